"""The Triton kernels of `rlvr.models.gpu_kernels` (imported on first use, so that importing
rlvr does not import Triton): the attention's forward and its two backward kernels, the token
statistics and their logit gradient, the rotary embedding and SiLU·up (each with a flag for
its backward).

The attention's layout is `cpu_kernels.AttentionLayout`'s: row b of the batch has the sp keys
of its prefix p = row_prefix[b] and then its own t positions; position i of row b is per-token
row rows[b, i] of q, k, v (or -1: not computed, hidden). Query i of row b sees prefix key j
where prefix_mask[p, j] != 0 and its own key i' <= i where own_mask[b, i'] != 0 and
rows[b, i'] >= 0; its own key always. `count[b]` is one past row b's last computed position.
"""

import triton
import triton.language as tl

NEGATIVE = tl.constexpr(-1.0e30)
"""The score of a hidden key: exp(NEGATIVE - max) is 0, and NEGATIVE - NEGATIVE is not NaN."""


@triton.jit
def _per_token(x, idx, live, x_row, x_head, head, d, in_dim):
    """Head `head` of per-token rows idx of x (zeros where not live)."""
    at = idx[:, None] * x_row + head * x_head + d[None, :]
    return tl.load(x + at, mask=live[:, None] & in_dim[None, :], other=0.0)


@triton.jit
def _query_block(q, rows, b, i, t, rows_row, q_row, q_head, head, d, in_dim):
    """Row b's positions i: their per-token rows (-1 outside), whether computed, their queries."""
    idx = tl.load(rows + b * rows_row + i, mask=i < t, other=-1)
    live = idx >= 0
    return idx, live, _per_token(q, idx, live, q_row, q_head, head, d, in_dim)


@triton.jit
def _prefix_keys(
    pk, pv, prefix_mask, p, head, j, sp, pk_prefix, pk_head, pk_pos, mask_row, d, in_dim
):
    """Prefix p's keys and values j of key/value head `head`, and whether each is visible."""
    inside = j < sp
    at = p * pk_prefix + head * pk_head + j[:, None] * pk_pos + d[None, :]
    load = inside[:, None] & in_dim[None, :]
    keys = tl.load(pk + at, mask=load, other=0.0)
    values = tl.load(pv + at, mask=load, other=0.0)
    seen = tl.load(prefix_mask + p * mask_row + j, mask=inside, other=0) != 0
    return keys, values, seen


@triton.jit
def _own_keys(k, v, rows, own_mask, b, j, t, rows_row, own_row, k_row, k_head, head, d, in_dim):
    """Row b's own keys and values j of key/value head `head`, their per-token rows (-1 where not
    computed) and whether each is visible to the queries after it."""
    inside = (j >= 0) & (j < t)
    kidx = tl.load(rows + b * rows_row + j, mask=inside, other=-1)
    exists = kidx >= 0
    at = kidx[:, None] * k_row + head * k_head + d[None, :]
    load = exists[:, None] & in_dim[None, :]
    keys = tl.load(k + at, mask=load, other=0.0)
    values = tl.load(v + at, mask=load, other=0.0)
    seen = (tl.load(own_mask + b * own_row + j, mask=inside, other=0) != 0) & exists
    return kidx, keys, values, seen


@triton.jit
def _key_block(
    block, PREFIX_BLOCKS, b, kv_head, k, v, pk, pv, rows, own_mask, prefix_mask, row_prefix,
    t, sp, k_row, k_head, pk_prefix, pk_head, pk_pos, rows_row, own_row, mask_row, d, in_dim,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Key block `block` of row b (key/value head `kv_head`): blocks [0, PREFIX_BLOCKS) are its
    prefix's keys, the next its own positions. Returns the own positions jo (negative in a
    prefix block, whose keys every query sees: jo <= i), their per-token rows (-1 where none),
    the keys, the values and whether each key is visible to the queries after it. A prefix
    block loads no own keys and an own block no prefix keys (masked loads move nothing)."""
    prefix = block < PREFIX_BLOCKS
    jp = block * BLOCK_N + tl.arange(0, BLOCK_N)
    jo = jp - PREFIX_BLOCKS * BLOCK_N
    prefix_keys, prefix_values, prefix_seen = _prefix_keys(
        pk, pv, prefix_mask, tl.load(row_prefix + b), kv_head, jp, tl.where(prefix, sp, 0),
        pk_prefix, pk_head, pk_pos, mask_row, d, in_dim,
    )  # fmt: skip
    kidx, own_keys, own_values, own_seen = _own_keys(
        k, v, rows, own_mask, b, jo, tl.where(prefix, 0, t), rows_row, own_row, k_row, k_head,
        kv_head, d, in_dim,
    )  # fmt: skip
    keys = tl.where(prefix, prefix_keys, own_keys)
    values = tl.where(prefix, prefix_values, own_values)
    return jo, kidx, keys, values, tl.where(prefix, prefix_seen, own_seen)


@triton.jit
def _visible(i, live, jo, seen):
    """[queries i, keys jo] of `_key_block`: causal over the visible keys, and each query's own
    key; nothing for the queries not computed."""
    own = (seen[None, :] & (jo[None, :] <= i[:, None])) | (jo[None, :] == i[:, None])
    return own & live[:, None]


@triton.jit
def _online_block(queries, keys, values, visible, m, total, acc, scale, PRECISION: tl.constexpr):
    """One key block of the online softmax (FlashAttention, Dao et al. 2022, Algorithm 1): the
    running max m, the sum of exponentials `total` and the unnormalised output `acc`."""
    s = tl.dot(queries, tl.trans(keys), input_precision=PRECISION) * scale
    s = tl.where(visible, s, NEGATIVE)
    m_new = tl.maximum(m, tl.max(s, 1))
    p = tl.where(visible, tl.exp(s - m_new[:, None]), 0.0)
    alpha = tl.exp(m - m_new)
    total = total * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(values.dtype), values, input_precision=PRECISION)
    return m_new, total, acc


@triton.jit
def _score_grads(queries, keys, values, visible, lse, delta, dout, scale, PRECISION: tl.constexpr):
    """The block's probabilities P = exp(scale q·kᵀ - lse) on the visible keys and the scores'
    gradient dS = P (dP - delta), dP = dout·vᵀ (FlashAttention-2, Dao 2023, Algorithm 2)."""
    s = tl.dot(queries, tl.trans(keys), input_precision=PRECISION) * scale
    p = tl.where(visible, tl.exp(s - lse[:, None]), 0.0)
    dp = tl.dot(dout, tl.trans(values), input_precision=PRECISION)
    return p, p * (dp - delta[:, None])


@triton.jit
def _accumulate(
    queries, keys, values, visible, m, total, acc, grads, row_lse, row_delta, scale,
    BACKWARD: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One key block of `attention_queries_kernel`: the online softmax's step forward; with
    BACKWARD, the queries' gradient's sum Σ dS·k (scaled by the caller)."""
    if BACKWARD:
        _probs, ds = _score_grads(
            queries, keys, values, visible, row_lse, row_delta, grads, scale, PRECISION
        )
        acc += tl.dot(ds.to(keys.dtype), keys, input_precision=PRECISION)
    else:
        m, total, acc = _online_block(
            queries, keys, values, visible, m, total, acc, scale, PRECISION
        )
    return m, total, acc


@triton.jit
def _own_block(
    block, i, live, queries, grads, row_lse, row_delta, m, total, acc, k, v, rows, own_mask, b,
    t, rows_row, own_row, k_row, k_head, kv_head, d, in_dim, scale,
    CAUSAL: tl.constexpr, BACKWARD: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """`_accumulate` over row b's own key block `block`; CAUSAL for a block that reaches the
    queries i (the causal test and each query's own key), not for one wholly before them,
    where every visible key is seen."""
    j = block * BLOCK_N + tl.arange(0, BLOCK_N)
    _kidx, keys, values, seen = _own_keys(
        k, v, rows, own_mask, b, j, t, rows_row, own_row, k_row, k_head, kv_head, d, in_dim
    )
    visible = _visible(i, live, j, seen) if CAUSAL else live[:, None] & seen[None, :]
    return _accumulate(
        queries, keys, values, visible, m, total, acc, grads, row_lse, row_delta, scale,
        BACKWARD, PRECISION,
    )  # fmt: skip


@triton.jit
def attention_queries_kernel(
    q, k, v, pk, pv, rows, own_mask, prefix_mask, row_prefix, count, lse, delta, dout, outputs,
    out, t, sp, q_row, q_head, k_row, k_head, pk_prefix, pk_head, pk_pos, rows_row, own_row,
    mask_row, lse_row, scale,
    BACKWARD: tl.constexpr, GROUP: tl.constexpr, DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One program per (row b, block of BLOCK_M positions, query head), over the key blocks
    the block's computed queries see: the prefix's, then the row's own up to the block's last
    position (the blocks above the diagonal are skipped), in separate loops, so that no
    iteration computes another's addresses or selects between them, and only the own blocks
    that reach the diagonal make the causal test. Forward: the outputs into `out` and
    the log-sum-exps into `lse` (the online softmax, FlashAttention Algorithm 1). BACKWARD:
    the queries' gradient dq = scale Σ dS·k into `out`, from the outputs' gradient dout and
    the forward's lse, with delta = Σ dout·outputs per query (FlashAttention-2, Algorithm 2),
    computed here from the forward's `outputs` in fp32 and written to `delta` for the keys'
    kernel. out, dout and outputs are laid out like q, delta like lse."""
    b = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1) * BLOCK_M
    head = tl.program_id(2)
    kv_head = head // GROUP
    d = tl.arange(0, BLOCK_D)
    in_dim = d < DIM
    i = start + tl.arange(0, BLOCK_M)
    idx, live, queries = _query_block(q, rows, b, i, t, rows_row, q_row, q_head, head, d, in_dim)
    m = tl.full([BLOCK_M], NEGATIVE, tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    grads, row_lse, row_delta = queries, m, m  # read by backward only
    if BACKWARD:
        grads = _per_token(dout, idx, live, q_row, q_head, head, d, in_dim)
        row_lse = tl.load(lse + idx * lse_row + head, mask=live, other=0.0)
        forward = _per_token(outputs, idx, live, q_row, q_head, head, d, in_dim)
        row_delta = tl.sum(grads.to(tl.float32) * forward.to(tl.float32), 1)
        tl.store(delta + idx * lse_row + head, row_delta, mask=live)
    computed = start < tl.load(count + b)
    prefix = tl.load(row_prefix + b)
    for block in range(0, tl.where(computed, tl.cdiv(sp, BLOCK_N), 0)):
        j = block * BLOCK_N + tl.arange(0, BLOCK_N)
        keys, values, seen = _prefix_keys(
            pk, pv, prefix_mask, prefix, kv_head, j, sp, pk_prefix, pk_head, pk_pos, mask_row,
            d, in_dim,
        )  # fmt: skip
        m, total, acc = _accumulate(
            queries, keys, values, live[:, None] & seen[None, :], m, total, acc, grads,
            row_lse, row_delta, scale, BACKWARD, PRECISION,
        )  # fmt: skip
    below = start // BLOCK_N  # own key blocks wholly before the first query: no causal test
    own_blocks = tl.cdiv(tl.minimum(start + BLOCK_M, t), BLOCK_N)
    for block in range(0, tl.where(computed, below, 0)):
        m, total, acc = _own_block(
            block, i, live, queries, grads, row_lse, row_delta, m, total, acc, k, v, rows,
            own_mask, b, t, rows_row, own_row, k_row, k_head, kv_head, d, in_dim, scale,
            False, BACKWARD, BLOCK_N, PRECISION,
        )  # fmt: skip
    for block in range(below, tl.where(computed, own_blocks, below)):
        m, total, acc = _own_block(
            block, i, live, queries, grads, row_lse, row_delta, m, total, acc, k, v, rows,
            own_mask, b, t, rows_row, own_row, k_row, k_head, kv_head, d, in_dim, scale,
            True, BACKWARD, BLOCK_N, PRECISION,
        )  # fmt: skip
    at = idx[:, None] * q_row + head * q_head + d[None, :]
    store = live[:, None] & in_dim[None, :]
    if BACKWARD:
        tl.store(out + at, (acc * scale).to(out.dtype.element_ty), mask=store)
    else:
        total = tl.where(live, total, 1.0)
        tl.store(out + at, (acc / total[:, None]).to(out.dtype.element_ty), mask=store)
        tl.store(lse + idx * lse_row + head, m + tl.log(total), mask=live)


@triton.jit
def _key_grads(
    i0, b, head, q, rows, dout, lse, delta, keys, values, jo, seen, dkeys, dvalues, t,
    rows_row, q_row, q_head, lse_row, d, in_dim, scale,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """`attention_dkv_kernel`'s sums over the query block from i0 of row b, query head
    `head`: dv += Pᵀ·dout, dk += dSᵀ·q (scaled by the caller). CAUSAL for a query block that
    may come before some of the keys jo, not for one wholly after them."""
    i = i0 + tl.arange(0, BLOCK_M)
    idx, live, queries = _query_block(q, rows, b, i, t, rows_row, q_row, q_head, head, d, in_dim)
    grads = _per_token(dout, idx, live, q_row, q_head, head, d, in_dim)
    row_lse = tl.load(lse + idx * lse_row + head, mask=live, other=0.0)
    row_delta = tl.load(delta + idx * lse_row + head, mask=live, other=0.0)
    visible = _visible(i, live, jo, seen) if CAUSAL else live[:, None] & seen[None, :]
    p, ds = _score_grads(
        queries, keys, values, visible, row_lse, row_delta, grads, scale, PRECISION
    )
    dvalues += tl.dot(tl.trans(p.to(grads.dtype)), grads, input_precision=PRECISION)
    dkeys += tl.dot(tl.trans(ds.to(queries.dtype)), queries, input_precision=PRECISION)
    return dkeys, dvalues


@triton.jit
def attention_dkv_kernel(
    q, k, v, pk, pv, rows, own_mask, prefix_mask, row_prefix, count, lse, delta, dout,
    dk, dv, part_dpk, part_dpv,
    t, sp, q_row, q_head, k_row, k_head, pk_prefix, pk_head, pk_pos, rows_row, own_row,
    mask_row, lse_row, part_row, part_head, scale,
    GROUP: tl.constexpr, DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """The keys' and values' gradients, one program per (row b, key block, key/value head):
    dv = Σ Pᵀ·dout and dk = scale Σ dSᵀ·q over the GROUP query heads of the key/value head and
    the row's queries that see the block (from the block's first position on, for an own
    block). A prefix block's gradients from row b go to part_dpk, part_dpv [batch, kv_heads,
    sp, dim] (fp32; the caller sums the rows of each prefix); an own block's to dk, dv, laid
    out like k."""
    b = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    kv_head = tl.program_id(2)
    PREFIX_BLOCKS = tl.cdiv(sp, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    in_dim = d < DIM
    jo, kidx, keys, values, seen = _key_block(
        block, PREFIX_BLOCKS, b, kv_head, k, v, pk, pv, rows, own_mask, prefix_mask, row_prefix,
        t, sp, k_row, k_head, pk_prefix, pk_head, pk_pos, rows_row, own_row, mask_row, d,
        in_dim, BLOCK_N,
    )  # fmt: skip
    dkeys = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dvalues = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    first = tl.maximum((block - PREFIX_BLOCKS) * BLOCK_N, 0)
    last = tl.load(count + b)
    # the query blocks from `first` that a key of an own block may follow (causal test)
    diagonal = tl.where(block < PREFIX_BLOCKS, 0, tl.cdiv(BLOCK_N, BLOCK_M))
    after = tl.minimum(first + diagonal * BLOCK_M, last)
    for g in range(GROUP):
        head = kv_head * GROUP + g
        for i0 in range(first, after, BLOCK_M):
            dkeys, dvalues = _key_grads(
                i0, b, head, q, rows, dout, lse, delta, keys, values, jo, seen, dkeys, dvalues,
                t, rows_row, q_row, q_head, lse_row, d, in_dim, scale,
                True, BLOCK_M, PRECISION,
            )  # fmt: skip
        for i0 in range(after, last, BLOCK_M):
            dkeys, dvalues = _key_grads(
                i0, b, head, q, rows, dout, lse, delta, keys, values, jo, seen, dkeys, dvalues,
                t, rows_row, q_row, q_head, lse_row, d, in_dim, scale,
                False, BLOCK_M, PRECISION,
            )  # fmt: skip
    dkeys = dkeys * scale
    jp = block * BLOCK_N + tl.arange(0, BLOCK_N)
    at = b * part_row + kv_head * part_head + jp[:, None] * DIM + d[None, :]
    store = (jp < tl.where(block < PREFIX_BLOCKS, sp, 0))[:, None] & in_dim[None, :]
    tl.store(part_dpk + at, dkeys, mask=store)
    tl.store(part_dpv + at, dvalues, mask=store)
    at = kidx[:, None] * k_row + kv_head * k_head + d[None, :]
    store = (kidx >= 0)[:, None] & in_dim[None, :]
    tl.store(dk + at, dkeys.to(dk.dtype.element_ty), mask=store)
    tl.store(dv + at, dvalues.to(dv.dtype.element_ty), mask=store)


@triton.jit
def token_stats_kernel(
    logits, tokens, logp, entropy, lse, vocab, logits_row, inverse_t,
    WITH_ENTROPY: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One program per row of logits x: with z = x / T, its log-sum-exp L, log p[y] = z[y] - L
    for its token y and (WITH_ENTROPY) H = L - Σ p·z, in one pass over the row: each lane keeps
    a running max, Σ exp(z - max) and Σ exp(z - max)·z, rescaled when its max grows (the online
    softmax of Milakov & Gimelshein 2018), and the lanes are combined at the end."""
    row = tl.program_id(0).to(tl.int64)
    start = logits + row * logits_row
    high = tl.full([BLOCK], NEGATIVE, tl.float32)
    total = tl.zeros([BLOCK], tl.float32)
    weighted = tl.zeros([BLOCK], tl.float32)
    for first in range(0, vocab, BLOCK):
        cols = first + tl.arange(0, BLOCK)
        inside = cols < vocab
        z = tl.load(start + cols, mask=inside, other=0.0).to(tl.float32) * inverse_t
        z = tl.where(inside, z, NEGATIVE)
        new_high = tl.maximum(high, z)
        shrink = tl.exp(high - new_high)
        e = tl.where(inside, tl.exp(z - new_high), 0.0)
        total = total * shrink + e
        if WITH_ENTROPY:
            weighted = weighted * shrink + e * z
        high = new_high
    top = tl.max(high, 0)
    lanes = tl.exp(high - top)
    summed = tl.sum(total * lanes, 0)
    log_total = top + tl.log(summed)
    token = tl.load(tokens + row)
    known = (token >= 0) & (token < vocab)  # checked by the caller; never read outside
    chosen = tl.load(start + token, mask=known, other=float("nan")).to(tl.float32) * inverse_t
    tl.store(logp + row, chosen - log_total)
    tl.store(lse + row, log_total)
    if WITH_ENTROPY:
        tl.store(entropy + row, log_total - tl.sum(weighted * lanes, 0) / summed)


@triton.jit
def logit_grad_kernel(
    logits, tokens, lse, entropy, g_logp, g_entropy, out, vocab, logits_row, out_row, inverse_t,
    HAS_LOGP: tl.constexpr, HAS_ENTROPY: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One program per (row, block of the vocabulary): d loss / dx of the block, from the row's
    log-sum-exp L, entropy H, token y and upstream gradients g (log-prob) and g_H (entropy):
    (g·(onehot(y) - p) - g_H·p·(log p + H)) / T with p = exp(z - L), read once, written once."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < vocab
    z = tl.load(logits + row * logits_row + cols, mask=inside, other=0.0).to(tl.float32)
    log_p = z * inverse_t - tl.load(lse + row)
    p = tl.exp(log_p)
    grad = tl.zeros([BLOCK], tl.float32)
    if HAS_LOGP:
        g = tl.load(g_logp + row)
        grad = tl.where(cols == tl.load(tokens + row), g, 0.0) - g * p
    if HAS_ENTROPY:
        grad -= tl.load(g_entropy + row) * p * (log_p + tl.load(entropy + row))
    out_at = out + row * out_row + cols
    tl.store(out_at, (grad * inverse_t).to(out.dtype.element_ty), mask=inside)


@triton.jit
def rotary_kernel(
    x, cos, sin, out, n_rows, heads, x_row, x_head, cos_row, sin_row,
    BACKWARD: tl.constexpr, DIM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """One program per BLOCK_R of the n_rows = tokens × heads rows of x [tokens, heads, DIM]
    (token and head strides x_row, x_head, the last axis dense; row r is head r % heads of
    token r // heads, whose angle is row r // heads of cos and sin): the rotary embedding
    y = x·cos + rotate_half(x)·sin (RoFormer, Su et al. 2021, eq. 34; rotate_half(x1, x2) =
    (-x2, x1)), or (BACKWARD) its gradient from the output's g: g·cos - rotate_half(g·sin),
    rotate_half being a signed permutation whose transpose is its negative, into the dense
    `out`. A block of rows rather than one (token, head) a program: a head is only DIM values,
    too few to keep a program's lanes busy."""
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    i = tl.arange(0, BLOCK_D)
    inside = (r < n_rows)[:, None] & (i < DIM)[None, :]
    half = DIM // 2
    partner = tl.where(i < half, i + half, i - half)[None, :]
    token = (r // heads)[:, None]
    start = x + token * x_row + (r % heads)[:, None] * x_head
    value = tl.load(start + i[None, :], mask=inside, other=0.0).to(tl.float32)
    other = tl.load(start + partner, mask=inside, other=0.0).to(tl.float32)
    c = tl.load(cos + token * cos_row + i[None, :], mask=inside, other=0.0).to(tl.float32)
    if BACKWARD:
        s_other = tl.load(sin + token * sin_row + partner, mask=inside, other=0.0)
        signed = tl.where(i[None, :] < half, other, -other) * s_other.to(tl.float32)
    else:
        s = tl.load(sin + token * sin_row + i[None, :], mask=inside, other=0.0).to(tl.float32)
        signed = tl.where(i[None, :] < half, -other, other) * s
    y = value * c + signed
    tl.store(out + r[:, None] * DIM + i[None, :], y.to(out.dtype.element_ty), mask=inside)


@triton.jit
def swiglu_kernel(
    gate, up, grad, out, d_gate, d_up, width, gate_row, up_row, d_row,
    BACKWARD: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One program per (row, block of BLOCK columns): silu(gate)·up (the SwiGLU MLP's inner
    product, Shazeer 2020, eq. 6), or (BACKWARD) from the output's gradient g: d gate =
    g·up·σ(gate)·(1 + gate·(1 - σ(gate))) and d up = g·silu(gate), recomputing σ(gate)
    instead of keeping silu(gate) for backward. gate and up rows are `gate_row` and `up_row`
    apart (the two halves of a packed gate/up projection, or tensors of their own), d_gate
    and d_up rows `d_row` apart (the two halves of one gradient, or tensors of their own);
    grad and out are dense [rows, width]."""
    row = tl.program_id(0).to(tl.int64)  # row × stride can pass 2**31
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = i < width
    a = tl.load(gate + row * gate_row + i, mask=inside, other=0.0).to(tl.float32)
    b = tl.load(up + row * up_row + i, mask=inside, other=0.0).to(tl.float32)
    sigmoid = 1.0 / (1.0 + tl.exp(-a))
    at = row * width + i
    if BACKWARD:
        g = tl.load(grad + at, mask=inside, other=0.0).to(tl.float32)
        d_a = g * b * sigmoid * (1.0 + a * (1.0 - sigmoid))
        d_at = row * d_row + i
        tl.store(d_gate + d_at, d_a.to(d_gate.dtype.element_ty), mask=inside)
        tl.store(d_up + d_at, (g * a * sigmoid).to(d_up.dtype.element_ty), mask=inside)
    else:
        tl.store(out + at, (a * sigmoid * b).to(out.dtype.element_ty), mask=inside)


@triton.jit
def add_rms_norm_kernel(
    h, delta, weight, total, out, rstd, eps, width, h_row, delta_row, BLOCK: tl.constexpr
):  # fmt: skip
    """One program per row: the residual stream's s = h + delta, rounded to its dtype as the
    stream keeps it, and RMSNorm(s)·w = s·rsqrt(mean(s²) + eps)·w (Zhang and Sennrich 2019,
    eq. 4), with the row's rsqrt kept for backward. `total`, `out` are dense [rows, width]."""
    row = tl.program_id(0).to(tl.int64)  # row × stride can pass 2**31
    i = tl.arange(0, BLOCK)
    inside = i < width
    a = tl.load(h + row * h_row + i, mask=inside, other=0.0).to(tl.float32)
    b = tl.load(delta + row * delta_row + i, mask=inside, other=0.0).to(tl.float32)
    s = (a + b).to(total.dtype.element_ty)
    tl.store(total + row * width + i, s, mask=inside)
    s = s.to(tl.float32)
    r = tl.rsqrt(tl.sum(s * s, 0) / width + eps)
    w = tl.load(weight + i, mask=inside, other=0.0).to(tl.float32)
    tl.store(out + row * width + i, (s * r * w).to(out.dtype.element_ty), mask=inside)
    tl.store(rstd + row, r)


@triton.jit
def add_rms_norm_backward_kernel(
    total, weight, rstd, grad_total, grad_out, grad_in, part_w, n_rows, width,
    RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Programs striding over the rows of `add_rms_norm_kernel`'s s: with x̂ = s·r and
    dx̂ = g·w for the norm's output gradient g, the gradient of s (and so of h and delta) is
    r·(dx̂ − x̂·mean(dx̂·x̂)), plus (RESIDUAL) the gradient s itself received downstream, into
    `grad_in`; the weight's gradient Σ g·x̂ is summed per program into part_w[program] (fp32).
    Every tensor is dense [rows, width]."""
    program = tl.program_id(0)
    i = tl.arange(0, BLOCK)
    inside = i < width
    w = tl.load(weight + i, mask=inside, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK], tl.float32)
    for row in range(program, n_rows, tl.num_programs(0)):
        at = tl.cast(row, tl.int64) * width + i
        s = tl.load(total + at, mask=inside, other=0.0).to(tl.float32)
        g = tl.load(grad_out + at, mask=inside, other=0.0).to(tl.float32)
        r = tl.load(rstd + row)
        x = s * r
        dx = g * w
        d = r * (dx - x * (tl.sum(dx * x, 0) / width))
        if RESIDUAL:
            d += tl.load(grad_total + at, mask=inside, other=0.0).to(tl.float32)
        tl.store(grad_in + at, d.to(grad_in.dtype.element_ty), mask=inside)
        acc += g * x
    tl.store(part_w + program * width + i, acc, mask=inside)
