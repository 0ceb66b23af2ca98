//! The single-pass decode kernel's algorithm on the host
//! (`kernels/decode_1p.cu`, `--single-pass-decode`), in the kernel's order:
//! a partition's tokens dealt to `128 / (D/8)` slots, `U` at a time; each
//! slot an online softmax (running max, exp-sum, P·V) per head; the slots
//! then combined as split-K partitions are, and the partitions by
//! `paged_decode_reduce`. Tested here against a plain softmax, so what the
//! device run checks is the kernel's translation of this, not the algebra.

/// One (sequence, KV head): `q` is `[group][d]` (already scaled), `k` and
/// `v` are `[ctx][d]`; the context is cut into partitions of `p` tokens.
/// Returns `[group][d]`.
pub fn single_pass_attention(q: &[f32], k: &[f32], v: &[f32], d: usize, p: usize) -> Vec<f32> {
    let group = q.len() / d;
    let ctx = k.len() / d;
    let slots = 128 / (d / 8);
    let u = if group <= 4 { 4 } else { 2 };
    // Each partition's (max, sum, unnormalised P·V) per head: tmp_* rows.
    let mut parts: Vec<Vec<(f32, f32, Vec<f32>)>> = Vec::new();
    for start in (0..ctx).step_by(p.max(1)) {
        let n = (start + p).min(ctx) - start;
        let mut slot_state = vec![vec![(f32::NEG_INFINITY, 0f32, vec![0f32; d]); group]; slots];
        for base in (0..n).step_by(slots * u) {
            for (slot, heads) in slot_state.iter_mut().enumerate() {
                let live: Vec<usize> = (0..u)
                    .map(|j| base + j * slots + slot)
                    .filter(|&i| i < n)
                    .map(|i| start + i)
                    .collect();
                for (g, (m, l, acc)) in heads.iter_mut().enumerate() {
                    let qg = &q[g * d..(g + 1) * d];
                    let sc: Vec<f32> = live.iter().map(|&t| dot(qg, &k[t * d..][..d])).collect();
                    let mt = sc.iter().copied().fold(*m, f32::max);
                    if mt == f32::NEG_INFINITY {
                        continue;
                    }
                    let corr = (*m - mt).exp();
                    *l *= corr;
                    acc.iter_mut().for_each(|a| *a *= corr);
                    for (&t, &s) in live.iter().zip(&sc) {
                        let e = (s - mt).exp();
                        *l += e;
                        for (a, &x) in acc.iter_mut().zip(&v[t * d..][..d]) {
                            *a += e * x;
                        }
                    }
                    *m = mt;
                }
            }
        }
        parts.push(
            (0..group)
                .map(|g| combine(slot_state.iter().map(|s| &s[g]), d))
                .collect(),
        );
    }
    // paged_decode_reduce (one partition: the kernel normalises directly).
    (0..group)
        .flat_map(|g| {
            let (_, l, acc) = combine(parts.iter().map(|p| &p[g]), d);
            acc.into_iter().map(move |a| a / l)
        })
        .collect()
}

/// States `(max, exp-sum, P·V)` over disjoint token sets as one: the max of
/// the maxima, the others rescaled to it; a state that saw no token
/// (max -inf) adds nothing.
fn combine<'a>(
    states: impl Iterator<Item = &'a (f32, f32, Vec<f32>)> + Clone,
    d: usize,
) -> (f32, f32, Vec<f32>) {
    let mx = states
        .clone()
        .map(|s| s.0)
        .fold(f32::NEG_INFINITY, f32::max);
    let (mut l, mut acc) = (0f32, vec![0f32; d]);
    for (m, sl, sacc) in states.filter(|s| s.0 != f32::NEG_INFINITY) {
        let w = (m - mx).exp();
        l += sl * w;
        for (a, &x) in acc.iter_mut().zip(sacc) {
            *a += x * w;
        }
    }
    (mx, l, acc)
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{decode_plan, AttnShape, DecodeKernel, Dtype, SINGLE_PASS_GROUPS};

    fn plain(q: &[f32], k: &[f32], v: &[f32], d: usize) -> Vec<f32> {
        let ctx = k.len() / d;
        q.chunks(d)
            .flat_map(|qg| {
                let s: Vec<f32> = (0..ctx).map(|t| dot(qg, &k[t * d..][..d])).collect();
                let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f32 = e.iter().sum();
                (0..d).map(move |j| (0..ctx).map(|t| e[t] * v[t * d + j]).sum::<f32>() / z)
            })
            .collect()
    }

    fn rand(seed: &mut u64, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
            })
            .collect()
    }

    #[test]
    fn single_pass_equals_a_plain_softmax_over_partitions_and_empty_slots() {
        let mut seed = 7u64;
        // Head dims 16-128 (8-64 slots), groups 1-8, contexts from one
        // token (most slots empty) past several partitions and slot rounds.
        for (d, group, ctx, p) in [
            (16, 1, 1, 512),
            (32, 2, 3, 64),
            (64, 4, 130, 64),
            (128, 8, 1025, 512),
            (128, 3, 700, 128),
            (64, 8, 97, 512),
        ] {
            let q = rand(&mut seed, group * d, 2.0);
            let (k, v) = (rand(&mut seed, ctx * d, 2.0), rand(&mut seed, ctx * d, 2.0));
            let got = single_pass_attention(&q, &k, &v, d, p);
            let want = plain(&q, &k, &v, d);
            let err = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(err < 1e-5, "d{d} g{group} ctx{ctx} p{p}: max error {err}");
        }
    }

    #[test]
    fn the_single_pass_kernel_is_chosen_only_when_asked_and_built_for_the_group() {
        let shape = |h, kv, d| AttnShape {
            num_heads: h,
            num_kv_heads: kv,
            head_dim: d,
            block_size: 16,
        };
        let s = shape(32, 8, 128);
        assert_eq!(DecodeKernel::choose(false, &s), DecodeKernel::TwoPass);
        assert_eq!(
            DecodeKernel::choose(true, &s),
            DecodeKernel::SinglePass { group: 4 }
        );
        assert_eq!(
            DecodeKernel::choose(true, &shape(12, 4, 64)),
            DecodeKernel::SinglePass { group: 4 }
        );
        assert_eq!(
            DecodeKernel::choose(true, &shape(16, 1, 64)),
            DecodeKernel::TwoPass
        );
        assert_eq!(
            DecodeKernel::choose(true, &s).name(Dtype::Bf16, &s),
            "paged_decode_1p_bf16_d128_g4"
        );
        assert_eq!(
            DecodeKernel::TwoPass.name(Dtype::F16, &s),
            "paged_decode_f16_d128"
        );
        // Every instance fits the 48 KiB a CTA gets without opting in.
        for d in crate::plan::HEAD_DIMS {
            for group in SINGLE_PASS_GROUPS {
                let s = shape(group * 2, 2, d);
                let plan = decode_plan(&s, 1, 4096);
                let bytes = DecodeKernel::SinglePass { group }.smem_bytes(&s, &plan);
                assert!(bytes <= 48 * 1024, "d{d} g{group}: {bytes} bytes");
            }
        }
    }
}
