// Paged attention over the block-table KV cache (layout in cache.cu).
//
// Queries are read in place from the fused QKV rows: query head h of token t
// is at q[t*q_stride + h*D]. Outputs are [tokens, num_heads, D]. Every CTA
// works on one KV head and all the query heads of its GQA group, so each K/V
// element is read from memory once per group rather than once per query head.
// Causality: the i-th of a sequence's q_len new tokens sees context indices
// 0 ..= context_len - q_len + i (its own K/V were written to the cache first).
#include "common.cuh"

using namespace agentd;

#define MAX_GROUP 16

// ---------------------------------------------------------------------------
// Decode: one new token per sequence (token s of the batch is sequence s).
// grid: (num_kv_heads, num_seqs, num_partitions); block: 128 threads.
// Split-K (flash-decoding): partition p covers context [p*P, (p+1)*P). With one
// partition the CTA writes the final output; with several it writes its
// unnormalised sum, max and exp-sum to tmp_* for paged_decode_reduce.
//
// Memory-level parallelism is what decode needs (it reads each K/V byte once
// and does little arithmetic): a token's row is read by TPT = D/8 threads with
// one 16-byte load each, TOKP = 128/TPT tokens at a time, U rows per thread in
// flight before the first use.
// smem (dynamic): group*D (q) + group*P (scores) + 4096 (PV partials) floats.
#define DECODE_U 4
#define DECODE_HC 4

template <typename T, int D>
__device__ void decode_impl(T* __restrict__ out, float* __restrict__ tmp_out,
                            float* __restrict__ tmp_max, float* __restrict__ tmp_sum,
                            const T* __restrict__ q, int q_stride, const T* __restrict__ k_cache,
                            const T* __restrict__ v_cache, const int* __restrict__ block_tables,
                            int max_blocks, const int* __restrict__ context_lens, int num_heads,
                            int num_kv_heads, int block_size, float scale, int P,
                            int num_partitions) {
  constexpr int TPT = D / 8, TOKP = 128 / TPT;
  __shared__ float scratch[32];
  __shared__ float head_max[MAX_GROUP], head_sum[MAX_GROUP];
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int kvh = blockIdx.x, s = blockIdx.y, part = blockIdx.z;
  const int group = num_heads / num_kv_heads;
  const int ctx = context_lens[s];
  const int start = part * P;
  if (start >= ctx) return;  // the reduce step counts partitions from ctx
  const int n = min(start + P, ctx) - start;
  float* qs = (float*)smem_raw;    // [group][D]
  float* logits = qs + group * D;  // [group][P]
  float* red = logits + group * P; // [TOKP][DECODE_HC][D]
  for (int i = threadIdx.x; i < group * D; i += blockDim.x)
    qs[i] = to_float(q[(size_t)s * q_stride + (size_t)(kvh * group) * D + i]) * scale;
  __syncthreads();

  const int slot = threadIdx.x / TPT, c = threadIdx.x % TPT;
  const int* table = block_tables + (size_t)s * max_blocks;
  const size_t head_off = (size_t)kvh * block_size * D + c * 8;
  const size_t block_stride = (size_t)num_kv_heads * block_size * D;

  // q·k for every token of the partition.
  for (int base = 0; base < n; base += TOKP * DECODE_U) {
    float kf[DECODE_U][8];
#pragma unroll
    for (int u = 0; u < DECODE_U; ++u) {
      const int i = base + u * TOKP + slot;
      if (i < n) {
        const int t = start + i;
        load8(k_cache + table[t / block_size] * block_stride + head_off + (size_t)(t % block_size) * D, kf[u]);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) kf[u][e] = 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < DECODE_U; ++u) {
      const int i = base + u * TOKP + slot;
      for (int g = 0; g < group; ++g) {
        const float4 a = *reinterpret_cast<const float4*>(&qs[g * D + c * 8]);
        const float4 b = *reinterpret_cast<const float4*>(&qs[g * D + c * 8 + 4]);
        float acc = a.x * kf[u][0] + a.y * kf[u][1] + a.z * kf[u][2] + a.w * kf[u][3] +
                    b.x * kf[u][4] + b.y * kf[u][5] + b.z * kf[u][6] + b.w * kf[u][7];
#pragma unroll
        for (int o = TPT / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (c == 0 && i < n) logits[g * P + i] = acc;
      }
    }
  }
  __syncthreads();

  // Softmax numerators per head, in place; keep each head's max and sum.
  for (int g = 0; g < group; ++g) {
    float m = -INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, logits[g * P + i]);
    m = block_max(m, scratch);
    float l = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const float e = __expf(logits[g * P + i] - m);
      logits[g * P + i] = e;
      l += e;
    }
    l = block_sum(l, scratch);
    if (threadIdx.x == 0) {
      head_max[g] = m;
      head_sum[g] = l;
    }
  }
  __syncthreads();

  // Weighted sum of V, DECODE_HC heads of the group at a time; each thread keeps 8
  // dimensions of DECODE_HC heads over its token slot, then the slots are summed.
  for (int g0 = 0; g0 < group; g0 += DECODE_HC) {
    float acc[DECODE_HC][8];
#pragma unroll
    for (int h = 0; h < DECODE_HC; ++h)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[h][e] = 0.f;
    for (int base = 0; base < n; base += TOKP * DECODE_U) {
      float vf[DECODE_U][8];
#pragma unroll
      for (int u = 0; u < DECODE_U; ++u) {
        const int i = base + u * TOKP + slot;
        if (i < n) {
          const int t = start + i;
          load8(v_cache + table[t / block_size] * block_stride + head_off + (size_t)(t % block_size) * D, vf[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < DECODE_U; ++u) {
        const int i = base + u * TOKP + slot;
        if (i < n) {
#pragma unroll
          for (int h = 0; h < DECODE_HC; ++h) {
            if (g0 + h < group) {
              const float p = logits[(g0 + h) * P + i];
#pragma unroll
              for (int e = 0; e < 8; ++e) acc[h][e] += p * vf[u][e];
            }
          }
        }
      }
    }
#pragma unroll
    for (int h = 0; h < DECODE_HC; ++h)
#pragma unroll
      for (int e = 0; e < 8; ++e) red[(slot * DECODE_HC + h) * D + c * 8 + e] = acc[h][e];
    __syncthreads();
    for (int idx = threadIdx.x; idx < DECODE_HC * D; idx += blockDim.x) {
      const int h = idx / D, d = idx % D, g = g0 + h;
      if (g >= group) continue;
      float v = 0.f;
      for (int j = 0; j < TOKP; ++j) v += red[(j * DECODE_HC + h) * D + d];
      const int head = kvh * group + g;
      if (num_partitions == 1) {
        out[((size_t)s * num_heads + head) * D + d] = from_float<T>(v / head_sum[g]);
      } else {
        const size_t row = ((size_t)s * num_heads + head) * num_partitions + part;
        tmp_out[row * D + d] = v;
        if (d == 0) {
          tmp_max[row] = head_max[g];
          tmp_sum[row] = head_sum[g];
        }
      }
    }
    __syncthreads();
  }
}

// Combines the partitions of each (sequence, head). grid: (num_heads,
// num_seqs); block: D threads.
template <typename T>
__device__ void decode_reduce_impl(T* __restrict__ out, const float* __restrict__ tmp_out,
                                   const float* __restrict__ tmp_max,
                                   const float* __restrict__ tmp_sum,
                                   const int* __restrict__ context_lens, int num_heads, int D,
                                   int P, int num_partitions) {
  const int head = blockIdx.x, s = blockIdx.y, d = threadIdx.x;
  const int np = (context_lens[s] + P - 1) / P;
  const size_t row0 = ((size_t)s * num_heads + head) * num_partitions;
  float m = -INFINITY;
  for (int p = 0; p < np; ++p) m = fmaxf(m, tmp_max[row0 + p]);
  float l = 0.f, v = 0.f;
  for (int p = 0; p < np; ++p) {
    const float w = __expf(tmp_max[row0 + p] - m);
    l += tmp_sum[row0 + p] * w;
    v += tmp_out[(row0 + p) * D + d] * w;
  }
  out[((size_t)s * num_heads + head) * D + d] = from_float<T>(v / l);
}

// ---------------------------------------------------------------------------
// Prefill: chunks of new tokens (varlen, causal) over each sequence's paged
// prefix. A CTA takes one KV head and a tile of up to ROWS (token, head) rows:
// bq = ROWS / group consecutive tokens of one sequence with all their group's
// heads. tiles[2i], tiles[2i+1] = (sequence, first new-token index) of tile i,
// laid out by the host. Online softmax over key tiles of BK keys staged in
// shared memory. grid: (num_kv_heads, num_tiles); block: 128 threads.
// smem (dynamic): ROWS*D (q) + ROWS*D (acc) + BK*(D+1) (k) + BK*D (v) +
// ROWS*BK (scores) + 3*ROWS floats.
#define ROWS 32
#define BK 32
template <typename T, int D>
__device__ void prefill_impl(T* __restrict__ out, const T* __restrict__ q, int q_stride,
                             const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                             const int* __restrict__ block_tables, int max_blocks,
                             const int* __restrict__ cu_seqlens,
                             const int* __restrict__ context_lens, const int* __restrict__ tiles,
                             int num_heads, int num_kv_heads, int block_size, float scale) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int kvh = blockIdx.x, tile = blockIdx.y;
  const int group = num_heads / num_kv_heads, bq = ROWS / group;
  const int s = tiles[2 * tile], q0 = tiles[2 * tile + 1];
  const int tok0 = cu_seqlens[s], q_len = cu_seqlens[s + 1] - tok0;
  const int base = context_lens[s] - q_len;
  const int ntok = min(bq, q_len - q0), rows = ntok * group;
  const int kv_end = base + q0 + ntok;  // keys [0, kv_end) are visible to some row
  float* qs = (float*)smem_raw;         // [ROWS][D]
  float* acc = qs + ROWS * D;           // [ROWS][D]
  float* ks = acc + ROWS * D;           // [BK][D+1] (padded: no bank conflicts)
  float* vs = ks + BK * (D + 1);        // [BK][D]
  float* sc = vs + BK * D;              // [ROWS][BK]
  float* row_max = sc + ROWS * BK;
  float* row_sum = row_max + ROWS;
  float* row_alpha = row_sum + ROWS;

  for (int i = threadIdx.x; i < rows * D; i += blockDim.x) {
    const int r = i / D, d = i % D, tok = tok0 + q0 + r / group, head = kvh * group + r % group;
    qs[i] = to_float(q[(size_t)tok * q_stride + (size_t)head * D + d]) * scale;
    acc[i] = 0.f;
  }
  for (int r = threadIdx.x; r < ROWS; r += blockDim.x) {
    row_max[r] = -INFINITY;
    row_sum[r] = 0.f;
  }
  const int* table = block_tables + (size_t)s * max_blocks;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;

  for (int kt = 0; kt < kv_end; kt += BK) {
    __syncthreads();  // previous tile fully consumed
    for (int i = threadIdx.x; i < BK * D; i += blockDim.x) {
      const int j = i / D, d = i % D, key = kt + j;
      float kv = 0.f, vv = 0.f;
      if (key < kv_end) {
        const size_t blk = table[key / block_size];
        const size_t at = ((blk * num_kv_heads + kvh) * block_size + key % block_size) * D + d;
        kv = to_float(k_cache[at]);
        vv = to_float(v_cache[at]);
      }
      ks[j * (D + 1) + d] = kv;
      vs[j * D + d] = vv;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < ROWS * BK; i += blockDim.x) {
      const int r = i / BK, j = i % BK, key = kt + j;
      float v = -INFINITY;
      if (r < rows && key <= base + q0 + r / group) {
        v = 0.f;
#pragma unroll 8
        for (int d = 0; d < D; ++d) v += qs[r * D + d] * ks[j * (D + 1) + d];
      }
      sc[i] = v;
    }
    __syncthreads();
    // Online softmax, one warp per row, lane j <-> key j (BK == 32).
    for (int r = warp; r < rows; r += nwarps) {
      const float v = sc[r * BK + lane];
      const float m_old = row_max[r];
      const float m_new = fmaxf(m_old, warp_max(v));
      const float p = v == -INFINITY ? 0.f : __expf(v - m_new);
      const float l = warp_sum(p);
      sc[r * BK + lane] = p;
      if (lane == 0) {
        const float alpha = m_old == -INFINITY ? 0.f : __expf(m_old - m_new);
        row_alpha[r] = alpha;
        row_sum[r] = row_sum[r] * alpha + l;
        row_max[r] = m_new;
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < rows * D; i += blockDim.x) {
      const int r = i / D, d = i % D;
      float a = acc[i] * row_alpha[r];
#pragma unroll 8
      for (int j = 0; j < BK; ++j) a += sc[r * BK + j] * vs[j * D + d];
      acc[i] = a;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rows * D; i += blockDim.x) {
    const int r = i / D, d = i % D, tok = tok0 + q0 + r / group, head = kvh * group + r % group;
    out[((size_t)tok * num_heads + head) * D + d] = from_float<T>(acc[i] / row_sum[r]);
  }
}

#define DECODE_ARGS                                                                      \
  (void* out, float* tmp_out, float* tmp_max, float* tmp_sum, const void* q, int q_stride, \
   const void* k_cache, const void* v_cache, const int* block_tables, int max_blocks,      \
   const int* context_lens, int num_heads, int num_kv_heads, int block_size, float scale,  \
   int P, int num_partitions)
#define DECODE_CALL(T, D)                                                                 \
  decode_impl<T, D>((T*)out, tmp_out, tmp_max, tmp_sum, (const T*)q, q_stride,            \
                    (const T*)k_cache, (const T*)v_cache, block_tables, max_blocks,       \
                    context_lens, num_heads, num_kv_heads, block_size, scale, P,          \
                    num_partitions)
#define PREFILL_ARGS                                                                     \
  (void* out, const void* q, int q_stride, const void* k_cache, const void* v_cache,       \
   const int* block_tables, int max_blocks, const int* cu_seqlens, const int* context_lens,\
   const int* tiles, int num_heads, int num_kv_heads, int block_size, float scale)
#define PREFILL_CALL(T, D)                                                                \
  prefill_impl<T, D>((T*)out, (const T*)q, q_stride, (const T*)k_cache, (const T*)v_cache, \
                     block_tables, max_blocks, cu_seqlens, context_lens, tiles, num_heads, \
                     num_kv_heads, block_size, scale)

#define INSTANTIATE(SUFFIX, T, D)                                                         \
  extern "C" __global__ void __launch_bounds__(128) paged_decode_##SUFFIX DECODE_ARGS {   \
    DECODE_CALL(T, D);                                                                    \
  }                                                                                       \
  extern "C" __global__ void __launch_bounds__(128) paged_prefill_##SUFFIX PREFILL_ARGS { \
    PREFILL_CALL(T, D);                                                                   \
  }
INSTANTIATE(bf16_d16, __nv_bfloat16, 16)
INSTANTIATE(bf16_d32, __nv_bfloat16, 32)
INSTANTIATE(bf16_d64, __nv_bfloat16, 64)
INSTANTIATE(bf16_d128, __nv_bfloat16, 128)
INSTANTIATE(f16_d16, __half, 16)
INSTANTIATE(f16_d32, __half, 32)
INSTANTIATE(f16_d64, __half, 64)
INSTANTIATE(f16_d128, __half, 128)

extern "C" __global__ void paged_decode_reduce_bf16(void* out, const float* tmp_out,
                                                    const float* tmp_max, const float* tmp_sum,
                                                    const int* context_lens, int num_heads,
                                                    int D, int P, int num_partitions) {
  decode_reduce_impl<__nv_bfloat16>((__nv_bfloat16*)out, tmp_out, tmp_max, tmp_sum,
                                    context_lens, num_heads, D, P, num_partitions);
}
extern "C" __global__ void paged_decode_reduce_f16(void* out, const float* tmp_out,
                                                   const float* tmp_max, const float* tmp_sum,
                                                   const int* context_lens, int num_heads,
                                                   int D, int P, int num_partitions) {
  decode_reduce_impl<__half>((__half*)out, tmp_out, tmp_max, tmp_sum, context_lens,
                             num_heads, D, P, num_partitions);
}
