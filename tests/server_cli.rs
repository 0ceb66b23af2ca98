//! The real `agentd serve` binary with no `--model`: it generates the
//! embedded tiny Qwen3 into its cache, logs the address it listens on, and
//! answers a chat completion and `/metrics`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

/// Kills the server when the test ends, pass or fail.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `Connection: close` HTTP/1.1 exchange; returns (status, body).
fn http(addr: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
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
    (status, rest.to_string())
}

#[test]
fn serve_default_model_end_to_end() {
    let cache = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("serve-cli-cache");
    let child = Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["serve", "--port", "0", "--num-kv-blocks", "256"])
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
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the server logs its address");

    let (status, _) = http(&addr, "GET", "/health", None);
    assert_eq!(status, 200);
    let (status, body) = http(&addr, "GET", "/v1/models", None);
    assert_eq!(status, 200, "{body}");
    let models: Value = serde_json::from_str(&body).expect("json");
    let name = models["data"][0]["id"]
        .as_str()
        .expect("model id")
        .to_string();
    assert_eq!(name, "agentd-tiny-qwen3");

    let req = json!({
        "model": name,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 4,
        "temperature": 0,
        "ignore_eos": true,
        "program_id": "cli-test",
    });
    let (status, body) = http(&addr, "POST", "/v1/chat/completions", Some(&req));
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["usage"]["completion_tokens"], 4);

    let (status, body) = http(&addr, "GET", "/metrics", None);
    assert_eq!(status, 200);
    assert!(body.contains("vllm:generation_tokens_total{model_name=\"agentd-tiny-qwen3\"}"));
    assert!(body.contains("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"256\"} 1"));
}

/// Without the `cuda` feature, `--device cuda` stops at once with a message
/// that says how to get a CUDA build (instead of serving on the CPU).
#[cfg(not(feature = "cuda"))]
#[test]
fn serve_device_cuda_needs_a_cuda_build() {
    let cache = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("serve-cli-cache");
    let out = Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["serve", "--device", "cuda", "--port", "0"])
        .env("XDG_CACHE_HOME", &cache)
        .env("NO_COLOR", "1")
        .output()
        .expect("run agentd serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("built without CUDA") && err.contains("--features cuda"),
        "{err}"
    );
}
