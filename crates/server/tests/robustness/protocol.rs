//! Refusals made below the handlers, in the OpenAI error shape with the
//! status the stack chose; the `Bearer` scheme in any case; a release that
//! races its program's first request.

use serde_json::json;

use crate::common::{self, raw_request};
use crate::{assert_error_shape, assert_settled};

fn post_raw(path: &str, extra_headers: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\n{extra_headers}\r\n"
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

#[test]
fn the_stack_refuses_in_the_openai_shape() {
    let addr = common::start(None);
    // Over the body limit (axum's default, 2 MB).
    let big = vec![b' '; 3 << 20];
    let r = raw_request(
        addr,
        &post_raw(
            "/v1/completions",
            &format!("Content-Length: {}\r\n", big.len()),
            &big,
        ),
    );
    assert_eq!(r.status, 413, "{}", r.body);
    assert_error_shape(&r, "413");
    // Malformed chunked encoding: a size that is not hex, then one that
    // overflows.
    for chunks in ["zz\r\nabc\r\n0\r\n\r\n", "ffffffffffffffffffff\r\na\r\n"] {
        let r = raw_request(
            addr,
            &post_raw(
                "/v1/completions",
                "Transfer-Encoding: chunked\r\n",
                chunks.as_bytes(),
            ),
        );
        assert_eq!(r.status, 400, "{chunks:?}: {}", r.body);
        assert_error_shape(&r, chunks);
    }

    // Unknown route, wrong method (with its Allow header).
    let r = common::get(addr, "/v1/nothing");
    assert_eq!(r.status, 404);
    assert_error_shape(&r, "404");
    assert!(r.body.contains("/v1/nothing"), "{}", r.body);
    let r = common::get(addr, "/v1/chat/completions");
    assert_eq!(r.status, 405);
    assert_error_shape(&r, "405");
    assert_eq!(r.header("allow"), Some("POST"));
    assert_settled(addr);
}

#[test]
fn a_stalled_body_times_out_with_a_json_error() {
    let srv = common::start_tweaked(
        None,
        common::test_config(),
        agentd_tools::ToolsConfig::default(),
        |s| {
            s.connections = agentd_server::ConnectionLimits {
                header_read_timeout: std::time::Duration::from_millis(500),
                ..Default::default()
            }
        },
    );
    // A body shorter than its Content-Length, and then nothing.
    let t0 = std::time::Instant::now();
    let r = raw_request(
        srv.addr,
        &post_raw("/v1/completions", "Content-Length: 100\r\n", b"{\"a\""),
    );
    assert!(
        r.status == 400 || r.status == 408,
        "{}: {}",
        r.status,
        r.body
    );
    assert_error_shape(&r, "stalled body");
    assert!(t0.elapsed() < std::time::Duration::from_secs(10));
    srv.stop();
}

#[test]
fn the_bearer_scheme_is_case_insensitive() {
    let addr = common::start(Some("k3y"));
    for auth in ["Bearer k3y", "bearer k3y", "BEARER k3y", "bEaReR   k3y "] {
        let r = common::request(addr, "GET", "/v1/models", &[("Authorization", auth)], None);
        assert_eq!(r.status, 200, "{auth}: {}", r.body);
    }
    for auth in ["Bearer k3", "Basic k3y", "k3y", "Bearerk3y", "Bearer", ""] {
        let r = common::request(addr, "GET", "/v1/models", &[("Authorization", auth)], None);
        assert_eq!(r.status, 401, "{auth:?}: {}", r.body);
        assert_error_shape(&r, auth);
    }
}

#[test]
fn a_release_before_the_first_request_makes_that_request_the_last() {
    let addr = common::start(None);
    let r = common::post(addr, "/programs/release", &json!({"program_id": "early"}));
    assert_eq!(r.status, 404, "{}", r.body);
    assert_error_shape(&r, "release");
    let r = common::post(
        addr,
        "/v1/completions",
        &json!({"model": common::MODEL, "prompt": "hi", "max_tokens": 2, "program_id": "early"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    // The program did not outlive its request: nothing to list, no KV.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let list = common::get(addr, "/programs").json();
        let ids: Vec<&str> = list
            .as_array()
            .expect("list")
            .iter()
            .filter_map(|p| p["id"].as_str())
            .collect();
        if !ids.contains(&"early") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still live: {ids:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_settled(addr);
    // The tombstone was consumed: the id starts a normal program again.
    let r = common::post(
        addr,
        "/v1/completions",
        &json!({"model": common::MODEL, "prompt": "hi", "max_tokens": 2, "program_id": "early"}),
    );
    assert_eq!(r.status, 200);
    let list = common::get(addr, "/programs").body;
    assert!(list.contains("\"early\""), "{list}");
}
