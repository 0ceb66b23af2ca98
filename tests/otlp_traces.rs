//! `agentd serve --otlp-traces-endpoint`: a program's request spans (with
//! their queueing, admission and end) and the engine's step spans, linked,
//! reach an OTLP/HTTP collector. The collector here is a loopback listener
//! that answers 200 and decodes each body with the OTLP schema
//! (`opentelemetry-proto`), as a collector would.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{http, spawn_serve_env};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use serde_json::json;

/// Accepts OTLP/HTTP posts on loopback; each (path, body) goes to the channel.
fn collector() -> (String, mpsc::Receiver<(String, Vec<u8>)>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming().map_while(Result::ok) {
            let tx = tx.clone();
            std::thread::spawn(move || serve_posts(conn, &tx));
        }
    });
    (addr, rx)
}

/// One connection's posts (keep-alive: several per connection).
fn serve_posts(conn: TcpStream, tx: &mpsc::Sender<(String, Vec<u8>)>) {
    let mut out = conn.try_clone().expect("clone");
    let mut r = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
        let mut len = 0;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let _ = out.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
        );
        let _ = tx.send((path, body));
    }
}

fn attr<'a>(kvs: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    kvs.iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn str_attr<'a>(kvs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    match attr(kvs, key) {
        Some(any_value::Value::StringValue(s)) => Some(s),
        _ => None,
    }
}

/// An integer field: `tracing-opentelemetry` 0.34 exports `u64` fields
/// (the token counts) as their decimal text, `i64` ones as integers.
fn int_attr(kvs: &[KeyValue], key: &str) -> Option<i64> {
    match attr(kvs, key)? {
        any_value::Value::IntValue(v) => Some(*v),
        any_value::Value::StringValue(s) => s.parse().ok(),
        _ => None,
    }
}

/// The spans exported so far, and the service names they came under.
#[derive(Default)]
struct Exported {
    spans: Vec<Span>,
    services: Vec<String>,
}

impl Exported {
    fn add(&mut self, body: &[u8]) {
        let req = ExportTraceServiceRequest::decode(body).expect("an OTLP trace export");
        for rs in req.resource_spans {
            let res = rs.resource.map(|r| r.attributes).unwrap_or_default();
            self.services
                .extend(str_attr(&res, "service.name").map(str::to_string));
            self.spans
                .extend(rs.scope_spans.into_iter().flat_map(|s| s.spans));
        }
    }

    fn request(&self, id: &str) -> Option<&Span> {
        self.spans
            .iter()
            .find(|s| s.name == "request" && str_attr(&s.attributes, "request_id") == Some(id))
    }

    /// Step spans linked to the span `span_id` (`follows_from`).
    fn steps_of(&self, span_id: &[u8]) -> usize {
        self.spans
            .iter()
            .filter(|s| s.name == "step" && s.links.iter().any(|l| l.span_id == span_id))
            .count()
    }
}

fn chat(addr: &str, content: &str) -> String {
    let req = json!({
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 3,
        "temperature": 0,
        "ignore_eos": true,
        "program_id": "otlp-agent",
    });
    let (status, body) = http(addr, "POST", "/v1/chat/completions", Some(&req));
    assert_eq!(status, 200, "{body}");
    serde_json::from_str::<serde_json::Value>(&body).expect("json")["id"]
        .as_str()
        .expect("id")
        .to_string()
}

#[test]
fn a_programs_request_and_step_spans_reach_an_otlp_collector() {
    let (collector, posts) = collector();
    let endpoint = format!("http://{collector}/v1/traces");
    let (_server, addr, _logs) = spawn_serve_env(
        "otlp-cache",
        [
            "--num-kv-blocks",
            "256",
            "--otlp-traces-endpoint",
            &endpoint,
        ],
        // Export every 100 ms instead of every 5 s.
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    );
    // Two turns of one program.
    let ids = [chat(&addr, "hello"), chat(&addr, "and again")];

    // The spans come in batches; wait until both requests' spans came.
    let mut got = Exported::default();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ids.iter().all(|id| got.request(id).is_some()) {
        let left = deadline.saturating_duration_since(Instant::now());
        let (path, body) = posts.recv_timeout(left).unwrap_or_else(|_| {
            panic!(
                "no request spans for {ids:?} within 60 s ({} spans)",
                got.spans.len()
            )
        });
        assert_eq!(path, "/v1/traces");
        got.add(&body);
    }
    // The step spans close before the request's own; a short wait lets a
    // step that ended in the last batch window arrive too.
    while let Ok((_, body)) = posts.recv_timeout(Duration::from_millis(500)) {
        got.add(&body);
    }
    assert!(
        got.services.iter().all(|s| s == "agentd"),
        "{:?}",
        got.services
    );
    let mut programs = HashMap::new();
    for id in &ids {
        let span = got.request(id).expect("request span");
        *programs
            .entry(
                str_attr(&span.attributes, "program")
                    .unwrap_or("")
                    .to_string(),
            )
            .or_insert(0) += 1;
        let events: Vec<&str> = span.events.iter().map(|e| e.name.as_str()).collect();
        for e in ["admitted", "finished"] {
            assert!(events.contains(&e), "{id}: events {events:?} lack {e}");
        }
        assert_eq!(str_attr(&span.attributes, "finish_reason"), Some("length"));
        assert_eq!(
            int_attr(&span.attributes, "completion_tokens"),
            Some(3),
            "{id}"
        );
        assert!(
            int_attr(&span.attributes, "prompt_tokens") > Some(0),
            "{id}"
        );
        // Three tokens take at least two steps after the prefill's; each
        // step follows from the requests in its batch.
        let steps = got.steps_of(&span.span_id);
        assert!(steps >= 2, "{id}: {steps} linked step spans");
    }
    assert_eq!(
        programs.len(),
        1,
        "one program key for both turns: {programs:?}"
    );
    assert!(
        programs.keys().all(|p| p.contains("otlp-agent")),
        "{programs:?}"
    );
}

#[test]
fn a_grpc_endpoint_is_refused_with_the_http_one_named() {
    let (status, lines) = common::serve_fails(
        "otlp-grpc-cache",
        ["--otlp-traces-endpoint", "grpc://localhost:4317"],
    );
    assert!(!status.success());
    let text = lines.join("\n");
    assert!(
        text.contains("not supported: --otlp-traces-endpoint grpc://localhost:4317")
            && text.contains("http://HOST:4318/v1/traces"),
        "{text}"
    );
}
