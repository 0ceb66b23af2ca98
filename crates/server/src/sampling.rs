//! OpenAI / vLLM request fields → the engine's [`SamplingParams`], with the
//! checks that turn nonsense into a 400 naming the field.

use agentd_models::SamplingParams;

use crate::error::ApiError;
use crate::protocol::CommonParams;

/// Largest `top_logprobs` / `logprobs: k` served (OpenAI's limit is 20).
pub const MAX_LOGPROBS: u32 = 20;

/// What the server needs besides the engine's parameters.
#[derive(Debug, Clone)]
pub struct Sampling {
    pub params: SamplingParams,
    /// Stop strings, matched by the server on the detokenised text.
    pub stop: Vec<String>,
}

/// Builds the sampling parameters. `prompt_len` and `max_model_len` give the
/// default `max_tokens` (the rest of the context, as vLLM does) and the
/// context-length check; `logprobs` is the number of alternatives asked for.
pub fn build(
    c: &CommonParams,
    logprobs: Option<u32>,
    prompt_len: usize,
    max_model_len: usize,
) -> Result<Sampling, ApiError> {
    if prompt_len == 0 {
        return Err(ApiError::invalid("prompt", "the prompt is empty"));
    }
    if prompt_len >= max_model_len {
        return Err(ApiError::ContextTooLong(format!(
            "This model's maximum context length is {max_model_len} tokens. However, your request has {prompt_len} input tokens. Please reduce the length of the input."
        )));
    }
    let room = max_model_len - prompt_len;
    let max_tokens = match c.max_completion_tokens.or(c.max_tokens) {
        Some(0) => {
            return Err(ApiError::invalid(
                "max_tokens",
                "max_tokens must be at least 1",
            ))
        }
        Some(m) if m > room as u64 => {
            return Err(ApiError::ContextTooLong(format!(
                "This model's maximum context length is {max_model_len} tokens. However, you requested {} tokens ({prompt_len} in the messages, {m} in the completion). Please reduce the length of the messages or completion.",
                // u128: `m` is the client's and may be u64::MAX.
                prompt_len as u128 + u128::from(m)
            )));
        }
        Some(m) => m as usize,
        None => room,
    };
    if let Some(k) = logprobs {
        if k > MAX_LOGPROBS {
            return Err(ApiError::invalid(
                "top_logprobs",
                format!("at most {MAX_LOGPROBS} logprobs per token are served, got {k}"),
            ));
        }
    }
    let top_k = match c.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => k as usize,
        Some(k) => {
            return Err(ApiError::invalid(
                "top_k",
                format!("top_k must be -1 (disabled) or positive, got {k}"),
            ))
        }
    };
    let stop = c.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "stop strings must not be empty"));
    }
    let defaults = SamplingParams::default();
    let params = SamplingParams {
        temperature: c.temperature.unwrap_or(defaults.temperature),
        top_k,
        top_p: c.top_p.unwrap_or(defaults.top_p),
        min_p: c.min_p.unwrap_or(defaults.min_p),
        seed: c.seed,
        repetition_penalty: c.repetition_penalty.unwrap_or(defaults.repetition_penalty),
        presence_penalty: c.presence_penalty.unwrap_or(0.0),
        frequency_penalty: c.frequency_penalty.unwrap_or(0.0),
        stop_token_ids: c.stop_token_ids.clone().unwrap_or_default(),
        ignore_eos: c.ignore_eos.unwrap_or(false),
        max_tokens,
        logprobs: logprobs.map(|k| k as usize),
        // Set by the route from `response_format` / `tool_choice`.
        constraint: None,
    };
    for (name, v) in [
        ("presence_penalty", params.presence_penalty),
        ("frequency_penalty", params.frequency_penalty),
    ] {
        if !(-2.0..=2.0).contains(&v) {
            return Err(ApiError::invalid(
                name,
                format!("{name} must be in [-2, 2], got {v}"),
            ));
        }
    }
    params
        .validate()
        .map_err(|e| ApiError::invalid(param_of(&e.to_string()), e.to_string()))?;
    tracing::debug!(?params, stop = ?stop, "sampling parameters");
    Ok(Sampling { params, stop })
}

/// The field a [`SamplingParams::validate`] message is about.
fn param_of(message: &str) -> &'static str {
    [
        "temperature",
        "top_p",
        "min_p",
        "repetition_penalty",
        "penalties",
    ]
    .into_iter()
    .find(|p| message.contains(p))
    .unwrap_or("sampling")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn common(json: &str) -> CommonParams {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn defaults_fill_the_context() {
        let s = build(&common("{}"), None, 10, 100).unwrap();
        assert_eq!(s.params.max_tokens, 90);
        let s = build(
            &common(r#"{"max_completion_tokens":4,"max_tokens":9}"#),
            Some(2),
            10,
            100,
        )
        .unwrap();
        assert_eq!(s.params.max_tokens, 4);
        assert_eq!(s.params.logprobs, Some(2));
    }

    #[test]
    fn refusals() {
        let err = |j: &str, p: usize| build(&common(j), None, p, 100).unwrap_err();
        assert!(matches!(err("{}", 100), ApiError::ContextTooLong(_)));
        assert!(matches!(
            err(r#"{"max_tokens":96}"#, 5),
            ApiError::ContextTooLong(_)
        ));
        // The largest max_tokens: the total in the message does not wrap
        // (nor panic with overflow checks).
        let e = err(r#"{"max_tokens":18446744073709551615}"#, 5);
        assert!(e.to_string().contains("18446744073709551620 tokens"), "{e}");
        assert!(matches!(
            err(r#"{"temperature":-1}"#, 5),
            ApiError::InvalidParam {
                param: Some("temperature"),
                ..
            }
        ));
        assert!(matches!(
            err(r#"{"top_p":2}"#, 5),
            ApiError::InvalidParam { .. }
        ));
        assert!(matches!(
            err(r#"{"top_k":-3}"#, 5),
            ApiError::InvalidParam { .. }
        ));
        assert!(matches!(
            err(r#"{"stop":[""]}"#, 5),
            ApiError::InvalidParam { .. }
        ));
        assert!(matches!(
            err(r#"{"presence_penalty":3}"#, 5),
            ApiError::InvalidParam { .. }
        ));
        assert!(build(&common("{}"), Some(21), 5, 100).is_err());
        assert!(build(&common(r#"{"n":1,"top_k":-1}"#), None, 5, 100).is_ok());
    }
}
