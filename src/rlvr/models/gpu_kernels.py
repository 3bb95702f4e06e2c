"""Triton kernels for the padding-free training forward on a GPU: the attention of
`cpu_kernels.attention`'s layout (each row's prefix, read in place by all the rows that share
it, then the row's own positions, causal), forward and backward, in the recomputation scheme of
FlashAttention (Dao et al. 2022, Algorithms 1–2; FlashAttention-2, Dao 2023, Algorithm 2).

PyTorch's scaled-dot-product attention, which the GPU otherwise runs (`fused.TorchOps`),
needs the padded [rows, heads, positions, dim] layout and an additive mask: the queries and
keys are scattered into it and the outputs gathered back, each sample gets its own copy of its
prompt's keys (and their gradient is summed back), and every (query, key) pair of the padded
rectangle is computed, masked or not. Here only the computed positions are read, in place;
only the key blocks a query block sees are computed (half of a causal rectangle, none of the
padding); a prompt's keys are read once per sample, never copied.

Used where `usable` says (`fused.layer_ops`, for the padding-free completion forward of the
update and of the log-prob passes): Triton is installed (it comes with PyTorch's CUDA builds)
and the tensors are on a GPU, or `TRITON_INTERPRET=1` was set before Triton was imported,
which runs the kernels on a CPU in Triton's interpreter (how the CPU tests check them, in
fp32). The kernels themselves are in `_gpu_kernels`, imported at first use.
"""

from __future__ import annotations

import importlib.util
import os
from functools import cache
from types import ModuleType
from typing import Any

import torch

from rlvr.models.cpu_kernels import AttentionLayout, check_attention

INSTALLED = importlib.util.find_spec("triton") is not None
"""Whether Triton is installed (without importing it: a CPU-only install has no use for it)."""

BLOCK = 64
"""Queries and keys per block of the attention kernels."""


def usable(x: torch.Tensor) -> bool:
    """Whether the kernels run for tensors like `x`: on a GPU with Triton installed, or on a
    CPU under Triton's interpreter (`TRITON_INTERPRET=1`, which must be set before Triton is
    first imported)."""
    return INSTALLED and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


@cache
def kernels() -> ModuleType:
    """`rlvr.models._gpu_kernels`, imported at the first call."""
    return importlib.import_module("rlvr.models._gpu_kernels")


class _Launch:
    """What the three attention kernels share: the grid's shape, the layout's tensors and every
    stride, and the block sizes."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, pk: torch.Tensor, layout: Any) -> None:
        batch, t = layout.rows.shape
        q_heads, dim = q.shape[1:]
        self.t, self.sp, self.kv_heads = t, pk.shape[2], k.shape[1]
        self.batch, self.q_heads = batch, q_heads
        self.prefix_blocks = -(-self.sp // BLOCK)
        device = q.device
        self.rows = layout.rows.to(device)
        counted = torch.arange(1, t + 1, device=device) * (self.rows >= 0)
        self.count = counted.amax(1) if t else torch.zeros(batch, dtype=torch.long, device=device)
        starts = layout.starts.to(device)
        positions = torch.arange(batch, device=device)
        self.row_prefix = torch.searchsorted(starts, positions, right=True) - 1
        self.tensors = (
            self.rows,
            layout.own_mask.to(device),
            layout.prefix_mask.to(device),
            self.row_prefix,
            self.count,
        )
        self.strides = (
            t,
            self.sp,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            *pk.stride()[:3],
            self.rows.stride(0),
            self.tensors[1].stride(0),
            self.tensors[2].stride(0),
        )
        self.constants = dict(
            GROUP=q_heads // self.kv_heads,
            DIM=dim,
            BLOCK_D=max(16, 1 << (dim - 1).bit_length()),
            BLOCK_M=BLOCK,
            BLOCK_N=BLOCK,
            PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        )

    def query_grid(self) -> tuple[int, int, int]:
        return (self.batch, -(-self.t // BLOCK), self.q_heads)


class _PackedAttention(torch.autograd.Function):
    """`attention`, forward in one kernel, backward in two (queries; keys and values)."""

    @staticmethod
    def forward(ctx, q, k, v, pk, pv, layout, scale):
        launch = _Launch(q, k, pk, layout)
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
        kernels().attention_forward_kernel[launch.query_grid()](
            q, k, v, pk, pv, *launch.tensors, out, lse, *launch.strides, out.stride(0),
            out.stride(1), lse.stride(0), scale, launch.prefix_blocks, **launch.constants,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, pk, pv, out, lse)
        ctx.launch, ctx.scale = launch, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, pk, pv, out, lse = ctx.saved_tensors
        launch, scale = ctx.launch, ctx.scale
        grad = grad.contiguous()
        delta = torch.linalg.vecdot(grad.float(), out.float())
        dq = torch.empty_like(q)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        parts = torch.zeros(2, launch.batch, launch.kv_heads, launch.sp, q.shape[2],
                            dtype=torch.float32, device=q.device)  # fmt: skip
        common = (*launch.tensors, lse, delta, grad)
        kernels().attention_dq_kernel[launch.query_grid()](
            q, k, v, pk, pv, *common, dq, *launch.strides, lse.stride(0), scale,
            launch.prefix_blocks, **launch.constants,
        )  # fmt: skip
        grid = (launch.batch, launch.prefix_blocks + -(-launch.t // BLOCK), launch.kv_heads)
        kernels().attention_dkv_kernel[grid](
            q, k, v, pk, pv, *common, dk, dv, parts[0], parts[1], *launch.strides,
            lse.stride(0), parts.stride(1), parts.stride(2), scale, launch.prefix_blocks,
            **launch.constants,
        )  # fmt: skip
        summed = torch.zeros(2, *pk.shape, dtype=torch.float32, device=q.device)
        summed.index_add_(1, launch.row_prefix, parts)
        return dq, dk, dv, summed[0].to(pk.dtype), summed[1].to(pv.dtype), None, None


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    prefix_k: torch.Tensor,
    prefix_v: torch.Tensor,
    layout: AttentionLayout,
    scale: float,
) -> torch.Tensor:
    """`cpu_kernels.attention` (same arguments, same result) by the Triton kernels: on a GPU in
    any floating dtype, the arithmetic in fp32 and the matmuls' inputs in the tensors' dtype.

    q [n, q_heads, dim], k, v [n, kv_heads, dim]: per computed position (`layout.rows`);
    prefix_k, prefix_v [prefixes, kv_heads, sp, dim] with the same strides, the last axis
    dense. Returns [n, q_heads, dim]."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    check_attention(q, k, v, prefix_k, prefix_v, layout, "gpu_kernels")
    return _PackedAttention.apply(q, k, v, prefix_k, prefix_v, layout, scale)
