//! vLLM's length semantics over a real socket: requests that name no
//! `max_tokens` / `max_output_tokens` (the openai SDK's, the Agents SDK's
//! and LangChain's default) on a pool far smaller than the model's window.
//! The window is lowered to what one replica's pool holds (8 blocks of 16 =
//! 128 tokens against the tiny Qwen3's 4096), blocks are allocated as the
//! sequence grows, and generation stops at the context length or at EOS;
//! nothing is refused for the window the operator never asked for.

mod common;

use std::net::SocketAddr;
use std::sync::OnceLock;

use agentd_engine::EngineConfig;
use common::{get, post, start_with, MODEL};
use serde_json::{json, Value};

const BLOCKS: usize = 8;
const BLOCK: usize = 16;
/// One replica's pool, in tokens: the served window.
const POOL: u64 = (BLOCKS * BLOCK) as u64;

fn server() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        start_with(
            None,
            EngineConfig {
                num_blocks: BLOCKS,
                block_size: BLOCK,
                ..EngineConfig::default()
            },
        )
    })
}

/// A finished request either ran to the window (`length`, prompt + output
/// fill the 128-token pool exactly) or met EOS before it (`stop`).
fn assert_stopped_at_window_or_eos(reason: &str, prompt: u64, output: u64, what: &str) {
    assert!(output > 0, "{what}: nothing generated");
    match reason {
        "length" => assert_eq!(prompt + output, POOL, "{what}: length before the window"),
        "stop" => assert!(prompt + output <= POOL, "{what}: past the window"),
        other => panic!("{what}: finish reason {other}"),
    }
}

#[test]
fn the_served_window_is_the_pool() {
    let v = get(server(), "/v1/models").json();
    assert_eq!(v["data"][0]["max_model_len"], POOL, "{v}");
}

#[test]
fn chat_without_max_tokens_runs_to_the_context_length() {
    let base = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0, "chat_template_kwargs": {"enable_thinking": false}});
    // With EOS ignored the only end is the window: exactly 128 tokens in all.
    let mut body = base.clone();
    body["ignore_eos"] = json!(true);
    let r = post(server(), "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    let (p, c) = (
        v["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens"),
        v["usage"]["completion_tokens"]
            .as_u64()
            .expect("completion"),
    );
    assert_eq!(p + c, POOL, "{v}");
    assert!(c > 64, "most of the window is output: {v}");
    // As a client sends it (sampled, EOS honoured), streamed too.
    for seed in 0..4 {
        let mut body = base.clone();
        body["temperature"] = json!(1.0);
        body["seed"] = json!(seed);
        let r = post(server(), "/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_stopped_at_window_or_eos(
            v["choices"][0]["finish_reason"].as_str().unwrap_or(""),
            v["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
            v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
            &format!("chat seed {seed}: {v}"),
        );
    }
    let mut body = base;
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let r = post(server(), "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let chunks: Vec<Value> = r
        .events()
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).expect("chunk"))
        .collect();
    let reason = chunks
        .iter()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str())
        .expect("a finish reason");
    let usage = &chunks.last().expect("chunks")["usage"];
    assert_stopped_at_window_or_eos(
        reason,
        usage["prompt_tokens"].as_u64().unwrap_or(0),
        usage["completion_tokens"].as_u64().unwrap_or(0),
        "streamed chat",
    );
}

#[test]
fn completions_without_max_tokens_run_to_the_context_length() {
    let r = post(
        server(),
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "Once upon a time", "temperature": 0,
            "ignore_eos": true}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    let (p, c) = (
        v["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
        v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
    );
    assert_eq!(p + c, POOL, "{v}");
    // A token-id prompt of 100: 28 tokens of room, all used.
    let r = post(
        server(),
        "/v1/completions",
        &json!({"model": MODEL, "prompt": vec![9707; 100], "temperature": 1.0, "seed": 1}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_stopped_at_window_or_eos(
        v["choices"][0]["finish_reason"].as_str().unwrap_or(""),
        v["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
        v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
        &format!("token prompt: {v}"),
    );
    // A prompt that fills the window leaves no room: vLLM's 400.
    let r = post(
        server(),
        "/v1/completions",
        &json!({"model": MODEL, "prompt": vec![9707; POOL as usize]}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("128"), "{}", r.body);
}

#[test]
fn responses_without_max_output_tokens_run_to_the_context_length() {
    let r = post(
        server(),
        "/v1/responses",
        &json!({"model": MODEL, "input": "Tell me a story.", "temperature": 0,
            "ignore_eos": true, "store": false}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    // The window, not max_output_tokens, ended it; OpenAI has one reason
    // for both.
    assert_eq!(v["status"], "incomplete", "{v}");
    assert_eq!(
        v["incomplete_details"]["reason"], "max_output_tokens",
        "{v}"
    );
    let (p, c) = (
        v["usage"]["input_tokens"].as_u64().unwrap_or(0),
        v["usage"]["output_tokens"].as_u64().unwrap_or(0),
    );
    assert_eq!(p + c, POOL, "{v}");
    for seed in 0..3 {
        let r = post(
            server(),
            "/v1/responses",
            &json!({"model": MODEL, "input": "Tell me a story.", "temperature": 1.0,
                "seed": seed, "store": false}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        let reason = match v["status"].as_str() {
            Some("incomplete") => "length",
            Some("completed") => "stop",
            _ => panic!("seed {seed}: {v}"),
        };
        assert_stopped_at_window_or_eos(
            reason,
            v["usage"]["input_tokens"].as_u64().unwrap_or(0),
            v["usage"]["output_tokens"].as_u64().unwrap_or(0),
            &format!("responses seed {seed}: {v}"),
        );
    }
}
