// Sampling on the device (issue 28 item 1): one CTA per logits row draws the
// row's next token by its plan, so only token ids and requested logprobs
// leave the GPU. The algorithm is the Rust reference's
// (crates/runtime/src/sampling/device.rs `draw_planned`), step for step:
//
//   A. raw statistics when logprobs are asked: max, log-sum-exp, and the n
//      best (logit desc, index asc) by n argmax passes, each below the last;
//   B. the sparse edits in place (banned -> -inf; + bias; repetition penalty
//      on seen tokens; - frequency*count - presence), the raw value of each
//      edited token saved; the allowed bitmask is read, never written;
//   C. greedy: argmax. Otherwise the candidate set of the host sampler
//      (top-k, then top-p on it, then min-p), found by radix selection on
//      the order-preserving bits of the logit (8 bits a pass, counts for
//      top-k and weights for top-p in shared-memory histograms; ties at the
//      cut resolved by index, as a stable sort would), then Gumbel-max over
//      it with Philox4x32-10 noise keyed by (seed, draw index, token);
//   D. the token, its raw logprob and the n best written to `out`.
//
// Layouts (host side: crates/cuda/src/sampling.rs, tested there):
//   params: ROW_WORDS u32 per row (see the P_* offsets; f32 as bits);
//   edits:  EDIT_WORDS u32 per edit: token, flags (1 banned, 2 seen,
//           4 bias), bias bits, count;
//   masks:  per masked row, ceil(vocab/32) words; bit t%32 of word t/32;
//   saved:  one f32 per edit (scratch);
//   out:    out_stride u32 per row: token, logprob bits, then n (token,
//           logprob bits) pairs.
// grid: rows; block: SAMPLE_THREADS (1024). Shared memory: static.
#include <math_constants.h>

#include "common.cuh"

using namespace agentd;

#define SAMPLE_THREADS 1024
#define NWARPS (SAMPLE_THREADS / 32)
#define MAX_TOP 20

enum {
  P_TEMPERATURE = 0,
  P_TOP_P,
  P_MIN_P,
  P_REPETITION,
  P_PRESENCE,
  P_FREQUENCY,
  P_TOP_K,
  P_LOGPROBS,  // n alternatives; bit 31 set: no logprobs at all
  P_SEED_LO,
  P_SEED_HI,
  P_DRAW_LO,
  P_DRAW_HI,
  P_EDIT_START,
  P_EDIT_COUNT,
  P_MASK_START,  // 0xffffffff: no mask
  P_RESERVED,
  ROW_WORDS
};
#define EDIT_WORDS 4
#define NO_LOGPROBS 0x80000000u
#define NO_MASK 0xffffffffu

// ---- Philox4x32-10 and the Gumbel noise (same integer code as the Rust) ----

__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint32_t k0, uint32_t k1) {
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint32_t hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
    c = make_uint4(hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0);
  }
  return c;
}

__device__ __forceinline__ float gumbel(uint32_t s0, uint32_t s1, uint32_t d0, uint32_t d1,
                                        uint32_t i) {
  const uint32_t x = philox4x32_10(make_uint4(i, d0, d1, 0u), s0, s1).x;
  const float u = ((float)(x >> 8) + 0.5f) * (1.0f / 16777216.0f);
  return -logf(-logf(u));
}

// ---- order and reductions ----

// Bits that order like the float (NaN is never kept: callers map it to -inf).
__device__ __forceinline__ uint32_t key_of(float x) {
  const uint32_t b = __float_as_uint(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// (value, index) with the larger value first, the lower index on ties.
struct Best {
  float v;
  int i;
};
__device__ __forceinline__ Best better(Best a, Best b) {
  if (b.v > a.v || (b.v == a.v && b.i < a.i)) return b;
  return a;
}
__device__ __forceinline__ Best block_best(Best b, Best* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Best other{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.i, o)};
    b = better(b, other);
  }
  __syncthreads();
  if (lane == 0) scratch[warp] = b;
  __syncthreads();
  Best t{-CUDART_INF_F, 0x7fffffff};
  for (int w = 0; w < NWARPS; ++w) t = better(t, scratch[w]);
  return t;
}

__device__ __forceinline__ uint32_t block_sum_u32(uint32_t v, uint32_t* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  uint32_t t = 0;
  for (int w = 0; w < NWARPS; ++w) t += scratch[w];
  return t;
}

// The row as the sampler sees it: masked tokens and NaN are -inf.
struct Row {
  const float* x;
  const uint32_t* mask;  // null: every token allowed
  int vocab;
  __device__ __forceinline__ float operator()(int i) const {
    if (mask && !((mask[i >> 5] >> (i & 31)) & 1u)) return -CUDART_INF_F;
    const float v = x[i];
    return isnan(v) ? -CUDART_INF_F : v;
  }
};

// Whether token i is still a candidate: key above `cut_key`, or equal to it
// at an index up to `cut_idx`.
struct Cut {
  uint32_t key;
  int idx;
  __device__ __forceinline__ bool keeps(uint32_t k, int i) const {
    return k > key || (k == key && i <= idx);
  }
};
__device__ __forceinline__ Cut no_cut() { return Cut{0u, 0x7fffffff}; }

struct Shared {
  Best best[NWARPS];
  uint32_t u[NWARPS];
  float f[NWARPS];
  uint32_t count[256];
  float mass[256];
  uint32_t chunk_u[SAMPLE_THREADS];
  float chunk_f[SAMPLE_THREADS];
  int top_i[MAX_TOP];
  float top_v[MAX_TOP];
  uint32_t digit;
  uint32_t rest_u;
  float rest_f;
  int cut_idx;
};

// The cut keeping the `k` best of the kept-by-`prev` tokens (by count), or
// the shortest prefix whose weight e^((x-m)·inv_t) reaches `target` (by
// mass, when `by_mass`). Radix selection over the key, 8 bits a pass, then
// the index among the tied keys by a scan in index order.
__device__ Cut select_cut(const Row& row, Cut prev, bool by_mass, uint32_t k, float target,
                          float m, float inv_t, Shared& sh) {
  uint32_t prefix = 0, prefix_mask = 0;
  uint32_t rest_u = k;
  float rest_f = target;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += blockDim.x) {
      sh.count[d] = 0;
      sh.mass[d] = 0.f;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < row.vocab; i += blockDim.x) {
      const float v = row(i);
      if (v == -CUDART_INF_F) continue;
      const uint32_t key = key_of(v);
      if (!prev.keeps(key, i) || (key & prefix_mask) != prefix) continue;
      const uint32_t d = (key >> shift) & 0xffu;
      if (by_mass)
        atomicAdd(&sh.mass[d], __expf((v - m) * inv_t));
      else
        atomicAdd(&sh.count[d], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      // Walk digits from the highest: the one where the running total
      // reaches what is left to find.
      int d = 255;
      for (; d > 0; --d) {
        if (by_mass) {
          if (sh.mass[d] >= rest_f) break;
          rest_f -= sh.mass[d];
        } else {
          if (sh.count[d] >= rest_u) break;
          rest_u -= sh.count[d];
        }
      }
      sh.digit = (uint32_t)d;
      sh.rest_u = rest_u;
      sh.rest_f = rest_f;
    }
    __syncthreads();
    prefix |= sh.digit << shift;
    prefix_mask |= 0xffu << shift;
    rest_u = sh.rest_u;
    rest_f = sh.rest_f;
    __syncthreads();
  }
  // Ties at `prefix`: keep them in index order until what is left is
  // reached. Each thread scans a contiguous chunk.
  const int chunk = (row.vocab + blockDim.x - 1) / blockDim.x;
  const int lo = threadIdx.x * chunk, hi = min(row.vocab, lo + chunk);
  uint32_t n = 0;
  float w = 0.f;
  for (int i = lo; i < hi; ++i) {
    const float v = row(i);
    if (v == -CUDART_INF_F || key_of(v) != prefix || !prev.keeps(prefix, i)) continue;
    ++n;
    w += __expf((v - m) * inv_t);
  }
  sh.chunk_u[threadIdx.x] = n;
  sh.chunk_f[threadIdx.x] = w;
  __syncthreads();
  if (threadIdx.x == 0) {
    int t = 0;
    for (; t < (int)blockDim.x - 1; ++t) {
      if (by_mass ? sh.chunk_f[t] >= rest_f : sh.chunk_u[t] >= rest_u) break;
      rest_u -= sh.chunk_u[t];
      rest_f -= sh.chunk_f[t];
    }
    // Within chunk t: the token where the running total reaches the rest.
    const int tlo = t * chunk, thi = min(row.vocab, tlo + chunk);
    int cut = thi - 1;
    for (int i = tlo; i < thi; ++i) {
      const float v = row(i);
      if (v == -CUDART_INF_F || key_of(v) != prefix || !prev.keeps(prefix, i)) continue;
      if (by_mass) {
        rest_f -= __expf((v - m) * inv_t);
        if (rest_f <= 0.f) {
          cut = i;
          break;
        }
      } else if (--rest_u == 0) {
        cut = i;
        break;
      }
    }
    sh.cut_idx = cut;
  }
  __syncthreads();
  return Cut{prefix, sh.cut_idx};
}

// Total weight e^((x-m)·inv_t) of the tokens `cut` keeps.
__device__ float kept_mass(const Row& row, Cut cut, float m, float inv_t, Shared& sh) {
  float w = 0.f;
  for (int i = threadIdx.x; i < row.vocab; i += blockDim.x) {
    const float v = row(i);
    if (v != -CUDART_INF_F && cut.keeps(key_of(v), i)) w += __expf((v - m) * inv_t);
  }
  return block_sum(w, sh.f);
}

__device__ __forceinline__ float param_f(const uint32_t* p, int i) {
  return __uint_as_float(p[i]);
}

// Step A: max, log-sum-exp and the n best of the raw row.
__device__ float raw_stats(const float* x, int vocab, int n, Shared& sh) {
  float mx = -CUDART_INF_F;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) mx = fmaxf(mx, x[i]);
  mx = block_max(mx, sh.f);
  float s = 0.f;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) s += expf(x[i] - mx);
  const float lse = mx + logf(block_sum(s, sh.f));
  Best prev{CUDART_INF_F, -1};
  for (int j = 0; j < n; ++j) {
    Best b{-CUDART_INF_F, 0x7fffffff};
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float v = isnan(x[i]) ? -CUDART_INF_F : x[i];
      // Strictly after the previous pick in (value desc, index asc).
      if (v < prev.v || (v == prev.v && i > prev.i)) b = better(b, Best{v, i});
    }
    b = block_best(b, sh.best);
    if (threadIdx.x == 0) {
      sh.top_i[j] = b.i;
      sh.top_v[j] = b.v;
    }
    prev = b;
  }
  return lse;
}

// Step B: the sparse edits, in place; raw values saved.
__device__ void apply_edits(float* x, const uint32_t* p, const uint32_t* edits, float* saved) {
  const uint32_t start = p[P_EDIT_START], count = p[P_EDIT_COUNT];
  const float rep = param_f(p, P_REPETITION), pres = param_f(p, P_PRESENCE),
              freq = param_f(p, P_FREQUENCY);
  for (uint32_t j = threadIdx.x; j < count; j += blockDim.x) {
    const uint32_t* e = edits + (size_t)(start + j) * EDIT_WORDS;
    const uint32_t t = e[0], flags = e[1], cnt = e[3];
    const float raw = x[t];
    saved[start + j] = raw;
    float y = raw;
    if ((flags & 1u) || raw == -CUDART_INF_F) {
      y = -CUDART_INF_F;
    } else {
      if (flags & 4u) y += __uint_as_float(e[2]);
      if ((flags & 2u) && rep != 1.f) y = y > 0.f ? y / rep : y * rep;
      if (cnt > 0) y -= freq * (float)cnt + pres;
    }
    x[t] = y;
  }
  __syncthreads();
}

// Step C: the drawn token.
__device__ int choose(const Row& row, const uint32_t* p, Shared& sh) {
  Best b{-CUDART_INF_F, 0x7fffffff};
  for (int i = threadIdx.x; i < row.vocab; i += blockDim.x) b = better(b, Best{row(i), i});
  const Best top = block_best(b, sh.best);
  const float temp = param_f(p, P_TEMPERATURE);
  const float m = top.v;
  if (temp < 1e-5f || !isfinite(m)) return top.i == 0x7fffffff ? 0 : top.i;
  const float inv_t = 1.f / temp;
  const uint32_t k = p[P_TOP_K];
  const float top_p = param_f(p, P_TOP_P), min_p = param_f(p, P_MIN_P);
  Cut cut = no_cut();
  if (k > 0 && k < (uint32_t)row.vocab) cut = select_cut(row, cut, false, k, 0.f, m, inv_t, sh);
  if (top_p < 1.f) {
    const float z = kept_mass(row, cut, m, inv_t, sh);
    cut = select_cut(row, cut, true, 0u, top_p * z, m, inv_t, sh);
  }
  // p_i >= min_p * p_max  <=>  x_i >= m + T ln(min_p).
  const float floor = min_p > 0.f ? m + logf(min_p) / inv_t : -CUDART_INF_F;
  const uint32_t s0 = p[P_SEED_LO], s1 = p[P_SEED_HI], d0 = p[P_DRAW_LO], d1 = p[P_DRAW_HI];
  Best g{-CUDART_INF_F, 0x7fffffff};
  for (int i = threadIdx.x; i < row.vocab; i += blockDim.x) {
    const float v = row(i);
    if (v == -CUDART_INF_F || v < floor || !cut.keeps(key_of(v), i)) continue;
    g = better(g, Best{(v - m) * inv_t + gumbel(s0, s1, d0, d1, (uint32_t)i), i});
  }
  g = block_best(g, sh.best);
  return g.i == 0x7fffffff ? top.i : g.i;
}

// The raw logit of `token`: saved if an edit changed it.
__device__ float raw_of(const float* x, const uint32_t* p, const uint32_t* edits,
                        const float* saved, int token) {
  uint32_t lo = p[P_EDIT_START], hi = lo + p[P_EDIT_COUNT];
  while (lo < hi) {
    const uint32_t mid = (lo + hi) / 2;
    const uint32_t t = edits[(size_t)mid * EDIT_WORDS];
    if (t == (uint32_t)token) return saved[mid];
    if (t < (uint32_t)token)
      lo = mid + 1;
    else
      hi = mid;
  }
  return x[token];
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_rows(float* logits, int vocab, const uint32_t* params, const uint32_t* edits,
                const uint32_t* masks, float* saved, uint32_t* out, int out_stride) {
  __shared__ Shared sh;
  const int r = blockIdx.x;
  float* x = logits + (size_t)r * vocab;
  const uint32_t* p = params + (size_t)r * ROW_WORDS;
  const uint32_t lp = p[P_LOGPROBS];
  const bool want = !(lp & NO_LOGPROBS);
  const int n = want ? min((int)lp, MAX_TOP) : 0;
  const float lse = want ? raw_stats(x, vocab, n, sh) : 0.f;
  apply_edits(x, p, edits, saved);
  const Row row{x, p[P_MASK_START] == NO_MASK ? nullptr : masks + p[P_MASK_START], vocab};
  const int token = choose(row, p, sh);
  if (threadIdx.x == 0) {
    uint32_t* o = out + (size_t)r * out_stride;
    o[0] = (uint32_t)token;
    o[1] = __float_as_uint(want ? raw_of(x, p, edits, saved, token) - lse : 0.f);
    for (int j = 0; j < n; ++j) {
      o[2 + 2 * j] = (uint32_t)sh.top_i[j];
      o[3 + 2 * j] = __float_as_uint(sh.top_v[j] - lse);
    }
  }
}
