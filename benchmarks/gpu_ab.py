"""Side-by-side A/B on a GPU for the levers `benchmarks/gpu.py` reports on.

- **decode**: the same rollouts (`gpu.decode_case`: 128-token prompts, 512 forced new tokens)
  with the ways of `STEP_WAYS`: the CUDA-graph decode step of `graph_step.decode_hidden`
  (packed q/k/v and gate/up matmuls, one fused attention kernel: lever 25) with the default
  sampling, overlapped steps and Triton kernels, with the attention by our split-KV kernel
  (`triton_ops.decode_attention`, lever 46) instead of PyTorch's SDPA, with the sampling in
  PyTorch (before lever 30), with no Triton kernels (before levers 29 and 30), with
  sequential steps (the host reads each step's tokens before launching the next, as before
  lever 28), with the residual additions copied before their matmuls (before lever 43), with
  the RMSNorms as kernels of their own (before lever 45), with the rotary embedding
  computed in each step (before lever 49), with the RMSNorms apart and the rotary
  embedding and K/V write as a program per row and head (before levers 44 and 45), with the
  attention as two matmuls, with the sampling before lever 26, and the step of
  `FusedForward.hidden` (before lever 25), alternating twice, at 64, 128 and 512 rows
  (`--batches`), then the kernels of each at each of those (`gpu.decode_step_profile`); `--ways`
  picks some of them.
  The 11-26 results (`gpu_ab-decode-step.json`, and `gpu_ab-packed-step.json` for lever 25
  alone) predate lever 27, which changed `decode_attention`. (Until lever 25 this part
  compared sampling inside and after the graph, lever 23; graphs against eager decoding:
  `gpu.py`.);
- **chunks**: the 0.5b's training mini-batch at 16k-token micro-batches without logits, with
  chunks of 64M (the default until 11-26), 256M (the GPU default since) and 1G logits, and
  with the real rows' logits, alternating
  twice (a chunk's LM-head gradient is added into an fp32 [vocab, hidden] sum: 1.4 GB of
  memory traffic per chunk at the 0.5b's shape);
- **kernels**: one GRPO mini-batch (`gpu.train_case`, the default way of scoring) with the
  completions' attention by FlashAttention-2's variable-length kernel (lever 41), then by
  the Triton kernels of `gpu_kernels` instead (lever 31: only the real positions, a prompt's
  keys read in place, the causal half), both with Triton kernels for the token statistics
  (lever 32: one pass over the logits forward, one backward) and for the rotary embedding and
  SiLU·up (lever 33), one q/k/v and one gate/up matmul (lever 40), each residual addition
  with its RMSNorm as one kernel (lever 50) and SiLU·up over the gate/up output whole, so
  its gradient is one tensor (lever 51); the second way is the first without lever 51, the
  third without 50 and 51, the fourth without 40 as well; then the third and fourth ways
  with the Triton attention, then without the statistics too (before lever 32), with the attention
  alone (before levers 32 and 33), and with none (PyTorch's SDPA over the padded layout with
  an additive mask: before lever 31), and last the first way with the attention's layout and
  plan made from the GPU's tensors, each check reading the GPU back (before lever 54),
  alternating twice, at 16k- and 32k-token micro-batches, with the peak memory;
- **training**: one GRPO mini-batch (`gpu.train_case`) with the three ways of scoring the
  completion tokens of `lm_head_ab.py` (padded logits, as before; real-row logits; no logits,
  the default), alternating twice, at 16k- and 32k-token micro-batches, with the peak memory.
  (Until 11-25 this half compared the chunked log-prob function with autograd through
  `logsumexp`; those results are in `docs/benchmarks.md`.) `--micro-batch-tokens` sets the
  budgets of these two parts (levers 32 and 33 keep less for backward, so 64k may now fit).

    python benchmarks/gpu_ab.py                  # both shapes, both parts, bf16, on CUDA
    python benchmarks/gpu_ab.py --parts train    # the training half only
    python benchmarks/gpu_ab.py --shapes 0.5b --parts chunks
    python benchmarks/gpu_ab.py --parts decode --ways "packed step" \
        "packed step, PyTorch sampling" "packed step, no Triton kernels" \
        "packed step, sequential steps"              # levers 28-30
    python benchmarks/gpu_ab.py --parts kernels     # levers 31-33 and 40
    python benchmarks/gpu_ab.py --quick          # its CPU smoke run (toy shape, no decode)

Results go to `benchmarks/results/gpu_ab.json` with the device, versions and command.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import torch
import torch.nn.functional as F
import transformers
from lm_head_ab import WAYS

from rlvr.models import flash_varlen, fused, gpu_kernels
from rlvr.rollout import graph_step, graphs, triton_ops
from rlvr.rollout.graphs import GraphDecoder, SlotKV
from rlvr.rollout.sampling import below, sample_tokens
from rlvr.training import logprobs, update

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("gpu_bench", HERE / "gpu.py")
gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu)


def layer_ops_runner(self, b, batch: int, span: int, sampling):
    """`GraphDecoder._runner` before lever 25: the step through `FusedForward.hidden` (q, k, v,
    gate and up as five matmuls, attention as matmuls and a softmax)."""

    def run() -> object:
        mask = b.key_mask[:batch, :span]
        bias = fused.additive_bias(mask[:, None, :] != 0, b.kv.dtype)
        cache = SlotKV(b.kv, batch, span, b.where)
        hidden = self.forward.hidden(
            b.token[:batch], b.position[:batch], mask, cache, ops=fused.TorchOps(bias)
        )
        logits = self.forward.logits(hidden[:, -1])
        if sampling is None:
            return logits
        params, banned = sampling
        return sample_tokens(logits, params, b.uniform[:batch], b.ban if banned else None)

    return run


def matmul_attention(q, keys, values, bias, scale: float):
    """`graph_step.decode_attention` as `fused.attention` computes it for one query: two
    batched matmuls and a softmax in fp32 (as before lever 25)."""
    b, heads, d = q.shape
    return fused.attention(q[:, :, None], keys, values, bias, scale).reshape(b, heads * d)


def blocked_cumsum(probs: torch.Tensor, block: int = 256) -> torch.Tensor:
    """The GPU's cumulative sum of the probabilities before lever 26."""
    b, vocab = probs.shape
    blocks = F.pad(probs, (0, -vocab % block)).view(b, -1, block).cumsum(-1)
    totals = blocks[..., -1]
    before = totals.cumsum(-1) - totals
    return (blocks + before[..., None]).view(b, -1)[:, :vocab]


def sample_tokens_before(logits, params, uniform, ban=None):
    """`sampling.sample_tokens` before lever 26: temperature divisions at temperature 1 and
    the inverse CDF over `blocked_cumsum`'s whole-row cumulative sums."""
    logits = logits.float()
    allowed = logits if ban is None else logits + ban
    logprobs = (logits / params.temperature).log_softmax(-1)
    probs = (allowed / params.temperature).softmax(-1)
    cdf = blocked_cumsum(probs)
    total = cdf[:, -1:]
    target = torch.minimum(uniform.to(probs.device)[:, None] * total, below(total))
    tokens = (cdf <= target).sum(-1).clamp_(max=probs.shape[-1] - 1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


@dataclass(frozen=True)
class StepWay:
    """One way of running the captured decode step (`STEP_WAYS`)."""

    runner: Callable = GraphDecoder._runner
    attention: Callable = graph_step.decode_attention
    sampling: Callable = sample_tokens
    overlap: bool = True
    """Whether each step is launched before the host reads the previous one's EOS flags."""
    kernels: bool = True
    """Whether the step runs Triton kernels where it can (levers 29 and 30)."""
    residual: Callable = graph_step.residual_linear
    rotate: Callable | None = None
    """The rotary embedding and K/V write (None: `triton_ops.rotate_and_store`)."""
    fold_norms: bool = True
    """Whether the packed weights hold the RMSNorm gains (lever 45; `graph_step.FOLD_NORMS`)."""
    rotary_table: bool = True
    """Whether the step gathers its rotations from a table (lever 49) or computes them."""


def residual_linear_copied(h, x, module):
    """`graph_step.residual_linear` before lever 43: an out-of-place `addmm`, which first
    copies h into its new output."""
    out = torch.addmm(h, x, module.weight.t())
    return out if module.bias is None else out + module.bias


def rotate_per_head(qkv, cos, signed_sin, keys, values, where, heads, norm=None):
    """`triton_ops.rotate_and_store` before lever 44: a program per row and head
    (`rotate_per_head.py`, imported at the first call since it imports Triton; the script's
    folder is on the path, as for `lm_head_ab`). It predates lever 45 too: no `norm`."""
    import rotate_per_head as before

    if norm is not None:
        raise ValueError("the rotation per head runs with the norms apart (fold_norms=False)")
    return before.rotate_and_store(qkv, cos, signed_sin, keys, values, where, heads)


def sample_tokens_in_pytorch(logits, params, uniform, ban=None):
    """`sample_tokens` without its Triton kernel (the sampling before lever 30)."""
    usable = triton_ops.usable
    triton_ops.usable = lambda x: False
    try:
        return sample_tokens(logits, params, uniform, ban)
    finally:
        triton_ops.usable = usable


STEP_WAYS = {
    "packed step": StepWay(),
    "packed step, PyTorch sampling": StepWay(sampling=sample_tokens_in_pytorch),
    "packed step, no Triton kernels": StepWay(kernels=False),
    "packed step, sequential steps": StepWay(overlap=False),
    "packed step, residual copied": StepWay(residual=residual_linear_copied),
    "packed step, our attention": StepWay(attention=triton_ops.decode_attention),
    "packed step, SDPA attention": StepWay(attention=graph_step.sdpa_decode_attention),
    "packed step, norms apart": StepWay(fold_norms=False),
    "packed step, rotary computed per step": StepWay(rotary_table=False),
    "packed step, norms apart, rotation per head": StepWay(
        rotate=rotate_per_head, fold_norms=False
    ),
    "packed step, matmul attention": StepWay(attention=matmul_attention),
    "packed step, sampling before lever 26": StepWay(sampling=sample_tokens_before),
    "layer-ops step": StepWay(runner=layer_ops_runner),
}

TRITON_USABLE = triton_ops.usable
ROTATE_AND_STORE = triton_ops.rotate_and_store
ROTARY_TABLE = graph_step.rotary_table


def use_way(way: StepWay) -> bool:
    """Make the decode step `way`; return whether its steps overlap."""
    GraphDecoder._runner, graph_step.decode_attention = way.runner, way.attention
    graph_step.residual_linear = way.residual
    triton_ops.rotate_and_store = way.rotate or ROTATE_AND_STORE
    graph_step.FOLD_NORMS = way.fold_norms
    graph_step.rotary_table = ROTARY_TABLE if way.rotary_table else lambda *args: None
    graphs.sample_tokens = way.sampling
    triton_ops.usable = TRITON_USABLE if way.kernels else lambda x: False
    return way.overlap


CHUNK_WAYS = {  # name: (way of `lm_head_ab.WAYS`, logits per chunk)
    "no logits, 64M-logit chunks": ("no logits", 1 << 26),
    "no logits, 256M-logit chunks": ("no logits", 1 << 28),
    "no logits, 1G-logit chunks": ("no logits", 1 << 30),
    "real-row logits": ("real-row logits", 1 << 26),
}


class TrainWay(NamedTuple):
    """Which of the update's GPU levers a way of the mini-batch A/B keeps (`use_train_kernels`)."""

    attention: bool = True  # PackedOps' attention kernels (lever 31), else SDPA over padding
    elementwise: bool = True  # Triton rotary embedding and SiLU·up (lever 33)
    statistics: bool = True  # Triton token statistics (lever 32)
    packed: bool = True  # one q/k/v and one gate/up matmul (lever 40)
    varlen: bool = True  # FlashAttention-2's variable-length kernel (lever 41)
    norms: bool = True  # residual additions fused with their RMSNorms (lever 50)
    one_gradient: bool = True  # SiLU·up of the packed gate/up output whole (lever 51)
    host_layout: bool = True  # the attention's layout and plan made on the host (lever 54)


ALL_ON = TrainWay()
TRITON = ALL_ON._replace(varlen=False, norms=False, one_gradient=False)
TRAIN_KERNEL_WAYS = {
    "varlen attention, Triton element-wise and statistics, packed projections, fused norms, "
    "one gate/up gradient": ALL_ON,
    "varlen attention, Triton element-wise and statistics, packed projections, fused norms": (
        ALL_ON._replace(one_gradient=False)
    ),
    "varlen attention, Triton element-wise and statistics, packed projections": (
        ALL_ON._replace(norms=False, one_gradient=False)
    ),
    "varlen attention, Triton element-wise and statistics": (
        ALL_ON._replace(packed=False, norms=False, one_gradient=False)
    ),
    "Triton attention, element-wise and statistics, packed projections": TRITON,
    "Triton attention, element-wise and statistics": TRITON._replace(packed=False),
    "Triton attention and element-wise, PyTorch statistics": (
        TRITON._replace(packed=False, statistics=False)
    ),
    "Triton attention, PyTorch element-wise and statistics": (
        TRITON._replace(packed=False, statistics=False, elementwise=False)
    ),
    "PyTorch attention, element-wise and statistics": TrainWay(*[False] * 7, host_layout=True),
    "all on, the attention's layout and plan made on the GPU": ALL_ON._replace(host_layout=False),
}
TRITON_ELEMENTWISE = fused.PackedOps.rotate, fused.PackedOps.silu_mul
PACKED_PROJECTIONS = fused.PackedOps.projections
PACKED_SWIGLU = fused.PackedOps.mlp_inner
FUSED_NORMS = fused.PackedOps.__dict__["add_rms_norm"]
"""The staticmethod itself: read through the class it is a plain function, which set back on
the class would be bound to the instance."""
HOST_LAYOUT = fused.KernelOps._layout


def device_layout(
    self: fused.KernelOps, select: torch.Tensor | None, prefixes: int, k: torch.Tensor
):
    """`KernelOps._layout` as before lever 54: from the device's tensors, checked and planned
    there, each check and the plan reading the GPU back."""
    layout, self.gather = fused.prefix_layout(self.key_mask, self.t, self.flat, select, prefixes)
    return layout


KERNELS_OFF = SimpleNamespace(usable=lambda x: False, check_token_ids=gpu_kernels.check_token_ids)
"""Stands in for `gpu_kernels` where a way turns its kernels off: both users ask `usable`
first, and `logprobs` checks the token ids given on the host with it whatever the kernels."""


def use_train_kernels(way: TrainWay) -> None:
    """Let `fused.layer_ops` pick `PackedOps` (the Triton attention, or with `varlen`
    FlashAttention-2's variable-length kernel) with or without its Triton rotary embedding and
    SiLU·up, its packed q/k/v and gate/up matmuls, its residual additions fused with their
    RMSNorms (`norms`) and its SiLU·up of the packed gate/up output whole (`one_gradient`,
    lever 51: else split into views, whose gradients autograd joins), its attention laid out
    on the host (`host_layout`, lever 54: else on the GPU, as before), and `logprobs` the
    Triton token statistics, or not."""
    attention, elementwise, statistics, packed, varlen, norms, one_gradient, host_layout = way
    fused.KernelOps._layout = HOST_LAYOUT if host_layout else device_layout
    fused.PackedOps.add_rms_norm = FUSED_NORMS if norms else fused.TorchOps.add_rms_norm
    flash_varlen.ENABLED = varlen
    fused.gpu_kernels = gpu_kernels if attention else KERNELS_OFF
    rotate, silu_mul = (
        TRITON_ELEMENTWISE if elementwise else (fused.rotate, fused.TorchOps.silu_mul)
    )
    fused.PackedOps.rotate, fused.PackedOps.silu_mul = staticmethod(rotate), staticmethod(silu_mul)
    projections = PACKED_PROJECTIONS if packed else fused.TorchOps.projections
    fused.PackedOps.projections = staticmethod(projections)
    whole = packed and elementwise and one_gradient
    fused.PackedOps.mlp_inner = PACKED_SWIGLU if whole else fused.TorchOps.mlp_inner
    logprobs.gpu_kernels = gpu_kernels if statistics else KERNELS_OFF


def train_run(model, device: torch.device, micro_batch_tokens: int) -> dict:
    """`gpu.train_case` on 16 prompts × 8 ragged completions of 512–1024 tokens (2 × 4 of at
    most 16 on the CPU), with the peak memory on CUDA; {"oom": True} when memory runs out."""
    cuda = device.type == "cuda"
    case = argparse.Namespace(
        train_prompts=16 if cuda else 2,
        samples=8 if cuda else 4,
        train_len=1024 if cuda else 16,
        prompt_len=128 if cuda else 8,
        micro_batch_tokens=micro_batch_tokens,
        repeats=2 if cuda else 1,
    )
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        r = gpu.train_case(model, case, device, {"datasheet": 989e12})
    except torch.OutOfMemoryError:
        return {"oom": True}
    if cuda:
        r["peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
    return r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["100m", "0.5b"], choices=["100m", "0.5b"])
    parser.add_argument("--quick", action="store_true", help="toy shape on the CPU, no decode part")
    parser.add_argument(
        "--parts",
        nargs="+",
        default=["decode", "train"],
        choices=["decode", "chunks", "kernels", "train"],
    )
    parser.add_argument(
        "--ways",
        nargs="+",
        choices=list(STEP_WAYS),
        default=list(STEP_WAYS),
        metavar="WAY",
        help="the decode ways to compare (default: all of STEP_WAYS)",
    )
    parser.add_argument(
        "--batches",
        nargs="+",
        type=int,
        default=[64, 128, 512],
        help="the decode part's rows per rollout (default: 64 128 512)",
    )
    parser.add_argument(
        "--micro-batch-tokens",
        nargs="+",
        type=int,
        default=[16384, 32768],
        help="the kernels and train parts' micro-batch token budgets (default: 16384 32768)",
    )
    args = parser.parse_args()
    step_ways = {name: STEP_WAYS[name] for name in args.ways}
    cuda = not args.quick
    device = torch.device("cuda" if cuda else "cpu")
    if args.quick:
        args.shapes, args.parts = ["toy"], [p for p in args.parts if p != "decode"]
    default_way = update.completion_token_stats
    default_chunks = logprobs.CHUNK_ELEMENTS, logprobs.GPU_CHUNK_ELEMENTS
    path = HERE / "results" / ("gpu_ab.json" if cuda else "gpu_ab-quick.json")
    bandwidths = {"datasheet": gpu.datasheet(device)[0]}
    report = {
        "command": " ".join(["python", "benchmarks/gpu_ab.py", *sys.argv[1:]]),
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "results": {},
    }

    def record(key: str, result: dict, shown: str) -> None:
        """Add `result` to the runs of `key`, print its `shown` figure, rewrite the report."""
        report["results"].setdefault(key, []).append(result)
        print(key, result.get(shown, "oom"), flush=True)
        path.write_text(json.dumps(report, indent=1) + "\n")

    for shape in args.shapes:
        model = gpu.build(shape, device, torch.bfloat16 if cuda else torch.float32)
        for batch in args.batches if "decode" in args.parts else ():
            case = argparse.Namespace(
                batch=batch, samples=8, prompt_len=128, new_tokens=512, repeats=1
            )
            for name, way in [*step_ways.items()] * 2:
                overlap = use_way(way)
                r = gpu.decode_case(model, case, device, bandwidths, overlap=overlap)
                record(f"{shape} decode batch {batch} {name}", r, "decode_step_ms")
        profiled = itertools.product(args.batches, step_ways.items())
        for batch, (name, way) in profiled if "decode" in args.parts else ():
            use_way(way)
            case = argparse.Namespace(batch=batch, samples=8, prompt_len=128, new_tokens=512)
            r = gpu.decode_step_profile(model, case, device)
            record(f"{shape} decode profile {batch} {name}", r, "total_ms")
        use_way(STEP_WAYS["packed step"])
        for name, (way, chunk) in [*CHUNK_WAYS.items()] * 2 if "chunks" in args.parts else ():
            update.completion_token_stats = WAYS[way]
            logprobs.CHUNK_ELEMENTS = logprobs.GPU_CHUNK_ELEMENTS = chunk
            record(
                f"{shape} chunks {name}", train_run(model, device, 16384 if cuda else 64), "step_s"
            )
        logprobs.CHUNK_ELEMENTS, logprobs.GPU_CHUNK_ELEMENTS = default_chunks
        budgets = args.micro_batch_tokens if cuda else [64]
        for tokens in budgets if "kernels" in args.parts else ():
            for name, way in [*TRAIN_KERNEL_WAYS.items()] * 2:
                use_train_kernels(way)
                run = train_run(model, device, tokens)
                record(f"{shape} kernels mb {tokens} {name}", run, "step_s")
        use_train_kernels(ALL_ON)
        for tokens in budgets if "train" in args.parts else ():
            for name, way in [*WAYS.items()] * 2:
                update.completion_token_stats = way
                record(
                    f"{shape} train mb {tokens} {name}", train_run(model, device, tokens), "step_s"
                )
        update.completion_token_stats = default_way
        del model
        if cuda:
            torch.cuda.empty_cache()
    print(f"results: {path}")


if __name__ == "__main__":
    main()
