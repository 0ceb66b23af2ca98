//! The few f32 vector kernels the CPU attention and the small-batch linear
//! layers spend their time in. Rust builds for baseline x86-64 (SSE2, no FMA),
//! so these dispatch at run time to AVX2+FMA versions when the CPU has them;
//! the portable fallbacks are written with independent accumulators so LLVM
//! can still vectorise them.

/// `a · b` over the common length.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports the features `x86::dot` is compiled for.
        return unsafe { x86::dot(a, b) };
    }
    dot_portable(a, b)
}

/// `y += alpha * x` over the common length.
#[inline]
pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    let n = y.len().min(x.len());
    let (y, x) = (&mut y[..n], &x[..n]);
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: as in `dot`.
        unsafe { x86::axpy(y, alpha, x) };
        return;
    }
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// `out[j] = xs[j*k..(j+1)*k] · w` for every row j of `xs` (k = `w.len()`):
/// one weight row against several activation rows, loading the weights once.
#[inline]
pub fn dot_rows(xs: &[f32], w: &[f32], out: &mut [f32]) {
    let k = w.len();
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        let mut j = 0;
        while j + 4 <= out.len() {
            let rows = [
                &xs[j * k..(j + 1) * k],
                &xs[(j + 1) * k..(j + 2) * k],
                &xs[(j + 2) * k..(j + 3) * k],
                &xs[(j + 3) * k..(j + 4) * k],
            ];
            // SAFETY: as in `dot`; every row has length k.
            let r = unsafe { x86::dot4(rows, w) };
            out[j..j + 4].copy_from_slice(&r);
            j += 4;
        }
        for (jj, o) in out.iter_mut().enumerate().skip(j) {
            // SAFETY: as in `dot`.
            *o = unsafe { x86::dot(&xs[jj * k..(jj + 1) * k], w) };
        }
        return;
    }
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
#[inline]
pub(crate) fn has_avx2_fma() -> bool {
    // The std macro caches the CPUID result; this is a relaxed atomic load.
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
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

    /// Four dot products sharing the `w` loads.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; every row has `w.len()` elements.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot4(rows: [&[f32]; 4], w: &[f32]) -> [f32; 4] {
        let n = w.len();
        let pw = w.as_ptr();
        let p = [
            rows[0].as_ptr(),
            rows[1].as_ptr(),
            rows[2].as_ptr(),
            rows[3].as_ptr(),
        ];
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 8 <= n {
            let wv = _mm256_loadu_ps(pw.add(i));
            acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(p[0].add(i)), wv, acc[0]);
            acc[1] = _mm256_fmadd_ps(_mm256_loadu_ps(p[1].add(i)), wv, acc[1]);
            acc[2] = _mm256_fmadd_ps(_mm256_loadu_ps(p[2].add(i)), wv, acc[2]);
            acc[3] = _mm256_fmadd_ps(_mm256_loadu_ps(p[3].add(i)), wv, acc[3]);
            i += 8;
        }
        let mut out = [hsum(acc[0]), hsum(acc[1]), hsum(acc[2]), hsum(acc[3])];
        while i < n {
            for r in 0..4 {
                out[r] += rows[r][i] * w[i];
            }
            i += 1;
        }
        out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_match_scalar_for_odd_lengths() {
        for n in [1usize, 7, 8, 9, 16, 17, 33, 128] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert!((dot(&a, &b) - want).abs() < 1e-4, "dot n={n}");
            let mut y = b.clone();
            axpy(&mut y, 0.5, &a);
            for i in 0..n {
                assert!((y[i] - (b[i] + 0.5 * a[i])).abs() < 1e-6);
            }
            let rows = 6;
            let xs: Vec<f32> = (0..rows * n).map(|i| (i as f32 * 0.05).sin()).collect();
            let mut out = vec![0.0; rows];
            dot_rows(&xs, &b, &mut out);
            for r in 0..rows {
                let want: f32 = xs[r * n..(r + 1) * n]
                    .iter()
                    .zip(&b)
                    .map(|(x, y)| x * y)
                    .sum();
                assert!((out[r] - want).abs() < 1e-4, "dot_rows n={n} r={r}");
            }
        }
    }
}
