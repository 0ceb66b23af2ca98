//! The small-T AVX-512 kernel: 4 weight rows × 4 activation rows per tile,
//! 16 accumulators, 8 loads per 16 FMAs, one horizontal sum per output.

// Register tiles read best as explicit index loops.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

/// Reduction length per tile pass (see [`block`]).
const K_CHUNK: usize = 1024;

/// One task's weight rows `r0..r1` against activation rows `t0..t1`, in
/// 4×4 tiles. Edge tiles repeat their last valid row (results discarded)
/// so a single kernel serves every shape.
///
/// # Safety
/// AVX-512F must be available; `x` has `t1` rows and `w` has `r1` rows of
/// `k` floats; `out` points to a `[T, n]` buffer whose columns `r0..r1`
/// no other thread writes.
#[target_feature(enable = "avx512f")]
pub unsafe fn block(
    x: &[f32],
    w: &[f32],
    k: usize,
    n: usize,
    (r0, r1): (usize, usize),
    (t0, t1): (usize, usize),
    out: *mut f32,
) {
    let mut r = r0;
    while r < r1 {
        let rr = (r1 - r).min(4);
        let wp: [*const f32; 4] = std::array::from_fn(|i| w.as_ptr().add((r + i.min(rr - 1)) * k));
        // k in chunks, so a tile's 4 weight rows and 4 activation rows
        // (2 x 16 KiB) stay in L1 across the pass over activation rows.
        let mut k0 = 0;
        while k0 < k {
            let kc = (k - k0).min(K_CHUNK);
            let mut t = t0;
            while t < t1 {
                let tc = (t1 - t).min(4);
                let xp: [*const f32; 4] =
                    std::array::from_fn(|i| x.as_ptr().add((t + i.min(tc - 1)) * k + k0));
                // The first pass over a weight tile also prefetches the
                // next tile: each weight row is one 4 KiB page, where the
                // hardware prefetcher stops, so a cold row would otherwise
                // start with a run of misses to DRAM.
                let acc = if t == t0 && r + 4 < r1 {
                    let next = wp.map(|p| p.add(4 * k + k0));
                    tile4x4::<true>(wp.map(|p| p.add(k0)), xp, next, kc)
                } else {
                    tile4x4::<false>(wp.map(|p| p.add(k0)), xp, wp, kc)
                };
                for c in 0..tc {
                    for (ri, a) in acc.iter().enumerate().take(rr) {
                        let o = out.add((t + c) * n + r + ri);
                        if k0 == 0 {
                            *o = a[c];
                        } else {
                            *o += a[c];
                        }
                    }
                }
                t += 4;
            }
            k0 += kc;
        }
        r += 4;
    }
}

/// Dot products of 4 weight rows with 4 activation rows over `k` floats.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn tile4x4<const PREFETCH: bool>(
    w: [*const f32; 4],
    x: [*const f32; 4],
    next: [*const f32; 4],
    k: usize,
) -> [[f32; 4]; 4] {
    let mut acc = [[_mm512_setzero_ps(); 4]; 4];
    let mut i = 0;
    while i + 16 <= k {
        if PREFETCH {
            for p in next {
                _mm_prefetch::<_MM_HINT_T0>(p.add(i) as *const i8);
            }
        }
        let wv = [
            _mm512_loadu_ps(w[0].add(i)),
            _mm512_loadu_ps(w[1].add(i)),
            _mm512_loadu_ps(w[2].add(i)),
            _mm512_loadu_ps(w[3].add(i)),
        ];
        for c in 0..4 {
            let xv = _mm512_loadu_ps(x[c].add(i));
            for r in 0..4 {
                acc[r][c] = _mm512_fmadd_ps(wv[r], xv, acc[r][c]);
            }
        }
        i += 16;
    }
    if i < k {
        let mask: __mmask16 = ((1u32 << (k - i)) - 1) as __mmask16;
        let wv = [
            _mm512_maskz_loadu_ps(mask, w[0].add(i)),
            _mm512_maskz_loadu_ps(mask, w[1].add(i)),
            _mm512_maskz_loadu_ps(mask, w[2].add(i)),
            _mm512_maskz_loadu_ps(mask, w[3].add(i)),
        ];
        for c in 0..4 {
            let xv = _mm512_maskz_loadu_ps(mask, x[c].add(i));
            for r in 0..4 {
                acc[r][c] = _mm512_fmadd_ps(wv[r], xv, acc[r][c]);
            }
        }
    }
    let mut out = [[0f32; 4]; 4];
    for r in 0..4 {
        for c in 0..4 {
            out[r][c] = _mm512_reduce_add_ps(acc[r][c]);
        }
    }
    out
}
