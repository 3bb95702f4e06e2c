"""The update's Triton kernels on a GPU against the PyTorch operations they replace, one
piece at a time (levers 31–34 of `docs/benchmarks.md`), at the 0.5B shape in bf16: forward
plus backward of

- **attention**: one layer's attention of the completions of a shared-prefix micro-batch (4
  prompts of 128 tokens, 8 samples each, completions of 512–1024 tokens), `fused.PackedOps`
  by FlashAttention-2's variable-length kernel (`flash_varlen`, lever 41; each sample's copy
  of its prompt's keys gathered in front of its own) and by the Triton kernels
  (`gpu_kernels.attention`, the prompt's keys read in place) with the tilings the autotuner
  keeps and with the first of `QUERY_TILINGS` / `KEY_TILINGS` untuned (lever 36), against
  `fused.TorchOps` (the padded layout, each sample's copy of its prompt's keys, SDPA under an
  additive mask), also as useful TFLOP/s (the visible (query, key) pairs only), and the
  tiling kept for each kernel;
- **token statistics**: the log-probs and entropies of one 256M-logit chunk (1,700 rows of
  151,936), `gpu_kernels.token_stats` and `logit_grad` against `logprobs`' PyTorch path;
- **rotary**: the queries' rotary embedding of 32k tokens, `gpu_kernels.rotary` against
  `fused.rotate`;
- **SwiGLU**: silu(gate)·up of 32k tokens × 4,864, `gpu_kernels.swiglu` against PyTorch;
- **head gradient** (backward only): one chunk's dzᵀ·h added into the fp32 [vocab, hidden]
  sum, `addmm(..., out_dtype=float32)` against the bf16 product added.

Each way is timed (median of 10 calls after a warm-up) twice, alternating, and the results go
to `benchmarks/results/train_kernels_ab.json` with the device and versions. `--quick` runs
tiny shapes on the CPU in Triton's interpreter, which Triton reads from the environment when
it is first imported (a smoke run: its times mean nothing).

    python benchmarks/train_kernels_ab.py
    TRITON_INTERPRET=1 python benchmarks/train_kernels_ab.py --quick
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("gpu_bench", HERE / "gpu.py")
gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu)

Case = dict[str, Callable[[], object]]
"""A piece's ways: name -> one forward and backward (the first way is the kernels')."""

SHAPE = dict(heads=14, kv_heads=2, dim=64, hidden=896, mlp=4864, vocab=151936)
QUICK = dict(heads=4, kv_heads=2, dim=16, hidden=32, mlp=96, vocab=300)


def attention_case(
    s: dict, quick: bool, device: torch.device, dtype: torch.dtype
) -> tuple[Case, float]:
    """The attention's ways, and its useful FLOPs forward and backward: 12 · dim · heads per
    (query, visible key) pair (QKᵀ and PV forward, twice that backward; `gpu.py`'s count)."""
    from rlvr.models import flash_varlen, fused, gpu_kernels, kv_cache

    g = torch.Generator().manual_seed(0)
    prompts, samples, prompt_len = (2, 2, 8) if quick else (4, 8, 128)
    low, high = (5, 12) if quick else (512, 1024)
    lengths = torch.randint(low, high + 1, (prompts * samples,), generator=g)
    t = int(lengths.max())
    prompt_mask = torch.ones(prompts, prompt_len, dtype=torch.long)
    prompt_mask[0, : prompt_len // 4] = 0  # a left-padded prompt
    prompt_index = torch.arange(prompts).repeat_interleave(samples)
    real = torch.arange(t)[None, :] < lengths[:, None]
    key_mask = torch.cat([prompt_mask[prompt_index], torch.ones(len(real), t, dtype=torch.long)], 1)
    flat = fused.real_positions(real).to(device)
    key_mask, prompt_index = key_mask.to(device), prompt_index.to(device)
    n, heads, kv, d = len(flat), s["heads"], s["kv_heads"], s["dim"]

    def tensor(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device, dtype).requires_grad_()

    q, k, v, grad = tensor(n, heads, d), tensor(n, kv, d), tensor(n, kv, d), tensor(n, heads * d)
    pk, pv = (tensor(prompts, prompt_len, kv, d) for _ in range(2))
    packed = fused.PackedOps(key_mask, t, flat)
    ways = {  # name: (ops, gpu_kernels.TUNE, flash_varlen.ENABLED)
        "FlashAttention-2 varlen (PackedOps)": (packed, True, True),
        "Triton, autotuned tilings": (packed, True, False),
        "Triton, the first tilings untuned": (packed, False, False),
        "PyTorch SDPA (TorchOps)": (
            fused.TorchOps(fused.mask_bias(key_mask, t, dtype), flat),
            True,
            False,
        ),
    }

    def run(ops: fused.TorchOps, tune: bool, flash: bool) -> Callable[[], object]:
        def once() -> None:
            gpu_kernels.TUNE, flash_varlen.ENABLED = tune, flash
            try:
                cache = kv_cache.ConcatKV(1)
                cache.update(0, pk.transpose(1, 2), pv.transpose(1, 2))
                cache.batch_select_indices(prompt_index)
                out = ops.attend(q, *ops.cached(cache, 0, k, v), scale=d**-0.5)
                out.backward(grad)
            finally:
                gpu_kernels.TUNE, flash_varlen.ENABLED = True, True

        return once

    seen_prompt = prompt_mask.sum(1)[prompt_index.cpu()]
    pairs = float((lengths * seen_prompt + lengths * (lengths + 1) // 2).sum())
    return {name: run(*way) for name, way in ways.items()}, 12.0 * d * heads * pairs


def chosen_tilings() -> dict[str, str]:
    """The tiling the autotuner kept for each attention kernel and key (direction, head size,
    group, dtypes)."""
    from rlvr.models import gpu_kernels

    chosen = {}
    for name, tilings in [
        ("attention_queries_kernel", gpu_kernels.QUERY_TILINGS),
        ("attention_dkv_kernel", gpu_kernels.KEY_TILINGS),
    ]:
        for key, config in gpu_kernels._tuned(name, tilings).cache.items():
            chosen[f"{name} {key}"] = str(config)
    return chosen


def statistics_case(s: dict, quick: bool, device: torch.device, dtype: torch.dtype) -> Case:
    from rlvr.models import gpu_kernels
    from rlvr.training import logprobs

    g = torch.Generator().manual_seed(1)
    rows = 24 if quick else (1 << 28) // s["vocab"]
    x = (torch.randn(rows, s["vocab"], generator=g) * 2).to(device, dtype).requires_grad_()
    tokens = torch.randint(0, s["vocab"], (rows,), generator=g).to(device)
    weights = torch.randn(2, rows, generator=g).to(device)

    def run(kernels: object) -> Callable[[], object]:
        def once() -> None:
            logprobs.gpu_kernels = kernels
            try:
                logp, entropy = logprobs.token_logprobs_and_entropy(x, tokens, 1.0, rows)
                ((logp * weights[0]).sum() + (entropy * weights[1]).sum()).backward()
            finally:
                logprobs.gpu_kernels = gpu_kernels

        return once

    off = SimpleNamespace(usable=lambda x: False)
    return {"Triton": run(gpu_kernels), "PyTorch": run(off)}


def elementwise_cases(s: dict, quick: bool, device: torch.device, dtype: torch.dtype) -> dict:
    from rlvr.models import fused, gpu_kernels

    g = torch.Generator().manual_seed(2)
    tokens = 64 if quick else 32768

    def tensor(*shape: int, grad: bool = True) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device, dtype).requires_grad_(grad)

    x, dx = tensor(tokens, s["heads"], s["dim"]), tensor(tokens, s["heads"], s["dim"])
    cos, sin = tensor(tokens, 1, s["dim"], grad=False), tensor(tokens, 1, s["dim"], grad=False)
    gate, up, dout = (tensor(tokens, s["mlp"]) for _ in range(3))

    def run(fn: Callable, inputs: tuple, out_grad: torch.Tensor) -> Callable[[], object]:
        return lambda: fn(*inputs).backward(out_grad)

    return {
        "rotary": {
            "Triton": run(gpu_kernels.rotary, (x, cos, sin), dx),
            "PyTorch": run(fused.rotate, (x, cos, sin), dx),
        },
        "SwiGLU": {
            "Triton": run(gpu_kernels.swiglu, (gate, up), dout),
            "PyTorch": run(lambda a, b: F.silu(a) * b, (gate, up), dout),
        },
    }


def head_gradient_case(s: dict, quick: bool, device: torch.device, dtype: torch.dtype) -> Case:
    from rlvr.training import logprobs

    g = torch.Generator().manual_seed(3)
    rows = 24 if quick else (1 << 28) // s["vocab"]
    dz = torch.randn(rows, s["vocab"], generator=g).to(device, dtype)
    h = torch.randn(rows, s["hidden"], generator=g).to(device, dtype)
    total = torch.zeros(s["vocab"], s["hidden"], device=device)
    ways = {"product added": lambda: total.add_(dz.T @ h)}
    if logprobs.fp32_output_matmul(device, dtype):
        ways = {"fp32-output matmul": lambda: logprobs._add_product(total, dz.T, h), **ways}
    return ways


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, CPU, interpreter")
    args = parser.parse_args()
    if args.quick and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("--quick runs the kernels in Triton's interpreter: set TRITON_INTERPRET=1")
    device = torch.device("cpu" if args.quick else "cuda")
    dtype = torch.float32 if args.quick else torch.bfloat16
    shape = QUICK if args.quick else SHAPE
    attention, attention_flops = attention_case(shape, args.quick, device, dtype)
    pieces = {
        "attention": attention,
        "token statistics": statistics_case(shape, args.quick, device, dtype),
        **elementwise_cases(shape, args.quick, device, dtype),
        "head gradient": head_gradient_case(shape, args.quick, device, dtype),
    }
    repeats = 1 if args.quick else 10
    report = {
        "command": " ".join(["python", "benchmarks/train_kernels_ab.py", *sys.argv[1:]]),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "shape": shape,
        "attention_useful_flops": attention_flops,
        "results": {},
    }
    path = (
        HERE
        / "results"
        / ("train_kernels_ab-quick.json" if args.quick else "train_kernels_ab.json")
    )
    for piece, ways in pieces.items():
        for name, fn in [*ways.items()] * 2:
            ms = 1e3 * gpu.timed(fn, device, repeats)
            report["results"].setdefault(piece, {}).setdefault(name, []).append(ms)
            rate = f" ({attention_flops / ms / 1e9:.0f} TFLOP/s)" if piece == "attention" else ""
            print(f"{piece}, {name}: {ms:.3f} ms{rate}", flush=True)
            path.write_text(json.dumps(report, indent=1) + "\n")
    if device.type == "cuda":
        report["attention_tilings"] = chosen_tilings()
        print(json.dumps(report["attention_tilings"], indent=1))
        path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"results: {path}")


if __name__ == "__main__":
    main()
