//! `agentd simulate` end to end: the real binary, its JSON and its plot.

use std::process::Command;

fn agentd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_agentd"))
}

/// A fresh directory for one test's output files.
fn out_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("agentd-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[test]
fn simulate_writes_json_table_and_plot() {
    let dir = out_dir("sim-cli");
    let json = dir.join("out.json");
    let svg = dir.join("out.svg");
    let out = agentd()
        .args(["simulate", "--workload", "toolorch", "--concurrency", "2,6"])
        .args(["--policy", "request,program", "--kv-tokens", "80000"])
        .args(["--duration-s", "300", "--seed", "3"])
        .arg("--json")
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .output()
        .expect("agentd runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("x request"),
        "ratio column against the baseline:\n{table}"
    );
    assert_eq!(
        table.lines().count(),
        2 + 4,
        "header, rule, 4 runs:\n{table}"
    );

    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("json written")).expect("valid json");
    let runs = doc["runs"].as_array().expect("runs array");
    assert_eq!(runs.len(), 4);
    for r in runs {
        for key in [
            "steps_per_min",
            "prefix_hit_rate",
            "ideal_hit_rate",
            "recomputed_tokens",
            "pauses",
            "restores",
            "kv_imbalance",
            "sched_us_per_step",
        ] {
            assert!(r[key].is_number(), "{key} missing in {r}");
        }
        assert_eq!(r["workload"], "toolorch");
        assert!(r["steps_per_min"].as_f64().unwrap_or(0.0) > 0.0);
    }
    let plot = std::fs::read_to_string(&svg).expect("svg written");
    assert!(plot.starts_with("<svg") && plot.contains("Prefix-cache hit rate"));
    assert_eq!(
        plot.matches("<polyline").count(),
        4,
        "2 panels x 2 policies"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn simulate_rejects_bad_flags_with_a_clear_message() {
    let out = agentd()
        .args(["simulate", "--policy", "fastest"])
        .output()
        .expect("agentd runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown policy 'fastest'"), "{err}");

    let out = agentd()
        .args(["simulate", "--kv-tokens", "100", "--duration-s", "10"])
        .output()
        .expect("agentd runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("kv_tokens"));
}

/// The workload shape flags `agentd bench` takes reshape the simulated
/// preset the same way: fixed 4 output tokens a turn show as exactly 4
/// output tokens per completed turn; a shape the simulator cannot draw
/// (exponential tool times) is refused naming the flag's field.
#[test]
fn simulate_takes_the_bench_workload_shape() {
    let dir = out_dir("sim-shape");
    let json = dir.join("out.json");
    let shape = [
        "--system-tokens",
        "256",
        "--task-tokens",
        "64:128",
        "--turns",
        "4:6",
        "--tool-tokens",
        "=64",
        "--output-tokens",
        "=4",
        "--tool-time",
        "fixed:0.5",
    ];
    let out = agentd()
        .args(["simulate", "--workload", "swe", "--concurrency", "8"])
        .args([
            "--policy",
            "program",
            "--duration-s",
            "600",
            "--warmup-s",
            "0",
        ])
        .args(shape)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("agentd runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parses");
    let run = &v["runs"][0];
    let per_turn = run["output_tok_s"].as_f64().expect("output_tok_s") * 60.0
        / run["steps_per_min"].as_f64().expect("steps_per_min");
    assert!(
        (per_turn - 4.0).abs() < 0.05,
        "{per_turn} output tokens a turn: {run}"
    );

    let out = agentd()
        .args(["simulate", "--workload", "swe", "--concurrency", "2"])
        .args(["--tool-time", "exp:2"])
        .output()
        .expect("agentd runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tool times log-normally"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
