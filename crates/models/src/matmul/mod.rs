//! `out = x · Wᵀ` for activations `x` `[T, k]` and a weight `W` `[n, k]` stored
//! row-major as Hugging Face stores it, threaded over blocks of weight rows.
//!
//! Why not candle's gemm: in decode, T is the number of running sequences.
//! candle's gemm (the `gemm` crate as candle builds it) runs AVX2 micro-kernels
//! only, packs both operands, and runs a one-row product on one core. With
//! AVX-512 two kernels serve every T, summing in one order:
//!
//! - [`bcast`] (T ≥ 5): the activations are transposed once per call
//!   (`[k, T]`, cheap: T·k floats), then each weight value is broadcast and
//!   multiplied into 16 activation rows per FMA; no horizontal reductions,
//!   and the transposed activations stay in L1/L2 while the weights stream
//!   once per 64 rows. 1.7–2.3× candle's gemm's GFLOP/s from T = 16 on.
//! - [`small`] (T ≤ 4): 16×16 weight tiles transposed in registers, each
//!   activation value broadcast against 16 weight rows; about 1.9× gemm at
//!   T = 1 (the `matmul_probe` example).
//!
//! **Batch invariance:** every output is one FMA chain over k in order,
//! whatever T is and whichever rows share its tile, so a sequence's logits do
//! not depend on what else is in the batch (or on whether its prefix came
//! from the cache). Seeded sampling relies on it: an earlier 4×4 dot-product
//! kernel for small T summed in another order, and the repeat of a seeded
//! request diverged (`crates/server/tests/choices.rs`).
//!
//! Without AVX-512 it falls back to `simd::dot_rows` (AVX2 or portable).
//!
//! **Stored dtype:** `W` may be f32, bf16 or f16 ([`WeightElem`]). 16-bit
//! weights are widened as they are loaded, exactly (bf16: a 16-bit shift;
//! f16: `vcvtph2ps` in the AVX-512 kernels, `half`'s `to_f32` in the portable
//! path, both exact for every f16 value), and the FMA chains are the same,
//! so a bf16 or f16 product equals the f32 product of the same rounded
//! weights bit for bit, and stays batch-invariant, while the weights take
//! half the memory and half the bandwidth.

use rayon::prelude::*;

use crate::simd;

#[cfg(target_arch = "x86_64")]
mod bcast;
#[cfg(target_arch = "x86_64")]
mod small;

/// Weight rows per rayon task for the portable kernel: 32 rows of
/// k = 1024..3072 floats (128-384 KiB) stay in L2 while every activation row
/// passes over them.
const ROWS_PER_TASK: usize = 32;
/// Activation rows per pass over a task's weight rows (bounds the x working set).
const X_ROWS_PER_PASS: usize = 64;

/// The stored dtype of a weight element (the kernels pick their load by it;
/// the branch is resolved at compile time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElemKind {
    F32,
    Bf16,
    F16,
}

/// A weight element the kernels read: f32, or bf16 / f16 widened on the fly.
pub trait WeightElem: Copy + Send + Sync + 'static {
    const KIND: ElemKind;
    /// The exact f32 value.
    fn to_f32(self) -> f32;
}

impl WeightElem for f32 {
    const KIND: ElemKind = ElemKind::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl WeightElem for half::bf16 {
    const KIND: ElemKind = ElemKind::Bf16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
}

impl WeightElem for half::f16 {
    const KIND: ElemKind = ElemKind::F16;
    /// Exact: every f16 (subnormals included) is an f32.
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
}

#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint column ranges of `out` (see `matmul_xwt`).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// `out[t, r] = x[t, :] · w[r, :]` for `t < T`, `r < n`.
///
/// Panics if the slices are shorter than the shapes say (callers pass tensors
/// whose shapes were checked).
pub fn matmul_xwt<W: WeightElem>(
    x: &[f32],
    t: usize,
    w: &[W],
    n: usize,
    k: usize,
    out: &mut [f32],
) {
    assert!(x.len() >= t * k && w.len() >= n * k && out.len() >= t * n);
    let out_ptr = OutPtr(out.as_mut_ptr());
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: AVX-512F is present; shapes were checked above.
        unsafe {
            if t <= 4 {
                small::matmul(x, t, w, n, k, out_ptr)
            } else {
                bcast::matmul(x, t, w, n, k, out_ptr)
            }
        };
        return;
    }
    row_tasks(t, n, |rows, ts| {
        portable_block(x, w, k, n, rows, ts, out_ptr)
    });
}

/// Whether the AVX-512 kernels can run here.
pub fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Runs `block(rows, activation_rows)` over [`ROWS_PER_TASK`]-row tasks in
/// parallel, each in passes of at most [`X_ROWS_PER_PASS`] activation rows.
fn row_tasks(t: usize, n: usize, block: impl Fn((usize, usize), (usize, usize)) + Sync + Send) {
    (0..n.div_ceil(ROWS_PER_TASK))
        .into_par_iter()
        .for_each(|task| {
            let r0 = task * ROWS_PER_TASK;
            let r1 = (r0 + ROWS_PER_TASK).min(n);
            let mut t0 = 0;
            while t0 < t {
                let t1 = (t0 + X_ROWS_PER_PASS).min(t);
                block((r0, r1), (t0, t1));
                t0 = t1;
            }
        });
}

fn portable_block<W: WeightElem>(
    x: &[f32],
    w: &[W],
    k: usize,
    n: usize,
    (r0, r1): (usize, usize),
    (t0, t1): (usize, usize),
    out: OutPtr,
) {
    let xs = &x[t0 * k..t1 * k];
    let mut col = vec![0f32; t1 - t0];
    let narrow = W::KIND != ElemKind::F32;
    let mut wide = if narrow { vec![0f32; k] } else { Vec::new() };
    for r in r0..r1 {
        let row = &w[r * k..(r + 1) * k];
        let row: &[f32] = if narrow {
            wide.iter_mut().zip(row).for_each(|(d, s)| *d = s.to_f32());
            &wide
        } else {
            // SAFETY: W is f32 when KIND is F32 (the only such impl).
            unsafe { std::slice::from_raw_parts(row.as_ptr().cast::<f32>(), k) }
        };
        simd::dot_rows(xs, row, &mut col);
        for (i, v) in col.iter().enumerate() {
            // SAFETY: (t0 + i, r) is inside `out` and column r belongs to this task.
            unsafe { *out.0.add((t0 + i) * n + r) = *v };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each output row is bit-identical whatever other rows share the call:
    /// alone (the small-T kernel), with three others (small-T) or with six
    /// others (the broadcast kernel).
    #[test]
    fn rows_are_batch_invariant() {
        if !has_avx512() {
            // The portable fallback sums rows in groups of 4 (not invariant).
            eprintln!("SKIPPED: no AVX-512 on this CPU");
            return;
        }
        let (n, k) = (70, 45);
        let x: Vec<f32> = (0..7 * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let run = |t: usize| {
            let mut out = vec![f32::NAN; t * n];
            matmul_xwt(&x[..t * k], t, &w, n, k, &mut out);
            out
        };
        let (all, four) = (run(7), run(4));
        for row in 0..7 {
            let mut alone = vec![f32::NAN; n];
            matmul_xwt(&x[row * k..(row + 1) * k], 1, &w, n, k, &mut alone);
            assert!(
                alone == all[row * n..(row + 1) * n],
                "row {row}: alone vs 7"
            );
            if row < 4 {
                assert!(
                    alone == four[row * n..(row + 1) * n],
                    "row {row}: alone vs 4"
                );
            }
        }
    }

    /// `v` rounded to a 16-bit type, and those rounded values back in f32.
    fn rounded<W: WeightElem>(v: &[f32], round: impl Fn(f32) -> W) -> (Vec<W>, Vec<f32>) {
        let narrow: Vec<W> = v.iter().map(|x| round(*x)).collect();
        let wide = narrow.iter().map(|x| x.to_f32()).collect();
        (narrow, wide)
    }

    /// 16-bit weights give bit for bit the f32 product of the same rounded
    /// weights, for every kernel (T = 1..4 small, 5+ broadcast; k = 45 has a
    /// ragged 13-wide tail) and the portable path, and their rows are
    /// batch-invariant.
    fn narrow_weights_equal_f32_of_rounded<W: WeightElem>(round: impl Fn(f32) -> W) {
        let (n, k) = (70, 45);
        let x: Vec<f32> = (0..9 * k).map(|i| (i as f32 * 0.37).sin()).collect();
        // Values spanning f16's subnormals (2^-24..2^-14) up to ~8.
        let w: Vec<f32> = (0..n * k)
            .map(|i| (i as f32 * 0.11).cos() * 2f32.powi((i % 28) as i32 - 25))
            .collect();
        let (wn, wf) = rounded(&w, round);
        let name = format!("{:?}", W::KIND);
        for t in [1, 2, 4, 5, 9] {
            let mut a = vec![f32::NAN; t * n];
            let mut b = vec![f32::NAN; t * n];
            matmul_xwt(&x[..t * k], t, &wn, n, k, &mut a);
            matmul_xwt(&x[..t * k], t, &wf, n, k, &mut b);
            assert!(a == b, "{name} t={t}: narrow vs f32 of rounded weights");
            let mut p = vec![f32::NAN; t * n];
            let mut q = vec![f32::NAN; t * n];
            portable_block(&x, &wn, k, n, (0, n), (0, t), OutPtr(p.as_mut_ptr()));
            portable_block(&x, &wf, k, n, (0, n), (0, t), OutPtr(q.as_mut_ptr()));
            assert!(p == q, "{name} t={t}: portable narrow vs f32");
        }
        if has_avx512() {
            let mut all = vec![f32::NAN; 9 * n];
            matmul_xwt(&x, 9, &wn, n, k, &mut all);
            for row in 0..9 {
                let mut alone = vec![f32::NAN; n];
                matmul_xwt(&x[row * k..(row + 1) * k], 1, &wn, n, k, &mut alone);
                assert!(alone == all[row * n..(row + 1) * n], "{name} row {row}");
            }
        }
    }

    #[test]
    fn bf16_weights_equal_f32_of_rounded_weights() {
        narrow_weights_equal_f32_of_rounded(half::bf16::from_f32);
    }

    #[test]
    fn f16_weights_equal_f32_of_rounded_weights() {
        narrow_weights_equal_f32_of_rounded(half::f16::from_f32);
    }

    /// The kernels' f16 widening (vcvtph2ps with AVX-512) equals `half`'s on
    /// every f16 value but NaNs: products with unit activations return each
    /// weight as the kernel widened it (1 row: small kernel, 5: broadcast).
    /// Compared as floats: `fma(-0, 1, +0)` is +0.
    #[test]
    fn f16_widening_is_exact_for_every_value() {
        let w: Vec<half::f16> = (0..=u16::MAX)
            .map(half::f16::from_bits)
            .filter(|v| !v.is_nan())
            .collect();
        let n = w.len();
        for t in [1, 5] {
            let mut out = vec![f32::NAN; t * n];
            matmul_xwt(&vec![1.0; t], t, &w, n, 1, &mut out);
            for row in out.chunks(n) {
                for (v, o) in w.iter().zip(row) {
                    assert!(*o == v.to_f32(), "t={t} f16 {:#06x}: {o}", v.to_bits());
                }
            }
        }
    }

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
            (5, 13, 40),
            (16, 49, 64),
            (33, 50, 100),
            (64, 97, 31),
            (130, 61, 48),
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
