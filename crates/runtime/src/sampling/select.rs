//! The candidate set of one draw: top-k by one thresholded pass, top-p by a
//! mass-weighted quickselect, min-p as a logit floor. Every filter keeps a
//! prefix of the vocabulary in one total order (higher logit first, lower
//! index on ties, as a stable sort would give), so none needs the full sort.

use std::cmp::Ordering;

use super::kernels::{self, exp_neg};
use super::SamplingParams;

/// A token still in the running, with its unnormalised weight
/// `e^((logit - max)/T)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Cand {
    pub idx: u32,
    pub logit: f32,
    pub w: f32,
}

/// The candidates' order: higher logit first, lower index on ties.
fn order(a: &Cand, b: &Cand) -> Ordering {
    b.logit.total_cmp(&a.logit).then(a.idx.cmp(&b.idx))
}

/// Elements scanned per threshold check: a chunk whose max is below the
/// running threshold is skipped with one vector max.
const CHUNK: usize = 64;

/// The `k` best entries of `v` in the candidates' order, unordered (fewer
/// when `v` has fewer finite entries; NaN and -inf are never chosen). One
/// pass keeps a buffer of at most 2k behind a threshold that rises each time
/// the buffer is cut back to k, so only a few hundred entries are ever moved.
pub(super) fn top_k(v: &[f32], k: usize) -> Vec<Cand> {
    if k == 0 {
        return Vec::new();
    }
    let cap = 2 * k.max(CHUNK);
    let mut buf = Vec::with_capacity(cap);
    let mut thr = f32::NEG_INFINITY;
    for (c, chunk) in v.chunks(CHUNK).enumerate() {
        if kernels::max_portable(chunk) <= thr {
            continue;
        }
        for (j, &x) in chunk.iter().enumerate() {
            // A later entry equal to the threshold has a higher index than
            // the k-th kept one, so it is strictly worse.
            if x > thr {
                let idx = (c * CHUNK + j) as u32;
                buf.push(Cand {
                    idx,
                    logit: x,
                    w: 0.0,
                });
                if buf.len() == cap {
                    thr = keep_best(&mut buf, k);
                }
            }
        }
    }
    if buf.len() > k {
        keep_best(&mut buf, k);
    }
    buf
}

/// Cuts `buf` back to its `k` best; returns the k-th best logit.
fn keep_best(buf: &mut Vec<Cand>, k: usize) -> f32 {
    buf.select_nth_unstable_by(k - 1, order);
    buf.truncate(k);
    buf[k - 1].logit
}

/// Every entry with `logit ≥ cut` (so never NaN).
fn at_least(v: &[f32], cut: f32) -> Vec<Cand> {
    let mut out = Vec::new();
    for (c, chunk) in v.chunks(CHUNK).enumerate() {
        if kernels::max_portable(chunk) < cut {
            continue;
        }
        for (j, &x) in chunk.iter().enumerate() {
            if x >= cut {
                let idx = (c * CHUNK + j) as u32;
                out.push(Cand {
                    idx,
                    logit: x,
                    w: 0.0,
                });
            }
        }
    }
    out
}

fn weigh(c: &mut [Cand], m: f32, inv_t: f32) -> f64 {
    c.iter_mut()
        .map(|c| {
            c.w = exp_neg((c.logit - m) * inv_t);
            c.w as f64
        })
        .sum()
}

/// The tokens that survive top-k, then top-p (on the top-k set renormalised),
/// then min-p (on the max's probability), with their weights; never empty
/// when `m` (the row's max) is finite. `inv_t` is 1/temperature.
pub(super) fn kept(row: &[f32], m: f32, inv_t: f32, p: &SamplingParams) -> Vec<Cand> {
    // p_i ≥ min_p·p_max  ⟺  logit_i ≥ max + T·ln(min_p).
    let floor = if p.min_p > 0.0 {
        m + p.min_p.ln() / inv_t
    } else {
        f32::NEG_INFINITY
    };
    let (mut c, z) = if let Some(k) = p.top_k_limit().filter(|&k| k < row.len()) {
        let mut c = top_k(row, k);
        let z = weigh(&mut c, m, inv_t);
        (c, z)
    } else if p.top_p < 1.0 {
        let mut blocks = Vec::new();
        let z = kernels::block_sums(row, m, inv_t, &mut blocks);
        (
            top_p_candidates(row, m, inv_t, floor, p.top_p as f64 * z),
            z,
        )
    } else {
        let mut c = at_least(row, floor);
        weigh(&mut c, m, inv_t);
        (c, 0.0)
    };
    if p.top_p < 1.0 {
        let n = mass_prefix(&mut c, p.top_p as f64 * z);
        c.truncate(n);
    }
    c.retain(|c| c.logit >= floor);
    c
}

/// A candidate set that holds the top-p prefix (mass `target`) or every
/// token at or above `floor`, whichever is smaller: on real logits the top-p
/// mass lies within a few temperatures of the max, so start 8T below it
/// (weights ≥ e^-8) and double the span until the mass is reached. Past 64T
/// (weights < 1e-27) the last try takes everything down to the floor.
fn top_p_candidates(row: &[f32], m: f32, inv_t: f32, floor: f32, target: f64) -> Vec<Cand> {
    let mut span = 8.0;
    loop {
        let cut = if span > 64.0 {
            floor
        } else {
            (m - span / inv_t).max(floor)
        };
        let mut c = at_least(row, cut);
        if weigh(&mut c, m, inv_t) >= target || cut <= floor {
            return c;
        }
        span *= 2.0;
    }
}

/// Reorders `c` so its first n entries are the shortest prefix of the
/// candidates' order whose weight reaches `target`, and returns n (at least
/// 1 when `c` is not empty; all of `c` when the target is out of reach).
/// Large sets (flat logits: top_p = 0.9 can keep 130k of 152k tokens) are
/// first cut by a weight histogram, so only one bucket is quickselected.
pub(super) fn mass_prefix(c: &mut [Cand], target: f64) -> usize {
    if c.len() > BUCKETED_FROM {
        bucketed_prefix(c, target)
    } else {
        quickselect_prefix(c, target)
    }
}

/// Candidate count above which [`mass_prefix`] buckets first: below it the
/// quickselect's ~3 passes cost less than the histogram's.
const BUCKETED_FROM: usize = 4096;

/// A weight's bucket: the top 12 bits of a non-negative f32 (exponent and 3
/// mantissa bits, 8 buckets per octave) order like the value, and weights
/// grow with the logit, so buckets never split a tie and follow the order.
fn bucket(w: f32) -> usize {
    (w.to_bits() >> 20) as usize
}

/// [`mass_prefix`] by a histogram of weight per bucket: buckets above the
/// one where the running mass reaches `target` are kept whole (unordered),
/// and only that boundary bucket is quickselected.
fn bucketed_prefix(c: &mut [Cand], target: f64) -> usize {
    // Weights are ≤ 1 (the max's), so 1.0's bucket is the last.
    let mut mass = vec![0f64; bucket(1.0) + 1];
    for x in c.iter() {
        mass[bucket(x.w).min(bucket(1.0))] += x.w as f64;
    }
    let mut above = 0f64;
    let Some(b) = (0..mass.len()).rev().find(|&b| {
        let reached = above + mass[b] >= target;
        if !reached {
            above += mass[b];
        }
        reached
    }) else {
        return c.len();
    };
    // [bucket > b | bucket == b | rest].
    let mut kept = partition(c, |x| bucket(x.w) > b);
    let tied = partition(&mut c[kept..], |x| bucket(x.w) == b);
    kept += quickselect_prefix(&mut c[kept..kept + tied], target - above);
    kept.max(1).min(c.len())
}

/// Moves the entries satisfying `pred` to the front; returns their count.
fn partition(c: &mut [Cand], pred: impl Fn(&Cand) -> bool) -> usize {
    let mut n = 0;
    for i in 0..c.len() {
        if pred(&c[i]) {
            c.swap(i, n);
            n += 1;
        }
    }
    n
}

/// [`mass_prefix`] by a quickselect that recurses into the side holding the
/// boundary: expected O(len) instead of the O(len·log len) sort.
fn quickselect_prefix(c: &mut [Cand], target: f64) -> usize {
    let (mut lo, mut hi) = (0, c.len());
    // Weight of c[..lo], every entry of which is in the prefix; stays < target.
    let mut acc = 0f64;
    while hi - lo > 1 {
        let last = hi - 1;
        let mid = lo + (hi - lo) / 2;
        // Median of three as the pivot, moved to `last`.
        let mut three = [lo, mid, last];
        three.sort_by(|&a, &b| order(&c[a], &c[b]));
        c.swap(three[1], last);
        let pivot = c[last];
        let mut store = lo;
        let mut above = 0f64;
        for i in lo..last {
            if order(&c[i], &pivot) == Ordering::Less {
                above += c[i].w as f64;
                c.swap(i, store);
                store += 1;
            }
        }
        c.swap(store, last);
        if acc + above >= target {
            hi = store;
        } else if acc + above + pivot.w as f64 >= target {
            return store + 1;
        } else {
            acc += above + pivot.w as f64;
            lo = store + 1;
        }
    }
    // One entry left in lo..hi: it completes the prefix if anything does.
    hi.max(1).min(c.len())
}

/// Inverse-CDF draw from the candidates by weight, `u` ∈ [0, 1).
pub(super) fn draw(c: &[Cand], u: f64) -> Option<u32> {
    let total: f64 = c.iter().map(|c| c.w as f64).sum();
    let mut target = u * total;
    let mut last = None;
    for c in c.iter().filter(|c| c.w > 0.0) {
        last = Some(c.idx);
        if target < c.w as f64 {
            return last;
        }
        target -= c.w as f64;
    }
    last.or(c.first().map(|c| c.idx))
}

/// The `k` largest `(index, value)` pairs, best first (lower index on ties).
pub fn top_k_pairs(v: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut c = top_k(v, k.min(v.len()));
    c.sort_unstable_by(order);
    c.into_iter().map(|c| (c.idx, c.logit)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(v: &[f32]) -> Vec<Cand> {
        let mut c: Vec<Cand> = v
            .iter()
            .enumerate()
            .map(|(i, &x)| Cand {
                idx: i as u32,
                logit: x,
                w: (x - 10.0).exp(),
            })
            .collect();
        c.sort_by(order);
        c
    }

    fn row(n: usize, seed: u32) -> Vec<f32> {
        // Few distinct values, so ties are common.
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 97)
            .map(|x| x as f32 * 0.1)
            .collect()
    }

    #[test]
    fn top_k_equals_the_sorted_prefix_ties_by_index() {
        for (n, k) in [(10, 3), (1000, 1), (1000, 50), (5000, 700), (300, 300)] {
            let v = row(n, k as u32);
            let mut got = top_k(&v, k);
            got.sort_by(order);
            let want: Vec<(u32, f32)> = sorted(&v)[..k].iter().map(|c| (c.idx, c.logit)).collect();
            let got: Vec<(u32, f32)> = got.iter().map(|c| (c.idx, c.logit)).collect();
            assert_eq!(got, want, "n {n} k {k}");
        }
        assert_eq!(
            top_k_pairs(&[1.0, f32::NAN, 3.0], 5),
            vec![(2, 3.0), (0, 1.0)]
        );
    }

    #[test]
    fn mass_prefix_equals_the_sorted_cumulative_cut() {
        for n in [1, 2, 3, 10, 257, 3000, 20_000] {
            let v = row(n, n as u32);
            let want_order = sorted(&v);
            let total: f64 = want_order.iter().map(|c| c.w as f64).sum();
            for q in [1e-9, 0.1, 0.5, 0.9, 0.999] {
                let target = q * total;
                let mut cum = 0f64;
                let want = want_order
                    .iter()
                    .position(|c| {
                        cum += c.w as f64;
                        cum >= target
                    })
                    .map_or(n, |i| i + 1);
                let mut c = want_order.clone();
                c.reverse();
                let got = mass_prefix(&mut c, target);
                // Rounding of the two summation orders may move the cut by one
                // entry only when the target sits on a boundary.
                assert!(got.abs_diff(want) <= 1, "n {n} q {q}: {got} vs {want}");
                let mut head = c[..got].to_vec();
                head.sort_by(order);
                assert_eq!(head, want_order[..got].to_vec());
            }
        }
    }
}
