//! The real `agentd serve` binary with no `--model`: it generates the
//! embedded tiny Qwen3 into its cache, logs the address it listens on, and
//! answers a chat completion and `/metrics`.

mod common;

use common::{http, spawn_serve};
use serde_json::{json, Value};

#[test]
fn serve_default_model_end_to_end() {
    let (_server, addr, _logs) = spawn_serve("serve-cli-cache", ["--num-kv-blocks", "256"]);

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
    // The kernel path this CPU runs (no AGENTD_CPU_KERNELS: the fastest).
    let best = agentd_models::cpu_kernels::KernelPath::best();
    assert!(
        body.contains(&format!("agentd:cpu_kernels_info{{path=\"{best}\"}} 1")),
        "{body}"
    );
}

/// `AGENTD_CPU_KERNELS` naming no path, or one the CPU lacks, stops `agentd
/// serve` at start with a message that names the paths it has.
#[test]
fn serve_refuses_a_cpu_kernel_path_the_cpu_lacks() {
    use agentd_models::cpu_kernels::KernelPath;
    use std::process::Command;

    let cache = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("serve-cli-cache");
    let serve = |value: &str| {
        Command::new(env!("CARGO_BIN_EXE_agentd"))
            .args(["serve", "--port", "0"])
            .env("XDG_CACHE_HOME", &cache)
            .env("NO_COLOR", "1")
            .env("AGENTD_CPU_KERNELS", value)
            .output()
            .expect("run agentd serve")
    };
    let out = serve("sse9");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\"sse9\" is not a kernel path"), "{err}");
    let lacking = KernelPath::ALL.into_iter().find(|p| !p.supported());
    let lacking = lacking.expect("no CPU has both the x86 and the aarch64 paths");
    let out = serve(lacking.name());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("this CPU lacks") && err.contains("portable"),
        "{err}"
    );
}

/// Without the `cuda` feature, `--device cuda` stops at once with a message
/// that says how to get a CUDA build (instead of serving on the CPU).
#[cfg(not(feature = "cuda"))]
#[test]
fn serve_device_cuda_needs_a_cuda_build() {
    use std::process::Command;

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
    // --gpu-memory-utilization sizes the CUDA pool: accepted with --device
    // cuda (no longer "not supported"), so the same message comes.
    let out = Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["serve", "--device", "cuda", "--port", "0"])
        .args(["--gpu-memory-utilization", "0.8"])
        .env("XDG_CACHE_HOME", &cache)
        .env("NO_COLOR", "1")
        .output()
        .expect("run agentd serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("built without CUDA") && !err.contains("not supported"),
        "{err}"
    );
}

/// An explicit `--max-model-len` that one replica's pool cannot hold stops
/// `agentd serve` at startup with both numbers (vLLM refuses to start
/// too); without the flag the window is lowered to the pool instead.
#[test]
fn serve_refuses_a_max_model_len_the_pool_cannot_hold() {
    use std::process::Command;

    let cache = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("serve-cli-window");
    let serve = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_agentd"))
            .args([
                "serve",
                "--port",
                "0",
                "--num-kv-blocks",
                "4",
                "--block-size",
                "16",
            ])
            .args(extra)
            .env("XDG_CACHE_HOME", &cache)
            .env("NO_COLOR", "1")
            .output()
            .expect("run agentd serve")
    };
    let out = serve(&["--max-model-len", "1024"]);
    assert!(
        !out.status.success(),
        "started with a window the pool cannot hold"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    // 4 blocks of 16 tokens: a 64-token pool.
    assert!(
        err.contains("--max-model-len 1024") && err.contains("64 tokens"),
        "{err}"
    );

    let (_server, addr, _logs) = spawn_serve(
        "serve-cli-window",
        ["--num-kv-blocks", "4", "--block-size", "16"],
    );
    let (status, body) = http(&addr, "GET", "/v1/models", None);
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["data"][0]["max_model_len"], 64, "{body}");
}

/// Servers started together on an empty cache each generate the default
/// model and the first to finish installs it; all of them serve it and no
/// scratch is left. (The install used to delete an installed directory
/// before renaming its own over it, so a server opening files in that
/// window could fail to start; the window is too narrow for this test to
/// hit reliably, so it checks the outcome, not that race.)
#[test]
fn servers_starting_together_share_the_default_model() {
    let name = "serve-cli-race-cache";
    let cache = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::remove_dir_all(&cache).ok();
    let servers: Vec<_> = (0..4)
        .map(|_| std::thread::spawn(move || spawn_serve(name, ["--num-kv-blocks", "64"])))
        .map(|t| t.join().expect("a server starts"))
        .collect();
    for (_server, addr, _logs) in &servers {
        let (status, body) = http(addr, "GET", "/v1/models", None);
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("agentd-tiny-qwen3"), "{body}");
    }
    let model = cache.join("agentd/qwen3-tiny-v1/model");
    assert!(model.join(".complete").is_file());
    let left: Vec<_> = std::fs::read_dir(model.parent().expect("parent"))
        .expect("cache dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "model")
        .collect();
    assert!(left.is_empty(), "scratch left behind: {left:?}");
}
