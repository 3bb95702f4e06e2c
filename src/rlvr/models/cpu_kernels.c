/* The elementwise and attention work of one decode step of rlvr's lean forward, on a CPU.

   Built and loaded by cpu_kernels.py. In a decode step every tensor is small (one token per
   row, e.g. 128 rows x 192 hidden), so PyTorch's per-operation overhead costs more than the
   arithmetic: RMSNorm is five operations, the rotary embedding six, and the attention two
   batched matrix-vector products that reach half of the memory bandwidth. Each function here
   is one pass over its data. All tensors are fp32 and row-major; `threads` is PyTorch's
   intra-op thread count. */
#include <math.h>
#include <omp.h>

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
void rotary(float *x, const float *cos, const float *sin, long rows, long heads, long dim,
            int threads) {
    long half = dim / 2;
#pragma omp parallel for num_threads(threads) schedule(static) \
    if (rows * heads * dim >= PARALLEL_MIN)
    for (long r = 0; r < rows; r++) {
        const float *c = cos + r * dim, *s = sin + r * dim;
        for (long h = 0; h < heads; h++) {
            float *v = x + (r * heads + h) * dim;
            for (long i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * c[i] - b * s[i];
                v[i + half] = b * c[i + half] + a * s[i + half];
            }
        }
    }
}

/* gate <- silu(gate) * up = gate / (1 + exp(-gate)) * up (the SwiGLU MLP's inner product,
   Shazeer 2020, "GLU Variants Improve Transformer", eq. 6), over n elements. */
void silu_mul(float *gate, const float *up, long n, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (n >= PARALLEL_MIN)
    for (long i = 0; i < n; i++) gate[i] = gate[i] / (1.f + expf(-gate[i])) * up[i];
}

/* Attention of one query position per row over its first `len` cached positions:
   out = softmax(q.k^T * scale, over the visible keys) . v.
   q, out [batch, q_heads, dim]; k, v: element (b, h, j, i) at b*stride_b + h*stride_h + j*dim
   + i (a [batch, kv_heads, capacity, dim] cache); visible [batch, len], 1 where a key counts.
   Query head h uses key/value head h / (q_heads / kv_heads) (grouped-query attention). Each
   (row, kv head) pair reads its keys and values once for all of its query heads.
   workspace [threads, q_heads / kv_heads * len]: each thread's scores. */
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
            const float *query = q + (b * q_heads + head * group) * dim;
            float *o = out + (b * q_heads + head * group) * dim;
            for (long j = 0; j < len; j++) {
                for (long g = 0; g < group; g++) {
                    float dot = 0.f;
                    for (long i = 0; i < dim; i++) dot += query[g * dim + i] * keys[j * dim + i];
                    scores[g * len + j] = dot * scale;
                }
            }
            for (long g = 0; g < group; g++) {
                float *s = scores + g * len;
                float top = -3.0e38f;
                for (long j = 0; j < len; j++)
                    if (mask[j] && s[j] > top) top = s[j];
                float total = 0.f;
                for (long j = 0; j < len; j++) {
                    float e = mask[j] ? expf(s[j] - top) : 0.f;
                    s[j] = e;
                    total += e;
                }
                for (long j = 0; j < len; j++) s[j] /= total;
                for (long i = 0; i < dim; i++) o[g * dim + i] = 0.f;
            }
            for (long j = 0; j < len; j++) {
                for (long g = 0; g < group; g++) {
                    float p = scores[g * len + j];
                    for (long i = 0; i < dim; i++) o[g * dim + i] += p * values[j * dim + i];
                }
            }
        }
    }
}
