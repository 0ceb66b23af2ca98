//! vLLM's per-token controls: `allowed_token_ids`, `bad_words`, `min_tokens`
//! and OpenAI's `logit_bias`. They act on the row before the penalties, in
//! vLLM v1's order (`Sampler.apply_logits_processors`): the allowed-ids
//! mask, the bad-words mask, the logit bias, the min-tokens mask. Each row is
//! processed on its own from the sequence's own state, so a sequence samples
//! the same tokens whatever else shares its batch.

use super::device::Edit;
use super::InvalidSampling;

/// Largest |bias| of `logit_bias` (OpenAI's range; ±100 bans or forces a
/// token in practice).
pub const MAX_LOGIT_BIAS: f32 = 100.0;

/// The request's token controls; the default (all empty) does nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenControls {
    /// `(token, bias)`: the bias is added to the token's logit.
    pub logit_bias: Vec<(u32, f32)>,
    /// Only these tokens may be sampled; `None` allows all.
    pub allowed_token_ids: Option<Vec<u32>>,
    /// Banned token sequences (vLLM's `bad_words`, tokenized by the caller):
    /// a sequence's last token is masked whenever the output so far ends
    /// with the rest of it.
    pub bad_words: Vec<Vec<u32>>,
    /// Stop token ids and EOS are masked, and no stop condition ends the
    /// sequence, until this many tokens were generated.
    pub min_tokens: usize,
}

impl TokenControls {
    /// The checks that need no vocabulary; `max_tokens` bounds `min_tokens`.
    pub fn validate(&self, max_tokens: usize) -> Result<(), InvalidSampling> {
        let bad = |field: &'static str, message: String| Err(InvalidSampling { field, message });
        let m = MAX_LOGIT_BIAS;
        if let Some((t, b)) = self.logit_bias.iter().find(|(_, b)| !(-m..=m).contains(b)) {
            return bad(
                "logit_bias",
                format!("logit_bias: the bias of token {t} must be in [-{m}, {m}], got {b}"),
            );
        }
        if self.allowed_token_ids.as_ref().is_some_and(Vec::is_empty) {
            return bad(
                "allowed_token_ids",
                "allowed_token_ids must not be empty (nothing could be sampled)".into(),
            );
        }
        if self.bad_words.iter().any(Vec::is_empty) {
            return bad(
                "bad_words",
                "bad_words must not contain an empty word".into(),
            );
        }
        if self.min_tokens > max_tokens {
            return bad(
                "min_tokens",
                format!(
                    "min_tokens must be less than or equal to max_tokens={max_tokens}, got {}",
                    self.min_tokens
                ),
            );
        }
        Ok(())
    }

    /// Every token id named is inside a vocabulary of `vocab` tokens.
    pub fn validate_vocab(&self, vocab: usize) -> Result<(), InvalidSampling> {
        let outside =
            |mut ids: Box<dyn Iterator<Item = u32> + '_>| ids.find(|&t| t as usize >= vocab);
        let fields: [(&'static str, Option<u32>); 3] = [
            (
                "logit_bias",
                outside(Box::new(self.logit_bias.iter().map(|&(t, _)| t))),
            ),
            (
                "allowed_token_ids",
                outside(Box::new(self.allowed_token_ids.iter().flatten().copied())),
            ),
            (
                "bad_words",
                outside(Box::new(self.bad_words.iter().flatten().copied())),
            ),
        ];
        match fields.into_iter().find_map(|(f, t)| Some((f, t?))) {
            Some((field, t)) => Err(InvalidSampling {
                field,
                message: format!("{field}: token id {t} is outside the vocabulary (size {vocab})"),
            }),
            None => Ok(()),
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// The controls of one sequence, with the output it has to remember.
#[derive(Debug, Clone)]
pub(super) struct Controls {
    /// Sorted, deduplicated.
    allowed: Option<Vec<u32>>,
    logit_bias: Vec<(u32, f32)>,
    bad_words: Vec<Vec<u32>>,
    min_tokens: usize,
    /// The tokens generated so far (kept only for `bad_words`).
    output: Vec<u32>,
}

impl Controls {
    /// `None` when nothing is asked for (the default), so a plain request
    /// pays nothing.
    pub fn new(c: &TokenControls) -> Option<Self> {
        if c.is_empty() {
            return None;
        }
        let allowed = c.allowed_token_ids.clone().map(|mut a| {
            a.sort_unstable();
            a.dedup();
            a
        });
        Some(Controls {
            allowed,
            logit_bias: c.logit_bias.clone(),
            bad_words: c.bad_words.clone(),
            min_tokens: c.min_tokens,
            output: Vec::new(),
        })
    }

    /// Whether stop tokens and EOS are still held back after `generated`
    /// tokens.
    pub fn holds_stops(&self, generated: usize) -> bool {
        generated < self.min_tokens
    }

    /// The controls as a device plan's edits (banned tokens, biases) and
    /// allowed bitmask of `vocab` tokens, for the row after `generated`
    /// tokens; `stops` are the ids `min_tokens` holds back (the request's
    /// stop ids and EOS). Ids beyond the row are ignored.
    pub fn plan(
        &self,
        edits: &mut Vec<Edit>,
        generated: usize,
        stops: &[&[u32]],
        vocab: usize,
    ) -> Option<Vec<u32>> {
        let ban = |t: u32| Edit {
            banned: true,
            ..Edit::new(t)
        };
        for word in &self.bad_words {
            if let Some((&last, prefix)) = word.split_last() {
                if self.output.ends_with(prefix) {
                    edits.push(ban(last));
                }
            }
        }
        for &(t, bias) in &self.logit_bias {
            edits.push(Edit {
                bias: Some(bias),
                ..Edit::new(t)
            });
        }
        if self.holds_stops(generated) {
            edits.extend(stops.iter().copied().flatten().map(|&t| ban(t)));
        }
        self.allowed
            .as_ref()
            .map(|a| super::device::words_allowing(a, vocab))
    }

    /// Remembers one generated token.
    pub fn record(&mut self, token: u32) {
        if !self.bad_words.is_empty() {
            self.output.push(token);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::device::{merge_edits, RowPlan};

    const NEG: f32 = f32::NEG_INFINITY;

    /// `row` with the controls applied after `generated` tokens (through
    /// the row plan, the one definition of the edits).
    fn apply(c: &Controls, row: &[f32], generated: usize, stops: &[&[u32]]) -> Vec<f32> {
        let mut edits = Vec::new();
        let allowed = c.plan(&mut edits, generated, stops, row.len());
        let plan = RowPlan {
            edits: merge_edits(edits, row.len()),
            allowed,
            ..RowPlan::greedy()
        };
        let mut out = row.to_vec();
        plan.edit(&mut out);
        out
    }

    #[test]
    fn each_control_in_isolation() {
        let row = [1.0, 2.0, 3.0, 4.0];
        let c = |t: TokenControls| Controls::new(&t).unwrap();
        let allowed = c(TokenControls {
            allowed_token_ids: Some(vec![2, 0, 2, 99]),
            ..Default::default()
        });
        assert_eq!(apply(&allowed, &row, 0, &[]), [1.0, NEG, 3.0, NEG]);
        let bias = c(TokenControls {
            logit_bias: vec![(0, 100.0), (3, -100.0), (7, 5.0)],
            ..Default::default()
        });
        assert_eq!(apply(&bias, &row, 0, &[]), [101.0, 2.0, 3.0, -96.0]);
        let min = c(TokenControls {
            min_tokens: 2,
            ..Default::default()
        });
        assert_eq!(apply(&min, &row, 1, &[&[3], &[1]]), [1.0, NEG, 3.0, NEG]);
        assert_eq!(apply(&min, &row, 2, &[&[3], &[1]]), row);
        assert!(Controls::new(&TokenControls::default()).is_none());
    }

    #[test]
    fn bad_words_mask_the_last_token_when_the_prefix_matches() {
        let row = [0.0; 5];
        let mut c = Controls::new(&TokenControls {
            bad_words: vec![vec![4], vec![1, 2, 3]],
            ..Default::default()
        })
        .unwrap();
        // A one-token word is always banned; the longer one only after 1, 2.
        assert_eq!(apply(&c, &row, 0, &[]), [0.0, 0.0, 0.0, 0.0, NEG]);
        c.record(1);
        assert_eq!(apply(&c, &row, 1, &[]), [0.0, 0.0, 0.0, 0.0, NEG]);
        c.record(2);
        assert_eq!(apply(&c, &row, 2, &[]), [0.0, 0.0, 0.0, NEG, NEG]);
        c.record(0);
        assert_eq!(apply(&c, &row, 3, &[]), [0.0, 0.0, 0.0, 0.0, NEG]);
    }

    #[test]
    fn validation_names_the_field() {
        let field = |t: TokenControls| t.validate(10).and(t.validate_vocab(5)).unwrap_err().field;
        let d = TokenControls::default;
        let cases = [
            (
                TokenControls {
                    logit_bias: vec![(1, 100.5)],
                    ..d()
                },
                "logit_bias",
            ),
            (
                TokenControls {
                    logit_bias: vec![(1, f32::NAN)],
                    ..d()
                },
                "logit_bias",
            ),
            (
                TokenControls {
                    logit_bias: vec![(5, 1.0)],
                    ..d()
                },
                "logit_bias",
            ),
            (
                TokenControls {
                    allowed_token_ids: Some(vec![]),
                    ..d()
                },
                "allowed_token_ids",
            ),
            (
                TokenControls {
                    allowed_token_ids: Some(vec![1, 5]),
                    ..d()
                },
                "allowed_token_ids",
            ),
            (
                TokenControls {
                    bad_words: vec![vec![]],
                    ..d()
                },
                "bad_words",
            ),
            (
                TokenControls {
                    bad_words: vec![vec![1, 9]],
                    ..d()
                },
                "bad_words",
            ),
            (
                TokenControls {
                    min_tokens: 11,
                    ..d()
                },
                "min_tokens",
            ),
        ];
        for (t, f) in cases {
            assert_eq!(field(t), f);
        }
        let ok = TokenControls {
            logit_bias: vec![(4, -100.0)],
            allowed_token_ids: Some(vec![0, 4]),
            bad_words: vec![vec![1, 2]],
            min_tokens: 10,
        };
        assert!(ok.validate(10).and(ok.validate_vocab(5)).is_ok());
    }
}
