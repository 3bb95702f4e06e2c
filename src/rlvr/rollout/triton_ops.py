"""Triton kernels for the decode step on a GPU (`graph_step.decode_hidden`, `sampling`), each
doing in one or two kernels what took PyTorch several:

- `rotate_and_store`: the rotary embedding of each row's query and key heads (RoFormer, Su et
  al. 2021, eq. 34, in Llama's half-split layout: x·cos + rotate_half(x)·sin) read from the
  packed q/k/v projection, the rotated queries written out and the rotated keys and the values
  written into the KV cache at the step's column; in PyTorch a multiply, a roll, an `addcmul`,
  two `index_copy` and a copy;
- `silu_mul`: silu(gate)·up of the SwiGLU MLP (Shazeer 2020, eq. 6) from the packed gate/up
  projection, by the update's kernel (`gpu_kernels.swiglu`); in PyTorch a SiLU and a
  multiply;
- with a `RowNorm` (lever 45), `rotate_and_store` and `silu_mul` also finish the RMSNorm
  before their matmul: the matmul ran on the raw hidden state h with weights that hold the
  norm's gain g, since RMSNorm(h)·Wᵀ = rsqrt(mean(h²) + ε)·(h·(W·diag g)ᵀ), so the kernel
  scales each row by rsqrt(mean(h²) + ε), read from h, and adds the bias; the step's
  separate RMSNorm kernels go (`graph_step.PackedWeights`);
- `sample`: the next token by inverse-CDF sampling and its log-prob, without top-k or top-p
  (`sampling.sample_tokens`' rules); in PyTorch a dozen passes over [rows, vocab];
- `decode_attention`: one query per row against the K/V cache, split over the keys and
  merged (FlashDecoding), each K/V head read once for its query group; what
  `graph_step.decode_attention` runs from `graph_step.OUR_ATTENTION_ROWS` rows on (lever 46:
  faster than PyTorch's SDPA there on an H200, no faster at 64 rows).

Inside a CUDA graph a kernel costs no launch but still runs for microseconds however little
it does, and these element-wise kernels were about a third of the step's kernels
(`docs/benchmarks.md`, levers 29 and 30). The arithmetic is in fp32 and each output is rounded once
to the tensors' dtype (PyTorch rounds each intermediate as well).

Used where `usable` says: Triton is installed (it comes with PyTorch's CUDA builds) and the
tensors are on a GPU, or `TRITON_INTERPRET=1` was set before Triton was imported, which
runs the kernels on a CPU in Triton's interpreter (how the CPU tests check them, in fp32).
The kernels themselves are in `_triton_kernels`, imported at first use.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from types import ModuleType

import torch

from rlvr.models import gpu_kernels

usable = gpu_kernels.usable
"""Whether the kernels run for tensors like a given one (`gpu_kernels.usable`, which the
update's kernels share)."""


@dataclass(frozen=True)
class RowNorm:
    """The rest of an RMSNorm whose gain the matmul's weights hold: each output row times
    rsqrt(mean(h²) + `eps`) of its `hidden` state h [b, hidden], then plus `bias` (or None)."""

    hidden: torch.Tensor
    eps: float
    bias: torch.Tensor | None

    def arguments(self) -> dict:
        """The kernels' arguments for the norm (`inverse_rms`), by name."""
        width = self.hidden.shape[-1]
        return dict(HIDDEN=width, BLOCK_W=1 << (width - 1).bit_length())


@cache
def kernels() -> ModuleType:
    """`rlvr.rollout._triton_kernels`, imported at the first call."""
    return importlib.import_module("rlvr.rollout._triton_kernels")


def rotate_and_store(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    signed_sin: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    where: torch.Tensor,
    heads: int,
    norm: RowNorm | None = None,
) -> torch.Tensor:
    """The rotated queries [b, heads, d] of `qkv` [b, (heads + 2·kv_heads)·d] (q, k, v heads
    end to end), with the rotated keys and the values written into `keys` and `values`
    [b, kv_heads, positions, d] at position `where` (a one-element device tensor). `cos` and
    `signed_sin` [b, 1, d] are `graph_step.rotary_pair`'s, so that the rotation is
    x·cos + roll(x, d/2)·signed_sin. With `norm`, qkv is first scaled and biased by it."""
    b, kv_heads, d = keys.shape[0], keys.shape[1], keys.shape[-1]
    queries = qkv.new_empty(b, heads, d)
    hidden = qkv if norm is None else norm.hidden  # not read without a norm
    bias = qkv if norm is None or norm.bias is None else norm.bias
    sizes = dict(HIDDEN=1, BLOCK_W=1) if norm is None else norm.arguments()
    k = kernels()
    k.rotate_and_store_kernel[(b,)](
        qkv,
        cos,
        signed_sin,
        hidden,
        bias,
        queries,
        keys,
        values,
        where,
        0.0 if norm is None else float(norm.eps),
        hidden.stride(0),
        qkv.stride(0),
        cos.stride(0),
        signed_sin.stride(0),
        queries.stride(0),
        *keys.stride()[:3],
        *values.stride()[:3],
        HEADS=heads,
        KV_HEADS=kv_heads,
        DIM=d,
        NORM=norm is not None,
        BIAS=bias is not qkv,
        **sizes,
        BLOCK_H=1 << (heads + 2 * kv_heads - 1).bit_length(),
        BLOCK=1 << (d - 1).bit_length(),
    )
    return queries


def silu_mul(gate_up: torch.Tensor, norm: RowNorm | None = None) -> torch.Tensor:
    """silu(gate)·up [b, width] from `gate_up` [b, 2·width] (gate, then up), both halves read
    in place by the update's SwiGLU kernel (`gpu_kernels.swiglu`); with `norm`, each half
    first scaled and biased by it, by a kernel of its own."""
    if norm is None:
        return gpu_kernels.swiglu(*gate_up.chunk(2, dim=-1))
    b, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = gate_up.new_empty(b, width)
    bias = gate_up if norm.bias is None else norm.bias  # not read without a bias
    kernels().normed_silu_mul_kernel[(b, -(-width // gpu_kernels.ELEMENTS_BLOCK))](
        gate_up,
        norm.hidden,
        bias,
        out,
        width,
        float(norm.eps),
        gate_up.stride(0),
        norm.hidden.stride(0),
        BIAS=norm.bias is not None,
        BLOCK=gpu_kernels.ELEMENTS_BLOCK,
        **norm.arguments(),
    )
    return out


DECODE_KEY_BLOCK = 64
"""Keys per block of `decode_attention`'s kernel (the graphs' spans are multiples of 64)."""

DECODE_PROGRAMS = 512
"""`decode_attention` splits each row's keys until it runs about this many programs (a few per
multiprocessor of an H100 or H200), when the keys suffice."""


def decode_splits(rows: int, kv_heads: int, span: int, block: int = DECODE_KEY_BLOCK) -> int:
    """Splits of the keys for `decode_attention`: enough for `DECODE_PROGRAMS` programs of
    (row, K/V head, split), with at least one key block each."""
    wanted = -(-DECODE_PROGRAMS // (rows * kv_heads))
    return max(1, min(wanted, -(-span // block)))


def decode_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    bias: torch.Tensor,
    scale: float,
    splits: int | None = None,
) -> torch.Tensor:
    """`graph_step.decode_attention` (one query per row: q [b, heads, d] against keys and
    values [b, kv_heads, s, d] under the additive `bias` [b, 1, 1, s] of 0 and -inf; returns
    [b, heads·d]) by our kernels: each (row, K/V head, split of the keys) a program that reads
    the head once for its group of query heads, and with more than one split
    (`decode_splits`, or `splits`) a second kernel merging the splits' partial softmaxes
    (FlashDecoding)."""
    b, heads, d = q.shape
    kv_heads, span = keys.shape[1], keys.shape[2]
    if keys.stride(-1) != 1 or values.stride(-1) != 1:
        raise ValueError("decode_attention: keys and values need a unit stride along the head")
    if q.stride(2) != 1 or q.stride(1) != d:
        q = q.contiguous()
    splits = splits or decode_splits(b, kv_heads, span)
    per_split = -(-span // (splits * DECODE_KEY_BLOCK)) * DECODE_KEY_BLOCK
    splits = -(-span // per_split)
    out = q.new_empty(b, heads * d)
    partial, stats = out, out  # not written with one split
    if splits > 1:
        partial = torch.empty(splits, b, heads, d, dtype=torch.float32, device=q.device)
        stats = torch.empty(2, splits, b, heads, dtype=torch.float32, device=q.device)
    bias = bias.reshape(b, span)
    group = heads // kv_heads
    k = kernels()
    k.decode_attention_kernel[(b, kv_heads, splits)](
        q, keys, values, bias, out, partial, stats, span, per_split, splits, float(scale),
        q.stride(0), *keys.stride()[:3], *values.stride()[:3], bias.stride(0),
        GROUP=group, DIM=d, SPLIT=splits > 1,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        BLOCK_G=max(16, 1 << (group - 1).bit_length()),
        BLOCK_D=max(16, 1 << (d - 1).bit_length()), BLOCK_N=DECODE_KEY_BLOCK,
    )  # fmt: skip
    if splits > 1:
        k.decode_attention_merge_kernel[(b, heads)](
            partial, stats, out, splits, heads, DIM=d,
            BLOCK_S=max(2, 1 << (splits - 1).bit_length()), BLOCK_D=1 << (d - 1).bit_length(),
        )  # fmt: skip
    return out


def sample(
    logits: torch.Tensor,
    temperature: float,
    uniform: torch.Tensor,
    ban: torch.Tensor | None,
    block: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sampling.sample_tokens` without top-k, top-p or min-p, at a temperature > 0, in two kernels
    over `logits` [rows, vocab]: per (row, chunk of `block` tokens) the chunk's max and sum of
    exponentials, with and without the ban; then per row the normalisers, the chunk that
    u·total falls in (`uniform` [rows] on the logits' device; the cumulative probabilities
    are under softmax(logits / T + ban)), the token within it from a cumulative sum over that
    chunk alone, and the token's log-prob under softmax(logits / T). The logits are read once,
    plus one chunk per row, and every (row, chunk) is a program of its own, so few rows still
    keep the GPU busy (`blocked_inverse_cdf` in two kernels)."""
    rows, vocab = logits.shape
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    chunks = -(-vocab // block)
    stats = torch.empty(rows, 4, chunks, dtype=torch.float32, device=logits.device)
    tokens = torch.empty(rows, dtype=torch.long, device=logits.device)
    logps = torch.empty(rows, dtype=torch.float32, device=logits.device)
    banned = logits if ban is None else ban  # not read without a ban
    common = dict(HAS_BAN=ban is not None, BLOCK=block, num_warps=8)
    k = kernels()
    k.sample_chunk_kernel[(rows, chunks)](
        logits, banned, stats, logits.stride(0), vocab, chunks, float(temperature), **common
    )
    k.sample_pick_kernel[(rows,)](
        logits,
        banned,
        stats,
        uniform,
        tokens,
        logps,
        logits.stride(0),
        vocab,
        chunks,
        float(temperature),
        CHUNKS=max(2, 1 << (chunks - 1).bit_length()),
        **common,
    )
    return tokens, logps
