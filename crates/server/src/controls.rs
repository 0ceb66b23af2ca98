//! vLLM's token-level request fields → the engine's [`TokenControls`]
//! (`logit_bias`, `allowed_token_ids`, `bad_words`, `min_tokens`), plus
//! `truncate_prompt_tokens` on the prompt, each refusal naming its field.

use agentd_runtime::{TokenControls, Tokenizer};

use crate::error::ApiError;
use crate::protocol::CommonParams;
use crate::sampling::Sampling;

/// vLLM's `truncate_prompt_tokens`: keep the last `k` prompt tokens (left
/// truncation); -1 means the model's window; 0, below -1, or more than the
/// window is a 400 (vLLM's `SamplingParams` and renderer checks).
pub fn truncate(
    prompt: &mut Vec<u32>,
    c: &CommonParams,
    max_model_len: usize,
) -> Result<(), ApiError> {
    let Some(k) = c.truncate_prompt_tokens else {
        return Ok(());
    };
    let field = "truncate_prompt_tokens";
    let keep = match k {
        -1 => max_model_len,
        k if k >= 1 => usize::try_from(k).unwrap_or(usize::MAX),
        k => {
            return Err(ApiError::invalid(
                field,
                format!("truncate_prompt_tokens must be an integer >= 1 or -1, got {k}"),
            ))
        }
    };
    if keep > max_model_len {
        return Err(ApiError::invalid(
            field,
            format!(
                "truncate_prompt_tokens value ({k}) is greater than max_model_len \
                 ({max_model_len}). Please select a smaller truncation size."
            ),
        ));
    }
    if prompt.len() > keep {
        let cut = prompt.len() - keep;
        prompt.drain(..cut);
    }
    Ok(())
}

/// Sets the token controls and `include_stop_str_in_output` of `sampling`
/// from the request, checking them against the model's vocabulary of
/// `vocab` tokens. `bad_words` are tokenized here (a few short strings).
pub fn apply(
    c: &CommonParams,
    tokenizer: &Tokenizer,
    vocab: usize,
    sampling: &mut Sampling,
) -> Result<(), ApiError> {
    let controls = TokenControls {
        logit_bias: logit_bias(c)?,
        allowed_token_ids: c.allowed_token_ids.clone(),
        bad_words: bad_words(c.bad_words.as_deref().unwrap_or_default(), tokenizer)?,
        min_tokens: usize::try_from(c.min_tokens.unwrap_or(0)).unwrap_or(usize::MAX),
    };
    controls
        .validate(sampling.params.max_tokens)
        .and_then(|()| controls.validate_vocab(vocab))
        .map_err(|e| ApiError::invalid(e.field, e.message))?;
    if !controls.is_empty() {
        tracing::debug!(?controls, "token controls");
    }
    sampling.params.controls = controls;
    sampling.include_stop_str_in_output = c.include_stop_str_in_output.unwrap_or(false);
    Ok(())
}

/// OpenAI's map of token-id strings to biases.
fn logit_bias(c: &CommonParams) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(map) = &c.logit_bias else {
        return Ok(Vec::new());
    };
    map.iter()
        .map(|(k, &bias)| {
            let t = k.trim().parse::<u32>().map_err(|_| {
                ApiError::invalid(
                    "logit_bias",
                    format!("logit_bias keys must be token ids (non-negative integers), got {k:?}"),
                )
            })?;
            Ok((t, bias))
        })
        .collect()
}

/// vLLM's `SamplingParams.update_from_tokenizer`: each word as tokens, and
/// with a leading space when that spelling starts with a different token
/// but has as many (so a word is banned mid-text too).
fn bad_words(words: &[String], tokenizer: &Tokenizer) -> Result<Vec<Vec<u32>>, ApiError> {
    let mut out: Vec<Vec<u32>> = Vec::with_capacity(words.len() * 2);
    for word in words {
        let word = word.trim_start();
        if word.is_empty() {
            return Err(ApiError::invalid(
                "bad_words",
                "bad_words must not contain an empty word",
            ));
        }
        let bare = tokenizer.encode(word, false)?;
        let spaced = tokenizer.encode(&format!(" {word}"), false)?;
        let distinct = spaced.first() != bare.first() && spaced.len() == bare.len();
        out.push(bare);
        if distinct {
            out.push(spaced);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn common(json: &str) -> CommonParams {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn truncation_keeps_the_last_tokens() {
        let run = |k: &str, len: usize| {
            let mut p: Vec<u32> = (0..len as u32).collect();
            let c = common(&format!(r#"{{"truncate_prompt_tokens":{k}}}"#));
            truncate(&mut p, &c, 8).map(|()| p)
        };
        assert_eq!(run("3", 6).unwrap(), [3, 4, 5]);
        assert_eq!(
            run("10", 0)
                .err()
                .map(|e| e.to_string().contains("max_model_len")),
            Some(true)
        );
        assert_eq!(run("-1", 10).unwrap(), (2..10).collect::<Vec<_>>());
        assert_eq!(run("6", 4).unwrap(), [0, 1, 2, 3]);
        for bad in ["0", "-2", "9"] {
            assert!(
                matches!(
                    run(bad, 4),
                    Err(ApiError::InvalidParam {
                        param: Some("truncate_prompt_tokens"),
                        ..
                    })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn logit_bias_keys_are_token_ids() {
        let c = common(r#"{"logit_bias":{"5":1.5," 7":-100}}"#);
        assert_eq!(logit_bias(&c).unwrap(), [(7, -100.0), (5, 1.5)]);
        let c = common(r#"{"logit_bias":{"x":1}}"#);
        assert!(matches!(
            logit_bias(&c),
            Err(ApiError::InvalidParam {
                param: Some("logit_bias"),
                ..
            })
        ));
    }
}
