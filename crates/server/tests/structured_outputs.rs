//! Structured outputs over a real socket on the random-weight tiny Qwen3:
//! `response_format` json_schema / json_object, `tool_choice` required and
//! named, the Responses API's `text.format`, 400s naming the field, and
//! unconstrained requests left as they were. A random model writes noise, so
//! whatever parses here parses because the grammar forced it.

mod common;

use common::{post, shared};
use serde_json::{json, Value};

/// Small and bounded, so a random model finishes within a few dozen tokens.
fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "n": {"type": "integer", "minimum": 0, "maximum": 9},
            "color": {"enum": ["red", "green", "blue"]},
            "tag": {"type": "string", "maxLength": 6},
        },
        "required": ["ok", "n", "color", "tag"],
        "additionalProperties": false,
    })
}

/// The checks of `schema()`, written out for this one schema.
fn assert_valid(v: &Value) {
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"));
    assert_eq!(o.len(), 4, "{v}");
    assert!(o["ok"].is_boolean(), "{v}");
    assert!(matches!(o["n"].as_i64(), Some(0..=9)), "{v}");
    assert!(
        ["red", "green", "blue"].contains(&o["color"].as_str().unwrap_or("")),
        "{v}"
    );
    assert!(
        o["tag"].as_str().is_some_and(|s| s.chars().count() <= 6),
        "{v}"
    );
}

fn chat(extra: Value, seed: u64) -> Value {
    let mut body = json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": "Give me a record."}],
        "max_tokens": 64,
        "temperature": 1.0,
        "seed": seed,
    });
    for (k, v) in extra.as_object().expect("object") {
        body[k] = v.clone();
    }
    let r = post(shared(), "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

#[test]
fn json_schema_output_parses_and_validates_for_many_seeds() {
    let rf = json!({"response_format": {"type": "json_schema",
        "json_schema": {"name": "record", "strict": true, "schema": schema()}}});
    for seed in 0..24 {
        let r = chat(rf.clone(), seed);
        let c = &r["choices"][0];
        assert_eq!(c["finish_reason"], "stop", "seed {seed}: {r}");
        let text = c["message"]["content"].as_str().expect("content");
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_valid(&v);
    }
}

#[test]
fn json_object_output_is_an_object_whenever_it_stops() {
    // Keys and strings are unbounded under json_object, so a random model
    // often runs to max_tokens inside one; what it did write is still JSON.
    let mut stopped = 0;
    for seed in 0..16 {
        let r = chat(json!({"response_format": {"type": "json_object"}}), seed);
        let c = &r["choices"][0];
        let text = c["message"]["content"].as_str().expect("content");
        assert!(text.starts_with('{'), "{text}");
        if c["finish_reason"] == "stop" {
            let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
            assert!(v.is_object());
            stopped += 1;
        }
    }
    assert!(stopped > 0, "no seed closed its object");
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "strict": true,
            "parameters": {"type": "object",
                "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 3}},
                "required": ["city", "days"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "set_alarm",
            "parameters": {"type": "object",
                "properties": {"on": {"type": "boolean"}},
                "required": ["on"], "additionalProperties": false}}},
    ])
}

fn assert_call(call: &Value) -> String {
    let name = call["function"]["name"].as_str().expect("name").to_owned();
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().expect("args"))
        .expect("arguments parse");
    match name.as_str() {
        "get_weather" => {
            assert!(
                ["Paris", "Oslo"].contains(&args["city"].as_str().unwrap_or("")),
                "{args}"
            );
            assert!(matches!(args["days"].as_i64(), Some(1..=3)), "{args}");
            assert_eq!(args.as_object().map(|o| o.len()), Some(2), "{args}");
        }
        "set_alarm" => assert!(
            args["on"].is_boolean() && args.as_object().map(|o| o.len()) == Some(1),
            "{args}"
        ),
        other => panic!("unknown tool {other}"),
    }
    name
}

#[test]
fn tool_choice_required_and_named_force_a_valid_call() {
    let named = json!({"type": "function", "function": {"name": "set_alarm"}});
    for (choice, want) in [(json!("required"), None), (named, Some("set_alarm"))] {
        for seed in 0..12 {
            let r = chat(json!({"tools": tools(), "tool_choice": choice}), seed);
            let c = &r["choices"][0];
            assert_eq!(c["finish_reason"], "tool_calls", "seed {seed}: {r}");
            let calls = c["message"]["tool_calls"].as_array().expect("tool_calls");
            assert_eq!(calls.len(), 1, "{r}");
            let name = assert_call(&calls[0]);
            if let Some(w) = want {
                assert_eq!(name, w);
            }
        }
    }
}

#[test]
fn responses_text_format_and_tool_choice_are_enforced() {
    let body = json!({"model": "tiny", "input": "Give me a record.", "max_output_tokens": 64,
        "temperature": 1.0, "seed": 3, "store": false,
        "text": {"format": {"type": "json_schema", "name": "record", "schema": schema()}}});
    let r = post(shared(), "/v1/responses", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let out = r.json();
    let text = out["output"]
        .as_array()
        .expect("output")
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["text"].as_str().map(str::to_owned))
        .collect::<String>();
    assert_valid(&serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {out}")));
    let body = json!({"model": "tiny", "input": "Wake me.", "max_output_tokens": 64, "seed": 4, "store": false,
        "tools": [{"type": "function", "name": "set_alarm", "parameters": tools()[1]["function"]["parameters"]}],
        "tool_choice": {"type": "function", "name": "set_alarm"}});
    let r = post(shared(), "/v1/responses", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let out = r.json();
    let call = out["output"]
        .as_array()
        .expect("output")
        .iter()
        .find(|i| i["type"] == "function_call")
        .unwrap_or_else(|| panic!("no call: {out}"))
        .clone();
    assert_eq!(call["name"], "set_alarm");
    let args: Value =
        serde_json::from_str(call["arguments"].as_str().expect("args")).expect("parse");
    assert!(args["on"].is_boolean(), "{args}");
}

#[test]
fn invalid_schemas_are_400s_naming_the_field() {
    let cases = [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "notatype"}}}}),
            "response_format.json_schema.schema",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "notaschema"}}}),
            "response_format.json_schema.schema",
        ),
        (
            json!({"response_format": {"type": "yaml"}}),
            "response_format.type",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "strict": true,
            "parameters": {"type": "object", "properties": {"a": {"type": "notatype"}}}}}]}),
            "tools",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f",
            "parameters": {"type": "object", "properties": {"a": {"type": "notatype"}}}}}],
            "tool_choice": "required"}),
            "tools",
        ),
    ];
    for (extra, param) in cases {
        let mut body = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        let r = post(shared(), "/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{extra}: {}", r.body);
        let e = r.json();
        assert_eq!(e["error"]["param"], param, "{}", r.body);
        assert_eq!(e["error"]["type"], "invalid_request_error");
    }
    let body = json!({"model": "tiny", "input": "hi", "store": false,
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "notatype"}}}});
    let r = post(shared(), "/v1/responses", &body);
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "text.format.schema");
}

#[test]
fn unconstrained_requests_are_unchanged() {
    // `text` and `tool_choice: none` / `auto` compile nothing: the same seed
    // gives the same tokens as a request that names neither.
    let base = chat(json!({}), 5);
    let text = chat(json!({"response_format": {"type": "text"}}), 5);
    assert_eq!(base["choices"][0]["message"], text["choices"][0]["message"]);
    let none = chat(json!({"tools": tools(), "tool_choice": "none"}), 6);
    let auto_nonstrict = chat(
        json!({"tools": [tools()[1].clone()], "tool_choice": "auto"}),
        6,
    );
    for r in [none, auto_nonstrict] {
        assert_eq!(r["choices"][0]["finish_reason"], "length", "{r}");
    }
}

#[test]
fn strict_tools_under_auto_leave_text_and_thinking_as_they_were() {
    // vLLM 0.32 enforces strict tools under `auto` on the calls the model
    // writes, not on its text (tests/serve_families.rs shows a call being
    // enforced). A random model rarely writes `<tool_call>`: with a strict
    // tool it still answers in free text, thinking on (the same prompt as
    // without one). The text is not the same token for token: the grammar's
    // mask (tokens that would open a malformed call, special tokens) is
    // applied before every draw, which renormalises what a seed draws from.
    let strict = tools();
    let mut loose = tools();
    loose[0]["function"]["strict"] = json!(false);
    for seed in 0..4 {
        let a = chat(json!({"tools": strict, "tool_choice": "auto"}), seed);
        let b = chat(json!({"tools": loose, "tool_choice": "auto"}), seed);
        assert_eq!(
            a["usage"]["prompt_tokens"], b["usage"]["prompt_tokens"],
            "seed {seed}: thinking stays on"
        );
        assert_eq!(a["choices"][0]["finish_reason"], "length", "{a}");
        let m = &a["choices"][0]["message"];
        assert_eq!(m["tool_calls"], json!([]), "{a}");
        let text = format!(
            "{}{}",
            m["reasoning_content"].as_str().unwrap_or(""),
            m["content"].as_str().unwrap_or("")
        );
        assert!(!text.is_empty(), "{a}");
        assert!(!text.contains("<tool_call>"), "{a}");
    }
}
