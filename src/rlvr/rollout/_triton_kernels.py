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


@triton.jit
def sample_kernel(
    logits,
    ban,
    uniform,
    tokens,
    logps,
    row_stride,
    vocab,
    temperature,
    HAS_BAN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program per row, two passes over its logits in blocks of `BLOCK`: the normalisers
    of softmax(logits / T) and softmax(logits / T + ban), per lane then combined; then the
    first token whose cumulative probability exceeds u·total, and its log-prob."""
    row = tl.program_id(0)
    start = logits + row * row_stride
    lanes = tl.arange(0, BLOCK)
    lowest = -3.0e38
    top = tl.full([BLOCK], lowest, tl.float32)  # per lane: max of logits / T
    total = tl.zeros([BLOCK], tl.float32)  # per lane: sum of exp(logits / T - top)
    top_ok = tl.full([BLOCK], lowest, tl.float32)  # the same with the ban added
    total_ok = tl.zeros([BLOCK], tl.float32)
    for begin in range(0, vocab, BLOCK):
        i = begin + lanes
        inside = i < vocab
        x = tl.load(start + i, mask=inside, other=float("-inf")).to(tl.float32) / temperature
        allowed = x
        if HAS_BAN:
            allowed = x + tl.load(ban + i, mask=inside, other=0.0)
        new_top = tl.maximum(top, x)
        total = total * tl.exp(top - new_top) + tl.exp(x - new_top)
        top = new_top
        new_top_ok = tl.maximum(top_ok, allowed)
        total_ok = total_ok * tl.exp(top_ok - new_top_ok) + tl.exp(allowed - new_top_ok)
        top_ok = new_top_ok
    m = tl.max(top, 0)
    log_total = m + tl.log(tl.sum(total * tl.exp(top - m), 0))
    m_ok = tl.max(top_ok, 0)
    target = tl.load(uniform + row) * tl.sum(total_ok * tl.exp(top_ok - m_ok), 0)
    running = tl.zeros([BLOCK], tl.float32)  # every lane: the cumulative sum so far
    found = tl.full([BLOCK], -1, tl.int32)  # every lane: the drawn token, -1 until found
    last = tl.full([BLOCK], 0, tl.int32)  # every lane: the last token of nonzero probability
    for begin in range(0, vocab, BLOCK):
        i = begin + lanes
        inside = i < vocab
        x = tl.load(start + i, mask=inside, other=float("-inf")).to(tl.float32) / temperature
        allowed = x
        if HAS_BAN:
            allowed = x + tl.load(ban + i, mask=inside, other=0.0)
        p = tl.exp(allowed - m_ok)
        cdf = running + tl.cumsum(p, 0)
        first = tl.min(tl.where((cdf > target) & (p > 0), i, vocab), 0)
        found = tl.where((found < 0) & (first < vocab), first, found)
        last = tl.maximum(last, tl.max(tl.where(p > 0, i, 0), 0))
        running = running + tl.sum(p, 0)
    token = tl.max(tl.where(found < 0, last, found), 0)
    chosen = tl.load(start + token).to(tl.float32) / temperature
    tl.store(tokens + row, token.to(tl.int64))
    tl.store(logps + row, chosen - log_total)
