//! Test harness: a tiny random Qwen3 (real tokenizer and chat template), a
//! real engine and server on 127.0.0.1:0, and a minimal blocking HTTP/1.1
//! client (so tests can also hang up mid-stream).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use agentd_engine::{Engine, EngineConfig};
use agentd_models::synth::{write_random_model, ModelCard};
use agentd_models::Model;
use agentd_server::AppState;
use serde_json::Value;

pub const MODEL: &str = "tiny";

/// The tiny model directory, written once per target dir.
pub fn model_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("server-tiny-qwen3");
        let done = out.join(".complete");
        if !done.is_file() {
            let card = ModelCard::from_file(&root.join("models/qwen3-tiny.json")).expect("card");
            write_random_model(&card.config, &out, 0, card.tokenizer_dir.as_deref())
                .expect("write tiny model");
            std::fs::write(&done, b"").expect("marker");
        }
        out
    })
}

/// A checkpoint of the tiny model's card with `layers` layers and `seed`,
/// written once per target dir (a weight update's second checkpoint).
pub fn checkpoint(name: &str, layers: usize, seed: u64) -> PathBuf {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    if !out.join(".complete").is_file() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let card = ModelCard::from_file(&root.join("models/qwen3-tiny.json")).expect("card");
        let mut cfg = card.config.clone();
        cfg.num_hidden_layers = layers;
        write_random_model(&cfg, &out, seed, card.tokenizer_dir.as_deref())
            .expect("write the checkpoint");
        std::fs::write(out.join(".complete"), b"").expect("marker");
    }
    out
}

/// A second checkpoint of the tiny model's shape (seed 1).
pub fn second_checkpoint() -> PathBuf {
    checkpoint("server-tiny-qwen3-seed1", 2, 1)
}

/// The engine configuration of the test servers.
pub fn test_config() -> EngineConfig {
    EngineConfig {
        num_blocks: 512,
        block_size: 16,
        ..EngineConfig::default()
    }
}

/// Starts a server on its own runtime thread; returns its address.
pub fn start(api_key: Option<&str>) -> SocketAddr {
    start_with(api_key, test_config())
}

pub fn start_with(api_key: Option<&str>, cfg: EngineConfig) -> SocketAddr {
    start_dir(model_dir(), MODEL, api_key, cfg)
}

/// Serves `state` on a free port from a thread of its own (a two-thread
/// runtime) until `stop` completes; returns the address and the thread.
fn spawn_server(
    state: Arc<AppState>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> (SocketAddr, std::thread::JoinHandle<()>) {
    spawn_server_on(2, state, stop)
}

/// [`spawn_server`] on a runtime of `worker_threads` threads.
pub fn spawn_server_on(
    worker_threads: usize,
    state: Arc<AppState>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> (SocketAddr, std::thread::JoinHandle<()>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(worker_threads)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            tx.send(listener.local_addr().expect("addr"))
                .expect("send addr");
            agentd_server::serve(listener, state, stop)
                .await
                .expect("serve");
        });
    });
    let addr = rx.recv_timeout(Duration::from_secs(60)).expect("server up");
    (addr, thread)
}

/// Starts a server for the model in `dir`, served as `name`.
pub fn start_dir(dir: &Path, name: &str, api_key: Option<&str>, cfg: EngineConfig) -> SocketAddr {
    let engine =
        Engine::with_model(Arc::new(Model::load(dir).expect("model")), cfg).expect("engine");
    let state = Arc::new(
        AppState::new(engine, dir, name.to_string(), api_key.map(str::to_string)).expect("state"),
    );
    spawn_server(state, std::future::pending()).0
}

/// Serves a state the test built itself (custom bounds); never stops.
pub fn start_state(state: Arc<AppState>) -> SocketAddr {
    spawn_server(state, std::future::pending()).0
}

/// The test model served with vLLM's dev-mode routes on
/// (`VLLM_SERVER_DEV_MODE=1`).
pub fn start_dev() -> SocketAddr {
    let engine = Engine::with_model(
        Arc::new(Model::load(model_dir()).expect("model")),
        test_config(),
    )
    .expect("engine");
    let mut state = AppState::new(engine, model_dir(), MODEL.to_string(), None).expect("state");
    state.dev_mode = true;
    start_state(Arc::new(state))
}

/// A server with its tool side configured, and a way to stop it.
pub struct Server {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Graceful shutdown; returns once `serve` has returned (after the
    /// `reclaim_on_exit` reclaims, when configured).
    pub fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().expect("server thread");
        }
    }
}

pub fn start_tools(
    api_key: Option<&str>,
    cfg: EngineConfig,
    tools: agentd_tools::ToolsConfig,
) -> Server {
    start_tweaked(api_key, cfg, tools, |_| {})
}

/// [`start_tools`], with `tweak` applied to the state before serving
/// (connection limits, tenants).
pub fn start_tweaked(
    api_key: Option<&str>,
    cfg: EngineConfig,
    tools: agentd_tools::ToolsConfig,
    tweak: impl FnOnce(&mut AppState),
) -> Server {
    let dir = model_dir();
    let engine =
        Engine::with_model(Arc::new(Model::load(dir).expect("model")), cfg).expect("engine");
    let mut state = AppState::with_tools(
        engine,
        dir,
        MODEL.to_string(),
        api_key.map(str::to_string),
        tools,
    )
    .expect("state");
    tweak(&mut state);
    let state = Arc::new(state);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stop = async move {
        let _ = stop_rx.await;
    };
    let (addr, thread) = spawn_server(state, stop);
    Server {
        addr,
        stop: Some(stop_tx),
        thread: Some(thread),
    }
}

/// One server shared by the tests of a binary (no API key).
pub fn shared() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| start(None))
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of an SSE body, `[DONE]` included.
    pub fn events(&self) -> Vec<String> {
        self.body
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }
}

fn write_request(
    s: &mut TcpStream,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    req.push_str("\r\n");
    if let Some(b) = body {
        req.push_str(b);
    }
    s.write_all(req.as_bytes()).expect("write request");
}

pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Resp {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).ok();
    write_request(&mut s, method, path, headers, body);
    read_response(s)
}

/// Sends `bytes` as they are (a request the tests build by hand, malformed
/// or not) and reads the response until the server closes.
pub fn raw_request(addr: SocketAddr, bytes: &[u8]) -> Resp {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).ok();
    // The server may answer (413) and close before reading everything.
    // The write side stays open: hyper drops a request whose client closed
    // it (no half-close), so that hung-up clients' requests are cancelled.
    let _ = s.write_all(bytes);
    read_response(s)
}

fn read_response(mut s: TcpStream) -> Resp {
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    // A reset after the response (unread request bytes) ends the read too.
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
    }
    let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        // No response at all (the connection was dropped): status 0, for
        // the caller to report with what it sent.
        return Resp {
            status: 0,
            headers: Vec::new(),
            body: String::from_utf8_lossy(&raw).into_owned(),
        };
    };
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    if chunked {
        body = dechunk(&body);
    }
    Resp {
        status,
        headers,
        body: String::from_utf8(body).expect("utf-8 body"),
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size = usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).trim(), 16)
            .expect("chunk size");
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 2 + size + 2..];
    }
}

/// A JSON array of token ids (SGLang's `output_ids`, `/tokenize`'s
/// `tokens`).
pub fn id_list(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("an id list")
        .iter()
        .map(|t| t.as_u64().expect("an id"))
        .collect()
}

/// The `output_ids` of an SGLang `/generate` answer.
pub fn output_ids(v: &Value) -> Vec<u64> {
    id_list(&v["output_ids"])
}

pub fn post(addr: SocketAddr, path: &str, body: &Value) -> Resp {
    request(addr, "POST", path, &[], Some(&body.to_string()))
}

pub fn get(addr: SocketAddr, path: &str) -> Resp {
    request(addr, "GET", path, &[], None)
}

/// Sends a streaming request and hangs up after the first `data:` event.
pub fn post_and_hang_up(addr: SocketAddr, path: &str, body: &Value) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).ok();
    write_request(&mut s, "POST", path, &[], Some(&body.to_string()));
    let mut r = BufReader::new(s);
    let mut line = String::new();
    loop {
        line.clear();
        let n = r.read_line(&mut line).expect("read");
        assert!(n > 0, "stream ended before any event");
        if line.starts_with("data: ") {
            break;
        }
    }
    // Dropping the reader closes the socket mid-stream.
}

/// A metric's value from `/metrics` text (first line starting with `name{`).
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing:\n{text}"))
}

/// A tool process leading its own group.
pub fn tool_process() -> std::process::Child {
    use std::os::unix::process::CommandExt;
    std::process::Command::new("sleep")
        .arg("300")
        .process_group(0)
        .spawn()
        .expect("spawn sleep")
}

/// Waits for `child` to exit (we are its parent: reaping it is our job) and
/// checks it was killed by SIGTERM, then that its pid is gone.
pub fn assert_terminated(mut child: std::process::Child) {
    use std::os::unix::process::ExitStatusExt;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "process {} still alive",
            child.id()
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    // SAFETY: signal 0 only asks whether the pid exists.
    let r = unsafe { libc::kill(child.id() as i32, 0) };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ESRCH)
    );
}

/// Environment commands allowed, as `nobody` when the tests run as root
/// (the server refuses to run them as root); `root` (the sandbox root) is
/// made traversable for that user.
pub fn test_commands(root: &Path) -> agentd_tools::CommandPolicy {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid only reads process state.
    let as_root = unsafe { libc::geteuid() } == 0;
    if as_root {
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755))
            .expect("chmod sandbox root");
    }
    agentd_tools::CommandPolicy {
        allow: true,
        user: as_root.then_some((65534, 65534)),
        memory_max: Some(1 << 30),
    }
}
