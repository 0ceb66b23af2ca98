//! The OpenAI API over a real socket, on a real engine with a tiny random
//! Qwen3: chat and completions (whole and streamed), usage and cached
//! tokens across a program's turns, program ids, release, metrics, errors,
//! API key, and a client hanging up mid-stream.

mod common;

use std::time::{Duration, Instant};

use common::{
    get, metric, post, post_and_hang_up, request, shared, start, start_with, test_config, MODEL,
};
use serde_json::{json, Value};

fn chat_body(extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "system", "content": "You are terse."},
                     {"role": "user", "content": "Say hello to the world."}],
        "max_tokens": 6,
        "temperature": 0,
        "ignore_eos": true,
        "chat_template_kwargs": {"enable_thinking": false},
    });
    merge(&mut body, extra);
    body
}

fn merge(body: &mut Value, extra: Value) {
    if let (Some(b), Value::Object(e)) = (body.as_object_mut(), extra) {
        b.extend(e);
    }
}

/// Content deltas of a chat stream, concatenated, and the parsed chunks.
fn stream_chunks(events: &[String]) -> Vec<Value> {
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("chunk JSON"))
        .collect()
}

#[test]
fn chat_whole_and_streamed_agree() {
    let addr = shared();
    let r = post(addr, "/v1/chat/completions", &chat_body(json!({})));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], MODEL);
    let choice = &v["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 6);
    let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 10);
    assert_eq!(v["usage"]["total_tokens"], prompt_tokens + 6);
    assert!(v["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64());
    let whole = choice["message"]["content"]
        .as_str()
        .unwrap_or("")
        .to_string();

    let r = post(
        addr,
        "/v1/chat/completions",
        &chat_body(json!({"stream": true, "stream_options": {"include_usage": true}})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let chunks = stream_chunks(&r.events());
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut streamed = String::new();
    let mut finish = None;
    for c in &chunks {
        if let Some(choice) = c["choices"].get(0) {
            streamed.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
            if let Some(f) = choice["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
        }
    }
    assert_eq!(finish.as_deref(), Some("length"));
    assert_eq!(
        streamed, whole,
        "greedy stream must equal the whole response"
    );
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(chunks.last().unwrap()["choices"], json!([]));
    assert_eq!(usage["completion_tokens"], 6);
    assert_eq!(usage["prompt_tokens"], prompt_tokens);
}

#[test]
fn chat_thinking_and_tools_render() {
    let addr = shared();
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let mut body = chat_body(json!({"tools": tools, "logprobs": true, "top_logprobs": 2}));
    body.as_object_mut().unwrap().remove("chat_template_kwargs");
    let r = post(addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let msg = &v["choices"][0]["message"];
    // Thinking on: the random model never closes `<think>`, so its text is
    // reasoning; either way some text came back.
    let text = format!(
        "{}{}",
        msg["reasoning_content"].as_str().unwrap_or(""),
        msg["content"].as_str().unwrap_or("")
    );
    assert!(!text.is_empty(), "{v}");
    let lp = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(lp.len(), 6);
    assert!(lp[0]["logprob"].as_f64().unwrap() <= 0.0);
    assert_eq!(lp[0]["top_logprobs"].as_array().unwrap().len(), 2);

    // Streamed with tools: the parser's deltas, a finish reason, [DONE].
    merge(&mut body, json!({"stream": true}));
    let r = post(addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let chunks = stream_chunks(&r.events());
    let finish = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["finish_reason"].as_str())
        .collect::<Vec<_>>();
    assert_eq!(finish, ["length"]);
    let streamed: usize = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array())
        .map(Vec::len)
        .sum();
    assert_eq!(streamed, 6, "every token's logprob is streamed once");
}

#[test]
fn completions_text_tokens_stream_and_logprobs() {
    let addr = shared();
    let body = json!({"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 5,
                      "temperature": 0, "ignore_eos": true, "logprobs": 3});
    let r = post(addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 5);
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 5);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 3);
    let whole = v["choices"][0]["text"].as_str().unwrap().to_string();

    let mut sbody = body.clone();
    merge(
        &mut sbody,
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let r = post(addr, "/v1/completions", &sbody);
    assert_eq!(r.status, 200, "{}", r.body);
    let chunks = stream_chunks(&r.events());
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .map(|c| c["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, whole);
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 5);

    // Token ids (and a one-element list of them) as the prompt.
    let ids: Vec<u32> = (1000..1020).collect();
    for prompt in [json!(ids), json!([ids])] {
        let r = post(
            addr,
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 2, "ignore_eos": true}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.json()["usage"]["prompt_tokens"], 20);
    }
}

#[test]
fn completions_return_token_ids_whole_and_streamed() {
    let addr = shared();
    let ids: Vec<u32> = (2000..2024).collect();
    let body = json!({"model": MODEL, "prompt": ids, "max_tokens": 7, "temperature": 0,
                      "ignore_eos": true, "return_token_ids": true});
    let r = post(addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let choice = &v["choices"][0];
    assert_eq!(choice["prompt_token_ids"], json!(ids));
    let whole: Vec<u64> = choice["token_ids"]
        .as_array()
        .expect("token_ids")
        .iter()
        .map(|t| t.as_u64().expect("id"))
        .collect();
    assert_eq!(whole.len(), 7);

    let mut sbody = body.clone();
    merge(&mut sbody, json!({"stream": true}));
    let r = post(addr, "/v1/completions", &sbody);
    assert_eq!(r.status, 200, "{}", r.body);
    let chunks = stream_chunks(&r.events());
    assert_eq!(chunks[0]["choices"][0]["prompt_token_ids"], json!(ids));
    let streamed: Vec<u64> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .flat_map(|c| c["token_ids"].as_array().cloned().unwrap_or_default())
        .map(|t| t.as_u64().expect("id"))
        .collect();
    assert_eq!(streamed, whole, "greedy: the same ids, split over chunks");

    // Without the flag the fields are absent (as in OpenAI's API).
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": ids, "max_tokens": 2, "ignore_eos": true}),
    );
    assert!(r.json()["choices"][0].get("token_ids").is_none());
}

#[test]
fn stop_string_still_reports_cached_tokens() {
    let addr = shared();
    let prompt = "Once upon a time there was a compiler that never finished. ".repeat(6);
    let base = json!({"prompt": prompt, "max_tokens": 12, "temperature": 0,
                      "ignore_eos": true, "program_id": "stopper"});
    let first = post(addr, "/v1/completions", &base);
    assert_eq!(first.status, 200, "{}", first.body);
    let full = first.json()["choices"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 4, "{full:?}");
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let mut body = base.clone();
    merge(&mut body, json!({"stop": [stop]}));
    let r = post(addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    // The same prompt again: all its full blocks are reused, even though the
    // request ended on a stop string (the engine's final usage never arrives).
    assert!(
        cached >= prompt_tokens / 16 * 16 - 16,
        "{cached} of {prompt_tokens}"
    );
    assert!(cached > 0);
}

#[test]
fn stop_string_cuts_the_text() {
    let addr = shared();
    let base = json!({"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0,
                      "ignore_eos": true});
    let full = post(addr, "/v1/completions", &base).json()["choices"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 4, "{full:?}");
    // A stop string from the middle; the answer is the text before its first
    // occurrence.
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let cut = &full[..full.find(&stop).unwrap()];
    for stream in [false, true] {
        let mut body = base.clone();
        merge(&mut body, json!({"stop": [stop.clone()], "stream": stream}));
        let r = post(addr, "/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let (text, finish) = if stream {
            let chunks = stream_chunks(&r.events());
            let text: String = chunks
                .iter()
                .filter_map(|c| c["choices"][0]["text"].as_str())
                .collect();
            let finish = chunks.last().unwrap()["choices"][0]["finish_reason"].clone();
            (text, finish)
        } else {
            let v = r.json();
            (
                v["choices"][0]["text"].as_str().unwrap().to_string(),
                v["choices"][0]["finish_reason"].clone(),
            )
        };
        assert_eq!(text, cut, "stream={stream} full={full:?} stop={stop:?}");
        assert_eq!(finish, "stop");
    }
}

#[test]
fn cached_tokens_grow_on_a_programs_second_turn() {
    let addr = shared();
    let turn1: Vec<u32> = (2000..2040).collect();
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": turn1, "max_tokens": 4, "ignore_eos": true, "program_id": "cache-prog"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let first = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let mut turn2 = turn1.clone();
    turn2.extend(3000..3030);
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": turn2, "max_tokens": 4, "ignore_eos": true, "program_id": "cache-prog"}),
    );
    let second = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        second >= 32 && second > first,
        "first {first}, second {second}"
    );
}

#[test]
fn program_ids_from_body_extra_body_and_header_then_release() {
    let addr = shared();
    let base = json!({"prompt": "hi", "max_tokens": 1, "ignore_eos": true});
    let mut b = base.clone();
    merge(&mut b, json!({"program_id": "pid-body"}));
    assert_eq!(post(addr, "/v1/completions", &b).status, 200);
    let mut b = base.clone();
    merge(&mut b, json!({"extra_body": {"program_id": "pid-extra"}}));
    assert_eq!(post(addr, "/v1/completions", &b).status, 200);
    let r = request(
        addr,
        "POST",
        "/v1/completions",
        &[("X-Session-ID", "pid-header")],
        Some(&base.to_string()),
    );
    assert_eq!(r.status, 200, "{}", r.body);

    let programs = get(addr, "/programs").json();
    let ids: Vec<&str> = programs
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["id"].as_str())
        .collect();
    for id in ["pid-body", "pid-extra", "pid-header"] {
        assert!(ids.contains(&id), "{id} missing from {programs}");
    }
    let p = programs
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == "pid-body")
        .unwrap();
    assert_eq!(p["phase"], "acting");
    assert_eq!(p["lifecycle"], "acting", "{p}");
    // Nothing wanted its memory: no keep / swap / recompute choice.
    assert_eq!(p["park"], Value::Null, "{p}");
    // Acting, it keeps its KV on the device: every full block is there
    // (the partial tail block has no hash yet), none swapped or lost.
    let (device, held) = (p["kv"]["device"].as_u64(), p["blocks_held"].as_u64());
    assert!(
        matches!((device, held), (Some(d), Some(h)) if d <= h && d + 1 >= h),
        "{p}"
    );
    assert_eq!(
        (p["kv"]["host"].as_u64(), p["kv"]["lost"].as_u64()),
        (Some(0), Some(0)),
        "{p}"
    );

    for id in ["pid-body", "pid-extra", "pid-header"] {
        let r = post(addr, "/programs/release", &json!({"program_id": id}));
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.json()["released"], true);
        let r = post(addr, "/programs/release", &json!({"program_id": id}));
        assert_eq!(r.status, 404, "{}", r.body);
        assert!(r.json()["error"]["message"].is_string());
    }
    let programs = get(addr, "/programs").json();
    assert!(!programs
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["id"] == "pid-body" && p["state"] != "terminated"));

    // `final: true` (here inside extra_body) releases after the request.
    let mut b = base.clone();
    merge(
        &mut b,
        json!({"program_id": "pid-final", "extra_body": {"final": true}}),
    );
    assert_eq!(post(addr, "/v1/completions", &b).status, 200);
    let r = post(
        addr,
        "/programs/release",
        &json!({"program_id": "pid-final"}),
    );
    assert_eq!(
        r.status, 404,
        "a final request must release its program: {}",
        r.body
    );
}

#[test]
fn metrics_names_and_counters_move() {
    let addr = shared();
    let before = get(addr, "/metrics");
    assert_eq!(before.status, 200);
    assert!(before
        .header("content-type")
        .unwrap()
        .starts_with("text/plain"));
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:cache_config_info",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:e2e_request_latency_seconds_count",
        "agentd:programs",
        "agentd:program_pauses_total",
        "agentd:program_restores_total",
        "agentd:recomputed_tokens_total",
    ] {
        assert!(
            before.body.contains(&format!("{name}{{")),
            "{name} missing:\n{}",
            before.body
        );
    }
    assert!(before.body.contains("model_name=\"tiny\""));
    let gen0 = metric(&before.body, "vllm:generation_tokens_total");
    let prompt0 = metric(&before.body, "vllm:prompt_tokens_total");
    let e2e0 = metric(&before.body, "vllm:e2e_request_latency_seconds_count");
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "metrics please", "max_tokens": 3, "ignore_eos": true}),
    );
    assert_eq!(r.status, 200);
    let after = get(addr, "/metrics").body;
    assert!(metric(&after, "vllm:generation_tokens_total") >= gen0 + 3.0);
    assert!(metric(&after, "vllm:prompt_tokens_total") > prompt0);
    assert!(metric(&after, "vllm:e2e_request_latency_seconds_count") > e2e0);
}

#[test]
fn models_and_health() {
    let addr = shared();
    let r = get(addr, "/health");
    assert_eq!(r.status, 200);
    let v = get(addr, "/v1/models").json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], MODEL);
    assert_eq!(v["data"][0]["max_model_len"], 4096);
}

#[test]
fn errors_in_openai_shape() {
    let addr = shared();
    let check = |r: common::Resp, status: u16, code: Option<&str>| {
        assert_eq!(r.status, status, "{}", r.body);
        let v = r.json();
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].is_string(), "{v}");
        assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
        if let Some(code) = code {
            assert_eq!(e["code"], code, "{v}");
        }
        v
    };
    let r = request(addr, "POST", "/v1/chat/completions", &[], Some("{not json"));
    check(r, 400, None);
    let r = request(
        addr,
        "POST",
        "/v1/completions",
        &[],
        Some(r#"{"prompt": 5}"#),
    );
    check(r, 400, None);
    let r = request(
        addr,
        "POST",
        "/v1/completions",
        &[],
        Some(r#"{"prompt": "x", "temperature": "hot"}"#),
    );
    check(r, 400, None);
    let r = post(
        addr,
        "/v1/chat/completions",
        &chat_body(json!({"model": "gpt-9"})),
    );
    check(r, 404, Some("model_not_found"));
    let r = post(
        addr,
        "/v1/chat/completions",
        &chat_body(json!({"max_tokens": 5000})),
    );
    check(r, 400, Some("context_length_exceeded"));
    let long: Vec<u32> = (0..5000).map(|i| 100 + i % 1000).collect();
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": long, "max_tokens": 1}),
    );
    check(r, 400, Some("context_length_exceeded"));
    for n in [0, 65] {
        let r = post(addr, "/v1/chat/completions", &chat_body(json!({ "n": n })));
        let v = check(r, 400, None);
        assert_eq!(v["error"]["param"], "n");
    }
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": ["a", "b"], "n": 40, "max_tokens": 1}),
    );
    check(r, 400, None);
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": Vec::<String>::new(), "max_tokens": 1}),
    );
    check(r, 400, None);
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": [999999999], "max_tokens": 1}),
    );
    check(r, 400, None);
    let r = post(
        addr,
        "/v1/chat/completions",
        &chat_body(json!({"temperature": -1})),
    );
    check(r, 400, None);
    let r = post(addr, "/programs/release", &json!({"nope": 1}));
    check(r, 400, None);
}

#[test]
fn api_key_guards_everything_but_health() {
    let addr = start(Some("sekret"));
    assert_eq!(get(addr, "/health").status, 200);
    let r = get(addr, "/v1/models");
    assert_eq!(r.status, 401, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    let r = request(
        addr,
        "GET",
        "/metrics",
        &[("Authorization", "Bearer wrong")],
        None,
    );
    assert_eq!(r.status, 401);
    let r = request(
        addr,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer sekret")],
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let body = json!({"prompt": "hi", "max_tokens": 1}).to_string();
    let r = request(addr, "POST", "/v1/completions", &[], Some(&body));
    assert_eq!(r.status, 401);
}

#[test]
fn overload_is_429() {
    let mut cfg = test_config();
    cfg.max_waiting = 0;
    let addr = start_with(None, cfg);
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 1}),
    );
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
}

#[test]
fn hanging_up_mid_stream_cancels_and_the_next_request_works() {
    let addr = shared();
    let body = json!({"prompt": "a long story", "max_tokens": 3000, "ignore_eos": true,
                      "stream": true, "program_id": "hangup"});
    post_and_hang_up(addr, "/v1/completions", &body);
    // The engine notices the closed stream and finishes the request.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let programs = get(addr, "/programs").json();
        let p = programs
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == "hangup")
            .cloned();
        if let Some(p) = p.as_ref().filter(|p| p["phase"] == "acting") {
            // Cancelled long before its 3000 tokens.
            let context = p["context_tokens"].as_u64().unwrap();
            eprintln!("hung-up program kept {context} tokens");
            assert!(context < 2000, "{p}");
            break;
        }
        assert!(Instant::now() < deadline, "request not cancelled: {p:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let r = post(
        addr,
        "/v1/chat/completions",
        &chat_body(json!({"program_id": "hangup"})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["completion_tokens"], 6);
}
