//! The AVX2+FMA form of one attention task (see `cpu.rs` for the task split
//! and `avx512.rs` for the design it mirrors), for head dims that are
//! multiples of 8 up to 256: chunks of 8 keys (one ymm of scores).
//!
//! Per chunk: (1) scores of every row of the task as a small matrix product
//! over the block's transposed K, each score one FMA chain over d in order
//! (so prefill and decode of the same token agree to the bit); (2) online
//! softmax on the vector (masked max, vector `exp`, sum); (3) P·V with each
//! probability broadcast against value rows, in register tiles of RT rows ×
//! CV vectors (≤ 12 accumulators: AVX2 has 16 ymm registers; fewer rows take
//! a tile of their own size). Decode-sized tasks prefetch two blocks ahead
//! (`cpu::prefetch_ahead`).
//!
//! The chunks are 8 keys here and 16 with AVX-512, so the softmax rescales
//! at other points: results agree with the AVX-512 kernel to ~1e-6, not to
//! the bit (the matmul kernels do agree to the bit).

// Register tiles read best as explicit index loops.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::cpu::{prefetch_ahead, Job, OutPtr, Task};
use crate::cpu_kernels::KernelPath;

/// Keys per chunk: one vector of scores.
const KC: usize = 8;

/// The kernel for head dim `d`, if there is one (and the CPU has AVX2).
pub fn select(d: usize) -> Option<super::cpu::ChunkFn> {
    if !KernelPath::Avx2.supported() {
        return None;
    }
    // SAFETY (of each entry): AVX2, FMA and F16C were detected above.
    Some(match d {
        8 => |j, t, o| unsafe { chunk::<1, 1, 8>(j, t, o) },
        16 => |j, t, o| unsafe { chunk::<2, 2, 6>(j, t, o) },
        32 => |j, t, o| unsafe { chunk::<4, 4, 3>(j, t, o) },
        48 => |j, t, o| unsafe { chunk::<6, 3, 4>(j, t, o) },
        64 => |j, t, o| unsafe { chunk::<8, 4, 3>(j, t, o) },
        80 => |j, t, o| unsafe { chunk::<10, 5, 2>(j, t, o) },
        96 => |j, t, o| unsafe { chunk::<12, 4, 3>(j, t, o) },
        128 => |j, t, o| unsafe { chunk::<16, 4, 3>(j, t, o) },
        256 => |j, t, o| unsafe { chunk::<32, 4, 3>(j, t, o) },
        _ => return None,
    })
}

/// One task: DV = d / 8 vectors per head row, P·V in tiles of RT rows × CV
/// vectors (CV divides DV).
///
/// # Safety
/// AVX2 and FMA must be available; the batch was validated against the
/// cache (block tables and context lengths in range), `d == DV * 8`.
#[target_feature(enable = "avx2,fma")]
unsafe fn chunk<const DV: usize, const CV: usize, const RT: usize>(
    job: &Job<'_>,
    task: Task,
    out: OutPtr,
) {
    let d = DV * 8;
    let sh = job.shape;
    let (nh, nkv, bs) = (sh.num_heads, sh.num_kv_heads, sh.block_size);
    let group = nh / nkv;
    let Task {
        seq,
        kv_head,
        lo,
        hi,
    } = task;
    let tok0 = job.batch.cu_seqlens[seq];
    let first = job.batch.context_lens[seq] - job.batch.query_len(seq);
    let table = &job.batch.block_tables[seq];
    let rows = (hi - lo) * group;

    // The task's query rows, contiguous and pre-scaled; row r is query
    // lo + r / group, head kv_head * group + r % group.
    let mut qs = vec![0f32; rows * d];
    let mut qpos = vec![0usize; rows];
    for r in 0..rows {
        let (qi, g) = (lo + r / group, r % group);
        let off = ((tok0 + qi) * nh + kv_head * group + g) * d;
        for (dst, src) in qs[r * d..(r + 1) * d].iter_mut().zip(&job.q[off..off + d]) {
            *dst = src * job.scale;
        }
        qpos[r] = first + qi;
    }
    let mut m = vec![f32::NEG_INFINITY; rows];
    let mut l = vec![0f32; rows];
    let mut acc = vec![0f32; rows * d];
    let mut p = vec![0f32; rows * KC];

    // Start of key j's block (for this KV head) and its offset in the block.
    let key_at = |j: usize| -> (usize, usize) {
        let block = table[j / bs] as usize;
        ((block * nkv + kv_head) * bs * d, j % bs)
    };
    let key_row = |j: usize| -> usize {
        let (base, off) = key_at(j);
        base + off * d
    };
    // Chunks start at multiples of 8, so with such blocks a chunk never
    // straddles two blocks and its keys are contiguous in each K row.
    let direct = bs % KC == 0;
    let mut kt = if direct {
        Vec::new()
    } else {
        vec![0f32; d * KC]
    };
    let (kp, vp) = (job.kv.k.as_ptr(), job.kv.v.as_ptr());
    let iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let end = first + hi; // keys 0..end are visible to some row of the task
    let mut j0 = 0;
    let mut pf_block = usize::MAX;
    // Decode-sized tasks stream their keys once; a prefill chunk computes
    // 16 rows per key loaded and finds them in cache (`cpu::PF_BLOCKS`).
    let stream = hi - lo <= super::cpu::PF_MAX_QUERIES;
    while j0 < end {
        let nk = (end - j0).min(KC);
        if stream && j0 / bs != pf_block {
            pf_block = j0 / bs;
            prefetch_ahead(job, table, pf_block, end, kv_head);
        }
        let offs: [usize; KC] = std::array::from_fn(|i| key_row(j0 + i.min(nk - 1)));

        // 1. Scores into p[r][0..8]; component dd of key j0 + i is at
        // kcol[dd * kstride + i].
        let (kcol, kstride) = if direct {
            let (base, off) = key_at(j0);
            (kp.add(base + off), bs)
        } else {
            for i in 0..KC {
                let (base, off) = key_at(j0 + i.min(nk - 1));
                for dd in 0..d {
                    kt[dd * KC + i] = *kp.add(base + dd * bs + off);
                }
            }
            (kt.as_ptr(), KC)
        };
        let mut r = 0;
        while r < rows {
            let n = rows - r;
            if n >= 8 {
                scores_t::<8>(&qs, kcol, kstride, d, r, n, &mut p);
                r += 8;
            } else if n >= 4 {
                scores_t::<4>(&qs, kcol, kstride, d, r, n, &mut p);
                r += 4;
            } else {
                scores_t::<2>(&qs, kcol, kstride, d, r, n, &mut p);
                r += n.min(2);
            }
        }

        // 2. Online softmax, row by row on the 8 scores.
        for r in 0..rows {
            let visible = (qpos[r] + 1).saturating_sub(j0).min(nk);
            let pr = p.as_mut_ptr().add(r * KC);
            if visible == 0 {
                _mm256_storeu_ps(pr, _mm256_setzero_ps());
                continue;
            }
            let mask =
                _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(visible as i32), iota));
            let s = _mm256_loadu_ps(pr);
            let masked = _mm256_blendv_ps(_mm256_set1_ps(f32::NEG_INFINITY), s, mask);
            let new_m = m[r].max(hmax(masked));
            if new_m > m[r] && m[r] != f32::NEG_INFINITY {
                let corr = (m[r] - new_m).exp();
                l[r] *= corr;
                let c = _mm256_set1_ps(corr);
                let ar = acc.as_mut_ptr().add(r * d);
                for v in 0..DV {
                    _mm256_storeu_ps(
                        ar.add(8 * v),
                        _mm256_mul_ps(c, _mm256_loadu_ps(ar.add(8 * v))),
                    );
                }
            }
            let e = _mm256_and_ps(mask, exp(_mm256_sub_ps(s, _mm256_set1_ps(new_m))));
            l[r] += hsum(e);
            m[r] = new_m;
            _mm256_storeu_ps(pr, e);
        }

        // 3. acc += P · V over the chunk's keys, in RT × CV register tiles.
        let mut r = 0;
        while r < rows {
            let n = (rows - r).min(RT);
            let mut c0 = 0;
            while c0 < DV {
                // A tile of its own size for fewer rows than RT (decode
                // with GQA 1: one row), as in `avx512.rs`.
                match n {
                    1 => pv::<CV, 1>(&mut acc, d, &p, vp, &offs, nk, r, n, c0),
                    2 if RT > 2 => pv::<CV, 2>(&mut acc, d, &p, vp, &offs, nk, r, n, c0),
                    _ => pv::<CV, RT>(&mut acc, d, &p, vp, &offs, nk, r, n, c0),
                }
                c0 += CV;
            }
            r += n;
        }
        j0 += nk;
    }

    for r in 0..rows {
        let (qi, g) = (lo + r / group, r % group);
        let inv = if l[r] > 0.0 { 1.0 / l[r] } else { 0.0 };
        let off = ((tok0 + qi) * nh + kv_head * group + g) * d;
        // SAFETY: (tok0 + qi, head) belongs to this task alone (see cpu.rs).
        let dst = std::slice::from_raw_parts_mut(out.0.add(off), d);
        for (o, a) in dst.iter_mut().zip(&acc[r * d..(r + 1) * d]) {
            *o = a * inv;
        }
    }
}

/// Scores of rows `r..r + n.min(R)` against 8 keys whose component dd is
/// at `k[dd * stride..][..8]`; rows past `n` repeat the last valid one and
/// are not stored.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn scores_t<const R: usize>(
    qs: &[f32],
    k: *const f32,
    stride: usize,
    d: usize,
    r: usize,
    n: usize,
    p: &mut [f32],
) {
    let valid = n.min(R);
    let q: [*const f32; R] = std::array::from_fn(|i| qs.as_ptr().add((r + i.min(valid - 1)) * d));
    let mut acc = [_mm256_setzero_ps(); R];
    for dd in 0..d {
        let kv = _mm256_loadu_ps(k.add(dd * stride));
        for i in 0..R {
            acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(*q[i].add(dd)), kv, acc[i]);
        }
    }
    for i in 0..valid {
        _mm256_storeu_ps(p.as_mut_ptr().add((r + i) * KC), acc[i]);
    }
}

/// `acc[r..r + n][c0 * 8..(c0 + CV) * 8] += p[r..r + n] · V[chunk][same
/// columns]`, RT rows × CV vectors in registers.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn pv<const CV: usize, const RT: usize>(
    acc: &mut [f32],
    d: usize,
    p: &[f32],
    vp: *const f32,
    offs: &[usize; KC],
    nk: usize,
    r: usize,
    n: usize,
    c0: usize,
) {
    let rows: [usize; RT] = std::array::from_fn(|i| r + i.min(n - 1));
    let col = 8 * c0;
    let mut a = [[_mm256_setzero_ps(); CV]; RT];
    for i in 0..RT {
        for v in 0..CV {
            a[i][v] = _mm256_loadu_ps(acc.as_ptr().add(rows[i] * d + col + 8 * v));
        }
    }
    for (j, &o) in offs.iter().enumerate().take(nk) {
        let vrow = vp.add(o + col);
        let vv: [__m256; CV] = std::array::from_fn(|v| _mm256_loadu_ps(vrow.add(8 * v)));
        for i in 0..RT {
            let b = _mm256_set1_ps(p[rows[i] * KC + j]);
            for v in 0..CV {
                a[i][v] = _mm256_fmadd_ps(b, vv[v], a[i][v]);
            }
        }
    }
    // Repeated rows computed the same sums; store each row once.
    for i in 0..n {
        for v in 0..CV {
            _mm256_storeu_ps(acc.as_mut_ptr().add(rows[i] * d + col + 8 * v), a[i][v]);
        }
    }
}

/// The largest lane.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn hmax(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
    _mm_cvtss_f32(m)
}

/// The sum of the lanes.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// `e^x` lane-wise for x ≤ 0 (scores minus their running max), relative
/// error a few 1e-7: x = n·ln2 + r, |r| ≤ ln2/2, e^r by a degree-6 Taylor
/// polynomial, times 2^n built in the exponent bits. x is clamped at -87
/// so 2^n stays a normal float (e^-87 ≈ 1.6e-38: nothing next to the
/// running max's own term, which is 1).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn exp(x: __m256) -> __m256 {
    let x = _mm256_max_ps(x, _mm256_set1_ps(-87.0));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    // Cody-Waite: ln2 split so n * LN2_HI is exact.
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
    let mut y = _mm256_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
    }
    let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_mul_ps(y, _mm256_castsi256_ps(bits))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_exp_matches_libm() {
        if !KernelPath::Avx2.supported() {
            eprintln!("SKIPPED: no AVX2 on this CPU");
            return;
        }
        let xs: Vec<f32> = (0..4000).map(|i| -(i as f32) * 0.025).collect();
        for c in xs.chunks(8) {
            let mut lanes = [0f32; 8];
            lanes[..c.len()].copy_from_slice(c);
            let mut got = [0f32; 8];
            // SAFETY: AVX2 and FMA were detected above.
            unsafe { _mm256_storeu_ps(got.as_mut_ptr(), exp(_mm256_loadu_ps(lanes.as_ptr()))) };
            for (x, g) in lanes.iter().zip(got) {
                let want = x.exp();
                // Below -87 the clamp returns e^-87 (≤ 2e-38).
                assert!(
                    (g - want).abs() <= 4e-7 * want + 2e-38,
                    "exp({x}) = {g}, libm {want}"
                );
            }
        }
    }
}
