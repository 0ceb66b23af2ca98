//! The socket never waits for the engine (issue 18): `/metrics`,
//! `/programs`, `/health` and new submissions answer while a worker holds
//! the engine lock, and a ~100k-token prompt being rendered and tokenized
//! does not hold up `/health` or a short request. Both servers run on a
//! runtime with ONE worker thread, so anything that blocked a runtime
//! thread would stall every other connection and the orderings asserted
//! here would flip.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use agentd_engine::{Engine, EngineConfig, KvEventSink};
use agentd_models::Model;
use agentd_server::AppState;
use common::{get, metric, model_dir, post, test_config, MODEL};
use serde_json::{json, Value};

/// Serves a real engine on a one-worker runtime; returns its address.
fn start_one_worker(cfg: EngineConfig) -> SocketAddr {
    let engine = Engine::with_model(Arc::new(Model::load(model_dir()).expect("model")), cfg)
        .expect("engine");
    let state =
        Arc::new(AppState::new(engine, model_dir(), MODEL.to_string(), None).expect("state"));
    common::spawn_server_on(1, state, std::future::pending()).0
}

/// Holds the engine lock on demand: a KV-event sink runs under the engine
/// lock (after each step's commit), so a sink that blocks is a critical
/// section as long as the test wants.
#[derive(Default)]
struct Gate {
    /// (armed, holding, open)
    state: Mutex<(bool, bool, bool)>,
    cv: Condvar,
}

impl Gate {
    fn sink(self: &Arc<Self>) -> KvEventSink {
        let gate = self.clone();
        KvEventSink::new(move |_, _| gate.hold_if_armed())
    }

    fn hold_if_armed(&self) {
        let mut st = self.state.lock().unwrap();
        if !st.0 {
            return;
        }
        st.0 = false; // once
        st.1 = true;
        self.cv.notify_all();
        while !st.2 {
            st = self.cv.wait(st).unwrap();
        }
        st.1 = false;
    }

    fn arm(&self) {
        self.state.lock().unwrap().0 = true;
    }

    fn wait_holding(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut st = self.state.lock().unwrap();
        while !st.1 {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no step reached the sink");
            st = self.cv.wait_timeout(st, left).unwrap().0;
        }
    }

    fn holding(&self) -> bool {
        self.state.lock().unwrap().1
    }

    fn open(&self) {
        self.state.lock().unwrap().2 = true;
        self.cv.notify_all();
    }
}

/// A completion of `prompt_len` token ids starting at `first` (distinct
/// prompts store new blocks, so their steps reach the KV-event sink).
fn completion(program: &str, first: u32, prompt_len: u32, stream: bool) -> Value {
    json!({
        "model": MODEL, "program_id": program,
        "prompt": (first..first + prompt_len).collect::<Vec<_>>(),
        "max_tokens": 4, "temperature": 0, "ignore_eos": true, "stream": stream,
    })
}

/// Sends a streaming request and returns once the response head arrived,
/// with its status and the open connection.
fn stream_head(addr: SocketAddr, body: &Value) -> (u16, BufReader<TcpStream>) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).ok();
    let body = body.to_string();
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("write");
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).expect("status line");
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    loop {
        line.clear();
        if r.read_line(&mut line).expect("header") <= 2 {
            break;
        }
    }
    (status, r)
}

#[test]
fn reads_and_submissions_answer_while_the_engine_lock_is_held() {
    let gate = Arc::new(Gate::default());
    let addr = start_one_worker(EngineConfig {
        kv_events: Some(gate.sink()),
        ..test_config()
    });
    let r = post(addr, "/v1/completions", &completion("warm", 1, 40, false));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(get(addr, "/programs").body.contains("\"warm\""));

    // The next step that stores blocks blocks in the sink, under the lock.
    gate.arm();
    let held = std::thread::spawn(move || {
        post(
            addr,
            "/v1/completions",
            &completion("held", 1000, 40, false),
        )
    });
    gate.wait_holding();
    let t0 = Instant::now();
    let m = get(addr, "/metrics");
    assert_eq!(m.status, 200);
    assert!(m.body.contains("agentd:engine_lock_hold_seconds_bucket"));
    let programs = get(addr, "/programs");
    assert_eq!(programs.status, 200);
    assert!(programs.body.contains("\"warm\""), "{}", programs.body);
    assert_eq!(get(addr, "/programs/warm").status, 200);
    assert_eq!(get(addr, "/health").status, 200);
    // A submission goes into the inbox without the lock: the streamed
    // response starts (its head comes back) while the step is still held.
    let (status, mut during) = stream_head(addr, &completion("during", 2000, 20, true));
    assert_eq!(status, 200);
    let answered_in = t0.elapsed();
    assert!(
        gate.holding(),
        "every read and the submission answered while the engine lock was held"
    );
    eprintln!("reads and a submission answered in {answered_in:?} under a held engine lock");
    gate.open();
    let r = held.join().expect("held request");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["completion_tokens"], 4);
    let mut rest = String::new();
    during.read_to_string(&mut rest).expect("stream");
    assert!(rest.contains("[DONE]"), "{rest}");
    // The hold shows in the lock histogram: one section longer than 0.1 s.
    let m = get(addr, "/metrics").body;
    let name = "agentd:engine_lock_hold_seconds";
    let bucket = format!("{name}_bucket{{model_name=\"{MODEL}\",le=\"0.1\"}} ");
    let le_100ms: f64 = m
        .lines()
        .find_map(|l| l.strip_prefix(&bucket))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {bucket}in\n{m}"));
    let count = metric(&m, &format!("{name}_count"));
    assert!(count - le_100ms >= 1.0, "{le_100ms} of {count} under 0.1 s");
}

/// ~`n` tokens of text that the tokenizer's word cache cannot shortcut:
/// pseudo-random 5-letter words (about two tokens each).
fn long_text(tokens: usize) -> String {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut s = String::with_capacity(tokens * 3);
    for _ in 0..tokens / 2 {
        s.push(' ');
        for _ in 0..5 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            s.push((b'a' + (x % 26) as u8) as char);
        }
    }
    s
}

#[test]
fn a_100k_token_prompt_does_not_block_the_socket() {
    let addr = start_one_worker(test_config());
    let order = Arc::new(Mutex::new(Vec::<&str>::new()));
    let long = json!({
        "model": MODEL, "max_tokens": 4,
        "messages": [{"role": "user", "content": long_text(100_000)}],
    })
    .to_string();
    let (sent_tx, sent_rx) = std::sync::mpsc::channel();
    let log = order.clone();
    let t0 = Instant::now();
    let long = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(120))).ok();
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            long.len()
        );
        s.write_all(head.as_bytes()).expect("write");
        s.write_all(long.as_bytes()).expect("write");
        sent_tx.send(()).expect("sent");
        let mut raw = String::new();
        let _ = s.read_to_string(&mut raw);
        log.lock().unwrap().push("long");
        raw
    });
    sent_rx.recv().expect("long request sent");
    let health = get(addr, "/health");
    assert_eq!(health.status, 200);
    order.lock().unwrap().push("health");
    // The short request needs a CPU slot of its own for its (tiny)
    // tokenization: the server runs one job per core.
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    if cores >= 2 {
        let short = post(
            addr,
            "/v1/chat/completions",
            &json!({
                "model": MODEL, "max_tokens": 4, "temperature": 0, "ignore_eos": true,
                "messages": [{"role": "user", "content": "hi"}],
            }),
        );
        assert_eq!(short.status, 200, "{}", short.body);
        order.lock().unwrap().push("short");
    } else {
        eprintln!("SKIPPED the short-request half: one core, one tokenization slot");
    }
    let short_done = t0.elapsed();
    let raw = long.join().expect("long request");
    let long_done = t0.elapsed();
    eprintln!("short done at {short_done:?}, the long prompt's answer at {long_done:?}");
    // The tiny model's window is 4096 tokens: the long prompt is refused,
    // after being rendered and tokenized in full.
    assert!(
        raw.starts_with("HTTP/1.1 400"),
        "{}",
        &raw[..raw.len().min(300)]
    );
    let tokens: usize = raw
        .split("your request has ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no token count in {}", &raw[..raw.len().min(600)]));
    assert!(tokens >= 90_000, "{tokens} tokens");
    let order = order.lock().unwrap().clone();
    assert_eq!(
        order.last(),
        Some(&"long"),
        "health and the short request answered while the long prompt was tokenized: {order:?}"
    );
}
