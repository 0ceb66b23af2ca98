//! `out = x · Wᵀ` for activations `x` `[T, k]` and a weight `W` `[n, k]` stored
//! row-major as Hugging Face stores it, threaded over blocks of weight rows.
//!
//! Why not candle's gemm: in decode, T is the number of running sequences.
//! candle's gemm (the `gemm` crate as candle builds it) runs AVX2 micro-kernels
//! only, packs both operands, and runs a one-row product on one core. With
//! AVX-512 two kernels serve every T, summing in one order:
//!
//! - [`bcast`] (T ≥ 9): the activations are transposed once per call
//!   (`[k, T]`, cheap: T·k floats), then each weight value is broadcast and
//!   multiplied into 16 activation rows per FMA; no horizontal reductions,
//!   and the transposed activations stay in L1/L2 while the weights stream
//!   once per 64 rows. 1.7–2.3× candle's gemm's GFLOP/s from T = 16 on.
//! - [`small`] (T ≤ 8): 16×16 weight tiles transposed in registers, each
//!   activation value broadcast against 16 weight rows, the next tile's
//!   rows prefetched into L2 (16 interleaved row streams are more than the
//!   hardware prefetchers follow: without it the 151,936 × 256 output
//!   projection streamed at 3 GB/s, a third of the portable row-at-a-time
//!   loop; `benches/matmul_decode.rs`).
//!
//! **Batch invariance:** every output is one FMA chain over k in order,
//! whatever T is and whichever rows share its tile, so a sequence's logits do
//! not depend on what else is in the batch (or on whether its prefix came
//! from the cache). Seeded sampling relies on it: an earlier 4×4 dot-product
//! kernel for small T summed in another order, and the repeat of a seeded
//! request diverged (`crates/server/tests/choices.rs`).
//!
//! The AVX2+FMA path (`bcast_avx2`, `small_avx2`) has the same two kernels
//! with 8-lane vectors and the same FMA chains, so its results equal the
//! AVX-512 ones bit for bit. So has the aarch64 NEON path (`neon`: 4-lane
//! forms, same chains). The portable path sums each output alone
//! with `simd::dot_rows` (batch-invariant too, in another order). The path is
//! [`cpu_kernels::path`].
//!
//! **Stored dtype:** `W` may be f32, bf16 or f16 ([`WeightElem`]). 16-bit
//! weights are widened as they are loaded, exactly (bf16: a 16-bit shift;
//! f16: `vcvtph2ps` in the AVX-512 kernels, integer bit arithmetic in the
//! NEON ones, `half`'s `to_f32` in the portable
//! path, both exact for every f16 value), and the FMA chains are the same,
//! so a bf16 or f16 product equals the f32 product of the same rounded
//! weights bit for bit, and stays batch-invariant, while the weights take
//! half the memory and half the bandwidth.

use rayon::prelude::*;

use crate::cpu_kernels::{self, KernelPath};
use crate::simd;

#[cfg(target_arch = "x86_64")]
mod bcast;
#[cfg(target_arch = "x86_64")]
mod bcast_avx2;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod small;
#[cfg(target_arch = "x86_64")]
mod small_avx2;

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

/// Activation rows per transposed block of the broadcast kernels: 4 vectors
/// of 16 (AVX-512), 8 of 8 (AVX2), 16 of 4 (NEON).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
const BLOCK_ROWS: usize = 64;

/// `x` `[t, k]` → consecutive blocks of [`BLOCK_ROWS`] rows, each `[k, tp]`
/// with `tp` the block's rows rounded up to `lanes`. Block b starts at
/// `b * BLOCK_ROWS * k` (every block but the last is full).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
fn transpose_blocks(x: &[f32], t: usize, k: usize, lanes: usize) -> Vec<f32> {
    let mut xt = vec![0f32; t.div_ceil(lanes) * lanes * k];
    let mut t0 = 0;
    while t0 < t {
        let tb = (t - t0).min(BLOCK_ROWS);
        let tp = tb.div_ceil(lanes) * lanes;
        let dst = &mut xt[t0 * k..];
        for (ti, row) in x[t0 * k..(t0 + tb) * k].chunks_exact(k).enumerate() {
            for (i, v) in row.iter().enumerate() {
                dst[i * tp + ti] = *v;
            }
        }
        t0 += tb;
    }
    xt
}

/// The most activation rows the x86 small-T kernels take (`small`,
/// `small_avx2`); the broadcast kernels take more. Both sum in one order, so
/// the cut-off is a speed choice only: at T = 8 the small kernel streams
/// the 151,936 × 256 output projection several times faster than the
/// broadcast one (`benches/matmul_decode.rs`).
#[cfg(target_arch = "x86_64")]
const SMALL_MAX_T: usize = 8;

/// Weight rows per rayon task of the small-T kernels (whole passes of
/// `pass` rows): about four tasks per thread, so the threads finish
/// together, but at most 1024 rows, so each task streams a few hundred KiB
/// to a few MiB and rayon's per-task cost stays far below its work (the
/// 151,936-row output projection is 149 tasks, not 2,374 of 64 rows).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn small_rows_per_task(n: usize, pass: usize) -> usize {
    let tasks = rayon::current_num_threads().max(1) * 4;
    n.div_ceil(tasks).clamp(pass, 1024).div_ceil(pass) * pass
}

/// Prefetches into L2 the part of the next pass's weights (`rows` rows
/// from `row0 + rows * k`, contiguous) that matches columns `k0..k0 + kc`
/// of this pass: the same share of its bytes, in address order, so the next
/// pass is fetched sequentially. A pass reads one line of each of its 16
/// (8) rows at a time, more streams than the hardware prefetchers follow:
/// without this the 151,936 × 256 output projection streamed at 3 GB/s.
/// (Prefetching those same scattered lines instead measured 0-15% slower at
/// T = 1 on a loaded 2-core EPYC; both leave f32 rows of k = 1024 streaming
/// from DRAM short of the portable row-at-a-time loop.) `wrapping_add`: past
/// the last row it is only a hint, never read.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_next_pass<W>(row0: *const W, rows: usize, k: usize, k0: usize, kc: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    let size = std::mem::size_of::<W>();
    let next = row0.wrapping_add(rows * k).cast::<u8>();
    let start = next.wrapping_add(k0 * rows * size) as usize & !63;
    let end = next.wrapping_add((k0 + kc) * rows * size) as usize;
    let mut line = start;
    while line < end {
        // SAFETY: prefetching is a hint; it never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(line as *const i8) };
        line += 64;
    }
}

#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint column ranges of `out` (see `matmul_xwt`).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// `out[t, r] = x[t, :] · w[r, :]` for `t < T`, `r < n`, on the process's
/// kernel path.
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
    matmul_xwt_on(cpu_kernels::path(), x, t, w, n, k, out)
}

/// [`matmul_xwt`] on the given path (panics if the CPU lacks it).
pub fn matmul_xwt_on<W: WeightElem>(
    path: KernelPath,
    x: &[f32],
    t: usize,
    w: &[W],
    n: usize,
    k: usize,
    out: &mut [f32],
) {
    assert!(x.len() >= t * k && w.len() >= n * k && out.len() >= t * n);
    let out_ptr = OutPtr(out.as_mut_ptr());
    match cpu_kernels::check(path) {
        // SAFETY (every arm): the path was checked, so the CPU has the
        // features the kernels are compiled for; shapes were checked above.
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512 => unsafe {
            if t <= SMALL_MAX_T {
                small::matmul(x, t, w, n, k, out_ptr)
            } else {
                bcast::matmul(x, t, w, n, k, out_ptr)
            }
        },
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2 => unsafe {
            if t <= SMALL_MAX_T {
                small_avx2::matmul(x, t, w, n, k, out_ptr)
            } else {
                bcast_avx2::matmul(x, t, w, n, k, out_ptr)
            }
        },
        #[cfg(target_arch = "aarch64")]
        KernelPath::Neon => unsafe {
            if t <= 4 {
                neon::small(x, t, w, n, k, out_ptr)
            } else {
                neon::bcast(x, t, w, n, k, out_ptr)
            }
        },
        _ => row_tasks(t, n, |rows, ts| {
            portable_block(x, w, k, n, rows, ts, out_ptr)
        }),
    }
}

/// Whether the process's path has vectorised matmul kernels (which beat
/// candle's gemm at every T and keep rows batch-invariant).
pub fn has_own_kernels() -> bool {
    matches!(
        cpu_kernels::path(),
        KernelPath::Avx512 | KernelPath::Avx2 | KernelPath::Neon
    )
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
mod tests;
