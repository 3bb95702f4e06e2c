"""rlvr's rollout and training throughput against the hardware's limits, for a GPU.

For each model shape (random init) it measures:
- **decode**: `HFRolloutEngine` (with its CUDA-graph decode steps, and at the first of the
  `--batch` sizes again without them as `decode_eager`, unless `--no-eager`) sampling
  `--samples` completions for each of the prompts of a batch of `--batch` rows (one entry per
  size in `decode`), every completion forced to `--new-tokens` tokens. Decode time is a
  full rollout minus a prefill-only rollout of the same prompts. The memory-bandwidth roofline
  of a decode step reads every matmul weight once and the K/V of every earlier position of
  every row; `roofline_frac` = roofline time / measured time, against the device's data-sheet
  bandwidth and against the copy bandwidth measured here;
- **training**: one GRPO mini-batch (`minibatch_backward` on shared-prefix, padding-free
  micro-batches, then AdamW) on ragged completions; tokens/s over the tokens the model really
  computes (each prompt once, then the completions), and MFU = model FLOPs/s (6 · matmul
  parameters · tokens plus causal attention) over the data-sheet bf16 dense peak and over the
  matmul peak measured here (recomputation under `--gradient-checkpointing` is not counted as
  model FLOPs), and on CUDA the peak memory allocated and the allocator's retries over the
  timed calls and their warm-up (`allocator_retries`).

`--parts` picks decode and/or training; `--profile` adds, for a few decode steps at the first
batch size (`decode_step_profile`) and one training step, the operations that took the most
time (kernels by device time on a GPU); on a GPU also the time no kernel ran and the longest
such gaps (`idle_time`) and, for the training step, where the host waited for the GPU
(`sync_sites`).

    python benchmarks/gpu.py                    # 100m and 0.5b shapes, bf16, on CUDA
    python benchmarks/gpu.py --quick            # a CPU smoke run on a toy shape (fp32)

Results go to `benchmarks/results/<--out>` (default `gpu.json`, `gpu-quick.json` for
`--quick`) with the device, versions and command, rewritten after each case.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rlvr.config import resolve_config
from rlvr.models import fused
from rlvr.rollout.base import SamplingParams
from rlvr.rollout.graphs import GraphDecoder, GraphState
from rlvr.rollout.hf import HFRolloutEngine
from rlvr.rollout.sampling import Draw, ban_bias
from rlvr.training.batch import RolloutBatch
from rlvr.training.batching import response_mask_from_lengths
from rlvr.training.optim import build_optimizer
from rlvr.training.update import LossSettings, minibatch_backward

RESULTS = Path(__file__).parent / "results"

SHAPES: dict[str, Callable[[], torch.nn.Module]] = {
    # ≈ 110M parameters: a GPT-2-small-sized Llama
    "100m": lambda: LlamaForCausalLM(
        LlamaConfig(
            vocab_size=32000,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            num_key_value_heads=12,
            intermediate_size=2048,
            tie_word_embeddings=True,
        )
    ),
    # ≈ 494M parameters: the Qwen2.5-0.5B shape (GQA 14/2, q/k/v biases, 152k vocabulary)
    "0.5b": lambda: Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=151936,
            hidden_size=896,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            intermediate_size=4864,
            tie_word_embeddings=True,
        )
    ),
    # a toy shape for `--quick` on a CPU
    "toy": lambda: LlamaForCausalLM(
        LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            tie_word_embeddings=True,
        )
    ),
}


def build(shape: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The `shape` model, random init made on `device` (the 0.5b's takes seconds on a CPU),
    then cast to `dtype`."""
    torch.manual_seed(0)
    with device:
        return SHAPES[shape]().to(dtype=dtype)


# Data-sheet figures: HBM bandwidth (bytes/s) and dense bf16 tensor-core peak (FLOP/s).
DATASHEET = {
    "H100 PCIe": (2.0e12, 756e12),
    "H100": (3.35e12, 989e12),  # SXM5
    "H200": (4.8e12, 989e12),
    "A100": (2.0e12, 312e12),  # 80 GB SXM
}


def datasheet(device: torch.device) -> tuple[float | None, float | None]:
    """(bandwidth, bf16 peak) of a known GPU by name, else (None, None)."""
    if device.type != "cuda":
        return None, None
    name = torch.cuda.get_device_name(device)
    for key, figures in DATASHEET.items():
        if all(part in name for part in key.split()):
            return figures
    return None, None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median seconds of `repeats` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measured_copy_bandwidth(device: torch.device, dtype: torch.dtype) -> float:
    """Bytes/s of a large device-to-device copy (one read plus one write per element)."""
    x = torch.empty(256 * 2**20 // 2, dtype=dtype, device=device)
    y = torch.empty_like(x)
    seconds = timed(lambda: y.copy_(x), device, 10)
    return 2 * x.numel() * x.element_size() / seconds


def measured_matmul_flops(device: torch.device, dtype: torch.dtype) -> float:
    """FLOP/s of a large square matmul in `dtype`."""
    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    return 2 * n**3 / timed(lambda: a @ b, device, 10)


def matmul_params(model: torch.nn.Module) -> int:
    """Parameters of the linear layers a token goes through (the LM head included)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def kv_bytes_per_position(model: torch.nn.Module) -> int:
    """Bytes of K and V of one position of one row, over all layers."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    element = next(model.parameters()).element_size()
    return cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * element


PROFILE_STEPS = 4
"""Decode steps `--profile` records (`decode_step_profile`)."""


def top_operations(fn: Callable[[], object], device: torch.device, top: int = 20) -> dict:
    """The `top` operations by self time of one call of `fn` under the PyTorch profiler, with
    their share of the total, and the total ms and number of operations: on a GPU its kernels
    by device time (the operators that launch them are left out, as their device time is the
    same kernels'), else operators by CPU time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        fn()
        sync(device)
    cuda = device.type == "cuda"
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if not cuda or e.device_type == DeviceType.CUDA]
    events.sort(key=lambda e: getattr(e, key), reverse=True)
    total = sum(getattr(e, key) for e in events) or 1.0
    operations = [
        {
            "name": e.key[:160],
            "ms": getattr(e, key) / 1e3,
            "calls": e.count,
            "share": getattr(e, key) / total,
        }
        for e in events[:top]
    ]
    calls = sum(e.count for e in events)
    result = {"total_ms": total / 1e3, "calls": calls, "top": operations}
    if cuda:
        kernels = [
            (e.time_range.start, e.time_range.end, e.name)
            for e in prof.events()
            if e.device_type == DeviceType.CUDA
        ]
        result["idle"] = idle_time(kernels)
    return result


def idle_time(kernels: list[tuple[float, float, str]], top: int = 10) -> dict:
    """Where a device waits between kernels, from each kernel's (start µs, end µs, name): the
    span from the first start to the last end, the time some kernel runs (the union of their
    intervals), the rest, and the `top` longest gaps with the kernels on either side (the one
    that ended last before the gap, the one that starts it)."""
    if not kernels:
        return {"span_ms": 0.0, "busy_ms": 0.0, "idle_ms": 0.0, "gaps": []}
    ordered = sorted(kernels)
    first, end, last = ordered[0]
    busy, gaps = 0.0, []
    for start, stop, name in ordered[1:]:
        if start > end:
            busy += end - first
            gaps.append((start - end, last, name))
            first = start
        if stop > end:
            end, last = stop, name
    busy += end - first
    span = end - ordered[0][0]
    gaps.sort(key=lambda gap: gap[0], reverse=True)
    return {
        "span_ms": span / 1e3,
        "busy_ms": busy / 1e3,
        "idle_ms": (span - busy) / 1e3,
        "gaps": [{"ms": g / 1e3, "after": a[:80], "before": b[:80]} for g, a, b in gaps[:top]],
    }


def sync_sites(fn: Callable[[], object]) -> dict[str, int]:
    """Where one call of `fn` makes the host wait for the GPU: the file and line of each
    synchronising call PyTorch's sync debug mode reports, with how often, most often first."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    sites = Counter(
        f"{Path(w.filename).name}:{w.lineno}"
        for w in caught
        if "called a synchronizing" in str(w.message)
    )
    return dict(sites.most_common())


def decode_case(
    model,
    args,
    device,
    bandwidths,
    cuda_graphs: bool = True,
    profile: bool = False,
    overlap: bool | None = None,
) -> dict:
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(0, vocab - 1, (args.prompt_len,), generator=g).tolist()
        for _ in range(args.batch // args.samples)
    ]
    eos = [vocab - 1]

    engine = HFRolloutEngine(
        model, eos, 0, batch_size=args.batch, cuda_graphs=cuda_graphs, overlap=overlap
    )

    def rollout(tokens: int) -> Callable[[], object]:
        params = SamplingParams(n=args.samples, max_new_tokens=tokens, min_new_tokens=tokens)

        def run() -> object:
            engine.generator = torch.Generator().manual_seed(0)
            return engine.generate(prompts, params)

        return run

    full = timed(rollout(args.new_tokens), device, args.repeats)
    prefill = timed(rollout(1), device, args.repeats)
    rows, steps = len(prompts) * args.samples, args.new_tokens - 1
    decode_s = full - prefill
    weight_bytes = matmul_params(model) * next(model.parameters()).element_size()
    kv_bytes = (
        kv_bytes_per_position(model) * rows * sum(args.prompt_len + 1 + j for j in range(steps))
    )
    total_bytes = steps * weight_bytes + kv_bytes
    result = {
        "rows": rows,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "rollout_s": full,
        "prefill_s": prefill,
        "decode_s": decode_s,
        "decode_tokens_per_s": rows * steps / decode_s,
        "decode_step_ms": 1e3 * decode_s / steps,
        "bytes_per_step_mb": total_bytes / steps / 1e6,
        "weight_share_of_bytes": steps * weight_bytes / total_bytes,
    }
    for name, bandwidth in bandwidths.items():
        if bandwidth:
            result[f"roofline_frac_{name}"] = total_bytes / bandwidth / decode_s
    if profile:
        result["profile"] = decode_step_profile(model, args, device)
    return result


def decode_step_profile(model, args, device, steps: int = PROFILE_STEPS) -> dict:
    """The kernels of `steps` decode steps of `--batch` rows halfway through a rollout (the
    prompt and half of the new tokens written), run uncaptured: the kernels a graph replays,
    without the prefill, whose kernels would otherwise mix in. The profiler's events of a
    whole captured rollout took minutes to sort."""
    rows, n = args.batch, args.samples
    vocab = model.config.vocab_size
    decoder = GraphDecoder(model, args.prompt_len + args.new_tokens, GraphState(capture=False))
    ids = torch.randint(0, vocab - 1, (rows // n, args.prompt_len), device=device)
    positions = torch.arange(args.prompt_len, device=device).expand_as(ids)
    params = SamplingParams(n=n, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens)
    ban = ban_bias(vocab, torch.tensor([vocab - 1], device=device))
    written = args.prompt_len + args.new_tokens // 2
    with torch.inference_mode():
        decoder.prefill(ids, torch.ones_like(ids), positions)
        decoder.select(torch.arange(len(ids), device=device).repeat_interleave(n))
    token = torch.zeros(rows, dtype=torch.long, device=device)

    def run() -> None:
        with torch.inference_mode():
            for j in range(steps):
                decoder.length = written + j  # columns past the prompt hold zeros: same cost
                mask = torch.ones(rows, written + j + 1, dtype=torch.long, device=device)
                position = torch.full((rows,), written + j, device=device)
                decoder.next_tokens(token, mask, position, Draw(params, torch.rand(rows), ban))

    run()  # warm-up: first-call set-up (cuBLAS handles, kernel loading) stays out
    return {"rows": rows, "written": written, "steps": steps, **top_operations(run, device)}


def token_batch(
    prompt_ids: list[list[int]], completion_ids: list[list[int]], group: int, advantages
) -> RolloutBatch:
    """A batch of token ids alone (no problems or texts): `group` consecutive samples per
    prompt, one advantage per sample ([N]) on every completion token."""
    n = len(prompt_ids)
    mask = response_mask_from_lengths([len(c) for c in completion_ids])
    return RolloutBatch(
        problems=[],
        prompt_ids=prompt_ids,
        completion_ids=completion_ids,
        prompt_texts=[],
        completion_texts=[],
        group_ids=torch.arange(n) // group,
        truncated=torch.zeros(n, dtype=torch.bool),
        response_mask=mask,
        rollout_logprobs=torch.zeros_like(mask),
        advantages=advantages[:, None] * mask,
    )


def allocator_retries(device: torch.device) -> int:
    """How often PyTorch's CUDA allocator has freed its cached blocks to retry an allocation
    (`num_alloc_retries`): each retry frees memory with cudaFree, which waits for the whole
    device. Fragmentation across micro-batches of different sizes makes them; 0 off CUDA."""
    if device.type != "cuda":
        return 0
    return torch.cuda.memory_stats(device).get("num_alloc_retries", 0)


def train_case(model, args, device, peaks, profile: bool = False) -> dict:
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    groups, n, t = args.train_prompts, args.samples, args.train_len
    prompts = [
        torch.randint(0, vocab, (args.prompt_len,), generator=g).tolist() for _ in range(groups)
    ]
    lengths = torch.randint(t // 2, t + 1, (groups * n,), generator=g).tolist()
    completions = [torch.randint(0, vocab, (k,), generator=g).tolist() for k in lengths]
    signs = torch.randint(0, 2, (groups * n,), generator=g).float() * 2 - 1
    batch = token_batch([prompts[i // n] for i in range(groups * n)], completions, n, signs)
    algo = resolve_config(preset="grpo").algorithm
    settings = LossSettings(algo, 1.0, t, args.micro_batch_tokens, 0)
    optimizer = build_optimizer(model, 1e-6, 0.0, (0.9, 0.999))
    rows = list(range(len(batch)))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        minibatch_backward(model, batch, rows, settings)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    model.train()
    retries = allocator_retries(device)
    seconds = timed(step, device, args.repeats)
    retries = allocator_retries(device) - retries
    tokens = groups * args.prompt_len + sum(lengths)
    cfg = model.config
    attn_width = cfg.num_attention_heads * (
        getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    )
    # causal attention: QKᵀ and PV, 2 FLOPs per multiply-add, 3× for forward + backward, each
    # token attending on average to half of its sequence
    mean_context = args.prompt_len + statistics.mean(lengths) / 2
    flops_per_token = (
        6 * matmul_params(model) + 12 * cfg.num_hidden_layers * attn_width * mean_context
    )
    flops = flops_per_token * tokens / seconds
    result = {
        "samples": len(batch),
        "tokens": tokens,
        "step_s": seconds,
        "tokens_per_s": tokens / seconds,
        "model_tflops": flops / 1e12,
        "allocator_retries": retries,
    }
    for name, peak in peaks.items():
        if peak:
            result[f"mfu_{name}"] = flops / peak
    if profile:
        result["profile"] = top_operations(step, device, top=60)
        if device.type == "cuda":
            result["profile"]["syncs"] = sync_sites(step)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["100m", "0.5b"], choices=list(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument(
        "--batch", type=int, nargs="+", default=[128], help="decode rows (one case per size)"
    )
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--train-prompts", type=int, default=16)
    parser.add_argument("--train-len", type=int, default=1024, help="longest completion")
    parser.add_argument("--micro-batch-tokens", type=int, default=32768)
    parser.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="recompute each layer in backward (train.gradient_checkpointing)",
    )
    parser.add_argument(
        "--parts", nargs="+", default=["decode", "train"], choices=["decode", "train"]
    )
    parser.add_argument("--profile", action="store_true", help="top operations of one call")
    parser.add_argument("--no-eager", action="store_true", help="no decode without graphs")
    parser.add_argument("--out", help="result file name in benchmarks/results/")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="toy shape on the CPU, fp32")
    args = parser.parse_args()
    if args.quick:
        args.shapes, args.device, args.dtype = ["toy"], "cpu", "float32"
        args.batch, args.prompt_len, args.new_tokens = [16], 8, 8
        args.train_prompts, args.train_len, args.repeats = 2, 16, 1
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    sheet_bandwidth, sheet_flops = datasheet(device)
    bandwidths = {"datasheet": sheet_bandwidth, "measured": measured_copy_bandwidth(device, dtype)}
    peaks = {"datasheet": sheet_flops, "measured": measured_matmul_flops(device, dtype)}
    report = {
        "command": " ".join(["python", "benchmarks/gpu.py", *sys.argv[1:]]),
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": args.dtype,
        "gradient_checkpointing": args.gradient_checkpointing,
        "bandwidth_gb_s": {k: v / 1e9 for k, v in bandwidths.items() if v},
        "peak_tflops": {k: v / 1e12 for k, v in peaks.items() if v},
        "shapes": {},
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / (args.out or f"gpu{'-quick' if args.quick else ''}.json")
    for shape in args.shapes:
        model = build(shape, device, dtype)
        entry = report["shapes"][shape] = {"parameters": sum(p.numel() for p in model.parameters())}
        for i, rows in enumerate(args.batch if "decode" in args.parts else []):
            case = argparse.Namespace(**{**vars(args), "batch": rows})
            first = i == 0
            result = decode_case(model, case, device, bandwidths, profile=args.profile and first)
            entry.setdefault("decode", []).append(result)
            print(shape, "decode", rows, result["decode_step_ms"], flush=True)
            if first and device.type == "cuda" and not args.no_eager:  # the same, no graphs
                entry["decode_eager"] = decode_case(model, case, device, bandwidths, False)
                print(shape, "decode_eager", rows, entry["decode_eager"]["decode_step_ms"])
            path.write_text(json.dumps(report, indent=1) + "\n")
        if "train" in args.parts:
            if args.gradient_checkpointing:
                fused.enable_activation_checkpointing(model)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            entry["train"] = train_case(model, args, device, peaks, args.profile)
            if device.type == "cuda":
                entry["train"]["peak_memory_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
            print(shape, "train", entry["train"]["step_s"], flush=True)
            path.write_text(json.dumps(report, indent=1) + "\n")
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(f"results: {path}")


if __name__ == "__main__":
    main()
