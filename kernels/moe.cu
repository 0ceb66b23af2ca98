// The sparse MoE block on the device (issue 28 item 5, `--device-moe`):
// routing, grouping per expert and the expert products with no host round
// trip, so a sparse layer costs no synchronisation (the host path downloads
// the router logits once a layer). vLLM's fused_moe is the model: pairs
// (token, choice) sorted by expert, each expert's run padded to MOE_BM rows,
// one grouped GEMM over every M-block whose expert it reads from a table.
// Unlike it, outputs are never added with atomics: each pair's row lands in
// its own slot and moe_combine sums a token's choices in expert order, as
// the host path and the CPU do, so the result is independent of the batch.
// The host halves (bounds, the layout moe_align builds) are in
// crates/cuda/src/moe_plan.rs, tested in CI.
#include <mma.h>

#include "common.cuh"

using namespace agentd;

#define MOE_MAX_EXPERTS 256
#define MOE_BM 64
#define MOE_BN 64
#define MOE_BK 32

// Index of the largest of v[0..n) not yet taken (ties to the lower index),
// marked taken. n <= MOE_MAX_EXPERTS.
__device__ __forceinline__ int take_max(const float* v, bool* taken, int n) {
  int best = -1;
  for (int e = 0; e < n; ++e)
    if (!taken[e] && (best < 0 || v[e] > v[best])) best = e;
  if (best >= 0) taken[best] = true;
  return best;
}

// Sorts a token's k choices by expert (k <= 16: insertion sort).
__device__ __forceinline__ void sort_by_expert(int* ids, float* w, int k) {
  for (int i = 1; i < k; ++i)
    for (int j = i; j > 0 && ids[j - 1] > ids[j]; --j) {
      const int ti = ids[j];
      ids[j] = ids[j - 1];
      ids[j - 1] = ti;
      const float tw = w[j];
      w[j] = w[j - 1];
      w[j - 1] = tw;
    }
}

// Routing, one thread per token, as agentd_runtime::router::route computes
// it: kind 0 = softmax top-k (renormalised when norm); kind 1 = GLM-4.5's
// grouped sigmoid (choice on score + bias within the topk_group groups
// whose two best biased scores sum highest, masked experts at 0.0 as
// transformers fills them; weights the unbiased scores, normalised with
// +1e-20 when norm, times scale). Writes ids/weights [tokens, k], each
// token's choices in expert order.
extern "C" __global__ void moe_route(int* __restrict__ ids, float* __restrict__ weights,
                                     const float* __restrict__ logits,
                                     const float* __restrict__ bias, int tokens, int E, int k,
                                     int kind, int norm, int n_group, int topk_group,
                                     float scale) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  const float* row = logits + (size_t)t * E;
  float score[MOE_MAX_EXPERTS], choice[MOE_MAX_EXPERTS];
  bool taken[MOE_MAX_EXPERTS];
  int* my_ids = ids + (size_t)t * k;
  float* my_w = weights + (size_t)t * k;
  for (int e = 0; e < E; ++e) taken[e] = false;
  if (kind == 0) {
    float mx = -INFINITY;
    for (int e = 0; e < E; ++e) mx = fmaxf(mx, row[e]);
    float sum = 0.f;
    for (int e = 0; e < E; ++e) {
      score[e] = expf(row[e] - mx);
      sum += score[e];
    }
    for (int e = 0; e < E; ++e) score[e] /= sum;
    float s = 0.f;
    for (int j = 0; j < k; ++j) {
      const int e = take_max(score, taken, E);
      my_ids[j] = e;
      my_w[j] = score[e];
      s += score[e];
    }
    if (norm)
      for (int j = 0; j < k; ++j) my_w[j] /= s;
  } else {
    for (int e = 0; e < E; ++e) {
      score[e] = 1.f / (1.f + expf(-row[e]));
      choice[e] = bias ? score[e] + bias[e] : score[e];
    }
    const int per = E / max(n_group, 1);
    if (n_group > 1) {
      float gscore[MOE_MAX_EXPERTS];
      bool gtaken[MOE_MAX_EXPERTS];
      for (int g = 0; g < n_group; ++g) {
        bool two[MOE_MAX_EXPERTS];
        for (int i = 0; i < per; ++i) two[i] = false;
        const int a = take_max(choice + g * per, two, per);
        const int b = take_max(choice + g * per, two, per);
        gscore[g] = choice[g * per + a] + (b >= 0 ? choice[g * per + b] : 0.f);
        gtaken[g] = false;
      }
      for (int j = 0; j < topk_group; ++j) take_max(gscore, gtaken, n_group);
      for (int g = 0; g < n_group; ++g)
        if (!gtaken[g])
          for (int i = 0; i < per; ++i) choice[g * per + i] = 0.f;
    }
    float s = 0.f;
    for (int j = 0; j < k; ++j) {
      const int e = take_max(choice, taken, E);
      my_ids[j] = e;
      my_w[j] = score[e];
      s += score[e];
    }
    s += 1e-20f;
    for (int j = 0; j < k; ++j) my_w[j] = (norm ? my_w[j] / s : my_w[j]) * scale;
  }
  sort_by_expert(my_ids, my_w, k);
}

// Each expert's pair count and its run's first row, runs padded to MOE_BM
// rows and laid end to end in expert order: offsets[E + 1]; block_expert[b]
// = the expert of M-block b; *num_blocks = the blocks used. One CTA.
extern "C" __global__ void moe_align_count(int* __restrict__ offsets,
                                           int* __restrict__ block_expert,
                                           int* __restrict__ num_blocks,
                                           const int* __restrict__ ids, int pairs, int E) {
  __shared__ int counts[MOE_MAX_EXPERTS];
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) atomicAdd(&counts[ids[i]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int row = 0, b = 0;
    for (int e = 0; e < E; ++e) {
      offsets[e] = row;
      const int blocks = (counts[e] + MOE_BM - 1) / MOE_BM;
      for (int j = 0; j < blocks; ++j) block_expert[b + j] = e;
      b += blocks;
      row += blocks * MOE_BM;
    }
    offsets[E] = row;
    *num_blocks = b;
  }
}

// Expert blockIdx.x's pairs into its run, in pair (= token) order: a stable
// compaction by ballot. sorted[row] = the pair index (-1 on padding rows);
// row_of[pair] = its row. grid: E; block: 256.
extern "C" __global__ void moe_align_scatter(int* __restrict__ sorted, int* __restrict__ row_of,
                                             const int* __restrict__ offsets,
                                             const int* __restrict__ ids, int pairs) {
  __shared__ int warp_counts[8];
  __shared__ int base_s;
  const int e = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int first = offsets[e], end = offsets[e + 1];
  if (threadIdx.x == 0) base_s = 0;
  __syncthreads();
  for (int i0 = 0; i0 < pairs; i0 += blockDim.x) {
    const int i = i0 + threadIdx.x;
    const bool mine = i < pairs && ids[i] == e;
    const unsigned m = __ballot_sync(0xffffffffu, mine);
    if (lane == 0) warp_counts[warp] = __popc(m);
    __syncthreads();
    int before = base_s;
    for (int w = 0; w < warp; ++w) before += warp_counts[w];
    if (mine) {
      const int row = first + before + __popc(m & ((1u << lane) - 1));
      sorted[row] = i;
      row_of[i] = row;
    }
    __syncthreads();
    if (threadIdx.x == 0)
      for (int w = 0; w < (int)(blockDim.x >> 5); ++w) base_s += warp_counts[w];
    __syncthreads();
  }
  for (int row = first + base_s + threadIdx.x; row < end; row += blockDim.x) sorted[row] = -1;
}

// The grouped GEMM: out[row, n] = sum_k a[src(row), k] * W_e[n, k] for every
// row of every used M-block, W_e = weights[block_expert[block]] ([N, K]
// row-major, as cuBLAS's linear takes it); src(row) = sorted[row] / topk
// (gather: rows of the layer input by token) or row (the previous product).
// Padding rows read zeros and are not stored. K % 8 == 0 (16-byte loads;
// host-checked). Tensor cores through WMMA 16x16x16, f32 accumulation.
// grid: (ceil(N / MOE_BN), max_blocks); block: 128 (2 x 2 warps of 32 x 32).
template <typename T>
__device__ void moe_gemm_impl(T* __restrict__ out, const T* __restrict__ a,
                              const unsigned long long* __restrict__ weights,
                              const int* __restrict__ sorted,
                              const int* __restrict__ block_expert,
                              const int* __restrict__ num_blocks, int N, int K, int gather,
                              int topk) {
  using namespace nvcuda;
  constexpr int LD = MOE_BK + 8;  // halves; a multiple of 8 as WMMA asks
  __shared__ __align__(32) T as[MOE_BM * LD];
  __shared__ __align__(32) T bs[MOE_BN * LD];
  __shared__ __align__(32) float cs[MOE_BM * (MOE_BN + 4)];
  __shared__ int src[MOE_BM];
  const int mb = blockIdx.y, n0 = blockIdx.x * MOE_BN;
  if (mb >= *num_blocks) return;
  const T* w = reinterpret_cast<const T*>(weights[block_expert[mb]]);
  for (int r = threadIdx.x; r < MOE_BM; r += blockDim.x) {
    const int p = sorted[mb * MOE_BM + r];
    src[r] = p < 0 ? -1 : (gather ? p / topk : mb * MOE_BM + r);
  }
  const int warp = threadIdx.x >> 5, wm = warp >> 1, wn = warp & 1;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.f);
  __syncthreads();
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int k0 = 0; k0 < K; k0 += MOE_BK) {
    // 64 rows x 32 halves = 256 loads of 16 bytes per tile; 2 per thread.
    for (int c = threadIdx.x; c < MOE_BM * MOE_BK / 8; c += blockDim.x) {
      const int r = c / (MOE_BK / 8), kk = (c % (MOE_BK / 8)) * 8;
      const bool in_k = k0 + kk < K;
      const int s = src[r];
      *reinterpret_cast<uint4*>(&as[r * LD + kk]) =
          (s >= 0 && in_k) ? *reinterpret_cast<const uint4*>(a + (size_t)s * K + k0 + kk) : zero;
      const int n = n0 + r;
      *reinterpret_cast<uint4*>(&bs[r * LD + kk]) =
          (n < N && in_k) ? *reinterpret_cast<const uint4*>(w + (size_t)n * K + k0 + kk) : zero;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < MOE_BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb[2];
#pragma unroll
      for (int i = 0; i < 2; ++i)
        wmma::load_matrix_sync(fa[i], &as[(wm * 32 + i * 16) * LD + kk], LD);
#pragma unroll
      for (int j = 0; j < 2; ++j)
        wmma::load_matrix_sync(fb[j], &bs[(wn * 32 + j * 16) * LD + kk], LD);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(&cs[(wm * 32 + i * 16) * (MOE_BN + 4) + wn * 32 + j * 16],
                              acc[i][j], MOE_BN + 4, wmma::mem_row_major);
  __syncthreads();
  for (int idx = threadIdx.x; idx < MOE_BM * MOE_BN; idx += blockDim.x) {
    const int r = idx / MOE_BN, c = idx % MOE_BN, n = n0 + c;
    if (src[r] >= 0 && n < N)
      out[(size_t)(mb * MOE_BM + r) * N + n] = from_float<T>(cs[r * (MOE_BN + 4) + c]);
  }
}
AGENTD_BF16_F16(moe_gemm,
                (void* out, const void* a, const unsigned long long* weights, const int* sorted,
                 const int* block_expert, const int* num_blocks, int N, int K, int gather,
                 int topk),
                ((T*)out, (const T*)a, weights, sorted, block_expert, num_blocks, N, K, gather,
                 topk))

// acc[t, :] = sum_j w[t, j] * y[row_of[t * k + j], :] in f32, a token's
// choices in expert order (the host path's and the CPU's order).
// grid: tokens; block: 256.
template <typename T>
__device__ void moe_combine_impl(float* __restrict__ acc, const T* __restrict__ y,
                                 const int* __restrict__ row_of, const float* __restrict__ w,
                                 int k, int hidden) {
  const int t = blockIdx.x;
  for (int d = threadIdx.x; d < hidden; d += blockDim.x) {
    float s = 0.f;
    for (int j = 0; j < k; ++j)
      s += w[t * k + j] * to_float(y[(size_t)row_of[t * k + j] * hidden + d]);
    acc[(size_t)t * hidden + d] = s;
  }
}
AGENTD_BF16_F16(moe_combine,
                (float* acc, const void* y, const int* row_of, const float* w, int k, int hidden),
                (acc, (const T*)y, row_of, w, k, hidden))
