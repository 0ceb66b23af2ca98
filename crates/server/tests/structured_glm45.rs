//! Forced tool calls on a GLM-4.5 MoE model over a real socket: a tiny
//! random-weight `glm4_moe` (Qwen3's tokenizer and chat template, the
//! family's default `glm45` parsers) under `tool_choice` `required` or a
//! named function writes `<tool_call>NAME\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>...`
//! calls whose arguments, as the `glm45` parser types them, are valid
//! against the schema, for every seed. A random model writes noise, so
//! whatever parses here parses because the grammar forced it.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;

use agentd_models::synth::{write_random_model, ModelCard};
use common::{post, start_dir, test_config};
use serde_json::{json, Value};

const NAME: &str = "tiny-glm45";

/// A random GLM-4.5 MoE (two layers, one dense, hidden 32) with the real
/// Qwen3 vocabulary, written once per target dir, served on its own.
fn server() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("server-tiny-glm45");
        let done = out.join(".complete");
        if !done.is_file() {
            let card = json!({
                "tokenizer": root.join("models/qwen3"),
                "config": {
                    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
                    "vocab_size": 151936, "hidden_size": 32, "intermediate_size": 32,
                    "moe_intermediate_size": 16, "n_routed_experts": 4, "n_shared_experts": 1,
                    "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
                    "routed_scaling_factor": 1.0, "norm_topk_prob": true,
                    "first_k_dense_replace": 1, "use_qk_norm": false, "num_hidden_layers": 2,
                    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                    "partial_rotary_factor": 0.5, "attention_bias": true,
                    "max_position_embeddings": 4096, "rope_theta": 10000,
                    "rms_norm_eps": 1e-05, "tie_word_embeddings": false,
                    "torch_dtype": "float32", "bos_token_id": 151643, "eos_token_id": 151645
                }
            });
            std::fs::create_dir_all(&out).expect("model dir");
            let card_path = out.join("card.json");
            std::fs::write(&card_path, card.to_string()).expect("card");
            let card = ModelCard::from_file(&card_path).expect("card");
            write_random_model(&card.config, &out, 7, card.tokenizer_dir.as_deref())
                .expect("write the tiny GLM-4.5");
            std::fs::write(&done, b"").expect("marker");
        }
        start_dir(&out, NAME, None, test_config())
    })
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "strict": true,
            "parameters": {"type": "object",
                "properties": {
                    "city": {"enum": ["Paris", "Oslo"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 3},
                    "note": {"type": "string", "maxLength": 6},
                    "units": {"type": "object", "properties": {"metric": {"type": "boolean"}},
                        "required": ["metric"], "additionalProperties": false}},
                "required": ["city", "days"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "set_alarm",
            "parameters": {"type": "object",
                "properties": {"on": {"type": "boolean"}, "label": {"type": "string", "maxLength": 4}},
                "required": ["on", "label"], "additionalProperties": false}}},
    ])
}

/// The call's arguments against its tool's schema, written out.
fn assert_valid_call(call: &Value) -> String {
    let name = call["function"]["name"].as_str().expect("name").to_owned();
    let text = call["function"]["arguments"].as_str().expect("arguments");
    let args: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let o = args
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {args}"));
    match name.as_str() {
        "get_weather" => {
            assert!(
                ["Paris", "Oslo"].contains(&o["city"].as_str().unwrap_or("")),
                "{args}"
            );
            assert!(matches!(o["days"].as_i64(), Some(1..=3)), "{args}");
            if let Some(n) = o.get("note") {
                assert!(n.as_str().is_some_and(|s| s.chars().count() <= 6), "{args}");
            }
            if let Some(u) = o.get("units") {
                assert!(
                    u["metric"].is_boolean() && u.as_object().map(|m| m.len()) == Some(1),
                    "{args}"
                );
            }
            assert!(
                o.keys()
                    .all(|k| ["city", "days", "note", "units"].contains(&k.as_str())),
                "{args}"
            );
        }
        "set_alarm" => {
            assert!(o["on"].is_boolean(), "{args}");
            assert!(
                o["label"].as_str().is_some_and(|s| s.chars().count() <= 4),
                "{args}"
            );
            assert_eq!(o.len(), 2, "{args}");
        }
        other => panic!("unknown tool {other}"),
    }
    name
}

fn chat(extra: Value, seed: u64) -> Value {
    let mut body = json!({
        "model": NAME,
        "messages": [{"role": "user", "content": "What is the weather?"}],
        "tools": tools(),
        "max_tokens": 256,
        "temperature": 1.0,
        "seed": seed,
    });
    for (k, v) in extra.as_object().expect("object") {
        body[k] = v.clone();
    }
    let r = post(server(), "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

#[test]
fn glm45_required_and_named_tool_choice_force_valid_calls() {
    let named = json!({"type": "function", "function": {"name": "set_alarm"}});
    for (choice, want) in [(json!("required"), None), (named, Some("set_alarm"))] {
        let mut seen = std::collections::HashSet::new();
        for seed in 0..16 {
            let r = chat(json!({"tool_choice": choice}), seed);
            let c = &r["choices"][0];
            assert_eq!(
                c["finish_reason"], "tool_calls",
                "{choice} seed {seed}: {r}"
            );
            let calls = c["message"]["tool_calls"].as_array().expect("tool_calls");
            assert_eq!(calls.len(), 1, "{r}");
            assert_eq!(c["message"]["content"], Value::Null, "{r}");
            let name = assert_valid_call(&calls[0]);
            if let Some(w) = want {
                assert_eq!(name, w, "{r}");
            }
            seen.insert(
                calls[0]["function"]["arguments"]
                    .as_str()
                    .map(str::to_owned),
            );
        }
        // Sampled values, not one forced string.
        assert!(seen.len() > 1, "{choice}: {seen:?}");
    }
}

#[test]
fn glm45_forced_call_streams_the_same_call() {
    let choice = json!({"type": "function", "function": {"name": "get_weather"}});
    let whole = chat(json!({"tool_choice": choice}), 3);
    let call = &whole["choices"][0]["message"]["tool_calls"][0];
    assert_valid_call(call);
    let mut body = json!({"model": NAME, "stream": true,
        "messages": [{"role": "user", "content": "What is the weather?"}],
        "tools": tools(), "tool_choice": choice, "max_tokens": 256, "temperature": 1.0, "seed": 3});
    body["stream_options"] = json!({"include_usage": false});
    let r = post(server(), "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let (mut name, mut args, mut reason) = (String::new(), String::new(), String::new());
    for e in r.events().iter().filter(|e| *e != "[DONE]") {
        let chunk: Value = serde_json::from_str(e).expect("chunk");
        let choice = &chunk["choices"][0];
        for c in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            name.push_str(c["function"]["name"].as_str().unwrap_or(""));
            args.push_str(c["function"]["arguments"].as_str().unwrap_or(""));
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            reason = f.to_owned();
        }
    }
    assert_eq!(reason, "tool_calls");
    assert_eq!(name, call["function"]["name"].as_str().unwrap_or(""));
    assert_eq!(args, call["function"]["arguments"].as_str().unwrap_or(""));
}

#[test]
fn glm45_tool_schemas_it_cannot_write_are_400s() {
    let tools = json!([{"type": "function", "function": {"name": "open",
        "parameters": {"type": "object", "properties": {"url": {"type": "string", "format": "uri"}},
            "required": ["url"]}}}]);
    let r = post(
        server(),
        "/v1/chat/completions",
        &json!({"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "tools": tools, "tool_choice": "required"}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    let e = r.json();
    assert_eq!(e["error"]["param"], "tools", "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap_or("").contains("url"),
        "{e}"
    );
}
