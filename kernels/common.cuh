// Shared helpers for agentd's CUDA kernels: element conversion, warp/block
// reductions. Every kernel computes in f32 and stores bf16 or f16.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace agentd {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half(x); }

// Eight consecutive elements (one 16-byte load; `p` 16-byte aligned) as f32.
template <typename T>
__device__ __forceinline__ void load8(const T* __restrict__ p, float (&f)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = to_float(e[i]);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the whole block; `scratch` holds one float per warp. All threads
// get the result.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = 0.f;
  for (int i = 0; i < nwarps; ++i) t += scratch[i];
  return t;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = -INFINITY;
  for (int i = 0; i < nwarps; ++i) t = fmaxf(t, scratch[i]);
  return t;
}

}  // namespace agentd

// Instantiates `NAME##_bf16` and `NAME##_f16` entry points of a templated
// kernel body `NAME##_impl<T>`; ARGS/CALL spell the parameter list and the
// forwarding call.
#define AGENTD_BF16_F16(NAME, ARGS, CALL)        \
  extern "C" __global__ void NAME##_bf16 ARGS {  \
    using T = __nv_bfloat16;                     \
    NAME##_impl<T> CALL;                         \
  }                                              \
  extern "C" __global__ void NAME##_f16 ARGS {   \
    using T = __half;                            \
    NAME##_impl<T> CALL;                         \
  }
