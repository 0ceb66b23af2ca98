//! Next-token selection for one sequence: penalties, temperature, top-k,
//! top-p, min-p, a seeded per-request RNG, stop conditions, and logprobs.
//!
//! Logprobs are those of the raw model distribution (log-softmax of the logits
//! before penalties and temperature), with the top-k alternatives, as vLLM
//! reports them by default.

use std::collections::{HashMap, HashSet};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{ModelError, Result};

/// Request-level sampling options (OpenAI / vLLM semantics).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1 disables.
    pub top_p: f32,
    /// 0 disables.
    pub min_p: f32,
    /// Makes sampling reproducible per request; `None` draws a fresh seed.
    pub seed: Option<u64>,
    /// 1 disables; > 1 discourages tokens seen in the prompt or output.
    pub repetition_penalty: f32,
    /// Subtracted once from tokens that appeared in the output.
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the output.
    pub frequency_penalty: f32,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub max_tokens: usize,
    /// Number of top alternatives to report with each token; `None` = no logprobs.
    pub logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            max_tokens: 16,
            logprobs: None,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Rejects values that have no meaning (negative temperature, top_p > 1...).
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(ModelError::Sampling(m.to_owned()));
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad("temperature must be >= 0");
        }
        if self.top_p.is_nan() || self.top_p <= 0.0 || self.top_p > 1.0 {
            return bad("top_p must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p must be in [0, 1]");
        }
        if !self.repetition_penalty.is_finite() || self.repetition_penalty <= 0.0 {
            return bad("repetition_penalty must be > 0");
        }
        if !self.presence_penalty.is_finite() || !self.frequency_penalty.is_finite() {
            return bad("penalties must be finite");
        }
        Ok(())
    }
}

/// Why a sequence finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token or EOS.
    Stop,
    /// `max_tokens` reached.
    Length,
}

/// One sampled token.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleOutput {
    pub token_id: u32,
    /// Raw log-probability of the chosen token (when logprobs were asked for).
    pub logprob: Option<f32>,
    /// Top alternatives `(token, raw logprob)`, best first.
    pub top: Vec<(u32, f32)>,
}

/// Sampling state of one sequence: its parameters, RNG and token history.
#[derive(Debug, Clone)]
pub struct SequenceSampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    prompt_tokens: HashSet<u32>,
    output_counts: HashMap<u32, u32>,
    generated: usize,
}

impl SequenceSampler {
    pub fn new(params: SamplingParams, prompt: &[u32]) -> Result<Self> {
        params.validate()?;
        let seed = params.seed.unwrap_or_else(|| rand::thread_rng().gen());
        Ok(SequenceSampler {
            rng: ChaCha8Rng::seed_from_u64(seed),
            prompt_tokens: prompt.iter().copied().collect(),
            output_counts: HashMap::new(),
            generated: 0,
            params,
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    pub fn num_generated(&self) -> usize {
        self.generated
    }

    /// Chooses the next token from one row of logits and records it.
    pub fn sample(&mut self, logits: &[f32]) -> Result<SampleOutput> {
        if logits.is_empty() {
            return Err(ModelError::Sampling("empty logits".into()));
        }
        let (logprob_of, top) = match self.params.logprobs {
            Some(k) => {
                let lp = log_softmax(logits);
                let top = top_k_pairs(&lp, k);
                (Some(lp), top)
            }
            None => (None, Vec::new()),
        };
        let mut work = logits.to_vec();
        self.apply_penalties(&mut work);
        let token = if self.params.temperature < 1e-5 {
            argmax(&work)
        } else {
            self.sample_filtered(&mut work)
        };
        let token_id = token as u32;
        *self.output_counts.entry(token_id).or_insert(0) += 1;
        self.generated += 1;
        Ok(SampleOutput {
            token_id,
            logprob: logprob_of.map(|lp| lp[token]),
            top,
        })
    }

    /// Whether generation stops after `token` (already counted by `sample`).
    pub fn finish_reason(&self, token: u32, eos_token_ids: &[u32]) -> Option<FinishReason> {
        if self.params.stop_token_ids.contains(&token)
            || (!self.params.ignore_eos && eos_token_ids.contains(&token))
        {
            Some(FinishReason::Stop)
        } else if self.generated >= self.params.max_tokens {
            Some(FinishReason::Length)
        } else {
            None
        }
    }

    fn apply_penalties(&self, logits: &mut [f32]) {
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            let seen = self
                .prompt_tokens
                .iter()
                .chain(self.output_counts.keys())
                .collect::<HashSet<_>>();
            for &t in seen {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&t, &n) in &self.output_counts {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= p.frequency_penalty * n as f32 + p.presence_penalty;
                }
            }
        }
    }

    /// Temperature, then top-k, top-p and min-p, then a draw from the rest.
    fn sample_filtered(&mut self, logits: &mut [f32]) -> usize {
        let p = &self.params;
        let inv_t = 1.0 / p.temperature;
        logits.iter_mut().for_each(|l| *l *= inv_t);
        // Candidates sorted by logit, best first. With top-k only k survive,
        // so sort only those (the vocabulary is ~150k).
        let mut cand: Vec<usize> = (0..logits.len()).collect();
        let by_logit = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.select_nth_unstable_by(p.top_k - 1, by_logit);
            cand.truncate(p.top_k);
        }
        cand.sort_unstable_by(by_logit);
        let max = logits[cand[0]];
        let mut probs: Vec<f32> = cand.iter().map(|&i| (logits[i] - max).exp()).collect();
        let z: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|q| *q /= z);
        let mut keep = probs.len();
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            for (i, q) in probs.iter().enumerate() {
                cum += q;
                if cum >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            let floor = p.min_p * probs[0];
            keep = keep.min(probs.iter().take_while(|&&q| q >= floor).count().max(1));
        }
        let total: f32 = probs[..keep].iter().sum();
        let mut u = self.rng.gen::<f32>() * total;
        for (i, q) in probs[..keep].iter().enumerate() {
            if u < *q {
                return cand[i];
            }
            u -= q;
        }
        cand[keep - 1]
    }
}

/// Index of the largest value (the lowest index among ties).
pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// `log_softmax(v)`, accumulated in f64.
pub fn log_softmax(v: &[f32]) -> Vec<f32> {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = v.iter().map(|&x| ((x - max) as f64).exp()).sum();
    let lse = max as f64 + sum.ln();
    v.iter().map(|&x| (x as f64 - lse) as f32).collect()
}

/// The `k` largest `(index, value)` pairs, best first (lower index on ties).
pub fn top_k_pairs(v: &[f32], k: usize) -> Vec<(u32, f32)> {
    let k = k.min(v.len());
    if k == 0 {
        return Vec::new();
    }
    let mut idx: Vec<usize> = (0..v.len()).collect();
    let cmp = |a: &usize, b: &usize| v[*b].total_cmp(&v[*a]).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, cmp);
        idx.truncate(k);
    }
    idx.sort_unstable_by(cmp);
    idx.into_iter().map(|i| (i as u32, v[i])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(p: SamplingParams) -> SequenceSampler {
        SequenceSampler::new(p, &[]).unwrap()
    }

    #[test]
    fn greedy_picks_argmax_and_reports_raw_logprobs() {
        let mut s = sampler(SamplingParams {
            logprobs: Some(2),
            ..SamplingParams::greedy()
        });
        let out = s.sample(&[0.1, 2.0, 1.0, -1.0]).unwrap();
        assert_eq!(out.token_id, 1);
        let lp = log_softmax(&[0.1, 2.0, 1.0, -1.0]);
        assert_eq!(out.logprob, Some(lp[1]));
        assert_eq!(out.top, vec![(1, lp[1]), (2, lp[2])]);
        let z: f64 = lp.iter().map(|&l| (l as f64).exp()).sum();
        assert!((z - 1.0).abs() < 1e-6);
    }

    #[test]
    fn seed_makes_sampling_reproducible() {
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.7).sin()).collect();
        let p = SamplingParams {
            temperature: 1.0,
            seed: Some(7),
            ..SamplingParams::default()
        };
        let draw = |p: &SamplingParams| {
            let mut s = sampler(p.clone());
            (0..20)
                .map(|_| s.sample(&logits).unwrap().token_id)
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(&p), draw(&p));
        let other = SamplingParams {
            seed: Some(8),
            ..p.clone()
        };
        assert_ne!(draw(&p), draw(&other));
    }

    #[test]
    fn top_k_top_p_min_p_restrict_the_support() {
        let logits = [5.0, 4.9, 1.0, 0.0, -3.0];
        for (p, allowed) in [
            (
                SamplingParams {
                    top_k: 2,
                    ..Default::default()
                },
                vec![0, 1],
            ),
            (
                SamplingParams {
                    top_p: 0.5,
                    ..Default::default()
                },
                vec![0],
            ),
            (
                SamplingParams {
                    min_p: 0.5,
                    ..Default::default()
                },
                vec![0, 1],
            ),
        ] {
            let mut s = sampler(SamplingParams { seed: Some(1), ..p });
            for _ in 0..200 {
                let t = s.sample(&logits).unwrap().token_id;
                assert!(allowed.contains(&t), "{t} not in {allowed:?}");
            }
        }
        // Without filters every token is eventually drawn at high temperature.
        let mut s = sampler(SamplingParams {
            temperature: 5.0,
            seed: Some(3),
            ..Default::default()
        });
        let seen: HashSet<u32> = (0..2000)
            .map(|_| s.sample(&logits).unwrap().token_id)
            .collect();
        assert_eq!(seen.len(), 5);
    }

    #[test]
    fn penalties_change_greedy_choice() {
        let logits = [1.0, 0.9, 0.5];
        // Repetition penalty on prompt token 0: 1.0 / 2 = 0.5 < 0.9.
        let mut s = SequenceSampler::new(
            SamplingParams {
                repetition_penalty: 2.0,
                ..SamplingParams::greedy()
            },
            &[0],
        )
        .unwrap();
        assert_eq!(s.sample(&logits).unwrap().token_id, 1);
        // Frequency penalty grows with each repetition.
        let mut s = sampler(SamplingParams {
            frequency_penalty: 0.3,
            ..SamplingParams::greedy()
        });
        assert_eq!(s.sample(&logits).unwrap().token_id, 0); // 1.0
        assert_eq!(s.sample(&logits).unwrap().token_id, 1); // 0.7 < 0.9
                                                            // Presence penalty applies once.
        let mut s = sampler(SamplingParams {
            presence_penalty: 0.05,
            ..SamplingParams::greedy()
        });
        assert_eq!(s.sample(&logits).unwrap().token_id, 0);
        assert_eq!(s.sample(&logits).unwrap().token_id, 0); // 0.95 > 0.9
    }

    #[test]
    fn stop_conditions() {
        let mut s = sampler(SamplingParams {
            stop_token_ids: vec![2],
            max_tokens: 2,
            ..SamplingParams::greedy()
        });
        s.sample(&[1.0, 0.0, 0.0]).unwrap();
        assert_eq!(s.finish_reason(0, &[1]), None);
        assert_eq!(s.finish_reason(1, &[1]), Some(FinishReason::Stop));
        assert_eq!(s.finish_reason(2, &[]), Some(FinishReason::Stop));
        s.sample(&[1.0, 0.0, 0.0]).unwrap();
        assert_eq!(s.finish_reason(0, &[1]), Some(FinishReason::Length));
        let ign = sampler(SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy()
        });
        assert_eq!(ign.finish_reason(1, &[1]), None);
        assert!(SequenceSampler::new(
            SamplingParams {
                top_p: 0.0,
                ..Default::default()
            },
            &[]
        )
        .is_err());
        assert!(SequenceSampler::new(
            SamplingParams {
                temperature: -1.0,
                ..Default::default()
            },
            &[]
        )
        .is_err());
    }
}
