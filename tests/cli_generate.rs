//! The real `agentd` binary: `generate --json` on a golden fixture reproduces
//! transformers' greedy tokens; `make-model` + `generate --prompt` work end to
//! end with the Qwen3 tokenizer; a bad model directory fails cleanly.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn agentd(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run agentd")
}

fn json_of(out: &std::process::Output) -> Value {
    assert!(
        out.status.success(),
        "agentd failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object on stdout")
}

#[test]
fn generate_json_matches_transformers_greedy() {
    for name in [
        "gqa4-tied",
        "gqa2-untied",
        "glm4-gqa1-tied",
        "qwen3moe-gqa2",
        "glm4moe-gqa1-tied",
    ] {
        let dir = repo().join("tests/fixtures/golden").join(name);
        let golden: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap())
                .unwrap();
        // The 17-token prompt: decode crosses the 16-token block boundary.
        let case = &golden["cases"][3];
        let ids: Vec<String> = case["input_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.to_string())
            .collect();
        let out = agentd(&[
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            &ids.join(","),
            "--max-tokens",
            "8",
            "--ignore-eos",
            "--top-logprobs",
            "3",
            "--block-size",
            "16",
            "--json",
        ]);
        let v = json_of(&out);
        let want: Vec<u64> = case["greedy"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["token"].as_u64().unwrap())
            .collect();
        let got: Vec<u64> = v["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect();
        assert_eq!(got, want, "{name}");
        let lps = v["logprobs"].as_array().unwrap();
        assert_eq!(lps.len(), 8);
        for (lp, step) in lps.iter().zip(case["greedy"].as_array().unwrap()) {
            let a = lp["logprob"].as_f64().unwrap();
            let b = step["logprob"].as_f64().unwrap();
            assert!((a - b).abs() < 1e-4, "{name}: logprob {a} vs {b}");
            let top = lp["top"].as_array().unwrap();
            assert_eq!(top.len(), 3);
            // Greedy: the chosen token is the best alternative.
            assert_eq!(top[0][0], lp["token_id"]);
        }
        assert_eq!(v["finish_reason"], "length");
    }
}

#[test]
fn make_model_then_generate_text() {
    let d = tempfile::tempdir().unwrap();
    let model = d.path().join("tiny");
    let card = repo().join("models/qwen3-tiny.json");
    let out = agentd(&[
        "make-model",
        "--config",
        card.to_str().unwrap(),
        "--out",
        model.to_str().unwrap(),
        "--seed",
        "3",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gen = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--prompt",
            "Hello, world! 你好",
            "--max-tokens",
            "5",
            "--ignore-eos",
            "--json",
        ];
        args.extend_from_slice(extra);
        json_of(&agentd(&args))
    };
    let greedy = gen(&[]);
    assert_eq!(greedy["token_ids"].as_array().unwrap().len(), 5);
    assert!(greedy["text"].is_string());
    assert!(greedy["prompt_tokens"].as_u64().unwrap() > 3);
    // Seeded sampling is reproducible.
    let s1 = gen(&["--temperature", "1.0", "--seed", "11", "--top-p", "0.9"]);
    let s2 = gen(&["--temperature", "1.0", "--seed", "11", "--top-p", "0.9"]);
    assert_eq!(s1["token_ids"], s2["token_ids"]);
}

/// `--dtype` on `generate`: an f16 checkpoint kept in f16 (`auto`,
/// `float16`) gives the tokens and log-probabilities of the f32 load
/// (`float32`) of the same file; `bfloat16` casts it and still runs; an
/// unknown name is refused listing the valid ones.
#[test]
fn generate_dtype_keeps_f16_with_the_f32_results() {
    let d = tempfile::tempdir().unwrap();
    let model = d.path().join("tiny16");
    let card = repo().join("models/qwen3-tiny.json");
    let out = agentd(&[
        "make-model",
        "--config",
        card.to_str().unwrap(),
        "--out",
        model.to_str().unwrap(),
        "--dtype",
        "float16",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gen = |dtype: &str| {
        json_of(&agentd(&[
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--prompt",
            "Hello, world!",
            "--max-tokens",
            "6",
            "--ignore-eos",
            "--top-logprobs",
            "2",
            "--json",
            "--dtype",
            dtype,
        ]))
    };
    let wide = gen("float32");
    assert_eq!(wide["token_ids"].as_array().map(Vec::len), Some(6));
    for dtype in ["auto", "float16"] {
        let kept = gen(dtype);
        assert_eq!(kept["token_ids"], wide["token_ids"], "--dtype {dtype}");
        let lp = |v: &Value| -> Vec<f64> {
            v["logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["logprob"].as_f64().unwrap())
                .collect()
        };
        for (a, b) in lp(&kept).iter().zip(lp(&wide)) {
            assert!((a - b).abs() < 1e-5, "--dtype {dtype}: logprob {a} vs {b}");
        }
    }
    assert_eq!(
        gen("bfloat16")["token_ids"].as_array().map(Vec::len),
        Some(6)
    );
    fails_mentioning(
        &[
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--prompt",
            "hi",
            "--dtype",
            "int8",
        ],
        "float16",
    );
}

fn fails_mentioning(args: &[&str], needle: &str) {
    let out = agentd(args);
    assert!(!out.status.success(), "should fail: {args:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(needle), "stderr lacks {needle:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_inputs_fail_cleanly() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().to_str().unwrap();
    fails_mentioning(
        &["generate", "--model", p, "--prompt-ids", "1,2", "--json"],
        "config.json",
    );
    let fixture = repo().join("tests/fixtures/golden/gqa4-tied");
    let long: Vec<String> = (0..200).map(|i| (3 + i % 400).to_string()).collect();
    fails_mentioning(
        &[
            "generate",
            "--model",
            fixture.to_str().unwrap(),
            "--prompt-ids",
            &long.join(","),
        ],
        "max_position_embeddings",
    );
    // Text prompt without a tokenizer.
    fails_mentioning(
        &[
            "generate",
            "--model",
            fixture.to_str().unwrap(),
            "--prompt",
            "hi",
        ],
        "tokenizer.json",
    );
    let _ = Path::new(p);
}

/// `--generation-config` on `generate`, as on `serve`: the sampling flags
/// left unset take the model's generation_config.json (`auto`), a flag
/// given wins, and `vllm` (or a model that sets none) leaves greedy.
#[test]
fn generate_takes_the_generation_config_defaults() {
    let d = tempfile::tempdir().unwrap();
    let src = repo().join("tests/fixtures/golden/gqa4-tied");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), d.path().join(f)).unwrap();
    }
    std::fs::write(
        d.path().join("generation_config.json"),
        r#"{"temperature": 1.5, "top_k": 5, "eos_token_id": 2}"#,
    )
    .unwrap();
    let model = d.path().to_str().unwrap();
    let gen = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            model,
            "--prompt-ids",
            "5,9,17,33",
            "--max-tokens",
            "12",
            "--ignore-eos",
            "--seed",
            "11",
            "--json",
        ];
        args.extend_from_slice(extra);
        json_of(&agentd(&args))["token_ids"].clone()
    };
    let greedy = gen(&["--generation-config", "vllm"]);
    let from_model = gen(&[]);
    assert_ne!(
        from_model, greedy,
        "the model's temperature 1.5 / top_k 5 sample"
    );
    // The same sampling spelled as flags: the same tokens.
    let spelled = gen(&[
        "--generation-config",
        "vllm",
        "--temperature",
        "1.5",
        "--top-k",
        "5",
    ]);
    assert_eq!(from_model, spelled);
    // A flag given wins over the model's default.
    assert_eq!(gen(&["--temperature", "0"]), greedy);
    // A directory: its generation_config.json.
    assert_eq!(gen(&["--generation-config", model]), from_model);
}
