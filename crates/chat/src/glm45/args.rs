//! GLM-4.5 tool-call arguments: `<arg_key>k</arg_key><arg_value>v</arg_value>`
//! pairs → a JSON object string, with each value coerced to its JSON Schema
//! type from the request's tools, as vLLM's `glm45` parser does
//! (`_glm47_arg_converter`, then `ParserEngine._fix_arg_types` with
//! `coerce_to_schema_type`).

use crate::pyjson;
use minijinja::value::Serde;
use minijinja::Value;
use serde_json::{Map, Value as Json};
use std::sync::Arc;

pub const KEY_START: &str = "<arg_key>";
pub const KEY_END: &str = "</arg_key>";
pub const VALUE_START: &str = "<arg_value>";
pub const VALUE_END: &str = "</arg_value>";

/// The request's function tools: names and their parameter `properties`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolSchemas(Arc<Vec<(String, Map<String, Json>)>>);

impl ToolSchemas {
    /// From OpenAI chat tool definitions (`{"type": "function", "function":
    /// {"name", "parameters"}}`); entries without a name are skipped.
    pub fn from_tools(tools: &[Json]) -> Self {
        let list = tools
            .iter()
            .filter_map(|t| {
                let f = t.get("function")?;
                let name = f.get("name")?.as_str()?.to_string();
                let props = f
                    .pointer("/parameters/properties")
                    .and_then(Json::as_object)
                    .cloned()
                    .unwrap_or_default();
                Some((name, props))
            })
            .collect();
        ToolSchemas(Arc::new(list))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// vLLM keeps a call only if its name is one of the request's tools
    /// (any name when the request has none).
    pub fn accepts(&self, name: &str) -> bool {
        self.is_empty() || self.0.iter().any(|(n, _)| n == name)
    }

    fn properties(&self, name: &str) -> Option<&Map<String, Json>> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, p)| p)
    }
}

/// The `(key, value)` pairs of a call body, keys trimmed, later duplicates
/// replacing earlier values in place (a Python dict). Matches vLLM's regex
/// `<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>` including its
/// backtracking: a key runs to the first `</arg_key>` that a value follows.
pub(crate) fn arg_pairs(raw: &str) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    let mut pos = 0;
    'starts: while let Some(s) = raw[pos..].find(KEY_START).map(|i| pos + i) {
        let key_start = s + KEY_START.len();
        let mut from = key_start;
        while let Some(e) = raw[from..].find(KEY_END).map(|i| from + i) {
            let after = raw[e + KEY_END.len()..].trim_start();
            if let Some(value) = after.strip_prefix(VALUE_START) {
                let v_start = raw.len() - value.len();
                let Some(len) = value.find(VALUE_END) else {
                    // No later start can close a value either.
                    break 'starts;
                };
                let key = raw[key_start..e].trim().to_string();
                let value = raw[v_start..v_start + len].to_string();
                match pairs.iter_mut().find(|(k, _)| *k == key) {
                    Some(slot) => slot.1 = value,
                    None => pairs.push((key, value)),
                }
                pos = v_start + len + VALUE_END.len();
                continue 'starts;
            }
            from = e + KEY_END.len();
        }
        pos = s + 1;
    }
    pairs
}

/// The arguments JSON string of a call named `name` with body `raw`.
pub(crate) fn arguments_json(name: &str, raw: &str, tools: &ToolSchemas) -> String {
    if raw.trim().is_empty() {
        return "{}".to_string();
    }
    let props = tools.properties(name);
    let mut out = String::from("{");
    for (i, (key, value)) in arg_pairs(raw).into_iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&dumps(&Json::String(key.clone())));
        out.push_str(": ");
        let schema = props.and_then(|p| p.get(&key)).filter(|s| s.is_object());
        match schema {
            Some(schema) => out.push_str(&coerce(&value, &schema_types(schema))),
            None => out.push_str(&dumps(&Json::String(value))),
        }
    }
    out.push('}');
    out
}

fn dumps(value: &Json) -> String {
    // Serialising a parsed JSON value cannot fail; fall back to serde's
    // spelling rather than panic.
    pyjson::dumps_default(&Value::from(Serde(value))).unwrap_or_else(|_| value.to_string())
}

/// The JSON types a raw `<arg_value>` under `schema` is coerced to by
/// [`arguments_json`] (normalised names: `int` is `integer`), so a grammar
/// can write values the parser reads back as valid: a value whose types
/// include `string` is taken as text unless it converts to another of them.
pub fn value_types(schema: &Json) -> Vec<String> {
    schema_types(schema).iter().map(|t| normalize(t)).collect()
}

/// `extract_types_from_schema`: `type` (string or list), types of `enum`
/// members, recursively `anyOf`/`oneOf`/`allOf`; `["string"]` when none.
fn schema_types(schema: &Json) -> Vec<String> {
    let mut types = Vec::new();
    collect_types(schema, &mut types);
    if types.is_empty() {
        types.push("string".to_string());
    }
    types
}

fn collect_types(schema: &Json, types: &mut Vec<String>) {
    let Some(obj) = schema.as_object() else {
        types.push("string".to_string());
        return;
    };
    match obj.get("type") {
        Some(Json::String(t)) => types.push(t.clone()),
        Some(Json::Array(list)) => {
            types.extend(list.iter().filter_map(Json::as_str).map(str::to_string))
        }
        _ => {}
    }
    if let Some(Json::Array(members)) = obj.get("enum") {
        for m in members {
            let t = match m {
                Json::Null => "null",
                Json::Bool(_) => "boolean",
                Json::Number(n) if n.is_f64() => "number",
                Json::Number(_) => "integer",
                Json::String(_) => "string",
                Json::Array(_) => "array",
                Json::Object(_) => "object",
            };
            types.push(t.to_string());
        }
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(Json::Array(choices)) = obj.get(key) {
            for choice in choices {
                collect_types(choice, types);
            }
        }
    }
}

fn normalize(t: &str) -> String {
    let t = t.trim().to_lowercase();
    let alias = match t.as_str() {
        "str" | "text" | "varchar" | "char" | "enum" => "string",
        "int" | "int32" | "int64" | "uint" | "uint32" | "uint64" | "long" | "short"
        | "unsigned" => "integer",
        "float" | "float32" | "float64" | "double" => "number",
        "bool" => "boolean",
        "dict" => "object",
        "arr" | "list" | "sequence" => "array",
        other => other,
    };
    alias.to_string()
}

/// `coerce_to_schema_type(value, types)` serialised: the first type in the
/// order null > integer > number > boolean > object > array > string that
/// the string converts to; else JSON if it parses; else the string.
fn coerce(value: &str, types: &[String]) -> String {
    let types: Vec<String> = types.iter().map(|t| normalize(t)).collect();
    let has = |t: &str| types.iter().any(|x| x == t);
    let as_string = || dumps(&Json::String(value.to_string()));
    for t in [
        "null", "integer", "number", "boolean", "object", "array", "string",
    ] {
        if !has(t) {
            continue;
        }
        let hit = match t {
            "null" => (value.to_lowercase() == "null").then(|| "null".to_string()),
            "integer" => python_int(value),
            "number" => python_float(value),
            "boolean" => match value.trim().to_lowercase().as_str() {
                "true" | "1" => Some("true".to_string()),
                "false" | "0" => Some("false".to_string()),
                _ => None,
            },
            "object" | "array" => serde_json::from_str::<Json>(value).ok().map(|j| dumps(&j)),
            _ => return as_string(),
        };
        if let Some(hit) = hit {
            return hit;
        }
    }
    match serde_json::from_str::<Json>(value) {
        Ok(j) => dumps(&j),
        Err(_) => as_string(),
    }
}

/// Python's `int(value)` for ASCII decimal spellings (surrounding
/// whitespace, a sign, leading zeros), as a JSON integer of any size.
fn python_int(value: &str) -> Option<String> {
    let t = value.trim();
    let (neg, digits) = match t.as_bytes().first()? {
        b'-' => (true, &t[1..]),
        b'+' => (false, &t[1..]),
        _ => (false, t),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = digits.trim_start_matches('0');
    Some(match (digits.is_empty(), neg) {
        (true, _) => "0".to_string(),
        (false, true) => format!("-{digits}"),
        (false, false) => digits.to_string(),
    })
}

/// Python's `float(value)`, finite only, written back as an integer when
/// integral (`val if val != int(val) else int(val)`).
fn python_float(value: &str) -> Option<String> {
    let f: f64 = value.trim().parse().ok()?;
    if !f.is_finite() {
        return None;
    }
    if f.fract() == 0.0 {
        // Exact decimal digits of an integral double, as Python's int().
        let s = format!("{f:.0}");
        return Some(if s == "-0" { "0".to_string() } else { s });
    }
    serde_json::Number::from_f64(f).map(|n| dumps(&Json::Number(n)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_backtracks_to_a_closing_tag_followed_by_a_value() {
        let raw = "<arg_key>city</arg_key>x<arg_key>days</arg_key><arg_value>2</arg_value>";
        assert_eq!(
            arg_pairs(raw),
            vec![("city</arg_key>x<arg_key>days".to_string(), "2".to_string())]
        );
        let dup = "<arg_key> a </arg_key>\n<arg_value>1</arg_value><arg_key>b</arg_key><arg_value>2</arg_value><arg_key>a</arg_key><arg_value>3</arg_value>";
        assert_eq!(
            arg_pairs(dup),
            vec![("a".into(), "3".into()), ("b".into(), "2".into())]
        );
    }

    #[test]
    fn values_follow_their_schema_types() {
        let tools = ToolSchemas::from_tools(&[json!({"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {
                "i": {"type": "integer"}, "n": {"type": "number"}, "b": {"type": "boolean"},
                "o": {"type": ["null", "object"]}, "s": {"type": "string"}}}}})]);
        let raw = "<arg_key>i</arg_key><arg_value> +007 </arg_value><arg_key>n</arg_key><arg_value>3.0</arg_value>\
                   <arg_key>b</arg_key><arg_value>0</arg_value><arg_key>o</arg_key><arg_value>{\"k\": [1.5]}</arg_value>\
                   <arg_key>s</arg_key><arg_value>5</arg_value><arg_key>x</arg_key><arg_value>é</arg_value>";
        assert_eq!(
            arguments_json("f", raw, &tools),
            r#"{"i": 7, "n": 3, "b": false, "o": {"k": [1.5]}, "s": "5", "x": "é"}"#
        );
        assert_eq!(arguments_json("f", " \n", &tools), "{}");
    }
}
