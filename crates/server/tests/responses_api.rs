//! `/v1/responses` over a real socket on the tiny random Qwen3: create,
//! retrieve, delete, a chain through `previous_response_id` that keeps its
//! program's KV (cached tokens cover the previous turn's prompt), streamed
//! events, `store: false` ending the program, background + cancel, a bounded
//! store releasing evicted chains, and refusals.

mod common;

use std::sync::Arc;
use std::time::Duration;

use agentd_engine::Engine;
use agentd_models::Model;
use agentd_server::responses::store::ResponseStore;
use agentd_server::AppState;
use common::{get, model_dir, post, request, shared, test_config, MODEL};
use serde_json::{json, Value};

fn create(addr: std::net::SocketAddr, body: Value) -> Value {
    let r = post(addr, "/v1/responses", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

fn program_ids(addr: std::net::SocketAddr) -> Vec<String> {
    get(addr, "/programs")
        .json()
        .as_array()
        .expect("programs")
        .iter()
        .map(|p| p["id"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The text of the output's message items.
fn output_text(v: &Value) -> String {
    v["output"]
        .as_array()
        .expect("output")
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["text"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn create_retrieve_delete() {
    let addr = shared();
    let v = create(
        addr,
        json!({"model": MODEL, "input": "Say hi.", "max_output_tokens": 6,
        "temperature": 0, "instructions": "Be brief.", "metadata": {"k": "v"}}),
    );
    let id = v["id"].as_str().expect("id").to_string();
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "incomplete", "{v}");
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(v["usage"]["output_tokens"], 6);
    assert!(v["usage"]["input_tokens"].as_u64().unwrap() > 5);
    assert_eq!(v["instructions"], "Be brief.");
    assert_eq!(v["metadata"]["k"], "v");
    assert_eq!(
        v["program_id"],
        id.as_str(),
        "a chain's program is its root response"
    );
    let got = get(addr, &format!("/v1/responses/{id}"));
    assert_eq!(got.status, 200);
    assert_eq!(got.json(), v);
    let del = request(addr, "DELETE", &format!("/v1/responses/{id}"), &[], None);
    assert_eq!(del.status, 200, "{}", del.body);
    assert_eq!(del.json()["deleted"], true);
    assert_eq!(get(addr, &format!("/v1/responses/{id}")).status, 404);
    assert_eq!(
        request(addr, "DELETE", &format!("/v1/responses/{id}"), &[], None).status,
        404
    );
    // Deleting the chain's only response ended its program.
    assert!(!program_ids(addr).contains(&id));
}

#[test]
fn a_chain_is_one_program_whose_kv_is_reused() {
    let addr = shared();
    let tools = json!([{"type": "function", "name": "ls", "description": "List files",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}]);
    let r1 = create(
        addr,
        json!({"input": "List the files in the repository, then read README.",
        "tools": tools, "max_output_tokens": 8, "temperature": 0}),
    );
    let root = r1["id"].as_str().unwrap().to_string();
    assert!(
        program_ids(addr).contains(&root),
        "the chain's program lives on"
    );
    let r2 = create(
        addr,
        json!({"previous_response_id": root, "tools": tools,
        "max_output_tokens": 8, "temperature": 0, "input": [
            {"type": "function_call", "call_id": "call_a", "name": "ls", "arguments": "{\"path\": \".\"}"},
            {"type": "function_call_output", "call_id": "call_a", "output": "README.md src Cargo.toml"}]}),
    );
    let cached = r2["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prev_prompt = r1["usage"]["input_tokens"].as_u64().unwrap();
    assert!(
        cached >= prev_prompt,
        "turn 2 cached {cached} < turn 1 prompt {prev_prompt}"
    );
    assert_eq!(r2["program_id"], root.as_str());
    assert_eq!(r2["previous_response_id"], root.as_str());
    let r3 = create(
        addr,
        json!({"previous_response_id": r2["id"], "tools": tools,
        "max_output_tokens": 4, "temperature": 0, "store": false,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Thanks."}]}]}),
    );
    let cached = r3["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prev_prompt = r2["usage"]["input_tokens"].as_u64().unwrap();
    assert!(
        cached >= prev_prompt,
        "turn 3 cached {cached} < turn 2 prompt {prev_prompt}"
    );
    assert!(r3["usage"]["input_tokens"].as_u64().unwrap() > prev_prompt);
    // `store: false` is not stored and ends the chain's program.
    let id3 = r3["id"].as_str().unwrap();
    assert_eq!(get(addr, &format!("/v1/responses/{id3}")).status, 404);
    assert!(!program_ids(addr).contains(&root));
}

/// `(event name, data)` of a Responses SSE body.
fn sse(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let name = e
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .expect("event line");
            let data = e
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .expect("data line");
            (
                name.to_string(),
                serde_json::from_str(data).expect("json data"),
            )
        })
        .collect()
}

#[test]
fn streamed_events_build_the_stored_response() {
    let addr = shared();
    let r = post(
        addr,
        "/v1/responses",
        &json!({"input": "Count to ten.", "stream": true,
        "max_output_tokens": 10, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let events = sse(&r.body);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(&names[..2], ["response.created", "response.in_progress"]);
    assert_eq!(*names.last().unwrap(), "response.incomplete");
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], name.as_str());
        assert_eq!(data["sequence_number"], i as u64);
    }
    let deltas: String = events
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap().to_string())
        .collect();
    let last = &events.last().unwrap().1["response"];
    assert_eq!(output_text(last), deltas);
    assert_eq!(last["usage"]["output_tokens"], 10);
    let id = last["id"].as_str().unwrap();
    assert_eq!(&get(addr, &format!("/v1/responses/{id}")).json(), last);
}

#[test]
fn background_responses_can_be_cancelled() {
    let addr = shared();
    let v = create(
        addr,
        json!({"input": "Write a long story.", "background": true,
        "max_output_tokens": 400, "ignore_eos": true}),
    );
    assert_eq!(v["status"], "queued");
    let id = v["id"].as_str().unwrap();
    let c = post(addr, &format!("/v1/responses/{id}/cancel"), &json!({}));
    assert_eq!(c.status, 200, "{}", c.body);
    assert_eq!(c.json()["status"], "cancelled");
    let got = get(addr, &format!("/v1/responses/{id}")).json();
    assert_eq!(got["status"], "cancelled");
    // A finished response cannot be cancelled.
    let done = create(addr, json!({"input": "x", "max_output_tokens": 1}));
    let id = done["id"].as_str().unwrap();
    assert_eq!(
        post(addr, &format!("/v1/responses/{id}/cancel"), &json!({})).status,
        400
    );
}

#[test]
fn refusals_name_the_field() {
    let addr = shared();
    let bad = |body: Value, status: u16, param: &str| {
        let r = post(addr, "/v1/responses", &body);
        assert_eq!(r.status, status, "{}", r.body);
        let want = if param.is_empty() {
            Value::Null
        } else {
            json!(param)
        };
        assert_eq!(r.json()["error"]["param"], want, "{}", r.body);
    };
    bad(
        json!({"input": "x", "previous_response_id": "resp_nope"}),
        404,
        "",
    );
    bad(
        json!({"input": [{"type": "item_reference", "id": "x"}]}),
        400,
        "input",
    );
    bad(
        json!({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}),
        400,
        "input",
    );
    bad(
        json!({"input": "x", "tools": [{"type": "web_search"}]}),
        400,
        "tools",
    );
    bad(
        json!({"input": "x", "tool_choice": "sometimes"}),
        400,
        "tool_choice",
    );
    bad(
        json!({"input": "x", "background": true, "store": false}),
        400,
        "background",
    );
    bad(json!({}), 400, "input");
    let f = |params: Value| json!([{"type": "function", "name": "f", "parameters": params}]);
    bad(
        json!({"input": "x", "tools": f(json!("notaschema"))}),
        400,
        "tools",
    );
    bad(
        json!({"input": "x", "tools": f(json!({})), "tool_choice": {"type": "function", "name": "g"}}),
        400,
        "tool_choice",
    );
    bad(
        json!({"input": "x", "tool_choice": "required"}),
        400,
        "tool_choice",
    );
    // The same checks on the chat route.
    let r = post(
        addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": "notaschema"}}]}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "tools");
    assert!(
        r.body.contains("tools[0].function.parameters"),
        "{}",
        r.body
    );
    bad(json!({"input": 5}), 400, "");
    // Fields OpenAI or vLLM define for responses that agentd does not
    // implement: refused by name, from the table chat and completions use.
    for (field, value) in [
        ("include", json!(["message.output_text.logprobs"])),
        ("truncation", json!("auto")),
        ("max_tool_calls", json!(2)),
        ("skip_special_tokens", json!(false)),
        ("structured_outputs", json!({"json": {}})),
    ] {
        let mut body = json!({"input": "x", "max_output_tokens": 2});
        body[field] = value;
        bad(body, 400, field);
    }
}

#[test]
fn fields_no_api_defines_here_are_ignored() {
    let addr = shared();
    let base = json!({"model": MODEL, "input": "Say hi.", "max_output_tokens": 4,
                      "temperature": 0, "store": false});
    let plain = create(addr, base.clone());
    // Unknown fields, chat-only fields and what asks for nothing pass, and
    // change nothing (vLLM logs and ignores them: extra="allow").
    let mut body = base;
    for (k, v) in [
        ("no_such_field", json!({"x": 1})),
        ("prompt_logprobs", json!(3)),
        ("best_of", json!(4)),
        ("include", json!(["reasoning.encrypted_content"])),
        ("truncation", json!("disabled")),
        ("top_logprobs", json!(2)),
        ("parallel_tool_calls", json!(false)),
    ] {
        body[k] = v;
    }
    let v = create(addr, body);
    assert_eq!(output_text(&v), output_text(&plain), "{v}");
    assert_eq!(v["parallel_tool_calls"], false);
}

#[test]
fn an_evicted_chain_releases_its_program() {
    let engine = Engine::with_model(
        Arc::new(Model::load(model_dir()).expect("model")),
        test_config(),
    )
    .expect("engine");
    let mut state = AppState::new(engine, model_dir(), MODEL.into(), None).expect("state");
    state.responses = ResponseStore::new(1, Duration::from_secs(3600));
    let addr = common::start_state(Arc::new(state));
    let a = create(addr, json!({"input": "a", "max_output_tokens": 2}));
    let a_id = a["id"].as_str().unwrap().to_string();
    assert!(program_ids(addr).contains(&a_id));
    let b = create(addr, json!({"input": "b", "max_output_tokens": 2}));
    assert_eq!(get(addr, &format!("/v1/responses/{a_id}")).status, 404);
    assert!(!program_ids(addr).contains(&a_id), "evicted chain released");
    assert!(program_ids(addr).contains(&b["id"].as_str().unwrap().to_string()));
}
