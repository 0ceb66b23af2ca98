//! The aarch64 NEON forms of [`super::small`] and [`super::bcast`], with 4
//! lanes per `float32x4_t` and 32 vector registers:
//!
//! - `small` (T ≤ 4): lanes hold 4 weight rows; 4×4 weight tiles (4 rows ×
//!   4 consecutive k) are transposed in registers (8 `trn`s), each
//!   activation value broadcast against a column; 16 weight rows per pass.
//! - `bcast` (T ≥ 5): the activations transposed into the same 64-row
//!   blocks (padded to 4 lanes), each weight value broadcast against up to 4
//!   vectors (16 activation rows) for MR weight rows: ≤ 24 accumulators.
//!
//! Every output is the FMA chain `acc = w·x + acc` over k in order from zero
//! (`vfmaq_f32` is fused like `vfmadd`), as in the AVX-512 and AVX2 kernels,
//! so the results equal theirs bit for bit and are batch-invariant.
//!
//! 16-bit weights are widened exactly: bf16 by a 16-bit shift, f16 by integer
//! bit arithmetic ([`f16x4`]): the NEON f16 conversion (`vcvt_f32_f16`)
//! takes `float16x4_t`, which is not stable in Rust 1.95.

// Register tiles read best as explicit index loops.
#![allow(clippy::needless_range_loop)]

use std::arch::aarch64::*;

use rayon::prelude::*;

use super::{transpose_blocks, ElemKind, OutPtr, WeightElem, BLOCK_ROWS};

/// Weight rows per rayon task of the small kernel: four passes of 16.
const SMALL_ROWS_PER_TASK: usize = 64;
/// Weight rows per pass: four tiles of 4.
const PASS_ROWS: usize = 16;
/// Weight rows per rayon task of the broadcast kernel (a multiple of every MR).
const BCAST_ROWS_PER_TASK: usize = 48;
/// Vectors of 4 activation rows per register tile, at most.
const MAX_NV: usize = 4;

/// `out[t, r] = x[t, :] · w[r, :]` for `t <= 4`.
///
/// # Safety
/// `x` has `t` rows and `w` has `n` rows of `k` floats; `out` holds `t * n`
/// floats that nothing else touches meanwhile.
pub unsafe fn small<W: WeightElem>(x: &[f32], t: usize, w: &[W], n: usize, k: usize, out: OutPtr) {
    (0..n.div_ceil(SMALL_ROWS_PER_TASK))
        .into_par_iter()
        .for_each(move |task| {
            let rows = (
                task * SMALL_ROWS_PER_TASK,
                ((task + 1) * SMALL_ROWS_PER_TASK).min(n),
            );
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

unsafe fn passes<W: WeightElem, const T: usize>(
    x: &[f32],
    w: &[W],
    n: usize,
    k: usize,
    (r0, r1): (usize, usize),
    out: OutPtr,
) {
    const G: usize = PASS_ROWS / 4;
    let mut r = r0;
    while r < r1 {
        let rr = (r1 - r).min(PASS_ROWS);
        // Rows past the end repeat the last valid one (results not stored).
        let wp: [*const W; PASS_ROWS] =
            std::array::from_fn(|j| w.as_ptr().add((r + j.min(rr - 1)) * k));
        let mut acc = [[vdupq_n_f32(0.0); G]; T];
        let mut k0 = 0;
        while k0 < k {
            let kc = (k - k0).min(4);
            let mut tile = [[vdupq_n_f32(0.0); 4]; G];
            for g in 0..G {
                for j in 0..4 {
                    tile[g][j] = load4(wp[4 * g + j].add(k0), kc);
                }
                transpose4(&mut tile[g]);
            }
            for i in 0..kc {
                for tt in 0..T {
                    let xv = vdupq_n_f32(*x.as_ptr().add(tt * k + k0 + i));
                    for g in 0..G {
                        acc[tt][g] = vfmaq_f32(acc[tt][g], tile[g][i], xv);
                    }
                }
            }
            k0 += kc;
        }
        for tt in 0..T {
            for g in 0..G {
                let valid = rr.saturating_sub(4 * g).min(4);
                let dst = out.0.add(tt * n + r + 4 * g);
                if valid == 4 {
                    vst1q_f32(dst, acc[tt][g]);
                } else if valid > 0 {
                    let mut lanes = [0f32; 4];
                    vst1q_f32(lanes.as_mut_ptr(), acc[tt][g]);
                    std::ptr::copy_nonoverlapping(lanes.as_ptr(), dst, valid);
                }
            }
        }
        r += PASS_ROWS;
    }
}

/// `kc <= 4` weights from `p` widened to f32, zero lanes past `kc`.
#[inline(always)]
unsafe fn load4<W: WeightElem>(p: *const W, kc: usize) -> float32x4_t {
    if kc < 4 {
        let mut tail = [0u32; 4];
        let src = std::slice::from_raw_parts(p, kc);
        for (d, s) in tail.iter_mut().zip(src) {
            *d = s.to_f32().to_bits();
        }
        return vld1q_f32(tail.as_ptr().cast::<f32>());
    }
    match W::KIND {
        ElemKind::F32 => vld1q_f32(p.cast::<f32>()),
        ElemKind::Bf16 => {
            let bits = vmovl_u16(vld1_u16(p.cast::<u16>()));
            vreinterpretq_f32_u32(vshlq_n_u32::<16>(bits))
        }
        ElemKind::F16 => f16x4(vmovl_u16(vld1_u16(p.cast::<u16>()))),
    }
}

/// Four f16 bit patterns (in the low halves of u32 lanes) as f32, exactly:
/// the magnitude's bits move up 13 places and the exponent is rebiased
/// (+112); Inf/NaN get the all-ones f32 exponent (+112 more); zeros and
/// subnormals are made as `2^-14·(1 + m/1024) - 2^-14`, exact in f32.
#[inline(always)]
unsafe fn f16x4(h: uint32x4_t) -> float32x4_t {
    const EXP: u32 = 0x7c00 << 13;
    const REBIAS: u32 = (127 - 15) << 23;
    let o = vshlq_n_u32::<13>(vandq_u32(h, vdupq_n_u32(0x7fff)));
    let e = vandq_u32(o, vdupq_n_u32(EXP));
    let o = vaddq_u32(o, vdupq_n_u32(REBIAS));
    let inf = vceqq_u32(e, vdupq_n_u32(EXP));
    let o = vaddq_u32(o, vandq_u32(inf, vdupq_n_u32(REBIAS)));
    let sub = vsubq_f32(
        vreinterpretq_f32_u32(vaddq_u32(o, vdupq_n_u32(1 << 23))),
        vdupq_n_f32(f32::from_bits(113 << 23)),
    );
    let zero_or_sub = vceqq_u32(e, vdupq_n_u32(0));
    let mag = vbslq_f32(zero_or_sub, sub, vreinterpretq_f32_u32(o));
    let sign = vshlq_n_u32::<16>(vandq_u32(h, vdupq_n_u32(0x8000)));
    vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(mag), sign))
}

/// In-register transpose: row j lane i → row i lane j.
#[inline(always)]
unsafe fn transpose4(r: &mut [float32x4_t; 4]) {
    let t0 = vtrn1q_f32(r[0], r[1]); // r0[0] r1[0] r0[2] r1[2]
    let t1 = vtrn2q_f32(r[0], r[1]); // r0[1] r1[1] r0[3] r1[3]
    let t2 = vtrn1q_f32(r[2], r[3]);
    let t3 = vtrn2q_f32(r[2], r[3]);
    let pair = |a: float32x4_t, b: float32x4_t, hi: bool| {
        let (a, b) = (vreinterpretq_f64_f32(a), vreinterpretq_f64_f32(b));
        vreinterpretq_f32_f64(if hi {
            vtrn2q_f64(a, b)
        } else {
            vtrn1q_f64(a, b)
        })
    };
    r[0] = pair(t0, t2, false);
    r[1] = pair(t1, t3, false);
    r[2] = pair(t0, t2, true);
    r[3] = pair(t1, t3, true);
}

/// `out[t, r] = x[t, :] · w[r, :]` for `t >= 5` (any t works).
///
/// # Safety
/// As [`small`].
pub unsafe fn bcast<W: WeightElem>(x: &[f32], t: usize, w: &[W], n: usize, k: usize, out: OutPtr) {
    let xt = transpose_blocks(&x[..t * k], t, k, 4);
    let xt = &xt;
    (0..n.div_ceil(BCAST_ROWS_PER_TASK))
        .into_par_iter()
        .for_each(move |task| {
            let rows = (
                task * BCAST_ROWS_PER_TASK,
                ((task + 1) * BCAST_ROWS_PER_TASK).min(n),
            );
            let mut t0 = 0;
            while t0 < t {
                let tb = (t - t0).min(BLOCK_ROWS);
                // SAFETY: as the caller's; this task owns columns `rows` of out.
                unsafe {
                    match tb.div_ceil(4) {
                        1 | 2 => tiles::<W, 12>(&xt[t0 * k..], t0, tb, w, n, k, rows, out),
                        _ => tiles::<W, 6>(&xt[t0 * k..], t0, tb, w, n, k, rows, out),
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
    let nvec = tb.div_ceil(4);
    let tp = nvec * 4;
    let mut r = r0;
    while r < r1 {
        let rr = (r1 - r).min(MR);
        let wp: [*const W; MR] = std::array::from_fn(|i| w.as_ptr().add((r + i.min(rr - 1)) * k));
        let mut v0 = 0;
        while v0 < nvec {
            let nv = (nvec - v0).min(MAX_NV);
            let x0 = xt.as_ptr().add(4 * v0);
            let mut acc = [[vdupq_n_f32(0.0); MAX_NV]; MR];
            match nv {
                1 => tile::<W, MR, 1>(x0, tp, wp, k, &mut acc),
                2 => tile::<W, MR, 2>(x0, tp, wp, k, &mut acc),
                3 => tile::<W, MR, 3>(x0, tp, wp, k, &mut acc),
                _ => tile::<W, MR, 4>(x0, tp, wp, k, &mut acc),
            }
            let mut lanes = [0f32; 4];
            for ri in 0..rr {
                for v in 0..nv {
                    vst1q_f32(lanes.as_mut_ptr(), acc[ri][v]);
                    for (l, val) in lanes.iter().enumerate() {
                        let ti = (v0 + v) * 4 + l;
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

/// MR weight rows × NV·4 activation rows over the whole reduction, into the
/// first NV columns of `acc` (zero on entry).
#[inline(always)]
unsafe fn tile<W: WeightElem, const MR: usize, const NV: usize>(
    xt: *const f32,
    tp: usize,
    w: [*const W; MR],
    k: usize,
    acc: &mut [[float32x4_t; MAX_NV]; MR],
) {
    let mut a = [[vdupq_n_f32(0.0); NV]; MR];
    for i in 0..k {
        let mut xv = [vdupq_n_f32(0.0); NV];
        for v in 0..NV {
            xv[v] = vld1q_f32(xt.add(i * tp + 4 * v));
        }
        for r in 0..MR {
            // Widening is exact, so the chain is the f32 one.
            let b = vdupq_n_f32((*w[r].add(i)).to_f32());
            for v in 0..NV {
                a[r][v] = vfmaq_f32(a[r][v], b, xv[v]);
            }
        }
    }
    for r in 0..MR {
        acc[r][..NV].copy_from_slice(&a[r]);
    }
}
