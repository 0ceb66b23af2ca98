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

/// Weight rows per rayon task: four passes of 16.
const ROWS_PER_TASK: usize = 64;
/// Weight rows per pass: two tiles of 8, two independent FMA chains per
/// activation row.
const PASS_ROWS: usize = 16;

/// `out[t, r] = x[t, :] · w[r, :]` for `t <= 4`.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `x` has `t` rows and `w` has `n`
/// rows of `k` floats; `out` holds `t * n` floats that nothing else touches
/// meanwhile.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn matmul<W: WeightElem>(x: &[f32], t: usize, w: &[W], n: usize, k: usize, out: OutPtr) {
    (0..n.div_ceil(ROWS_PER_TASK))
        .into_par_iter()
        .for_each(move |task| {
            let rows = (task * ROWS_PER_TASK, ((task + 1) * ROWS_PER_TASK).min(n));
            // SAFETY: as the caller's; this task owns columns `rows` of out.
            unsafe {
                match t {
                    1 => passes::<W, 1>(x, w, n, k, rows, out),
                    2 => passes::<W, 2>(x, w, n, k, rows, out),
                    3 => passes::<W, 3>(x, w, n, k, rows, out),
                    _ => passes::<W, 4>(x, w, n, k, rows, out),
                }
            }
        });
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn passes<W: WeightElem, const T: usize>(
    x: &[f32],
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
        let mut acc = [[_mm256_setzero_ps(); 2]; T];
        let mut k0 = 0;
        while k0 < k {
            let kc = (k - k0).min(8);
            let mut tile = [[_mm256_setzero_ps(); 8]; 2];
            for g in 0..2 {
                for j in 0..8 {
                    tile[g][j] = load8(wp[8 * g + j].add(k0), kc);
                }
                transpose8(&mut tile[g]);
            }
            for i in 0..kc {
                for tt in 0..T {
                    let xv = _mm256_set1_ps(*x.as_ptr().add(tt * k + k0 + i));
                    for g in 0..2 {
                        acc[tt][g] = _mm256_fmadd_ps(tile[g][i], xv, acc[tt][g]);
                    }
                }
            }
            k0 += kc;
        }
        for tt in 0..T {
            for g in 0..2 {
                let valid = rr.saturating_sub(8 * g).min(8);
                let dst = out.0.add(tt * n + r + 8 * g);
                if valid == 8 {
                    _mm256_storeu_ps(dst, acc[tt][g]);
                } else if valid > 0 {
                    let mut lanes = [0f32; 8];
                    _mm256_storeu_ps(lanes.as_mut_ptr(), acc[tt][g]);
                    std::ptr::copy_nonoverlapping(lanes.as_ptr(), dst, valid);
                }
            }
        }
        r += PASS_ROWS;
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
