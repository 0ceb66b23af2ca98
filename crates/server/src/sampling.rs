//! OpenAI / vLLM request fields → the engine's [`SamplingParams`], with the
//! checks that turn nonsense into a 400 naming the field.

use agentd_runtime::SamplingParams;

use crate::app::AppState;
use crate::error::ApiError;
use crate::protocol::CommonParams;

/// Largest `top_logprobs` / `logprobs: k` served (OpenAI's limit is 20).
pub use agentd_runtime::sampling::MAX_LOGPROBS;

/// What the server needs besides the engine's parameters.
#[derive(Debug, Clone)]
pub struct Sampling {
    pub params: SamplingParams,
    /// Stop strings, matched by the server on the detokenised text.
    pub stop: Vec<String>,
    /// vLLM's `include_stop_str_in_output` (set by [`crate::controls::apply`]).
    pub include_stop_str_in_output: bool,
}

/// Builds the sampling parameters; a field the request leaves unset takes
/// its value from `defaults` (the model's generation config, see
/// [`crate::AppState::sampling_defaults`]). `prompt_len` and `max_model_len` give the
/// default `max_tokens` (the rest of the context, as vLLM does) and the
/// context-length check; `logprobs` is the number of alternatives asked for
/// and the request field that asked (`top_logprobs` in chat, `logprobs` in
/// completions). Every field is checked by [`SamplingParams::validate`], the
/// one validation, whose refusal names the field.
pub fn build(
    c: &CommonParams,
    defaults: &SamplingParams,
    logprobs: Option<(u32, &'static str)>,
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
        Some(m) if m > room as u64 => {
            return Err(ApiError::ContextTooLong(format!(
                "This model's maximum context length is {max_model_len} tokens. However, you requested {} tokens ({prompt_len} in the messages, {m} in the completion). Please reduce the length of the messages or completion.",
                // u128: `m` is the client's and may be u64::MAX.
                prompt_len as u128 + u128::from(m)
            )));
        }
        // m <= room, a usize.
        Some(m) => m as usize,
        None => room,
    };
    let stop = c.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "stop strings must not be empty"));
    }
    let params = SamplingParams {
        temperature: c.temperature.unwrap_or(defaults.temperature),
        top_k: c.top_k.unwrap_or(defaults.top_k),
        top_p: c.top_p.unwrap_or(defaults.top_p),
        min_p: c.min_p.unwrap_or(defaults.min_p),
        seed: c.seed,
        repetition_penalty: c.repetition_penalty.unwrap_or(defaults.repetition_penalty),
        presence_penalty: c.presence_penalty.unwrap_or(defaults.presence_penalty),
        frequency_penalty: c.frequency_penalty.unwrap_or(defaults.frequency_penalty),
        stop_token_ids: c.stop_token_ids.clone().unwrap_or_default(),
        ignore_eos: c.ignore_eos.unwrap_or(false),
        max_tokens,
        logprobs: logprobs.map(|(k, _)| k as usize),
        prompt_logprobs: crate::prompt_logprobs::requested(c)?,
        // Set by the route from `response_format` / `tool_choice`.
        constraint: None,
        // Set by `controls::apply`.
        controls: Default::default(),
    };
    params.validate().map_err(|e| {
        let field = match (e.field, logprobs) {
            ("logprobs", Some((_, asked_as))) => asked_as,
            (field, _) => field,
        };
        ApiError::invalid(field, e.message)
    })?;
    tracing::debug!(?params, stop = ?stop, "sampling parameters");
    Ok(Sampling {
        params,
        stop,
        include_stop_str_in_output: false,
    })
}

/// What a route asks of [`for_request`]: the defaults unset fields take,
/// the logprobs asked for (count, and the field that asked), and the
/// prompt's length.
pub struct Ask<'a> {
    pub defaults: &'a SamplingParams,
    pub logprobs: Option<(u32, &'static str)>,
    pub prompt_len: usize,
}

/// A request's sampling, the one path every generation route takes (chat,
/// completions, responses, SGLang's `/generate`, vLLM's token route):
/// [`build`] (parameters and their checks, against the server's context
/// length) then [`crate::controls::apply`] (token controls, checked against
/// the model's vocabulary).
pub fn for_request(state: &AppState, c: &CommonParams, ask: Ask<'_>) -> Result<Sampling, ApiError> {
    let mut sampling = build(
        c,
        ask.defaults,
        ask.logprobs,
        ask.prompt_len,
        state.max_model_len,
    )?;
    let vocab = state.engine.model_config().vocab_size;
    crate::controls::apply(c, &state.tokenizer, vocab, &mut sampling)?;
    Ok(sampling)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn common(json: &str) -> CommonParams {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn defaults_fill_the_context() {
        let s = build(&common("{}"), &SamplingParams::default(), None, 10, 100).unwrap();
        assert_eq!(s.params.max_tokens, 90);
        let s = build(
            &common(r#"{"max_completion_tokens":4,"max_tokens":9}"#),
            &SamplingParams::default(),
            Some((2, "logprobs")),
            10,
            100,
        )
        .unwrap();
        assert_eq!(s.params.max_tokens, 4);
        assert_eq!(s.params.logprobs, Some(2));
    }

    #[test]
    fn refusals() {
        let err = |j: &str, p: usize| {
            build(&common(j), &SamplingParams::default(), None, p, 100).unwrap_err()
        };
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
        // Each refusal names the request's own field (there is no
        // "penalties" field).
        for (body, field) in [
            (r#"{"top_k":-3}"#, "top_k"),
            (r#"{"top_p":0}"#, "top_p"),
            (r#"{"min_p":2}"#, "min_p"),
            (r#"{"presence_penalty":-3}"#, "presence_penalty"),
            (r#"{"frequency_penalty":1e30}"#, "frequency_penalty"),
            (r#"{"repetition_penalty":0}"#, "repetition_penalty"),
            (r#"{"max_tokens":0}"#, "max_tokens"),
        ] {
            match err(body, 5) {
                ApiError::InvalidParam { param, .. } => assert_eq!(param, Some(field), "{body}"),
                e => panic!("{body}: {e}"),
            }
        }
        assert!(matches!(
            err(r#"{"stop":[""]}"#, 5),
            ApiError::InvalidParam { .. }
        ));
        assert!(matches!(
            err(r#"{"presence_penalty":3}"#, 5),
            ApiError::InvalidParam { .. }
        ));
        let e = build(
            &common("{}"),
            &SamplingParams::default(),
            Some((21, "top_logprobs")),
            5,
            100,
        )
        .unwrap_err();
        assert!(
            matches!(
                e,
                ApiError::InvalidParam {
                    param: Some("top_logprobs"),
                    ..
                }
            ),
            "{e}"
        );
        assert!(build(
            &common(r#"{"n":1,"top_k":-1}"#),
            &SamplingParams::default(),
            None,
            5,
            100
        )
        .is_ok());
    }
}
