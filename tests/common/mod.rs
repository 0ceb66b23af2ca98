//! Helpers shared by the tests of the `agentd` binary: spawn `agentd serve`
//! on a free port and learn its address from its log, and a minimal HTTP/1.1
//! client.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

/// Kills the child when the test ends, pass or fail.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `agentd serve --port 0 <args>` with its model cache under the test's temp
/// dir (`cache`); returns the process, the address it logged, and its log
/// lines as they come.
pub fn spawn_serve<I, S>(cache: &str, args: I) -> (Proc, String, mpsc::Receiver<String>)
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    spawn_serve_env(cache, args, &[])
}

/// [`spawn_serve`] with extra environment variables.
pub fn spawn_serve_env<I, S>(
    cache: &str,
    args: I,
    env: &[(&str, &str)],
) -> (Proc, String, mpsc::Receiver<String>)
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let cache = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(cache);
    let child = Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["serve", "--port", "0"])
        .args(args)
        .envs(env.iter().copied())
        .env("XDG_CACHE_HOME", &cache)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn agentd serve");
    let mut p = Proc(child);
    let stderr = p.0.stderr.take().expect("stderr");
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
    let addr = match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(addr) => addr,
        Err(e) => {
            // A server that never listened: show why (its exit and log),
            // or a failure seen once on a fresh machine stays a mystery.
            let status = p.0.try_wait().ok().flatten();
            let log: Vec<String> = log_rx.try_iter().collect();
            panic!(
                "the server did not log its address ({e}); exit {status:?}; its log:\n{}",
                log.join("\n")
            );
        }
    };
    (p, addr, log_rx)
}

/// `Connection: close` HTTP/1.1 exchange; returns (status, body).
pub fn http(addr: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
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

/// `agentd serve --port P <args>` that must fail at startup: waits for it to
/// exit (at most 120 s), probing P meanwhile, and panics if anything ever
/// answered there. Returns the exit status and the stderr lines.
pub fn serve_fails<I, S>(cache: &str, args: I) -> (std::process::ExitStatus, Vec<String>)
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    serve_fails_env(cache, args, &[])
}

/// [`serve_fails`] with extra environment variables.
pub fn serve_fails_env<I, S>(
    cache: &str,
    args: I,
    env: &[(&str, &str)],
) -> (std::process::ExitStatus, Vec<String>)
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    // A port nobody listens on now; the server would bind it once loaded.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let cache = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(cache);
    let child = Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["serve", "--port", &port.to_string()])
        .args(args)
        .envs(env.iter().copied())
        .env("XDG_CACHE_HOME", &cache)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn agentd serve");
    let mut p = Proc(child);
    let stderr = p.0.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let started = std::time::Instant::now();
    let status = loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(50)).is_ok() {
            panic!("a server that failed to load answered on port {port}");
        }
        if let Some(s) = p.0.try_wait().expect("wait") {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "agentd serve neither failed nor served"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err(),
        "port {port} answers after the server exited"
    );
    (status, reader.join().expect("stderr reader"))
}
