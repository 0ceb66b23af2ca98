//! `agentd bench` end to end against a real `agentd serve` (the embedded
//! tiny model, a tiny KV pool): JSON rows, plot and table; and against a
//! server that is not there or dies mid-run: errors reported, non-zero
//! exit, no hang.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use agentd_bench::prom::Metrics;
use common::{http, spawn_serve, Proc};

use serde_json::Value;

fn tmp(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&d).expect("tmp dir");
    d
}

/// `agentd serve` on a free port with the embedded tiny model; its address.
fn serve(blocks: &str) -> (Proc, String) {
    let (p, addr, _logs) = spawn_serve("bench-cli-cache", ["--num-kv-blocks", blocks]);
    (p, addr)
}

/// A small, fast workload; `extra` adds flags.
fn bench_cmd(url: &str, out: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_agentd"));
    c.args(["bench", "--target", &format!("agentd={url}")])
        .args([
            "--workload",
            "swe",
            "--system-tokens",
            "64",
            "--task-tokens",
            "=16",
        ])
        .args([
            "--turns",
            "=3",
            "--tool-tokens",
            "=24",
            "--output-tokens",
            "=4",
        ])
        .args(["--seed", "3", "--no-progress"]);
    if !extra.contains(&"--tool-time") {
        c.args(["--tool-time", "fixed:0.05"]);
    }
    c.args(["--request-timeout-s", "20", "--settle-s", "0.2"])
        .arg("--json")
        .arg(out.join("out.json"))
        .arg("--plot")
        .arg(out.join("out.svg"))
        .args(extra)
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn rows(out: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(out.join("out.json")).expect("json written");
    let v: Value = serde_json::from_str(&text).expect("json");
    v["rows"].as_array().expect("rows").clone()
}

fn output_within(mut c: Command, limit: Duration) -> (Output, Duration) {
    let t = Instant::now();
    let child = c.spawn().expect("spawn agentd bench");
    let (tx, rx) = mpsc::channel();
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => (out.expect("bench output"), t.elapsed()),
        Err(_) => {
            // Do not leave it running; the test fails on the hang.
            let _ = Command::new("kill").arg(pid.to_string()).status();
            panic!("agentd bench did not finish within {limit:?}");
        }
    }
}

#[test]
fn bench_against_agentd_serve_writes_rows_plot_and_table() {
    let (_server, addr) = serve("128");
    let out = tmp("bench-e2e");
    let cmd = bench_cmd(
        &format!("http://{addr}"),
        &out,
        &[
            "--concurrency",
            "1,3",
            "--duration-s",
            "2",
            "--warmup-s",
            "0.5",
        ],
    );
    let (o, _) = output_within(cmd, Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("steps/min") && stdout.contains("x agentd"),
        "{stdout}"
    );
    let got = rows(&out);
    assert_eq!(got.len(), 2, "{got:?}");
    for (r, c) in got.iter().zip([1, 3]) {
        assert_eq!(r["target"], "agentd");
        assert_eq!(r["concurrency"], c);
        assert_eq!(r["errors"], 0, "{r}");
        assert!(r["steps_per_min"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["output_tok_s"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["hit_rate_source"], "metrics");
        let hit = r["prefix_hit_rate"].as_f64().unwrap();
        let ideal = r["ideal_hit_rate"].as_f64().unwrap();
        // 3 turns of 64+16, +28, +28 tokens: most of each later prompt is reusable.
        assert!(ideal > 0.4 && ideal < 1.0, "{r}");
        // The program scheduler keeps every context: it hits what an
        // unlimited cache would (usage agrees with the metrics).
        assert!(hit >= 0.95 * ideal, "{r}");
        assert!(r["usage_hit_rate"].as_f64().unwrap() >= 0.95 * ideal, "{r}");
        let p50 = r["p50_step_s"].as_f64().unwrap();
        let p99 = r["p99_step_s"].as_f64().unwrap();
        assert!(p50 > 0.0 && p99 >= p50, "{r}");
        assert!(r["ttft_p50_s"].as_f64().unwrap() <= p99, "{r}");
        assert_eq!(r["preemptions"], 0.0);
    }
    let svg = std::fs::read_to_string(out.join("out.svg")).expect("svg");
    assert!(svg.starts_with("<svg") && svg.contains("agentd"));

    // Chat mode, whole responses: the same server through the chat template.
    let chat = tmp("bench-e2e-chat");
    let cmd = bench_cmd(
        &format!("http://{addr}"),
        &chat,
        &[
            "--mode",
            "chat",
            "--no-stream",
            "--concurrency",
            "2",
            "--duration-s",
            "1.5",
        ],
    );
    let (o, _) = output_within(cmd, Duration::from_secs(60));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = &rows(&chat)[0];
    assert_eq!(r["errors"], 0, "{r}");
    assert!(r["steps"].as_u64().unwrap() > 0, "{r}");
    assert!(r["ttft_p50_s"].is_null(), "no TTFT without streaming: {r}");
    // Later turns extend the earlier ones' prompts through the template.
    assert!(r["prefix_hit_rate"].as_f64().unwrap() > 0.3, "{r}");
}

#[test]
fn bench_against_nothing_listening_fails_fast() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let out = tmp("bench-nothing");
    let cmd = bench_cmd(
        &format!("http://127.0.0.1:{port}"),
        &out,
        &["--concurrency", "2", "--duration-s", "5"],
    );
    let (o, took) = output_within(cmd, Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    assert!(took < Duration::from_secs(15), "took {took:?}");
    assert!(stderr.contains("connect"), "{stderr}");
    let rows = rows(&out);
    assert_eq!(rows[0]["errors"], 1);
    assert_eq!(rows[0]["aborted"], true);
}

#[test]
fn bench_against_a_server_killed_mid_run_reports_errors() {
    let (mut server, addr) = serve("128");
    let out = tmp("bench-killed");
    let cmd = bench_cmd(
        &format!("http://{addr}"),
        &out,
        &[
            "--concurrency",
            "2,4",
            "--duration-s",
            "20",
            "--warmup-s",
            "0.5",
        ],
    );
    let t = Instant::now();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(3));
        let _ = server.0.kill();
        let _ = server.0.wait();
    });
    let (o, _) = output_within(cmd, Duration::from_secs(60));
    killer.join().expect("killer");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    // It noticed within seconds, not at the end of the 20 s level.
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    assert!(stderr.contains("stopped by errors"), "{stderr}");
    let rows = rows(&out);
    assert_eq!(rows.len(), 1, "the second level is skipped: {rows:?}");
    assert!(rows[0]["errors"].as_u64().unwrap() >= 1);
    assert_eq!(rows[0]["aborted"], true);
    assert!(
        rows[0]["steps"].as_u64().unwrap() > 0,
        "it ran before the kill"
    );
}

/// A stationary start sends each first-wave program's earlier turns as
/// history: the real server answers those longer prompts with exact counts,
/// and the first window sees later turns than a cold start does.
#[test]
fn a_stationary_start_joins_programs_mid_plan() {
    let (_server, addr) = serve("128");
    let url = format!("http://{addr}");
    let mean_prompt = |name: &str, extra: &[&str]| {
        let out = tmp(name);
        // Tools of 3 s: the 1.5 s window holds the first wave's first
        // requests only, so it shows the turns the programs start at.
        let mut args = vec![
            "--concurrency",
            "8",
            "--duration-s",
            "1.5",
            "--warmup-s",
            "0",
            "--tool-time",
            "fixed:3",
        ];
        args.extend_from_slice(extra);
        let (o, _) = output_within(bench_cmd(&url, &out, &args), Duration::from_secs(60));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let r = rows(&out).remove(0);
        assert_eq!(r["errors"], 0, "{r}");
        let steps = r["steps"].as_u64().unwrap();
        let finished = r["programs_finished"].as_u64().unwrap();
        // One request per program, and one more for each that joined at
        // its last turn (it ends at once and the next program starts cold).
        assert_eq!(steps, 8 + finished, "{r}");
        // Each of them is its program's first request of the level.
        assert_eq!(r["first_steps"].as_u64(), Some(steps), "{r}");
        assert!(r["later_step_p99_s"].is_null(), "{r}");
        assert!(r["first_step_p99_s"].as_f64().is_some(), "{r}");
        (
            r["prompt_tokens"].as_u64().unwrap() as f64 / steps as f64,
            finished,
        )
    };
    // Turn k's prompt: 64 system + 16 task + k * (4 output + 24 tool).
    let cold = mean_prompt("bench-cold", &[]);
    assert_eq!(
        cold,
        (80.0, 0),
        "a cold start begins every program at turn 0"
    );
    let (joined, finished) = mean_prompt("bench-stationary", &["--stationary-start"]);
    assert!(finished > 0, "some program joins at its last turn (seed 3)");
    assert!(joined > 85.0 && joined <= 136.0, "mean prompt {joined}");
}

/// A step still in flight when the window closes is in the tail too: with
/// the real server frozen (SIGSTOP) for the rest of a 6 s level once it has
/// answered some steps, every program's step is open at the end, and the
/// row counts them by their ages (the finished steps' p99 alone would hide
/// the wait).
#[test]
fn steps_open_when_the_window_closes_count_by_their_age() {
    let (server, addr) = serve("128");
    let url = format!("http://{addr}");
    let out = tmp("bench-open");
    let args = ["--concurrency", "4", "--duration-s", "6", "--warmup-s", "0"];
    let spawned = Instant::now();
    let child = bench_cmd(&url, &out, &args).spawn().expect("spawn bench");
    let finished = || {
        let (_, m) = http(&addr, "GET", "/metrics", None);
        Metrics::parse(&m)
            .get("agentd:requests_finished_total")
            .unwrap_or(0.0)
    };
    while finished() < 8.0 {
        assert!(
            spawned.elapsed() < Duration::from_secs(3),
            "no steps in 3 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let signal = |sig: &str| {
        let ok = Command::new("kill")
            .args([sig, &server.0.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig}");
    };
    signal("-STOP");
    // Past the level's end; the bench waits on its final scrape meanwhile.
    std::thread::sleep(Duration::from_secs(7).saturating_sub(spawned.elapsed()));
    signal("-CONT");
    let o = child.wait_with_output().expect("bench output");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = rows(&out).remove(0);
    assert_eq!(r["open_steps"], 4, "{r}");
    // Frozen from at most 3 s into the 6 s window until its end.
    let oldest = r["oldest_open_s"].as_f64().expect("oldest open step");
    assert!((2.5..=6.0).contains(&oldest), "{r}");
    let (p99, with_open) = (
        r["p99_step_s"].as_f64().unwrap(),
        r["p99_with_open_s"].as_f64().unwrap(),
    );
    assert!(p99 < 2.0 && with_open >= 2.5, "{r}");
    assert!(r["steps"].as_u64().unwrap() >= 8, "{r}");
}

/// `--order` runs the targets in the order it names (the first is the
/// baseline of the ratios), whichever flag named them; an unknown or
/// missing name is refused before anything runs.
#[test]
fn order_runs_the_targets_as_named() {
    let (_server, addr) = serve("128");
    let out = tmp("bench-order");
    let url = format!("http://{addr}");
    let second = format!("second={url}");
    let flags = [
        "--target",
        second.as_str(),
        "--order",
        "second,agentd",
        "--concurrency",
        "1",
        "--duration-s",
        "1",
        "--warmup-s",
        "0.2",
    ];
    let (o, _) = output_within(bench_cmd(&url, &out, &flags), Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("x second"), "{stdout}");
    let names: Vec<String> = rows(&out)
        .iter()
        .map(|r| r["target"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(names, ["second", "agentd"]);

    let bad = ["--target", second.as_str(), "--order", "second,nobody"];
    let (o, took) = output_within(bench_cmd(&url, &out, &bad), Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    assert!(
        stderr.contains("--order must name every target once"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(10), "refused late: {took:?}");

    let mut rollout = Command::new(env!("CARGO_BIN_EXE_agentd"));
    rollout
        .args(["bench", "--target", &format!("agentd={url}")])
        .args(["--workload", "rollout", "--order", "agentd"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (o, _) = output_within(rollout, Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    assert!(
        stderr.contains("--order is for the agentic sweep"),
        "{stderr}"
    );
}
