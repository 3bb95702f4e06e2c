"""Two Triton kernels for the captured decode step (`graph_step.decode_hidden`) on a GPU, each
doing in one kernel what took PyTorch several:

- `rotate_and_store`: the rotary embedding of each row's query and key heads (RoFormer, Su et
  al. 2021, eq. 34, in Llama's half-split layout: x·cos + rotate_half(x)·sin) read from the
  packed q/k/v projection, the rotated queries written out and the rotated keys and the values
  written into the KV cache at the step's column; in PyTorch a multiply, a roll, an `addcmul`,
  two `index_copy` and a copy;
- `silu_mul`: silu(gate)·up of the SwiGLU MLP (Shazeer 2020, eq. 6) from the packed gate/up
  projection; in PyTorch a SiLU and a multiply.

Inside a CUDA graph a kernel costs no launch but still runs for microseconds however little
it does, and these element-wise kernels were about a third of the step's kernels
(`docs/benchmarks.md`, lever 29). The arithmetic is in fp32 and each output is rounded once
to the tensors' dtype (PyTorch rounds each intermediate as well).

Used where `usable` says: Triton is installed (it comes with PyTorch's CUDA builds) and the
tensors are on a GPU, or `TRITON_INTERPRET=1` was set before Triton was imported, which
runs the kernels on a CPU in Triton's interpreter (how the CPU tests check them, in fp32).
The kernels themselves are in `_triton_kernels`, imported at first use.
"""

from __future__ import annotations

import importlib.util
import os
from functools import cache
from types import ModuleType

import torch

INSTALLED = importlib.util.find_spec("triton") is not None
"""Whether Triton is installed (without importing it: a CPU-only install has no use for it)."""


def usable(x: torch.Tensor) -> bool:
    """Whether the kernels run for tensors like `x`: on a GPU with Triton installed, or on a
    CPU under Triton's interpreter (`TRITON_INTERPRET=1`, which must be set before Triton is
    first imported)."""
    return INSTALLED and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


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
) -> torch.Tensor:
    """The rotated queries [b, heads, d] of `qkv` [b, (heads + 2·kv_heads)·d] (q, k, v heads
    end to end), with the rotated keys and the values written into `keys` and `values`
    [b, kv_heads, positions, d] at position `where` (a one-element device tensor). `cos` and
    `signed_sin` [b, 1, d] are `graph_step.rotary_pair`'s, so that the rotation is
    x·cos + roll(x, d/2)·signed_sin."""
    b, kv_heads, d = keys.shape[0], keys.shape[1], keys.shape[-1]
    queries = qkv.new_empty(b, heads, d)
    k = kernels()
    k.rotate_and_store_kernel[(b, heads + 2 * kv_heads)](
        qkv,
        cos,
        signed_sin,
        queries,
        keys,
        values,
        where,
        qkv.stride(0),
        cos.stride(0),
        signed_sin.stride(0),
        queries.stride(0),
        *keys.stride()[:3],
        *values.stride()[:3],
        HEADS=heads,
        KV_HEADS=kv_heads,
        DIM=d,
        BLOCK=1 << (d - 1).bit_length(),
    )
    return queries


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate)·up [b, width] from `gate_up` [b, 2·width] (gate, then up)."""
    b, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = gate_up.new_empty(b, width)
    block = 1024
    kernels().silu_mul_kernel[(b, -(-width // block))](
        gate_up, out, gate_up.stride(0), out.stride(0), width, BLOCK=block
    )
    return out


def sample(
    logits: torch.Tensor,
    temperature: float,
    uniform: torch.Tensor,
    ban: torch.Tensor | None,
    block: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sampling.sample_tokens` without top-k or top-p, at a temperature > 0, in one kernel
    that reads each row of `logits` [rows, vocab] twice, `block` tokens at a time: the token
    of each row whose interval of the cumulative probabilities under softmax(logits / T +
    ban) holds u·total (`uniform` [rows] on the logits' device), and its log-prob under
    softmax(logits / T). One program per row loops over the vocabulary, so wide blocks (and
    8 warps) keep few, wide iterations: 38 per pass over a 152k-token row."""
    rows, vocab = logits.shape
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    tokens = torch.empty(rows, dtype=torch.long, device=logits.device)
    logps = torch.empty(rows, dtype=torch.float32, device=logits.device)
    kernels().sample_kernel[(rows,)](
        logits,
        logits if ban is None else ban,  # not read without a ban
        uniform,
        tokens,
        logps,
        logits.stride(0),
        vocab,
        float(temperature),
        HAS_BAN=ban is not None,
        BLOCK=block,
        num_warps=8,
    )
    return tokens, logps
