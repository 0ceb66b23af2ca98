//! The aarch64 NEON form of one attention task: `avx2.rs` step for step,
//! with each 8-lane vector a pair of `float32x4_t` ([`F8`]), for head dims
//! that are multiples of 8 up to 256: chunks of 8 keys, the same score FMA
//! chains over d, the same masked online softmax with the same vector `exp`
//! and lane-sum order, the same P·V tiles (an F8 is two of aarch64's 32
//! registers, so the AVX2 tile shapes, ≤ 12 accumulators, fit).
//!
//! The vector steps compute what the AVX2 kernel computes lane for lane;
//! the running-max correction `(m - new_m).exp()` is the platform libm's
//! scalar `expf`, whose last bit may differ between glibc builds, so results
//! are compared with the portable reference to a tolerance (as the x86
//! kernels are), not with x86 outputs bit for bit.

// Register tiles read best as explicit index loops.
#![allow(clippy::needless_range_loop)]

use super::cpu::{Job, OutPtr, Task};
use crate::neon8::F8;

/// Keys per chunk: one F8 of scores.
const KC: usize = 8;

/// The kernel for head dim `d`, if there is one (NEON is baseline on aarch64).
pub fn select(d: usize) -> Option<super::cpu::ChunkFn> {
    // SAFETY (of each entry): `chunk`'s contract is `cpu.rs`'s validated batch.
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
/// The batch was validated against the
/// cache (block tables and context lengths in range), `d == DV * 8`.
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
    let end = first + hi; // keys 0..end are visible to some row of the task
    let mut j0 = 0;
    while j0 < end {
        let nk = (end - j0).min(KC);
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
                F8::zero().store(pr);
                continue;
            }
            let s = F8::load(pr);
            let masked = s.first_or(visible, F8::splat(f32::NEG_INFINITY));
            let new_m = m[r].max(masked.hmax());
            if new_m > m[r] && m[r] != f32::NEG_INFINITY {
                let corr = (m[r] - new_m).exp();
                l[r] *= corr;
                let c = F8::splat(corr);
                let ar = acc.as_mut_ptr().add(r * d);
                for v in 0..DV {
                    c.mul(F8::load(ar.add(8 * v))).store(ar.add(8 * v));
                }
            }
            let e = s.sub(F8::splat(new_m)).exp().first_or(visible, F8::zero());
            l[r] += e.hsum();
            m[r] = new_m;
            e.store(pr);
        }

        // 3. acc += P · V over the chunk's keys, in RT × CV register tiles.
        let mut r = 0;
        while r < rows {
            let n = (rows - r).min(RT);
            let mut c0 = 0;
            while c0 < DV {
                pv::<CV, RT>(&mut acc, d, &p, vp, &offs, nk, r, n, c0);
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
    let mut acc = [F8::zero(); R];
    for dd in 0..d {
        let kv = F8::load(k.add(dd * stride));
        for i in 0..R {
            acc[i] = acc[i].fma(F8::splat(*q[i].add(dd)), kv);
        }
    }
    for i in 0..valid {
        acc[i].store(p.as_mut_ptr().add((r + i) * KC));
    }
}

/// `acc[r..r + n][c0 * 8..(c0 + CV) * 8] += p[r..r + n] · V[chunk][same
/// columns]`, RT rows × CV vectors in registers.
#[allow(clippy::too_many_arguments)]
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
    let mut a = [[F8::zero(); CV]; RT];
    for i in 0..RT {
        for v in 0..CV {
            a[i][v] = F8::load(acc.as_ptr().add(rows[i] * d + col + 8 * v));
        }
    }
    for (j, &o) in offs.iter().enumerate().take(nk) {
        let vrow = vp.add(o + col);
        let vv: [F8; CV] = std::array::from_fn(|v| F8::load(vrow.add(8 * v)));
        for i in 0..RT {
            let b = F8::splat(p[rows[i] * KC + j]);
            for v in 0..CV {
                a[i][v] = a[i][v].fma(b, vv[v]);
            }
        }
    }
    // Repeated rows computed the same sums; store each row once.
    for i in 0..n {
        for v in 0..CV {
            a[i][v].store(acc.as_mut_ptr().add(rows[i] * d + col + 8 * v));
        }
    }
}
