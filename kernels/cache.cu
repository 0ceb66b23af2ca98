// KV-cache kernels. Layout of one layer's K (and V) cache:
// [num_blocks, num_kv_heads, block_size, head_dim], the same as the CPU cache
// (crates/models/src/attention/cache.rs), so one block of one head is a
// contiguous run of block_size * head_dim elements.
#include "common.cuh"

using namespace agentd;

// Writes each new token's K and V into its cache slot. Token t's K head h is
// at src[t*row_stride + k_offset + h*head_dim] (V likewise at v_offset): the
// rows of the fused QKV product. slot < 0 skips the token (padding).
// grid: tokens; block: any.
template <typename T>
__device__ void reshape_and_cache_impl(const T* __restrict__ src, int k_offset, int v_offset,
                                       int row_stride, T* __restrict__ k_cache,
                                       T* __restrict__ v_cache,
                                       const long long* __restrict__ slots, int num_kv_heads,
                                       int head_dim, int block_size) {
  const int t = blockIdx.x;
  const long long slot = slots[t];
  if (slot < 0) return;
  const long long block = slot / block_size, off = slot % block_size;
  const T* row = src + (size_t)t * row_stride;
  const int n = num_kv_heads * head_dim;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int h = i / head_dim, d = i % head_dim;
    const size_t dst = ((block * num_kv_heads + h) * block_size + off) * head_dim + d;
    k_cache[dst] = row[k_offset + i];
    v_cache[dst] = row[v_offset + i];
  }
}
AGENTD_BF16_F16(reshape_and_cache,
                (const void* src, int k_offset, int v_offset, int row_stride, void* k_cache,
                 void* v_cache, const long long* slots, int num_kv_heads, int head_dim,
                 int block_size),
                ((const T*)src, k_offset, v_offset, row_stride, (T*)k_cache, (T*)v_cache,
                 slots, num_kv_heads, head_dim, block_size))

// Copies whole blocks within one layer's cache: pairs[2i] -> pairs[2i+1], for
// K (blockIdx.y == 0) and V (== 1). Copy-on-write of a shared partial block,
// and the device side of a host tier later. 16-byte moves: block_elems * 2
// bytes is a multiple of 16 whenever head_dim is a multiple of 8.
// grid: (pairs, 2); block: any.
__device__ void copy_blocks_impl(uint4* __restrict__ k_cache, uint4* __restrict__ v_cache,
                                 const long long* __restrict__ pairs, int block_vecs) {
  uint4* cache = blockIdx.y == 0 ? k_cache : v_cache;
  const long long src = pairs[2 * blockIdx.x] * block_vecs;
  const long long dst = pairs[2 * blockIdx.x + 1] * block_vecs;
  for (int i = threadIdx.x; i < block_vecs; i += blockDim.x) cache[dst + i] = cache[src + i];
}
extern "C" __global__ void copy_blocks(void* k_cache, void* v_cache, const long long* pairs,
                                       int block_vecs) {
  copy_blocks_impl((uint4*)k_cache, (uint4*)v_cache, pairs, block_vecs);
}
