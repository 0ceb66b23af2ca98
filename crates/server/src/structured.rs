//! Structured outputs: `response_format` (chat), `text.format` (responses)
//! and forced tool calls (`tool_choice` `required` or a named function) →
//! the grammar the sampler enforces (see `agentd_runtime::sampling::constraint`).
//!
//! Thinking: a constrained request is rendered with `enable_thinking: false`
//! and constrained from its first generated token. The grammar then never
//! has to skip a `<think>` block (vLLM defers the constraint until a
//! reasoning parser sees `</think>`; without that the model could not think
//! inside a JSON grammar anyway), and the model is told it is not thinking,
//! so what it writes is the answer the grammar shapes.
//!
//! Tool calls are constrained in the model's own format
//! (`agentd_runtime::sampling::tool_grammar`: Hermes for Qwen3, GLM-4.5's `<arg_key>` pairs):
//! `tool_choice` `required` or a named function forces one call, its
//! arguments valid against the function's `parameters` (every forced tool,
//! strict or not); under `auto` (or no `tool_choice`), a `strict: true` tool
//! makes the grammar enforce every call the model chooses to write (strict
//! tools' arguments pinned to their schemas, the others' free) while text
//! stays free, as vLLM 0.32 does with its structural tags. Such a request
//! keeps its thinking (the grammar lets one reasoning block through). With
//! a `response_format` too, the output is one call or that JSON (vLLM's
//! `OrFormat`). `tool_choice: none` constrains no call.

use agentd_runtime::sampling::constraint::compact_layout;
use agentd_runtime::sampling::tool_grammar::{self, Calls};
use agentd_runtime::sampling::{Constraint, Grammar, GrammarCompiler};
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
/// request constrained from its first token gets `enable_thinking: false`
/// in `kwargs` (see the module note). `tools` are chat-completions tools,
/// `tool_choice` already checked against them.
pub fn constraint(
    state: &AppState,
    format: Format<'_>,
    tools: &[Json],
    tool_choice: Option<&Json>,
    kwargs: &mut Map<String, Json>,
) -> Result<Option<Constraint>, ApiError> {
    let forced = forced_tools(tools, tool_choice);
    let auto = tool_choice.is_none() || tool_choice.and_then(Json::as_str) == Some("auto");
    let strict: Vec<usize> = (0..tools.len())
        .filter(|&i| tools[i].pointer("/function/strict").and_then(Json::as_bool) == Some(true))
        .collect();
    let checked = if forced.is_empty() { &strict } else { &forced };
    if checked.is_empty() && matches!(format, Format::Text) {
        return Ok(None);
    }
    let compiler = compiler(state)?;
    for &i in checked {
        let mut params = tool_grammar::parameters(&tools[i]);
        compact_layout(&mut params);
        compiler.compile(Grammar::JsonSchema(params)).map_err(|e| {
            ApiError::invalid(
                "tools",
                format!("tools[{i}].function.parameters is not a usable JSON Schema: {e}"),
            )
        })?;
    }
    let json_format = |format: Format<'_>| {
        let (mut schema, field) = match format {
            Format::Text => return None,
            Format::JsonObject => (json!({"type": "object"}), "response_format"),
            Format::JsonSchema(s, field) => (s.clone(), field),
        };
        compact_layout(&mut schema);
        Some((schema, field))
    };
    let calls = |calls| {
        tool_grammar::grammar(state.output_format.tool, tools, calls)
            .map_err(|e| ApiError::invalid("tools", e.0))
    };
    let (grammar, field, thinking) = if !forced.is_empty() {
        (
            Grammar::Lark(calls(Calls::Forced(&forced))?),
            "tools",
            false,
        )
    } else if auto && !strict.is_empty() {
        match json_format(format) {
            None => (
                Grammar::Lark(calls(Calls::Auto { strict: &strict })?),
                "tools",
                true,
            ),
            Some((schema, _)) => {
                let g = calls(Calls::CallOrJson {
                    strict: &strict,
                    schema,
                })?;
                (Grammar::Lark(g), "tools", false)
            }
        }
    } else {
        match json_format(format) {
            None => return Ok(None),
            Some((schema, field)) => (Grammar::JsonSchema(schema), field, false),
        }
    };
    let c = compiler
        .compile(grammar)
        .map_err(|e| ApiError::invalid(field, format!("{field} is not a usable grammar: {e}")))?;
    if !thinking {
        kwargs.insert("enable_thinking".into(), Json::Bool(false));
    }
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
