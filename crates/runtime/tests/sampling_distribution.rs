//! The sampler's draws over many seeds follow the exact distribution its
//! parameters define (penalties, temperature, top-k, top-p, min-p, computed
//! here in f64 by sorting, the textbook way): a chi-square goodness-of-fit test
//! per configuration at α ≈ 1e-6, with every token outside the support never
//! drawn. The seeds are fixed, so the test is deterministic.

use agentd_runtime::{SamplingParams, SequenceSampler};

/// Draws per configuration, one per seed.
const DRAWS: u64 = 12_000;

/// Logits spread like a language model's: most tokens near 0, a head up to 8.
fn row_a(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h =
                ((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as f32 / (1u64 << 24) as f32;
            8.0 * h * h * h
        })
        .collect()
}

/// One token at 10.5 and 5,000 tied at 0: the top token holds 0.879 of the
/// mass, so top_p = 0.9 reaches into the ties (broken by lower index) and
/// past the sampler's first candidate cut (8 temperatures below the max).
fn row_ties() -> Vec<f32> {
    let mut v = vec![0.0; 5_001];
    v[4_321] = 10.5;
    v
}

/// The distribution by definition: logits / T, a stable sort (higher first,
/// lower index on ties), top-k, top-p on the renormalised top-k (shortest
/// prefix with cumulative ≥ p), min-p against the best, renormalised.
fn exact(logits: &[f32], p: &SamplingParams) -> Vec<f64> {
    let x: Vec<f64> = logits
        .iter()
        .map(|&l| l as f64 / p.temperature as f64)
        .collect();
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[b].total_cmp(&x[a]));
    if let Some(k) = p.top_k_limit() {
        order.truncate(k);
    }
    let m = x[order[0]];
    let w: Vec<f64> = order.iter().map(|&i| (x[i] - m).exp()).collect();
    let z: f64 = w.iter().sum();
    let mut keep = order.len();
    let mut cum = 0.0;
    for (j, wj) in w.iter().enumerate() {
        cum += wj / z;
        if cum >= p.top_p as f64 {
            keep = j + 1;
            break;
        }
    }
    keep = keep.min(w.iter().take_while(|&&q| q >= p.min_p as f64).count());
    let kept: f64 = w[..keep].iter().sum();
    let mut probs = vec![0.0; x.len()];
    for (j, &i) in order[..keep].iter().enumerate() {
        probs[i] = w[j] / kept;
    }
    probs
}

/// Token counts over `DRAWS` seeds: each seed's sampler first eats the
/// `warmup` rows (to build penalty history), then draws once from `row`.
fn histogram(p: &SamplingParams, prompt: &[u32], warmup: &[Vec<f32>], row: &[f32]) -> Vec<u64> {
    let mut counts = vec![0u64; row.len()];
    for seed in 0..DRAWS {
        let params = SamplingParams {
            seed: Some(seed),
            max_tokens: 1 << 20,
            ..p.clone()
        };
        let mut s = SequenceSampler::new(params, prompt).unwrap();
        for w in warmup {
            s.sample(w, &[]).unwrap();
        }
        counts[s.sample(row, &[]).unwrap().token_id as usize] += 1;
    }
    counts
}

/// Pearson's chi-square and its degrees of freedom, bins with expected count
/// < 5 pooled; panics when a zero-probability token was drawn.
fn chi_square(counts: &[u64], probs: &[f64]) -> (f64, usize) {
    let n = DRAWS as f64;
    let (mut chi, mut bins) = (0.0, 0usize);
    let (mut pool_obs, mut pool_exp) = (0.0, 0.0);
    for (t, (&c, &q)) in counts.iter().zip(probs).enumerate() {
        if q == 0.0 {
            assert_eq!(c, 0, "token {t} is outside the support but was drawn");
        } else if q * n < 5.0 {
            pool_obs += c as f64;
            pool_exp += q * n;
        } else {
            chi += (c as f64 - q * n).powi(2) / (q * n);
            bins += 1;
        }
    }
    if pool_exp > 0.0 {
        chi += (pool_obs - pool_exp).powi(2) / pool_exp;
        bins += 1;
    }
    (chi, bins.saturating_sub(1).max(1))
}

/// Chi-square critical value at α ≈ 1e-6 (z = 4.75), Wilson-Hilferty.
fn critical(df: usize) -> f64 {
    let d = df as f64;
    let a = 2.0 / (9.0 * d);
    d * (1.0 - a + 4.75 * a.sqrt()).powi(3)
}

fn check(
    name: &str,
    p: SamplingParams,
    prompt: &[u32],
    warmup: &[Vec<f32>],
    row: &[f32],
    want: &[f64],
) {
    let counts = histogram(&p, prompt, warmup, row);
    let (chi, df) = chi_square(&counts, want);
    let tv: f64 = counts
        .iter()
        .zip(want)
        .map(|(&c, &q)| (c as f64 / DRAWS as f64 - q).abs())
        .sum::<f64>()
        / 2.0;
    eprintln!(
        "{name}: chi2 {chi:.1} on {df} df (critical {:.1}), TV {tv:.4}",
        critical(df)
    );
    assert!(
        chi < critical(df),
        "{name}: chi2 {chi:.1} ≥ {:.1} on {df} df",
        critical(df)
    );
}

fn params(temperature: f32, top_k: i64, top_p: f32, min_p: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        ..SamplingParams::default()
    }
}

#[test]
fn temperature_top_k_top_p_min_p_match_the_exact_distribution() {
    let a = row_a(3_000);
    for (name, p) in [
        ("temperature 1", params(1.0, 0, 1.0, 0.0)),
        ("temperature 0.7 top_k 40", params(0.7, 40, 1.0, 0.0)),
        ("top_p 0.8", params(1.0, 0, 0.8, 0.0)),
        ("temperature 1.3 min_p 0.05", params(1.3, 0, 1.0, 0.05)),
        (
            "top_k 200 top_p 0.9 min_p 0.01",
            params(1.0, 200, 0.9, 0.01),
        ),
    ] {
        let want = exact(&a, &p);
        check(name, p, &[], &[], &a, &want);
    }
    let ties = row_ties();
    let p = params(1.0, 0, 0.9, 0.0);
    let want = exact(&ties, &p);
    check("top_p 0.9 into ties", p, &[], &[], &ties, &want);
}

#[test]
fn penalties_match_the_exact_distribution() {
    let a = row_a(3_000);
    // Two forced draws of token 5, then a draw from `a` with token 5
    // penalised for repetition and output (2 occurrences), prompt tokens for
    // repetition only.
    let mut forced = vec![0.0; a.len()];
    forced[5] = 100.0;
    let prompt: Vec<u32> = (0..3_000).step_by(7).collect();
    let p = SamplingParams {
        repetition_penalty: 1.3,
        presence_penalty: 0.4,
        frequency_penalty: 0.3,
        ..params(1.0, 0, 1.0, 0.0)
    };
    let mut penalised = a.clone();
    for &t in prompt.iter().chain([&5]) {
        let l = &mut penalised[t as usize];
        *l = if *l > 0.0 { *l / 1.3 } else { *l * 1.3 };
    }
    penalised[5] -= 2.0 * 0.3 + 0.4;
    let want = exact(&penalised, &p);
    check(
        "penalties",
        p,
        &prompt,
        &[forced.clone(), forced],
        &a,
        &want,
    );
}

#[test]
fn the_chi_square_test_rejects_a_wrong_distribution() {
    // Power check: the same draws judged against temperature 1.15.
    let a = row_a(3_000);
    let p = params(1.0, 0, 1.0, 0.0);
    let counts = histogram(&p, &[], &[], &a);
    let wrong = exact(&a, &params(1.15, 0, 1.0, 0.0));
    let (chi, df) = chi_square(&counts, &wrong);
    assert!(chi > critical(df), "chi2 {chi:.1} on {df} df");
}
