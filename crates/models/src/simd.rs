//! The few f32 vector kernels the CPU attention, the norms and the portable
//! linear layers spend their time in, on the process's [`KernelPath`]: AVX2+FMA
//! forms on the x86 paths (AVX-512 has no wider form of these: they run on
//! short rows or are memory-bound), their NEON twins on aarch64 (8 lanes as
//! two `float32x4_t`, the same sums in the same order), plain loops with independent accumulators
//! (which LLVM vectorises for the baseline ISA) otherwise.

use crate::cpu_kernels::{self, KernelPath};

/// `a · b` over the common length.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_on(cpu_kernels::path(), a, b)
}

/// [`dot`] on the given path (panics if the CPU lacks it).
#[inline]
pub fn dot_on(path: KernelPath, a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    #[cfg(target_arch = "x86_64")]
    if cpu_kernels::check(path).x86_avx2() {
        // SAFETY: the CPU supports the features `x86::dot` is compiled for
        // (the path was checked).
        return unsafe { x86::dot(a, b) };
    }
    #[cfg(target_arch = "aarch64")]
    if cpu_kernels::check(path) == KernelPath::Neon {
        return neon::dot(a, b);
    }
    let _ = path;
    dot_portable(a, b)
}

/// `y += alpha * x` over the common length.
#[inline]
pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    axpy_on(cpu_kernels::path(), y, alpha, x)
}

/// [`axpy`] on the given path (panics if the CPU lacks it).
#[inline]
pub fn axpy_on(path: KernelPath, y: &mut [f32], alpha: f32, x: &[f32]) {
    let n = y.len().min(x.len());
    let (y, x) = (&mut y[..n], &x[..n]);
    #[cfg(target_arch = "x86_64")]
    if cpu_kernels::check(path).x86_avx2() {
        // SAFETY: as in `dot_on`.
        unsafe { x86::axpy(y, alpha, x) };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if cpu_kernels::check(path) == KernelPath::Neon {
        neon::axpy(y, alpha, x);
        return;
    }
    let _ = path;
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// `out[j] = xs[j*k..(j+1)*k] · w` for every row j of `xs` (k = `w.len()`),
/// each row summed alone in the same order (so batch-invariant): the
/// portable matmul's inner loop.
#[inline]
pub fn dot_rows(xs: &[f32], w: &[f32], out: &mut [f32]) {
    let k = w.len();
    for (j, o) in out.iter_mut().enumerate() {
        *o = dot_portable(&xs[j * k..(j + 1) * k], w);
    }
}

fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        s += x * y;
    }
    s
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA; `a` and `b` have equal length.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
            acc1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 8)),
                _mm256_loadu_ps(pb.add(i + 8)),
                acc1,
            );
            i += 16;
        }
        if i + 8 <= n {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
            i += 8;
        }
        let mut s = hsum(_mm256_add_ps(acc0, acc1));
        while i < n {
            s += a[i] * b[i];
            i += 1;
        }
        s
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA; `y` and `x` have equal length.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
        let n = y.len();
        let (py, px) = (y.as_mut_ptr(), x.as_ptr());
        let av = _mm256_set1_ps(alpha);
        let mut i = 0;
        while i + 8 <= n {
            let r = _mm256_fmadd_ps(av, _mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i)));
            _mm256_storeu_ps(py.add(i), r);
            i += 8;
        }
        while i < n {
            y[i] += alpha * x[i];
            i += 1;
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use crate::neon8::F8;

    /// The AVX2 `x86::dot` with [`F8`] lanes: the same FMA chains and the same
    /// final reduction, so the same value.
    pub fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let (mut acc0, mut acc1) = (F8::zero(), F8::zero());
        let mut i = 0;
        // SAFETY (loads): i + 16 (or + 8) <= n, inside both slices.
        while i + 16 <= n {
            unsafe {
                acc0 = acc0.fma(F8::load(pa.add(i)), F8::load(pb.add(i)));
                acc1 = acc1.fma(F8::load(pa.add(i + 8)), F8::load(pb.add(i + 8)));
            }
            i += 16;
        }
        if i + 8 <= n {
            acc0 = unsafe { acc0.fma(F8::load(pa.add(i)), F8::load(pb.add(i))) };
            i += 8;
        }
        let mut s = acc0.add(acc1).hsum();
        while i < n {
            s += a[i] * b[i];
            i += 1;
        }
        s
    }

    /// `y += alpha * x`, fused per element as on the x86 paths.
    pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
        let n = y.len().min(x.len());
        let (py, px) = (y.as_mut_ptr(), x.as_ptr());
        let av = F8::splat(alpha);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n, inside both slices.
            unsafe {
                F8::load(py.add(i))
                    .fma(av, F8::load(px.add(i)))
                    .store(py.add(i))
            };
            i += 8;
        }
        while i < n {
            y[i] += alpha * x[i];
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_match_scalar_for_odd_lengths_on_every_path() {
        for path in KernelPath::supported_paths() {
            for n in [1usize, 7, 8, 9, 16, 17, 33, 128] {
                let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
                let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
                let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
                assert!(
                    (dot_on(path, &a, &b) - want).abs() < 1e-4,
                    "{path} dot n={n}"
                );
                let mut y = b.clone();
                axpy_on(path, &mut y, 0.5, &a);
                for i in 0..n {
                    assert!((y[i] - (b[i] + 0.5 * a[i])).abs() < 1e-6, "{path} axpy");
                }
            }
        }
        let (rows, n) = (6, 33);
        let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
        let xs: Vec<f32> = (0..rows * n).map(|i| (i as f32 * 0.05).sin()).collect();
        let mut out = vec![0.0; rows];
        dot_rows(&xs, &b, &mut out);
        for r in 0..rows {
            let want: f32 = xs[r * n..(r + 1) * n]
                .iter()
                .zip(&b)
                .map(|(x, y)| x * y)
                .sum();
            assert!((out[r] - want).abs() < 1e-4, "dot_rows r={r}");
        }
    }
}
