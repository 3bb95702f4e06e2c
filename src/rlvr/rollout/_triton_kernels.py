"""The Triton kernels of `rlvr.rollout.triton_ops` (imported on first use, so that importing
rlvr does not import Triton)."""

import triton
import triton.language as tl


@triton.jit
def rotate_and_store_kernel(
    qkv,
    cos,
    sin,
    queries,
    keys,
    values,
    where,
    qkv_row,
    cos_row,
    sin_row,
    query_row,
    key_row,
    key_head,
    key_position,
    value_row,
    value_head,
    value_position,
    HEADS: tl.constexpr,
    KV_HEADS: tl.constexpr,
    DIM: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program per (row, head of q, k and v): rotate a query or key head and store
    it, or store a value head."""
    row = tl.program_id(0)
    head = tl.program_id(1)
    i = tl.arange(0, BLOCK)
    inside = i < DIM
    start = qkv + row * qkv_row + head * DIM
    x = tl.load(start + i, mask=inside, other=0.0).to(tl.float32)
    column = tl.load(where)
    if head < HEADS + KV_HEADS:
        half = DIM // 2
        partner = tl.where(i < half, i + half, i - half)  # roll(x, DIM / 2)
        rolled = tl.load(start + partner, mask=inside, other=0.0).to(tl.float32)
        c = tl.load(cos + row * cos_row + i, mask=inside, other=0.0).to(tl.float32)
        s = tl.load(sin + row * sin_row + i, mask=inside, other=0.0).to(tl.float32)
        y = x * c + rolled * s
        if head < HEADS:
            out = queries + row * query_row + head * DIM + i
            tl.store(out, y.to(queries.dtype.element_ty), mask=inside)
        else:
            at = row * key_row + (head - HEADS) * key_head + column * key_position
            tl.store(keys + at + i, y.to(keys.dtype.element_ty), mask=inside)
    else:
        at = row * value_row + (head - HEADS - KV_HEADS) * value_head
        at += column * value_position
        tl.store(values + at + i, x.to(values.dtype.element_ty), mask=inside)


@triton.jit
def silu_mul_kernel(gate_up, out, in_row, out_row, width, BLOCK: tl.constexpr):
    """One program per (row, block of `BLOCK` columns): silu(gate)·up."""
    row = tl.program_id(0)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = i < width
    gate = tl.load(gate_up + row * in_row + i, mask=inside, other=0.0).to(tl.float32)
    up = tl.load(gate_up + row * in_row + width + i, mask=inside, other=0.0).to(tl.float32)
    y = gate * tl.sigmoid(gate) * up
    tl.store(out + row * out_row + i, y.to(out.dtype.element_ty), mask=inside)
