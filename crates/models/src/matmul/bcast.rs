//! The AVX-512 kernel for five or more activation rows: weights broadcast
//! against transposed activations.
//!
//! `x` is transposed once per call into blocks of up to 64 rows, each stored
//! `[k, tp]` (tp = the block's rows rounded up to 16, padding lanes zero). A
//! register tile then holds MR weight rows × NV vectors of 16 activation rows:
//! for each of the k reduction steps it loads NV activation vectors, broadcasts
//! one value of each of the MR weight rows, and issues MR·NV FMAs. With
//! MR·NV = 24 (or 12 for a single vector) accumulators that is 24 FMAs per
//! 4–10 loads, and the sums come out already laid out by activation row: no
//! horizontal reductions, unlike dot-product tiles.
//!
//! Cache use: a task owns [`ROWS_PER_TASK`] weight rows. For each activation
//! block it walks its weight rows MR at a time; the block's transposed
//! activations (≤ 256 KiB at k = 1024) stay in L2 and the weight rows stream
//! from memory on the first block and from L2 after that.

// Register tiles read best as explicit index loops.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use rayon::prelude::*;

use super::{transpose_blocks, ElemKind, OutPtr, WeightElem, BLOCK_ROWS};

/// Weight rows per rayon task (a multiple of every MR below, so only the
/// last task of a product has a ragged tile).
const ROWS_PER_TASK: usize = 48;

/// `out[t, r] = x[t, :] · w[r, :]`.
///
/// # Safety
/// AVX-512F must be available; `x` has `t` rows and `w` has `n` rows of `k`
/// floats; `out` holds `t * n` floats that nothing else touches meanwhile.
#[target_feature(enable = "avx512f")]
pub unsafe fn matmul<W: WeightElem>(x: &[f32], t: usize, w: &[W], n: usize, k: usize, out: OutPtr) {
    let xt = transpose_blocks(&x[..t * k], t, k, 16);
    let xt = &xt;
    (0..n.div_ceil(ROWS_PER_TASK))
        .into_par_iter()
        .for_each(move |task| {
            let rows = (task * ROWS_PER_TASK, ((task + 1) * ROWS_PER_TASK).min(n));
            let mut t0 = 0;
            while t0 < t {
                let tb = (t - t0).min(BLOCK_ROWS);
                let xb = &xt[t0 * k..];
                let blk = Block {
                    xt: xb,
                    t0,
                    rows: tb,
                };
                // SAFETY: as the caller's; this task owns columns `rows` of out.
                unsafe {
                    match tb.div_ceil(16) {
                        1 => tiles::<W, 12, 1>(&blk, w, n, k, rows, out),
                        2 => tiles::<W, 12, 2>(&blk, w, n, k, rows, out),
                        3 => tiles::<W, 8, 3>(&blk, w, n, k, rows, out),
                        _ => tiles::<W, 6, 4>(&blk, w, n, k, rows, out),
                    }
                }
                t0 += tb;
            }
        });
}

/// One transposed activation block: rows `t0..t0 + rows` of x, `[k, tp]`.
struct Block<'a> {
    xt: &'a [f32],
    t0: usize,
    rows: usize,
}

/// A task's weight rows against one activation block, MR rows at a time.
/// A ragged last tile repeats its last valid weight row (results dropped).
#[target_feature(enable = "avx512f")]
unsafe fn tiles<W: WeightElem, const MR: usize, const NV: usize>(
    blk: &Block<'_>,
    w: &[W],
    n: usize,
    k: usize,
    (r0, r1): (usize, usize),
    out: OutPtr,
) {
    let tp = NV * 16;
    let mut r = r0;
    while r < r1 {
        let rr = (r1 - r).min(MR);
        let wp: [*const W; MR] = std::array::from_fn(|i| w.as_ptr().add((r + i.min(rr - 1)) * k));
        let acc = tile::<W, MR, NV>(blk.xt.as_ptr(), tp, wp, k);
        let mut lanes = [0f32; 16];
        for ri in 0..rr {
            for v in 0..NV {
                _mm512_storeu_ps(lanes.as_mut_ptr(), acc[ri][v]);
                for (l, val) in lanes.iter().enumerate() {
                    let ti = v * 16 + l;
                    if ti < blk.rows {
                        *out.0.add((blk.t0 + ti) * n + r + ri) = *val;
                    }
                }
            }
        }
        r += MR;
    }
}

/// MR weight rows × NV·16 activation rows over the whole reduction.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn tile<W: WeightElem, const MR: usize, const NV: usize>(
    xt: *const f32,
    tp: usize,
    w: [*const W; MR],
    k: usize,
) -> [[__m512; NV]; MR] {
    let mut acc = [[_mm512_setzero_ps(); NV]; MR];
    for i in 0..k {
        let mut xv = [_mm512_setzero_ps(); NV];
        for v in 0..NV {
            xv[v] = _mm512_loadu_ps(xt.add(i * tp + 16 * v));
        }
        for r in 0..MR {
            // Widening is exact (bf16: a shift; f16: vcvtph2ps), so the FMA
            // chain is the f32 one whatever the stored dtype.
            let b = broadcast(w[r].add(i));
            for v in 0..NV {
                acc[r][v] = _mm512_fmadd_ps(b, xv[v], acc[r][v]);
            }
        }
    }
    acc
}

/// The weight at `p`, widened to f32, in every lane.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn broadcast<W: WeightElem>(p: *const W) -> __m512 {
    if W::KIND == ElemKind::F16 {
        let bits = *p.cast::<u16>();
        return _mm512_cvtph_ps(_mm256_set1_epi16(bits as i16));
    }
    _mm512_set1_ps((*p).to_f32())
}
