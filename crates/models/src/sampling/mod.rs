//! Next-token selection for one sequence: penalties, temperature, top-k,
//! top-p, min-p, a seeded per-request RNG, stop conditions, and logprobs.
//!
//! Logprobs are those of the raw model distribution (log-softmax of the logits
//! before penalties and temperature), with the top-k alternatives, as vLLM
//! reports them by default.

pub mod constraint;
mod kernels;
mod penalties;
mod select;
mod token_env;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{ModelError, Result};
use constraint::ConstraintState;
use penalties::Penalties;

pub use constraint::{Constraint, Grammar, GrammarCompiler};
pub use kernels::argmax;
pub use select::top_k_pairs;

/// Most alternatives `logprobs` may ask for per token (OpenAI's limit).
pub const MAX_LOGPROBS: usize = 20;

/// Largest |presence_penalty| and |frequency_penalty| (OpenAI's range).
pub const MAX_ADDITIVE_PENALTY: f32 = 2.0;

/// Request-level sampling options (OpenAI / vLLM semantics).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 or -1 disables (vLLM's
    /// convention, so a client's -1 reaches [`SamplingParams::validate`]
    /// unchanged).
    pub top_k: i64,
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
    /// A grammar the output must follow (structured outputs, forced tool calls).
    pub constraint: Option<Constraint>,
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
            constraint: None,
        }
    }
}

/// A sampling parameter with no meaning, named by its OpenAI / vLLM field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidSampling {
    /// The request field (`temperature`, `top_k`, `presence_penalty`, ...).
    pub field: &'static str,
    pub message: String,
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// The one validation of every field, each refusal naming its field:
    /// the server calls it at the HTTP boundary (before any side effect)
    /// and [`SequenceSampler::new`] at the engine's, so no caller of the
    /// engine can bypass it.
    pub fn validate(&self) -> std::result::Result<(), InvalidSampling> {
        let bad = |field: &'static str, message: String| Err(InvalidSampling { field, message });
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad(
                "temperature",
                format!("temperature must be >= 0, got {}", self.temperature),
            );
        }
        if self.top_k < -1 {
            return bad(
                "top_k",
                format!(
                    "top_k must be -1 or 0 (disabled) or positive, got {}",
                    self.top_k
                ),
            );
        }
        if self.top_p.is_nan() || self.top_p <= 0.0 || self.top_p > 1.0 {
            return bad(
                "top_p",
                format!("top_p must be in (0, 1], got {}", self.top_p),
            );
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(
                "min_p",
                format!("min_p must be in [0, 1], got {}", self.min_p),
            );
        }
        if !self.repetition_penalty.is_finite() || self.repetition_penalty <= 0.0 {
            return bad(
                "repetition_penalty",
                format!(
                    "repetition_penalty must be > 0, got {}",
                    self.repetition_penalty
                ),
            );
        }
        let m = MAX_ADDITIVE_PENALTY;
        for (field, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            // Also refuses NaN and infinities.
            if !(-m..=m).contains(&v) {
                return bad(field, format!("{field} must be in [-{m}, {m}], got {v}"));
            }
        }
        if self.max_tokens == 0 {
            return bad("max_tokens", "max_tokens must be at least 1".into());
        }
        if let Some(k) = self.logprobs.filter(|&k| k > MAX_LOGPROBS) {
            return bad(
                "logprobs",
                format!(
                    "logprobs: at most {MAX_LOGPROBS} alternatives per token are served, got {k}"
                ),
            );
        }
        Ok(())
    }

    /// How many candidates top-k keeps; `None` when disabled.
    pub fn top_k_limit(&self) -> Option<usize> {
        usize::try_from(self.top_k).ok().filter(|&k| k > 0)
    }
}

/// Why a sequence finished: the one finish reason of the stack (the
/// sampler decides `Stop` and `Length`; the engine adds the other two).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token or EOS (or a completed grammar).
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The client went away or the program was released.
    Cancelled,
    /// The engine could not continue the request (a model or sampling
    /// failure; the server log says which).
    Error,
}

impl FinishReason {
    /// The OpenAI / vLLM `finish_reason` string.
    pub fn as_openai(&self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Cancelled => "abort",
            Self::Error => "error",
        }
    }
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

/// Sampling state of one sequence: its parameters, RNG and penalty counts.
/// `Send`, and a draw needs only `&mut self` and the row, so sequences can be
/// sampled in parallel outside any engine lock.
#[derive(Debug, Clone)]
pub struct SequenceSampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    penalties: Option<Penalties>,
    constraint: Option<ConstraintState>,
    generated: usize,
}

impl SequenceSampler {
    /// Validates `params` ([`SamplingParams::validate`]) and sets up the
    /// penalties (over the prompt) and the grammar matcher: O(prompt), so
    /// callers build it before taking any lock.
    pub fn new(
        params: SamplingParams,
        prompt: &[u32],
    ) -> std::result::Result<Self, InvalidSampling> {
        params.validate()?;
        let seed = params.seed.unwrap_or_else(|| rand::thread_rng().gen());
        Ok(SequenceSampler {
            rng: ChaCha8Rng::seed_from_u64(seed),
            penalties: Penalties::new(&params, prompt),
            constraint: params.constraint.as_ref().map(Constraint::start),
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
        let raw = self.params.logprobs.map(|n| raw_logprobs(logits, n));
        let mut owned = self.penalties.as_ref().map(|p| p.apply(logits));
        if let Some(c) = &mut self.constraint {
            c.mask(owned.get_or_insert_with(|| logits.to_vec()))?;
        }
        let row = owned.as_deref().unwrap_or(logits);
        let token = if self.params.temperature < 1e-5 {
            argmax(row)
        } else {
            self.draw(row)
        };
        let token_id = token as u32;
        if let Some(p) = &mut self.penalties {
            p.record(token_id);
        }
        if let Some(c) = &mut self.constraint {
            c.advance(token_id)?;
        }
        self.generated += 1;
        let (logprob, top) = match raw {
            Some((lse, top)) => (Some((logits[token] as f64 - lse) as f32), top),
            None => (None, Vec::new()),
        };
        Ok(SampleOutput {
            token_id,
            logprob,
            top,
        })
    }

    /// Whether generation stops after `token` (already counted by `sample`).
    pub fn finish_reason(&self, token: u32, eos_token_ids: &[u32]) -> Option<FinishReason> {
        if self.params.stop_token_ids.contains(&token)
            || (!self.params.ignore_eos && eos_token_ids.contains(&token))
            || self
                .constraint
                .as_ref()
                .is_some_and(ConstraintState::is_finished)
        {
            Some(FinishReason::Stop)
        } else if self.generated >= self.params.max_tokens {
            Some(FinishReason::Length)
        } else {
            None
        }
    }

    /// A draw at the temperature, from what top-k, top-p and min-p keep.
    /// Temperature alone is one inverse-CDF walk over the row (max pass,
    /// normaliser pass, one block re-weighed); filters work on candidates.
    fn draw(&mut self, row: &[f32]) -> usize {
        let p = &self.params;
        let inv_t = 1.0 / p.temperature;
        let m = kernels::max(row);
        if !m.is_finite() {
            // All -inf/NaN (nothing to weigh) or a +inf logit (certain).
            return argmax(row);
        }
        let u = self.rng.gen::<f64>();
        let filtered =
            p.top_k_limit().is_some_and(|k| k < row.len()) || p.top_p < 1.0 || p.min_p > 0.0;
        if !filtered {
            let mut blocks = Vec::new();
            let z = kernels::block_sums(row, m, inv_t, &mut blocks);
            return kernels::draw(row, m, inv_t, &blocks, u * z);
        }
        let kept = select::kept(row, m, inv_t, p);
        select::draw(&kept, u).map_or_else(|| argmax(row), |t| t as usize)
    }
}

/// `log Σ e^x` of the raw row and its `n` best `(token, logprob)`, by one max
/// pass, one exp-sum pass and a partial selection.
fn raw_logprobs(logits: &[f32], n: usize) -> (f64, Vec<(u32, f32)>) {
    let m = kernels::max(logits);
    let mut blocks = Vec::new();
    let lse = m as f64 + kernels::block_sums(logits, m, 1.0, &mut blocks).ln();
    let top = top_k_pairs(logits, n)
        .into_iter()
        .map(|(t, x)| (t, (x as f64 - lse) as f32))
        .collect();
    (lse, top)
}

/// `log_softmax(v)`, accumulated in f64.
pub fn log_softmax(v: &[f32]) -> Vec<f32> {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = v.iter().map(|&x| ((x - max) as f64).exp()).sum();
    let lse = max as f64 + sum.ln();
    v.iter().map(|&x| (x as f64 - lse) as f32).collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

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
        // The sampler's one-pass log-softmax agrees with the f64 reference.
        let lp = log_softmax(&[0.1, 2.0, 1.0, -1.0]);
        let close = |a: f32, b: f32| (a - b).abs() < 1e-6;
        assert!(close(out.logprob.unwrap(), lp[1]));
        assert_eq!(out.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 2]);
        assert!(close(out.top[0].1, lp[1]) && close(out.top[1].1, lp[2]));
        let z: f64 = lp.iter().map(|&l| (l as f64).exp()).sum();
        assert!((z - 1.0).abs() < 1e-6);
    }

    #[test]
    fn sampler_can_move_to_a_worker_thread() {
        fn send<T: Send + 'static>(_: &T) {}
        send(&sampler(SamplingParams::default()));
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
    fn validation_names_the_field_it_refuses() {
        let d = SamplingParams::default;
        for (p, field) in [
            (
                SamplingParams {
                    temperature: f32::NAN,
                    ..d()
                },
                "temperature",
            ),
            (SamplingParams { top_k: -2, ..d() }, "top_k"),
            (SamplingParams { top_p: 0.0, ..d() }, "top_p"),
            (SamplingParams { min_p: 1.5, ..d() }, "min_p"),
            (
                SamplingParams {
                    repetition_penalty: 0.0,
                    ..d()
                },
                "repetition_penalty",
            ),
            (
                SamplingParams {
                    presence_penalty: 2.5,
                    ..d()
                },
                "presence_penalty",
            ),
            (
                SamplingParams {
                    frequency_penalty: f32::INFINITY,
                    ..d()
                },
                "frequency_penalty",
            ),
            (
                SamplingParams {
                    max_tokens: 0,
                    ..d()
                },
                "max_tokens",
            ),
            (
                SamplingParams {
                    logprobs: Some(MAX_LOGPROBS + 1),
                    ..d()
                },
                "logprobs",
            ),
        ] {
            let e = p.validate().expect_err(field);
            assert_eq!(e.field, field, "{e}");
            assert!(
                e.message.starts_with(field),
                "the message names {field}: {e}"
            );
            // The sampler refuses the same, with the same error.
            assert_eq!(SequenceSampler::new(p, &[]).err(), Some(e));
        }
        // -1 and 0 disable top-k (vLLM), as do values past the vocabulary.
        for (k, limit) in [(-1, None), (0, None), (5, Some(5))] {
            let p = SamplingParams { top_k: k, ..d() };
            assert!(p.validate().is_ok());
            assert_eq!(p.top_k_limit(), limit);
        }
    }

    #[test]
    fn finish_reasons_name_openai_strings() {
        let all = [
            FinishReason::Stop,
            FinishReason::Length,
            FinishReason::Cancelled,
            FinishReason::Error,
        ];
        let names: Vec<&str> = all.iter().map(FinishReason::as_openai).collect();
        assert_eq!(names, ["stop", "length", "abort", "error"]);
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
