//! The robustness suite against the real `agentd serve` process (issue 15),
//! where what it holds is exact: its own `/proc/<pid>/fd`, its KV usage, the
//! processes its environments started. Disconnect storms, releases racing a
//! program's first request and its running stream, programs abandoned under
//! a short lease, and an environment command past its memory limit; every
//! answer below 500, KV back to 0, no fd left behind.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::spawn_serve;
use serde_json::{json, Value};

const MODEL: &str = "agentd-tiny-qwen3";

/// Cases run and answers >= 500 seen, across a test.
#[derive(Default)]
struct Tally {
    cases: AtomicUsize,
    server_errors: AtomicUsize,
}

impl Tally {
    fn note(&self, status: u16, what: &str) {
        self.cases.fetch_add(1, Ordering::Relaxed);
        if status >= 500 {
            self.server_errors.fetch_add(1, Ordering::Relaxed);
            eprintln!("5xx: {what}: {status}");
        }
    }
    /// Prints the counts (and the server's fds before / after, where
    /// measured); fails on any 5xx.
    fn report(&self, name: &str, fds: Option<(usize, usize)>) {
        let (cases, errors) = (
            self.cases.load(Ordering::Relaxed),
            self.server_errors.load(Ordering::Relaxed),
        );
        let fds = fds.map_or(String::new(), |(b, a)| {
            format!(", fds {b} before / {a} after")
        });
        eprintln!("{name}: {cases} cases, 5xx = {errors}{fds}");
        assert_eq!(errors, 0, "{name}: answers of 5xx");
    }
}

fn call(addr: &str, method: &str, path: &str, body: Option<&Value>, t: &Tally) -> (u16, Value) {
    let (status, text) = common::http(addr, method, path, body);
    t.note(status, path);
    if status >= 400 {
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        assert!(
            v["error"]["message"].is_string(),
            "{path}: {status} is not the JSON error: {text}"
        );
    }
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Posts a streaming request; returns the stream after its status line was
/// checked and its first `data:` event read.
fn open_stream(addr: &str, path: &str, body: &Value, t: &Tally) -> BufReader<TcpStream> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).ok();
    let body = body.to_string();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).expect("status line");
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    t.note(status, path);
    assert_eq!(status, 200, "{path}: {line}");
    loop {
        line.clear();
        let n = r.read_line(&mut line).expect("read");
        assert!(n > 0, "stream ended before any event");
        if line.starts_with("data: ") {
            return r;
        }
    }
}

fn stream_body(program: Option<&str>, chat: bool) -> (&'static str, Value) {
    let mut b = json!({"model": MODEL, "max_tokens": 400, "ignore_eos": true, "stream": true});
    if chat {
        b["messages"] = json!([{"role": "user", "content": "tell me everything"}]);
    } else {
        b["prompt"] = json!("once upon a time");
    }
    if let Some(p) = program {
        b["program_id"] = json!(p);
    }
    let path = if chat {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    (path, b)
}

fn pid_of(server: &common::Proc) -> u32 {
    server.0.id()
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

fn metric(addr: &str, name: &str) -> f64 {
    let (_, text) = common::http(addr, "GET", "/metrics", None);
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing"))
}

/// Waits until nothing runs and no KV block is referenced.
fn settle(addr: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let running = metric(addr, "vllm:num_requests_running");
        let usage = metric(addr, "vllm:kv_cache_usage_perc");
        if running == 0.0 && usage == 0.0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "running {running}, KV usage {usage}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the server holds at most `baseline` fds (closed connections
/// are released asynchronously); returns the count.
fn fds_back(pid: u32, baseline: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let n = fds(pid);
        if n <= baseline || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn program_ids(addr: &str, t: &Tally) -> Vec<String> {
    let (status, v) = call(addr, "GET", "/programs", None, t);
    assert_eq!(status, 200);
    v.as_array()
        .expect("list")
        .iter()
        .filter_map(|p| p["id"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn disconnect_storms_and_release_races_leave_no_kv_or_fds() {
    let (server, addr, _log) = spawn_serve("serve-storms-cache", ["--num-kv-blocks", "512"]);
    let pid = pid_of(&server);
    let t = Arc::new(Tally::default());
    let warm = json!({"model": MODEL, "prompt": "hi", "max_tokens": 2});
    assert_eq!(
        call(&addr, "POST", "/v1/completions", Some(&warm), &t).0,
        200
    );
    let baseline = fds(pid);

    // 1. A storm of 48 streams, half of named programs, dropped mid-stream.
    std::thread::scope(|s| {
        for i in 0..48 {
            let (addr, t) = (&addr, &t);
            s.spawn(move || {
                let name = format!("storm-{i}");
                let program = (i % 2 == 0).then_some(name.as_str());
                let (path, body) = stream_body(program, i % 3 != 0);
                drop(open_stream(addr, path, &body, t));
            });
        }
    });
    for i in (0..48).step_by(2) {
        let (status, _) = call(
            &addr,
            "POST",
            "/programs/release",
            Some(&json!({"program_id": format!("storm-{i}")})),
            &t,
        );
        assert!(status == 200 || status == 404, "release: {status}");
    }

    // 2. A release racing each program's first request: whichever comes
    // first, no program outlives the pair.
    std::thread::scope(|s| {
        for i in 0..16 {
            let (addr, t) = (&addr, &t);
            let id = format!("race-{i}");
            let body = json!({"model": MODEL, "prompt": "hi", "max_tokens": 8,
                              "program_id": id});
            let release = json!({"program_id": id});
            s.spawn(move || call(addr, "POST", "/v1/completions", Some(&body), t));
            s.spawn(move || call(addr, "POST", "/programs/release", Some(&release), t));
        }
    });

    // 3. A release while the program's stream runs ends that stream.
    let (path, body) = stream_body(Some("live"), true);
    let mut stream = open_stream(&addr, path, &body, &t);
    let (status, _) = call(
        &addr,
        "POST",
        "/programs/release",
        Some(&json!({"program_id": "live"})),
        &t,
    );
    assert_eq!(status, 200);
    let t0 = Instant::now();
    let mut line = String::new();
    while stream.read_line(&mut line).unwrap_or(0) > 0 && !line.contains("[DONE]") {
        line.clear();
    }
    assert!(t0.elapsed() < Duration::from_secs(20), "the stream ended");

    settle(&addr, Duration::from_secs(30));
    let leftover: Vec<String> = program_ids(&addr, &t)
        .into_iter()
        .filter(|p| p.starts_with("race-") || p.starts_with("storm-") || p == "live")
        .collect();
    assert!(
        leftover.is_empty(),
        "programs outlived their release: {leftover:?}"
    );
    let after = fds_back(pid, baseline);
    t.report("storms and races", Some((baseline, after)));
    assert!(
        after <= baseline,
        "fds leaked: {baseline} before, {after} after"
    );
}

#[test]
fn programs_abandoned_under_a_short_lease_give_their_kv_back() {
    let (server, addr, _log) = spawn_serve(
        "serve-storms-cache",
        ["--num-kv-blocks", "512", "--program-lease-s", "1"],
    );
    let pid = pid_of(&server);
    let t = Tally::default();
    let warm = json!({"model": MODEL, "prompt": "hi", "max_tokens": 1});
    assert_eq!(
        call(&addr, "POST", "/v1/completions", Some(&warm), &t).0,
        200
    );
    let baseline = fds(pid);
    for i in 0..40 {
        let body = json!({"model": MODEL, "prompt": format!("task {i}"), "max_tokens": 2,
                          "program_id": format!("abandoned-{i}")});
        assert_eq!(
            call(&addr, "POST", "/v1/completions", Some(&body), &t).0,
            200
        );
    }
    assert!(
        metric(&addr, "vllm:kv_cache_usage_perc") > 0.0,
        "idle programs keep their KV"
    );
    // Never released: the lease (1 s, checked every second) ends them.
    settle(&addr, Duration::from_secs(15));
    assert!(
        program_ids(&addr, &t).is_empty(),
        "lease ended every program"
    );
    let after = fds_back(pid, baseline);
    t.report("abandoned programs", Some((baseline, after)));
    assert!(
        after <= baseline,
        "fds leaked: {baseline} before, {after} after"
    );
}

/// Whether this process's cgroup v2 directory offers the memory controller
/// (then environments get `memory.max` on top of `RLIMIT_AS`).
fn cgroup_memory_controller() -> bool {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let Some(rel) = own.lines().find_map(|l| l.strip_prefix("0::")) else {
        return false;
    };
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter(|l| l.contains(" - cgroup2 "))
        .filter_map(|l| l.split_whitespace().nth(4))
        .any(|m| {
            let dir = format!("{m}{rel}");
            std::fs::read_to_string(format!("{dir}/cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"))
        })
}

#[test]
fn an_environment_command_past_its_memory_limit_fails() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().canonicalize().expect("root");
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut args: Vec<String> = [
        "--num-kv-blocks",
        "256",
        "--allow-environment-commands",
        "--environment-memory-mib",
        "64",
        "--kill-grace-ms",
        "200",
        "--sandbox-root",
    ]
    .map(str::to_string)
    .to_vec();
    args.push(root.display().to_string());
    // As root the server refuses to run commands without a sandbox user.
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root_user = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|u| u.split_whitespace().nth(1))
        == Some("0");
    if root_user {
        args.extend(["--sandbox-user".to_string(), "65534:65534".to_string()]);
    }
    let (_server, addr, _log) = spawn_serve("serve-storms-cache", &args);
    let t = Tally::default();
    // One line of `mib` MiB: `tail` must hold it whole.
    let env = |id: &str, mib: u64| {
        let cmd = format!("head -c {} /dev/zero | tail -n 1 > /dev/null", mib << 20);
        let body = json!({"local": {"command": cmd, "workdir": id}});
        let (status, v) = call(
            &addr,
            "POST",
            &format!("/programs/{id}/environment"),
            Some(&body),
            &t,
        );
        assert_eq!(status, 202, "{v}");
        let (status, v) = call(
            &addr,
            "GET",
            &format!("/programs/{id}/environment?wait=60"),
            None,
            &t,
        );
        assert_eq!(status, 200, "{v}");
        v
    };
    let small = env("small", 8);
    assert_eq!(small["state"], "ready", "8 MiB fits under 64: {small}");
    let big = env("big", 256);
    assert_eq!(big["state"], "failed", "256 MiB is past 64: {big}");
    if cgroup_memory_controller() {
        eprintln!("memory limit: RLIMIT_AS and the cgroup's memory.max");
    } else {
        eprintln!(
            "SKIPPED: cgroup v2 has no memory controller here; the limit held by RLIMIT_AS alone"
        );
    }
    for id in ["small", "big"] {
        let (status, _) = call(
            &addr,
            "POST",
            "/programs/release",
            Some(&json!({"program_id": id})),
            &t,
        );
        assert!(status == 200 || status == 404);
    }
    t.report("environment memory", None);
}
