//! The AVX-512 form of one attention task (see `cpu.rs` for the task split),
//! for head dims that are multiples of 16 up to 256.
//!
//! The portable kernel spends its time in one `dot` (with a horizontal sum),
//! one `exp` and one `axpy` call per (query row, key). Here a task walks its
//! context in chunks of 16 keys and, per chunk:
//!
//! 1. **Scores** for all its rows (query tokens × heads of the GQA group) as a
//!    small matrix product, 16 keys per vector: K is stored transposed per
//!    block (`cache.rs`), so one head-dim component of the chunk's keys is one
//!    load (blocks of a multiple of 16 tokens; other sizes are gathered into
//!    a `[d, 16]` scratch), and each query value is broadcast against it.
//!    Every score is one FMA chain over d in order, however many rows the
//!    task has, so prefill and decode of the same token agree to the bit
//!    (batch invariance, see `matmul/mod.rs`).
//! 2. **Online softmax** on whole vectors: one masked max, one vector `exp`
//!    (polynomial, ~1 ulp), one sum; causal and context limits are lane masks.
//! 3. **P·V** with each probability broadcast against the value rows, RT rows
//!    × d/16 vectors of accumulators in registers per pass (fewer rows, as a
//!    GQA-1 decode's one, take a tile of their own size).
//!
//! A decode-sized task also prefetches the K and V of the block two ahead
//! (`cpu::prefetch_ahead`): it reads every key once, from memory.

// Register tiles read best as explicit index loops.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::cpu::{prefetch_ahead, Job, OutPtr, Task};

/// Keys per chunk: one vector of scores.
const KC: usize = 16;

/// The kernel for head dim `d`, if there is one.
pub fn select(d: usize) -> Option<super::cpu::ChunkFn> {
    if !std::arch::is_x86_feature_detected!("avx512f") {
        return None;
    }
    // SAFETY (of each entry): AVX-512F was detected above.
    Some(match d {
        16 => |j, t, o| unsafe { chunk::<1, 8>(j, t, o) },
        32 => |j, t, o| unsafe { chunk::<2, 8>(j, t, o) },
        48 => |j, t, o| unsafe { chunk::<3, 6>(j, t, o) },
        64 => |j, t, o| unsafe { chunk::<4, 4>(j, t, o) },
        80 => |j, t, o| unsafe { chunk::<5, 4>(j, t, o) },
        96 => |j, t, o| unsafe { chunk::<6, 3>(j, t, o) },
        128 => |j, t, o| unsafe { chunk::<8, 2>(j, t, o) },
        256 => |j, t, o| unsafe { chunk::<16, 1>(j, t, o) },
        _ => return None,
    })
}

/// One task: DV = d / 16 vectors per head row, RT rows per P·V pass.
///
/// # Safety
/// AVX-512F must be available; the batch was validated against the cache
/// (block tables and context lengths in range), `d == DV * 16`.
#[target_feature(enable = "avx512f")]
unsafe fn chunk<const DV: usize, const RT: usize>(job: &Job<'_>, task: Task, out: OutPtr) {
    let d = DV * 16;
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
    // Chunks start at multiples of 16, so with such blocks a chunk never
    // straddles two blocks and its keys are contiguous in each K row.
    let direct = bs % KC == 0;
    // Gathered keys (`[d, 16]`), for the other block sizes only.
    let mut kt = if direct {
        Vec::new()
    } else {
        vec![0f32; d * KC]
    };
    let (kp, vp) = (job.kv.k.as_ptr(), job.kv.v.as_ptr());
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

        // 1. Scores into p[r][0..16]; component dd of key j0 + i is at
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

        // 2. Online softmax, row by row on the 16 scores.
        for r in 0..rows {
            let visible = (qpos[r] + 1).saturating_sub(j0).min(nk);
            let pr = p.as_mut_ptr().add(r * KC);
            if visible == 0 {
                _mm512_storeu_ps(pr, _mm512_setzero_ps());
                continue;
            }
            let mask: __mmask16 = ((1u32 << visible) - 1) as __mmask16;
            let s = _mm512_loadu_ps(pr);
            let new_m = m[r].max(_mm512_mask_reduce_max_ps(mask, s));
            if new_m > m[r] && m[r] != f32::NEG_INFINITY {
                let corr = (m[r] - new_m).exp();
                l[r] *= corr;
                let c = _mm512_set1_ps(corr);
                let ar = acc.as_mut_ptr().add(r * d);
                for v in 0..DV {
                    _mm512_storeu_ps(
                        ar.add(16 * v),
                        _mm512_mul_ps(c, _mm512_loadu_ps(ar.add(16 * v))),
                    );
                }
            }
            let e = _mm512_maskz_mov_ps(mask, exp(_mm512_sub_ps(s, _mm512_set1_ps(new_m))));
            l[r] += _mm512_reduce_add_ps(e);
            m[r] = new_m;
            _mm512_storeu_ps(pr, e);
        }

        // 3. acc += P · V over the chunk's keys.
        let mut r = 0;
        while r < rows {
            let n = (rows - r).min(RT);
            // Fewer rows than the tile (decode: one row per KV head with
            // GQA 1) take a tile of their own size: the repeated rows of a
            // full tile would cost RT / n times the FMAs.
            match n {
                1 => pv::<DV, 1>(&mut acc, &p, vp, &offs, nk, r, n),
                2 if RT > 2 => pv::<DV, 2>(&mut acc, &p, vp, &offs, nk, r, n),
                _ => pv::<DV, RT>(&mut acc, &p, vp, &offs, nk, r, n),
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

/// Scores of rows `r..r + n.min(R)` against 16 keys whose component dd is
/// at `k[dd * stride..][..16]`; rows past `n` repeat the last valid one and
/// are not stored.
#[target_feature(enable = "avx512f")]
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
    let mut acc = [_mm512_setzero_ps(); R];
    for dd in 0..d {
        let kv = _mm512_loadu_ps(k.add(dd * stride));
        for i in 0..R {
            acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(*q[i].add(dd)), kv, acc[i]);
        }
    }
    for i in 0..valid {
        _mm512_storeu_ps(p.as_mut_ptr().add((r + i) * KC), acc[i]);
    }
}

/// `acc[r..r + n] += p[r..r + n] · V[chunk]`, RT rows at a time in registers.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn pv<const DV: usize, const RT: usize>(
    acc: &mut [f32],
    p: &[f32],
    vp: *const f32,
    offs: &[usize; KC],
    nk: usize,
    r: usize,
    n: usize,
) {
    let d = DV * 16;
    let rows: [usize; RT] = std::array::from_fn(|i| r + i.min(n - 1));
    let mut a = [[_mm512_setzero_ps(); DV]; RT];
    for i in 0..RT {
        for v in 0..DV {
            a[i][v] = _mm512_loadu_ps(acc.as_ptr().add(rows[i] * d + 16 * v));
        }
    }
    for (j, &o) in offs.iter().enumerate().take(nk) {
        let vrow = vp.add(o);
        let vv: [__m512; DV] = std::array::from_fn(|v| _mm512_loadu_ps(vrow.add(16 * v)));
        for i in 0..RT {
            let b = _mm512_set1_ps(p[rows[i] * KC + j]);
            for v in 0..DV {
                a[i][v] = _mm512_fmadd_ps(b, vv[v], a[i][v]);
            }
        }
    }
    // Repeated rows computed the same sums; store each row once.
    for i in 0..n {
        for v in 0..DV {
            _mm512_storeu_ps(acc.as_mut_ptr().add(rows[i] * d + 16 * v), a[i][v]);
        }
    }
}

/// `e^x` lane-wise for x ≤ 0 (scores minus their running max), with a
/// relative error of a few 1e-7: x = n·ln2 + r, |r| ≤ ln2/2, e^r by a
/// degree-6 Taylor polynomial, then scaled by 2^n (`vscalefps`).
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn exp(x: __m512) -> __m512 {
    let x = _mm512_max_ps(x, _mm512_set1_ps(-103.0));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    // Cody-Waite: ln2 split so n * LN2_HI is exact.
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_145_75), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428_606_8e-6), r);
    let mut y = _mm512_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(c));
    }
    _mm512_scalef_ps(y, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_exp_matches_libm() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        let xs: Vec<f32> = (0..4000).map(|i| -(i as f32) * 0.025).collect();
        for c in xs.chunks(16) {
            let mut lanes = [0f32; 16];
            lanes[..c.len()].copy_from_slice(c);
            let mut got = [0f32; 16];
            // SAFETY: AVX-512F was detected above.
            unsafe { _mm512_storeu_ps(got.as_mut_ptr(), exp(_mm512_loadu_ps(lanes.as_ptr()))) };
            for (x, g) in lanes.iter().zip(got) {
                let want = x.exp();
                assert!(
                    (g - want).abs() <= 4e-7 * want + 1e-38,
                    "exp({x}) = {g}, libm {want}"
                );
            }
        }
    }
}
