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

/// A checkpoint of `config`'s family whose greedy output is `script` after
/// the prompt's last token: every layer's output projections are zero (the
/// residual stream stays the token's embedding), token `script[i]` embeds
/// as the unit vector `i` and the head maps unit vector `i` to
/// `script[i + 1]`, a bigram chain (so `script` must not repeat a token).
/// `config` needs `hidden_size` 32, the Qwen3 vocabulary and an untied head.
fn scripted(dir: &std::path::Path, config: Value, script: &[u32]) {
    use candle_core::{DType, Device, Tensor};
    let hidden = 32usize;
    assert!(script.len() <= hidden, "script longer than the hidden size");
    let mut seen = std::collections::HashSet::new();
    assert!(script.iter().all(|t| seen.insert(*t)), "{script:?} repeats");
    let card = json!({"tokenizer": repo().join("models/qwen3"), "config": config});
    let card_path = dir.join("card.json");
    std::fs::write(&card_path, card.to_string()).unwrap();
    let card = agentd_models::synth::ModelCard::from_file(&card_path).unwrap();
    agentd_models::synth::write_random_model(&card.config, dir, 7, card.tokenizer_dir.as_deref())
        .unwrap();
    let file = dir.join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&file, &Device::Cpu).unwrap();
    let vocab = 151936usize;
    let (mut embed, mut head) = (vec![0f32; vocab * hidden], vec![0f32; vocab * hidden]);
    for (i, pair) in script.windows(2).enumerate() {
        embed[pair[0] as usize * hidden + i] = 1.0;
        head[pair[1] as usize * hidden + i] = 10.0;
    }
    for (name, t) in tensors.iter_mut() {
        if name.contains("o_proj") || name.contains("down_proj") {
            *t = t.zeros_like().unwrap();
        } else if name == "model.norm.weight" {
            *t = t.ones_like().unwrap();
        } else if name == "model.embed_tokens.weight" {
            *t = Tensor::from_vec(embed.clone(), (vocab, hidden), &Device::Cpu).unwrap();
        } else if name == "lm_head.weight" {
            *t = Tensor::from_vec(head.clone(), (vocab, hidden), &Device::Cpu).unwrap();
        }
        assert_eq!(t.dtype(), DType::F32);
    }
    candle_core::safetensors::save(&tensors, &file).unwrap();
}

/// The fields every scripted config shares (Qwen3's vocabulary and tokens).
fn scripted_config(family: Value) -> Value {
    let mut c = json!({
        "vocab_size": 151936, "hidden_size": 32, "intermediate_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 16, "max_position_embeddings": 4096, "rope_theta": 10000,
        "rms_norm_eps": 1e-05, "tie_word_embeddings": false, "torch_dtype": "float32",
        "bos_token_id": 151643, "eos_token_id": 151645
    });
    c.as_object_mut()
        .unwrap()
        .extend(family.as_object().unwrap().clone());
    c
}

/// A GLM-4.5 MoE checkpoint whose greedy output is `script`.
fn scripted_glm45(dir: &std::path::Path, script: &[u32]) {
    let config = scripted_config(json!({
        "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
        "moe_intermediate_size": 16, "n_routed_experts": 4, "n_shared_experts": 1,
        "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
        "routed_scaling_factor": 1.0, "norm_topk_prob": true, "first_k_dense_replace": 1,
        "use_qk_norm": false, "partial_rotary_factor": 0.5, "attention_bias": true
    }));
    scripted(dir, config, script);
}

/// The script that writes `text` after the generation prompt (`\n`) and
/// then EOS.
fn script_of(dir: &std::path::Path, text: &str) -> Vec<u32> {
    std::fs::copy(
        repo().join("models/qwen3/tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    let tok = agentd_runtime::Tokenizer::from_dir(dir).unwrap();
    let mut script = vec![198]; // "\n": the generation prompt's last token
    script.extend(tok.encode(text, false).unwrap());
    script.push(151645); // <|im_end|>: EOS
    script
}

/// A chat request offering the tool `ping` to the model served at `addr`
/// comes back, whole and streamed, with reasoning "hm", no content and one
/// call of `ping` with arguments `{}`.
fn assert_ping_tool_call(addr: &str, model: &str) {
    let mut body = json!({
        "model": model,
        "messages": [{"role": "user", "content": "ping?"}],
        "tools": [{"type": "function", "function": {"name": "ping",
            "parameters": {"type": "object", "properties": {}}}}],
        "max_tokens": 20,
        "temperature": 0.0,
    });
    let (status, text) = http(addr, "POST", "/v1/chat/completions", Some(&body));
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["reasoning_content"], "hm", "{text}");
    assert_eq!(msg["content"], Value::Null, "{text}");
    assert_eq!(msg["tool_calls"][0]["function"]["name"], "ping", "{text}");
    assert_eq!(
        msg["tool_calls"][0]["function"]["arguments"], "{}",
        "{text}"
    );
    assert_eq!(
        msg["tool_calls"].as_array().map(Vec::len),
        Some(1),
        "{text}"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{text}");

    body["stream"] = json!(true);
    let (status, sse) = http(addr, "POST", "/v1/chat/completions", Some(&body));
    assert_eq!(status, 200, "{sse}");
    let (mut name, mut args, mut reasoning) = (String::new(), String::new(), String::new());
    for line in sse.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let Ok(chunk) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let delta = &chunk["choices"][0]["delta"];
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        assert!(delta["content"].as_str().unwrap_or("").is_empty(), "{sse}");
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            name.push_str(call["function"]["name"].as_str().unwrap_or(""));
            args.push_str(call["function"]["arguments"].as_str().unwrap_or(""));
        }
    }
    assert_eq!(
        (reasoning.as_str(), name.as_str(), args.as_str()),
        ("hm", "ping", "{}"),
        "{sse}"
    );
}

/// GLM-4.5's tool-call text, written by a GLM-4.5 MoE model over a real
/// socket, comes back as OpenAI `tool_calls` (the family's default `glm45`
/// parsers), whole and streamed.
#[test]
fn serve_glm45_tool_call_text_becomes_tool_calls() {
    let dir = tempfile::tempdir().unwrap();
    let script = script_of(dir.path(), "<think>hm</think><tool_call>ping</tool_call>");
    scripted_glm45(dir.path(), &script);
    let (_server, addr, _logs) = spawn_serve(
        "serve-families-glm45-tools",
        [dir.path().to_str().unwrap(), "--num-kv-blocks", "64"],
    );
    assert_ping_tool_call(&addr, dir.path().file_name().unwrap().to_str().unwrap());
}

/// Qwen3-MoE (Qwen3-30B-A3B's chat template writes Hermes tool calls; vLLM
/// serves it with `--tool-call-parser hermes --reasoning-parser qwen3`) and
/// GLM-4-0414 (vLLM has no parser for its native `name\n{json}` calls, see
/// `crates/chat/src/formats.rs`) default to `hermes` / `qwen3`: a scripted
/// model of each family writing a Hermes call over a real socket gets
/// `tool_calls`, whole and streamed, and the family's parsers are logged.
#[test]
fn serve_qwen3_moe_and_glm4_tool_calls_are_hermes() {
    let families = [
        (
            "qwen3moe",
            json!({
                "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                "moe_intermediate_size": 16, "num_experts": 4, "num_experts_per_tok": 2,
                "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
                "attention_bias": false
            }),
        ),
        (
            "glm4",
            json!({
                "architectures": ["Glm4ForCausalLM"], "model_type": "glm4",
                "partial_rotary_factor": 0.5, "attention_bias": true
            }),
        ),
    ];
    for (name, family) in families {
        let dir = tempfile::tempdir().unwrap();
        let script = script_of(
            dir.path(),
            r#"<think>hm</think><tool_call>{"name":"ping","arguments":{}}</tool_call>"#,
        );
        scripted(dir.path(), scripted_config(family), &script);
        let (_server, addr, logs) = spawn_serve(
            &format!("serve-families-{name}-tools"),
            [dir.path().to_str().unwrap(), "--num-kv-blocks", "64"],
        );
        let log: Vec<String> = logs.try_iter().collect();
        assert!(
            log.iter()
                .any(|l| l.contains("tool-call parser hermes, reasoning parser qwen3")),
            "{name}: family default not logged: {log:?}"
        );
        assert_ping_tool_call(&addr, dir.path().file_name().unwrap().to_str().unwrap());
    }
}

/// The GLM-4.5 MoE family gets vLLM's `glm45` parsers by default; an
/// unknown parser name stops `agentd serve` before it loads anything,
/// listing the valid names.
#[test]
fn serve_glm45_parsers_by_family_and_flag() {
    let fixture = repo().join("tests/fixtures/golden/glm4moe-gqa2");
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture.join(f), dir.path().join(f)).unwrap();
    }
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(repo().join("models/qwen3").join(f), dir.path().join(f)).unwrap();
    }
    let (_server, _addr, logs) = spawn_serve(
        "serve-families-glm45-parsers",
        [dir.path().to_str().unwrap(), "--num-kv-blocks", "64"],
    );
    let log: Vec<String> = logs.try_iter().collect();
    assert!(
        log.iter()
            .any(|l| l.contains("tool-call parser glm45, reasoning parser glm45")),
        "family default not logged: {log:?}"
    );

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["serve", "--tool-call-parser", "nope"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("nope") && err.contains("hermes") && err.contains("glm45"),
        "{err}"
    );
}

/// `strict: true` under `tool_choice: "auto"` (vLLM 0.32's structural tag):
/// the text stays free, but a call the model starts is the grammar's. A
/// scripted GLM-4.5 model writes `</think>ok<tool_call>` and then, off its
/// script, ties every logit at 0 (greedy takes the lowest allowed id): with
/// a strict tool the grammar turns that into a call valid against the
/// schema, in both formats (`hermes` and `glm45` parsers); without one the
/// call is the model's noise and no tool call comes back.
#[test]
fn serve_strict_tools_under_auto_enforce_the_calls_the_model_starts() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        repo().join("models/qwen3/tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    let tok = agentd_runtime::Tokenizer::from_dir(dir.path()).unwrap();
    let mut script = vec![198]; // "\n": the generation prompt's last token
    script.extend(tok.encode("</think>ok<tool_call>", false).unwrap());
    scripted_glm45(dir.path(), &script);
    let weather = json!({"type": "object",
        "properties": {"city": {"enum": ["Paris", "Oslo"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 3}},
        "required": ["city", "days"], "additionalProperties": false});
    let dir_arg = dir.path().to_str().unwrap();
    for parsers in [
        &[
            "--tool-call-parser",
            "hermes",
            "--reasoning-parser",
            "qwen3",
        ][..],
        &[][..],
    ] {
        let mut args = vec![dir_arg, "--num-kv-blocks", "64"];
        args.extend_from_slice(parsers);
        let (_server, addr, _logs) = spawn_serve("serve-families-strict-auto", args);
        for strict in [true, false] {
            let body = json!({
                "model": dir.path().file_name().unwrap().to_str().unwrap(),
                "messages": [{"role": "user", "content": "weather?"}],
                "tools": [{"type": "function", "function": {"name": "get_weather",
                    "strict": strict, "parameters": weather}}],
                "tool_choice": "auto",
                "max_tokens": 160,
                "temperature": 0.0,
            });
            let (status, text) = http(&addr, "POST", "/v1/chat/completions", Some(&body));
            assert_eq!(status, 200, "{parsers:?}: {text}");
            let v: Value = serde_json::from_str(&text).unwrap();
            let calls = v["choices"][0]["message"]["tool_calls"].as_array();
            if !strict {
                assert!(calls.is_none_or(Vec::is_empty), "{parsers:?}: {text}");
                continue;
            }
            let calls = calls.unwrap_or_else(|| panic!("{parsers:?}: no call: {text}"));
            assert_eq!(calls.len(), 1, "{parsers:?}: {text}");
            assert_eq!(calls[0]["function"]["name"], "get_weather", "{text}");
            let args: Value =
                serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
            assert!(
                ["Paris", "Oslo"].contains(&args["city"].as_str().unwrap_or("")),
                "{args}"
            );
            assert!(matches!(args["days"].as_i64(), Some(1..=3)), "{args}");
            assert_eq!(args.as_object().map(|o| o.len()), Some(2), "{args}");
        }
    }
}
