//! The robustness suite (issue 15): what a hostile or broken client can
//! send, over a real socket, against a real engine and tool side.
//!
//! - [`catalogue`]: hundreds of bad requests (table-driven), each answered
//!   with OpenAI's JSON error object and never a 5xx;
//! - [`protocol`]: refusals made below the handlers (routes, methods,
//!   body limits, chunking, stalled bodies, auth scheme) in the same shape,
//!   and a release racing its program's first request;
//! - [`flood`]: thousands of half-open connections, idle keep-alives;
//! - [`tenants`]: several API keys, each acting only on its own programs
//!   and responses;
//! - [`salt`]: the prefix cache shared only within a tenant and a `cache_salt`.
//!
//! Every test ends by checking the server is still healthy and holds no KV.

#[path = "../common/mod.rs"]
mod common;

mod catalogue;
mod flood;
mod protocol;
mod salt;
mod tenants;

use std::net::SocketAddr;

use serde_json::Value;

/// Asserts the OpenAI error shape: `{"error": {"message": str, "type": str,
/// "param", "code"}}`.
pub fn assert_error_shape(r: &common::Resp, what: &str) {
    let v: Value = serde_json::from_str(&r.body)
        .unwrap_or_else(|e| panic!("{what}: {} is not JSON ({e}): {:?}", r.status, r.body));
    let e = &v["error"];
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: no message in {v}"
    );
    assert!(e["type"].is_string(), "{what}: no type in {v}");
    assert!(
        e.get("param").is_some() && e.get("code").is_some(),
        "{what}: {v}"
    );
    assert!(
        r.header("content-type")
            .is_some_and(|c| c.starts_with("application/json")),
        "{what}: {:?}",
        r.headers
    );
}

/// The server answers `/health` and holds no KV block (every refused or
/// finished request gave its blocks back).
pub fn assert_settled(addr: SocketAddr) {
    assert_settled_as(addr, None);
}

/// [`assert_settled`] for a server with API keys (`key` reads `/metrics`).
pub fn assert_settled_as(addr: SocketAddr, key: Option<&str>) {
    assert_eq!(common::get(addr, "/health").status, 200);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let auth = key.map(|k| format!("Bearer {k}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
    loop {
        let m = common::request(addr, "GET", "/metrics", &headers, None).body;
        let running = common::metric(&m, "vllm:num_requests_running");
        let usage = common::metric(&m, "vllm:kv_cache_usage_perc");
        if running == 0.0 && usage == 0.0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still running {running}, KV usage {usage}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
