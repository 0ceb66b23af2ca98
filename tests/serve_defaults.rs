//! What `agentd serve` takes from the model and the machine, as vLLM does:
//! the model's `generation_config.json` sets the default sampling
//! (`--generation-config auto`; `vllm` is neutral; a request's own value
//! wins; `/v1/models` lists them) and its `eos_token_id` ends generation;
//! the CPU KV cache is sized from `VLLM_CPU_KVCACHE_SPACE` (logged as vLLM
//! logs it) and refused with the fix named when it cannot hold one window;
//! common vLLM flags get a one-line answer.

mod common;

use std::path::{Path, PathBuf};

use common::{http, serve_fails_env, spawn_serve_env};
use serde_json::{json, Value};

/// The tiny Qwen3 as `make-model` writes it, with `generation` as its
/// generation_config.json.
fn model(generation: Option<Value>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let card = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/qwen3-tiny.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["make-model", "--config"])
        .arg(&card)
        .arg("--out")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    if let Some(g) = generation {
        std::fs::write(dir.path().join("generation_config.json"), g.to_string()).unwrap();
    }
    dir
}

/// The generated ids and finish reason of one completion with `extra` fields.
fn complete(addr: &str, extra: Value) -> (Vec<u64>, String) {
    let mut body =
        json!({"prompt": "Once upon a time", "max_tokens": 16, "return_token_ids": true});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let (status, text) = http(addr, "POST", "/v1/completions", Some(&body));
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let c = &v["choices"][0];
    let ids = c["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    (ids, c["finish_reason"].as_str().unwrap().to_owned())
}

fn serve(dir: &Path, extra: &[&str]) -> (common::Proc, String, Vec<String>) {
    let mut args = vec![dir.to_str().unwrap(), "--num-kv-blocks", "64"];
    args.extend_from_slice(extra);
    let (p, addr, logs) = spawn_serve_env("serve-defaults", args, &[]);
    // The start lines are all logged before the address.
    let lines = logs.try_iter().collect();
    (p, addr, lines)
}

#[test]
fn generation_config_sets_the_default_sampling() {
    // top_k 1: the model's default sampling is greedy whatever the seed.
    let dir = model(Some(
        json!({"top_k": 1, "temperature": 0.9, "eos_token_id": [151643]}),
    ));
    let (_auto, auto, logs) = serve(dir.path(), &[]);
    assert!(
        logs.iter()
            .any(|l| l.contains("default sampling: temperature=0.9 top_p=1 top_k=1")),
        "{logs:#?}"
    );
    let (_neutral, neutral, _) = serve(dir.path(), &["--generation-config", "vllm"]);
    // /v1/models lists the defaults a request gets.
    let listed = |addr: &str| {
        let (status, text) = http(addr, "GET", "/v1/models", None);
        assert_eq!(status, 200, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        v["data"][0]["sampling_defaults"].clone()
    };
    assert_eq!(
        listed(&auto),
        json!({"temperature": 0.9, "top_p": 1.0, "top_k": 1, "min_p": 0.0,
               "repetition_penalty": 1.0})
    );
    assert_eq!(listed(&neutral)["temperature"], 1.0);
    assert_eq!(listed(&neutral)["top_k"], 0);

    let greedy = complete(&auto, json!({"temperature": 0, "ignore_eos": true})).0;
    let seeded = json!({"seed": 7, "ignore_eos": true});
    // The model's defaults (top_k 1) make a seeded request greedy ...
    assert_eq!(complete(&auto, seeded.clone()).0, greedy);
    // ... the neutral ones sample (temperature 1 over 151936 tokens) ...
    let sampled = complete(&neutral, seeded.clone()).0;
    assert_ne!(sampled, greedy);
    // ... and a request's own top_k wins over the model's: the neutral
    // server's tokens (temperature 0.9 vs 1 still differs, so set both).
    let own = json!({"seed": 7, "ignore_eos": true, "top_k": 0, "temperature": 1.0});
    assert_eq!(complete(&auto, own).0, sampled);

    // eos_token_id of generation_config.json ends generation: make the
    // third greedy token an end id and the completion stops there.
    let third = greedy[2];
    let dir = model(Some(json!({"eos_token_id": [151643, third]})));
    let (_s, addr, _) = serve(dir.path(), &[]);
    let (ids, finish) = complete(&addr, json!({"temperature": 0}));
    // config.json ends on 151645; the first end id in the greedy run stops it
    // (the third token at the latest).
    let stop_at = greedy
        .iter()
        .position(|t| [151645, 151643, third].contains(t))
        .unwrap();
    assert!(stop_at <= 2);
    assert_eq!(finish, "stop", "{ids:?}");
    assert_eq!(
        ids,
        greedy[..=stop_at],
        "stops at the generation config's eos id"
    );
}

#[test]
fn kv_cache_sized_from_memory() {
    let dir = model(None);
    let path = dir.path().to_str().unwrap();
    // 0.01 GiB at 8192 bytes per block (2 layers x K,V x 2 heads x 16 dims
    // x 16 tokens x f32): 1310 blocks, 20960 tokens, 5.12 windows of 4096.
    let (_s, _addr, logs) = spawn_serve_env(
        "serve-kv",
        [
            path,
            "--enable-prefix-caching",
            "--tensor-parallel-size",
            "1",
        ],
        &[("VLLM_CPU_KVCACHE_SPACE", "0.01")],
    );
    let logs: Vec<String> = logs.try_iter().collect();
    let has = |s: &str| logs.iter().any(|l| l.contains(s));
    assert!(has("KV cache size: 20960 tokens"), "{logs:#?}");
    assert!(
        has("Maximum concurrency for 4096 tokens per request: 5.12x"),
        "{logs:#?}"
    );
    assert!(
        has("accepted, no effect: --enable-prefix-caching: always on"),
        "{logs:#?}"
    );

    // 0.001 GiB holds 2096 tokens: not one window of 4096. The error names
    // the variable, the flag and the largest window that fits.
    let env = [("VLLM_CPU_KVCACHE_SPACE", "0.001")];
    let (status, lines) = serve_fails_env("serve-kv", [path], &env);
    assert!(!status.success());
    let err = lines
        .iter()
        .find(|l| l.starts_with("error: "))
        .expect("an error line");
    assert!(
        err.contains("VLLM_CPU_KVCACHE_SPACE") && err.contains("--max-model-len to at most 2096"),
        "{err}"
    );
    // Following the advice starts it.
    let (_s, _addr, logs) = spawn_serve_env("serve-kv", [path, "--max-model-len", "2096"], &env);
    let logs: Vec<String> = logs.try_iter().collect();
    assert!(
        logs.iter()
            .any(|l| l.contains("Maximum concurrency for 2096 tokens per request: 1.00x")),
        "{logs:#?}"
    );

    // vLLM flags agentd does not implement: one line naming the flag.
    // (`-tp` is vLLM's short spelling of --tensor-parallel-size.)
    let (status, lines) = serve_fails_env("serve-kv", [path, "-tp", "2"], &[]);
    assert!(!status.success());
    let err = lines
        .iter()
        .find(|l| l.starts_with("error: "))
        .expect("an error line");
    assert!(
        err.contains("not supported: --tensor-parallel-size"),
        "{err}"
    );

    // The GPU-only paths are refused on the CPU with the device they need.
    for flag in [
        "--device-sampling",
        "--fused-prologue",
        "--single-pass-decode",
        "--device-moe",
        "--cuda-graphs",
    ] {
        let (status, lines) = serve_fails_env("serve-kv", [path, flag], &[]);
        assert!(!status.success(), "{flag}");
        let err = lines
            .iter()
            .find(|l| l.starts_with("error: "))
            .expect("an error line");
        assert!(err.contains(flag) && err.contains("--device cuda"), "{err}");
    }
}
