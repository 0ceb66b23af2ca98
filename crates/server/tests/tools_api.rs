//! Tool resources over a real socket (docs/design.md §10), on real directories and
//! real process groups: declared on requests (body, `extra_body`) or on
//! `/programs/{id}/resources`, reclaimed on release, `final`, lease expiry
//! and shutdown; sharing; refusals; environment preparation overlapping a
//! streaming request; a missing Docker socket; the API key. (The churn of
//! 200 programs is in `tools_churn.rs`.)

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agentd_engine::EngineConfig;
use agentd_scheduler::SchedulerConfig;
use agentd_tools::{DockerConfig, ReclaimConfig, ToolsConfig};
use common::{
    assert_terminated, get, metric, post, request, start_tools, test_config, tool_process, Server,
};
use serde_json::{json, Value};

struct Sandbox {
    _tmp: tempfile::TempDir,
    root: PathBuf,
}

fn sandbox() -> Sandbox {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().canonicalize().expect("canonical");
    Sandbox { _tmp: tmp, root }
}

fn tools_config(root: &Path) -> ToolsConfig {
    ToolsConfig {
        sandbox_root: Some(root.to_path_buf()),
        kill_grace: Duration::from_millis(500),
        docker: DockerConfig {
            socket: root.join("missing-docker.sock"),
            ..DockerConfig::default()
        },
        reclaim: ReclaimConfig {
            concurrency: 8,
            max_attempts: 3,
            backoff: Duration::from_millis(20),
            history: 4096,
        },
        reclaim_on_exit: false,
        orphan_lease: None,
        // These tests declare processes they started themselves.
        foreign_pids: agentd_tools::ForeignPids {
            allow: true,
            any_uid: false,
        },
        commands: common::test_commands(root),
    }
}

fn server(sb: &Sandbox) -> Server {
    start_tools(None, test_config(), tools_config(&sb.root))
}

/// A directory with content under the sandbox root.
fn work_dir(sb: &Sandbox, name: &str) -> String {
    let d = sb.root.join(name);
    std::fs::create_dir_all(d.join("repo/.git")).expect("mkdir");
    std::fs::write(d.join("repo/main.py"), "print('hi')\n").expect("write");
    d.display().to_string()
}

fn chat(addr: SocketAddr, extra: Value) -> common::Resp {
    let mut body = json!({
        "model": common::MODEL,
        "messages": [{"role": "user", "content": "run the tests"}],
        "max_tokens": 2,
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": false},
    });
    for (k, v) in extra.as_object().expect("object") {
        body[k] = v.clone();
    }
    post(addr, "/v1/chat/completions", &body)
}

fn completion(addr: SocketAddr, extra: Value) -> common::Resp {
    let mut body =
        json!({"model": common::MODEL, "prompt": "ls -la", "max_tokens": 1, "temperature": 0});
    for (k, v) in extra.as_object().expect("object") {
        body[k] = v.clone();
    }
    post(addr, "/v1/completions", &body)
}

/// Polls `GET /programs/{id}` until every resource is past reclaiming.
fn wait_settled(addr: SocketAddr, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = get(addr, &format!("/programs/{id}"));
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        let settled = v["tool_resources"]["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .all(|x| x["state"] == "reclaimed" || x["state"] == "failed");
        if settled && !v["tool_resources"]["ended"].is_null() {
            return v;
        }
        assert!(Instant::now() < deadline, "not reclaimed in time: {v}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn states(v: &Value) -> Vec<(String, String)> {
    v["tool_resources"]["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| {
            (
                r["kind"].as_str().unwrap_or("").to_string(),
                r["state"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn release_and_final_reclaim_declared_dirs_and_process_groups() {
    let sb = sandbox();
    let srv = server(&sb);
    let addr = srv.addr;

    // Declared in extra_body on a chat request; released by the client.
    let d1 = work_dir(&sb, "rel");
    let p1 = tool_process();
    let r = chat(
        addr,
        json!({"extra_body": {"program_id": "rel", "tool_resources": {"dirs": [d1], "pids": [p1.id()]}}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = get(addr, "/programs/rel").json();
    assert_eq!(v["engine"]["id"], "rel", "{v}");
    assert_eq!(
        states(&v),
        vec![
            ("dir".into(), "live".into()),
            ("process_group".into(), "live".into())
        ]
    );
    assert_eq!(
        v["tool_resources"]["resources"][0]["owners"],
        json!(["rel"])
    );
    let m = get(addr, "/metrics").body;
    assert_eq!(metric(&m, "agentd:tool_resources_live"), 2.0);
    assert!(Path::new(&d1).join("repo/main.py").exists());

    let r = post(addr, "/programs/release", &json!({"program_id": "rel"}));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = wait_settled(addr, "rel");
    assert_eq!(v["tool_resources"]["ended"], "released");
    assert!(states(&v).iter().all(|(_, s)| s == "reclaimed"), "{v}");
    assert!(!Path::new(&d1).exists(), "directory removed");
    assert_terminated(p1);

    // Top-level tool_resources on a completion marked final.
    let d2 = work_dir(&sb, "fin");
    let p2 = tool_process();
    let r = completion(
        addr,
        json!({"program_id": "fin", "final": true, "tool_resources": {"dirs": [d2], "pids": [p2.id()]}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = wait_settled(addr, "fin");
    assert_eq!(v["tool_resources"]["ended"], "final");
    assert!(v["engine"].is_null(), "the engine released it");
    assert!(!Path::new(&d2).exists());
    assert_terminated(p2);

    let m = get(addr, "/metrics").body;
    assert_eq!(metric(&m, "agentd:tool_resources_reclaimed_total"), 4.0);
    assert_eq!(metric(&m, "agentd:tool_resources_failed_total"), 0.0);
    assert_eq!(metric(&m, "agentd:tool_resources_live"), 0.0);
    srv.stop();
}

#[test]
fn lease_expiry_reclaims_a_silent_programs_resources() {
    let sb = sandbox();
    let cfg = EngineConfig {
        scheduler: SchedulerConfig {
            lease_s: 0.5,
            ..SchedulerConfig::default()
        },
        ..test_config()
    };
    let tools = ToolsConfig {
        orphan_lease: Some(Duration::from_millis(500)),
        ..tools_config(&sb.root)
    };
    let srv = start_tools(None, cfg, tools);
    // Declared but never run by the engine: the same lease, from the tools side.
    let ghost = work_dir(&sb, "ghost");
    let r = post(
        srv.addr,
        "/programs/ghost/resources",
        &json!({"dirs": ["ghost"]}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let d = work_dir(&sb, "idle");
    let p = tool_process();
    // Program id from the X-Session-ID header, resources in the body.
    let body = json!({"model": common::MODEL, "prompt": "x", "max_tokens": 1,
                      "tool_resources": {"dirs": ["idle"], "pids": [p.id()]}});
    let r = request(
        srv.addr,
        "POST",
        "/v1/completions",
        &[("X-Session-ID", "idle")],
        Some(&body.to_string()),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = wait_settled(srv.addr, "idle");
    assert_eq!(v["tool_resources"]["ended"], "lease_expired", "{v}");
    assert!(!Path::new(&d).exists());
    assert_terminated(p);
    let v = wait_settled(srv.addr, "ghost");
    assert_eq!(v["tool_resources"]["ended"], "lease_expired", "{v}");
    assert!(v["engine"].is_null());
    assert!(!Path::new(&ghost).exists());
    srv.stop();
}

#[test]
fn a_shared_resource_survives_until_its_last_owner_ends() {
    let sb = sandbox();
    let srv = server(&sb);
    let addr = srv.addr;
    let shared = work_dir(&sb, "shared-cache");
    for p in ["a", "b"] {
        let r = post(
            addr,
            &format!("/programs/{p}/resources"),
            &json!({"dirs": [shared]}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(
            chat(addr, json!({"program_id": p})).status,
            200,
            "engine knows {p}"
        );
    }
    let v = get(addr, "/programs/a").json();
    assert_eq!(
        v["tool_resources"]["resources"][0]["owners"],
        json!(["a", "b"])
    );
    assert_eq!(
        post(addr, "/programs/release", &json!({"program_id": "a"})).status,
        200
    );
    // Give the reclaimer every chance to (wrongly) act.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        Path::new(&shared).join("repo/main.py").exists(),
        "b still owns it"
    );
    let v = get(addr, "/programs/a").json();
    assert_eq!(v["tool_resources"]["ended"], "released");
    assert_eq!(v["tool_resources"]["resources"][0]["state"], "live");
    assert_eq!(v["tool_resources"]["resources"][0]["owners"], json!(["b"]));
    assert_eq!(
        post(addr, "/programs/release", &json!({"program_id": "b"})).status,
        200
    );
    wait_settled(addr, "b");
    assert!(!Path::new(&shared).exists());
    srv.stop();
}

#[test]
fn bad_declarations_and_specs_get_400_with_a_reason() {
    let sb = sandbox();
    let srv = server(&sb);
    let addr = srv.addr;
    let outside = tempfile::tempdir().expect("outside");
    std::fs::write(outside.path().join("precious"), b"x").expect("write");
    std::os::unix::fs::symlink(outside.path(), sb.root.join("escape")).expect("symlink");
    let cases = [
        (
            json!({"dirs": [outside.path()]}),
            "not inside the sandbox root",
        ),
        (
            json!({"dirs": ["escape/inner"]}),
            "not inside the sandbox root",
        ),
        (json!({"dirs": ["a/../../etc"]}), "`..`"),
        (json!({"pids": [1]}), "pids <= 1"),
        (json!({"pids": [std::process::id()]}), "the server itself"),
        (
            json!({"docker": ["x/../../images"]}),
            "not a valid Docker name",
        ),
        (json!({"dir": ["typo"]}), "unknown field"),
    ];
    for (spec, why) in cases {
        let r = post(addr, "/programs/bad/resources", &spec);
        assert_eq!(r.status, 400, "{spec}: {}", r.body);
        let e = r.json();
        assert_eq!(e["error"]["type"], "invalid_request_error");
        assert_eq!(e["error"]["param"], "tool_resources");
        let msg = e["error"]["message"].as_str().expect("message");
        assert!(msg.contains(why), "{msg} should say {why}");
        // The same refusal on a request, before any generation.
        let r = chat(addr, json!({"program_id": "bad", "tool_resources": spec}));
        assert_eq!(r.status, 400, "{}", r.body);
    }
    assert!(outside.path().join("precious").exists());
    assert_eq!(get(addr, "/programs/bad").status, 404, "nothing registered");
    // A process in the server's own process group.
    let mut same = Command::new("sleep").arg("30").spawn().expect("spawn");
    let r = post(
        addr,
        "/programs/bad/resources",
        &json!({"pids": [same.id()]}),
    );
    assert_eq!(r.status, 400);
    assert!(r.body.contains("own process group"), "{}", r.body);
    same.kill().expect("kill");
    same.wait().expect("wait");

    let r = chat(addr, json!({"tool_resources": {"dirs": ["x"]}}));
    assert_eq!(r.status, 400);
    assert!(r.body.contains("need a program id"), "{}", r.body);
    for spec in [
        json!({"local": {"command": "true", "workdir": "../out"}}),
        json!({"local": {"command": "true", "timeout_s": 0}}),
        json!({"local": {"command": ""}}),
        json!({"docker": {"image": "bad image"}}),
        json!({}),
        json!({"shell": "true"}),
    ] {
        let r = post(addr, "/programs/bad/environment", &spec);
        assert_eq!(r.status, 400, "{spec}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], "environment");
    }
    assert_eq!(get(addr, "/programs/none/environment").status, 404);
    let r = post(
        addr,
        "/programs/w/environment",
        &json!({"local": {"command": "true"}}),
    );
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(get(addr, "/programs/w/environment?wait=abc").status, 400);
    assert_eq!(get(addr, "/programs/w/environment?wait=-1").status, 400);
    srv.stop();
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64()
}

#[test]
fn preparation_overlaps_a_streaming_request_and_wait_returns_when_ready() {
    let sb = sandbox();
    let srv = server(&sb);
    let addr = srv.addr;
    let t0 = Instant::now();
    let r = post(
        addr,
        "/programs/env/environment",
        &json!({"local": {"command": "sleep 1.5; git --version >/dev/null 2>&1; echo ok > prepared.txt", "timeout_s": 30}}),
    );
    assert_eq!(r.status, 202, "{}", r.body);
    assert!(
        t0.elapsed() < Duration::from_millis(1000),
        "returns at once"
    );
    let pending = r.json();
    assert_eq!(pending["state"], "pending");
    let workdir = PathBuf::from(pending["workdir"].as_str().expect("workdir"));
    assert!(workdir.starts_with(&sb.root));

    // The program reasons (a streaming request) while its environment is
    // prepared.
    let stream = std::thread::spawn(move || {
        let body = json!({"model": common::MODEL, "program_id": "env", "stream": true,
                          "messages": [{"role": "user", "content": "plan"}], "max_tokens": 8,
                          "chat_template_kwargs": {"enable_thinking": false}});
        let r = post(addr, "/v1/chat/completions", &body);
        (unix_now(), r)
    });
    let r = get(addr, "/programs/env/environment?wait=30");
    assert_eq!(r.status, 200);
    let ready = r.json();
    assert_eq!(ready["state"], "ready", "{ready}");
    assert!(ready["duration_s"].as_f64().expect("duration") >= 1.5);
    assert_eq!(
        std::fs::read_to_string(workdir.join("prepared.txt")).expect("prepared"),
        "ok\n"
    );
    let (stream_done, resp) = stream.join().expect("stream thread");
    assert_eq!(resp.status, 200);
    assert_eq!(resp.events().last().map(String::as_str), Some("[DONE]"));
    let finished = ready["finished_at"].as_f64().expect("finished_at");
    eprintln!(
        "preparation took {:.2}s; the streaming request ended {:.2}s before it was ready",
        ready["duration_s"].as_f64().unwrap_or(0.0),
        finished - stream_done
    );
    assert!(
        stream_done < finished,
        "the stream ran while the environment was pending"
    );
    let v = get(addr, "/programs/env").json();
    assert_eq!(v["environment"]["state"], "ready");
    let kinds: Vec<&str> = v["tool_resources"]["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(|r| r["kind"].as_str())
        .collect();
    assert_eq!(kinds, vec!["dir", "process_tree"]);
    assert_eq!(
        post(addr, "/programs/release", &json!({"program_id": "env"})).status,
        200
    );
    wait_settled(addr, "env");
    assert!(
        !workdir.exists(),
        "the prepared directory goes with the program"
    );
    srv.stop();
}

#[test]
fn a_missing_docker_socket_marks_the_container_failed_and_the_server_keeps_serving() {
    let sb = sandbox();
    let srv = server(&sb);
    let addr = srv.addr;
    let r = completion(
        addr,
        json!({"program_id": "dock", "final": true, "extra_body": {"tool_resources": {"docker_ids": ["3f2a9c"]}}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = wait_settled(addr, "dock");
    let res = &v["tool_resources"]["resources"][0];
    assert_eq!(res["state"], "failed", "{v}");
    assert_eq!(res["attempts"], 3);
    let reason = res["reason"].as_str().expect("reason");
    eprintln!("missing Docker socket → {reason}");
    assert!(reason.contains("Docker daemon is unreachable"), "{reason}");
    assert!(reason.contains("missing-docker.sock"), "{reason}");
    let m = get(addr, "/metrics").body;
    assert_eq!(metric(&m, "agentd:tool_resources_failed_total"), 1.0);
    assert_eq!(metric(&m, "agentd:tool_resources_live"), 0.0);
    // Still serving.
    assert_eq!(get(addr, "/health").status, 200);
    assert_eq!(completion(addr, json!({})).status, 200);
    // Preparing a Docker environment fails the same visible way.
    let r = post(
        addr,
        "/programs/dock2/environment",
        &json!({"docker": {"image": "busybox:1.36"}}),
    );
    assert_eq!(r.status, 202);
    let s = get(addr, "/programs/dock2/environment?wait=10").json();
    assert_eq!(s["state"], "failed");
    assert!(
        s["error"].as_str().expect("error").contains("unreachable"),
        "{s}"
    );
    srv.stop();
}

#[test]
fn the_api_key_guards_the_tool_endpoints() {
    let sb = sandbox();
    let srv = start_tools(Some("k3y"), test_config(), tools_config(&sb.root));
    let addr = srv.addr;
    let body = json!({"dirs": ["x"]}).to_string();
    for (method, path, body) in [
        ("POST", "/programs/p/resources", Some(body.as_str())),
        ("GET", "/programs/p", None),
        (
            "POST",
            "/programs/p/environment",
            Some("{\"local\":{\"command\":\"true\"}}"),
        ),
        ("GET", "/programs/p/environment", None),
    ] {
        let r = request(addr, method, path, &[], body);
        assert_eq!(r.status, 401, "{method} {path}");
        assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    }
    let auth = [("Authorization", "Bearer k3y")];
    let r = request(addr, "POST", "/programs/p/resources", &auth, Some(&body));
    assert_eq!(r.status, 200, "{}", r.body);
    let r = request(addr, "GET", "/programs/p", &auth, None);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["tool_resources"]["resources"][0]["kind"], "dir");
    srv.stop();
}

#[test]
fn shutdown_with_reclaim_on_exit_reclaims_live_programs() {
    let sb = sandbox();
    let cfg = ToolsConfig {
        reclaim_on_exit: true,
        ..tools_config(&sb.root)
    };
    let srv = start_tools(None, test_config(), cfg);
    let d = work_dir(&sb, "live");
    let p = tool_process();
    let r = post(
        srv.addr,
        "/programs/live/resources",
        &json!({"tool_resources": {"dirs": [d], "pids": [p.id()]}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(chat(srv.addr, json!({"program_id": "live"})).status, 200);
    assert!(Path::new(&d).exists());
    srv.stop();
    assert!(!Path::new(&d).exists(), "reclaimed before serve returned");
    assert_terminated(p);
}
