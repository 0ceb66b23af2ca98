//! Agent programs end to end over a real socket, on the golden fixtures
//! (tiny random Qwen3s whose greedy tokens transformers recorded):
//! `/v1/completions` with token-id prompts reproduces transformers' greedy
//! tokens; a deliberately tiny KV pool pauses and restores concurrent
//! programs without failing a request, changing a token or leaking a block;
//! a program's second turn reuses the KV of its first.
//!
//! The fixtures have a 512-token vocabulary and no tokenizer. The server
//! needs one (output text, `logprobs.tokens`), so each fixture is served from
//! a temp copy with a word-level tokenizer.json that names token `i` `t{i}`:
//! every id then has its own string, and `logprobs.tokens` gives the
//! generated ids exactly. (With the Qwen3 tokenizer, 129 of the ids below
//! 512 are lone non-UTF-8 bytes that all decode to U+FFFD, and most golden
//! continuations contain one, so neither the text nor the token strings
//! would pin the ids down; [`greedy_text_with_the_qwen3_tokenizer`] still
//! checks the text the server decodes with it.)

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use agentd_engine::EngineConfig;
use agentd_runtime::Tokenizer;
use common::{get, metric, post, start_dir};
use serde_json::{json, Value};

const NAME: &str = "golden";
const FIXTURES: [&str; 3] = ["gqa1-untied", "gqa2-untied", "gqa4-tied"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture(name: &str) -> PathBuf {
    root().join("tests/fixtures/golden").join(name)
}

/// (prompt, transformers' greedy continuation) of the fixture's cases.
fn golden(name: &str) -> Vec<(Vec<u32>, Vec<u32>)> {
    let text = std::fs::read_to_string(fixture(name).join("golden.json")).expect("fixture");
    let v: Value = serde_json::from_str(&text).expect("json");
    let ids = |x: &Value| -> Vec<u32> {
        x.as_array()
            .expect("array")
            .iter()
            .map(|t| t.as_u64().expect("id") as u32)
            .collect()
    };
    v["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            let greedy: Vec<u32> = c["greedy"]
                .as_array()
                .expect("greedy")
                .iter()
                .map(|g| g["token"].as_u64().expect("token") as u32)
                .collect();
            (ids(&c["input_ids"]), greedy)
        })
        .collect()
}

/// Which tokenizer a served copy of a fixture gets.
#[derive(Clone, Copy)]
enum Vocab {
    /// Word-level: token `i` is the string `t{i}`.
    Ids,
    /// The real Qwen3 tokenizer (`models/qwen3/`).
    Qwen3,
}

fn id_tokenizer_json(vocab_size: usize) -> String {
    let vocab: serde_json::Map<String, Value> = (0..vocab_size)
        .map(|i| (format!("t{i}"), json!(i)))
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"},
    })
    .to_string()
}

/// Writes `bytes` to `path` through a rename, so a concurrent test process
/// never reads a half-written file.
fn write_atomic(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// A servable copy of fixture `name` (weights and config) with a tokenizer,
/// in a directory of its own per `tag`.
fn servable(name: &str, vocab: Vocab, tag: &str) -> PathBuf {
    let src = fixture(name);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("e2e-{tag}-{name}"));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let read = |p: PathBuf| std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        write_atomic(&dir.join(f), &read(src.join(f)));
    }
    let tokenizer = match vocab {
        Vocab::Ids => {
            let cfg: Value =
                serde_json::from_slice(&read(src.join("config.json"))).expect("config json");
            let n = cfg["vocab_size"].as_u64().expect("vocab_size") as usize;
            id_tokenizer_json(n).into_bytes()
        }
        Vocab::Qwen3 => read(root().join("models/qwen3/tokenizer.json")),
    };
    write_atomic(&dir.join("tokenizer.json"), &tokenizer);
    dir
}

/// The engine configuration of the fixture servers: like the engine tests'.
fn config(num_blocks: usize) -> EngineConfig {
    EngineConfig {
        num_blocks,
        block_size: 16,
        max_num_batched_tokens: 64,
        ..EngineConfig::default()
    }
}

fn serve(name: &str, vocab: Vocab, tag: &str, num_blocks: usize) -> SocketAddr {
    start_dir(&servable(name, vocab, tag), NAME, None, config(num_blocks))
}

/// A greedy, `ignore_eos` completion of a token-id prompt.
fn body(prompt: &[u32], max_tokens: usize, program: Option<&str>) -> Value {
    let mut b = json!({"model": NAME, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": true, "logprobs": 0});
    if let Some(p) = program {
        b["program_id"] = json!(p);
    }
    b
}

/// Sends a completion to a server with the id tokenizer; returns the
/// generated token ids (from `logprobs.tokens`) and the response.
fn complete(addr: SocketAddr, body: &Value) -> (Vec<u32>, Value) {
    let r = post(addr, "/v1/completions", body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "length", "{v}");
    let ids: Vec<u32> = choice["logprobs"]["tokens"]
        .as_array()
        .unwrap_or_else(|| panic!("no logprobs.tokens: {v}"))
        .iter()
        .map(|t| {
            let s = t.as_str().expect("token string");
            s.strip_prefix('t')
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("not an id token: {s:?}"))
        })
        .collect();
    assert_eq!(v["usage"]["completion_tokens"], ids.len(), "{v}");
    // The text is the same tokens, detokenised.
    let text: Vec<String> = ids.iter().map(|i| format!("t{i}")).collect();
    assert_eq!(
        choice["text"].as_str().unwrap().trim_start(),
        text.join(" "),
        "{v}"
    );
    (ids, v)
}

fn cached_tokens(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens: {v}"))
}

fn program_ids(addr: SocketAddr) -> Vec<String> {
    let r = get(addr, "/programs");
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
        .as_array()
        .expect("program list")
        .iter()
        .map(|p| p["id"].as_str().expect("id").to_string())
        .collect()
}

/// Runs `bodies` concurrently, each on its own connection.
fn complete_all(addr: SocketAddr, bodies: Vec<Value>) -> Vec<(Vec<u32>, Value)> {
    let handles: Vec<_> = bodies
        .into_iter()
        .map(|b| std::thread::spawn(move || complete(addr, &b)))
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("request thread"))
        .collect()
}

#[test]
fn greedy_completions_match_transformers() {
    for name in FIXTURES {
        let addr = serve(name, Vocab::Ids, "greedy", 256);
        let cases = golden(name);
        let bodies = cases
            .iter()
            .enumerate()
            .map(|(i, (prompt, want))| body(prompt, want.len(), Some(&format!("g{i}"))))
            .collect();
        let got = complete_all(addr, bodies);
        for ((prompt, want), (ids, v)) in cases.iter().zip(got) {
            assert_eq!(
                &ids,
                want,
                "{name}: prompt of {} tokens: transformers' greedy tokens",
                prompt.len()
            );
            assert_eq!(v["usage"]["prompt_tokens"], prompt.len(), "{v}");
            assert_eq!(v["usage"]["total_tokens"], prompt.len() + want.len());
        }
    }
}

#[test]
fn greedy_text_with_the_qwen3_tokenizer() {
    let name = "gqa2-untied";
    let addr = serve(name, Vocab::Qwen3, "qwen3", 256);
    let tok = Tokenizer::from_dir(&root().join("models/qwen3")).expect("qwen3 tokenizer");
    for (prompt, want) in golden(name) {
        let r = post(addr, "/v1/completions", &body(&prompt, want.len(), None));
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(v["usage"]["completion_tokens"], want.len(), "{v}");
        // The server skips special tokens, as vLLM does by default.
        let expect = tok.decode(&want, true).expect("decode");
        assert_eq!(v["choices"][0]["text"], expect, "greedy {want:?}");
    }
}

#[test]
fn a_tiny_pool_pauses_and_restores_without_failures_or_leaks() {
    let name = "gqa2-untied";
    // Short prompts that are admitted together, then outgrow the pool while
    // decoding: 4 × (20 + 90) tokens need 28 blocks of 16; there are 14.
    let prompts: Vec<Vec<u32>> = (0..4u32)
        .map(|k| (0..20).map(|i| (i * 13 + k * 101) % 500).collect())
        .collect();
    const MAX: usize = 90;
    // Alone, on a roomy server.
    let roomy = serve(name, Vocab::Ids, "roomy", 256);
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| complete(roomy, &body(p, MAX, None)).0)
        .collect();

    let tight = serve(name, Vocab::Ids, "tight", 14);
    let bodies = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| body(p, MAX, Some(&format!("tight-{i}"))))
        .collect();
    let got = complete_all(tight, bodies);
    for (i, ((ids, v), w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(ids, w, "program {i}: same tokens as uncontended");
        assert_eq!(v["usage"]["completion_tokens"], MAX);
    }
    let m = get(tight, "/metrics").body;
    let pauses = metric(&m, "agentd:program_pauses_total");
    let restores = metric(&m, "agentd:program_restores_total");
    eprintln!(
        "pauses {pauses}, restores {restores}, recomputed {}",
        metric(&m, "agentd:recomputed_tokens_total")
    );
    assert!(pauses > 0.0, "memory pressure paused someone:\n{m}");
    assert!(restores > 0.0, "{m}");
    // Each pause was a park choice; without a host tier, a recompute.
    let park = |choice: &str| {
        let label = format!("choice=\"{choice}\"}}");
        m.lines()
            .filter(|l| l.starts_with("agentd:park_decisions_total{"))
            .find(|l| l.contains(&label))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("park {choice} missing:\n{m}"))
    };
    assert_eq!(park("recompute"), pauses, "{m}");
    assert_eq!((park("swap"), park("keep")), (0.0, 0.0), "{m}");
    assert!(
        metric(&m, "vllm:kv_cache_usage_perc") > 0.0,
        "programs keep their KV between turns"
    );
    // Hundreds of steps ran: the engine fitted its own step time.
    let decode_s = metric(&m, "agentd:fit_decode_step_seconds");
    assert!(decode_s > 0.0 && decode_s < 10.0, "{m}");
    let prefill = metric(&m, "agentd:fit_prefill_tokens_per_second");
    assert!(prefill.is_finite() && prefill >= 0.0, "{m}");

    let mut ids = program_ids(tight);
    ids.sort();
    assert_eq!(ids, ["tight-0", "tight-1", "tight-2", "tight-3"]);
    for id in ids {
        let r = post(tight, "/programs/release", &json!({"program_id": id}));
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.json()["released"], true);
    }
    let m = get(tight, "/metrics").body;
    assert_eq!(
        metric(&m, "vllm:kv_cache_usage_perc"),
        0.0,
        "no leaked blocks:\n{m}"
    );
    assert_eq!(metric(&m, "vllm:num_requests_running"), 0.0, "{m}");
    assert_eq!(metric(&m, "vllm:num_requests_waiting"), 0.0, "{m}");
    assert!(program_ids(tight).is_empty());
}

#[test]
fn a_programs_second_turn_reuses_its_first_turns_blocks() {
    let addr = serve("gqa2-untied", Vocab::Ids, "turns", 256);
    // 40 + 10 = 50 tokens: three full blocks of 16, and the last sampled
    // token (whose KV is never computed) is not a block's last.
    let prompt1: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 500).collect();
    let (out1, v1) = complete(addr, &body(&prompt1, 10, Some("two-turns")));
    assert_eq!(out1.len(), 10);
    assert_eq!(cached_tokens(&v1), 0, "{v1}");

    let mut prompt2 = prompt1.clone();
    prompt2.extend(&out1);
    prompt2.extend([11, 12, 13, 14, 15]);
    let (_, v2) = complete(addr, &body(&prompt2, 4, Some("two-turns")));
    assert_eq!(v2["usage"]["prompt_tokens"], prompt2.len(), "{v2}");
    let cached = cached_tokens(&v2) as usize;
    let full_blocks = (prompt1.len() + out1.len()) / 16 * 16;
    assert!(
        cached >= full_blocks,
        "cached {cached} < the first turn's {full_blocks} tokens in full blocks: {v2}"
    );
    // Everything the first turn computed, the partial last block included.
    assert_eq!(cached, prompt1.len() + out1.len() - 1, "{v2}");

    let r = post(
        addr,
        "/programs/release",
        &json!({"program_id": "two-turns"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let m = get(addr, "/metrics").body;
    assert_eq!(metric(&m, "vllm:kv_cache_usage_perc"), 0.0, "{m}");
    assert!(program_ids(addr).is_empty());
}

/// A rollout group (GRPO: four samples of one prompt, `group_id` +
/// `group_size`, each naming the tool it runs next) and the implicit group
/// of an `n = 4` request, on a pool too small for their decodes: every
/// request finishes with the tokens it gets alone, and no block leaks.
#[test]
fn rollout_groups_run_to_the_end_on_a_tiny_pool() {
    let name = "gqa2-untied";
    let prompt: Vec<u32> = (0..20).map(|i| (i * 17 + 3) % 500).collect();
    const MAX: usize = 90;
    let roomy = serve(name, Vocab::Ids, "group-roomy", 256);
    let want = complete(roomy, &body(&prompt, MAX, None)).0;

    let tight = serve(name, Vocab::Ids, "group-tight", 14);
    let bodies = (0..4)
        .map(|i| {
            let mut b = body(&prompt, MAX, Some(&format!("rollout-{i}")));
            b["group_id"] = json!("grpo-1");
            b["extra_body"] = json!({"group_size": 4, "tool_name": "pytest"});
            b
        })
        .collect();
    for (i, (ids, _)) in complete_all(tight, bodies).iter().enumerate() {
        assert_eq!(ids, &want, "member {i}: same tokens as alone");
    }
    // n = 4: one implicit group of the request's four choices.
    let mut b = body(&prompt, MAX, Some("sampler"));
    b["n"] = json!(4);
    let r = post(tight, "/v1/completions", &b);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(4), "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 4 * MAX, "{v}");

    for id in program_ids(tight) {
        let r = post(tight, "/programs/release", &json!({"program_id": id}));
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let m = get(tight, "/metrics").body;
    assert_eq!(metric(&m, "vllm:kv_cache_usage_perc"), 0.0, "leak:\n{m}");
    assert_eq!(metric(&m, "vllm:num_requests_waiting"), 0.0, "{m}");
}
