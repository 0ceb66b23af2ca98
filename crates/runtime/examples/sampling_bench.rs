//! Milliseconds per batch-32 sampling step over 151,936-wide logits (Qwen3's
//! vocabulary), one thread, the `SequenceSampler` against the full-sort
//! sampler it replaced (kept below only as this baseline), in the same run.
//!
//! ```text
//! cargo run --release -p agentd-runtime --example sampling_bench
//! ```
//!
//! Two logit shapes: `peaked` (N(0, 2²) plus 20 tokens boosted by 12..16, so
//! about half the mass sits on a few tokens, as in decoding) and `flat`
//! (N(0, 1): top_p = 0.9 keeps most of the vocabulary, the worst case).

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use agentd_runtime::sampling::log_softmax;
use agentd_runtime::{SamplingParams, SequenceSampler};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

const VOCAB: usize = 151_936;
const BATCH: usize = 32;
const REPS: usize = 5;

fn logits(peaked: bool, rng: &mut ChaCha8Rng) -> Vec<Vec<f32>> {
    let sd = if peaked { 2.0 } else { 1.0 };
    let normal = Normal::new(0.0f32, sd).expect("valid normal");
    (0..BATCH)
        .map(|_| {
            let mut row: Vec<f32> = (0..VOCAB).map(|_| normal.sample(rng)).collect();
            if peaked {
                for _ in 0..20 {
                    let t = rng.gen_range(0..VOCAB);
                    row[t] += rng.gen_range(12.0..16.0);
                }
            }
            row
        })
        .collect()
}

/// The pre-change sampler: penalties over a rebuilt seen-set, temperature,
/// then a sort of the whole vocabulary (only the top-k when top_k is set).
struct FullSort {
    p: SamplingParams,
    rng: ChaCha8Rng,
    prompt: HashSet<u32>,
    counts: HashMap<u32, u32>,
}

impl FullSort {
    fn sample(&mut self, logits: &[f32]) -> usize {
        let p = &self.p;
        if let Some(k) = p.logprobs {
            // Full f64 log-softmax, then the top k by index selection.
            let lp = log_softmax(logits);
            let mut idx: Vec<usize> = (0..lp.len()).collect();
            let by = |a: &usize, b: &usize| lp[*b].total_cmp(&lp[*a]).then(a.cmp(b));
            idx.select_nth_unstable_by(k - 1, by);
            idx.truncate(k);
            idx.sort_unstable_by(by);
            std::hint::black_box(idx);
        }
        let mut l = logits.to_vec();
        if p.repetition_penalty != 1.0 {
            let seen: HashSet<&u32> = self.prompt.iter().chain(self.counts.keys()).collect();
            for &t in seen {
                let x = &mut l[t as usize];
                *x = if *x > 0.0 {
                    *x / p.repetition_penalty
                } else {
                    *x * p.repetition_penalty
                };
            }
        }
        for (&t, &n) in &self.counts {
            l[t as usize] -= p.frequency_penalty * n as f32 + p.presence_penalty;
        }
        let token = if p.temperature < 1e-5 {
            let mut best = 0;
            for (i, &x) in l.iter().enumerate() {
                if x > l[best] {
                    best = i;
                }
            }
            best
        } else {
            l.iter_mut().for_each(|x| *x /= p.temperature);
            let mut cand: Vec<usize> = (0..l.len()).collect();
            let by = |a: &usize, b: &usize| l[*b].total_cmp(&l[*a]).then(a.cmp(b));
            if let Some(k) = p.top_k_limit().filter(|&k| k < cand.len()) {
                cand.select_nth_unstable_by(k - 1, by);
                cand.truncate(k);
            }
            cand.sort_unstable_by(by);
            let max = l[cand[0]];
            let mut probs: Vec<f32> = cand.iter().map(|&i| (l[i] - max).exp()).collect();
            let z: f32 = probs.iter().sum();
            probs.iter_mut().for_each(|q| *q /= z);
            let mut keep = probs.len();
            let mut cum = 0.0;
            for (i, q) in probs.iter().enumerate() {
                cum += q;
                if cum >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            let total: f32 = probs[..keep].iter().sum();
            let mut u = self.rng.gen::<f32>() * total;
            let mut pick = cand[keep - 1];
            for (i, q) in probs[..keep].iter().enumerate() {
                if u < *q {
                    pick = cand[i];
                    break;
                }
                u -= q;
            }
            pick
        };
        *self.counts.entry(token as u32).or_insert(0) += 1;
        token
    }
}

/// Median seconds of one batch step over `REPS` (after one warm-up step).
fn median_step(rows: &[Vec<f32>], mut sample_row: impl FnMut(usize, &[f32])) -> f64 {
    let mut times: Vec<f64> = (0..=REPS)
        .map(|_| {
            let s = Instant::now();
            for (i, r) in rows.iter().enumerate() {
                sample_row(i, r);
            }
            s.elapsed().as_secs_f64()
        })
        .skip(1)
        .collect();
    times.sort_by(f64::total_cmp);
    times[REPS / 2]
}

fn main() {
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let prompt: Vec<u32> = (0..512).map(|_| rng.gen_range(0..VOCAB as u32)).collect();
    let configs = [
        ("greedy", SamplingParams::greedy()),
        ("temperature=1", SamplingParams::default()),
        (
            "top_p=0.9",
            SamplingParams {
                top_p: 0.9,
                ..Default::default()
            },
        ),
        (
            "top_k=50",
            SamplingParams {
                top_k: 50,
                ..Default::default()
            },
        ),
        (
            "temperature=1 + top_logprobs=5",
            SamplingParams {
                logprobs: Some(5),
                ..Default::default()
            },
        ),
        (
            "penalties (rep 1.1, pres 0.3, freq 0.3, 512-token prompt)",
            SamplingParams {
                repetition_penalty: 1.1,
                presence_penalty: 0.3,
                frequency_penalty: 0.3,
                ..Default::default()
            },
        ),
    ];
    for peaked in [true, false] {
        let rows = logits(peaked, &mut rng);
        println!(
            "{} logits, batch {BATCH} x {VOCAB}, median of {REPS} steps:",
            if peaked { "peaked" } else { "flat" }
        );
        for (name, p) in &configs {
            let p = SamplingParams {
                seed: Some(1),
                ..p.clone()
            };
            let mut new: Vec<SequenceSampler> = (0..BATCH)
                .map(|_| SequenceSampler::new(p.clone(), &prompt).expect("valid params"))
                .collect();
            let mut old: Vec<FullSort> = (0..BATCH)
                .map(|_| FullSort {
                    p: p.clone(),
                    rng: ChaCha8Rng::seed_from_u64(1),
                    prompt: prompt.iter().copied().collect(),
                    counts: HashMap::new(),
                })
                .collect();
            let t_new = median_step(&rows, |i, r| {
                new[i].sample(r, &[]).expect("sample");
            });
            let t_old = median_step(&rows, |i, r| {
                old[i].sample(r);
            });
            println!(
                "  {name:<58} old {:>8.2} ms  new {:>7.2} ms  ({:.1}x)",
                t_old * 1e3,
                t_new * 1e3,
                t_old / t_new
            );
        }
    }
}
