//! `agentd serve DIR` on broken model directories (issue 13, "Bad input"):
//! a missing shard, a tensor of the wrong shape, an unknown `model_type`.
//! Each exits non-zero with one error line naming the file, tensor or field,
//! and never answers on its port (the server binds only once the model is
//! loaded; a dtype the CPU cannot run is the same load error, tested in
//! `crates/models/tests/errors.rs`). And `--dtype float16` on an f16
//! checkpoint serves the f32 load's greedy tokens.

mod common;

use std::path::{Path, PathBuf};

use common::{http, serve_fails, spawn_serve};
use serde_json::{json, Value};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A servable copy of golden fixture `name` (Qwen3 tokenizer beside it).
fn model_dir(name: &str) -> tempfile::TempDir {
    let fixture = repo().join("tests/fixtures/golden").join(name);
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture.join(f), dir.path().join(f)).unwrap();
    }
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(repo().join("models/qwen3").join(f), dir.path().join(f)).unwrap();
    }
    dir
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let p = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&p, v.to_string()).unwrap();
}

/// The safetensors header of `file`: tensor name -> its entry.
fn header(file: &Path) -> serde_json::Map<String, Value> {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut h: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    h.remove("__metadata__");
    h
}

/// Serves `dir`, which must fail: returns its single `error:` line.
fn error_line(dir: &Path, case: &str) -> String {
    let (status, lines) = serve_fails(
        &format!("serve-bad-{case}"),
        [dir.to_str().unwrap(), "--num-kv-blocks", "16"],
    );
    assert!(!status.success(), "{case}: exit {status}");
    let errors: Vec<&String> = lines.iter().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "{case}: one error line: {lines:#?}");
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("panicked") || l.contains("listening on")),
        "{case}: {lines:#?}"
    );
    errors[0].clone()
}

#[test]
fn broken_model_dirs_fail_with_one_line_and_never_listen() {
    // Missing shard: an index naming two shards, the second absent.
    let d = model_dir("gqa2-untied");
    let names: Vec<String> = header(&d.path().join("model.safetensors"))
        .keys()
        .cloned()
        .collect();
    let (one, two) = (
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    );
    std::fs::rename(d.path().join("model.safetensors"), d.path().join(one)).unwrap();
    let map: serde_json::Map<String, Value> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.clone(), json!(if i == 0 { two } else { one })))
        .collect();
    std::fs::write(
        d.path().join("model.safetensors.index.json"),
        json!({"metadata": {}, "weight_map": map}).to_string(),
    )
    .unwrap();
    let line = error_line(d.path(), "shard");
    assert!(
        line.contains(&d.path().join(two).display().to_string()),
        "{line}"
    );

    // Wrong shape: the config's intermediate size disagrees with the file.
    let d = model_dir("gqa2-untied");
    edit_config(d.path(), |v| v["intermediate_size"] = json!(100));
    let line = error_line(d.path(), "shape");
    assert!(
        line.contains("model.layers.0.mlp.gate_proj.weight")
            && line.contains(&d.path().join("model.safetensors").display().to_string())
            && line.contains("[100, 64]"),
        "{line}"
    );

    // Unknown model_type.
    let d = model_dir("glm4moe-gqa2");
    edit_config(d.path(), |v| v["model_type"] = json!("llama"));
    let line = error_line(d.path(), "model-type");
    assert!(
        line.contains("model_type") && line.contains("llama") && line.contains("config.json"),
        "{line}"
    );
}

/// `--dtype float16` serves an f16 checkpoint kept in f16, with the greedy
/// tokens and log-probabilities of `--dtype float32` on the same file.
#[test]
fn serve_dtype_float16_keeps_f16_with_the_f32_tokens() {
    let d = tempfile::tempdir().unwrap();
    let model = d.path().join("tiny16");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["make-model", "--config"])
        .arg(repo().join("models/qwen3-tiny.json"))
        .arg("--out")
        .arg(&model)
        .args(["--dtype", "float16"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let complete = |dtype: &str| -> Value {
        let (_server, addr, _logs) = spawn_serve(
            &format!("serve-dtype-{dtype}"),
            [
                model.to_str().unwrap(),
                "--num-kv-blocks",
                "16",
                "--dtype",
                dtype,
            ],
        );
        let body = json!({
            "model": "tiny16",
            "prompt": "Hello, world!",
            "max_tokens": 6,
            "temperature": 0.0,
            "ignore_eos": true,
            "logprobs": 1,
            "return_token_ids": true,
        });
        let (status, text) = http(&addr, "POST", "/v1/completions", Some(&body));
        assert_eq!(status, 200, "--dtype {dtype}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        v["choices"][0].clone()
    };
    let (kept, wide) = (complete("float16"), complete("float32"));
    assert_eq!(kept["token_ids"].as_array().map(Vec::len), Some(6));
    assert_eq!(kept["token_ids"], wide["token_ids"]);
    let lps = |c: &Value| -> Vec<f64> {
        c["logprobs"]["token_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect()
    };
    for (a, b) in lps(&kept).iter().zip(lps(&wide)) {
        assert!((a - b).abs() < 1e-5, "logprob {a} vs {b}");
    }
}
