//! OpenAI chat request messages and their normalisation into what a chat
//! template sees.
//!
//! The wire types are deliberately lenient (a role is any string, content is a
//! string or a list of parts, tool-call arguments are any JSON value) so that
//! a malformed request is rejected by [`template_messages`] with a precise
//! location and message instead of a generic serde error.
//!
//! The normalisation follows vLLM, which the server replaces:
//! - for templates that concatenate `message.content` (vLLM's "string"
//!   content format, detected for Qwen3) text parts are joined with `"\n"`
//!   and `null` content becomes `""`; for templates that loop over content
//!   parts ("openai" format) every content becomes a list of text parts;
//! - tool-call `arguments` sent as a JSON string (the OpenAI API shape) are
//!   parsed into a value so templates can `tojson` them; an empty string is
//!   taken as `{}`;
//! - `reasoning` is an alias of `reasoning_content`, and the reasoning is also
//!   exposed as `thinking` (transformers does this for gpt-oss templates);
//! - role `developer` (OpenAI's newer name for `system`) renders as `system`.

use crate::content_format::ContentFormat;
use crate::error::ChatError;
use minijinja::value::Serde;
use minijinja::Value;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

/// One message of an OpenAI `/v1/chat/completions` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `developer`, `user`, `assistant` or `tool`; anything else is
    /// rejected when the prompt is built.
    pub role: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<MessageContent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallParam>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Reasoning of an earlier assistant turn (vLLM's response field, sent back
    /// by agent clients so interleaved-thinking templates can render it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Alias some clients use for `reasoning_content`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
}

impl ChatMessage {
    /// A message with plain-text content.
    pub fn text(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: Some(MessageContent::Text(content.into())),
            name: None,
            tool_calls: None,
            tool_call_id: None,
            reasoning_content: None,
            reasoning: None,
        }
    }
}

/// `content`: a string or a list of content parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged, expecting = "a string or a list of content parts")]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One content part. Only `{"type": "text", "text": ...}` is accepted for
/// rendering; other kinds (images, audio) are rejected with a clear error
/// because the engine serves text-only models.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// An assistant message's tool call as sent back by the client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallParam {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub function: FunctionCallParam,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCallParam {
    pub name: String,
    /// A JSON-encoded string in the OpenAI API; an object is accepted too
    /// (transformers' own message format).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Json>,
}

const ROLES: &str = "system, developer, user, assistant, tool";

/// Validates `messages` and converts them into the JSON objects a chat
/// template receives as `messages` (see the module docs for the rules).
pub fn normalize_messages(
    messages: &[ChatMessage],
    format: ContentFormat,
) -> Result<Vec<Json>, ChatError> {
    if messages.is_empty() {
        return Err(ChatError::invalid(
            "messages",
            "must contain at least one message",
        ));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| normalize_message(i, m, format))
        .collect()
}

/// The normalised message as a JSON object (insertion-ordered, which is the
/// order transformers' dict would have).
pub(crate) fn normalize_message(
    index: usize,
    m: &ChatMessage,
    format: ContentFormat,
) -> Result<Json, ChatError> {
    let at = format!("messages[{index}]");
    let role = match m.role.as_str() {
        "system" | "user" | "assistant" | "tool" => m.role.as_str(),
        "developer" => "system",
        other => {
            return Err(ChatError::invalid(
                format!("{at}.role"),
                format!("unknown role '{other}'; expected one of {ROLES}"),
            ))
        }
    };
    let texts = match &m.content {
        Some(content) => content_texts(&at, content)?,
        // OpenAI allows a null content only on assistant messages (tool-call
        // turns); everything else must say something.
        None if role == "assistant" => Vec::new(),
        None => {
            return Err(ChatError::invalid(
                format!("{at}.content"),
                format!("a {} message requires 'content'", m.role),
            ))
        }
    };

    let mut out = Map::new();
    out.insert("role".into(), Json::from(role));
    out.insert("content".into(), content_json(texts, format));
    if let Some(name) = &m.name {
        out.insert("name".into(), Json::from(name.as_str()));
    }
    if let Some(calls) = &m.tool_calls {
        let calls = tool_calls(&at, m, role, calls)?;
        if !calls.is_empty() {
            out.insert("tool_calls".into(), Json::Array(calls));
        }
    }
    match (&m.tool_call_id, role) {
        (Some(id), _) => {
            out.insert("tool_call_id".into(), Json::from(id.as_str()));
        }
        // OpenAI rejects tool results that do not say which call they answer;
        // the model's template may not need the id, but the client's agent
        // loop is broken and should hear about it.
        (None, "tool") => {
            return Err(ChatError::invalid(
                format!("{at}.tool_call_id"),
                "a tool message requires 'tool_call_id'",
            ))
        }
        (None, _) => {}
    }
    // vLLM forwards reasoning on assistant turns only, preferring `reasoning`.
    let reasoning = m.reasoning.as_ref().or(m.reasoning_content.as_ref());
    if let Some(reasoning) = reasoning.filter(|_| role == "assistant") {
        out.insert("reasoning_content".into(), Json::from(reasoning.as_str()));
        out.insert("reasoning".into(), Json::from(reasoning.as_str()));
        out.insert("thinking".into(), Json::from(reasoning.as_str()));
    }
    Ok(Json::Object(out))
}

/// The content as the template receives it: one string, or OpenAI's
/// list of text parts.
fn content_json(texts: Vec<&str>, format: ContentFormat) -> Json {
    match format {
        ContentFormat::String => Json::from(texts.join("\n")),
        ContentFormat::OpenAi => Json::Array(
            texts
                .into_iter()
                .map(|text| {
                    let mut part = Map::new();
                    part.insert("type".into(), Json::from("text"));
                    part.insert("text".into(), Json::from(text));
                    Json::Object(part)
                })
                .collect(),
        ),
    }
}

/// The tool calls of message `m` (at `at`), normalised; only an assistant
/// message may carry them.
fn tool_calls(
    at: &str,
    m: &ChatMessage,
    role: &str,
    calls: &[ToolCallParam],
) -> Result<Vec<Json>, ChatError> {
    if role != "assistant" {
        return Err(ChatError::invalid(
            format!("{at}.tool_calls"),
            format!(
                "only assistant messages may carry tool_calls, not {}",
                m.role
            ),
        ));
    }
    calls
        .iter()
        .enumerate()
        .map(|(j, call)| normalize_tool_call(&format!("{at}.tool_calls[{j}]"), call))
        .collect()
}

/// The texts of `content`: one for a string, one per part for a list.
fn content_texts<'a>(at: &str, content: &'a MessageContent) -> Result<Vec<&'a str>, ChatError> {
    match content {
        MessageContent::Text(text) => Ok(vec![text.as_str()]),
        MessageContent::Parts(parts) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let at = format!("{at}.content[{j}]");
                if part.kind != "text" {
                    return Err(ChatError::invalid(
                        at,
                        format!(
                            "unsupported content part type '{}'; this model accepts text parts only",
                            part.kind
                        ),
                    ));
                }
                match &part.text {
                    Some(text) => texts.push(text.as_str()),
                    None => return Err(ChatError::invalid(at, "a text part requires 'text'")),
                }
            }
            Ok(texts)
        }
    }
}

fn normalize_tool_call(at: &str, call: &ToolCallParam) -> Result<Json, ChatError> {
    if let Some(kind) = &call.kind {
        if kind != "function" {
            return Err(ChatError::invalid(
                format!("{at}.type"),
                format!("unsupported tool call type '{kind}'; expected 'function'"),
            ));
        }
    }
    if call.function.name.is_empty() {
        return Err(ChatError::invalid(
            format!("{at}.function.name"),
            "must be a non-empty string",
        ));
    }
    let arguments = match &call.function.arguments {
        None => Json::Object(Map::new()),
        Some(Json::String(s)) if s.trim().is_empty() => Json::Object(Map::new()),
        Some(Json::String(s)) => serde_json::from_str::<Json>(s).map_err(|e| {
            ChatError::invalid(
                format!("{at}.function.arguments"),
                format!("is not valid JSON ({e})"),
            )
        })?,
        Some(other) => other.clone(),
    };
    let mut function = Map::new();
    function.insert("name".into(), Json::from(call.function.name.as_str()));
    function.insert("arguments".into(), arguments);
    let mut out = Map::new();
    if let Some(id) = &call.id {
        out.insert("id".into(), Json::from(id.as_str()));
    }
    out.insert("type".into(), Json::from("function"));
    out.insert("function".into(), Json::Object(function));
    Ok(Json::Object(out))
}

/// Validates the request's `tools` (OpenAI function definitions) and converts
/// them for the template. Each definition is passed through as sent — key
/// order included — because templates print it with `tojson`.
pub fn template_tools(tools: &[Json]) -> Result<Vec<Value>, ChatError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            validate_tool(i, tool)?;
            Ok(Value::from(Serde(tool)))
        })
        .collect()
}

fn validate_tool(i: usize, tool: &Json) -> Result<(), ChatError> {
    let at = format!("tools[{i}]");
    let Some(obj) = tool.as_object() else {
        return Err(ChatError::invalid(at, "a tool must be a JSON object"));
    };
    match obj.get("type").and_then(Json::as_str) {
        Some("function") => {}
        Some(other) => {
            return Err(ChatError::invalid(
                format!("{at}.type"),
                format!("unsupported tool type '{other}'; expected 'function'"),
            ))
        }
        None => {
            return Err(ChatError::invalid(
                format!("{at}.type"),
                "missing; expected 'function'",
            ))
        }
    }
    let Some(function) = obj.get("function").and_then(Json::as_object) else {
        return Err(ChatError::invalid(
            format!("{at}.function"),
            "missing or not an object",
        ));
    };
    match function.get("name").and_then(Json::as_str) {
        Some(name) if !name.is_empty() => {}
        _ => {
            return Err(ChatError::invalid(
                format!("{at}.function.name"),
                "must be a non-empty string",
            ))
        }
    }
    // A JSON Schema for the arguments: an object (OpenAI refuses anything
    // else, and so must we rather than render nonsense into the prompt).
    match function.get("parameters") {
        None | Some(Json::Null) | Some(Json::Object(_)) => {}
        Some(other) => {
            return Err(ChatError::invalid(
                format!("{at}.function.parameters"),
                format!("must be a JSON Schema object, got {other}"),
            ))
        }
    }
    match function.get("strict") {
        None | Some(Json::Null) | Some(Json::Bool(_)) => Ok(()),
        Some(_) => Err(ChatError::invalid(
            format!("{at}.function.strict"),
            "must be a boolean",
        )),
    }
}
