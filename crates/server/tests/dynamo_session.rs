//! NVIDIA Dynamo's session identity over a real socket: `x-dynamo-session-id`
//! and `nvext.agent_context` name the program, `x-dynamo-session-final` and
//! `trajectory_final` end it, `x-dynamo-parent-session-id` is shown on
//! `/programs`; agentd's own program id wins over Dynamo's.

mod common;

use common::{get, request, shared, MODEL};
use serde_json::{json, Value};

fn body(extra: Value) -> String {
    let mut b = json!({"model": MODEL, "prompt": "hello world", "max_tokens": 2, "temperature": 0});
    if let (Some(b), Some(e)) = (b.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    b.to_string()
}

fn program(id: &str) -> Option<Value> {
    get(shared(), "/programs")
        .json()
        .as_array()
        .expect("list")
        .iter()
        .find(|p| p["id"] == id)
        .cloned()
}

#[test]
fn dynamo_headers_name_end_and_parent_programs() {
    let addr = shared();
    let r = request(
        addr,
        "POST",
        "/v1/completions",
        &[
            ("x-dynamo-session-id", "dyn-sub"),
            ("x-dynamo-parent-session-id", "dyn-root"),
        ],
        Some(&body(json!({}))),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let p = program("dyn-sub").expect("the Dynamo session is a program");
    assert_eq!(p["parent_program"], "dyn-root");

    // The final flag from the header releases it when the request ends.
    let r = request(
        addr,
        "POST",
        "/v1/completions",
        &[
            ("x-dynamo-session-id", "dyn-sub"),
            ("x-dynamo-session-final", "true"),
        ],
        Some(&body(json!({}))),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        program("dyn-sub").is_none(),
        "released by x-dynamo-session-final"
    );

    let r = request(
        addr,
        "POST",
        "/v1/completions",
        &[("x-dynamo-session-final", "maybe")],
        Some(&body(json!({}))),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("x-dynamo-session-final"), "{}", r.body);
}

#[test]
fn nvext_agent_context_and_precedence() {
    let addr = shared();
    let ctx = json!({"nvext": {"agent_context": {"trajectory_id": "traj-1"}}});
    let r = request(addr, "POST", "/v1/completions", &[], Some(&body(ctx)));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        program("traj-1").is_some(),
        "trajectory_id names the program"
    );
    let ctx =
        json!({"nvext": {"agent_context": {"session_id": "traj-1", "trajectory_final": true}}});
    let r = request(addr, "POST", "/v1/completions", &[], Some(&body(ctx)));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(program("traj-1").is_none(), "trajectory_final ends it");

    // agentd's own names come first: body program_id, then X-Session-ID.
    let r = request(
        addr,
        "POST",
        "/v1/completions",
        &[
            ("x-dynamo-session-id", "dyn-lost"),
            ("X-Session-ID", "xs-wins"),
        ],
        Some(&body(
            json!({"nvext": {"agent_context": {"session_id": "nv-lost"}}}),
        )),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(program("xs-wins").is_some());
    assert!(program("dyn-lost").is_none() && program("nv-lost").is_none());
    let r = request(
        addr,
        "POST",
        "/v1/completions",
        &[("x-dynamo-session-id", "dyn-lost")],
        Some(&body(json!({"program_id": "body-wins"}))),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(program("body-wins").is_some() && program("dyn-lost").is_none());
}
