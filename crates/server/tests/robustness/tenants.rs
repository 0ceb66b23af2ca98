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
    let srv = common::start_tweaked(
        None,
        common::test_config(),
        agentd_tools::ToolsConfig::default(),
        |s| s.api_keys = agentd_server::ApiKeys::new(["key-a".to_string(), "key-b".to_string()]),
    );
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
