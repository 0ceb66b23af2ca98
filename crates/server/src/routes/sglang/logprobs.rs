//! SGLang's input-token logprobs (`return_logprob` with
//! `logprob_start_len`), from the engine's prompt logprobs (vLLM's
//! `prompt_logprobs`: entry `j` scores prompt token `j + 1`).
//!
//! SGLang reports `input_ids[start:]`, the first `null` whatever `start`
//! is (its scheduler's `[None] + input_token_logprobs[:-1]`), each later
//! one `[logprob, token_id, text]` given the tokens before it; with
//! `top_logprobs_num` k, `input_top_logprobs` is `null` then the k best of
//! each position. `logprob_start_len: -1`, SGLang's default, starts at the
//! last prompt token: one `null` entry, no forward work.

use agentd_runtime::{PromptLogprob, Tokenizer};
use serde_json::{json, Value};

use crate::error::ApiError;

/// The first prompt position reported, from `logprob_start_len` (-1: the
/// last token); a position past the prompt is a 400.
pub fn start(logprob_start_len: i64, prompt_len: usize) -> Result<usize, ApiError> {
    let last = prompt_len.saturating_sub(1);
    match usize::try_from(logprob_start_len) {
        Err(_) => Ok(last),
        Ok(s) if s < prompt_len => Ok(s),
        Ok(s) => Err(ApiError::invalid(
            "logprob_start_len",
            format!("logprob_start_len ({s}) must be less than the prompt's length ({prompt_len})"),
        )),
    }
}

/// `input_token_logprobs` and `input_top_logprobs` (the latter `None`
/// unless alternatives were asked for).
#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    pub tokens: Value,
    pub top: Option<Value>,
}

/// SGLang's input logprobs of `ids[start..]` from the engine's `entries`
/// (`None`: none computed, so only the first entry, `null`), with `k`
/// alternatives and each token's text when `tokenizer` is given. -inf is
/// clamped to -9999.0 as vLLM does for JSON.
pub fn render(
    ids: &[u32],
    start: usize,
    entries: Option<&[PromptLogprob]>,
    k: u32,
    tokenizer: Option<&Tokenizer>,
) -> Result<Input, ApiError> {
    let text = |t: u32| -> Result<Value, ApiError> {
        Ok(match tokenizer {
            Some(tok) => json!(tok.decode(&[t], false)?),
            None => Value::Null,
        })
    };
    let triple =
        |lp: f32, t: u32| -> Result<Value, ApiError> { Ok(json!([lp.max(-9999.0), t, text(t)?])) };
    let mut tokens = Vec::new();
    let mut top = Vec::new();
    for (p, &t) in ids.iter().enumerate().skip(start) {
        let entry = (p > start)
            .then(|| entries.and_then(|e| e.get(p - 1)))
            .flatten();
        match entry {
            Some(e) => {
                tokens.push(triple(e.logprob, t)?);
                let alts = e.top.iter().map(|&(a, lp)| triple(lp, a));
                top.push(Value::Array(alts.collect::<Result<_, _>>()?));
            }
            None => {
                tokens.push(json!([Value::Null, t, text(t)?]));
                top.push(Value::Null);
            }
        }
    }
    Ok(Input {
        tokens: Value::Array(tokens),
        top: (k > 0).then_some(Value::Array(top)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(token_id: u32, logprob: f32) -> PromptLogprob {
        PromptLogprob {
            token_id,
            logprob,
            rank: 1,
            top: vec![(9, -0.5), (token_id, logprob)],
        }
    }

    #[test]
    fn start_positions() {
        assert_eq!(start(-1, 5).unwrap(), 4);
        assert_eq!(start(0, 5).unwrap(), 0);
        assert_eq!(start(4, 5).unwrap(), 4);
        assert!(start(5, 5).is_err());
    }

    #[test]
    fn the_first_reported_token_is_null_the_rest_scored_by_the_position_before() {
        let ids = [7, 8, 3, 4];
        let entries = [entry(8, -1.0), entry(3, f32::NEG_INFINITY), entry(4, -0.25)];
        let r = render(&ids, 1, Some(&entries), 2, None).unwrap();
        assert_eq!(
            r.tokens,
            json!([[null, 8, null], [-9999.0, 3, null], [-0.25, 4, null]])
        );
        let top = r.top.unwrap();
        assert_eq!(top[0], Value::Null);
        assert_eq!(top[2], json!([[-0.5, 9, null], [-0.25, 4, null]]));
        // From 0: every prompt token; -1 (the last): one null, no entries needed.
        let all = render(&ids, 0, Some(&entries), 0, None).unwrap();
        assert_eq!(all.tokens.as_array().unwrap().len(), 4);
        assert_eq!(all.top, None);
        let last = render(&ids, 3, None, 1, None).unwrap();
        assert_eq!(last.tokens, json!([[null, 4, null]]));
        assert_eq!(last.top, Some(json!([null])));
    }
}
