"""The update's attention on a GPU by FlashAttention-2's variable-length kernel (Dao 2023), the
build that ships inside PyTorch (`torch.ops.aten._flash_attention_forward` / `_backward`), in
bf16 or fp16 (lever 41 of `docs/benchmarks.md`).

`cpu_kernels.AttentionLayout` is not a set of plain causal sequences: row b's keys are its
prefix's visible keys (shared by the rows of a prompt's group) followed by its own computed
positions. `plan` lays each row out as one sequence of the kernel: its queries are its own
computed positions in order, its keys the visible prefix keys and then those same positions.
With the causal mask aligned to the bottom right (FlashAttention ≥ 2.1, for sequences whose
key count exceeds their query count), query i of a row then sees every visible prefix key
and its own positions up to i: the layout's rule, whenever every computed position is
visible to the queries after it (`own_mask` 1 wherever `rows` >= 0, which the update's
layouts always are; `plan` returns None otherwise and the Triton kernels serve).

Each row gets its own copy of its prompt's keys, gathered in front of its completion's (about
30 MB a layer for 117k keys of the 0.5B shape's two K/V heads); autograd sums their gradients
back into the prompt's. The kernel itself runs on CUDA only; the CPU tests check `plan` and
everything around the kernel with `reference_varlen` in its place.
"""

from __future__ import annotations

import os
from functools import cache
from typing import NamedTuple

import torch

from rlvr.models.cpu_kernels import AttentionLayout, check_attention

ENABLED = True
"""Whether `usable` may say yes (a switch for the benchmarks' A/B; `RLVR_FLASH_VARLEN=0` too)."""

DISABLE_ENV = "RLVR_FLASH_VARLEN"


class Plan(NamedTuple):
    """One layout as the kernel's packed sequences (only the rows with a computed position).

    `queries`: the per-token rows of the sequences' queries, in order; `in_order`: whether
    they are 0, 1, 2, … (then the queries are read in place); `keys`: for each key of the
    sequences, its row in the prefix keys flattened [prefixes · sp] followed by the
    per-token keys; `cu_q`, `cu_k`: the sequences' cumulative query and key counts (int32);
    `max_q`, `max_k`: the longest sequence's."""

    queries: torch.Tensor
    in_order: bool
    keys: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int


def plan(layout: AttentionLayout) -> Plan | None:
    """`layout` as packed sequences, or None when a computed position is hidden from the
    queries after it (which bottom-right causal sequences cannot say) or none is computed.
    Made once per layout (`AttentionLayout.varlen`): it reads a few numbers back from the
    device."""
    rows, own_mask, prefix_mask = layout.rows, layout.own_mask.bool(), layout.prefix_mask.bool()
    computed = rows >= 0
    if bool((computed & ~own_mask).any()) or not bool(computed.any()):
        return None
    row_prefix = layout.row_prefix
    prefixes, sp = prefix_mask.shape
    active = computed.any(1)
    prefix_keys = row_prefix[:, None] * sp + torch.arange(sp, device=rows.device)
    candidates = torch.cat([prefix_keys, prefixes * sp + rows], dim=1)[active]
    keys = candidates[torch.cat([prefix_mask[row_prefix], computed], dim=1)[active]]
    queries = rows[computed]
    q_len = computed.sum(1)[active]
    k_len = q_len + prefix_mask.sum(1)[row_prefix][active]
    in_order = bool((queries == torch.arange(len(queries), device=rows.device)).all())
    return Plan(
        queries,
        in_order,
        keys,
        *(_cumulative(x) for x in (q_len, k_len)),
        *(int(x.max()) for x in (q_len, k_len)),
    )


def _cumulative(lengths: torch.Tensor) -> torch.Tensor:
    """[0, l0, l0 + l1, …] as int32, the kernel's sequence offsets."""
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)


@cache
def _available(index: int | None) -> bool:
    return (
        hasattr(torch.ops.aten, "_flash_attention_forward")
        and torch.backends.cuda.is_flash_attention_available()
        and torch.cuda.get_device_capability(index) >= (8, 0)
    )


def supports(dtype: torch.dtype, dim: int) -> bool:
    """Whether the kernel takes queries of `dtype` and head size `dim` (bf16 or fp16, a
    multiple of 8 up to 256) and is switched on (`ENABLED`, and not `RLVR_FLASH_VARLEN=0`)."""
    return (
        ENABLED
        and os.environ.get(DISABLE_ENV) != "0"
        and dtype in (torch.bfloat16, torch.float16)
        and dim % 8 == 0
        and dim <= 256
    )


def usable(q: torch.Tensor) -> bool:
    """Whether the kernel runs for queries like q [n, heads, dim]: `supports` them, on an NVIDIA
    GPU of compute capability 8.0 or later with PyTorch's FlashAttention build."""
    return supports(q.dtype, q.shape[-1]) and q.is_cuda and _available(q.device.index)


class _Flash(torch.autograd.Function):
    """The kernel, forward and backward (no dropout, causal)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, scale):
        out, lse, seed, offset, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, max_q, max_k, 0.0, True, False, scale=scale
        )
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, seed, offset)
        ctx.sizes = max_q, max_k, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse, cu_q, cu_k, seed, offset = ctx.saved_tensors
        max_q, max_k, scale = ctx.sizes
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            grad.contiguous(), q, k, v, out, lse, cu_q, cu_k, max_q, max_k, 0.0, True, seed,
            offset, scale=scale,
        )  # fmt: skip
        return dq, dk, dv, None, None, None, None, None


def varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    scale: float,
) -> torch.Tensor:
    """Causal attention of packed sequences, bottom-right aligned: query i of a sequence of
    lq queries and lk keys sees its keys 0 … lk - lq + i (softmax(q·kᵀ·scale)·v); q [Tq,
    heads, dim], k, v [Tk, kv_heads, dim] with kv_heads dividing heads (grouped queries)."""
    return _Flash.apply(q, k, v, cu_q, cu_k, max_q, max_k, scale)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    prefix_k: torch.Tensor,
    prefix_v: torch.Tensor,
    layout: AttentionLayout,
    scale: float,
    packed: Plan,
) -> torch.Tensor:
    """`cpu_kernels.attention` (same arguments and result) through `varlen` over `packed`
    (`layout.varlen`): differentiable in q, k, v and the prefixes' keys and values."""
    check_attention(q, k, v, prefix_k, prefix_v, layout, "flash_varlen")
    n, heads, dim = q.shape
    prefixes, kv_heads, sp, _ = prefix_k.shape

    def laid_out(prefix: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
        flat = prefix.transpose(1, 2).reshape(prefixes * sp, kv_heads, dim)
        return torch.cat([flat, own]).index_select(0, packed.keys)

    in_place = packed.in_order and len(packed.queries) == n
    queries = q if in_place else q.index_select(0, packed.queries)
    out = varlen(
        queries.contiguous(), laid_out(prefix_k, k), laid_out(prefix_v, v), packed.cu_q,
        packed.cu_k, packed.max_q, packed.max_k, scale,
    )  # fmt: skip
    if in_place:
        return out
    return out.new_zeros(n, heads, dim).index_copy(0, packed.queries, out)
