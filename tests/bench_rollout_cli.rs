//! `agentd bench --workload rollout` end to end over sockets: two real
//! `agentd serve` processes on the embedded tiny model (program and
//! request scheduler), 2 iterations x 2 groups x 2 samples, the weights
//! swapped to a second checkpoint (`agentd make-model --seed 1`) between
//! the iterations through SGLang's routes. Every program finishes, the
//! weight version changes, the swap is timed apart from the generation,
//! and the servers serve the second checkpoint afterwards.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};

use common::{http, spawn_serve, Proc};
use serde_json::Value;

fn tmp(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&d).expect("tmp dir");
    d
}

fn serve(policy: &str) -> (Proc, String) {
    let (p, addr, _logs) = spawn_serve(
        "bench-rollout-cache",
        ["--num-kv-blocks", "256", "--scheduler", policy],
    );
    (p, addr)
}

fn get(addr: &str, path: &str) -> Value {
    let (status, body) = http(addr, "GET", path, None);
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).expect("json")
}

#[test]
fn rollout_iterations_swap_weights_between_them() {
    let (_program, a) = serve("program");
    let (_request, b) = serve("request");
    // The checkpoint the servers start on, and a second one of its shape.
    let first = get(&a, "/model_info")["model_path"]
        .as_str()
        .expect("model_path")
        .to_string();
    let second = tmp("bench-rollout").join("seed1");
    if !second.join("model.safetensors").is_file() {
        let st = Command::new(env!("CARGO_BIN_EXE_agentd"))
            .args(["make-model", "--config"])
            .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/qwen3-tiny.json"))
            .arg("--out")
            .arg(&second)
            .args(["--seed", "1"])
            .status()
            .expect("make-model");
        assert!(st.success());
    }
    let out = tmp("bench-rollout-out");
    let o = Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["bench", "--workload", "rollout"])
        .args(["--target", &format!("program=http://{a}")])
        .args(["--target", &format!("request=http://{b}")])
        .args(["--iterations", "2", "--groups", "2", "--group-size", "2"])
        .arg("--weights")
        .arg(format!("{first},{}", second.display()))
        .args([
            "--system-tokens",
            "32",
            "--task-tokens",
            "=16",
            "--turns",
            "2:4",
        ])
        .args([
            "--tool-tokens",
            "=8",
            "--output-tokens",
            "=4",
            "--tool-time",
            "fixed:0.05",
        ])
        .args(["--seed", "3", "--request-timeout-s", "60"])
        .arg("--json")
        .arg(out.join("r.json"))
        .arg("--markdown")
        .arg(out.join("r.md"))
        .arg("--plot")
        .arg(out.join("r.svg"))
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("agentd bench");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("r.json")).expect("json"))
            .expect("json");
    let rows = doc["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 4, "{rows:?}");
    for (r, (target, k)) in rows.iter().zip([
        ("program", 0),
        ("program", 1),
        ("request", 0),
        ("request", 1),
    ]) {
        assert_eq!(r["target"], target);
        assert_eq!(r["iteration"], k);
        assert_eq!(r["programs"], 4, "{r}");
        assert_eq!(r["programs_finished"], 4, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
        assert_eq!(r["groups_finished"], 2, "{r}");
        assert!(r["gen_tok_s"].as_f64().unwrap() > 0.0, "{r}");
        // agentd serves /metrics: the iteration's prefix-cache queries.
        assert!(r["counters"]["queries"].as_f64().unwrap() > 0.0, "{r}");
        let p50 = r["group_makespan_p50_s"].as_f64().unwrap();
        let max = r["group_makespan_max_s"].as_f64().unwrap();
        assert!(
            p50 > 0.0 && max >= p50 && max <= r["wall_s"].as_f64().unwrap() + 1e-9,
            "{r}"
        );
        // 2 to 4 turns of exactly 4 tokens per program.
        let out = r["output_tokens"].as_u64().unwrap();
        assert!((4 * 2 * 4..=4 * 4 * 4).contains(&out), "{r}");
        if k == 0 {
            assert!(r["swap"].is_null(), "{r}");
        } else {
            let s = &r["swap"];
            assert!(s["update_s"].as_f64().unwrap() > 0.0, "{r}");
            assert!(s["total_s"].as_f64().unwrap() >= s["update_s"].as_f64().unwrap());
            assert!(s["read_s"].as_f64().unwrap() > 0.0, "{r}");
            assert!(s["checkpoint_bytes"].as_u64().unwrap() > 0, "{r}");
            assert_eq!(s["checkpoint"], second.display().to_string());
        }
    }
    // The weight version changes between the iterations, on both servers.
    for pair in [&rows[0..2], &rows[2..4]] {
        let (v0, v1) = (&pair[0]["weight_version"], &pair[1]["weight_version"]);
        assert!(v0.is_string() && v1.is_string(), "{pair:?}");
        assert_ne!(v0, v1, "{pair:?}");
    }
    // Both servers now serve the second checkpoint under that version, and
    // every program was released.
    for (addr, row) in [(&a, &rows[1]), (&b, &rows[3])] {
        let info = get(addr, "/model_info");
        assert_eq!(info["model_path"], second.display().to_string());
        assert_eq!(
            get(addr, "/weight_version")["weight_version"],
            row["weight_version"]
        );
        // A release is carried out once no batch holds the program.
        let t = std::time::Instant::now();
        let mut programs = get(addr, "/programs");
        while programs.as_array().is_some_and(|p| !p.is_empty())
            && t.elapsed() < std::time::Duration::from_secs(10)
        {
            std::thread::sleep(std::time::Duration::from_millis(100));
            programs = get(addr, "/programs");
        }
        assert_eq!(programs, Value::Array(vec![]), "{programs}");
    }
    assert!(
        stdout.contains("makespan") && stdout.contains("update/read"),
        "{stdout}"
    );
    let md = std::fs::read_to_string(out.join("r.md")).expect("markdown");
    assert!(
        md.contains("kernel path") && md.contains("Per target"),
        "{md}"
    );
    let svg = std::fs::read_to_string(out.join("r.svg")).expect("svg");
    assert!(
        svg.starts_with("<svg") && svg.contains("Weight swap"),
        "{svg}"
    );
}
