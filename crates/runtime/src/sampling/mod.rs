//! Next-token selection for one sequence: token controls (`logit_bias`,
//! `allowed_token_ids`, `bad_words`, `min_tokens`), penalties, temperature,
//! top-k, top-p, min-p, a seeded per-request RNG, stop conditions, and
//! logprobs.
//!
//! Logprobs are those of the raw model distribution (log-softmax of the logits
//! before penalties and temperature), with the top-k alternatives, as vLLM
//! reports them by default.

pub mod constraint;
mod controls;
pub mod device;
mod kernels;
mod params;
mod penalties;
mod prompt;
mod select;
mod token_env;
pub mod tool_grammar;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{ModelError, Result};
use constraint::ConstraintState;
use controls::Controls;
use penalties::Penalties;

pub use constraint::{Constraint, Grammar, GrammarCompiler};
pub use controls::{TokenControls, MAX_LOGIT_BIAS};
pub use kernels::{argmax, pass_name, CPU_KERNELS_ENV};
pub use params::{InvalidSampling, SamplingParams, MAX_ADDITIVE_PENALTY, MAX_LOGPROBS};
pub use prompt::{prompt_logprob, PromptLogprob};
pub use select::top_k_pairs;

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
    /// The token ends the sequence as a stop token (a stop token id, or EOS
    /// unless `ignore_eos`): its text is not part of the output unless the
    /// request includes stop strings in it (vLLM's detokenizer skips it).
    pub stop_token: bool,
}

/// Sampling state of one sequence: its parameters, RNG and penalty counts.
/// `Send`, and a draw needs only `&mut self` and the row, so sequences can be
/// sampled in parallel outside any engine lock.
#[derive(Debug, Clone)]
pub struct SequenceSampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    penalties: Option<Penalties>,
    controls: Option<Controls>,
    constraint: Option<ConstraintState>,
    generated: usize,
    /// The RNG's seed, which also keys a device draw's Philox stream
    /// ([`device::RowPlan::seed`]).
    seed: u64,
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
            controls: Controls::new(&params.controls),
            constraint: params.constraint.as_ref().map(Constraint::start),
            generated: 0,
            seed,
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
    /// `eos` are the model's EOS ids (`min_tokens` holds them back, and
    /// they end the sequence unless `ignore_eos`). The row goes through the
    /// token controls, then the penalties, then the grammar's mask.
    pub fn sample(&mut self, logits: &[f32], eos: &[u32]) -> Result<SampleOutput> {
        if logits.is_empty() {
            return Err(ModelError::Sampling("empty logits".into()));
        }
        let raw = self.params.logprobs.map(|n| raw_logprobs(logits, n));
        let owned = self.edited(logits, eos)?;
        let row = owned.as_deref().unwrap_or(logits);
        let token = if self.params.temperature < device::GREEDY_BELOW {
            argmax(row)
        } else {
            self.draw(row)
        };
        self.accept(device::Drawn::of(logits, token, raw), eos)
    }

    /// The row after the token controls, the penalties and the grammar's
    /// mask; `None` when none applies (the row is read as it is). One
    /// definition of the edits for every backend: the row plan's
    /// ([`Self::plan_row`], [`device::RowPlan::edit`]), which a device
    /// applies where the logits are.
    fn edited(&mut self, logits: &[f32], eos: &[u32]) -> Result<Option<Vec<f32>>> {
        if self.controls.is_none() && self.penalties.is_none() && self.constraint.is_none() {
            return Ok(None);
        }
        let plan = self.plan_row(logits.len(), eos)?;
        Ok(plan.edits_row().then(|| plan.edited_copy(logits)))
    }

    /// Records a token drawn elsewhere (by [`Self::sample`], or by a
    /// device from [`Self::plan_row`]'s plan) as the next one.
    pub fn accept(&mut self, drawn: device::Drawn, eos: &[u32]) -> Result<SampleOutput> {
        let token_id = drawn.token;
        if let Some(p) = &mut self.penalties {
            p.record(token_id);
        }
        if let Some(c) = &mut self.controls {
            c.record(token_id);
        }
        if let Some(c) = &mut self.constraint {
            c.advance(token_id)?;
        }
        self.generated += 1;
        Ok(SampleOutput {
            token_id,
            logprob: drawn.logprob,
            top: drawn.top,
            stop_token: self.is_stop_token(token_id, eos),
        })
    }

    /// The next token's sampling as plain data for a row of `vocab`
    /// logits where they are (a device): the same edits, filters and
    /// logprobs as [`Self::sample`] (module [`device`]). `&mut`: the
    /// grammar computes its mask.
    pub fn plan_row(&mut self, vocab: usize, eos: &[u32]) -> Result<device::RowPlan> {
        let p = &self.params;
        let mut edits = Vec::new();
        let mut allowed = None;
        if let Some(c) = &self.controls {
            let stops: [&[u32]; 2] = [&p.stop_token_ids, eos];
            allowed = c.plan(&mut edits, self.generated, &stops, vocab);
        }
        if let Some(pen) = &self.penalties {
            pen.plan(&mut edits);
        }
        let mut edits = device::merge_edits(edits, vocab);
        if let Some(c) = &mut self.constraint {
            let words = c.mask_words(vocab)?;
            allowed = Some(match allowed {
                Some(a) => device::and_words(&a, &words),
                None => words,
            });
        }
        if allowed.is_some() {
            // Edits of tokens the mask removes change nothing.
            edits.retain(|e| device::allows(allowed.as_deref(), e.token));
        }
        let (repetition, presence, frequency) = match &self.penalties {
            Some(_) => (
                p.repetition_penalty,
                p.presence_penalty,
                p.frequency_penalty,
            ),
            None => (1.0, 0.0, 0.0),
        };
        Ok(device::RowPlan {
            temperature: p.temperature,
            top_k: p
                .top_k_limit()
                .map_or(0, |k| u32::try_from(k).unwrap_or(u32::MAX)),
            top_p: p.top_p,
            min_p: p.min_p,
            seed: self.seed,
            draw: self.generated as u64,
            logprobs: p.logprobs.map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
            repetition,
            presence,
            frequency,
            edits,
            allowed,
        })
    }

    /// Whether `token`, just counted by `sample`, stops the sequence as a
    /// stop token id or EOS: never before `min_tokens` tokens (vLLM's
    /// `check_stop`).
    fn is_stop_token(&self, token: u32, eos_token_ids: &[u32]) -> bool {
        let held = self
            .controls
            .as_ref()
            .is_some_and(|c| c.holds_stops(self.generated));
        !held
            && (self.params.stop_token_ids.contains(&token)
                || (!self.params.ignore_eos && eos_token_ids.contains(&token)))
    }

    /// Whether generation stops after `token` (already counted by `sample`).
    pub fn finish_reason(&self, token: u32, eos_token_ids: &[u32]) -> Option<FinishReason> {
        if self.is_stop_token(token, eos_token_ids)
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
        let out = s.sample(&[0.1, 2.0, 1.0, -1.0], &[]).unwrap();
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
                .map(|_| s.sample(&logits, &[]).unwrap().token_id)
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
                let t = s.sample(&logits, &[]).unwrap().token_id;
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
            .map(|_| s.sample(&logits, &[]).unwrap().token_id)
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
        assert_eq!(s.sample(&logits, &[]).unwrap().token_id, 1);
        // Frequency penalty grows with each repetition.
        let mut s = sampler(SamplingParams {
            frequency_penalty: 0.3,
            ..SamplingParams::greedy()
        });
        assert_eq!(s.sample(&logits, &[]).unwrap().token_id, 0); // 1.0
        assert_eq!(s.sample(&logits, &[]).unwrap().token_id, 1); // 0.7 < 0.9

        // Presence penalty applies once.
        let mut s = sampler(SamplingParams {
            presence_penalty: 0.05,
            ..SamplingParams::greedy()
        });
        assert_eq!(s.sample(&logits, &[]).unwrap().token_id, 0);
        assert_eq!(s.sample(&logits, &[]).unwrap().token_id, 0); // 0.95 > 0.9
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
        s.sample(&[1.0, 0.0, 0.0], &[]).unwrap();
        assert_eq!(s.finish_reason(0, &[1]), None);
        assert_eq!(s.finish_reason(1, &[1]), Some(FinishReason::Stop));
        assert_eq!(s.finish_reason(2, &[]), Some(FinishReason::Stop));
        s.sample(&[1.0, 0.0, 0.0], &[]).unwrap();
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

    #[test]
    fn min_tokens_holds_back_stop_ids_and_eos() {
        // Token 1 is EOS, 2 a stop id: greedy would pick 1, then 2.
        let mut s = sampler(SamplingParams {
            stop_token_ids: vec![2],
            controls: TokenControls {
                min_tokens: 2,
                ..Default::default()
            },
            ..SamplingParams::greedy()
        });
        let row = [0.0, 3.0, 2.0, 1.0];
        let out = s.sample(&row, &[1]).unwrap();
        assert_eq!((out.token_id, out.stop_token), (3, false));
        assert_eq!(s.finish_reason(out.token_id, &[1]), None);
        // Second token: still held (1 generated before it).
        assert_eq!(s.sample(&row, &[1]).unwrap().token_id, 3);
        // Two generated: EOS is free again and stops.
        let out = s.sample(&row, &[1]).unwrap();
        assert_eq!((out.token_id, out.stop_token), (1, true));
        assert_eq!(s.finish_reason(1, &[1]), Some(FinishReason::Stop));
        // ignore_eos: EOS is no stop token (though still masked by min_tokens).
        let mut s = sampler(SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy()
        });
        let out = s.sample(&row, &[1]).unwrap();
        assert_eq!((out.token_id, out.stop_token), (1, false));
    }

    #[test]
    fn controls_act_before_penalties_and_keep_seeded_draws_reproducible() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.3).cos()).collect();
        let p = SamplingParams {
            temperature: 1.0,
            seed: Some(11),
            presence_penalty: 1.0,
            controls: TokenControls {
                allowed_token_ids: Some(vec![3, 7, 9, 20]),
                logit_bias: vec![(9, -100.0)],
                bad_words: vec![vec![7, 7]],
                ..Default::default()
            },
            ..SamplingParams::default()
        };
        let run = |p: &SamplingParams| {
            let mut s = sampler(p.clone());
            (0..200)
                .map(|_| s.sample(&logits, &[]).unwrap().token_id)
                .collect::<Vec<_>>()
        };
        let a = run(&p);
        assert_eq!(a, run(&p), "same seed, same tokens");
        assert!(a.iter().all(|t| [3, 7, 20].contains(t)), "{a:?}");
        assert!(a.windows(2).all(|w| w != [7, 7]), "bad word 7 7 drawn");
        // +100 forces a token under greedy whatever the penalties do.
        let mut s = sampler(SamplingParams {
            frequency_penalty: 2.0,
            controls: TokenControls {
                logit_bias: vec![(42, 100.0)],
                ..Default::default()
            },
            ..SamplingParams::greedy()
        });
        for _ in 0..10 {
            assert_eq!(s.sample(&logits, &[]).unwrap().token_id, 42);
        }
    }
}
