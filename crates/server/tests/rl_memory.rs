//! SGLang's `/release_memory_occupation` and `/resume_memory_occupation`
//! over the real server (issue 31): the KV pool and the weights go back to
//! the OS (the process's RSS, read from /proc/self/status, drops by their
//! size), requests arriving meanwhile wait, and after the resume (weights
//! read again from disk) greedy output is what it was. One test in this
//! binary, so nothing else allocates in the process while RSS is read.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use agentd_engine::EngineConfig;
use agentd_models::synth::{write_random_model, ModelCard};
use common::{get, output_ids, post, request, start_dir};
use serde_json::{json, Value};

/// Pool blocks of 16 tokens; 256 KiB each for the model below.
const BLOCKS: usize = 256;
const BLOCK_BYTES: u64 = 2 * 4 * 8 * 16 * 64 * 4;
/// Prompt tokens per distinct prompt: 63 blocks, so four prompts and a long
/// request write every block of the pool.
const PROMPT: usize = 1008;

/// A Qwen3 whose weights (the embedding: 151936 x 128 f32, 78 MB) and KV
/// pool (4 layers x 8 KV heads x head_dim 64: 256 KiB a block, 64 MiB for
/// 256 blocks) stand well above the process's other memory.
fn model() -> PathBuf {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("server-mem-qwen3");
    if !out.join(".complete").is_file() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let card = ModelCard::from_file(&root.join("models/qwen3-tiny.json")).expect("card");
        let mut cfg = card.config.clone();
        cfg.hidden_size = 128;
        cfg.intermediate_size = 256;
        cfg.num_hidden_layers = 4;
        cfg.num_attention_heads = 8;
        cfg.num_key_value_heads = 8;
        cfg.head_dim = 64;
        cfg.rotary_dim = 64;
        write_random_model(&cfg, &out, 3, card.tokenizer_dir.as_deref()).expect("write");
        std::fs::write(out.join(".complete"), b"").expect("marker");
    }
    out
}

/// Bytes of the checkpoint's tensors (f32, as loaded).
fn weight_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("model dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .map(|e| e.metadata().expect("metadata").len())
        .sum()
}

/// This process's resident set, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

const MB: f64 = 1e6;

fn prompt(i: usize) -> Vec<u64> {
    (0..PROMPT as u64)
        .map(|t| 100 + (t * 7 + i as u64 * 1009) % 5000)
        .collect()
}

fn greedy(addr: SocketAddr, i: usize) -> Vec<u64> {
    let r = post(addr, "/generate", &body(i));
    assert_eq!(r.status, 200, "{}", r.body);
    output_ids(&r.json())
}

fn body(i: usize) -> Value {
    json!({"input_ids": prompt(i), "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
}

fn error_message(r: &common::Resp) -> String {
    r.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// A long request is running: a release is refused (SGLang asserts there).
fn refused_while_running(addr: SocketAddr) {
    let long = json!({"input_ids": prompt(9), "rid": "long",
        "sampling_params": {"max_new_tokens": 1500, "temperature": 0, "ignore_eos": true}});
    let t = std::thread::spawn(move || post(addr, "/generate", &long));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while get(addr, "/server_info").json()["internal_states"][0]["num_requests"] != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the request never ran"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = post(addr, "/release_memory_occupation", &json!({}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        error_message(&r).contains("no request runs or waits"),
        "{}",
        r.body
    );
    post(addr, "/abort_request", &json!({"rid": "long"}));
    let r = t.join().expect("long request");
    assert_eq!(r.json()["meta_info"]["finish_reason"]["type"], "abort");
}

#[test]
fn released_memory_leaves_rss_and_serving_resumes_unchanged() {
    let dir = model();
    let weights = weight_bytes(&dir);
    let cfg = EngineConfig {
        num_blocks: BLOCKS,
        block_size: 16,
        ..EngineConfig::default()
    };
    let addr = start_dir(&dir, "mem", None, cfg);
    refused_while_running(addr);
    let want: Vec<Vec<u64>> = (0..4).map(|i| greedy(addr, i)).collect();

    let before = rss();
    let r = post(addr, "/release_memory_occupation", &json!({}));
    assert_eq!((r.status, r.body.as_str()), (200, "null"), "{}", r.body);
    let released = rss();
    let pool = BLOCKS as u64 * BLOCK_BYTES;
    eprintln!(
        "RSS: {:.1} MB serving, {:.1} MB released (-{:.1} MB; weights {:.1} MB, KV pool {:.1} MB)",
        before as f64 / MB,
        released as f64 / MB,
        before.saturating_sub(released) as f64 / MB,
        weights as f64 / MB,
        pool as f64 / MB,
    );
    // Every block of the pool was written (four 63-block prompts and the
    // long request), so all of it was resident; allow a quarter of the
    // pool for blocks the allocator never handed out.
    assert!(
        before.saturating_sub(released) >= weights + pool * 3 / 4,
        "RSS fell by {} bytes only",
        before.saturating_sub(released)
    );
    let info = get(addr, "/server_info").json();
    assert_eq!(
        info["internal_states"][0]["memory_released"],
        json!(["weights", "kv_cache"])
    );

    // A request arriving now waits for the resume.
    let held = std::thread::spawn(move || greedy(addr, 0));
    std::thread::sleep(Duration::from_millis(400));
    assert!(
        !held.is_finished(),
        "a request ran while memory was released"
    );
    bad_inputs_while_released(addr);

    let r = post(
        addr,
        "/resume_memory_occupation",
        &json!({"tags": ["weights"]}),
    );
    assert_eq!((r.status, r.body.as_str()), (200, "null"), "{}", r.body);
    let weights_back = rss();
    eprintln!(
        "RSS: {:.1} MB after resuming the weights (+{:.1} MB)",
        weights_back as f64 / MB,
        weights_back.saturating_sub(released) as f64 / MB
    );
    assert!(
        weights_back.saturating_sub(released) >= weights * 9 / 10,
        "the weights were read again"
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !held.is_finished(),
        "a request ran with the KV pool released"
    );
    // Resuming what is not released is a 400 (SGLang raises KeyError).
    let r = post(
        addr,
        "/resume_memory_occupation",
        &json!({"tags": ["weights"]}),
    );
    assert_eq!(r.status, 400, "{}", r.body);

    let r = post(addr, "/resume_memory_occupation", &json!({}));
    assert_eq!((r.status, r.body.as_str()), (200, "null"), "{}", r.body);
    assert_eq!(held.join().expect("held request"), want[0]);
    let got: Vec<Vec<u64>> = (0..4).map(|i| greedy(addr, i)).collect();
    assert_eq!(got, want, "the same greedy output after release and resume");
    eprintln!("RSS: {:.1} MB serving again", rss() as f64 / MB);
    let r = post(addr, "/resume_memory_occupation", &json!({}));
    assert_eq!(r.status, 400, "nothing is released: {}", r.body);
}

/// Clear 400s, and the memory stays released.
fn bad_inputs_while_released(addr: SocketAddr) {
    // Released twice: a no-op, as SGLang's tag set.
    let r = post(
        addr,
        "/release_memory_occupation",
        &json!({"tags": ["kv_cache"]}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    for (path, body) in [
        ("/release_memory_occupation", r#"{"tags": ["bogus"]}"#),
        (
            "/resume_memory_occupation",
            r#"{"tags": ["kv_cache", "gpu"]}"#,
        ),
        ("/resume_memory_occupation", r#"{"tags": "weights"}"#),
        ("/resume_memory_occupation", "[1"),
    ] {
        let r = request(addr, "POST", path, &[], Some(body));
        assert_eq!(r.status, 400, "{path} {body}: {}", r.body);
        assert!(!error_message(&r).is_empty(), "{}", r.body);
    }
    let info = get(addr, "/server_info").json();
    assert_eq!(
        info["internal_states"][0]["memory_released"],
        json!(["weights", "kv_cache"])
    );
}
