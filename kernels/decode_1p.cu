// Single-pass paged decode attention (issue 28 item 3, `--single-pass-decode`).
//
// The two-pass kernel (attention.cu) reads a partition's K rows, writes every
// score to shared memory, takes a CTA-wide softmax, then reads the V rows in
// a second loop: two dependent sweeps with barriers between them, and for a
// GQA group of more than DECODE_HC heads a V sweep per four heads. Here each
// token's K and V rows are loaded together and the softmax is online: every
// token slot (the TPT = D/8 threads that share a token, one 16-byte load
// each) keeps its own running max, exp-sum and its 8 dimensions of P·V for
// each head of the group over the tokens it visits, with no barrier in the
// loop; the TOKP slots are combined once at the end, exactly as split-K
// partitions are (max of maxima, rescaled sums). The launch contract is the
// two-pass kernel's: grid (num_kv_heads, num_seqs, num_partitions), 128
// threads, the same partitions, the same tmp_* layout for
// paged_decode_reduce. The host reference of this algorithm is
// crates/cuda/src/decode_ref.rs (tested against a plain softmax).
//
// G: query heads per KV head rounded up to 1, 2, 4 or 8 (the host picks;
// larger groups keep the two-pass kernel). U: tokens in flight per slot.
// smem (dynamic): G*D (q) + TOKP*G*D (slot P·V) + 2*TOKP*G (slot max, sum)
// floats: at most 37.4 KiB for every instantiated D.
#include "common.cuh"

using namespace agentd;

template <typename T, int D, int G, int U>
__device__ void decode_1p_impl(T* __restrict__ out, float* __restrict__ tmp_out,
                               float* __restrict__ tmp_max, float* __restrict__ tmp_sum,
                               const T* __restrict__ q, int q_stride,
                               const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                               const int* __restrict__ block_tables, int max_blocks,
                               const int* __restrict__ context_lens, int num_heads,
                               int num_kv_heads, int block_size, float scale, int P,
                               int num_partitions) {
  constexpr int TPT = D / 8, TOKP = 128 / TPT;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int kvh = blockIdx.x, s = blockIdx.y, part = blockIdx.z;
  const int group = num_heads / num_kv_heads;  // <= G (host-checked)
  const int ctx = context_lens[s];
  const int start = part * P;
  if (start >= ctx) return;  // the reduce step counts partitions from ctx
  const int n = min(start + P, ctx) - start;
  float* qs = (float*)smem_raw;      // [G][D]
  float* red = qs + G * D;           // [TOKP][G][D]
  float* red_m = red + TOKP * G * D; // [TOKP][G]
  float* red_l = red_m + TOKP * G;   // [TOKP][G]
  for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
    const int g = i / D;
    qs[i] = g < group
                ? to_float(q[(size_t)s * q_stride + (size_t)(kvh * group) * D + i]) * scale
                : 0.f;
  }
  __syncthreads();

  const int slot = threadIdx.x / TPT, c = threadIdx.x % TPT;
  const int* table = block_tables + (size_t)s * max_blocks;
  const size_t head_off = (size_t)kvh * block_size * D + c * 8;
  const size_t block_stride = (size_t)num_kv_heads * block_size * D;

  float m[G], l[G], acc[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.f;
  }

  // `n` is the same for the whole CTA: every lane runs every iteration, so
  // the shuffles below see all 32 lanes.
  for (int base = 0; base < n; base += TOKP * U) {
    float kf[U][8], vf[U][8];
    bool live[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = base + u * TOKP + slot;
      live[u] = i < n;
      if (live[u]) {
        const int t = start + i;
        const size_t at =
            table[t / block_size] * block_stride + head_off + (size_t)(t % block_size) * D;
        load8(k_cache + at, kf[u]);
        load8(v_cache + at, vf[u]);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) kf[u][e] = vf[u][e] = 0.f;  // p = 0 must not meet NaN
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (g >= group) break;  // uniform over the CTA
      const float4 a = *reinterpret_cast<const float4*>(&qs[g * D + c * 8]);
      const float4 b = *reinterpret_cast<const float4*>(&qs[g * D + c * 8 + 4]);
      float sc[U];
      float mt = m[g];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float dot = a.x * kf[u][0] + a.y * kf[u][1] + a.z * kf[u][2] + a.w * kf[u][3] +
                    b.x * kf[u][4] + b.y * kf[u][5] + b.z * kf[u][6] + b.w * kf[u][7];
#pragma unroll
        for (int o = TPT / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        sc[u] = live[u] ? dot : -INFINITY;
        mt = fmaxf(mt, sc[u]);
      }
      if (mt == -INFINITY) continue;  // this slot has seen no token yet
      const float corr = __expf(m[g] - mt);  // exp(-inf) = 0 on a slot's first token
      l[g] *= corr;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] *= corr;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const float p = live[u] ? __expf(sc[u] - mt) : 0.f;
        l[g] += p;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] += p * vf[u][e];
      }
      m[g] = mt;
    }
  }

  // Combine the slots (a split-K combine inside the CTA).
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (c == 0) {
      red_m[slot * G + g] = m[g];
      red_l[slot * G + g] = l[g];
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) red[(slot * G + g) * D + c * 8 + e] = acc[g][e];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < group * D; idx += blockDim.x) {
    const int g = idx / D, d = idx % D;
    float mx = -INFINITY;
    for (int j = 0; j < TOKP; ++j) mx = fmaxf(mx, red_m[j * G + g]);
    float sum = 0.f, v = 0.f;
    for (int j = 0; j < TOKP; ++j) {
      const float mj = red_m[j * G + g];
      if (mj == -INFINITY) continue;  // a slot past the partition's end
      const float w = __expf(mj - mx);
      sum += red_l[j * G + g] * w;
      v += red[(j * G + g) * D + d] * w;
    }
    const int head = kvh * group + g;
    if (num_partitions == 1) {
      out[((size_t)s * num_heads + head) * D + d] = from_float<T>(v / sum);
    } else {
      const size_t row = ((size_t)s * num_heads + head) * num_partitions + part;
      tmp_out[row * D + d] = v;
      if (d == 0) {
        tmp_max[row] = mx;
        tmp_sum[row] = sum;
      }
    }
  }
}

// Tokens in flight per slot: 4 rows of K and 4 of V (64 registers) up to a
// group of 4; 2 for a group of 8, whose P·V sums take 64 registers.
#define INSTANTIATE_1P(SUFFIX, T, D, G)                                                    \
  extern "C" __global__ void __launch_bounds__(128) paged_decode_1p_##SUFFIX##_g##G(        \
      void* out, float* tmp_out, float* tmp_max, float* tmp_sum, const void* q,             \
      int q_stride, const void* k_cache, const void* v_cache, const int* block_tables,      \
      int max_blocks, const int* context_lens, int num_heads, int num_kv_heads,             \
      int block_size, float scale, int P, int num_partitions) {                             \
    decode_1p_impl<T, D, G, (G <= 4 ? 4 : 2)>(                                              \
        (T*)out, tmp_out, tmp_max, tmp_sum, (const T*)q, q_stride, (const T*)k_cache,       \
        (const T*)v_cache, block_tables, max_blocks, context_lens, num_heads, num_kv_heads, \
        block_size, scale, P, num_partitions);                                              \
  }
#define INSTANTIATE_1P_GROUPS(SUFFIX, T, D) \
  INSTANTIATE_1P(SUFFIX, T, D, 1)           \
  INSTANTIATE_1P(SUFFIX, T, D, 2)           \
  INSTANTIATE_1P(SUFFIX, T, D, 4)           \
  INSTANTIATE_1P(SUFFIX, T, D, 8)
INSTANTIATE_1P_GROUPS(bf16_d16, __nv_bfloat16, 16)
INSTANTIATE_1P_GROUPS(bf16_d32, __nv_bfloat16, 32)
INSTANTIATE_1P_GROUPS(bf16_d64, __nv_bfloat16, 64)
INSTANTIATE_1P_GROUPS(bf16_d128, __nv_bfloat16, 128)
INSTANTIATE_1P_GROUPS(f16_d16, __half, 16)
INSTANTIATE_1P_GROUPS(f16_d32, __half, 32)
INSTANTIATE_1P_GROUPS(f16_d64, __half, 64)
INSTANTIATE_1P_GROUPS(f16_d128, __half, 128)
