//! vLLM's dev-mode routes over the real server (issue 31): absent unless
//! dev mode is on (`VLLM_SERVER_DEV_MODE=1` in `agentd serve`); `/pause`
//! in vLLM's three modes with a request in flight, `/resume`,
//! `/is_paused`, `/sleep` at levels 1 and 2 and `/wake_up` by tags (the
//! same greedy tokens after), `/is_sleeping`, `/reset_prefix_cache`,
//! `/get_world_size`, `/weight_info`, `/abort_requests`, `/collective_rpc`'s
//! `reload_weights` (its own directory or a second checkpoint), and clear
//! 400s for bad queries. Each
//! test has its own server: a pause stops every request of its engine.

mod common;

use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{
    get, output_ids, post, request, second_checkpoint, start, start_dev, start_dir, test_config,
    MODEL,
};
use serde_json::{json, Value};

fn body(rid: &str, max_new_tokens: u64) -> Value {
    json!({"text": "The history of the world in one long sentence", "rid": rid,
           "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": true}})
}

fn generate_in_thread(addr: SocketAddr, body: Value) -> JoinHandle<Value> {
    std::thread::spawn(move || {
        let r = post(addr, "/generate", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    })
}

/// Waits until the engine has `n` requests running or waiting.
fn wait_requests(addr: SocketAddr, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while get(addr, "/server_info").json()["internal_states"][0]["num_requests"] != n {
        assert!(Instant::now() < deadline, "never {n} requests");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn post_q(addr: SocketAddr, path_and_query: &str) -> common::Resp {
    request(addr, "POST", path_and_query, &[], Some(""))
}

#[test]
fn dev_routes_are_absent_without_dev_mode() {
    let addr = start(None);
    for path in [
        "/pause",
        "/resume",
        "/sleep",
        "/wake_up",
        "/reset_prefix_cache",
    ] {
        let r = post_q(addr, path);
        assert_eq!(r.status, 404, "{path}: {}", r.body);
    }
    assert_eq!(get(addr, "/is_paused").status, 404);
}

#[test]
fn pause_modes_resume_and_reset_prefix_cache() {
    let addr = start_dev();
    assert_eq!(get(addr, "/is_paused").json(), json!({"is_paused": false}));
    assert_eq!(
        get(addr, "/get_world_size").json(),
        json!({"world_size": 1})
    );
    assert_eq!(
        get(addr, "/weight_info").json(),
        json!({"weight_version": "default"})
    );
    let r = post(addr, "/generate", &body("ref", 400));
    let want = output_ids(&r.json());

    // keep: the request stops with its KV and resumes to the same tokens.
    let t = generate_in_thread(addr, body("keep", 400));
    wait_requests(addr, 1);
    let r = post_q(addr, "/pause?mode=keep");
    assert_eq!(
        (r.status, r.json()),
        (200, json!({"status": "paused"})),
        "{}",
        r.body
    );
    assert_eq!(get(addr, "/is_paused").json(), json!({"is_paused": true}));
    // Its blocks are held: the prefix cache cannot be reset.
    assert_eq!(
        post_q(addr, "/reset_prefix_cache").json(),
        json!({"success": false})
    );
    let late = generate_in_thread(addr, body("late", 3));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!late.is_finished(), "a request ran while paused");
    let r = post_q(addr, "/resume");
    assert_eq!((r.status, r.json()), (200, json!({"status": "resumed"})));
    assert_eq!(
        output_ids(&t.join().expect("keep")),
        want,
        "keep resumes exactly"
    );
    assert_eq!(
        late.join().expect("late")["meta_info"]["completion_tokens"],
        3
    );

    // wait: /pause returns once the running request finished by itself.
    let t = generate_in_thread(addr, body("wait", 200));
    wait_requests(addr, 1);
    let r = post_q(addr, "/pause?mode=wait&clear_cache=false");
    assert_eq!(r.status, 200, "{}", r.body);
    let done = t.join().expect("wait");
    assert_eq!(done["meta_info"]["finish_reason"]["type"], "length");
    assert_eq!(done["meta_info"]["completion_tokens"], 200);
    let late = generate_in_thread(addr, body("late2", 2));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!late.is_finished(), "a request ran while paused (wait)");
    post_q(addr, "/resume");
    late.join().expect("late2");

    // abort (the default): the running request ends with abort.
    let t = generate_in_thread(addr, body("abort", 1500));
    wait_requests(addr, 1);
    assert_eq!(post_q(addr, "/pause").status, 200);
    let last = t.join().expect("abort");
    assert_eq!(last["meta_info"]["finish_reason"]["type"], "abort");
    post_q(addr, "/resume");
    assert_eq!(
        post_q(addr, "/reset_prefix_cache").json(),
        json!({"success": true})
    );

    // /abort_requests: by rid, or everything; no pause.
    let t = generate_in_thread(addr, body("by-id", 1500));
    wait_requests(addr, 1);
    let r = post(addr, "/abort_requests", &json!({"request_ids": ["by-id"]}));
    assert_eq!(
        r.json(),
        json!({"status": "aborted", "aborted": 1}),
        "{}",
        r.body
    );
    assert_eq!(
        t.join().expect("by-id")["meta_info"]["finish_reason"]["type"],
        "abort"
    );
    let t = generate_in_thread(addr, body("all", 1500));
    wait_requests(addr, 1);
    let r = post(addr, "/abort_requests", &json!({}));
    assert_eq!(
        r.json(),
        json!({"status": "aborted", "aborted": 1}),
        "{}",
        r.body
    );
    assert_eq!(
        t.join().expect("all")["meta_info"]["finish_reason"]["type"],
        "abort"
    );
    let r = request(addr, "POST", "/abort_requests", &[], Some("{"));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(get(addr, "/is_paused").json(), json!({"is_paused": false}));

    for q in [
        "/pause?mode=later",
        "/pause?clear_cache=maybe",
        "/pause?mode=%zz",
    ] {
        let r = post_q(addr, q);
        assert_eq!(r.status, 400, "{q}: {}", r.body);
        assert!(r.json()["error"]["message"].is_string(), "{}", r.body);
    }
    assert_eq!(get(addr, "/is_paused").json(), json!({"is_paused": false}));
}

#[test]
fn sleep_and_wake_up_by_level_and_tags() {
    let addr = start_dev();
    let want = output_ids(&post(addr, "/generate", &body("ref", 40)).json());
    let sleeping = |addr| get(addr, "/is_sleeping").json()["is_sleeping"].clone();
    assert_eq!(sleeping(addr), json!(false));

    // Level 1: the KV pool; a request waits for the wake-up.
    let r = post_q(addr, "/sleep?level=1");
    assert_eq!((r.status, r.body.as_str()), (200, ""), "{}", r.body);
    assert_eq!(sleeping(addr), json!(true));
    let info = get(addr, "/server_info").json();
    assert_eq!(
        info["internal_states"][0]["memory_released"],
        json!(["kv_cache"])
    );
    let held = generate_in_thread(addr, body("held", 40));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!held.is_finished(), "a request ran while asleep");
    let r = post_q(addr, "/wake_up");
    assert_eq!((r.status, r.body.as_str()), (200, ""), "{}", r.body);
    assert_eq!(sleeping(addr), json!(false));
    assert_eq!(output_ids(&held.join().expect("held")), want);

    // Level 2 (weights too, with a request running: aborted first); woken
    // tag by tag, the weights read again from disk.
    let t = generate_in_thread(addr, body("running", 1500));
    wait_requests(addr, 1);
    assert_eq!(post_q(addr, "/sleep?level=2").status, 200);
    assert_eq!(
        t.join().expect("running")["meta_info"]["finish_reason"]["type"],
        "abort"
    );
    let info = get(addr, "/server_info").json();
    assert_eq!(
        info["internal_states"][0]["memory_released"],
        json!(["weights", "kv_cache"])
    );
    assert_eq!(post_q(addr, "/wake_up?tags=weights").status, 200);
    assert_eq!(sleeping(addr), json!(true), "the KV pool still sleeps");
    assert_eq!(post_q(addr, "/wake_up?tags=kv_cache").status, 200);
    assert_eq!(sleeping(addr), json!(false));
    assert_eq!(
        output_ids(&post(addr, "/generate", &body("after", 40)).json()),
        want
    );

    for (q, want_status) in [
        ("/wake_up", 400),              // nothing asleep
        ("/wake_up?tags=weights", 400), // not asleep
        ("/wake_up?tags=vram", 400),    // no such tag
        ("/sleep?level=3", 400),        // vLLM has levels 1 and 2
        ("/sleep?mode=keep", 400),      // kept requests hold the KV
    ] {
        let r = post_q(addr, q);
        assert_eq!(r.status, want_status, "{q}: {}", r.body);
        assert!(r.json()["error"]["message"].is_string(), "{}", r.body);
    }
    assert_eq!(sleeping(addr), json!(false));
    assert_eq!(
        output_ids(&post(addr, "/generate", &body("end", 40)).json()),
        want
    );
}

/// vLLM's `/collective_rpc` with `reload_weights`, the call of its
/// sleep-mode recipe and of RL scripts: without a path it reloads the
/// weights' own directory (same output); with `weights_path` the second
/// checkpoint serves (greedy output equal to a server started on it, no
/// block of the old weights hit). Other methods and bad bodies are 400
/// JSON with the old weights serving; without dev mode the route is absent.
#[test]
fn collective_rpc_reload_weights() {
    let second = second_checkpoint();
    let addr = start_dev();
    let greedy = |addr| {
        let body = json!({"prompt": "The history of the world in one long sentence",
            "max_tokens": 8, "temperature": 0, "logprobs": 1});
        let r = post(addr, "/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    // The text and its logprobs (the tiny checkpoints may agree on text).
    let text = |v: &Value| {
        let c = &v["choices"][0];
        (c["text"].clone(), c["logprobs"]["token_logprobs"].clone())
    };
    let cached = |v: &Value| v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    let before = text(&greedy(addr));
    let want = text(&greedy(start_dir(&second, MODEL, None, test_config())));
    assert_ne!(before, want, "the checkpoints differ");
    let bad = [
        json!({}),
        json!({"method": 3}),
        json!({"method": "update_weights_disk", "kwargs": {"update_info": {"path": "/x"}}}),
        json!({"method": "reload_weights", "args": ["/x"]}),
        json!({"method": "reload_weights", "kwargs": "x"}),
        json!({"method": "reload_weights", "timeout": "soon"}),
        json!({"method": "reload_weights", "kwargs": {"weights_path": "/nonexistent/ckpt"}}),
        json!({"method": "reload_weights", "kwargs": {"is_checkpoint_format": false}}),
        json!({"method": "reload_weights", "kwargs": {"weights_iterator": []}}),
        json!(["reload_weights"]),
    ];
    for body in bad {
        let r = post(addr, "/collective_rpc", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert!(r.json()["error"]["message"].is_string(), "{}", r.body);
        assert_eq!(
            text(&greedy(addr)),
            before,
            "old weights serve after {body}"
        );
    }
    let r = post(
        addr,
        "/collective_rpc",
        &json!({"method": "reload_weights"}),
    );
    assert_eq!(
        (r.status, r.json()),
        (200, json!({"results": [null]})),
        "{}",
        r.body
    );
    assert_eq!(text(&greedy(addr)), before, "its own weights, reloaded");
    let body =
        json!({"method": "reload_weights", "kwargs": {"weights_path": second}, "timeout": 60});
    let r = post(addr, "/collective_rpc", &body);
    assert_eq!(
        (r.status, r.json()),
        (200, json!({"results": [null]})),
        "{}",
        r.body
    );
    let after = greedy(addr);
    assert_eq!(text(&after), want, "the second checkpoint's output");
    assert_eq!(cached(&after), Some(0), "no block of the old weights hit");
    let r = post(
        start(None),
        "/collective_rpc",
        &json!({"method": "reload_weights"}),
    );
    assert_eq!(r.status, 404, "dev mode only: {}", r.body);
}
