//! Tool calls as grammars, in the format the model writes and the server's
//! tool-call parser reads back (`--tool-call-parser`):
//!
//! - Hermes (Qwen3): `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`,
//!   the arguments a JSON schema;
//! - GLM-4.5: `<tool_call>NAME\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n...</tool_call>`
//!   (the layout GLM-4.5's chat template renders calls in), string values
//!   raw text, other values JSON, each written so that the `glm45` parser's
//!   type coercion (`agentd_chat::glm45_format::value_types`) reads back a
//!   value valid against the property's schema.
//!
//! Three shapes, as vLLM 0.32's structural tags (`tool_parsers/structural_tag_registry.py`):
//! one forced call (`tool_choice` `required` or a named function); free text
//! in which every call is well formed (`auto` with a `strict` tool: strict
//! tools' arguments follow their schemas, the others' are free, vLLM's
//! triggered tags); one call or a `response_format` JSON (`auto`, a strict
//! tool and a format: vLLM's `OrFormat`). Free text may carry one reasoning
//! block ending in `</think>`, outside the grammar's reach as vLLM defers its
//! grammar past reasoning; text is a lexeme that cannot contain `<tool_call>`
//! (nor, outside reasoning, `</think>`), so the trigger tag, spelled as one
//! token or several, always starts a constrained call.

use agentd_chat::glm45_format::{value_types, KEY_END, KEY_START, VALUE_END, VALUE_START};
use agentd_chat::{ToolParser, THINK_END, TOOL_CALL_END, TOOL_CALL_START};
use serde_json::{json, Value as Json};

use super::constraint::compact_layout;

/// A tool whose parameters no grammar of its format can express: the
/// client's `tools` field is at fault (the server answers 400 naming it).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ToolSchemaError(pub String);

/// What a tool-call grammar allows.
pub enum Calls<'a> {
    /// Exactly one call to one of these tools, arguments valid against
    /// their schemas, and nothing else.
    Forced(&'a [usize]),
    /// Free text and any calls; arguments of the `strict` tools follow
    /// their schemas.
    Auto { strict: &'a [usize] },
    /// One call (arguments of `strict` tools pinned) or the JSON of `schema`.
    CallOrJson { strict: &'a [usize], schema: Json },
}

/// The Lark grammar (llguidance's dialect) of `calls` to `tools` (OpenAI
/// chat tools) in `format`.
pub fn grammar(
    format: ToolParser,
    tools: &[Json],
    calls: Calls<'_>,
) -> Result<String, ToolSchemaError> {
    let (callable, pinned): (Vec<usize>, Vec<bool>) = match &calls {
        Calls::Forced(forced) => (forced.to_vec(), vec![true; forced.len()]),
        Calls::Auto { strict } | Calls::CallOrJson { strict, .. } => (
            (0..tools.len()).collect(),
            (0..tools.len()).map(|i| strict.contains(&i)).collect(),
        ),
    };
    let mut g = String::new();
    // `body`: what follows `<tool_call>` in one call.
    match format {
        ToolParser::Hermes => hermes_body(tools, &callable, &pinned, &mut g),
        ToolParser::Glm45 => glm45_body(tools, &callable, &pinned, &mut g)?,
    }
    g.push_str(&format!("one_call: {} body\n", lit(TOOL_CALL_START)));
    match calls {
        Calls::Forced(_) => g.push_str("start: one_call\n"),
        Calls::CallOrJson { mut schema, .. } => {
            compact_layout(&mut schema);
            g.push_str(&format!("start: one_call | %json {schema}\n"));
        }
        Calls::Auto { .. } => {
            // FREE: text without the trigger or the end of reasoning.
            let free = format!(
                "/(?s:.*)/ & ~/(?s:.*)({}|{})(?s:.*)/",
                rx(TOOL_CALL_START),
                rx(THINK_END)
            );
            g.push_str(&format!(
                "FREE: {free}\nREASONING: FREE {}\nTEXT_CALL: FREE {}\n\
                 start: REASONING? (TEXT_CALL body)* FREE\n",
                lit(THINK_END),
                lit(TOOL_CALL_START),
            ));
        }
    }
    Ok(g)
}

/// Hermes: `\n{"name": <one of the tools>, "arguments": ...}\n</tool_call>`.
fn hermes_body(tools: &[Json], callable: &[usize], pinned: &[bool], g: &mut String) {
    let calls: Vec<Json> = callable
        .iter()
        .zip(pinned)
        .map(|(&i, &pin)| {
            let args = if pin {
                parameters(&tools[i])
            } else {
                json!({"type": "object"})
            };
            json!({
                "type": "object",
                "properties": {"name": {"const": name(&tools[i])}, "arguments": args},
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
    g.push_str(&format!(
        "body: {} %json {schema} {}\n",
        lit("\n"),
        lit(&format!("\n{TOOL_CALL_END}"))
    ));
}

/// GLM-4.5: `NAME\n`, its argument pairs (`<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n`
/// each), `</tool_call>`; one rule per tool.
fn glm45_body(
    tools: &[Json],
    callable: &[usize],
    pinned: &[bool],
    g: &mut String,
) -> Result<(), ToolSchemaError> {
    let mut alts = Vec::with_capacity(callable.len());
    for (&i, &pin) in callable.iter().zip(pinned) {
        let head = lit(&format!("{}\n", name(&tools[i])));
        if pin {
            let pairs = glm45_pairs(i, &parameters(&tools[i]), g)?;
            g.push_str(&format!(
                "call_{i}: {head} {pairs} {}\n",
                lit(TOOL_CALL_END)
            ));
        } else {
            g.push_str(&format!("call_{i}: {head} FREE_ARGS\n"));
        }
        alts.push(format!("call_{i}"));
    }
    if pinned.iter().any(|p| !p) {
        // Free arguments: anything up to the call's end tag.
        g.push_str(&format!(
            "ARGS_TEXT: /(?s:.*)/ & ~/(?s:.*)({}|{})(?s:.*)/\nFREE_ARGS: ARGS_TEXT {}\n",
            rx(TOOL_CALL_START),
            rx(TOOL_CALL_END),
            lit(TOOL_CALL_END)
        ));
    }
    g.push_str(&format!("body: {}\n", alts.join(" | ")));
    Ok(())
}

/// The argument pairs of tool `i`'s `params`, in declared order (required
/// keys always, the others optional), as a rule body; value rules go to `g`.
fn glm45_pairs(i: usize, params: &Json, g: &mut String) -> Result<String, ToolSchemaError> {
    let field = |what: &str| {
        ToolSchemaError(format!(
            "tools[{i}].function.parameters: {what} (GLM-4.5 tool calls)"
        ))
    };
    let top = params
        .as_object()
        .ok_or_else(|| field("must be an object schema"))?;
    if top.get("type").is_some_and(|t| t != "object")
        || ["anyOf", "oneOf", "allOf", "$ref", "not"]
            .iter()
            .any(|k| top.contains_key(*k))
    {
        return Err(field(
            "must be one object schema with `properties` (no anyOf/oneOf/allOf/$ref at its top)",
        ));
    }
    let empty = serde_json::Map::new();
    let props = match top.get("properties") {
        None => &empty,
        Some(Json::Object(p)) => p,
        Some(_) => return Err(field("`properties` must be an object")),
    };
    let required: Vec<&str> = top
        .get("required")
        .and_then(Json::as_array)
        .map(|r| r.iter().filter_map(Json::as_str).collect())
        .unwrap_or_default();
    // Required keys without a schema take any value: raw text is valid.
    let any = json!({});
    let keys = props.iter().map(|(k, s)| (k.as_str(), s)).chain(
        required
            .iter()
            .filter(|k| !props.contains_key(**k))
            .map(|k| (*k, &any)),
    );
    let defs = definitions(top);
    let mut out = Vec::new();
    for (j, (key, schema)) in keys.enumerate() {
        let value = glm45_value(i, j, key, schema, &defs, g).map_err(|e| field(&e))?;
        let pair = format!(
            "{} {value} {}",
            lit(&format!("{KEY_START}{key}{KEY_END}\n{VALUE_START}")),
            lit("\n")
        );
        out.push(if required.contains(&key) {
            pair
        } else {
            format!("[{pair}]")
        });
    }
    Ok(out.join(" "))
}

/// The grammar of one `<arg_value>` (its end tag included) for the
/// property `key` of tool `i`, written so the `glm45` parser's coercion
/// gives a value valid against `schema`: enum members spelled as the
/// template writes them, text for string-typed values, JSON otherwise.
fn glm45_value(
    i: usize,
    j: usize,
    key: &str,
    schema: &Json,
    defs: &serde_json::Map<String, Json>,
    g: &mut String,
) -> Result<String, String> {
    let end = |s: &str| lit(&format!("{s}{VALUE_END}"));
    let members = schema
        .get("enum")
        .and_then(Json::as_array)
        .cloned()
        .or_else(|| schema.get("const").map(|c| vec![c.clone()]));
    if let Some(members) = members {
        if members.is_empty() {
            return Err(format!("property '{key}' has an empty enum"));
        }
        let alts: Vec<String> = members.iter().map(|m| end(&raw_value(m))).collect();
        return Ok(format!("({})", alts.join(" | ")));
    }
    let types = value_types(schema);
    if types.iter().any(|t| t == "string") {
        for unsupported in ["pattern", "format"] {
            if schema.get(unsupported).is_some() {
                return Err(format!(
                    "property '{key}': string `{unsupported}` is not enforced in raw-text values"
                ));
            }
        }
        let min = schema.get("minLength").and_then(Json::as_u64).unwrap_or(0);
        let len = match schema.get("maxLength").and_then(Json::as_u64) {
            Some(max) => format!("{{{min},{max}}}"),
            None => format!("{{{min},}}"),
        };
        // Text that cannot close the value or the call early.
        let tags = [
            "<think>",
            THINK_END,
            TOOL_CALL_START,
            TOOL_CALL_END,
            KEY_START,
            KEY_END,
            VALUE_START,
            VALUE_END,
        ]
        .map(rx)
        .join("|");
        g.push_str(&format!(
            "TEXT_{i}_{j}: /(?s:.{len})/ & ~/(?s:.*)({tags})(?s:.*)/\nVALUE_{i}_{j}: TEXT_{i}_{j} {}\n",
            lit(VALUE_END)
        ));
        return Ok(format!("VALUE_{i}_{j}"));
    }
    let mut sub = schema.clone();
    if let Json::Object(o) = &mut sub {
        for (k, v) in defs {
            o.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    compact_layout(&mut sub);
    Ok(format!("%json {sub} {}", lit(VALUE_END)))
}

/// A value as GLM-4.5's template writes it: strings raw, the rest as JSON.
fn raw_value(v: &Json) -> String {
    match v {
        Json::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The root's `$defs` / `definitions`, for sub-schemas compiled alone.
fn definitions(top: &serde_json::Map<String, Json>) -> serde_json::Map<String, Json> {
    ["$defs", "definitions"]
        .iter()
        .filter_map(|k| top.get(*k).map(|v| (k.to_string(), v.clone())))
        .collect()
}

fn name(tool: &Json) -> &str {
    tool.pointer("/function/name")
        .and_then(Json::as_str)
        .unwrap_or_default()
}

/// A function's `parameters`, `{"type": "object"}` when absent.
pub fn parameters(tool: &Json) -> Json {
    match tool.pointer("/function/parameters") {
        Some(p @ Json::Object(_)) => p.clone(),
        _ => json!({"type": "object"}),
    }
}

/// A Lark string literal: JSON string syntax, DEL escaped too (Lark's
/// string lexeme refuses raw control characters).
fn lit(s: &str) -> String {
    Json::String(s.to_owned())
        .to_string()
        .replace('\u{7f}', "\\u007f")
}

/// `s` as a regex matching itself, for a Lark `/.../` token (`/` spelled
/// `\x2F`, which would end the token).
fn rx(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for c in s.chars() {
        match c {
            '/' => out.push_str("\\x2F"),
            '\\' | '.' | '+' | '*' | '?' | '(' | ')' | '|' | '[' | ']' | '{' | '}' | '^' | '$'
            | '#' | '&' | '-' | '~' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<Json> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather", "strict": true,
                "parameters": {"type": "object",
                    "properties": {"city": {"enum": ["Paris", "Oslo"]},
                        "days": {"type": "integer", "minimum": 1, "maximum": 3},
                        "note": {"type": "string", "maxLength": 8}},
                    "required": ["city", "days"], "additionalProperties": false}}}),
            json!({"type": "function", "function": {"name": "ping"}}),
        ]
    }

    #[test]
    fn glm45_forced_call_spells_the_template_layout() {
        let g = grammar(ToolParser::Glm45, &tools(), Calls::Forced(&[0])).unwrap();
        assert!(g.contains(r#""get_weather\n""#), "{g}");
        assert!(
            g.contains(r#"("Paris</arg_value>" | "Oslo</arg_value>")"#),
            "{g}"
        );
        assert!(
            g.contains(r#"["<arg_key>note</arg_key>\n<arg_value>" VALUE_0_2 "\n"]"#),
            "{g}"
        );
        assert!(g.contains("start: one_call"), "{g}");
    }

    #[test]
    fn glm45_refuses_schemas_it_cannot_write() {
        let bad = [
            json!({"anyOf": [{"type": "object"}]}),
            json!({"type": "array"}),
            json!({"type": "object", "properties": {"u": {"type": "string", "format": "uri"}}}),
            json!({"type": "object", "properties": {"e": {"enum": []}}}),
        ];
        for params in bad {
            let t =
                vec![json!({"type": "function", "function": {"name": "f", "parameters": params}})];
            let e = grammar(ToolParser::Glm45, &t, Calls::Forced(&[0])).unwrap_err();
            assert!(e.0.starts_with("tools[0].function.parameters: "), "{e:?}");
        }
    }

    #[test]
    fn regex_escapes_tags() {
        assert_eq!(rx("</tool_call>"), r"<\x2Ftool_call>");
        assert_eq!(lit("a\u{7f}\n"), r#""a\u007f\n""#);
    }
}
