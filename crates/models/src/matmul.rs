//! `out = x · Wᵀ` for activations `x` `[T, k]` and a weight `W` `[n, k]` stored
//! row-major as Hugging Face stores it, threaded over blocks of weight rows.
//!
//! Why not candle's gemm for these: in decode, T is the number of running
//! sequences (1..64). candle's gemm (the `gemm` crate as candle builds it)
//! runs AVX2 micro-kernels only, packs operands for large blocks, and runs a
//! one-row product on one core. This kernel streams each block of weight rows
//! once from memory, dots it with every activation row while it sits in L1/L2,
//! and on CPUs with AVX-512 uses 4×4 register tiles of 16-lane FMAs (16
//! accumulators, 8 loads per 16 FMAs: FMA-bound, not load-bound).
//! Without AVX-512 it falls back to `simd::dot_rows` (AVX2 or portable).

use rayon::prelude::*;

use crate::simd;

/// Weight rows per rayon task: 32 rows of k = 1024..3072 floats (128-384 KiB)
/// stay in L2 while every activation row passes over them.
const ROWS_PER_TASK: usize = 32;
/// Activation rows per pass over a task's weight rows (bounds the x working set).
const X_ROWS_PER_PASS: usize = 64;
/// Reduction length per tile pass (see `avx512::block`).
#[cfg(target_arch = "x86_64")]
const K_CHUNK: usize = 1024;

#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint column ranges of `out` (see `matmul_xwt`).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// `out[t, r] = x[t, :] · w[r, :]` for `t < T`, `r < n`.
///
/// Panics if the slices are shorter than the shapes say (callers pass tensors
/// whose shapes were checked).
pub fn matmul_xwt(x: &[f32], t: usize, w: &[f32], n: usize, k: usize, out: &mut [f32]) {
    assert!(x.len() >= t * k && w.len() >= n * k && out.len() >= t * n);
    let out_ptr = OutPtr(out.as_mut_ptr());
    #[cfg(target_arch = "x86_64")]
    let avx512 = std::arch::is_x86_feature_detected!("avx512f");
    (0..n.div_ceil(ROWS_PER_TASK))
        .into_par_iter()
        .for_each(|task| {
            let r0 = task * ROWS_PER_TASK;
            let r1 = (r0 + ROWS_PER_TASK).min(n);
            let mut t0 = 0;
            while t0 < t {
                let t1 = (t0 + X_ROWS_PER_PASS).min(t);
                #[cfg(target_arch = "x86_64")]
                if avx512 {
                    // SAFETY: AVX-512F is present; indices are in bounds by the
                    // assert above; this task owns columns r0..r1 of `out`.
                    unsafe { avx512::block(x, w, k, n, (r0, r1), (t0, t1), out_ptr.0) };
                    t0 = t1;
                    continue;
                }
                portable_block(x, w, k, n, (r0, r1), (t0, t1), out_ptr);
                t0 = t1;
            }
        });
}

fn portable_block(
    x: &[f32],
    w: &[f32],
    k: usize,
    n: usize,
    (r0, r1): (usize, usize),
    (t0, t1): (usize, usize),
    out: OutPtr,
) {
    let xs = &x[t0 * k..t1 * k];
    let mut col = vec![0f32; t1 - t0];
    for r in r0..r1 {
        simd::dot_rows(xs, &w[r * k..(r + 1) * k], &mut col);
        for (i, v) in col.iter().enumerate() {
            // SAFETY: (t0 + i, r) is inside `out` and column r belongs to this task.
            unsafe { *out.0.add((t0 + i) * n + r) = *v };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    // Register tiles read best as explicit index loops.
    #![allow(clippy::needless_range_loop)]
    use std::arch::x86_64::*;

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
            let wp: [*const f32; 4] =
                std::array::from_fn(|i| w.as_ptr().add((r + i.min(rr - 1)) * k));
            // k in chunks, so a tile's 4 weight rows and 4 activation rows
            // (2 x 16 KiB) stay in L1 across the pass over activation rows.
            let mut k0 = 0;
            while k0 < k {
                let kc = (k - k0).min(super::K_CHUNK);
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The path CPUs without AVX-512 take, checked on every machine.
    #[test]
    fn portable_path_matches_naive() {
        let (t, n, k) = (5, 9, 37);
        let x: Vec<f32> = (0..t * k).map(|i| (i as f32 * 0.3).sin()).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.7).cos()).collect();
        let mut out = vec![f32::NAN; t * n];
        portable_block(&x, &w, k, n, (0, n), (0, t), OutPtr(out.as_mut_ptr()));
        for a in 0..t {
            for b in 0..n {
                let want: f32 = (0..k).map(|i| x[a * k + i] * w[b * k + i]).sum();
                assert!((out[a * n + b] - want).abs() < 1e-4);
            }
        }
    }

    #[test]
    fn matches_naive_for_ragged_shapes() {
        for (t, n, k) in [
            (1, 1, 1),
            (1, 70, 33),
            (3, 5, 16),
            (5, 37, 100),
            (70, 9, 17),
            (4, 4, 1024),
        ] {
            let x: Vec<f32> = (0..t * k)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1)
                .collect();
            let w: Vec<f32> = (0..n * k)
                .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.1)
                .collect();
            let mut out = vec![f32::NAN; t * n];
            matmul_xwt(&x, t, &w, n, k, &mut out);
            for a in 0..t {
                for b in 0..n {
                    let want: f32 = (0..k).map(|i| x[a * k + i] * w[b * k + i]).sum();
                    let got = out[a * n + b];
                    assert!(
                        (got - want).abs() < 1e-3,
                        "t={t} n={n} k={k} ({a},{b}): {got} vs {want}"
                    );
                }
            }
        }
    }
}
