//! The AVX2+FMA form of [`super::small`] (one to four activation rows):
//! lanes hold 8 weight rows; 8×8 weight tiles (8 rows × 8 consecutive k) are
//! transposed in registers (24 shuffles) and each activation value is
//! broadcast against a column.
//!
//! Every output is the FMA chain `acc = w·x + acc` over k in order from zero,
//! as in every other kernel, so the results equal the AVX-512 kernels' bit
//! for bit and a row's result does not depend on its batch.

// Register tiles read best as explicit index loops.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use rayon::prelude::*;

use super::{ElemKind, OutPtr, WeightElem};

/// Weight rows per pass: one tile of 8 (its 8 registers, up to 4
/// accumulators and the broadcast fit the 16 ymm registers; two tiles per
/// pass spilled to the stack).
const PASS_ROWS: usize = 8;

/// `out[t, r] = x[t, :] · w[r, :]` for `t <= 8`.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `x` has `t` rows and `w` has `n`
/// rows of `k` floats; `out` holds `t * n` floats that nothing else touches
/// meanwhile.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn matmul<W: WeightElem>(x: &[f32], t: usize, w: &[W], n: usize, k: usize, out: OutPtr) {
    let per_task = super::small_rows_per_task(n, PASS_ROWS);
    (0..n.div_ceil(per_task))
        .into_par_iter()
        .for_each(move |task| {
            let rows = (task * per_task, ((task + 1) * per_task).min(n));
            // SAFETY: as the caller's; this task owns columns `rows` of out.
            unsafe { passes(x, t, w, n, k, rows, out) }
        });
}

/// The task's rows, a pass of 8 at a time. Above 4 activation rows the pass
/// runs twice over the same (now cached) weights, rows 0-3 then the rest:
/// 8 accumulators beside the 8 tile registers and the broadcast would not
/// fit the 16 ymm registers, and the spills made T = 8 slower than the
/// broadcast kernel.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn passes<W: WeightElem>(
    x: &[f32],
    t: usize,
    w: &[W],
    n: usize,
    k: usize,
    (r0, r1): (usize, usize),
    out: OutPtr,
) {
    let mut r = r0;
    while r < r1 {
        let rr = (r1 - r).min(PASS_ROWS);
        // Rows past the end repeat the last valid one (results not stored).
        let wp: [*const W; PASS_ROWS] =
            std::array::from_fn(|j| w.as_ptr().add((r + j.min(rr - 1)) * k));
        let mut t0 = 0;
        while t0 < t {
            let x0 = x.as_ptr().add(t0 * k);
            let dst = OutPtr(out.0.add(t0 * n + r));
            // Prefetch the next pass once, on the first run over the weights.
            let pf = t0 == 0;
            match t - t0 {
                1 => pass::<W, 1>(&wp, x0, k, pf, dst, n, rr),
                2 => pass::<W, 2>(&wp, x0, k, pf, dst, n, rr),
                3 => pass::<W, 3>(&wp, x0, k, pf, dst, n, rr),
                _ => pass::<W, 4>(&wp, x0, k, pf, dst, n, rr),
            }
            t0 += 4;
        }
        r += PASS_ROWS;
    }
}

/// One pass: `T` activation rows from `x` against the rows `wp`, the first
/// `rr` results of each stored at `out + t * n`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn pass<W: WeightElem, const T: usize>(
    wp: &[*const W; PASS_ROWS],
    x: *const f32,
    k: usize,
    prefetch: bool,
    out: OutPtr,
    n: usize,
    rr: usize,
) {
    let mut acc = [_mm256_setzero_ps(); T];
    // As in `small`: columns up to row 0's first 8-column boundary first, so
    // the full tiles' loads are aligned.
    let size = std::mem::size_of::<W>();
    let lead = (8 - (wp[0] as usize / size) % 8) % 8;
    let mut k0 = lead.min(k);
    if k0 > 0 {
        if prefetch {
            super::prefetch_next_pass(wp[0], PASS_ROWS, k, 0, k0);
        }
        partial::<W, T>(wp, x, k, 0, k0, &mut acc);
    }
    while k0 + 8 <= k {
        if prefetch {
            super::prefetch_next_pass(wp[0], PASS_ROWS, k, k0, 8);
        }
        let mut tile: [__m256; 8] = std::array::from_fn(|j| load8(wp[j].add(k0), 8));
        transpose8(&mut tile);
        for i in 0..8 {
            for tt in 0..T {
                let xv = _mm256_set1_ps(*x.add(tt * k + k0 + i));
                acc[tt] = _mm256_fmadd_ps(tile[i], xv, acc[tt]);
            }
        }
        k0 += 8;
    }
    if k0 < k {
        if prefetch {
            super::prefetch_next_pass(wp[0], PASS_ROWS, k, k0, k - k0);
        }
        partial::<W, T>(wp, x, k, k0, k - k0, &mut acc);
    }
    for tt in 0..T {
        let dst = out.0.add(tt * n);
        if rr == 8 {
            _mm256_storeu_ps(dst, acc[tt]);
        } else {
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc[tt]);
            std::ptr::copy_nonoverlapping(lanes.as_ptr(), dst, rr);
        }
    }
}

/// Columns `k0..k0 + kc` (kc < 8) of the pass's rows into `acc`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn partial<W: WeightElem, const T: usize>(
    wp: &[*const W; PASS_ROWS],
    x: *const f32,
    k: usize,
    k0: usize,
    kc: usize,
    acc: &mut [__m256; T],
) {
    let mut tile: [__m256; 8] = std::array::from_fn(|j| load8(wp[j].add(k0), kc));
    transpose8(&mut tile);
    // Stop at kc, as every kernel does.
    for i in 0..kc {
        for tt in 0..T {
            let xv = _mm256_set1_ps(*x.add(tt * k + k0 + i));
            acc[tt] = _mm256_fmadd_ps(tile[i], xv, acc[tt]);
        }
    }
}

/// `kc <= 8` weights from `p` widened to f32, zero lanes past `kc` (bf16: a
/// 16-bit shift; f16: `vcvtph2ps`; both exact).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load8<W: WeightElem>(p: *const W, kc: usize) -> __m256 {
    if kc < 8 {
        let mut tail = [0u32; 8];
        let src = std::slice::from_raw_parts(p, kc);
        for (d, s) in tail.iter_mut().zip(src) {
            *d = s.to_f32().to_bits();
        }
        return _mm256_loadu_ps(tail.as_ptr().cast::<f32>());
    }
    match W::KIND {
        ElemKind::F32 => _mm256_loadu_ps(p.cast::<f32>()),
        ElemKind::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.cast::<__m128i>())),
        ElemKind::Bf16 => {
            let bits = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast::<__m128i>()));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(bits))
        }
    }
}

/// In-register transpose: row j lane i → row i lane j.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn transpose8(r: &mut [__m256; 8]) {
    let t: [__m256; 8] = std::array::from_fn(|i| {
        let (a, b) = (r[2 * (i / 2)], r[2 * (i / 2) + 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_ps(a, b)
        } else {
            _mm256_unpackhi_ps(a, b)
        }
    });
    // t0 = unpacklo(r0, r1), t1 = unpackhi(r0, r1), t2 = unpacklo(r2, r3), ...
    let mut u = [_mm256_setzero_ps(); 8];
    for h in 0..2 {
        let b = 4 * h;
        u[b] = _mm256_shuffle_ps::<0x44>(t[b], t[b + 2]);
        u[b + 1] = _mm256_shuffle_ps::<0xEE>(t[b], t[b + 2]);
        u[b + 2] = _mm256_shuffle_ps::<0x44>(t[b + 1], t[b + 3]);
        u[b + 3] = _mm256_shuffle_ps::<0xEE>(t[b + 1], t[b + 3]);
    }
    for i in 0..4 {
        r[i] = _mm256_permute2f128_ps::<0x20>(u[i], u[4 + i]);
        r[4 + i] = _mm256_permute2f128_ps::<0x31>(u[i], u[4 + i]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu_kernels::KernelPath;

    #[test]
    fn transpose8_moves_row_j_lane_i_to_row_i_lane_j() {
        if !KernelPath::Avx2.supported() {
            eprintln!("SKIPPED: no AVX2 on this CPU");
            return;
        }
        let m: Vec<f32> = (0..64).map(|i| i as f32).collect();
        // SAFETY: AVX2/FMA/F16C were detected above; m holds 64 floats.
        unsafe {
            let mut r: [__m256; 8] =
                std::array::from_fn(|j| _mm256_loadu_ps(m.as_ptr().add(8 * j)));
            transpose8(&mut r);
            for (i, v) in r.iter().enumerate() {
                let mut o = [0f32; 8];
                _mm256_storeu_ps(o.as_mut_ptr(), *v);
                for (j, x) in o.iter().enumerate() {
                    assert_eq!(*x, m[8 * j + i]);
                }
            }
        }
    }
}
