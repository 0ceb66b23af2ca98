//! Request fields agentd does not read: refused when OpenAI or vLLM gives
//! them a meaning agentd does not implement, ignored (and logged) otherwise.
//!
//! vLLM's request models take unknown fields (`extra="allow"`) and log
//! them; a field that changes the output but is silently dropped would
//! answer a different question than the client asked, so each field that
//! either API defines for chat completions, text completions or responses
//! and agentd does not implement is a 400 naming it — unless its value is
//! the one that asks for nothing (`best_of: 1`, `use_beam_search: false`,
//! `null`).

use serde_json::{Map, Value as Json};

use crate::error::ApiError;

/// The endpoint a body was sent to: some fields exist for one only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
    Responses,
}

impl Endpoint {
    fn bit(self) -> u8 {
        match self {
            Endpoint::Chat => CHAT.0,
            Endpoint::Completions => COMPLETIONS.0,
            Endpoint::Responses => RESPONSES.0,
        }
    }
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
    /// `null` or this string.
    Str(&'static str),
    /// `null` or a list without this string (Responses' `include`).
    Without(&'static str),
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
            Off::Str(s) => v.as_str() == Some(s),
            Off::Without(s) => v.as_array().is_some_and(|a| a.iter().all(|m| m != s)),
        }
    }
}

/// The endpoints a field is defined on (a set of bits).
#[derive(Debug, Clone, Copy)]
struct On(u8);

const CHAT: On = On(1);
const COMPLETIONS: On = On(2);
const RESPONSES: On = On(4);
/// Chat and text completions.
const BOTH: On = On(1 | 2);
/// Every generating endpoint.
const ALL: On = On(1 | 2 | 4);
const CHAT_RESPONSES: On = On(1 | 4);

/// The fields OpenAI or vLLM define that agentd does not implement, the
/// endpoints that define them, and the values that ask for nothing.
///
/// Reviewed and implemented, so not here: `prompt_logprobs`
/// ([`crate::prompt_logprobs`]); `add_special_tokens` (chat and
/// completions: the tokenizer's special tokens, a BOS where it defines
/// one, are added when true); `parallel_tool_calls` (false: at most one
/// tool call is returned, the first the model made).
const UNIMPLEMENTED: &[(&str, On, Off)] = &[
    // vLLM sampling parameters.
    ("best_of", BOTH, Off::One),
    ("use_beam_search", BOTH, Off::False),
    ("length_penalty", BOTH, Off::One),
    ("skip_special_tokens", ALL, Off::True),
    ("spaces_between_special_tokens", BOTH, Off::True),
    ("logits_processors", BOTH, Off::Empty),
    ("return_tokens_as_token_ids", BOTH, Off::False),
    ("priority", ALL, Off::Zero),
    ("kv_transfer_params", ALL, Off::Empty),
    ("vllm_xargs", ALL, Off::Empty),
    ("mm_processor_kwargs", ALL, Off::Empty),
    // vLLM structured outputs (agentd's are `response_format` / `text`
    // and tools).
    ("structured_outputs", ALL, Off::Null),
    ("guided_json", BOTH, Off::Null),
    ("guided_regex", BOTH, Off::Null),
    ("guided_choice", BOTH, Off::Null),
    ("guided_grammar", BOTH, Off::Null),
    ("structural_tag", BOTH, Off::Null),
    ("guided_decoding_backend", BOTH, Off::Null),
    ("guided_whitespace_pattern", BOTH, Off::Null),
    // Chat only (OpenAI, then vLLM).
    ("audio", CHAT, Off::Null),
    ("modalities", CHAT, Off::Text),
    ("prediction", CHAT, Off::Null),
    ("functions", CHAT, Off::Empty),
    ("function_call", CHAT, Off::Null),
    ("web_search_options", CHAT, Off::Null),
    ("reasoning_effort", CHAT, Off::Null),
    ("verbosity", CHAT, Off::Null),
    ("store", CHAT, Off::False),
    ("echo", CHAT, Off::False),
    ("return_token_ids", CHAT, Off::False),
    ("documents", CHAT, Off::Null),
    ("chat_template", CHAT, Off::Null),
    ("media_io_kwargs", CHAT_RESPONSES, Off::Empty),
    // Text completions only.
    ("suffix", COMPLETIONS, Off::Empty),
    ("prompt_embeds", COMPLETIONS, Off::Null),
    ("response_format", COMPLETIONS, Off::Null),
    // Responses only (OpenAI, then vLLM). `include` may name what agentd
    // has no use for (`reasoning.encrypted_content`: its reasoning is
    // plain text), but not output logprobs, which it does not return.
    (
        "include",
        RESPONSES,
        Off::Without("message.output_text.logprobs"),
    ),
    ("max_tool_calls", RESPONSES, Off::Null),
    ("prompt", RESPONSES, Off::Null),
    ("conversation", RESPONSES, Off::Null),
    ("truncation", RESPONSES, Off::Str("disabled")),
    ("enable_response_messages", RESPONSES, Off::False),
    ("previous_input_messages", RESPONSES, Off::Null),
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
    // Responses: read only with `include: ["message.output_text.logprobs"]`,
    // which is refused.
    "top_logprobs",
];

/// Refuses the first field of `extra` (the fields no request type read)
/// that the endpoint defines but agentd does not implement, naming it;
/// logs the rest, as vLLM logs the fields it ignores.
pub fn check(extra: &Map<String, Json>, endpoint: Endpoint) -> Result<(), ApiError> {
    for (name, value) in extra {
        let known = UNIMPLEMENTED
            .iter()
            .find(|(n, on, _)| *n == name.as_str() && on.0 & endpoint.bit() != 0);
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
        for off in [
            json!({"best_of": 1, "use_beam_search": false, "length_penalty": 1.0}),
            json!({"skip_special_tokens": true, "guided_json": null, "priority": 0}),
            json!({"modalities": ["text"], "functions": []}),
        ] {
            assert_eq!(run(off.clone(), Chat), Ok(()), "{off}");
        }
        // The Responses API's own, and the shared ones it defines too.
        assert_eq!(
            run(
                json!({"include": ["message.output_text.logprobs"]}),
                Responses
            ),
            Err(Some("include"))
        );
        assert_eq!(
            run(json!({"truncation": "auto"}), Responses),
            Err(Some("truncation"))
        );
        assert_eq!(
            run(json!({"skip_special_tokens": false}), Responses),
            Err(Some("skip_special_tokens"))
        );
        assert_eq!(
            run(
                json!({"include": ["reasoning.encrypted_content"], "truncation": "disabled",
                       "max_tool_calls": null, "top_logprobs": 3}),
                Responses
            ),
            Ok(())
        );
        // Chat's fields are no fields of the Responses API.
        assert_eq!(run(json!({"best_of": 3, "echo": true}), Responses), Ok(()));
        assert_eq!(run(json!({"truncation": "auto"}), Chat), Ok(()));
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
