//! `agentd serve DIR` on GLM-4, Qwen3-MoE and GLM-4.5 MoE checkpoints (the
//! golden fixtures, with the Qwen3 tokenizer files beside them) over a real
//! socket: `/v1/completions` with the prompt as token ids returns
//! transformers' greedy tokens and log-probabilities.

mod common;

use std::path::PathBuf;

use common::{http, spawn_serve};
use serde_json::{json, Value};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn serve_new_families_greedy_matches_transformers() {
    for name in ["glm4-gqa2", "qwen3moe-gqa1-tied", "glm4moe-gqa2"] {
        let fixture = repo().join("tests/fixtures/golden").join(name);
        let dir = tempfile::tempdir().unwrap();
        for f in ["config.json", "model.safetensors"] {
            std::fs::copy(fixture.join(f), dir.path().join(f)).unwrap();
        }
        for f in ["tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(repo().join("models/qwen3").join(f), dir.path().join(f)).unwrap();
        }
        let golden: Value =
            serde_json::from_str(&std::fs::read_to_string(fixture.join("golden.json")).unwrap())
                .unwrap();
        // The 17-token prompt: decode crosses the 16-token block boundary.
        let case = &golden["cases"][3];
        let (_server, addr, _logs) = spawn_serve(
            &format!("serve-families-{name}"),
            [
                dir.path().to_str().unwrap(),
                "--num-kv-blocks",
                "64",
                "--block-size",
                "16",
            ],
        );
        let body = json!({
            "model": dir.path().file_name().unwrap().to_str().unwrap(),
            "prompt": case["input_ids"],
            "max_tokens": 8,
            "temperature": 0.0,
            "ignore_eos": true,
            "logprobs": 1,
            "return_token_ids": true,
        });
        let (status, text) = http(&addr, "POST", "/v1/completions", Some(&body));
        assert_eq!(status, 200, "{name}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        let choice = &v["choices"][0];
        let steps = case["greedy"].as_array().unwrap();
        let want: Vec<u64> = steps.iter().map(|s| s["token"].as_u64().unwrap()).collect();
        let got: Vec<u64> = choice["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect();
        assert_eq!(got, want, "{name}: greedy tokens over HTTP");
        let lps = choice["logprobs"]["token_logprobs"].as_array().unwrap();
        for (lp, s) in lps.iter().zip(steps) {
            let (a, b) = (lp.as_f64().unwrap(), s["logprob"].as_f64().unwrap());
            assert!((a - b).abs() < 1e-3, "{name}: logprob {a} vs {b}");
        }
    }
}
