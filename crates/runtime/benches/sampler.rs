//! The host sampler per token on a Qwen3-wide row (151,936 logits), by what
//! the request asks: nothing (greedy), a draw (temperature + top-p), the
//! penalties over a 4,096-token prompt, and token controls (1,000 allowed
//! ids, a bias, `min_tokens`, bad words). The edits go through the row plan
//! (`plan_row` then `RowPlan::edited_copy`), the one definition every
//! backend follows, so this is where its cost on the CPU shows.
//!
//! ```text
//! cargo bench -p agentd-runtime --bench sampler
//! AGENTD_CPU_KERNELS=portable cargo bench -p agentd-runtime --bench sampler
//! ```
//!
//! Per case: `SAMPLER_ROUNDS` (default 5) rounds of `SAMPLER_TOKENS`
//! (default 200) tokens, each token timed; it prints p50 and p99 over every
//! token of every round and the best round's mean, in µs per token. The
//! CPU model and the sampler's pass (AVX2+FMA or portable) head the table.

use std::hint::black_box;
use std::time::Instant;

use agentd_runtime::cpu::cpu_model_name;
use agentd_runtime::sampling::{pass_name, SamplingParams, SequenceSampler, TokenControls};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

const VOCAB: usize = 151_936;
const EOS: [u32; 1] = [151_645];

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn cases() -> Vec<(&'static str, SamplingParams, Vec<u32>)> {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let prompt: Vec<u32> = (0..4096).map(|_| rng.gen_range(0..VOCAB as u32)).collect();
    let base = SamplingParams {
        max_tokens: 1 << 20,
        seed: Some(1),
        ..SamplingParams::greedy()
    };
    let draw = SamplingParams {
        temperature: 0.7,
        top_p: 0.9,
        ..base.clone()
    };
    let penalties = SamplingParams {
        repetition_penalty: 1.1,
        presence_penalty: 0.5,
        frequency_penalty: 0.3,
        ..draw.clone()
    };
    let allowed: Vec<u32> = (0..1000).map(|i| i * 151).collect();
    let controls = SamplingParams {
        controls: TokenControls {
            logit_bias: vec![(allowed[3], 2.0), (allowed[10], -1.0)],
            allowed_token_ids: Some(allowed.clone()),
            bad_words: vec![vec![allowed[5]], vec![allowed[6], allowed[7]]],
            min_tokens: 1 << 19,
        },
        ..draw.clone()
    };
    vec![
        ("greedy, no edits", base, prompt.clone()),
        ("temperature + top-p", draw, prompt.clone()),
        ("penalties, 4,096-token prompt", penalties, prompt.clone()),
        (
            "1,000 allowed ids + bias + min_tokens + bad words",
            controls,
            prompt,
        ),
    ]
}

/// Rows shaped like a language model's: a Gaussian floor (sd 2) and 32
/// plausible tokens 12-20 above it, so top-p keeps tens of tokens, not the
/// vocabulary. Two rows alternate (1.2 MB, the size of one step's row
/// fresh from the head in cache), so no token reads a row it just wrote.
fn rows() -> Vec<Vec<f32>> {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let floor = Normal::new(0.0f32, 2.0).expect("a valid normal");
    (0..2)
        .map(|_| {
            let mut row: Vec<f32> = (0..VOCAB).map(|_| floor.sample(&mut rng)).collect();
            for _ in 0..32 {
                let t = rng.gen_range(0..VOCAB);
                row[t] = rng.gen_range(12.0f32..20.0);
            }
            row
        })
        .collect()
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let rounds = env_usize("SAMPLER_ROUNDS", 5).max(1);
    let tokens = env_usize("SAMPLER_TOKENS", 200).max(1);
    let rows = rows();
    println!(
        "sampler, {VOCAB} logits a row: {} ({} pass), {rounds} rounds x {tokens} tokens",
        cpu_model_name(),
        pass_name()
    );
    println!(
        "| case | p50 µs/token | p99 µs/token | best round mean µs/token |\n|---|---:|---:|---:|"
    );
    for (name, params, prompt) in cases() {
        let mut all = Vec::with_capacity(rounds * tokens);
        let mut best = f64::MAX;
        for _ in 0..rounds {
            let mut s = match SequenceSampler::new(params.clone(), &prompt) {
                Ok(s) => s,
                Err(e) => panic!("{name}: {e:?}"),
            };
            let start = Instant::now();
            for t in 0..tokens {
                let t0 = Instant::now();
                let out = s.sample(&rows[t % rows.len()], &EOS);
                black_box(&out);
                all.push(t0.elapsed().as_secs_f64() * 1e6);
            }
            best = best.min(start.elapsed().as_secs_f64() * 1e6 / tokens as f64);
        }
        all.sort_by(f64::total_cmp);
        println!(
            "| {name} | {:.1} | {:.1} | {best:.1} |",
            pct(&all, 0.5),
            pct(&all, 0.99)
        );
    }
}
