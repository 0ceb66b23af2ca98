//! Request fields agentd does not read: refused when OpenAI or vLLM gives
//! them a meaning agentd does not implement, ignored (and logged) otherwise.
//!
//! vLLM's request models take unknown fields (`extra="allow"`) and log
//! them; a field that changes the output but is silently dropped would
//! answer a different question than the client asked, so each field that
//! either API defines for chat or text completions and agentd does not
//! implement is a 400 naming it — unless its value is the one that asks
//! for nothing (`best_of: 1`, `use_beam_search: false`, `null`).

use serde_json::{Map, Value as Json};

use crate::error::ApiError;

/// The endpoint a body was sent to: some fields exist for one only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

/// Values that ask for nothing.
#[derive(Debug, Clone, Copy)]
enum Off {
    /// Only `null`.
    Null,
    /// `null` or `false`.
    False,
    /// `null` or `true`.
    True,
    /// `null` or the number 1.
    One,
    /// `null` or the number 0.
    Zero,
    /// `null`, `[]`, `{}` or `""`.
    Empty,
    /// `null` or `["text"]` (output modalities).
    Text,
}

impl Off {
    fn accepts(self, v: &Json) -> bool {
        if v.is_null() {
            return true;
        }
        match self {
            Off::Null => false,
            Off::False => v == &Json::Bool(false),
            Off::True => v == &Json::Bool(true),
            Off::One => v.as_f64() == Some(1.0),
            Off::Zero => v.as_f64() == Some(0.0),
            Off::Empty => match v {
                Json::Array(a) => a.is_empty(),
                Json::Object(o) => o.is_empty(),
                Json::String(s) => s.is_empty(),
                _ => false,
            },
            Off::Text => v.as_array().is_some_and(|a| a.iter().all(|m| m == "text")),
        }
    }
}

/// Where a field is defined: both endpoints or one.
#[derive(Debug, Clone, Copy)]
enum On {
    Both,
    Chat,
    Completions,
}

/// The fields OpenAI or vLLM define for chat / text completions that agentd
/// does not implement, with the values that ask for nothing.
const UNIMPLEMENTED: &[(&str, On, Off)] = &[
    // vLLM sampling parameters.
    ("best_of", On::Both, Off::One),
    ("use_beam_search", On::Both, Off::False),
    ("length_penalty", On::Both, Off::One),
    ("prompt_logprobs", On::Both, Off::Null),
    ("skip_special_tokens", On::Both, Off::True),
    ("spaces_between_special_tokens", On::Both, Off::True),
    ("logits_processors", On::Both, Off::Empty),
    ("return_tokens_as_token_ids", On::Both, Off::False),
    ("add_special_tokens", On::Both, Off::False),
    ("priority", On::Both, Off::Zero),
    ("kv_transfer_params", On::Both, Off::Empty),
    ("vllm_xargs", On::Both, Off::Empty),
    ("mm_processor_kwargs", On::Both, Off::Empty),
    // vLLM structured outputs (agentd's are `response_format` and tools).
    ("structured_outputs", On::Both, Off::Null),
    ("guided_json", On::Both, Off::Null),
    ("guided_regex", On::Both, Off::Null),
    ("guided_choice", On::Both, Off::Null),
    ("guided_grammar", On::Both, Off::Null),
    ("structural_tag", On::Both, Off::Null),
    ("guided_decoding_backend", On::Both, Off::Null),
    ("guided_whitespace_pattern", On::Both, Off::Null),
    // Chat only (OpenAI, then vLLM).
    ("audio", On::Chat, Off::Null),
    ("modalities", On::Chat, Off::Text),
    ("prediction", On::Chat, Off::Null),
    ("functions", On::Chat, Off::Empty),
    ("function_call", On::Chat, Off::Null),
    ("web_search_options", On::Chat, Off::Null),
    ("parallel_tool_calls", On::Chat, Off::True),
    ("reasoning_effort", On::Chat, Off::Null),
    ("verbosity", On::Chat, Off::Null),
    ("store", On::Chat, Off::False),
    ("echo", On::Chat, Off::False),
    ("return_token_ids", On::Chat, Off::False),
    ("documents", On::Chat, Off::Null),
    ("chat_template", On::Chat, Off::Null),
    ("media_io_kwargs", On::Chat, Off::Empty),
    // Text completions only.
    ("suffix", On::Completions, Off::Empty),
    ("prompt_embeds", On::Completions, Off::Null),
    ("response_format", On::Completions, Off::Null),
];

/// Fields the APIs define that do not change what is generated
/// (identifiers and metadata): accepted as they are.
const NO_EFFECT: &[&str] = &[
    "user",
    "metadata",
    "safety_identifier",
    "prompt_cache_key",
    "service_tier",
    "request_id",
];

/// Refuses the first field of `extra` (the fields no request type read)
/// that the endpoint defines but agentd does not implement, naming it;
/// logs the rest, as vLLM logs the fields it ignores.
pub fn check(extra: &Map<String, Json>, endpoint: Endpoint) -> Result<(), ApiError> {
    for (name, value) in extra {
        let known = UNIMPLEMENTED.iter().find(|(n, on, _)| {
            *n == name.as_str()
                && match on {
                    On::Both => true,
                    On::Chat => endpoint == Endpoint::Chat,
                    On::Completions => endpoint == Endpoint::Completions,
                }
        });
        match known {
            Some((n, _, off)) if !off.accepts(value) => {
                return Err(ApiError::InvalidParam {
                    param: Some(*n),
                    message: format!(
                        "{n} is not supported by this server (agentd does not implement it); \
                         leave it out"
                    ),
                })
            }
            Some(_) => {}
            None if NO_EFFECT.contains(&name.as_str()) => {}
            None => tracing::info!(field = %name, "request field ignored: no API defines it"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn run(body: Json, endpoint: Endpoint) -> Result<(), Option<&'static str>> {
        let Json::Object(map) = body else {
            panic!("an object")
        };
        check(&map, endpoint).map_err(|e| match e {
            ApiError::InvalidParam { param, .. } => param,
            _ => None,
        })
    }

    #[test]
    fn defined_fields_are_refused_by_name_unless_they_ask_for_nothing() {
        use Endpoint::*;
        assert_eq!(run(json!({"best_of": 2}), Chat), Err(Some("best_of")));
        assert_eq!(
            run(json!({"use_beam_search": true}), Completions),
            Err(Some("use_beam_search"))
        );
        assert_eq!(
            run(json!({"guided_json": {}}), Chat),
            Err(Some("guided_json"))
        );
        assert_eq!(
            run(json!({"suffix": "x"}), Completions),
            Err(Some("suffix"))
        );
        assert_eq!(
            run(json!({"modalities": ["audio"]}), Chat),
            Err(Some("modalities"))
        );
        assert_eq!(
            run(json!({"prompt_logprobs": 1}), Chat),
            Err(Some("prompt_logprobs"))
        );
        for off in [
            json!({"best_of": 1, "use_beam_search": false, "length_penalty": 1.0}),
            json!({"skip_special_tokens": true, "guided_json": null, "priority": 0}),
            json!({"modalities": ["text"], "parallel_tool_calls": true, "functions": []}),
        ] {
            assert_eq!(run(off.clone(), Chat), Ok(()), "{off}");
        }
        // A field of the other endpoint is no field of this one.
        assert_eq!(run(json!({"suffix": "x"}), Chat), Ok(()));
        assert_eq!(run(json!({"echo": true}), Completions), Ok(()));
        assert_eq!(run(json!({"echo": true}), Chat), Err(Some("echo")));
        // Metadata and fields nobody defines pass.
        assert_eq!(
            run(json!({"user": "u", "metadata": {"a": 1}}), Chat),
            Ok(())
        );
        assert_eq!(run(json!({"made_up_field": [1, 2]}), Completions), Ok(()));
    }
}
