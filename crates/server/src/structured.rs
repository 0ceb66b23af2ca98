//! Structured outputs: `response_format` (chat), `text.format` (responses)
//! and forced tool calls (`tool_choice` `required` or a named function) →
//! the grammar the sampler enforces (see `agentd_models::sampling::constraint`).
//!
//! Thinking: a constrained request is rendered with `enable_thinking: false`
//! and constrained from its first generated token. The grammar then never
//! has to skip a `<think>` block (vLLM defers the constraint until a
//! reasoning parser sees `</think>`; without that the model could not think
//! inside a JSON grammar anyway), and the model is told it is not thinking,
//! so what it writes is the answer the grammar shapes.
//!
//! Forced tool calls use the Hermes format that `agentd_chat`'s tool-call
//! parser reads (Qwen3's template asks for exactly this layout):
//! `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one call,
//! the arguments constrained by the function's `parameters`. Under `auto`,
//! `strict` tools are checked (their schema must compile) but not enforced:
//! the model may answer in text.

use agentd_chat::{ToolParser, TOOL_CALL_END, TOOL_CALL_START};
use agentd_models::sampling::constraint::compact_layout;
use agentd_models::sampling::{Constraint, Grammar, GrammarCompiler};
use serde_json::{json, Map, Value as Json};

use crate::app::AppState;
use crate::error::ApiError;

/// The output format a request asks for.
pub enum Format<'a> {
    Text,
    JsonObject,
    /// A JSON schema, with the request field that holds it (for errors).
    JsonSchema(&'a Json, &'static str),
}

/// Chat completions' `response_format`.
pub fn chat_format(rf: Option<&Json>) -> Result<Format<'_>, ApiError> {
    const SCHEMA: &str = "response_format.json_schema.schema";
    let Some(rf) = rf.filter(|v| !v.is_null()) else {
        return Ok(Format::Text);
    };
    match rf.get("type").and_then(Json::as_str) {
        Some("text") => Ok(Format::Text),
        Some("json_object") => Ok(Format::JsonObject),
        Some("json_schema") => match rf.pointer("/json_schema/schema") {
            Some(s) if s.is_object() => Ok(Format::JsonSchema(s, SCHEMA)),
            Some(_) => Err(ApiError::invalid(SCHEMA, "must be a JSON Schema object")),
            None => Err(ApiError::invalid(
                SCHEMA,
                "response_format json_schema needs json_schema.schema",
            )),
        },
        _ => Err(ApiError::invalid(
            "response_format.type",
            format!("response_format.type must be text, json_object or json_schema, got {rf}"),
        )),
    }
}

/// The Responses API's `text.format` (`{"type": "json_schema", "schema": ...}`).
pub fn responses_format(text: Option<&Json>) -> Result<Format<'_>, ApiError> {
    const SCHEMA: &str = "text.format.schema";
    let Some(f) = text.and_then(|t| t.get("format")).filter(|v| !v.is_null()) else {
        return Ok(Format::Text);
    };
    match f.get("type").and_then(Json::as_str) {
        Some("text") => Ok(Format::Text),
        Some("json_object") => Ok(Format::JsonObject),
        Some("json_schema") => match f.get("schema") {
            Some(s) if s.is_object() => Ok(Format::JsonSchema(s, SCHEMA)),
            _ => Err(ApiError::invalid(SCHEMA, "must be a JSON Schema object")),
        },
        _ => Err(ApiError::invalid(
            "text.format.type",
            format!("text.format.type must be text, json_object or json_schema, got {f}"),
        )),
    }
}

/// The constraint of a request, or `None` when its output is free. A
/// constrained request gets `enable_thinking: false` in `kwargs` (see the
/// module note). `tools` are chat-completions tools, `tool_choice` already
/// checked against them.
pub fn constraint(
    state: &AppState,
    format: Format<'_>,
    tools: &[Json],
    tool_choice: Option<&Json>,
    kwargs: &mut Map<String, Json>,
) -> Result<Option<Constraint>, ApiError> {
    let forced = forced_tools(tools, tool_choice);
    let strict = tools
        .iter()
        .enumerate()
        .filter(|(_, t)| t.pointer("/function/strict").and_then(Json::as_bool) == Some(true));
    let checked: Vec<usize> = if forced.is_empty() {
        strict.map(|(i, _)| i).collect()
    } else {
        forced.clone()
    };
    if checked.is_empty() && matches!(format, Format::Text) {
        return Ok(None);
    }
    let compiler = compiler(state)?;
    if !forced.is_empty() && state.output_format.tool != ToolParser::Hermes {
        // GLM-4.5's `<arg_key>` calls need their own grammar (not written yet).
        return Err(ApiError::invalid(
            "tool_choice",
            "tool_choice required or a named function is enforced only for Hermes-format (Qwen3) tool calls",
        ));
    }
    for &i in &checked {
        let mut params = parameters(&tools[i]);
        compact_layout(&mut params);
        compiler.compile(Grammar::JsonSchema(params)).map_err(|e| {
            ApiError::invalid(
                "tools",
                format!("tools[{i}].function.parameters is not a usable JSON Schema: {e}"),
            )
        })?;
    }
    let (grammar, field) = if !forced.is_empty() {
        (tool_call_grammar(tools, &forced), "tools")
    } else {
        let (mut schema, field) = match format {
            Format::Text => return Ok(None),
            Format::JsonObject => (json!({"type": "object"}), "response_format"),
            Format::JsonSchema(s, field) => (s.clone(), field),
        };
        compact_layout(&mut schema);
        (Grammar::JsonSchema(schema), field)
    };
    let c = compiler
        .compile(grammar)
        .map_err(|e| ApiError::invalid(field, format!("{field} is not a usable grammar: {e}")))?;
    kwargs.insert("enable_thinking".into(), Json::Bool(false));
    Ok(Some(c))
}

fn compiler(state: &AppState) -> Result<&GrammarCompiler, ApiError> {
    state.grammar.as_deref().ok_or_else(|| {
        ApiError::invalid(
            "response_format",
            "structured outputs are not available for this model's tokenizer",
        )
    })
}

/// Indices of the tools a call is forced to: all for `required`, the named
/// one for a named function, none otherwise.
fn forced_tools(tools: &[Json], choice: Option<&Json>) -> Vec<usize> {
    fn name(t: &Json) -> Option<&str> {
        t.pointer("/function/name").and_then(Json::as_str)
    }
    match choice {
        Some(Json::String(s)) if s == "required" => (0..tools.len()).collect(),
        Some(v @ Json::Object(_)) => {
            let wanted = v.pointer("/function/name").and_then(Json::as_str);
            (0..tools.len())
                .filter(|&i| wanted.is_some() && name(&tools[i]) == wanted)
                .collect()
        }
        _ => Vec::new(),
    }
}

/// A function's `parameters`, `{"type": "object"}` when absent.
fn parameters(tool: &Json) -> Json {
    match tool.pointer("/function/parameters") {
        Some(p @ Json::Object(_)) => p.clone(),
        _ => json!({"type": "object"}),
    }
}

/// One Hermes tool call to one of `forced`, as a Lark grammar embedding the
/// call's JSON schema: `{"name": <const>, "arguments": <parameters>}`.
fn tool_call_grammar(tools: &[Json], forced: &[usize]) -> Grammar {
    let calls: Vec<Json> = forced
        .iter()
        .map(|&i| {
            let name = tools[i].pointer("/function/name").cloned();
            json!({
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": parameters(&tools[i])},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect();
    let mut schema = match <[Json; 1]>::try_from(calls) {
        Ok([one]) => one,
        Err(calls) => json!({"anyOf": calls}),
    };
    compact_layout(&mut schema);
    let lit = |s: &str| Json::String(s.to_owned()).to_string();
    Grammar::Lark(format!(
        "start: {} %json {} {}\n",
        lit(&format!("{TOOL_CALL_START}\n")),
        schema,
        lit(&format!("\n{TOOL_CALL_END}")),
    ))
}
