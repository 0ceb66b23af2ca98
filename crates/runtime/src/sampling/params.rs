//! Request-level sampling parameters and their one validation.

use super::constraint::Constraint;
use super::controls::TokenControls;

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
    /// vLLM's `prompt_logprobs`: each prompt token's logprob and rank with
    /// this many alternatives; `None` = none. The engine computes the whole
    /// prompt for it (no prefix-cache hit: every position's logits count).
    pub prompt_logprobs: Option<usize>,
    /// A grammar the output must follow (structured outputs, forced tool calls).
    pub constraint: Option<Constraint>,
    /// `logit_bias`, `allowed_token_ids`, `bad_words`, `min_tokens`.
    pub controls: TokenControls,
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
            prompt_logprobs: None,
            constraint: None,
            controls: TokenControls::default(),
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
    /// and [`SequenceSampler::new`](super::SequenceSampler::new) at the engine's, so no caller of the
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
        if let Some(k) = self.prompt_logprobs.filter(|&k| k > MAX_LOGPROBS) {
            return bad(
                "prompt_logprobs",
                format!(
                    "prompt_logprobs: at most {MAX_LOGPROBS} alternatives per token are served, \
                     got {k}"
                ),
            );
        }
        self.controls.validate(self.max_tokens)
    }

    /// How many candidates top-k keeps; `None` when disabled.
    pub fn top_k_limit(&self) -> Option<usize> {
        usize::try_from(self.top_k).ok().filter(|&k| k > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SequenceSampler;

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
}
