//! SGLang's trainer controls over the real server (issue 31): abort by
//! `rid`, the three pause modes with a request in flight (`in_place` and
//! `retract` resume to the same tokens as an uninterrupted run, `abort`
//! returns the partial output), `/flush_cache` refused while requests run,
//! and a weight update to a second checkpoint (greedy output then equals
//! that checkpoint's, no block cached under the first version is hit, and
//! bad updates are 400s with the old weights still serving). Each test has
//! its own server: a pause stops every request of its engine.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use common::{
    checkpoint, get, id_list, post, request, second_checkpoint, start, start_dir, test_config,
};
use serde_json::{json, Value};

const PROMPT: &str = "The history of the world in one long sentence";
/// A prompt of several full KV blocks (16 tokens each): only full blocks
/// are cached, so a repeat of it hits the cache.
fn cached_prompt() -> String {
    [PROMPT; 6].join(". ")
}
/// Long enough to pause or abort mid-way (ignore_eos): seconds on the tiny model.
const LONG: u64 = 1500;

fn long_body(rid: &str, stream: bool) -> Value {
    json!({"text": PROMPT, "rid": rid, "stream": stream,
           "sampling_params": {"max_new_tokens": LONG, "temperature": 0, "ignore_eos": true}})
}

/// Streams `/generate` from a thread: `started` fires at the first event;
/// the thread returns the last JSON event.
fn stream_generate(addr: SocketAddr, body: Value) -> (mpsc::Receiver<()>, JoinHandle<Value>) {
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(120))).ok();
        let b = body.to_string();
        let head = format!(
            "POST /generate HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            b.len()
        );
        s.write_all(head.as_bytes()).expect("write");
        s.write_all(b.as_bytes()).expect("write");
        let mut last = Value::Null;
        let mut sent = false;
        for line in BufReader::new(s).lines() {
            let Ok(line) = line else { break };
            let Some(data) = line.strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                break;
            }
            last = serde_json::from_str(data).expect("JSON event");
            if !sent {
                sent = true;
                let _ = tx.send(());
            }
        }
        last
    });
    (rx, t)
}

/// A non-streamed `/generate` from a thread.
fn generate_in_thread(addr: SocketAddr, body: Value) -> JoinHandle<Value> {
    std::thread::spawn(move || {
        let r = post(addr, "/generate", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    })
}

fn started(rx: &mpsc::Receiver<()>) {
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the stream started");
}

#[test]
fn abort_request_by_rid_ends_the_request_with_abort() {
    let addr = start(None);
    let (rx, t) = stream_generate(addr, long_body("to-abort", true));
    started(&rx);
    let r = post(addr, "/abort_request", &json!({"rid": "to-abort"}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.is_empty(), "{}", r.body);
    let last = t.join().expect("stream thread");
    let m = &last["meta_info"];
    assert_eq!(m["finish_reason"]["type"], "abort", "{last}");
    let n = id_list(&last["output_ids"]).len() as u64;
    assert!(n > 0 && n < LONG, "partial output: {n}");
    assert_eq!(m["completion_tokens"].as_u64(), Some(n));
    // Unknown rids and abort_all with nothing running are no-ops.
    assert_eq!(
        post(addr, "/abort_request", &json!({"rid": "nope"})).status,
        200
    );
    assert_eq!(
        post(addr, "/abort_request", &json!({"abort_all": true})).status,
        200
    );
    assert_eq!(
        request(addr, "POST", "/abort_request", &[], Some("[1")).status,
        400
    );
}

/// The reference: the long request, uninterrupted.
fn reference(addr: SocketAddr) -> Vec<u64> {
    let r = post(addr, "/generate", &long_body("ref", false));
    assert_eq!(r.status, 200, "{}", r.body);
    id_list(&r.json()["output_ids"])
}

/// Pauses in `mode` with the long request in flight and a second request
/// arriving while paused; returns the long request's last event, the
/// reference, and the second request's result.
fn pause_with_a_request_in_flight(mode: &str) -> (Value, Vec<u64>, Value) {
    let addr = start(None);
    let want = reference(addr);
    let (rx, t) = stream_generate(addr, long_body(&format!("p-{mode}"), true));
    started(&rx);
    let r = post(addr, "/pause_generation", &json!({"mode": mode}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json(),
        json!({"message": "Generation paused successfully.", "status": "ok"})
    );
    // A request arriving while paused waits for the resume.
    let late = generate_in_thread(
        addr,
        json!({"text": "late", "sampling_params": {"max_new_tokens": 3}}),
    );
    std::thread::sleep(Duration::from_millis(400));
    assert!(!late.is_finished(), "a request ran while paused ({mode})");
    let info = get(addr, "/server_info").json();
    assert_eq!(info["internal_states"][0]["paused"], mode, "{info}");
    let flush = post(addr, "/flush_cache", &json!({}));
    match mode {
        // The in-place request holds its KV.
        "in_place" => assert_eq!(flush.status, 400, "{}", flush.body),
        // A retracted request holds none.
        "retract" => assert_eq!(flush.status, 200, "{}", flush.body),
        _ => {}
    }
    let r = post(addr, "/continue_generation", &json!({}));
    assert_eq!(r.status, 200, "{}", r.body);
    let last = t.join().expect("stream thread");
    let late = late.join().expect("late request");
    (last, want, late)
}

#[test]
fn in_place_pause_resumes_to_the_uninterrupted_tokens() {
    let (last, want, late) = pause_with_a_request_in_flight("in_place");
    assert_eq!(last["meta_info"]["finish_reason"]["type"], "length");
    assert_eq!(
        id_list(&last["output_ids"]),
        want,
        "in_place: same tokens as uninterrupted"
    );
    assert_eq!(late["meta_info"]["completion_tokens"], 3);
}

#[test]
fn retract_pause_recomputes_and_loses_no_token() {
    let (last, want, late) = pause_with_a_request_in_flight("retract");
    assert_eq!(last["meta_info"]["finish_reason"]["type"], "length");
    let got = id_list(&last["output_ids"]);
    assert_eq!(got.len(), want.len(), "no token lost or duplicated");
    assert_eq!(got, want, "greedy recompute continues the same tokens");
    assert_eq!(late["meta_info"]["completion_tokens"], 3);
}

#[test]
fn abort_pause_returns_the_partial_output() {
    let (last, want, late) = pause_with_a_request_in_flight("abort");
    assert_eq!(
        last["meta_info"]["finish_reason"]["type"], "abort",
        "{last}"
    );
    let got = id_list(&last["output_ids"]);
    assert!(!got.is_empty() && got.len() < want.len(), "{}", got.len());
    assert_eq!(got, want[..got.len()], "the partial output is a prefix");
    assert_eq!(late["meta_info"]["completion_tokens"], 3);
}

#[test]
fn flush_cache_is_refused_while_a_request_runs() {
    let addr = start(None);
    let (rx, t) = stream_generate(addr, long_body("busy", true));
    started(&rx);
    let r = request(addr, "GET", "/flush_cache", &[], None);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.json()["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("running")));
    post(addr, "/abort_request", &json!({"abort_all": true}));
    t.join().expect("stream");
    // Idle: flushed, and the next request hits nothing.
    let body = json!({"text": cached_prompt(), "sampling_params": {"max_new_tokens": 1}});
    post(addr, "/generate", &body);
    let again = post(addr, "/generate", &body).json();
    assert!(
        again["meta_info"]["cached_tokens"].as_u64() > Some(0),
        "{again}"
    );
    let r = request(addr, "POST", "/flush_cache", &[], None);
    assert_eq!(r.status, 200, "{}", r.body);
    let after = post(addr, "/generate", &body).json();
    assert_eq!(after["meta_info"]["cached_tokens"], 0, "{after}");
}

#[test]
fn bad_control_bodies_are_4xx_json() {
    let addr = start(None);
    for (path, body) in [
        ("/pause_generation", json!({"mode": "sideways"})),
        ("/pause_generation", json!({"mode": 3})),
        ("/update_weight_version", json!({})),
        ("/update_weights_from_disk", json!({})),
        ("/update_weights_from_disk", json!({"model_path": 7})),
    ] {
        let r = post(addr, path, &body);
        assert_eq!(r.status, 400, "{path} {body}: {}", r.body);
        assert!(r.json()["error"]["message"].is_string(), "{}", r.body);
    }
    // Weight versions.
    assert_eq!(
        get(addr, "/weight_version").json(),
        json!({"weight_version": "default"})
    );
    let r = post(
        addr,
        "/update_weight_version",
        &json!({"new_version": "step-7"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["new_version"], "step-7");
    assert_eq!(
        get(addr, "/get_weight_version").json()["weight_version"],
        "step-7"
    );
    assert_eq!(get(addr, "/model_info").json()["weight_version"], "step-7");
    assert_eq!(get(addr, "/get_model_info").json()["is_generation"], true);
    assert_eq!(get(addr, "/get_server_info").status, 200);
    assert_eq!(get(addr, "/health_generate").status, 200);
    // Nothing was lost.
    let r = post(
        addr,
        "/generate",
        &json!({"text": "ok", "sampling_params": {"max_new_tokens": 1}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

/// A copy of `dir` whose config.json has `key` set to `value`.
fn edited_copy(dir: &Path, name: &str, key: &str, value: Value) -> PathBuf {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&out).expect("dir");
    for f in std::fs::read_dir(dir).expect("read dir") {
        let f = f.expect("entry").path();
        if f.is_file() {
            std::fs::copy(&f, out.join(f.file_name().expect("name"))).expect("copy");
        }
    }
    let path = out.join("config.json");
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("config")).expect("json");
    cfg[key] = value;
    std::fs::write(&path, cfg.to_string()).expect("write config");
    out
}

fn greedy(addr: SocketAddr) -> Value {
    let r = post(
        addr,
        "/generate",
        &json!({"text": cached_prompt(), "return_logprob": true,
                "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": true}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

#[test]
fn a_weight_update_serves_the_new_checkpoint_and_no_old_block() {
    let second = second_checkpoint();
    let addr = start(None);
    let before = greedy(addr);
    let again = greedy(addr);
    assert!(
        again["meta_info"]["cached_tokens"].as_u64() > Some(0),
        "cached before the update"
    );
    // The second checkpoint's own greedy output, from a server on it.
    let other = start_dir(&second, common::MODEL, None, test_config());
    let want = greedy(other);
    // Tokens and their logprobs: random weights may agree on the argmax.
    let tokens = |v: &Value| {
        (
            v["output_ids"].clone(),
            v["meta_info"]["output_token_logprobs"].clone(),
        )
    };
    assert_ne!(tokens(&want), tokens(&before), "the checkpoints differ");
    // Refused updates: the old weights keep serving.
    let bad = [
        json!({"model_path": "/nonexistent/model"}),
        // Loads, but is another architecture (3 layers, not 2).
        json!({"model_path": checkpoint("server-tiny-qwen3-3-layers", 3, 2)}),
        // Its config promises tensors the file does not have.
        json!({"model_path": edited_copy(&second, "tiny-more-layers", "num_hidden_layers", json!(3))}),
        json!({"model_path": edited_copy(&second, "tiny-wider-mlp", "intermediate_size", json!(256))}),
        json!({"model_path": second, "load_format": "gguf"}),
    ];
    for body in bad {
        let r = post(addr, "/update_weights_from_disk", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        let v = r.json();
        assert_eq!(v["success"], false, "{v}");
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()));
        assert_eq!(tokens(&greedy(addr)), tokens(&before), "old weights serve");
    }
    let r = post(
        addr,
        "/update_weights_from_disk",
        &json!({"model_path": second, "weight_version": "v2"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["success"], true, "{v}");
    assert_eq!(v["num_paused_requests"], 0);
    assert!(
        v["message"].as_str().is_some_and(|m| m.contains("v2")),
        "{v}"
    );
    let after = greedy(addr);
    assert_eq!(tokens(&after), tokens(&want), "the new checkpoint's tokens");
    assert_eq!(
        after["meta_info"]["cached_tokens"], 0,
        "no block of the old weights hit"
    );
    assert_eq!(after["meta_info"]["weight_version"], "v2");
    assert_eq!(get(addr, "/weight_version").json()["weight_version"], "v2");
    assert_eq!(
        get(addr, "/model_info").json()["model_path"],
        json!(second.display().to_string())
    );
}

#[test]
fn a_weight_update_waits_for_the_requests_in_flight() {
    let second = second_checkpoint();
    let addr = start(None);
    let want_old = reference(addr);
    let (rx, t) = stream_generate(addr, long_body("in-flight", true));
    started(&rx);
    let update = std::thread::spawn(move || {
        post(
            addr,
            "/update_weights_from_disk",
            &json!({"model_path": second}),
        )
    });
    let last = t.join().expect("stream");
    // The request in flight finished on the old weights, whole.
    assert_eq!(id_list(&last["output_ids"]), want_old);
    let r = update.join().expect("update");
    assert_eq!(r.status, 200, "{}", r.body);
}
