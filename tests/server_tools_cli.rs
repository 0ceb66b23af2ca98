//! The real `agentd serve` binary with the tool flags: resources declared
//! on a request and on `/programs/{id}/resources` are reclaimed on `final`
//! and, with `--reclaim-on-exit`, when the server gets SIGTERM.

mod common;

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::spawn_serve;
use serde_json::{json, Value};

/// `(status, JSON body)` of one exchange.
fn http(addr: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let (status, text) = common::http(addr, method, path, body);
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Waits for `child` (ours to reap) to exit; returns its terminating signal.
fn exit_signal(child: &mut Child, within: Duration) -> Option<i32> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            return s.signal();
        }
        assert!(Instant::now() < deadline, "pid {} still alive", child.id());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn serve_reclaims_tool_resources_on_final_and_on_exit() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().canonicalize().expect("canonical");
    let args: Vec<std::ffi::OsString> = vec![
        "--num-kv-blocks".into(),
        "256".into(),
        "--reclaim-on-exit".into(),
        // The test's tool processes are its own, not an environment's.
        "--allow-foreign-pids".into(),
        "--sandbox-root".into(),
        root.clone().into(),
        "--docker-socket".into(),
        root.join("no-docker.sock").into(),
        "--kill-grace-ms".into(),
        "300".into(),
        "--reclaim-backoff-ms".into(),
        "10".into(),
    ];
    let (mut server, addr, log_rx) = spawn_serve("serve-cli-cache", args);

    // A `final` request's resources go when it finishes.
    std::fs::create_dir_all(root.join("task-1/repo")).expect("mkdir");
    let mut tool1 = Command::new("sleep")
        .arg("300")
        .process_group(0)
        .spawn()
        .expect("spawn");
    let req = json!({
        "model": "agentd-tiny-qwen3", "max_tokens": 2, "final": true,
        "messages": [{"role": "user", "content": "hello"}],
        "extra_body": {"program_id": "one", "tool_resources": {"dirs": ["task-1"], "pids": [tool1.id()]}},
    });
    let (status, body) = http(&addr, "POST", "/v1/chat/completions", Some(&req));
    assert_eq!(status, 200, "{body}");
    assert_eq!(exit_signal(&mut tool1, Duration::from_secs(10)), Some(15));
    let deadline = Instant::now() + Duration::from_secs(10);
    while root.join("task-1").exists() {
        assert!(Instant::now() < deadline, "task-1 not removed");
        std::thread::sleep(Duration::from_millis(10));
    }

    // A live program's resources go on SIGTERM with --reclaim-on-exit.
    std::fs::create_dir_all(root.join("task-2")).expect("mkdir");
    let mut tool2 = Command::new("sleep")
        .arg("300")
        .process_group(0)
        .spawn()
        .expect("spawn");
    let decl = json!({"dirs": [root.join("task-2")], "pids": [tool2.id()]});
    let (status, body) = http(&addr, "POST", "/programs/two/resources", Some(&decl));
    assert_eq!(status, 200, "{body}");
    let (status, body) = http(&addr, "GET", "/programs/two", None);
    assert_eq!(status, 200);
    assert_eq!(
        body["tool_resources"]["resources"][0]["state"], "live",
        "{body}"
    );
    let (status, body) = http(
        &addr,
        "POST",
        "/programs/x/resources",
        Some(&json!({"dirs": ["/etc"]})),
    );
    assert_eq!(status, 400, "{body}");
    let (_, metrics) = common::http(&addr, "GET", "/metrics", None);
    assert!(
        metrics
            .contains("agentd:tool_resources_reclaimed_total{model_name=\"agentd-tiny-qwen3\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("agentd:tool_resources_live{model_name=\"agentd-tiny-qwen3\"} 2"),
        "{metrics}"
    );

    let pid = server.0.id().to_string();
    let term = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(term.success());
    let status = {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = server.0.try_wait().expect("try_wait") {
                break s;
            }
            assert!(Instant::now() < deadline, "the server did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    assert!(status.success(), "graceful exit: {status:?}");
    assert!(
        !root.join("task-2").exists(),
        "removed before the server exited"
    );
    assert_eq!(exit_signal(&mut tool2, Duration::from_secs(5)), Some(15));
    let logs: Vec<String> = log_rx.try_iter().collect();
    assert!(
        logs.iter().any(|l| l.contains("--reclaim-on-exit")),
        "the shutdown reclaim is logged"
    );
}
