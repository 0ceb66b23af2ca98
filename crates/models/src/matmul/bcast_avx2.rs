//! The AVX2+FMA form of [`super::bcast`] (five or more activation rows):
//! weights broadcast against transposed activations, 8 rows per vector.
//!
//! The activations are transposed into the same 64-row blocks (padded to a
//! multiple of 8 lanes). With 16 ymm registers a tile holds MR weight rows ×
//! NV ≤ 3 vectors (24 activation rows) of accumulators: 12 accumulators, NV
//! activation loads and one broadcast per k step. A 64-row block is walked in
//! groups of up to 3 vectors under each weight tile, so the tile's weight
//! rows (MR·k values) stay in L1 across the groups.
//!
//! Every output is the FMA chain `acc = w·x + acc` over k in order from zero,
//! as in the AVX-512 kernels: the results equal theirs bit for bit and are
//! batch-invariant.

// Register tiles read best as explicit index loops.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use rayon::prelude::*;

use super::{transpose_blocks, ElemKind, OutPtr, WeightElem, BLOCK_ROWS};

/// Weight rows per rayon task (a multiple of every MR below).
const ROWS_PER_TASK: usize = 48;
/// Vectors of 8 activation rows per register tile, at most.
const MAX_NV: usize = 3;

/// `out[t, r] = x[t, :] · w[r, :]`.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `x` has `t` rows and `w` has `n`
/// rows of `k` floats; `out` holds `t * n` floats that nothing else touches
/// meanwhile.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn matmul<W: WeightElem>(x: &[f32], t: usize, w: &[W], n: usize, k: usize, out: OutPtr) {
    let xt = transpose_blocks(&x[..t * k], t, k, 8);
    let xt = &xt;
    (0..n.div_ceil(ROWS_PER_TASK))
        .into_par_iter()
        .for_each(move |task| {
            let rows = (task * ROWS_PER_TASK, ((task + 1) * ROWS_PER_TASK).min(n));
            let mut t0 = 0;
            while t0 < t {
                let tb = (t - t0).min(BLOCK_ROWS);
                // SAFETY: as the caller's; this task owns columns `rows` of out.
                unsafe {
                    match tb.div_ceil(8) {
                        1 => tiles::<W, 12>(&xt[t0 * k..], t0, tb, w, n, k, rows, out),
                        2 => tiles::<W, 6>(&xt[t0 * k..], t0, tb, w, n, k, rows, out),
                        _ => tiles::<W, 4>(&xt[t0 * k..], t0, tb, w, n, k, rows, out),
                    }
                }
                t0 += tb;
            }
        });
}

/// A task's weight rows against one transposed block (rows `t0..t0 + tb` of
/// x, `[k, tp]`), MR rows at a time; under each weight tile the block's
/// vectors go in groups of up to [`MAX_NV`]. A ragged last tile repeats its
/// last valid weight row (results dropped).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tiles<W: WeightElem, const MR: usize>(
    xt: &[f32],
    t0: usize,
    tb: usize,
    w: &[W],
    n: usize,
    k: usize,
    (r0, r1): (usize, usize),
    out: OutPtr,
) {
    let nvec = tb.div_ceil(8);
    let tp = nvec * 8;
    let mut r = r0;
    while r < r1 {
        let rr = (r1 - r).min(MR);
        let wp: [*const W; MR] = std::array::from_fn(|i| w.as_ptr().add((r + i.min(rr - 1)) * k));
        let mut v0 = 0;
        while v0 < nvec {
            let nv = (nvec - v0).min(MAX_NV);
            let x0 = xt.as_ptr().add(8 * v0);
            let mut acc = [[_mm256_setzero_ps(); MAX_NV]; MR];
            match nv {
                1 => tile::<W, MR, 1>(x0, tp, wp, k, &mut acc),
                2 => tile::<W, MR, 2>(x0, tp, wp, k, &mut acc),
                _ => tile::<W, MR, 3>(x0, tp, wp, k, &mut acc),
            }
            let mut lanes = [0f32; 8];
            for ri in 0..rr {
                for v in 0..nv {
                    _mm256_storeu_ps(lanes.as_mut_ptr(), acc[ri][v]);
                    for (l, val) in lanes.iter().enumerate() {
                        let ti = (v0 + v) * 8 + l;
                        if ti < tb {
                            *out.0.add((t0 + ti) * n + r + ri) = *val;
                        }
                    }
                }
            }
            v0 += nv;
        }
        r += MR;
    }
}

/// MR weight rows × NV·8 activation rows over the whole reduction, into the
/// first NV columns of `acc` (zero on entry).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn tile<W: WeightElem, const MR: usize, const NV: usize>(
    xt: *const f32,
    tp: usize,
    w: [*const W; MR],
    k: usize,
    acc: &mut [[__m256; MAX_NV]; MR],
) {
    let mut a = [[_mm256_setzero_ps(); NV]; MR];
    for i in 0..k {
        let mut xv = [_mm256_setzero_ps(); NV];
        for v in 0..NV {
            xv[v] = _mm256_loadu_ps(xt.add(i * tp + 8 * v));
        }
        for r in 0..MR {
            // Widening is exact (bf16: a shift; f16: vcvtph2ps), so the FMA
            // chain is the f32 one whatever the stored dtype.
            let b = broadcast(w[r].add(i));
            for v in 0..NV {
                a[r][v] = _mm256_fmadd_ps(b, xv[v], a[r][v]);
            }
        }
    }
    for r in 0..MR {
        acc[r][..NV].copy_from_slice(&a[r]);
    }
}

/// The weight at `p`, widened to f32, in every lane.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn broadcast<W: WeightElem>(p: *const W) -> __m256 {
    if W::KIND == ElemKind::F16 {
        let bits = *p.cast::<u16>();
        return _mm256_cvtph_ps(_mm_set1_epi16(bits as i16));
    }
    _mm256_set1_ps((*p).to_f32())
}
