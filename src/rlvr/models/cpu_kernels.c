/* The elementwise and attention work of rlvr's lean forward on a CPU: a decode step's, and a
   training forward's or a prefill's, with their backward.

   Built and loaded by cpu_kernels.py. In a decode step every tensor is small (one token per
   row, e.g. 128 rows x 192 hidden), so PyTorch's per-operation overhead costs more than the
   arithmetic: RMSNorm is five operations, the rotary embedding six, and the attention two
   batched matrix-vector products that reach half of the memory bandwidth. In training the
   same operations are memory-bound passes, several per operation and its backward, and the
   attention runs over a padded layout. Each function here is one pass over its data. All
   tensors are fp32 and row-major; `threads` is PyTorch's intra-op thread count. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Below this many elements a loop runs on the calling thread (waking the team costs more). */
#define PARALLEL_MIN 16384

/* CALL(D) with D the head size `dim`, a constant for the common sizes (so that the compiler
   unrolls the loops over a head's vector and keeps it in registers). */
#define FOR_HEAD_DIM(dim, CALL)                                                              \
    switch (dim) {                                                                           \
    case 48: CALL(48); break;                                                                \
    case 64: CALL(64); break;                                                                \
    case 128: CALL(128); break;                                                              \
    default: CALL(dim);                                                                      \
    }

#define INLINE static inline __attribute__((always_inline))

/* Eight floats; read from any float address (aligned(4), may_alias). */
typedef float vec8 __attribute__((vector_size(32), aligned(4), may_alias));

/* The register tile shared by the decode step's products (`panel_linear`) and the training
   attention's scores (`tile_scores`): outputs [ROWS, cols] (cols <= PANEL) at y (row stride
   ldy), plus the bias where not null, from x [ROWS, k] (row stride k) and one panel [k][PANEL]
   (the PANEL columns of one input feature as two vector loads), the ROWS x PANEL sums in
   twelve AVX2 registers across the k products: the register blocking of Goto & van de Geijn
   2008, "Anatomy of High-Performance Matrix Multiplication". */

#define PANEL 16
#define ROWS 6

INLINE void store_row(vec8 low, vec8 high, const float *restrict bias, float *restrict y,
                      long cols) {
    float out[PANEL];
    memcpy(out, &low, sizeof low);
    memcpy(out + 8, &high, sizeof high);
    for (long j = 0; j < cols; j++) y[j] = out[j] + (bias ? bias[j] : 0.f);
}

INLINE void full_block(const float *restrict x, const float *restrict panel,
                       const float *restrict bias, float *restrict y, long ldy, long k,
                       long cols) {
    vec8 acc[ROWS][2];
    for (int r = 0; r < ROWS; r++) acc[r][0] = acc[r][1] = (vec8){0};
    for (long c = 0; c < k; c++) {
        vec8 w0 = *(const vec8 *)(panel + c * PANEL), w1 = *(const vec8 *)(panel + c * PANEL + 8);
#pragma GCC unroll 6
        for (int r = 0; r < ROWS; r++) {
            vec8 s = (vec8){0} + x[r * k + c];
            acc[r][0] += s * w0;
            acc[r][1] += s * w1;
        }
    }
    for (int r = 0; r < ROWS; r++) store_row(acc[r][0], acc[r][1], bias, y + r * ldy, cols);
}

/* y = x / sqrt(mean(x^2) + eps) * w for each row of x [rows, dim]
   (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization", eq. 4); where `inverse` is
   not null, each row's 1 / sqrt(mean(x^2) + eps) is kept there for the backward. */
void rms_norm_keep(const float *x, const float *w, float *y, float *inverse, long rows,
                   long dim, float eps, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * dim >= PARALLEL_MIN)
    for (long r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float *yr = y + r * dim;
        float squares = 0.f;
        for (long i = 0; i < dim; i++) squares += xr[i] * xr[i];
        float inv = 1.f / sqrtf(squares / (float)dim + eps);
        for (long i = 0; i < dim; i++) yr[i] = xr[i] * inv * w[i];
        if (inverse) inverse[r] = inv;
    }
}

void rms_norm(const float *x, const float *w, float *y, long rows, long dim, float eps,
              int threads) {
    rms_norm_keep(x, w, y, 0, rows, dim, eps, threads);
}

/* The backward of rms_norm_keep, with r its kept inverse and u = g w:
   dx = r (u - x r^2 mean(u x)), dw = sum over rows of g x r. Each thread sums its rows' dw
   into its row of dw_parts [threads, dim] (zeroed by the caller, which adds them up). */
void rms_norm_backward(const float *g, const float *x, const float *w, const float *inverse,
                       float *dx, float *dw_parts, long rows, long dim, int threads) {
#pragma omp parallel num_threads(threads) if (rows * dim >= PARALLEL_MIN)
    {
        float *dw = dw_parts + omp_get_thread_num() * dim;
#pragma omp for schedule(static)
        for (long r = 0; r < rows; r++) {
            const float *xr = x + r * dim, *gr = g + r * dim;
            float *dxr = dx + r * dim;
            float inv = inverse[r], dot = 0.f;
            for (long i = 0; i < dim; i++) dot += gr[i] * w[i] * xr[i];
            float k = inv * inv * dot / (float)dim;
            for (long i = 0; i < dim; i++) {
                dxr[i] = inv * (gr[i] * w[i] - xr[i] * k);
                dw[i] += gr[i] * xr[i] * inv;
            }
        }
    }
}

/* Rotary embedding in place (Su et al. 2021, RoFormer eq. 34, half-split layout as in Llama):
   x <- x*cos + rotate_half(x)*sin with rotate_half(x1, x2) = (-x2, x1).
   x [rows, heads, dim]; cos, sin [rows, dim]. */
void rotary_out(const float *x, const float *cos, const float *sin, float *out, long rows,
                long heads, long dim, float sign, int threads);

void rotary(float *x, const float *cos, const float *sin, long rows, long heads, long dim,
            int threads) {
    rotary_out(x, cos, sin, x, rows, heads, dim, 1.f, threads);
}

/* gate <- silu(gate) * up = gate / (1 + exp(-gate)) * up (the SwiGLU MLP's inner product,
   Shazeer 2020, "GLU Variants Improve Transformer", eq. 6), over n elements. */
void swiglu(const float *gate, const float *up, float *out, long n, int threads);

void silu_mul(float *gate, const float *up, long n, int threads) {
    swiglu(gate, up, gate, n, threads);
}

/* s[j] <- exp(s[j] - top) for j < n; returns their sum (softmax's denominator). */
static inline float exp_and_sum(float *restrict s, long n, float top) {
    float total = 0.f;
#pragma omp simd reduction(+ : total)
    for (long j = 0; j < n; j++) {
        float e = expf(s[j] - top);
        s[j] = e;
        total += e;
    }
    return total;
}

/* s[j] <- scale q.keys[j] for the j < n keys with mask[j], -3e38 for the others; returns the
   largest of `top` and those scores. */
static inline float segment_scores(const float *restrict q, const float *restrict keys,
                                   const unsigned char *restrict mask, float *restrict s, long n,
                                   long dim, float scale, float top) {
    for (long j = 0; j < n; j++) {
        const float *restrict key = keys + j * dim;
        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (long i = 0; i < dim; i++) dot += q[i] * key[i];
        dot = mask[j] ? dot * scale : -3.0e38f;
        s[j] = dot;
        top = dot > top ? dot : top;
    }
    return top;
}

/* o += inv p[j] values[j] for j < n. */
static inline void segment_values(const float *restrict p, const float *restrict values,
                                  float *restrict o, long n, long dim, float inv) {
    for (long j = 0; j < n; j++) {
        const float *restrict value = values + j * dim;
        float w = p[j] * inv;
#pragma omp simd
        for (long i = 0; i < dim; i++) o[i] += w * value[i];
    }
}

/* The attention of one (row, key/value head) pair, the body of decode_attention: for each of
   its `group` query heads, o = softmax(q.k^T * scale over the visible keys) . v, over the
   row's keys: the `plen` of its prompt (pkeys, pvalues: shared by the prompt's samples) and
   then its own `len`. A hidden key's score is -3e38, whose exp is 0, so that the exp loop
   has no branch and vectorises (glibc's libmvec); a query always sees at least itself, so
   the largest score is a visible one. The scores of both parts go into one array, so the
   result is the same, to the bit, as over one cache holding the prompt's keys and the
   row's. mask [plen + len]; scores [group, plen + len]: scratch. */
static inline void pair_attention(const float *restrict query, const float *restrict pkeys,
                                  const float *restrict pvalues, long plen,
                                  const float *restrict keys, const float *restrict values,
                                  long len, const unsigned char *restrict mask,
                                  float *restrict out, float *restrict scores, long group,
                                  long dim, float scale) {
    long total = plen + len;
    for (long g = 0; g < group; g++) {
        const float *restrict q = query + g * dim;
        float *restrict s = scores + g * total;
        float top = segment_scores(q, pkeys, mask, s, plen, dim, scale, -3.0e38f);
        top = segment_scores(q, keys, mask + plen, s + plen, len, dim, scale, top);
        float inv = 1.f / exp_and_sum(s, total, top);
        float *restrict o = out + g * dim;
        for (long i = 0; i < dim; i++) o[i] = 0.f;
        segment_values(s, pvalues, o, plen, dim, inv);
        segment_values(s + plen, values, o, len, dim, inv);
    }
}

/* Attention of one query position per row over its keys: its prompt's first `plen` cached
   positions, then its own first `len`: out = softmax(q.k^T * scale, over the visible keys) . v.
   q, out [batch, q_heads, dim]; k, v: element (b, h, j, i) at b*stride_b + h*stride_h + j*dim
   + i (a [batch, kv_heads, capacity, dim] cache); pk, pv the same for prompt p at
   p*prompt_b + h*prompt_h + j*dim + i, row b's prompt being prompt_of[b] (the prompt's keys
   stored once for all of its samples; with plen 0, pk, pv and prompt_of are not read);
   visible [batch, plen + len], 1 where a key counts.
   Query head h uses key/value head h / (q_heads / kv_heads) (grouped-query attention); one
   thread runs all the query heads of a key/value head, one after another, so its keys and
   values come from memory once and then from the CPU's caches; a prompt's samples are
   consecutive rows, so the threads' static share of the (row, head) pairs reads a prompt's
   keys from memory about once.
   workspace [threads, q_heads / kv_heads * (plen + len)]: each thread's scores.
   The common head sizes get their own copy of the loops (a constant `dim` lets the compiler
   unroll them and keep a head's output in registers). */
void decode_attention(const float *q, const float *pk, const float *pv, const long *prompt_of,
                      const float *k, const float *v, const unsigned char *visible, float *out,
                      float *workspace, long batch, long q_heads, long kv_heads, long plen,
                      long len, long dim, long prompt_b, long prompt_h, long stride_b,
                      long stride_h, float scale, int threads) {
    long group = q_heads / kv_heads, total = plen + len;
#pragma omp parallel num_threads(threads)
    {
        float *scores = workspace + omp_get_thread_num() * group * total;
#pragma omp for schedule(static)
        for (long pair = 0; pair < batch * kv_heads; pair++) {
            long b = pair / kv_heads, head = pair % kv_heads;
            long prompt = plen ? prompt_of[b] * prompt_b + head * prompt_h : 0;
            const float *keys = k + b * stride_b + head * stride_h;
            const float *values = v + b * stride_b + head * stride_h;
            const unsigned char *mask = visible + b * total;
#define PAIR_ATTENTION(D)                                                                   \
    pair_attention(q + pair * group * D, pk + prompt, pv + prompt, plen, keys, values, len,  \
                   mask, out + pair * group * D, scores, group, D, scale)
            FOR_HEAD_DIM(dim, PAIR_ATTENTION)
#undef PAIR_ATTENTION
        }
    }
}

/* Moves rows rows[0..n) of a decode cache buffer [batch, heads, capacity, dim] to rows 0..n
   (finished sequences leaving the batch), copying the first `count` floats (the filled
   positions) of each (row, head) block once, and returns 1. With `rows` non-negative and
   strictly increasing, rows[i] >= i: a row is read before any later destination overwrites
   it, which is why this runs in order on one thread. Other `rows` are left to the caller:
   nothing is copied and 0 is returned. Rows already in place are not copied. */
int compact_rows(float *buffer, const long *rows, long n, long row_stride, long head_stride,
                 long heads, long count) {
    for (long i = 0; i < n; i++)
        if (rows[i] < 0 || (i > 0 && rows[i] <= rows[i - 1])) return 0;
    for (long i = 0; i < n; i++) {
        if (rows[i] == i) continue;
        const float *source = buffer + rows[i] * row_stride;
        float *target = buffer + i * row_stride;
        for (long h = 0; h < heads; h++)
            memcpy(target + h * head_stride, source + h * head_stride, count * sizeof(float));
    }
    return 1;
}

/* out = silu(gate) * up, over n elements: the SwiGLU product of a training forward, which
   keeps `gate` and `up` for its backward; `silu_mul` is the in-place case, out = gate. */
void swiglu(const float *gate, const float *up, float *out, long n, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (n >= PARALLEL_MIN)
    for (long i = 0; i < n; i++) out[i] = gate[i] / (1.f + expf(-gate[i])) * up[i];
}

/* The SwiGLU product's backward in one pass: with s = sigmoid(gate),
   d_up = grad * gate * s and d_gate = grad * up * s * (1 + gate * (1 - s)),
   since d silu(x) / dx = s(x) (1 + x (1 - s(x))). */
void swiglu_backward(const float *grad, const float *gate, const float *up, float *d_gate,
                     float *d_up, long n, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (n >= PARALLEL_MIN)
    for (long i = 0; i < n; i++) {
        float s = 1.f / (1.f + expf(-gate[i]));
        float gs = grad[i] * s;
        d_up[i] = gs * gate[i];
        d_gate[i] = gs * up[i] * (1.f + gate[i] * (1.f - s));
    }
}

/* out = the rotary embedding of x by the angles whose cosines and sines are cos, sign * sin
   (`rotary` is the in-place case, out = x: each pair is read before it is written). The
   rotation is orthogonal, so its backward is the rotation by the negated angles: sign = -1
   on the gradient. x, out [rows, heads, dim]; cos, sin [rows, dim]. */
void rotary_out(const float *x, const float *cos, const float *sin, float *out, long rows,
                long heads, long dim, float sign, int threads) {
    long half = dim / 2;
#pragma omp parallel for num_threads(threads) schedule(static) \
    if (rows * heads * dim >= PARALLEL_MIN)
    for (long r = 0; r < rows; r++) {
        const float *c = cos + r * dim, *s = sin + r * dim;
        for (long h = 0; h < heads; h++) {
            const float *v = x + (r * heads + h) * dim;
            float *o = out + (r * heads + h) * dim;  /* may be v */
            for (long i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                o[i] = a * c[i] - sign * b * s[i];
                o[i + half] = b * c[i + half] + sign * a * s[i + half];
            }
        }
    }
}

/* Attention of a training forward or a prefill, and its backward, without the [t, s] scores
   of a batch, the padded layout of its keys or a copy of a shared prompt's keys per sample:
   the recomputation scheme of FlashAttention (Dao et al. 2022, "FlashAttention", Algorithms
   1-2) with one block per (prefix, key/value head) pair, whose keys fit in the CPU's caches.
   Only the keys each query sees are computed, and a query whose output is not used
   (padding) is skipped.

   Row b's keys are its prefix's sp keys (prefix p, the rows starts[p] .. starts[p+1] - 1 of
   which share it: a group's prompt) followed by its own t positions; query i of row b sees
   prefix key j where prefix_mask[p, j], and own key i' <= i where own_mask[b, i'] (its own
   always): `fused.visible_keys` over the concatenated keys.
   q, out, dq, dout: [n, q_heads, dim] and k, v, dk, dv: [n, kv_heads, dim], per computed
   position; rows [batch, t]: the row there of position i of batch row b, or -1 (not computed;
   hidden). pk, pv: prefix element (p, h, j, c) at p*psb + h*psh + j*pss + c; dpk, dpv:
   [prefixes, kv_heads, sp, dim]. dk, dv, dpk, dpv are zeroed by the caller. lse
   [n, q_heads]: each query's log-sum-exp of its scaled scores, kept for the backward. Query
   head h uses key/value head h / (q_heads / kv_heads). One thread runs a (prefix, key/value
   head) pair: it transposes the keys to kt (the prefix's once, each row's own
   after it), and takes a row's queries QUERY_BLOCK at a time through register tiles of
   QUERY_BLOCK queries x KEY_TILE keys (`tile_scores`), the register blocking of a matrix
   product (Goto & van de Geijn 2008), so that each key read from the caches serves
   QUERY_BLOCK queries and each key gradient is read and written once per block, not once per
   query (lever 55 of docs/benchmarks.md). */

#define QUERY_BLOCK ROWS /* queries of a tile */
#define KEY_TILE PANEL    /* keys of a tile */

/* out[r][j] = x_r . key j for the QUERY_BLOCK rows of x [QUERY_BLOCK][dim] and the keys
   j < n rounded up to KEY_TILE, from their transpose in panels: yt [width / KEY_TILE][dim]
   [KEY_TILE] (`PANEL_AT`), each panel one `full_block`; out's rows have stride width. */
#define PANEL_AT(j, c, dim) (((j) / KEY_TILE * (dim) + (c)) * KEY_TILE + (j) % KEY_TILE)

INLINE void tile_scores(const float *restrict x, const float *restrict yt, float *restrict out,
                        long n, long width, long dim) {
    for (long jb = 0; jb < n; jb += KEY_TILE)
        full_block(x, yt + jb * dim, 0, out + jb, width, dim, KEY_TILE);
}

/* out[r][c] = sum_{j < n} a[r][j] src[j][c] for r < QUERY_BLOCK (a's rows of stride width):
   an output's or a query gradient's sum over its keys' vectors. */
INLINE void tile_sums(const float *restrict a, const float *const *src, float *restrict out,
                      long n, long width, long dim) {
    long full = dim - dim % KEY_TILE;
    for (long c0 = 0; c0 < full; c0 += KEY_TILE) {
        vec8 acc[QUERY_BLOCK][2];
        for (int r = 0; r < QUERY_BLOCK; r++) acc[r][0] = acc[r][1] = (vec8){0};
        for (long j = 0; j < n; j++) {
            vec8 v0 = *(const vec8 *)(src[j] + c0), v1 = *(const vec8 *)(src[j] + c0 + 8);
#pragma GCC unroll 6
            for (int r = 0; r < QUERY_BLOCK; r++) {
                vec8 s = (vec8){0} + a[r * width + j];
                acc[r][0] += s * v0;
                acc[r][1] += s * v1;
            }
        }
        for (int r = 0; r < QUERY_BLOCK; r++) {
            *(vec8 *)(out + r * dim + c0) = acc[r][0];
            *(vec8 *)(out + r * dim + c0 + 8) = acc[r][1];
        }
    }
    for (long c = full; c < dim; c++)
        for (int r = 0; r < QUERY_BLOCK; r++) {
            float acc = 0.f;
            for (long j = 0; j < n; j++) acc += a[r * width + j] * src[j][c];
            out[r * dim + c] = acc;
        }
}

/* dst[j][c] += sum_r a[r][j] x[r][c] for j < n, r < QUERY_BLOCK, x [QUERY_BLOCK][dim]: the
   key and value gradients of a block of queries, each dst[j] read and written once (several
   j may share one dst, the sink of positions not computed). */
INLINE void tile_scatter(const float *restrict a, const float *restrict x, float *const *dst,
                         long n, long width, long dim) {
    long full = dim - dim % KEY_TILE;
    for (long c0 = 0; c0 < full; c0 += KEY_TILE) {
        vec8 xs[QUERY_BLOCK][2];
        for (int r = 0; r < QUERY_BLOCK; r++)
            xs[r][0] = *(const vec8 *)(x + r * dim + c0),
            xs[r][1] = *(const vec8 *)(x + r * dim + c0 + 8);
        for (long j = 0; j < n; j++) {
            vec8 d0 = *(vec8 *)(dst[j] + c0), d1 = *(vec8 *)(dst[j] + c0 + 8);
#pragma GCC unroll 6
            for (int r = 0; r < QUERY_BLOCK; r++) {
                vec8 s = (vec8){0} + a[r * width + j];
                d0 += s * xs[r][0];
                d1 += s * xs[r][1];
            }
            *(vec8 *)(dst[j] + c0) = d0, *(vec8 *)(dst[j] + c0 + 8) = d1;
        }
    }
    for (long j = 0; j < n; j++)
        for (long c = full; c < dim; c++) {
            float acc = dst[j][c];
            for (int r = 0; r < QUERY_BLOCK; r++) acc += a[r * width + j] * x[r * dim + c];
            dst[j][c] = acc;
        }
}

/* The keys (and values) of one pair as the loops read them: key j's vector at key[j], its
   column j of the transposes kt (and vt) in panels (`PANEL_AT`), seen[j] whether it is visible to the
   queries after it, and where its gradients go (dkey[j], dvalue[j]). */
struct pair_keys {
    const float **key, **value;
    float **dkey, **dvalue;
    float *kt, *vt;
    unsigned char *seen;
    long width;
};

static inline void set_key(struct pair_keys *keys, long j, const float *key, const float *value,
                           float *dkey, float *dvalue, unsigned char seen) {
    keys->key[j] = key, keys->value[j] = value, keys->dkey[j] = dkey, keys->dvalue[j] = dvalue;
    keys->seen[j] = seen;
}

/* Columns [from, to) of the panels yt (`PANEL_AT`) from the vectors x[j]: eight keys at a
   time from a multiple of eight (eight such keys share a panel), each feature of the eight
   gathered and stored as one vector (a scalar store per key and feature, to dim cache lines,
   cost a tenth of the attention). */
static void transpose(const float *const *x, float *restrict yt, long from, long to,
                      long dim) {
    long j = from;
    for (; j < to && j % 8; j++)
        for (long c = 0; c < dim; c++) yt[PANEL_AT(j, c, dim)] = x[j][c];
    for (; j + 8 <= to; j += 8) {
        const float *x0 = x[j], *x1 = x[j + 1], *x2 = x[j + 2], *x3 = x[j + 3];
        const float *x4 = x[j + 4], *x5 = x[j + 5], *x6 = x[j + 6], *x7 = x[j + 7];
        for (long c = 0; c < dim; c++)
            *(vec8 *)(yt + PANEL_AT(j, c, dim)) =
                (vec8){x0[c], x1[c], x2[c], x3[c], x4[c], x5[c], x6[c], x7[c]};
    }
    for (; j < to; j++)
        for (long c = 0; c < dim; c++) yt[PANEL_AT(j, c, dim)] = x[j][c];
}

/* The transposes' columns [from, to) from the keys' (and values') vectors set there. */
static void set_columns(struct pair_keys *keys, long from, long to, long dim) {
    transpose(keys->key, keys->kt, from, to, dim);
    if (keys->vt) transpose(keys->value, keys->vt, from, to, dim);
}

/* Columns [0, sp) for prefix p of key/value head `head`. */
static void set_prefix(struct pair_keys *keys, const float *pk, const float *pv, float *dpk,
                       float *dpv, const unsigned char *prefix_mask, long p, long head,
                       long kv_heads, long sp, long psb, long psh, long pss, long dim) {
    for (long j = 0; j < sp; j++) {
        long at = p * psb + head * psh + j * pss, grad = ((p * kv_heads + head) * sp + j) * dim;
        set_key(keys, j, pk + at, pv + at, dpk ? dpk + grad : 0, dpv ? dpv + grad : 0,
                prefix_mask[p * sp + j]);
    }
    set_columns(keys, 0, sp, dim);
}

/* Columns [sp, sp + count) for row b's own positions; returns count, one past its last
   computed position. A position not computed gets zero vectors and is hidden. */
static long set_own(struct pair_keys *keys, const float *k, const float *v, float *dk,
                    float *dv, const long *restrict rows, const unsigned char *own_mask,
                    const float *zero, float *sinks, long head, long kv_heads, long sp, long t,
                    long dim) {
    long count = 0;
    for (long i = 0; i < t; i++)
        if (rows[i] >= 0) count = i + 1;
    for (long i = 0; i < count; i++) {
        long at = (rows[i] * kv_heads + head) * dim;
        if (rows[i] >= 0)
            set_key(keys, sp + i, k + at, v + at, dk ? dk + at : 0, dv ? dv + at : 0,
                    own_mask[i]);
        else
            set_key(keys, sp + i, zero, zero, sinks, sinks + dim, 0);
    }
    set_columns(keys, sp, sp + count, dim);
    return count;
}

/* A thread's buffers for one block of queries: scores or probabilities s and their gradients
   ds [QUERY_BLOCK, width]; the queries q, the scaled queries qs, the output gradients g and
   the results o [QUERY_BLOCK, dim]. */
struct block {
    float *s, *ds, *q, *qs, *g, *o;
};

/* A thread's scratch for `width` key columns and its block buffers, then `zero` [dim] and
   `sinks` [2 dim] (the vectors and gradients of positions not computed); returns 0 when an
   allocation failed (then nothing else is set, and free_scratch still frees what was
   allocated). */
static int pair_scratch(struct pair_keys *keys, struct block *b, long width, long dim,
                        int with_values, float **floats) {
    keys->width = width;
    keys->key = malloc(sizeof(float *) * 4 * width);
    keys->seen = malloc(width);
    long transposes = (with_values ? 2 : 1) * dim * width;
    *floats = calloc(transposes + 2 * QUERY_BLOCK * (width + 2 * dim) + 3 * dim, sizeof(float));
    if (!keys->key || !keys->seen || !*floats) return 0;
    keys->value = keys->key + width, keys->dkey = (float **)keys->value + width;
    keys->dvalue = keys->dkey + width;
    keys->kt = *floats, keys->vt = with_values ? keys->kt + dim * width : 0;
    b->s = *floats + transposes, b->ds = b->s + QUERY_BLOCK * width;
    b->q = b->ds + QUERY_BLOCK * width, b->qs = b->q + QUERY_BLOCK * dim;
    b->g = b->qs + QUERY_BLOCK * dim, b->o = b->g + QUERY_BLOCK * dim;
    return 1;
}

static void free_scratch(struct pair_keys *keys, float *floats) {
    free(keys->key), free(keys->seen), free(floats);
}

/* The scaled scores of a block's m queries over the keys j < n[m - 1] into b->s, each row's
   hidden keys at -3e38 (exp 0, no branch): query r sees key j < n[r] where seen[j] and its
   own key n[r] - 1. */
INLINE void block_scores(const struct pair_keys *keys, const struct block *b, const long *n,
                         int m, long dim) {
    long width = keys->width, last = n[m - 1];
    tile_scores(b->qs, keys->kt, b->s, last, width, dim);
    const unsigned char *restrict seen = keys->seen;
    for (int r = 0; r < m; r++) {
        float *restrict s = b->s + r * width, own = s[n[r] - 1];
#pragma omp simd
        for (long j = 0; j < n[r]; j++) s[j] = seen[j] ? s[j] : -3.0e38f;
        s[n[r] - 1] = own;
        for (long j = n[r]; j < last; j++) s[j] = -3.0e38f;
    }
}

/* Rows m .. QUERY_BLOCK - 1 of x [QUERY_BLOCK, stride], first `count` entries, to zero (a
   block's unused rows, which the tiles compute too). */
INLINE void zero_rows(float *x, int m, long stride, long count) {
    for (int r = m; r < QUERY_BLOCK; r++) memset(x + r * stride, 0, count * sizeof(float));
}

/* The forward of a block: query r's vector at q + at[r], its output at out + at[r] and its
   log-sum-exp at lse[at[r] / dim]. */
INLINE void block_forward(const float *q, float *out, float *lse, const long *at,
                          const long *n, int m, const struct pair_keys *keys,
                          const struct block *b, long dim, float scale) {
    long width = keys->width, last = n[m - 1];
    for (int r = 0; r < m; r++)
        for (long c = 0; c < dim; c++) b->qs[r * dim + c] = q[at[r] + c] * scale;
    zero_rows(b->qs, m, dim, dim);
    block_scores(keys, b, n, m, dim);
    for (int r = 0; r < m; r++) {
        float *restrict s = b->s + r * width, top = -3.0e38f;
#pragma omp simd reduction(max : top)
        for (long j = 0; j < last; j++) top = s[j] > top ? s[j] : top;
        float total = exp_and_sum(s, last, top), inv = 1.f / total;
        for (long j = 0; j < last; j++) s[j] *= inv;
        lse[at[r] / dim] = top + logf(total);
    }
    zero_rows(b->s, m, width, last);
    tile_sums(b->s, keys->value, b->o, last, width, dim);
    for (int r = 0; r < m; r++) memcpy(out + at[r], b->o + r * dim, dim * sizeof(float));
}

/* The backward of a block, with p = softmax(scores) recomputed from lse and D = dout . out
   (FlashAttention, Algorithm 2): dv_j += p_j dout, ds_j = p_j (dout . v_j - D),
   dq = scale sum_j ds_j k_j, dk_j += scale ds_j q. */
INLINE void block_backward(const float *q, const float *dout, const float *out,
                           const float *lse, float *dq, const long *at, const long *n, int m,
                           const struct pair_keys *keys, const struct block *b, long dim,
                           float scale) {
    long width = keys->width, last = n[m - 1];
    float d[QUERY_BLOCK];
    for (int r = 0; r < m; r++) {
        float dot = 0.f;
        for (long c = 0; c < dim; c++) {
            float x = q[at[r] + c], g = dout[at[r] + c];
            b->q[r * dim + c] = x, b->qs[r * dim + c] = x * scale, b->g[r * dim + c] = g;
            dot += g * out[at[r] + c];
        }
        d[r] = dot;
    }
    zero_rows(b->q, m, dim, dim), zero_rows(b->qs, m, dim, dim), zero_rows(b->g, m, dim, dim);
    block_scores(keys, b, n, m, dim);
    tile_scores(b->g, keys->vt, b->ds, last, width, dim);
    for (int r = 0; r < m; r++) {
        float *restrict p = b->s + r * width, *restrict ds = b->ds + r * width;
        float level = lse[at[r] / dim];
#pragma omp simd
        for (long j = 0; j < last; j++) {
            p[j] = expf(p[j] - level);
            ds[j] = p[j] * (ds[j] - d[r]) * scale;
        }
    }
    zero_rows(b->s, m, width, last), zero_rows(b->ds, m, width, last);
    tile_sums(b->ds, keys->key, b->o, last, width, dim);
    for (int r = 0; r < m; r++) memcpy(dq + at[r], b->o + r * dim, dim * sizeof(float));
    tile_scatter(b->ds, b->q, keys->dkey, last, width, dim);
    tile_scatter(b->s, b->g, keys->dvalue, last, width, dim);
}

/* One block of attention_pass, the head size a constant where common (`FOR_HEAD_DIM`). */
static void run_block(int backward, const float *q, const float *dout, float *out, float *lse,
                      float *dq, const long *at, const long *n, int m,
                      const struct pair_keys *keys, const struct block *b, long dim,
                      float scale) {
#define RUN_BLOCK(D)                                                                          \
    if (backward)                                                                             \
        block_backward(q, dout, out, lse, dq, at, n, m, keys, b, D, scale);                   \
    else                                                                                      \
        block_forward(q, out, lse, at, n, m, keys, b, D, scale)
    FOR_HEAD_DIM(dim, RUN_BLOCK)
#undef RUN_BLOCK
}

/* Both directions share the walk over (prefix, key/value head) pairs, rows and queries;
   `dout` null means the forward (out, lse written), else the backward. Returns -1 when a
   thread could not allocate its scratch (its share of the work is then not done), else 0. */
static int attention_pass(const float *q, const float *k, const float *v, const long *rows,
                           const unsigned char *own_mask, const float *pk, const float *pv,
                           const unsigned char *prefix_mask, const long *starts, float *out,
                           float *lse, const float *dout, float *dq, float *dk, float *dv,
                           float *dpk, float *dpv, long prefixes, long t, long sp, long q_heads,
                           long kv_heads, long dim, long psb, long psh, long pss, float scale,
                           int threads) {
    long group = q_heads / kv_heads;
    long width = (sp + t + KEY_TILE - 1) / KEY_TILE * KEY_TILE;
    int backward = dout != 0, failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *floats, *zero = 0, *sinks = 0;
        struct pair_keys keys;
        struct block blk;
        int ready = pair_scratch(&keys, &blk, width, dim, backward, &floats);
        if (ready) {
            zero = blk.o + QUERY_BLOCK * dim, sinks = zero + dim;
        } else {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (long pair = 0; pair < prefixes * kv_heads; pair++) {
            if (!ready) continue;
            long p = pair / kv_heads, head = pair % kv_heads;
            set_prefix(&keys, pk, pv, dpk, dpv, prefix_mask, p, head, kv_heads, sp, psb, psh,
                       pss, dim);
            for (long b = starts[p]; b < starts[p + 1]; b++) {
                const long *row = rows + b * t;
                long count = set_own(&keys, k, v, dk, dv, row, own_mask + b * t, zero, sinks,
                                     head, kv_heads, sp, t, dim);
                for (long g = 0; g < group; g++) {
                    long at[QUERY_BLOCK], n[QUERY_BLOCK];
                    int m = 0;
                    for (long i = 0; i < count; i++) {
                        if (row[i] < 0) continue;
                        at[m] = (row[i] * q_heads + head * group + g) * dim, n[m++] = sp + i + 1;
                        if (m < QUERY_BLOCK && i + 1 < count) continue; /* row[count-1] >= 0 */
                        run_block(backward, q, dout, out, lse, dq, at, n, m, &keys, &blk, dim,
                                  scale);
                        m = 0;
                    }
                }
            }
        }
        free_scratch(&keys, floats);
    }
    return failed ? -1 : 0;
}

int attention_forward(const float *q, const float *k, const float *v, const long *rows,
                       const unsigned char *own_mask, const float *pk, const float *pv,
                       const unsigned char *prefix_mask, const long *starts, float *out,
                       float *lse, long prefixes, long t, long sp, long q_heads, long kv_heads,
                       long dim, long psb, long psh, long pss, float scale, int threads) {
    return attention_pass(q, k, v, rows, own_mask, pk, pv, prefix_mask, starts, out, lse, 0, 0,
                          0, 0, 0, 0, prefixes, t, sp, q_heads, kv_heads, dim, psb, psh, pss,
                          scale, threads);
}

int attention_backward(const float *q, const float *k, const float *v, const long *rows,
                        const unsigned char *own_mask, const float *pk, const float *pv,
                        const unsigned char *prefix_mask, const long *starts, const float *out,
                        const float *lse, const float *dout, float *dq, float *dk, float *dv,
                        float *dpk, float *dpv, long prefixes, long t, long sp, long q_heads,
                        long kv_heads, long dim, long psb, long psh, long pss, float scale,
                        int threads) {
    return attention_pass(q, k, v, rows, own_mask, pk, pv, prefix_mask, starts, (float *)out,
                          (float *)lse, dout, dq, dk, dv, dpk, dpv, prefixes, t, sp, q_heads,
                          kv_heads, dim, psb, psh, pss, scale, threads);
}

/* The decode step's products y = x W^T (+ bias), x [m, k] row-major, for the small m of a
   decode step (one row per sequence), where PyTorch's BLAS leaves the second core idle (128
   rows x 192 hidden on the AMD EPYC VM: 76-83 GFLOP/s on two threads, 78-81 on one; lever 53
   of docs/benchmarks.md). W [n, k] is packed once (`pack_panels`) into panels of PANEL output
   columns, each [k][PANEL], for `full_block`'s register tile (without Goto and van de Geijn's
   packing of x, which a decode step's few rows do not need). The threads split the panels. */

/* Whether the panel products are built for a CPU where they were measured to beat PyTorch's
   BLAS at a decode step's sizes: AVX2 with FMA and no AVX-512 (the AMD EPYC VM). With
   AVX-512 (the Xeon VM) the BLAS ran them at 220-300 GFLOP/s, more than this kernel's
   8-wide vectors reach. */
int panels_pay(void) {
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
    return 1;
#else
    return 0;
#endif
}

/* panels [ceil(n / PANEL)][k][PANEL] from w [n, k]; columns past n are zero. */
void pack_panels(const float *w, float *panels, long n, long k) {
    for (long j0 = 0; j0 < n; j0 += PANEL)
        for (long c = 0; c < k; c++)
            for (long j = 0; j < PANEL; j++)
                panels[j0 * k + c * PANEL + j] = j0 + j < n ? w[(j0 + j) * k + c] : 0.f;
}

/* The last rows of a block, fewer than ROWS, one at a time (`full_block` takes ROWS). */
static void part_block(const float *restrict x, const float *restrict panel,
                       const float *restrict bias, float *restrict y, long ldy, long k,
                       long rows, long cols) {
    for (long r = 0; r < rows; r++) {
        vec8 a = {0}, b = {0};
        for (long c = 0; c < k; c++) {
            vec8 s = (vec8){0} + x[r * k + c];
            a += s * *(const vec8 *)(panel + c * PANEL);
            b += s * *(const vec8 *)(panel + c * PANEL + 8);
        }
        store_row(a, b, bias, y + r * ldy, cols);
    }
}

/* ys[o] = x W_o^T + biases[o] (a null bias adds nothing) for `outputs` weights packed one
   after another (each by pack_panels), W_o [widths[o], k]; ys[o] is [m, widths[o]]. */
void panel_linear(const float *x, const float *panels, long m, long k, long outputs,
                  float *const *ys, const long *widths, const float *const *biases,
                  int threads) {
    long first[outputs + 1];
    first[0] = 0;
    for (long o = 0; o < outputs; o++) first[o + 1] = first[o] + (widths[o] + PANEL - 1) / PANEL;
    long total = first[outputs], columns = 0;
    for (long o = 0; o < outputs; o++) columns += widths[o];
#pragma omp parallel for num_threads(threads) schedule(static) if (m * k * columns >= 16 * PARALLEL_MIN)
    for (long p = 0; p < total; p++) {
        long o = 0;
        while (p >= first[o + 1]) o++;
        long j0 = (p - first[o]) * PANEL, n = widths[o];
        long cols = n - j0 < PANEL ? n - j0 : PANEL;
        const float *panel = panels + p * PANEL * k, *bias = biases[o] ? biases[o] + j0 : 0;
        long i = 0;
        for (; i + ROWS <= m; i += ROWS)
            full_block(x + i * k, panel, bias, ys[o] + i * n + j0, n, k, cols);
        part_block(x + i * k, panel, bias, ys[o] + i * n + j0, n, k, m - i, cols);
    }
}
