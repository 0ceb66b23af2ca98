//! vLLM's `prompt_logprobs` request field and response field.
//!
//! Request: an integer k, the alternatives per prompt position (0: only the
//! prompt's own token). vLLM refuses it with `stream: true` (unless 0,
//! which then returns nothing), a negative value other than -1, and more
//! than `max_logprobs` (20 by default; -1, the whole vocabulary, is more).
//!
//! Response: one entry per prompt token, the first `null` (nothing
//! precedes it), then `{token_id: {logprob, rank, decoded_token}}` with the
//! prompt's token and the k best: on each choice in `/v1/completions`, on
//! the response in `/v1/chat/completions`, as vLLM places them.

use std::collections::BTreeMap;

use agentd_runtime::{PromptLogprob, Tokenizer};
use serde::Serialize;

use crate::app::SharedState;
use crate::error::ApiError;
use crate::generation::Collected;
use crate::protocol::CommonParams;
use crate::sampling::MAX_LOGPROBS;

/// vLLM's `Logprob` as the response shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Entry {
    pub logprob: f32,
    pub rank: usize,
    pub decoded_token: String,
}

/// The response field: `null` for the first prompt token, then one map
/// per token (keys are token ids, as strings in JSON).
pub type Rendered = Vec<Option<BTreeMap<u32, Entry>>>;

/// The k the request asks the engine for: `None` when it asks for none,
/// or only for what a stream does not return (`0` with `stream: true`).
pub fn requested(c: &CommonParams) -> Result<Option<usize>, ApiError> {
    let Some(k) = c.prompt_logprobs else {
        return Ok(None);
    };
    let field = "prompt_logprobs";
    if c.stream && (k > 0 || k == -1) {
        return Err(ApiError::invalid(
            field,
            "`prompt_logprobs` are not available when `stream=True`.",
        ));
    }
    if k < -1 {
        return Err(ApiError::invalid(
            field,
            format!("`prompt_logprobs` must be a positive value or -1, got {k}"),
        ));
    }
    if k == -1 {
        return Err(ApiError::invalid(
            field,
            format!(
                "prompt_logprobs: -1 asks for the whole vocabulary; at most {MAX_LOGPROBS} \
                 alternatives per token are served (vLLM's default max_logprobs)"
            ),
        ));
    }
    if c.stream {
        return Ok(None);
    }
    // k >= 0 here; more than MAX_LOGPROBS is refused by `SamplingParams::validate`.
    Ok(Some(usize::try_from(k).unwrap_or(usize::MAX)))
}

/// The response field from the engine's entries (entry `j` scores prompt
/// token `j + 1`). `-inf` becomes -9999.0, as vLLM clamps it for JSON.
pub fn render(entries: &[PromptLogprob], tokenizer: &Tokenizer) -> Result<Rendered, ApiError> {
    let clamp = |x: f32| x.max(-9999.0);
    let mut out: Rendered = Vec::with_capacity(entries.len() + 1);
    out.push(None);
    for e in entries {
        let mut map = BTreeMap::new();
        map.insert(
            e.token_id,
            Entry {
                logprob: clamp(e.logprob),
                rank: e.rank,
                decoded_token: tokenizer.decode(&[e.token_id], false)?,
            },
        );
        // The k best, ranked 1..=k (they replace the prompt token's entry
        // when it is among them, as in vLLM's dict).
        for (i, &(t, lp)) in e.top.iter().enumerate() {
            map.insert(
                t,
                Entry {
                    logprob: clamp(lp),
                    rank: i + 1,
                    decoded_token: tokenizer.decode(&[t], false)?,
                },
            );
        }
        out.push(Some(map));
    }
    Ok(out)
}

/// Per prompt of a response whose choices are `done` (`n` per prompt), the
/// rendered prompt logprobs its first choice brought; detokenizing (k + 1
/// tokens a position) runs off the runtime.
pub async fn per_prompt(
    state: &SharedState,
    done: &mut [(usize, bool, Collected)],
    n: usize,
) -> Result<Vec<Option<Rendered>>, ApiError> {
    let prompts = done.len().div_ceil(n.max(1));
    let mut entries: Vec<Option<Vec<PromptLogprob>>> = vec![None; prompts];
    for (index, _, d) in done.iter_mut() {
        if let (Some(e), Some(slot)) =
            (d.prompt_logprobs.take(), entries.get_mut(*index / n.max(1)))
        {
            *slot = Some(e);
        }
    }
    if entries.iter().all(Option::is_none) {
        return Ok(vec![None; prompts]);
    }
    let tokenizer = state.tokenizer.clone();
    crate::offload::run(move || {
        entries
            .iter()
            .map(|e| e.as_deref().map(|e| render(e, &tokenizer)).transpose())
            .collect()
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn common(json: &str) -> CommonParams {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn vllm_refusals_and_what_is_asked_for() {
        let ask = |j: &str| requested(&common(j));
        assert_eq!(ask("{}").ok(), Some(None));
        assert_eq!(ask(r#"{"prompt_logprobs":null}"#).ok(), Some(None));
        assert_eq!(ask(r#"{"prompt_logprobs":3}"#).ok(), Some(Some(3)));
        assert_eq!(ask(r#"{"prompt_logprobs":0}"#).ok(), Some(Some(0)));
        // 0 with a stream asks for nothing a stream returns.
        assert_eq!(
            ask(r#"{"prompt_logprobs":0,"stream":true}"#).ok(),
            Some(None)
        );
        for bad in [
            r#"{"prompt_logprobs":1,"stream":true}"#,
            r#"{"prompt_logprobs":-1}"#,
            r#"{"prompt_logprobs":-2}"#,
        ] {
            assert!(
                matches!(
                    ask(bad),
                    Err(ApiError::InvalidParam {
                        param: Some("prompt_logprobs"),
                        ..
                    })
                ),
                "{bad}"
            );
        }
    }
}
