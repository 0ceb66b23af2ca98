// Dense-layer kernels of the decoder: embedding gather, RMSNorm fused with the
// residual add, per-head RMSNorm fused with neox-style RoPE, SiLU·mul, and a
// hash-based filler for synthetic weights. The residual stream is f32; what
// feeds a matrix product is bf16/f16.
#include "common.cuh"

using namespace agentd;

// residual[t, :] = emb[ids[t], :]   grid: tokens; block: any
template <typename T>
__device__ void embed_impl(float* __restrict__ residual, const T* __restrict__ emb,
                           const int* __restrict__ ids, int hidden) {
  const size_t row = (size_t)ids[blockIdx.x] * hidden;
  float* out = residual + (size_t)blockIdx.x * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[i] = to_float(emb[row + i]);
}
AGENTD_BF16_F16(embed,
                (float* residual, const void* emb, const int* ids, int hidden),
                (residual, (const T*)emb, ids, hidden))

// For output row b, input row r = rows ? rows[b] : b:
//   x = residual[r] + delta[r]          (delta may be null)
//   out[b] = x / rms(x) * w
// and, when rows is null, residual[r] = x (the fused residual add).
// grid: output rows; block: 256 (or fewer) threads. smem: none (static).
template <typename T>
__device__ void add_rms_norm_impl(float* __restrict__ residual, const T* __restrict__ delta,
                                  const int* __restrict__ rows, const float* __restrict__ w,
                                  T* __restrict__ out, int hidden, float eps) {
  __shared__ float scratch[32];
  const int b = blockIdx.x;
  const size_t r = rows ? (size_t)rows[b] : (size_t)b;
  float* x = residual + r * hidden;
  float ss = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v = x[i];
    if (delta) v += to_float(delta[r * hidden + i]);
    if (!rows) x[i] = v;
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss, scratch) / hidden + eps);
  T* o = out + (size_t)b * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v = x[i];
    if (delta && rows) v += to_float(delta[r * hidden + i]);
    o[i] = from_float<T>(v * inv * w[i]);
  }
}
AGENTD_BF16_F16(add_rms_norm,
                (float* residual, const void* delta, const int* rows, const float* w,
                 void* out, int hidden, float eps),
                (residual, (const T*)delta, rows, w, (T*)out, hidden, eps))

// In place on heads of a [tokens, row_stride] buffer (e.g. fused QKV rows):
// head h of token t starts at t*row_stride + head_offset + h*head_dim.
// Optional RMSNorm over the head (w non-null; Qwen3's q_norm/k_norm), then
// neox-style rotary embedding: x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin,
// halves of the head. cos_sin: [max_pos, head_dim] f32, cos in the first half.
// grid: (tokens, heads); block: head_dim / 2 threads.
// Thread i's pair (i, i + head_dim/2) of the head at p, normed (w non-null)
// and rotated in place: what head_norm_rope and qkv_prologue share. Every
// thread of the block must call it (the norm's block_sum synchronises).
template <typename T>
__device__ __forceinline__ void norm_rope_pair(T* p, const float* w, const float* cs, int i,
                                               int head_dim, float eps, float* scratch) {
  const int half = head_dim / 2;
  float a = to_float(p[i]), b = to_float(p[i + half]);
  if (w) {
    const float inv = rsqrtf(block_sum(a * a + b * b, scratch) / head_dim + eps);
    a = a * inv * w[i];
    b = b * inv * w[i + half];
  }
  const float c = cs[i], s = cs[half + i];
  p[i] = from_float<T>(a * c - b * s);
  p[i + half] = from_float<T>(b * c + a * s);
}

template <typename T>
__device__ void head_norm_rope_impl(T* __restrict__ x, const float* __restrict__ w,
                                    const int* __restrict__ positions,
                                    const float* __restrict__ cos_sin, int head_offset,
                                    int row_stride, int head_dim, float eps) {
  __shared__ float scratch[32];
  const int t = blockIdx.x, h = blockIdx.y;
  T* p = x + (size_t)t * row_stride + head_offset + (size_t)h * head_dim;
  const float* cs = cos_sin + (size_t)positions[t] * head_dim;
  norm_rope_pair(p, w, cs, threadIdx.x, head_dim, eps, scratch);
}
AGENTD_BF16_F16(head_norm_rope,
                (void* x, const float* w, const int* positions, const float* cos_sin,
                 int head_offset, int row_stride, int head_dim, float eps),
                ((T*)x, w, positions, cos_sin, head_offset, row_stride, head_dim, eps))

// out[t, i] = silu(gu[t, i]) * gu[t, inter + i]   (gate and up fused in one
// matrix product). grid-stride over tokens * inter.
template <typename T>
__device__ void silu_mul_impl(T* __restrict__ out, const T* __restrict__ gu, long long n,
                              int inter) {
  for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < n;
       k += (long long)gridDim.x * blockDim.x) {
    const long long t = k / inter, i = k % inter;
    const float g = to_float(gu[t * 2 * inter + i]);
    const float u = to_float(gu[t * 2 * inter + inter + i]);
    out[k] = from_float<T>(g / (1.f + __expf(-g)) * u);
  }
}
AGENTD_BF16_F16(silu_mul, (void* out, const void* gu, long long n, int inter),
                ((T*)out, (const T*)gu, n, inter))

// Deterministic uniform values in [lo, hi) from a 64-bit hash of (seed, index):
// synthetic checkpoints too large to build on the host (benchmarks only).
__device__ __forceinline__ float hash_uniform(unsigned long long seed, unsigned long long i) {
  unsigned long long z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (float)(z >> 40) * (1.0f / 16777216.0f);
}

template <typename T>
__device__ void fill_uniform_impl(T* __restrict__ out, long long n, unsigned long long seed,
                                  float lo, float hi) {
  for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < n;
       k += (long long)gridDim.x * blockDim.x)
    out[k] = from_float<T>(lo + (hi - lo) * hash_uniform(seed, k));
}
AGENTD_BF16_F16(fill_uniform,
                (void* out, long long n, unsigned long long seed, float lo, float hi),
                ((T*)out, n, seed, lo, hi))

// The attention prologue in one launch (issue 28 item 3, `--fused-prologue`):
// for token t, Q head h (blockIdx.y < heads) is RMS-normed and rotated in
// place as head_norm_rope does; K head j (blockIdx.y = heads + j) is normed,
// rotated in place and written to its cache slot, and V head j copied to
// its slot, as reshape_and_cache does (slot < 0 skips the writes). Three
// launches per layer become one, and K is written once where it was written,
// read back and written again. The stored values are the same bits as the
// unfused path's: K is rounded to T once, then copied.
// grid: (tokens, heads + kv_heads); block: head_dim / 2 threads.
template <typename T>
__device__ void qkv_prologue_impl(T* __restrict__ qkv, const float* __restrict__ q_w,
                                  const float* __restrict__ k_w, const int* __restrict__ positions,
                                  const float* __restrict__ cos_sin, T* __restrict__ k_cache,
                                  T* __restrict__ v_cache, const long long* __restrict__ slots,
                                  int heads, int kv_heads, int row_stride, int head_dim,
                                  int block_size, float eps) {
  __shared__ float scratch[32];
  const int t = blockIdx.x, y = blockIdx.y, i = threadIdx.x, half = head_dim / 2;
  const bool is_k = y >= heads;
  const int head = is_k ? y - heads : y;
  const int offset = is_k ? heads * head_dim + head * head_dim : head * head_dim;
  const float* w = is_k ? k_w : q_w;
  T* p = qkv + (size_t)t * row_stride + offset;
  norm_rope_pair(p, w, cos_sin + (size_t)positions[t] * head_dim, i, head_dim, eps, scratch);
  if (!is_k) return;
  // This thread's own two values, as just stored.
  const T ra = p[i], rb = p[i + half];
  const long long slot = slots[t];
  if (slot < 0) return;
  const long long block = slot / block_size, off = slot % block_size;
  const size_t dst = ((block * kv_heads + head) * block_size + off) * head_dim;
  k_cache[dst + i] = ra;
  k_cache[dst + i + half] = rb;
  const T* v = qkv + (size_t)t * row_stride + (heads + kv_heads) * head_dim + head * head_dim;
  v_cache[dst + i] = v[i];
  v_cache[dst + i + half] = v[i + half];
}
AGENTD_BF16_F16(qkv_prologue,
                (void* qkv, const float* q_w, const float* k_w, const int* positions,
                 const float* cos_sin, void* k_cache, void* v_cache, const long long* slots,
                 int heads, int kv_heads, int row_stride, int head_dim, int block_size,
                 float eps),
                ((T*)qkv, q_w, k_w, positions, cos_sin, (T*)k_cache, (T*)v_cache, slots, heads,
                 kv_heads, row_stride, head_dim, block_size, eps))

// GLM-4's pieces (Glm4ForCausalLM on the GPU):
//
// x[t, i] += b[i] over rows of `width` (the q/k/v projections' bias, f32),
// grid-stride over all n = tokens * width elements.
template <typename T>
__device__ void add_bias_impl(T* __restrict__ x, const float* __restrict__ b, long long n,
                              int width) {
  for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < n;
       k += (long long)gridDim.x * blockDim.x)
    x[k] = from_float<T>(to_float(x[k]) + b[k % width]);
}
AGENTD_BF16_F16(add_bias, (void* x, const float* b, long long n, int width),
                ((T*)x, b, n, width))

// In place, row r: x[r] = x[r] / rms(x[r]) * w (the sub-blocks' output norms,
// post_self_attn_layernorm and post_mlp_layernorm, before the residual add).
// grid: rows; block: 256 (or fewer) threads.
template <typename T>
__device__ void rms_norm_rows_impl(T* __restrict__ x, const float* __restrict__ w, int hidden,
                                   float eps) {
  __shared__ float scratch[32];
  T* row = x + (size_t)blockIdx.x * hidden;
  float ss = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float v = to_float(row[i]);
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss, scratch) / hidden + eps);
  for (int i = threadIdx.x; i < hidden; i += blockDim.x)
    row[i] = from_float<T>(to_float(row[i]) * inv * w[i]);
}
AGENTD_BF16_F16(rms_norm_rows, (void* x, const float* w, int hidden, float eps),
                ((T*)x, w, hidden, eps))

// GLM's partial interleaved RoPE, in place: in each head, pair i is dims
// (2i, 2i+1) of the first rot_dim, rotated by angle i; the other dims pass.
// cos_sin: [max_pos, rot_dim] f32, the cosines then the sines.
// grid: (tokens, heads); block: rot_dim / 2 threads.
template <typename T>
__device__ void head_rope_interleaved_impl(T* __restrict__ x, const int* __restrict__ positions,
                                           const float* __restrict__ cos_sin, int head_offset,
                                           int row_stride, int head_dim, int rot_dim) {
  const int t = blockIdx.x, h = blockIdx.y, i = threadIdx.x, half = rot_dim / 2;
  T* p = x + (size_t)t * row_stride + head_offset + (size_t)h * head_dim + 2 * i;
  const float* cs = cos_sin + (size_t)positions[t] * rot_dim;
  const float c = cs[i], s = cs[half + i];
  const float a = to_float(p[0]), b = to_float(p[1]);
  p[0] = from_float<T>(a * c - b * s);
  p[1] = from_float<T>(b * c + a * s);
}
AGENTD_BF16_F16(head_rope_interleaved,
                (void* x, const int* positions, const float* cos_sin, int head_offset,
                 int row_stride, int head_dim, int rot_dim),
                ((T*)x, positions, cos_sin, head_offset, row_stride, head_dim, rot_dim))

// Qwen3-MoE's expert dispatch (rows grouped per expert on the host,
// crates/cuda/src/moe_plan.rs):
//
// out[i, :] = x[rows[i], :]   grid: n; block: 256
template <typename T>
__device__ void gather_rows_impl(T* __restrict__ out, const T* __restrict__ x,
                                 const int* __restrict__ rows, int hidden) {
  const T* src = x + (size_t)rows[blockIdx.x] * hidden;
  T* dst = out + (size_t)blockIdx.x * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = src[i];
}
AGENTD_BF16_F16(gather_rows, (void* out, const void* x, const int* rows, int hidden),
                ((T*)out, (const T*)x, rows, hidden))

// acc[rows[i], :] += w[i] * y[i, :] in f32. One expert's rows are distinct
// tokens and experts run one after another on the stream, so no two blocks
// write one row at once and each token sums its experts in index order.
// grid: n; block: 256
template <typename T>
__device__ void scatter_add_rows_impl(float* __restrict__ acc, const T* __restrict__ y,
                                      const int* __restrict__ rows,
                                      const float* __restrict__ w, int hidden) {
  float* dst = acc + (size_t)rows[blockIdx.x] * hidden;
  const T* src = y + (size_t)blockIdx.x * hidden;
  const float s = w[blockIdx.x];
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] += s * to_float(src[i]);
}
AGENTD_BF16_F16(scatter_add_rows,
                (float* acc, const void* y, const int* rows, const float* w, int hidden),
                (acc, (const T*)y, rows, w, hidden))

// out[k] = acc[k] rounded to T, grid-stride over n.
template <typename T>
__device__ void cast_rows_impl(T* __restrict__ out, const float* __restrict__ acc, long long n) {
  for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < n;
       k += (long long)gridDim.x * blockDim.x)
    out[k] = from_float<T>(acc[k]);
}
AGENTD_BF16_F16(cast_rows, (void* out, const float* acc, long long n), ((T*)out, acc, n))

// GLM-4.5's attention prologue per head, in place: optional RMSNorm over the
// whole head (w non-null: use_qk_norm), then neox RoPE over the first
// rot_dim dims only (pairs (i, i + rot_dim/2)); the other dims pass.
// cos_sin: [max_pos, rot_dim] f32, the cosines then the sines.
// grid: (tokens, heads); block: head_dim / 2 threads; head_dim <= 1024.
template <typename T>
__device__ void head_norm_rope_partial_impl(T* __restrict__ x, const float* __restrict__ w,
                                            const int* __restrict__ positions,
                                            const float* __restrict__ cos_sin, int head_offset,
                                            int row_stride, int head_dim, int rot_dim, float eps) {
  __shared__ float scratch[32];
  __shared__ float v[1024];
  const int t = blockIdx.x, h = blockIdx.y, i = threadIdx.x, half = head_dim / 2;
  T* p = x + (size_t)t * row_stride + head_offset + (size_t)h * head_dim;
  float a = to_float(p[i]), b = to_float(p[i + half]);
  if (w) {
    const float inv = rsqrtf(block_sum(a * a + b * b, scratch) / head_dim + eps);
    a = a * inv * w[i];
    b = b * inv * w[i + half];
  }
  v[i] = a;
  v[i + half] = b;
  __syncthreads();
  const int rh = rot_dim / 2;
  if (i < rh) {
    const float* cs = cos_sin + (size_t)positions[t] * rot_dim;
    const float c = cs[i], s = cs[rh + i], x1 = v[i], x2 = v[i + rh];
    p[i] = from_float<T>(x1 * c - x2 * s);
    p[i + rh] = from_float<T>(x2 * c + x1 * s);
  }
  // Dims past the rotated part (thread i owns i and i + half; those below
  // rot_dim were written by the rotation above).
  if (i >= rot_dim) p[i] = from_float<T>(v[i]);
  if (i + half >= rot_dim) p[i + half] = from_float<T>(v[i + half]);
}
AGENTD_BF16_F16(head_norm_rope_partial,
                (void* x, const float* w, const int* positions, const float* cos_sin,
                 int head_offset, int row_stride, int head_dim, int rot_dim, float eps),
                ((T*)x, w, positions, cos_sin, head_offset, row_stride, head_dim, rot_dim, eps))
