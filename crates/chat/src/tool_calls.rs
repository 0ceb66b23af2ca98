//! Hermes-style tool calls (Qwen3, Qwen2.5, Hermes): the model writes
//! `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, which
//! become OpenAI `tool_calls` with `arguments` re-serialised as a JSON string.
//!
//! Rules (shared with the streaming parser, which must produce the same
//! result for any chunking):
//! - a block whose body is a JSON object with a string `name` and an
//!   `arguments` member (an object, or a string holding JSON, which is
//!   decoded) is a tool call; `arguments` is serialised as Python's
//!   `json.dumps(..., ensure_ascii=False)` would (vLLM's hermes parser does
//!   exactly that, so clients see the same strings);
//! - a block that does not parse stays in the content verbatim, tags included
//!   (vLLM falls back to content too; it never fails the request);
//! - a block missing its `</tool_call>` at the end of the output is parsed
//!   all the same (generation may stop on EOS right after the JSON);
//! - text outside blocks is content, except whitespace-only runs that follow
//!   a tool call (the model separates calls with newlines). vLLM drops all
//!   text after the first call; we keep non-blank text rather than lose it.

use crate::pyjson;
use minijinja::value::Serde;
use minijinja::Value;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// Opens a tool-call block.
pub const TOOL_CALL_START: &str = "<tool_call>";
/// Closes a tool-call block.
pub const TOOL_CALL_END: &str = "</tool_call>";

/// A tool call in an OpenAI chat completion response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

/// The called function: its name and its arguments as a JSON string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// Source of tool-call ids (`call_...`).
#[derive(Debug, Clone, Default)]
pub enum ToolCallIds {
    /// `call_` + 24 random hex digits per call, like OpenAI's.
    #[default]
    Random,
    /// `call_{prefix}{n}` with `n` counting from 0: deterministic, for tests
    /// and for servers that derive ids from the request id.
    Sequential { prefix: String, next: usize },
}

impl ToolCallIds {
    pub fn sequential(prefix: impl Into<String>) -> Self {
        ToolCallIds::Sequential {
            prefix: prefix.into(),
            next: 0,
        }
    }

    /// The next id.
    pub fn next_id(&mut self) -> String {
        match self {
            ToolCallIds::Random => format!("call_{}", random_hex24()),
            ToolCallIds::Sequential { prefix, next } => {
                let id = format!("call_{prefix}{next}");
                *next += 1;
                id
            }
        }
    }
}

/// 96 random bits from std's randomly keyed SipHash (no RNG dependency in
/// this crate); a process-wide counter keeps successive ids distinct.
fn random_hex24() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut a = RandomState::new().build_hasher();
    a.write_u64(n);
    let mut b = RandomState::new().build_hasher();
    b.write_u64(n ^ 0x9e37_79b9_7f4a_7c15);
    format!("{:016x}{:08x}", a.finish(), b.finish() as u32)
}

/// Parses the body of a tool-call block into `(name, arguments_json)`.
/// `None` when the body is not a well-formed call.
pub(crate) fn parse_call_body(body: &str) -> Option<(String, String)> {
    let json: Json = serde_json::from_str(body).ok()?;
    let obj = json.as_object()?;
    let name = obj.get("name")?.as_str()?.to_string();
    let arguments = match obj.get("arguments")? {
        // Some models double-encode the arguments; vLLM decodes them (and
        // treats undecodable ones as a malformed call), so do we.
        Json::String(s) => serde_json::from_str::<Json>(s).ok()?,
        other => other.clone(),
    };
    let arguments = pyjson::dumps_default(&Value::from(Serde(&arguments))).ok()?;
    Some((name, arguments))
}

pub(crate) fn make_call(ids: &mut ToolCallIds, name: String, arguments: String) -> ToolCall {
    ToolCall {
        id: ids.next_id(),
        kind: "function".to_string(),
        function: FunctionCall { name, arguments },
    }
}

/// Extracts tool calls from whole `text` (the content after reasoning).
/// Returns the remaining content and the calls.
pub fn extract_tool_calls(text: &str, ids: &mut ToolCallIds) -> (String, Vec<ToolCall>) {
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut after_call = false;
    let push_text = |content: &mut String, seg: &str, after_call: bool| {
        if !(after_call && seg.trim().is_empty()) {
            content.push_str(seg);
        }
    };
    let mut rest = text;
    while let Some(start) = rest.find(TOOL_CALL_START) {
        push_text(&mut content, &rest[..start], after_call);
        let body_start = start + TOOL_CALL_START.len();
        let (body, raw, next) = match rest[body_start..].find(TOOL_CALL_END) {
            Some(len) => {
                let end = body_start + len + TOOL_CALL_END.len();
                (
                    &rest[body_start..body_start + len],
                    &rest[start..end],
                    &rest[end..],
                )
            }
            None => (&rest[body_start..], &rest[start..], ""),
        };
        match parse_call_body(body) {
            Some((name, arguments)) => {
                calls.push(make_call(ids, name, arguments));
                after_call = true;
            }
            None => {
                content.push_str(raw);
                after_call = false;
            }
        }
        rest = next;
    }
    push_text(&mut content, rest, after_call);
    (content, calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids_differ() {
        let mut ids = ToolCallIds::Random;
        let (a, b) = (ids.next_id(), ids.next_id());
        assert_ne!(a, b);
        assert!(a.starts_with("call_") && a.len() == 29, "{a}");
    }

    #[test]
    fn arguments_use_python_spacing() {
        let (name, args) =
            parse_call_body(r#" {"name":"f","arguments":{"b":[1,2.0,"é"],"a":null}} "#)
                .expect("valid call");
        assert_eq!(name, "f");
        assert_eq!(args, r#"{"b": [1, 2.0, "é"], "a": null}"#);
    }
}
