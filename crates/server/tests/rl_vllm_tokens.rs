//! vLLM's trainer data plane over the real server (issue 31): the token-in
//! `POST /inference/v1/generate` (greedy ids and logprobs equal
//! `/v1/completions`' for the same ids, vLLM's response, logprob and stream
//! shapes, `stop_reason`), a program named by `X-Session-ID` that keeps its
//! KV across turns until `POST /finish_session` releases it and its tool
//! resources, `weight_version` on `/v1/models`, and in dev mode vLLM's
//! disk-backend weight update (`/start_weight_update`, `/update_weights`,
//! `/finish_weight_update`) to a second checkpoint: the output is then that
//! checkpoint's and no block of the old weights is hit; dev mode's
//! `/abort_requests` ends a token-in request by its `request_id`. Bad
//! inputs on each route are clear 4xx JSON and lose nothing.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{
    checkpoint, get, id_list, post, request, second_checkpoint, shared, start, start_dev,
    start_dir, start_tools, test_config, MODEL,
};
use serde_json::{json, Value};

const PROMPT: &str = "The history of the world in one long sentence";

/// The prompt's token ids, from the server's own tokenizer route.
fn ids_of(addr: SocketAddr, text: &str) -> Vec<u64> {
    let r = post(addr, "/tokenize", &json!({"prompt": text}));
    assert_eq!(r.status, 200, "{}", r.body);
    id_list(&r.json()["tokens"])
}

/// A prompt of several full KV blocks (16 tokens each): a repeat hits the
/// cache unless the cache was flushed.
fn long_ids(addr: SocketAddr) -> Vec<u64> {
    ids_of(addr, &[PROMPT; 6].join(". "))
}

fn tokens_generate(addr: SocketAddr, headers: &[(&str, &str)], body: &Value) -> common::Resp {
    request(
        addr,
        "POST",
        "/inference/v1/generate",
        headers,
        Some(&body.to_string()),
    )
}

fn greedy_body(ids: &[u64], max_tokens: u64) -> Value {
    json!({"token_ids": ids, "sampling_params":
           {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": true, "logprobs": 2}})
}

/// (token ids, their logprobs) of a `GenerateResponse`'s first choice.
fn ids_and_logprobs(v: &Value) -> (Vec<u64>, Vec<f64>) {
    let c = &v["choices"][0];
    let lps = c["logprobs"]["content"]
        .as_array()
        .expect("logprobs.content")
        .iter()
        .map(|e| e["logprob"].as_f64().expect("logprob"))
        .collect();
    (id_list(&c["token_ids"]), lps)
}

#[test]
fn greedy_token_in_generate_equals_completions() {
    let addr = shared();
    let ids = ids_of(addr, PROMPT);
    let c = post(
        addr,
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 12, "temperature": 0, "ignore_eos": true,
                "logprobs": 2, "return_token_ids": true}),
    );
    assert_eq!(c.status, 200, "{}", c.body);
    let c = c.json();
    let want = id_list(&c["choices"][0]["token_ids"]);
    let r = tokens_generate(addr, &[], &greedy_body(&ids, 12));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let (got, lps) = ids_and_logprobs(&v);
    assert_eq!(got, want, "the ids /v1/completions generates");
    let want_lps = c["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .expect("token_logprobs");
    for (a, b) in lps.iter().zip(want_lps) {
        assert!(
            (a - b.as_f64().expect("f64")).abs() < 1e-4,
            "{lps:?} vs {want_lps:?}"
        );
    }
    // vLLM's GenerateResponse.
    assert!(v["request_id"]
        .as_str()
        .is_some_and(|s| s.starts_with("generate-tokens-")));
    assert_eq!(v["model"], MODEL);
    assert!(v["created"].as_u64().is_some());
    assert_eq!(v["usage"]["prompt_tokens"].as_u64(), Some(ids.len() as u64));
    assert_eq!(v["usage"]["completion_tokens"], 12);
    assert!(v["prompt_logprobs"].is_null() && v["kv_transfer_params"].is_null());
    let choice = &v["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["finish_reason"], "length");
    assert!(choice["stop_reason"].is_null() && choice["routed_experts"].is_null());
    // Tokens as `token_id:N`, the sampled token first among 2 alternatives.
    let first = &choice["logprobs"]["content"][0];
    assert_eq!(first["token"], format!("token_id:{}", got[0]));
    let top = first["top_logprobs"].as_array().expect("top_logprobs");
    assert_eq!(top.len(), 2, "{first}");
    assert_eq!(top[0]["token"], first["token"]);
    assert_eq!(top[0]["logprob"], first["logprob"]);

    // The id vLLM echoes: the body's, or an X-Request-Id header's.
    let mut body = greedy_body(&ids, 1);
    body["request_id"] = json!("traj-7-turn-2");
    let v = tokens_generate(addr, &[], &body).json();
    assert_eq!(v["request_id"], "generate-tokens-traj-7-turn-2");
    let v = tokens_generate(addr, &[("X-Request-Id", "hdr-1")], &body).json();
    assert_eq!(v["request_id"], "generate-tokens-hdr-1");

    // A stop token ends the output on it; stop_reason names it.
    let at = 3;
    let stop = want[at];
    let cut = want.iter().position(|&t| t == stop).expect("in the output");
    let body = json!({"token_ids": ids, "sampling_params":
                      {"max_tokens": 12, "temperature": 0, "ignore_eos": true,
                       "stop_token_ids": [stop]}});
    let v = tokens_generate(addr, &[], &body).json();
    assert_eq!(id_list(&v["choices"][0]["token_ids"]), want[..=cut]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["stop_reason"], json!(stop));
}

#[test]
fn token_in_generate_streams_vllm_chunks() {
    let addr = shared();
    let ids = ids_of(addr, PROMPT);
    let want = id_list(
        &tokens_generate(addr, &[], &greedy_body(&ids, 10)).json()["choices"][0]["token_ids"],
    );
    let mut body = greedy_body(&ids, 10);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let r = tokens_generate(addr, &[], &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let events: Vec<&str> = r
        .body
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{}", r.body);
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("json chunk"))
        .collect();
    let (usage, steps) = chunks.split_last().expect("chunks");
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 10);
    let mut got = Vec::new();
    for (i, c) in steps.iter().enumerate() {
        assert!(c["request_id"]
            .as_str()
            .is_some_and(|s| s.starts_with("generate-tokens-")));
        let choice = &c["choices"][0];
        got.extend(id_list(&choice["token_ids"]));
        let last = i + 1 == steps.len();
        assert_eq!(choice["finish_reason"].is_null(), !last, "{c}");
        assert_eq!(
            choice["logprobs"]["content"].as_array().map(Vec::len),
            choice["token_ids"].as_array().map(Vec::len)
        );
    }
    assert_eq!(got, want, "the stream's ids are the whole response's");
    assert_eq!(
        steps.last().expect("last")["choices"][0]["finish_reason"],
        "length"
    );
}

/// The program's entry on `/programs`, if listed.
fn program(addr: SocketAddr, id: &str) -> Option<Value> {
    let all = get(addr, "/programs").json();
    all.as_array()?.iter().find(|p| p["id"] == id).cloned()
}

#[test]
fn a_session_keeps_its_kv_across_turns_until_finish_session() {
    let sandbox = tempfile::tempdir().expect("tempdir");
    let root = sandbox.path().canonicalize().expect("canonical");
    let tools = agentd_tools::ToolsConfig {
        sandbox_root: Some(root.clone()),
        ..agentd_tools::ToolsConfig::default()
    };
    let srv = start_tools(None, test_config(), tools);
    let addr = srv.addr;
    let session = [("X-Session-ID", "skyrl-traj-1")];
    let prompt = long_ids(addr);
    let r = tokens_generate(addr, &session, &greedy_body(&prompt, 8));
    assert_eq!(r.status, 200, "{}", r.body);
    let out = id_list(&r.json()["choices"][0]["token_ids"]);
    // Between turns (the tool runs) the program holds its context's blocks.
    let p = program(addr, "skyrl-traj-1").expect("the session is a program");
    assert_eq!(p["phase"], "acting", "{p}");
    assert!(p["blocks_held"].as_u64() > Some(0), "{p}");
    let dir = root.join("traj-1-workdir");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let r = post(
        addr,
        "/programs/skyrl-traj-1/resources",
        &json!({"dirs": [dir.display().to_string()]}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    // Turn 2 continues the context: its whole first turn is reused.
    let mut turn2 = prompt.clone();
    turn2.extend(&out);
    turn2.extend(ids_of(addr, " The tool said: ok."));
    let r = tokens_generate(addr, &session, &greedy_body(&turn2, 4));
    let v = r.json();
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    let turn1 = (prompt.len() + out.len()) as u64;
    // All but the last token of turn 1 (it is fed with turn 2).
    assert!(
        cached >= Some(turn1 - 1),
        "cached {cached:?} of {turn1}: {v}"
    );
    assert_eq!(program(addr, "skyrl-traj-1").expect("listed")["steps"], 2);

    let r = request(
        addr,
        "POST",
        "/finish_session?session_id=skyrl-traj-1",
        &[],
        Some(""),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json(),
        json!({"status": "ok", "session_id": "skyrl-traj-1", "released": true})
    );
    assert!(program(addr, "skyrl-traj-1").is_none(), "released");
    // Its tool resources are reclaimed: the directory goes.
    let deadline = Instant::now() + Duration::from_secs(20);
    while dir.exists() {
        assert!(
            Instant::now() < deadline,
            "the session's directory was not reclaimed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Idempotent: an unknown or finished session is not an error.
    let r = request(
        addr,
        "POST",
        "/finish_session?session_id=skyrl-traj-1",
        &[],
        Some(""),
    );
    assert_eq!(
        (r.status, r.json()["released"].clone()),
        (200, json!(false))
    );
    for q in [
        "/finish_session",
        "/finish_session?session_id=",
        "/finish_session?session_id=%zz",
    ] {
        let r = request(addr, "POST", q, &[], Some(""));
        assert_eq!(r.status, 400, "{q}: {}", r.body);
        assert!(r.json()["error"]["message"].is_string(), "{}", r.body);
    }
    srv.stop();
}

#[test]
fn bad_token_in_requests_are_4xx_json() {
    let addr = shared();
    let cases = [
        (json!({}), 400),
        (json!({"token_ids": [1, 2]}), 400),
        (json!({"token_ids": [], "sampling_params": {}}), 400),
        (json!({"token_ids": [1, -2], "sampling_params": {}}), 400),
        (
            json!({"token_ids": [9_999_999], "sampling_params": {}}),
            400,
        ),
        (json!({"token_ids": "hi", "sampling_params": {}}), 400),
        (
            json!({"token_ids": [1], "sampling_params": {"bogus": 1}}),
            400,
        ),
        (
            json!({"token_ids": [1], "sampling_params": {"temperature": -1}}),
            400,
        ),
        (
            json!({"token_ids": [1], "sampling_params": {"max_tokens": 0}}),
            400,
        ),
        (
            json!({"token_ids": [1], "sampling_params": {"max_tokens": 1_000_000}}),
            400,
        ),
        (
            json!({"token_ids": [1], "sampling_params": {"logprobs": -1}}),
            400,
        ),
        (
            json!({"token_ids": [1], "sampling_params": {"logprobs": 99}}),
            400,
        ),
        (json!({"token_ids": [1], "sampling_params": {"n": 0}}), 400),
        (
            json!({"token_ids": [1], "sampling_params": {"structured_outputs": {"regex": "a"}}}),
            400,
        ),
        (
            json!({"token_ids": [1], "sampling_params": {}, "priority": 3}),
            400,
        ),
        (
            json!({"token_ids": [1], "sampling_params": {}, "features": {"mm_hashes": {}}}),
            400,
        ),
        (
            json!({"token_ids": [1], "sampling_params": {}, "cache_salt": ""}),
            400,
        ),
        (
            json!({"token_ids": [1], "sampling_params": {}, "model": "nope"}),
            404,
        ),
    ];
    for (body, status) in cases {
        let r = tokens_generate(addr, &[], &body);
        assert_eq!(r.status, status, "{body}: {}", r.body);
        assert!(r.json()["error"]["message"].is_string(), "{}", r.body);
    }
    let r = request(
        addr,
        "POST",
        "/inference/v1/generate",
        &[],
        Some("{not json"),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    // Nothing was lost.
    let r = tokens_generate(addr, &[], &greedy_body(&[1, 2, 3], 1));
    assert_eq!(r.status, 200, "{}", r.body);
}

fn post_empty(addr: SocketAddr, path: &str) -> common::Resp {
    request(addr, "POST", path, &[], Some(""))
}

#[test]
fn update_weights_serves_the_second_checkpoint_and_no_old_block() {
    let second = second_checkpoint();
    let addr = start_dev();
    let prompt = long_ids(addr);
    let greedy = |addr| {
        let r = tokens_generate(addr, &[], &greedy_body(&prompt, 16));
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    let before = greedy(addr);
    let cached = |v: &Value| v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    assert!(cached(&greedy(addr)) > Some(0), "cached before the update");
    let want = greedy(start_dir(&second, MODEL, None, test_config()));
    assert_ne!(
        ids_and_logprobs(&want),
        ids_and_logprobs(&before),
        "the checkpoints differ"
    );
    let models = |addr| get(addr, "/v1/models").json()["data"][0]["weight_version"].clone();
    assert_eq!(models(addr), "default");

    let r = post(
        addr,
        "/init_weight_transfer_engine",
        &json!({"init_info": {}}),
    );
    assert_eq!(
        r.json(),
        json!({"message": "Weight transfer initialized"}),
        "{}",
        r.body
    );
    let r = post_empty(addr, "/start_weight_update");
    assert_eq!(
        r.json(),
        json!({"message": "Weight update started"}),
        "{}",
        r.body
    );
    let no_weights = tempfile::tempdir().expect("tempdir");
    let bad = [
        (json!({}), 400),
        (json!({"update_info": null}), 400),
        (
            json!({"update_info": {"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[4]]}}),
            400,
        ),
        (json!({"update_info": {"path": "relative/ckpt"}}), 400),
        (json!({"update_info": {"path": "/nonexistent/ckpt"}}), 400),
        (json!({"update_info": {"path": no_weights.path()}}), 400),
        // Loads, but is another architecture (3 layers, not 2).
        (
            json!({"update_info": {"path": checkpoint("server-tiny-qwen3-3-layers", 3, 2)}}),
            400,
        ),
    ];
    for (body, status) in bad {
        let r = post(addr, "/update_weights", &body);
        assert_eq!(r.status, status, "{body}: {}", r.body);
        assert!(r.json()["error"]["message"].is_string(), "{}", r.body);
        assert_eq!(
            ids_and_logprobs(&greedy(addr)),
            ids_and_logprobs(&before),
            "old weights serve"
        );
    }
    let r = post(
        addr,
        "/update_weights",
        &json!({"update_info": {"path": second}}),
    );
    assert_eq!(
        (r.status, r.json()),
        (200, json!({"message": "Weights updated"})),
        "{}",
        r.body
    );
    // One checkpoint per session, as vLLM's disk backend.
    let r = post(
        addr,
        "/update_weights",
        &json!({"update_info": {"path": second}}),
    );
    assert_eq!(r.status, 409, "{}", r.body);
    let r = post(
        addr,
        "/finish_weight_update",
        &json!({"weight_version": "step-1"}),
    );
    assert_eq!(
        r.json(),
        json!({"message": "Weight update finished"}),
        "{}",
        r.body
    );
    assert_eq!(
        post_empty(addr, "/finish_weight_update").status,
        409,
        "no session"
    );

    let after = greedy(addr);
    assert_eq!(
        ids_and_logprobs(&after),
        ids_and_logprobs(&want),
        "the second checkpoint's output"
    );
    assert_eq!(cached(&after), Some(0), "no block of the old weights hit");
    assert_eq!(models(addr), "step-1");
    assert_eq!(
        get(addr, "/weight_info").json(),
        json!({"weight_version": "step-1"})
    );
}

#[test]
fn weight_routes_need_dev_mode_and_models_show_the_version() {
    let addr = start(None);
    for path in [
        "/update_weights",
        "/start_weight_update",
        "/finish_weight_update",
    ] {
        assert_eq!(post(addr, path, &json!({})).status, 404, "{path}");
    }
    let m = get(addr, "/v1/models").json();
    assert_eq!(m["data"][0]["weight_version"], "default", "{m}");
    let r = post(
        addr,
        "/update_weight_version",
        &json!({"new_version": "v9"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        get(addr, "/v1/models").json()["data"][0]["weight_version"],
        "v9"
    );
}

#[test]
fn abort_requests_reaches_a_token_in_request_by_its_request_id() {
    let addr = start_dev();
    let mut body = greedy_body(&long_ids(addr), 1500);
    body["request_id"] = json!("traj-9-turn-1");
    let t = std::thread::spawn(move || tokens_generate(addr, &[], &body));
    let deadline = Instant::now() + Duration::from_secs(60);
    while get(addr, "/server_info").json()["internal_states"][0]["num_requests"] != 1 {
        assert!(Instant::now() < deadline, "the request never ran");
        std::thread::sleep(Duration::from_millis(10));
    }
    let r = post(
        addr,
        "/abort_requests",
        &json!({"request_ids": ["traj-9-turn-1"]}),
    );
    assert_eq!(
        r.json(),
        json!({"status": "aborted", "aborted": 1}),
        "{}",
        r.body
    );
    let r = t.join().expect("generate");
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["request_id"], "generate-tokens-traj-9-turn-1");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "abort", "{v}");
    let got = id_list(&choice["token_ids"]).len();
    assert!(got < 1500, "aborted mid-way: {got} tokens");
    assert_eq!(v["usage"]["completion_tokens"].as_u64(), Some(got as u64));
}
