//! Prefix-cache salting (vLLM's `cache_salt`, and a salt per tenant): the
//! same prompt is served from cache only to a request of the same tenant
//! and the same `cache_salt`; what another tenant or salt computed is never
//! reported (nor reused) as cached. `usage.prompt_tokens_details.cached_tokens`
//! says what the engine really reused.

use serde_json::{json, Value};

use crate::common::{self, Resp};
use crate::tenants::two_tenants;
use crate::{assert_error_shape, assert_settled, assert_settled_as};

/// 63 prompt tokens: 3 full blocks of 16 can be cached (the last token is
/// always computed).
const CACHEABLE: u64 = 48;

fn call(addr: std::net::SocketAddr, key: &str, path: &str, body: &Value) -> Resp {
    let auth = format!("Bearer {key}");
    common::request(
        addr,
        "POST",
        path,
        &[("Authorization", &auth)],
        Some(&body.to_string()),
    )
}

/// Cached prompt tokens of a one-off completion of `prompt` (token ids).
fn cached(addr: std::net::SocketAddr, key: &str, prompt: &[u32], salt: Option<&str>) -> u64 {
    let mut body = json!({"model": common::MODEL, "prompt": prompt, "max_tokens": 1,
                          "temperature": 0});
    if let Some(s) = salt {
        body["cache_salt"] = json!(s);
    }
    let r = call(addr, key, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached_tokens")
}

fn prompt(seed: u32) -> Vec<u32> {
    (0..63).map(|i| 100 + seed * 64 + i).collect()
}

#[test]
fn tenants_never_share_a_prompts_blocks() {
    let srv = two_tenants();
    let addr = srv.addr;
    let p = prompt(1);
    assert_eq!(cached(addr, "key-a", &p, None), 0);
    assert_eq!(cached(addr, "key-a", &p, None), CACHEABLE, "same tenant");
    assert_eq!(cached(addr, "key-b", &p, None), 0, "another tenant");
    assert_eq!(cached(addr, "key-b", &p, None), CACHEABLE);
    assert_settled_as(addr, Some("key-a"));
    srv.stop();
}

#[test]
fn cache_salt_separates_requests_of_one_tenant() {
    let srv = two_tenants();
    let addr = srv.addr;
    let p = prompt(2);
    assert_eq!(cached(addr, "key-a", &p, Some("s1")), 0);
    assert_eq!(
        cached(addr, "key-a", &p, Some("s1")),
        CACHEABLE,
        "same salt"
    );
    assert_eq!(cached(addr, "key-a", &p, Some("s2")), 0, "other salt");
    assert_eq!(cached(addr, "key-a", &p, None), 0, "unsalted");
    assert_eq!(
        cached(addr, "key-b", &p, Some("s1")),
        0,
        "same salt, other tenant"
    );
    // Chat completions and responses read the same field.
    let chat = |salt: &str| {
        let body = json!({"model": common::MODEL, "max_tokens": 1, "temperature": 0,
            "cache_salt": salt,
            "messages": [{"role": "user", "content": "tell me a long story ".repeat(8)}]});
        let r = call(addr, "key-a", "/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached_tokens")
    };
    assert_eq!(chat("c1"), 0);
    assert!(chat("c1") > 0, "same salt hits");
    assert_eq!(chat("c2"), 0, "another salt misses");
    let respond = |salt: &str| {
        let body = json!({"model": common::MODEL, "max_output_tokens": 1, "temperature": 0,
            "cache_salt": salt, "store": false, "input": "a long question ".repeat(8)});
        let r = call(addr, "key-a", "/v1/responses", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["usage"]["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached_tokens")
    };
    assert_eq!(respond("r1"), 0);
    assert!(respond("r1") > 0, "same salt hits");
    assert_eq!(respond("r2"), 0, "another salt misses");
    assert_settled_as(addr, Some("key-a"));
    srv.stop();
}

#[test]
fn a_cache_salt_that_is_not_a_non_empty_string_is_a_400() {
    let addr = common::shared();
    let bodies = [
        (
            "/v1/completions",
            json!({"model": common::MODEL, "prompt": "hi", "max_tokens": 1}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": common::MODEL, "max_tokens": 1,
                   "messages": [{"role": "user", "content": "hi"}]}),
        ),
        (
            "/v1/responses",
            json!({"model": common::MODEL, "max_output_tokens": 1, "input": "hi", "store": false}),
        ),
    ];
    for (path, body) in bodies {
        for bad in [json!(""), json!(5), json!([]), json!({}), json!(true)] {
            let mut b = body.clone();
            b["cache_salt"] = bad.clone();
            let r = common::post(addr, path, &b);
            assert_eq!(r.status, 400, "{path} cache_salt={bad}: {}", r.body);
            assert_error_shape(&r, path);
        }
        let mut b = body.clone();
        b["cache_salt"] = json!(null);
        assert_eq!(
            common::post(addr, path, &b).status,
            200,
            "{path}: null is absent"
        );
    }
    assert_settled(addr);
}
