"""The Triton kernels of `rlvr.rollout.triton_ops` (imported on first use, so that importing
rlvr does not import Triton)."""

import triton
import triton.language as tl

from rlvr.models._gpu_kernels import NEGATIVE, _online_block


@triton.jit
def inverse_rms(hidden, row, hidden_row, eps, HIDDEN: tl.constexpr, BLOCK_W: tl.constexpr):
    """rsqrt(mean(h²) + eps) of the row's hidden state h, in fp32: RMSNorm's scale (Zhang and
    Sennrich 2019, eq. 4) without its gain, which the folded weights hold."""
    j = tl.arange(0, BLOCK_W)
    x = tl.load(hidden + row * hidden_row + j, mask=j < HIDDEN, other=0.0).to(tl.float32)
    return tl.rsqrt(tl.sum(x * x, 0) / HIDDEN + eps)


@triton.jit
def rotate_and_store_kernel(
    qkv,
    cos,
    sin,
    hidden,
    bias,
    queries,
    keys,
    values,
    where,
    eps,
    hidden_row,
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
    NORM: tl.constexpr,
    BIAS: tl.constexpr,
    HIDDEN: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program per row, over all its q, k and v heads at once ([BLOCK_H, BLOCK] lanes):
    rotate the query and key heads, store the queries, and write the keys and values at the
    cache's column `where`. With NORM, qkv is the matmul of the raw hidden state with weights
    that hold the RMSNorm gain, and is first scaled by the row's `inverse_rms`; with BIAS the
    projections' bias is added after that."""
    row = tl.program_id(0).to(tl.int64)  # row × stride can pass 2**31
    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, BLOCK)[None, :]
    live = (h < HEADS + 2 * KV_HEADS) & (i < DIM)
    rotated = h < HEADS + KV_HEADS
    start = qkv + row * qkv_row + h * DIM
    x = tl.load(start + i, mask=live, other=0.0).to(tl.float32)
    half = DIM // 2
    partner = tl.where(i < half, i + half, i - half)  # roll(x, DIM / 2)
    rolled = tl.load(start + partner, mask=live & rotated, other=0.0).to(tl.float32)
    if NORM:
        scale = inverse_rms(hidden, row, hidden_row, eps, HIDDEN, BLOCK_W)
        x, rolled = x * scale, rolled * scale
    if BIAS:
        x += tl.load(bias + h * DIM + i, mask=live, other=0.0).to(tl.float32)
        rolled += tl.load(bias + h * DIM + partner, mask=live & rotated, other=0.0).to(tl.float32)
    c = tl.load(cos + row * cos_row + i, mask=i < DIM, other=0.0).to(tl.float32)
    s = tl.load(sin + row * sin_row + i, mask=i < DIM, other=0.0).to(tl.float32)
    y = tl.where(rotated, x * c + rolled * s, x)
    column = tl.load(where)
    out = queries + row * query_row + h * DIM + i
    tl.store(out, y.to(queries.dtype.element_ty), mask=live & (h < HEADS))
    at = row * key_row + (h - HEADS) * key_head + column * key_position
    tl.store(keys + at + i, y.to(keys.dtype.element_ty), mask=live & rotated & (h >= HEADS))
    at = row * value_row + (h - HEADS - KV_HEADS) * value_head + column * value_position
    tl.store(values + at + i, y.to(values.dtype.element_ty), mask=live & ~rotated)


@triton.jit
def normed_silu_mul_kernel(
    gate_up,
    hidden,
    bias,
    out,
    width,
    eps,
    gate_up_row,
    hidden_row,
    BIAS: tl.constexpr,
    HIDDEN: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program per (row, block of BLOCK columns): silu(a)·b (SwiGLU, Shazeer 2020, eq. 6)
    of the gate and up halves of `gate_up` [rows, 2·width], each first scaled by the row's
    `inverse_rms` (the matmul's weights hold the RMSNorm gain) and, with BIAS, plus its bias."""
    row = tl.program_id(0).to(tl.int64)  # row × stride can pass 2**31
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = i < width
    scale = inverse_rms(hidden, row, hidden_row, eps, HIDDEN, BLOCK_W)
    start = gate_up + row * gate_up_row
    a = tl.load(start + i, mask=inside, other=0.0).to(tl.float32) * scale
    b = tl.load(start + width + i, mask=inside, other=0.0).to(tl.float32) * scale
    if BIAS:
        a += tl.load(bias + i, mask=inside, other=0.0).to(tl.float32)
        b += tl.load(bias + width + i, mask=inside, other=0.0).to(tl.float32)
    y = a / (1.0 + tl.exp(-a)) * b
    tl.store(out + row * width + i, y.to(out.dtype.element_ty), mask=inside)


@triton.jit
def decode_attention_kernel(
    q,
    keys,
    values,
    bias,
    out,
    partial,
    stats,
    span,
    per_split,
    splits,
    scale,
    q_row,
    key_row,
    key_head,
    key_position,
    value_row,
    value_head,
    value_position,
    bias_row,
    GROUP: tl.constexpr,
    DIM: tl.constexpr,
    SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One program per (row, K/V head, split of the keys): the one query of each of the head's
    GROUP query heads against the keys [split·per_split, (split + 1)·per_split) ∩ [0, span)
    that the row's `bias` (0 or -inf) shows, by the online softmax (`_online_block`), the K/V
    head read once for its group as the [BLOCK_G, BLOCK_D] side of each block's matmuls.
    Without SPLIT the normalised output goes to `out` [row, heads·DIM]; with it the
    unnormalised sum to `partial` [splits, row, heads, DIM] and the running max and sum to
    `stats` [2, splits, row, heads], for `decode_attention_merge_kernel` (split-KV decoding,
    FlashDecoding: Dao et al. 2023)."""
    row = tl.program_id(0).to(tl.int64)  # row × stride can pass 2**31
    head = tl.program_id(1)
    split = tl.program_id(2)
    rows = tl.num_programs(0)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    real = (g < GROUP)[:, None] & (d < DIM)[None, :]
    query_heads = head * GROUP + g
    queries = tl.load(
        q + row * q_row + query_heads[:, None] * DIM + d[None, :], mask=real, other=0.0
    )
    m = tl.full([BLOCK_G], NEGATIVE, tl.float32)
    total = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    start = split * per_split
    end = tl.minimum(start + per_split, span)
    k_start = keys + row * key_row + head * key_head
    v_start = values + row * value_row + head * value_head
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        live = n < end
        block = live[:, None] & (d < DIM)[None, :]
        k = tl.load(k_start + n[:, None] * key_position + d[None, :], mask=block, other=0.0)
        v = tl.load(v_start + n[:, None] * value_position + d[None, :], mask=block, other=0.0)
        shown = tl.load(bias + row * bias_row + n, mask=live, other=float("-inf")) == 0
        visible = shown[None, :] & (g < GROUP)[:, None]
        m, total, acc = _online_block(queries, k, v, visible, m, total, acc, scale, PRECISION)
    if SPLIT:
        at = (split * rows + row) * GROUP * tl.num_programs(1) + query_heads
        tl.store(partial + at[:, None] * DIM + d[None, :], acc, mask=real)
        tl.store(stats + at, m, mask=g < GROUP)
        tl.store(stats + splits * rows * GROUP * tl.num_programs(1) + at, total, mask=g < GROUP)
    else:
        y = acc / tl.where(total > 0, total, 1.0)[:, None]
        at = out + row * GROUP * tl.num_programs(1) * DIM + query_heads[:, None] * DIM + d[None, :]
        tl.store(at, y.to(out.dtype.element_ty), mask=real)


@triton.jit
def decode_attention_merge_kernel(
    partial,
    stats,
    out,
    splits,
    heads,
    DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One program per (row, query head): the splits' partial outputs of
    `decode_attention_kernel` weighted by exp(mᵢ − max m) and divided by the likewise weighted
    sum of their sums, into `out` [row, heads·DIM]."""
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    rows = tl.num_programs(0)
    i = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    at = (i * rows + row) * heads + head
    m = tl.load(stats + at, mask=i < splits, other=NEGATIVE)
    total = tl.load(stats + splits * rows * heads + at, mask=i < splits, other=0.0)
    weight = tl.exp(m - tl.max(m, 0))
    norm = tl.sum(weight * total, 0)
    acc = tl.load(
        partial + at[:, None] * DIM + d[None, :],
        mask=(i < splits)[:, None] & (d < DIM)[None, :],
        other=0.0,
    )
    y = tl.sum(acc * weight[:, None], 0) / tl.where(norm > 0, norm, 1.0)
    tl.store(out + (row * heads + head) * DIM + d, y.to(out.dtype.element_ty), mask=d < DIM)


@triton.jit
def scaled(row_logits, ban, i, inside, temperature, HAS_BAN: tl.constexpr):
    """The logits `i` of a row divided by T in fp32 (-inf outside the row), and the same plus
    the ban."""
    x = tl.load(row_logits + i, mask=inside, other=float("-inf")).to(tl.float32) / temperature
    if HAS_BAN:
        return x, x + tl.load(ban + i, mask=inside, other=0.0)
    return x, x


@triton.jit
def sample_chunk_kernel(
    logits,
    ban,
    stats,
    row_stride,
    vocab,
    chunks,
    temperature,
    HAS_BAN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program per (row, chunk of `BLOCK` tokens): the chunk's max and sum of exp(x − max)
    for x = logits / T and for x + ban, into `stats` [rows, 4, chunks]. The ban is 0 or -inf
    (`sampling.ban_bias`), so while the chunk's largest x is not banned both sums take the
    same exponentials (one pass of them, the same values as two); without a ban they are one
    sum."""
    row = tl.program_id(0).to(tl.int64)  # row × stride can pass 2**31
    chunk = tl.program_id(1)
    i = chunk * BLOCK + tl.arange(0, BLOCK)
    inside = i < vocab
    x, allowed = scaled(logits + row * row_stride, ban, i, inside, temperature, HAS_BAN)
    top = tl.max(x, 0)
    e = tl.exp(x - top)
    total = tl.sum(e, 0)
    top_ok, total_ok = top, total
    if HAS_BAN:
        top_ok = tl.max(allowed, 0)
        if top_ok == top:
            total_ok = tl.sum(tl.where(allowed == x, e, 0.0), 0)
        else:
            shift = tl.where(top_ok > float("-inf"), top_ok, 0.0)  # a chunk may be banned whole
            total_ok = tl.sum(tl.exp(allowed - shift), 0)
    out = stats + row * 4 * chunks + chunk
    tl.store(out, top)
    tl.store(out + chunks, total)
    tl.store(out + 2 * chunks, top_ok)
    tl.store(out + 3 * chunks, total_ok)


@triton.jit
def sample_pick_kernel(
    logits,
    ban,
    stats,
    uniform,
    tokens,
    logps,
    row_stride,
    vocab,
    chunks,
    temperature,
    HAS_BAN: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNKS: tl.constexpr,
):
    """One program per row: the normalisers from the chunks' statistics, the chunk that
    u·total falls in, then the token within it (a cumulative sum over that chunk alone), and
    the token's log-prob under softmax(logits / T)."""
    row = tl.program_id(0).to(tl.int64)  # row × stride can pass 2**31
    c = tl.arange(0, CHUNKS)
    real = c < chunks
    start = stats + row * 4 * chunks
    top = tl.load(start + c, mask=real, other=float("-inf"))
    total = tl.load(start + chunks + c, mask=real, other=0.0)
    top_ok = tl.load(start + 2 * chunks + c, mask=real, other=float("-inf"))
    total_ok = tl.load(start + 3 * chunks + c, mask=real, other=0.0)
    m = tl.max(top, 0)
    log_total = m + tl.log(tl.sum(tl.where(total > 0, total * tl.exp(top - m), 0.0), 0))
    m_ok = tl.max(top_ok, 0)
    weight = tl.where(total_ok > 0, total_ok * tl.exp(top_ok - m_ok), 0.0)
    ends = tl.cumsum(weight, 0)
    target = tl.load(uniform + row) * tl.sum(weight, 0)
    hit = tl.min(tl.where((ends > target) & (weight > 0), c, CHUNKS), 0)
    last_chunk = tl.max(tl.where(weight > 0, c, 0), 0)
    chosen = tl.where(hit < CHUNKS, hit, last_chunk)
    before = tl.sum(tl.where(c < chosen, weight, 0.0), 0)
    i = chosen * BLOCK + tl.arange(0, BLOCK)
    inside = i < vocab
    row_logits = logits + row * row_stride
    _, allowed = scaled(row_logits, ban, i, inside, temperature, HAS_BAN)
    p = tl.exp(allowed - m_ok)
    cdf = tl.cumsum(p, 0)
    offset = target - before
    first = tl.min(tl.where((cdf > offset) & (p > 0), i, vocab), 0)
    last = tl.max(tl.where(p > 0, i, 0), 0)
    token = tl.where(first < vocab, first, last)
    x_token = tl.load(row_logits + token).to(tl.float32) / temperature
    tl.store(tokens + row, token.to(tl.int64))
    tl.store(logps + row, x_token - log_total)
