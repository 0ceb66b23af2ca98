//! The AVX-512 kernel for one to four activation rows (batch-1..4 decode),
//! summing in exactly the order of [`super::bcast`].
//!
//! With so few rows the broadcast kernel wastes its lanes and needs one load
//! per weight value. Here the lanes hold 16 weight rows instead: a 16×16 tile
//! of weights (16 rows × 16 consecutive k) is loaded as 16 vectors and
//! transposed in registers (64 shuffles), so column i of the tile is the i-th
//! value of 16 rows, and each activation value is broadcast against it. Every
//! output is still one FMA chain `acc = w·x + acc` over k in order, starting
//! from zero — the same operations as the broadcast kernel — so a sequence's
//! logits do not depend on whether it was decoded alone or in a batch.

// Register tiles read best as explicit index loops.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use rayon::prelude::*;

use super::{ElemKind, OutPtr, WeightElem};

/// Weight rows per pass: one tile of 16 (its 16 registers, the T ≤ 4
/// accumulators and the broadcast stay in the 32 zmm registers; two tiles
/// per pass spilled to the stack and ran at 3-4 GB/s).
const PASS_ROWS: usize = 16;

/// `out[t, r] = x[t, :] · w[r, :]` for `t <= 8`.
///
/// # Safety
/// AVX-512F must be available; `x` has `t` rows and `w` has `n` rows of `k`
/// floats; `out` holds `t * n` floats that nothing else touches meanwhile.
#[target_feature(enable = "avx512f")]
pub unsafe fn matmul<W: WeightElem>(x: &[f32], t: usize, w: &[W], n: usize, k: usize, out: OutPtr) {
    let per_task = super::small_rows_per_task(n, PASS_ROWS);
    (0..n.div_ceil(per_task))
        .into_par_iter()
        .for_each(move |task| {
            let rows = (task * per_task, ((task + 1) * per_task).min(n));
            // SAFETY: as the caller's; this task owns columns `rows` of out.
            unsafe {
                match t {
                    1 => passes::<W, 1>(x, w, n, k, rows, out),
                    2 => passes::<W, 2>(x, w, n, k, rows, out),
                    3 => passes::<W, 3>(x, w, n, k, rows, out),
                    4 => passes::<W, 4>(x, w, n, k, rows, out),
                    5 => passes::<W, 5>(x, w, n, k, rows, out),
                    6 => passes::<W, 6>(x, w, n, k, rows, out),
                    7 => passes::<W, 7>(x, w, n, k, rows, out),
                    _ => passes::<W, 8>(x, w, n, k, rows, out),
                }
            }
        });
}

#[target_feature(enable = "avx512f")]
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
        let mut acc = [_mm512_setzero_ps(); T];
        // Columns up to row 0's first 16-column boundary in memory go first,
        // so the full tiles' loads are aligned (each row's too when a row's
        // bytes are a multiple of 64, as in every model). Unaligned, a
        // 16-row tile at a 4 KiB row stride (k = 1024) touches 32 lines of
        // one L1 set, 8-way, and half of them are evicted before the next
        // tile reads them: the f32 k = 1024 products ran at 40-60% of the
        // row-at-a-time portable kernel.
        let size = std::mem::size_of::<W>();
        let lead = (16 - (wp[0] as usize / size) % 16) % 16;
        let mut k0 = lead.min(k);
        if k0 > 0 {
            super::prefetch_next_pass(wp[0], PASS_ROWS, k, 0, k0);
            partial::<W, T>(&wp, x.as_ptr(), k, 0, k0, &mut acc);
        }
        while k0 + 16 <= k {
            super::prefetch_next_pass(wp[0], PASS_ROWS, k, k0, 16);
            let mut tile: [__m512; 16] = std::array::from_fn(|j| load16(wp[j].add(k0), 16, !0));
            transpose16(&mut tile);
            fma_columns::<T, 16>(&tile, x.as_ptr().add(k0), k, &mut acc);
            k0 += 16;
        }
        if k0 < k {
            super::prefetch_next_pass(wp[0], PASS_ROWS, k, k0, k - k0);
            partial::<W, T>(&wp, x.as_ptr(), k, k0, k - k0, &mut acc);
        }
        let m = ((1u32 << rr) - 1) as __mmask16;
        for tt in 0..T {
            _mm512_mask_storeu_ps(out.0.add(tt * n + r), m, acc[tt]);
        }
        r += PASS_ROWS;
    }
}

/// Columns `k0..k0 + kc` (kc < 16) of the pass's rows into `acc`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn partial<W: WeightElem, const T: usize>(
    wp: &[*const W; PASS_ROWS],
    x: *const f32,
    k: usize,
    k0: usize,
    kc: usize,
    acc: &mut [__m512; T],
) {
    let mask = ((1u32 << kc) - 1) as __mmask16;
    let mut tile: [__m512; 16] = std::array::from_fn(|j| load16(wp[j].add(k0), kc, mask));
    transpose16(&mut tile);
    // Stop at kc, as every kernel does (an FMA with a zero weight could
    // still turn -0 into +0, or inf · 0 into NaN).
    for i in 0..kc {
        for tt in 0..T {
            let xv = _mm512_set1_ps(*x.add(tt * k + k0 + i));
            acc[tt] = _mm512_fmadd_ps(tile[i], xv, acc[tt]);
        }
    }
}

/// `acc[t] = fma(column i, x[t, i], acc[t])` for the `KC` columns of a
/// transposed tile in order: the FMA chain, with a constant trip count so
/// the tile stays in registers.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn fma_columns<const T: usize, const KC: usize>(
    tile: &[__m512; 16],
    x: *const f32,
    k: usize,
    acc: &mut [__m512; T],
) {
    for i in 0..KC {
        for tt in 0..T {
            let xv = _mm512_set1_ps(*x.add(tt * k + i));
            acc[tt] = _mm512_fmadd_ps(tile[i], xv, acc[tt]);
        }
    }
}

/// `kc <= 16` weights from `p` widened to f32, zero lanes past `kc`. bf16
/// lanes are zero-extended to 32 bits and shifted up, f16 lanes converted by
/// `vcvtph2ps` (AVX-512F): both exact.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load16<W: WeightElem>(p: *const W, kc: usize, mask: __mmask16) -> __m512 {
    if W::KIND == ElemKind::F32 {
        return _mm512_maskz_loadu_ps(mask, p.cast::<f32>());
    }
    let bits = if kc == 16 {
        _mm256_loadu_si256(p.cast::<__m256i>())
    } else {
        let mut tail = [0u16; 16];
        std::ptr::copy_nonoverlapping(p.cast::<u16>(), tail.as_mut_ptr(), kc);
        _mm256_loadu_si256(tail.as_ptr().cast::<__m256i>())
    };
    if W::KIND == ElemKind::F16 {
        return _mm512_cvtph_ps(bits);
    }
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(bits)))
}

/// In-register transpose: row j lane i → row i lane j.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn transpose16(r: &mut [__m512; 16]) {
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for g in 0..4 {
        let b = 4 * g;
        let (t0, t1, t2, t3) = (
            _mm512_castps_pd(t[b]),
            _mm512_castps_pd(t[b + 1]),
            _mm512_castps_pd(t[b + 2]),
            _mm512_castps_pd(t[b + 3]),
        );
        r[b] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
        r[b + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
        r[b + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
        r[b + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
    }
    for h in 0..2 {
        let b = 8 * h;
        for i in 0..4 {
            t[b + i] = _mm512_shuffle_f32x4::<0x88>(r[b + i], r[b + 4 + i]);
            t[b + 4 + i] = _mm512_shuffle_f32x4::<0xdd>(r[b + i], r[b + 4 + i]);
        }
    }
    for i in 0..8 {
        r[i] = _mm512_shuffle_f32x4::<0x88>(t[i], t[8 + i]);
        r[8 + i] = _mm512_shuffle_f32x4::<0xdd>(t[i], t[8 + i]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose16_moves_row_j_lane_i_to_row_i_lane_j() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        let m: Vec<f32> = (0..256).map(|i| i as f32).collect();
        // SAFETY: AVX-512F was detected above; m holds 256 floats.
        unsafe {
            let mut r: [__m512; 16] =
                std::array::from_fn(|j| _mm512_loadu_ps(m.as_ptr().add(16 * j)));
            transpose16(&mut r);
            for (i, v) in r.iter().enumerate() {
                let mut o = [0f32; 16];
                _mm512_storeu_ps(o.as_mut_ptr(), *v);
                for (j, x) in o.iter().enumerate() {
                    assert_eq!(*x, m[16 * j + i]);
                }
            }
        }
    }
}
