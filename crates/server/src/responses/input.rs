//! Responses input items → chat messages, and Responses tools → chat tools,
//! so that a response renders through the same chat template path as a chat
//! completion.
//!
//! Item rules (OpenAI's, as vLLM maps them):
//! - `message` (the `type` may be omitted): role and content; content parts
//!   `input_text` / `output_text` / `text` become text;
//! - `function_call`: a tool call of an assistant turn; consecutive calls
//!   (and the assistant text before them) are one assistant message, which is
//!   how the model emitted parallel calls;
//! - `function_call_output`: a `tool` message answering `call_id`;
//! - `reasoning`: its text is the `reasoning_content` of the assistant turn
//!   that follows it.

use agentd_chat::{ChatMessage, ContentPart, FunctionCallParam, MessageContent, ToolCallParam};
use serde_json::{json, Value as Json};

use super::protocol::InputSpec;
use crate::error::ApiError;

fn bad(at: String, message: impl std::fmt::Display) -> ApiError {
    ApiError::invalid("input", format!("{at}: {message}"))
}

fn str_field<'a>(item: &'a Json, at: &str, name: &str) -> Result<&'a str, ApiError> {
    item.get(name)
        .and_then(Json::as_str)
        .ok_or_else(|| bad(format!("{at}.{name}"), "must be a string"))
}

/// Appends the messages of `input` to `out`.
pub fn append_input(out: &mut Vec<ChatMessage>, input: &InputSpec) -> Result<(), ApiError> {
    let items = match input {
        InputSpec::Text(text) => {
            out.push(ChatMessage::text("user", text.as_str()));
            return Ok(());
        }
        InputSpec::Items(items) => items,
    };
    let mut reasoning: Option<String> = None;
    // Calls join an assistant message of this input, never one of the
    // history (which must render as it did).
    let start = out.len();
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        if !item.is_object() {
            return Err(bad(at, "an input item must be a JSON object"));
        }
        let kind = item.get("type").and_then(Json::as_str).unwrap_or("message");
        match kind {
            "message" => {
                let mut m = message(item, &at)?;
                if m.role == "assistant" {
                    m.reasoning_content = reasoning.take();
                }
                out.push(m);
            }
            "function_call" => {
                let call = ToolCallParam {
                    id: Some(str_field(item, &at, "call_id")?.to_string()),
                    kind: Some("function".into()),
                    function: FunctionCallParam {
                        name: str_field(item, &at, "name")?.to_string(),
                        arguments: Some(Json::String(
                            str_field(item, &at, "arguments")?.to_string(),
                        )),
                    },
                };
                assistant_turn(out, start, reasoning.take())
                    .tool_calls
                    .get_or_insert_with(Vec::new)
                    .push(call);
            }
            "function_call_output" => {
                let call_id = str_field(item, &at, "call_id")?;
                let output = match item.get("output") {
                    Some(Json::String(s)) => s.clone(),
                    Some(Json::Array(parts)) => texts(parts, &format!("{at}.output"))?.join("\n"),
                    _ => return Err(bad(format!("{at}.output"), "must be a string or parts")),
                };
                let mut m = ChatMessage::text("tool", output);
                m.tool_call_id = Some(call_id.to_string());
                out.push(m);
            }
            "reasoning" => {
                let mut text = String::new();
                for key in ["content", "summary"] {
                    if let Some(Json::Array(parts)) = item.get(key) {
                        text.push_str(&texts(parts, &format!("{at}.{key}"))?.join("\n"));
                    }
                    if !text.is_empty() {
                        break;
                    }
                }
                reasoning = Some(text);
            }
            other => {
                return Err(bad(
                    format!("{at}.type"),
                    format!("unsupported input item type '{other}'; expected message, function_call, function_call_output or reasoning"),
                ))
            }
        }
    }
    Ok(())
}

/// The assistant message that the next tool call belongs to: the last
/// message if it is an assistant turn of this input, else a new one.
fn assistant_turn(
    out: &mut Vec<ChatMessage>,
    start: usize,
    reasoning: Option<String>,
) -> &mut ChatMessage {
    let reuse = out.len() > start
        && out.last().is_some_and(|m| m.role == "assistant")
        && reasoning.is_none();
    if !reuse {
        let mut m = ChatMessage::text("assistant", "");
        m.content = None;
        m.reasoning_content = reasoning;
        out.push(m);
    }
    let last = out.len() - 1;
    &mut out[last]
}

fn message(item: &Json, at: &str) -> Result<ChatMessage, ApiError> {
    let role = str_field(item, at, "role")?;
    if !matches!(role, "user" | "assistant" | "system" | "developer") {
        return Err(bad(
            format!("{at}.role"),
            format!("unknown role '{role}'; expected user, assistant, system or developer"),
        ));
    }
    let content = match item.get("content") {
        Some(Json::String(s)) => MessageContent::Text(s.clone()),
        Some(Json::Array(parts)) => MessageContent::Parts(
            texts(parts, &format!("{at}.content"))?
                .into_iter()
                .map(|text| ContentPart {
                    kind: "text".into(),
                    text: Some(text),
                })
                .collect(),
        ),
        _ => {
            return Err(bad(
                format!("{at}.content"),
                "must be a string or a list of content parts",
            ))
        }
    };
    let mut m = ChatMessage::text(role, "");
    m.content = Some(content);
    Ok(m)
}

/// The texts of content parts: `input_text`, `output_text`, `text`,
/// `summary_text`, `reasoning_text`; anything else (images, files) is refused.
fn texts(parts: &[Json], at: &str) -> Result<Vec<String>, ApiError> {
    parts
        .iter()
        .enumerate()
        .map(|(j, part)| {
            let at = format!("{at}[{j}]");
            let kind = part.get("type").and_then(Json::as_str).unwrap_or("");
            match kind {
                "input_text" | "output_text" | "text" | "summary_text" | "reasoning_text" => {
                    Ok(str_field(part, &at, "text")?.to_string())
                }
                other => Err(bad(
                    format!("{at}.type"),
                    format!("unsupported content part '{other}'; this model accepts text only"),
                )),
            }
        })
        .collect()
}

/// Responses tools (`{"type": "function", "name", "description",
/// "parameters", "strict"}`) as chat-completions tools.
pub fn chat_tools(tools: &[Json]) -> Result<Vec<Json>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let kind = t.get("type").and_then(Json::as_str).unwrap_or("");
            if kind != "function" {
                return Err(ApiError::invalid(
                    "tools",
                    format!("tools[{i}].type: unsupported tool type '{kind}'; only function tools are served"),
                ));
            }
            let name = t
                .get("name")
                .and_then(Json::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| {
                    ApiError::invalid("tools", format!("tools[{i}].name must be a non-empty string"))
                })?;
            let mut function = json!({"name": name});
            for key in ["description", "parameters", "strict"] {
                if let Some(v) = t.get(key).filter(|v| !v.is_null()) {
                    function[key] = v.clone();
                }
            }
            Ok(json!({"type": "function", "function": function}))
        })
        .collect()
}

/// A Responses `tool_choice` in the chat-completions shape (a named
/// function becomes `{"type": "function", "function": {"name"}}`).
pub fn chat_tool_choice(choice: Option<&Json>) -> Result<Option<Json>, ApiError> {
    match choice {
        None => Ok(None),
        Some(Json::String(s)) if matches!(s.as_str(), "auto" | "none" | "required") => {
            Ok(Some(Json::String(s.clone())))
        }
        Some(v) if v.get("type").and_then(Json::as_str) == Some("function") => {
            let name = v.get("name").and_then(Json::as_str).ok_or_else(|| {
                ApiError::invalid("tool_choice", "a function tool_choice needs a 'name'")
            })?;
            Ok(Some(json!({"type": "function", "function": {"name": name}})))
        }
        Some(other) => Err(ApiError::invalid(
            "tool_choice",
            format!("tool_choice must be auto, none, required or {{\"type\": \"function\", \"name\": ...}}, got {other}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(v: Json) -> InputSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_tool_turn_becomes_assistant_calls_and_tool_results() {
        let mut out = Vec::new();
        append_input(
            &mut out,
            &items(json!([
                {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "think"}]},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"a\":1}"},
                {"type": "function_call_output", "call_id": "c1", "output": "one"},
                {"type": "function_call_output", "call_id": "c2", "output": "two"},
            ])),
        )
        .unwrap();
        let roles: Vec<_> = out.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "tool", "tool"]);
        assert_eq!(out[1].tool_calls.as_ref().unwrap().len(), 2);
        assert_eq!(out[1].reasoning_content.as_deref(), Some("think"));
        assert_eq!(out[3].tool_call_id.as_deref(), Some("c2"));
    }

    #[test]
    fn bad_items_name_their_index() {
        let mut out = Vec::new();
        let e = append_input(&mut out, &items(json!(["x"]))).unwrap_err();
        assert!(e.to_string().contains("input[0]"), "{e}");
        let e = append_input(
            &mut out,
            &items(json!([{"role": "user", "content": [{"type": "input_image"}]}])),
        )
        .unwrap_err();
        assert!(e.to_string().contains("input[0].content[0].type"), "{e}");
        let e = append_input(&mut out, &items(json!([{"type": "item_reference"}]))).unwrap_err();
        assert!(e.to_string().contains("unsupported input item"), "{e}");
    }

    #[test]
    fn tools_and_tool_choice_convert() {
        let t = chat_tools(&[json!({"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": true})]).unwrap();
        assert_eq!(t[0]["function"]["name"], "f");
        assert_eq!(t[0]["function"]["strict"], true);
        assert!(chat_tools(&[json!({"type": "web_search"})]).is_err());
        let c = chat_tool_choice(Some(&json!({"type": "function", "name": "f"}))).unwrap();
        assert_eq!(c.unwrap()["function"]["name"], "f");
        assert!(chat_tool_choice(Some(&json!("sometimes"))).is_err());
    }
}
