"""`triton_ops.rotate_and_store` as it was before lever 44 (one program per row and head),
for `gpu_ab.py`'s decode way "packed step, norms apart, rotation per head". Imported only by
that way."""

import torch
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
    row = tl.program_id(0).to(tl.int64)  # row × stride can pass 2**31
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


def rotate_and_store(qkv, cos, signed_sin, keys, values, where, heads: int) -> torch.Tensor:
    """`triton_ops.rotate_and_store` by the kernel above: a grid of rows × heads."""
    b, kv_heads, d = keys.shape[0], keys.shape[1], keys.shape[-1]
    queries = qkv.new_empty(b, heads, d)
    rotate_and_store_kernel[(b, heads + 2 * kv_heads)](
        qkv, cos, signed_sin, queries, keys, values, where, qkv.stride(0), cos.stride(0),
        signed_sin.stride(0), queries.stride(0), *keys.stride()[:3], *values.stride()[:3],
        HEADS=heads, KV_HEADS=kv_heads, DIM=d, BLOCK=1 << (d - 1).bit_length(),
    )  # fmt: skip
    return queries
