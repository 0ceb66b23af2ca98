//! The real `agentd serve` binary with the tool flags: resources declared
//! on a request and on `/programs/{id}/resources` are reclaimed on `final`
//! and, with `--reclaim-on-exit`, when the server gets SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Kills the server when the test ends, pass or fail.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn http(addr: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).ok();
    let body = body.map(Value::to_string).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read");
    let (head, rest) = raw.split_once("\r\n\r\n").expect("header end");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status");
    (status, serde_json::from_str(rest).unwrap_or(Value::Null))
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
    let cache = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("serve-cli-cache");
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().canonicalize().expect("canonical");
    let child = Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args([
            "serve",
            "--port",
            "0",
            "--num-kv-blocks",
            "256",
            "--reclaim-on-exit",
        ])
        .arg("--sandbox-root")
        .arg(&root)
        .arg("--docker-socket")
        .arg(root.join("no-docker.sock"))
        .args(["--kill-grace-ms", "300", "--reclaim-backoff-ms", "10"])
        .env("XDG_CACHE_HOME", &cache)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn agentd serve");
    let mut server = Server(child);
    let stderr = server.0.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    let (log_tx, log_rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(i) = line.find("listening on http://") {
                let addr = line[i + "listening on http://".len()..]
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_string();
                let _ = tx.send(addr);
            }
            let _ = log_tx.send(line);
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the server logs its address");

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
    let (_, metrics) = {
        let mut s = TcpStream::connect(&addr).expect("connect");
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .expect("write");
        let mut raw = String::new();
        s.read_to_string(&mut raw).expect("read");
        ((), raw)
    };
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
