//! Several API keys are several tenants: each lists, inspects, declares for
//! and releases only its own programs (404 for the others'), and equal ids
//! of two tenants are two programs.

use serde_json::{json, Value};

use crate::assert_error_shape;
use crate::common::{self, Resp};

fn call(
    addr: std::net::SocketAddr,
    key: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Resp {
    let auth = format!("Bearer {key}");
    let body = body.map(|b| b.to_string());
    common::request(
        addr,
        method,
        path,
        &[("Authorization", &auth)],
        body.as_deref(),
    )
}

/// A server with two API keys, `key-a` and `key-b`: two tenants.
pub fn two_tenants() -> common::Server {
    common::start_tweaked(
        None,
        common::test_config(),
        agentd_tools::ToolsConfig::default(),
        |s| s.api_keys = agentd_server::ApiKeys::new(["key-a".to_string(), "key-b".to_string()]),
    )
}

fn ids(addr: std::net::SocketAddr, key: &str) -> Vec<String> {
    let r = call(addr, key, "GET", "/programs", None);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|p| p["id"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn a_tenant_sees_and_releases_only_its_own_programs() {
    let srv = two_tenants();
    let addr = srv.addr;
    let turn = |key: &str, id: &str| {
        let r = call(
            addr,
            key,
            "POST",
            "/v1/completions",
            Some(
                json!({"model": common::MODEL, "prompt": "hi", "max_tokens": 2, "program_id": id}),
            ),
        );
        assert_eq!(r.status, 200, "{}", r.body);
    };
    turn("key-a", "shared-name");
    turn("key-a", "only-a");
    assert_eq!(ids(addr, "key-a").len(), 2);
    assert!(ids(addr, "key-b").is_empty(), "b sees none of a's programs");
    for (method, path, body) in [
        ("GET", "/programs/only-a", None),
        ("GET", "/programs/only-a/environment", None),
        (
            "POST",
            "/programs/release",
            Some(json!({"program_id": "only-a"})),
        ),
    ] {
        let r = call(addr, "key-b", method, path, body);
        assert_eq!(r.status, 404, "{method} {path}: {}", r.body);
        assert_error_shape(&r, path);
    }
    // Still a's, untouched by b's release.
    let r = call(addr, "key-a", "GET", "/programs/only-a", None);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["engine"]["id"], "only-a");
    // The same name under b is b's own program.
    turn("key-b", "shared-name");
    assert_eq!(ids(addr, "key-b"), vec!["shared-name".to_string()]);
    assert_eq!(ids(addr, "key-a").len(), 2);
    let r = call(
        addr,
        "key-a",
        "POST",
        "/programs/release",
        Some(json!({"program_id": "shared-name"})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        ids(addr, "key-b"),
        vec!["shared-name".to_string()],
        "b's program lives"
    );
    // A wrong key is no tenant.
    assert_eq!(call(addr, "key-c", "GET", "/programs", None).status, 401);
    srv.stop();
}

/// A stored response belongs to the tenant that created it: another key
/// cannot retrieve, delete, cancel or continue it (404, as for an unknown
/// id), and deleting the chain releases the owner's program.
#[test]
fn a_tenants_responses_are_404_to_another() {
    let srv = two_tenants();
    let addr = srv.addr;
    let create = |key: &str, previous: Option<&str>| {
        let mut body = json!({"model": common::MODEL, "input": "hello", "max_output_tokens": 2});
        if let Some(p) = previous {
            body["previous_response_id"] = json!(p);
        }
        call(addr, key, "POST", "/v1/responses", Some(body))
    };
    let first = create("key-a", None);
    assert_eq!(first.status, 200, "{}", first.body);
    let id = first.json()["id"].as_str().expect("id").to_string();
    let path = format!("/v1/responses/{id}");
    let cancel = format!("{path}/cancel");
    for (method, p) in [("GET", &path), ("DELETE", &path), ("POST", &cancel)] {
        let r = call(addr, "key-b", method, p, None);
        assert_eq!(r.status, 404, "{method} {p}: {}", r.body);
        assert_error_shape(&r, p);
    }
    let r = create("key-b", Some(&id));
    assert_eq!(r.status, 404, "b continues a's chain: {}", r.body);
    assert_error_shape(&r, "previous_response_id");
    // Still a's, whole.
    assert_eq!(call(addr, "key-a", "GET", &path, None).status, 200);
    let second = create("key-a", Some(&id));
    assert_eq!(second.status, 200, "{}", second.body);
    let id2 = second.json()["id"].as_str().expect("id").to_string();
    assert_eq!(ids(addr, "key-a").len(), 1, "the chain is one program");
    for i in [&id, &id2] {
        let r = call(addr, "key-a", "DELETE", &format!("/v1/responses/{i}"), None);
        assert_eq!(r.status, 200, "{}", r.body);
    }
    // The chain left the store: its program (under a's engine key) ends.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !ids(addr, "key-a").is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "chain program outlives its responses"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    crate::assert_settled_as(addr, Some("key-a"));
    srv.stop();
}
