//! The bad-input catalogue: every case is one request over a fresh
//! connection. Accepted cases (a field the server tolerates) may answer 2xx;
//! everything else must be a 4xx with the OpenAI error object. No case may
//! get a 5xx, a dropped connection (a panic) or leave KV behind.

use serde_json::{json, Value};

use crate::common::{self, Resp};
use crate::{assert_error_shape, assert_settled};

const BIG: u64 = u64::MAX;

/// Bodies that are not the expected JSON object at all.
fn malformed_bodies() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = [
        "",
        " ",
        "{",
        "}",
        "null",
        "[]",
        "1",
        "\"s\"",
        "true",
        "{\"a\":",
        "{'a': 1}",
        "{\"model\": NaN}",
        "{\"model\": Infinity}",
        "{\"max_tokens\": 1e999999}",
        "{\"a\":1,}",
        "\u{feff}{}",
        "{\"a\":\"\\ud800\"}",
        "{\"a\":\"\\u00\"}",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    v.push(vec![0xff, 0xfe, b'{', b'}']);
    v.push(vec![b'{', b'"', 0xc3, b'"', b':', b'1', b'}']);
    v.push(b"{\"a\":\"\0\"}".to_vec());
    // Nesting deeper than serde_json's recursion limit (128).
    v.push(format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)).into_bytes());
    v.push(format!("{}1{}", "{\"a\":".repeat(5_000), "}".repeat(5_000)).into_bytes());
    v
}

/// (field, value) set on a valid body of chat and completions.
fn field_mutations() -> Vec<(&'static str, Value)> {
    let long = "x".repeat(300);
    vec![
        ("model", json!("no-such-model")),
        ("model", json!(5)),
        ("model", json!(null)),
        ("max_tokens", json!(-1)),
        ("max_tokens", json!(0)),
        ("max_tokens", json!(BIG)),
        ("max_tokens", json!(BIG as f64 * 4.0)),
        ("max_tokens", json!(1.5)),
        ("max_tokens", json!("8")),
        ("max_tokens", json!(1_000_000_000)),
        ("max_completion_tokens", json!(BIG)),
        ("max_completion_tokens", json!(0)),
        ("temperature", json!(-1)),
        ("temperature", json!(1e308)),
        ("temperature", json!("hot")),
        ("top_p", json!(-0.1)),
        ("top_p", json!(2)),
        ("top_p", json!(0)),
        ("top_k", json!(-2)),
        ("top_k", json!(i64::MIN)),
        ("top_k", json!(i64::MAX)),
        ("top_k", json!(BIG)),
        ("min_p", json!(2)),
        ("min_p", json!(-1)),
        ("n", json!(0)),
        ("n", json!(65)),
        ("n", json!(BIG)),
        ("n", json!(-1)),
        ("logprobs", json!("x")),
        ("logprobs", json!(-1)),
        ("logprobs", json!(BIG)),
        ("top_logprobs", json!(-1)),
        ("top_logprobs", json!(1000)),
        ("top_logprobs", json!(BIG)),
        ("seed", json!(-1)),
        ("seed", json!(1.5)),
        ("seed", json!(BIG)),
        ("seed", json!("s")),
        ("stop", json!([""])),
        ("stop", json!(5)),
        ("stop", json!([1])),
        ("stop", json!(vec!["ab"; 10_000])),
        ("stop", json!("x".repeat(100_000))),
        ("stop_token_ids", json!([-1])),
        ("stop_token_ids", json!([1u64 << 40])),
        ("stop_token_ids", json!("x")),
        ("presence_penalty", json!(3)),
        ("presence_penalty", json!(-3)),
        ("frequency_penalty", json!(1e300)),
        ("repetition_penalty", json!(0)),
        ("repetition_penalty", json!(-1)),
        ("ignore_eos", json!("yes")),
        ("stream", json!("yes")),
        ("stream", json!(1)),
        ("stream_options", json!(5)),
        ("stream_options", json!({"include_usage": "x"})),
        ("program_id", json!("")),
        ("program_id", json!(long.clone())),
        ("program_id", json!(5)),
        ("program_id", json!({})),
        ("final", json!("yes")),
        ("extra_body", json!(5)),
        ("extra_body", json!({"program_id": ""})),
        ("extra_body", json!({"program_id": long})),
        ("tool_resources", json!({"dirs": ["/etc"]})),
        ("tool_resources", json!({"dirs": ["a"]})),
        ("tool_resources", json!({"pids": [1]})),
        ("tool_resources", json!({"pids": [1u64 << 40]})),
        ("tool_resources", json!({"pids": [-1]})),
        ("tool_resources", json!({"docker": ["../images"]})),
        ("tool_resources", json!({"volumes": ["a?b"]})),
        ("tool_resources", json!({"x": 1})),
        ("tool_resources", json!(5)),
        ("tools", json!(5)),
        ("tools", json!([{}])),
        ("tools", json!([{"type": "function"}])),
        ("tool_choice", json!(5)),
        ("response_format", json!(5)),
        ("response_format", json!({"type": "nope"})),
        ("logit_bias", json!({"x": 5})),
        ("logit_bias", json!(5)),
        ("logit_bias", json!({"1": 1000})),
        ("logit_bias", json!({"99999999": 1})),
        ("allowed_token_ids", json!([])),
        ("allowed_token_ids", json!([BIG])),
        ("bad_words", json!([""])),
        ("bad_words", json!(["x".repeat(10_000)])),
        ("min_tokens", json!(BIG)),
        ("min_tokens", json!(-1)),
        ("truncate_prompt_tokens", json!(BIG)),
        ("truncate_prompt_tokens", json!(0)),
        ("include_stop_str_in_output", json!(5)),
        ("prompt_logprobs", json!(5)),
        ("best_of", json!(3)),
        ("user", json!(5)),
        ("cache_salt", json!("")),
        ("cache_salt", json!(5)),
        ("cache_salt", json!([])),
        ("cache_salt", json!({})),
        ("cache_salt", json!(true)),
        ("cache_salt", json!("x".repeat(100_000))),
        ("group_id", json!("")),
        ("group_id", json!(5)),
        ("group_id", json!("g".repeat(100_000))),
        ("group_size", json!(4)),
        ("group_size", json!(0)),
        ("group_size", json!(-1)),
        ("group_size", json!(BIG)),
        ("group_size", json!("4")),
        ("tool_name", json!("")),
        ("tool_name", json!(5)),
        ("tool_name", json!("t".repeat(100_000))),
        ("extra_body", json!({"group_id": ""})),
        ("extra_body", json!({"group_size": 2})),
        ("extra_body", json!({"tool_name": ["x"]})),
    ]
}

fn chat_body() -> Value {
    json!({"model": common::MODEL, "max_tokens": 2, "temperature": 0,
           "messages": [{"role": "user", "content": "hi"}]})
}

fn completion_body() -> Value {
    json!({"model": common::MODEL, "max_tokens": 2, "temperature": 0, "prompt": "hi"})
}

/// Bodies specific to one endpoint.
fn endpoint_bodies() -> Vec<(&'static str, Value)> {
    let chat = |k: &str, v: Value| {
        let mut b = chat_body();
        b[k] = v;
        ("/v1/chat/completions", b)
    };
    let cmpl = |k: &str, v: Value| {
        let mut b = completion_body();
        b[k] = v;
        ("/v1/completions", b)
    };
    let long = "n".repeat(300);
    let mut v = vec![
        chat("messages", json!([])),
        chat("messages", json!("hi")),
        chat("messages", json!([{"role": "bogus", "content": "x"}])),
        chat("messages", json!([{"content": "x"}])),
        chat("messages", json!([{"role": "user", "content": 5}])),
        chat(
            "messages",
            json!([{"role": "user", "content": [{"type": "image_url"}]}]),
        ),
        chat("messages", json!([{"role": "user"}])),
        chat("messages", json!([null])),
        chat(
            "messages",
            json!([{"role": "user", "content": "x".repeat(200_000)}]),
        ),
        chat("chat_template_kwargs", json!(5)),
        chat("continue_final_message", json!(true)),
        chat("add_generation_prompt", json!("x")),
        cmpl("prompt", json!([])),
        cmpl("prompt", json!([[]])),
        cmpl("prompt", json!([-1])),
        cmpl("prompt", json!([1u64 << 32])),
        cmpl("prompt", json!([1_000_000_000])),
        cmpl("prompt", json!("")),
        cmpl("prompt", json!([["a"]])),
        cmpl("prompt", json!(5)),
        cmpl("prompt", json!(null)),
        cmpl("prompt", json!(vec!["a"; 65])),
        cmpl("prompt", json!("x ".repeat(100_000))),
        cmpl("echo", json!("x")),
        cmpl("suffix", json!(5)),
        ("/programs/release", json!({})),
        ("/programs/release", json!({"program_id": 5})),
        ("/programs/release", json!({"program_id": ""})),
        ("/programs/release", json!({"program_id": long})),
        ("/programs/release", json!({"program_id": null})),
        ("/programs/release", json!({"program_id": "never-existed"})),
        ("/programs/p/resources", json!({"dirs": ["file/sub"]})),
        ("/programs/p/resources", json!({"dirs": ["a\u{0}b"]})),
        ("/programs/p/resources", json!({"dirs": [long]})),
        ("/programs/p/resources", json!({"dirs": ["../x"]})),
        ("/programs/p/resources", json!({"dirs": [""]})),
        ("/programs/p/resources", json!({"dirs": ["/"]})),
        ("/programs/p/resources", json!({"pids": [1]})),
        ("/programs/p/resources", json!({"pids": [0]})),
        ("/programs/p/resources", json!({"pids": [-1]})),
        ("/programs/p/resources", json!({"pids": [i32::MAX]})),
        (
            "/programs/p/resources",
            json!({"pids": [std::process::id()]}),
        ),
        ("/programs/p/resources", json!({"docker": ["a/b"]})),
        ("/programs/p/resources", json!({"tool_resources": 5})),
        ("/programs/p/resources", json!({"dir": ["x"]})),
        ("/programs/p/environment", json!({})),
        ("/programs/p/environment", json!({"local": {}})),
        ("/programs/p/environment", json!({"local": {"command": ""}})),
        (
            "/programs/p/environment",
            json!({"local": {"command": "a\u{0}b"}}),
        ),
        (
            "/programs/p/environment",
            json!({"local": {"command": "true", "timeout_s": -1}}),
        ),
        (
            "/programs/p/environment",
            json!({"local": {"command": "true", "timeout_s": 1e9}}),
        ),
        (
            "/programs/p/environment",
            json!({"local": {"command": "true", "workdir": "../x"}}),
        ),
        (
            "/programs/p/environment",
            json!({"local": {"command": "true", "workdir": "file/sub"}}),
        ),
        (
            "/programs/p/environment",
            json!({"local": {"command": "true", "workdir": "a\u{0}"}}),
        ),
        (
            "/programs/p/environment",
            json!({"docker": {"image": "a?b"}}),
        ),
        ("/programs/p/environment", json!({"docker": {"image": ""}})),
        (
            "/programs/p/environment",
            json!({"local": {"command": "true"}, "docker": {"image": "a"}}),
        ),
        ("/programs/p/environment", json!({"shell": "true"})),
    ];
    for (k, val) in field_mutations() {
        v.push(chat(k, val.clone()));
        v.push(cmpl(k, val));
    }
    v
}

/// Requests on paths and methods the server does not route, and paths with
/// bad program ids.
fn path_cases() -> Vec<(&'static str, String)> {
    let long = "p".repeat(300);
    let mut v: Vec<(&str, String)> = vec![
        ("GET", "/v2/models".into()),
        ("GET", "/v1".into()),
        ("GET", "/v1/chat".into()),
        ("POST", "/v1/chat/completions/x".into()),
        ("GET", "/v1/chat/completions".into()),
        ("PUT", "/v1/completions".into()),
        ("DELETE", "/programs".into()),
        ("POST", "/health".into()),
        ("POST", "/v1/models".into()),
        ("GET", "/programs/release".into()),
        ("DELETE", "/programs/x".into()),
        ("PATCH", "/programs/x/environment".into()),
        ("GET", "/programs/x/resources".into()),
        ("GET", format!("/programs/{long}")),
        ("GET", format!("/programs/{long}/environment")),
        ("GET", "/programs/%00".into()),
        ("GET", "/programs/a%2Fb".into()),
        ("GET", "/programs/%ff%fe".into()),
        ("GET", "/programs/none".into()),
        ("GET", "/programs/none/environment".into()),
        ("GET", "/programs/none/environment?wait=1".into()),
        ("GET", "/../../etc/passwd".into()),
        ("GET", "/metrics/x".into()),
    ];
    for w in ["-1", "nan", "inf", "1e9", "abc", "", "601", "0x10"] {
        v.push(("GET", format!("/programs/x/environment?wait={w}")));
    }
    v
}

fn check(r: &Resp, what: &str, counts: &mut Counts) {
    counts.cases += 1;
    assert!(r.status != 0, "{what}: no response (dropped connection)");
    assert!(r.status < 500, "{what}: {} {}", r.status, r.body);
    if r.status >= 400 {
        counts.refused += 1;
        assert_error_shape(r, what);
    } else {
        counts.accepted += 1;
    }
}

#[derive(Default, Debug)]
struct Counts {
    cases: usize,
    refused: usize,
    accepted: usize,
}

#[test]
fn bad_input_catalogue_gets_json_errors_and_never_a_5xx() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().canonicalize().expect("root");
    std::fs::write(root.join("file"), b"x").expect("file");
    let srv = common::start_tools(
        None,
        common::test_config(),
        agentd_tools::ToolsConfig {
            sandbox_root: Some(root.clone()),
            ..Default::default()
        },
    );
    let addr = srv.addr;
    let mut counts = Counts::default();
    let endpoints = [
        "/v1/chat/completions",
        "/v1/completions",
        "/programs/release",
        "/programs/p/resources",
        "/programs/p/environment",
    ];
    for path in endpoints {
        for body in malformed_bodies() {
            let mut req = format!(
                "POST {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .into_bytes();
            req.extend_from_slice(&body);
            let r = common::raw_request(addr, &req);
            let shown = String::from_utf8_lossy(&body[..body.len().min(40)]).into_owned();
            check(&r, &format!("POST {path} {shown:?}"), &mut counts);
        }
    }
    for (path, body) in endpoint_bodies() {
        let r = common::post(addr, path, &body);
        let shown: String = body.to_string().chars().take(120).collect();
        check(&r, &format!("POST {path} {shown}"), &mut counts);
    }
    for (method, path) in path_cases() {
        let r = common::request(addr, method, &path, &[], None);
        check(&r, &format!("{method} {path}"), &mut counts);
    }
    // Tool-resource path errors name the path.
    for dir in ["file/sub", "a\u{0}b"] {
        let r = common::post(addr, "/programs/q/resources", &json!({"dirs": [dir]}));
        assert_eq!(r.status, 400, "{}", r.body);
        let shown = std::path::Path::new(dir).display().to_string();
        assert!(r.body.contains(&shown[..1]), "{}", r.body);
    }
    println!(
        "bad-input catalogue: {} cases, {} refused with the JSON error, {} accepted, 0 5xx",
        counts.cases, counts.refused, counts.accepted
    );
    assert!(counts.cases >= 300, "{counts:?}");
    // Programs created by accepted cases with an id would hold KV: none has
    // one, so everything must be back.
    assert_settled(addr);
    srv.stop();
}
