/* The elementwise and attention work of one decode step of rlvr's lean forward, on a CPU.

   Built and loaded by cpu_kernels.py. In a decode step every tensor is small (one token per
   row, e.g. 128 rows x 192 hidden), so PyTorch's per-operation overhead costs more than the
   arithmetic: RMSNorm is five operations, the rotary embedding six, and the attention two
   batched matrix-vector products that reach half of the memory bandwidth. Each function here
   is one pass over its data. All tensors are fp32 and row-major; `threads` is PyTorch's
   intra-op thread count. */
#include <math.h>
#include <omp.h>
#include <string.h>

/* Below this many elements a loop runs on the calling thread (waking the team costs more). */
#define PARALLEL_MIN 16384

/* y = x / sqrt(mean(x^2) + eps) * w for each row of x [rows, dim]
   (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization", eq. 4). */
void rms_norm(const float *x, const float *w, float *y, long rows, long dim, float eps,
              int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * dim >= PARALLEL_MIN)
    for (long r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float *yr = y + r * dim;
        float squares = 0.f;
        for (long i = 0; i < dim; i++) squares += xr[i] * xr[i];
        float inv = 1.f / sqrtf(squares / (float)dim + eps);
        for (long i = 0; i < dim; i++) yr[i] = xr[i] * inv * w[i];
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
void silu_mul(float *gate, const float *up, long n, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (n >= PARALLEL_MIN)
    for (long i = 0; i < n; i++) gate[i] = gate[i] / (1.f + expf(-gate[i])) * up[i];
}

/* The attention of one (row, key/value head) pair, the body of decode_attention: for each of
   its `group` query heads, o = softmax(q.k^T * scale over the visible keys) . v. A hidden
   key's score is -3e38, whose exp is 0, so that the exp loop has no branch and vectorises
   (glibc's libmvec); a query always sees at least itself, so the largest score is a visible
   one. scores [group, len]: scratch. */
static inline void pair_attention(const float *restrict query, const float *restrict keys,
                                  const float *restrict values, const unsigned char *restrict mask,
                                  float *restrict out, float *restrict scores, long group,
                                  long len, long dim, float scale) {
    for (long g = 0; g < group; g++) {
        const float *restrict q = query + g * dim;
        float *restrict s = scores + g * len;
        float top = -3.0e38f;
        for (long j = 0; j < len; j++) {
            const float *restrict key = keys + j * dim;
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (long i = 0; i < dim; i++) dot += q[i] * key[i];
            dot = mask[j] ? dot * scale : -3.0e38f;
            s[j] = dot;
            top = dot > top ? dot : top;
        }
        float total = 0.f;
#pragma omp simd reduction(+ : total)
        for (long j = 0; j < len; j++) {
            float e = expf(s[j] - top);
            s[j] = e;
            total += e;
        }
        float inv = 1.f / total;
        float *restrict o = out + g * dim;
        for (long i = 0; i < dim; i++) o[i] = 0.f;
        for (long j = 0; j < len; j++) {
            const float *restrict value = values + j * dim;
            float p = s[j] * inv;
#pragma omp simd
            for (long i = 0; i < dim; i++) o[i] += p * value[i];
        }
    }
}

/* Attention of one query position per row over its first `len` cached positions:
   out = softmax(q.k^T * scale, over the visible keys) . v.
   q, out [batch, q_heads, dim]; k, v: element (b, h, j, i) at b*stride_b + h*stride_h + j*dim
   + i (a [batch, kv_heads, capacity, dim] cache); visible [batch, len], 1 where a key counts.
   Query head h uses key/value head h / (q_heads / kv_heads) (grouped-query attention); one
   thread runs all the query heads of a key/value head, one after another, so its keys and
   values come from memory once and then from the CPU's caches.
   workspace [threads, q_heads / kv_heads * len]: each thread's scores.
   The common head sizes get their own copy of the loops (a constant `dim` lets the compiler
   unroll them and keep a head's output in registers). */
void decode_attention(const float *q, const float *k, const float *v,
                      const unsigned char *visible, float *out, float *workspace, long batch,
                      long q_heads, long kv_heads, long len, long dim, long stride_b,
                      long stride_h, float scale, int threads) {
    long group = q_heads / kv_heads;
#pragma omp parallel num_threads(threads)
    {
        float *scores = workspace + omp_get_thread_num() * group * len;
#pragma omp for schedule(static)
        for (long pair = 0; pair < batch * kv_heads; pair++) {
            long b = pair / kv_heads, head = pair % kv_heads;
            const float *keys = k + b * stride_b + head * stride_h;
            const float *values = v + b * stride_b + head * stride_h;
            const unsigned char *mask = visible + b * len;
#define PAIR_ATTENTION(D)                                                                  \
    pair_attention(q + pair * group * D, keys, values, mask, out + pair * group * D, scores, \
                   group, len, D, scale)
            switch (dim) {
            case 48: PAIR_ATTENTION(48); break;
            case 64: PAIR_ATTENTION(64); break;
            case 128: PAIR_ATTENTION(128); break;
            default: PAIR_ATTENTION(dim);
            }
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
   keeps `gate` and `up` for its backward (`silu_mul` overwrites `gate`). */
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
