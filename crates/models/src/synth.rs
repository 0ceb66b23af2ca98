//! Deterministic random-weight checkpoints in Hugging Face layout, for tests
//! and benchmarks where no real weights can be downloaded (`agentd make-model`).
//!
//! A *model card* is a small JSON file: `{"tokenizer": "qwen3", "config": {...}}`
//! where `config` is a Qwen3 `config.json` and `tokenizer` (optional) names a
//! directory, relative to the card, holding `tokenizer.json` and
//! `tokenizer_config.json` to copy alongside the weights.
//!
//! Weights are normal(0, 0.02) (transformers' `initializer_range`), RMSNorm
//! weights 1 + normal(0, 0.02); each tensor draws from its own ChaCha8 stream
//! seeded by (seed, tensor index), so tensors can be generated in parallel and
//! the output depends only on the card and the seed.

use std::path::{Path, PathBuf};

use half::{bf16, f16};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use rayon::prelude::*;
use safetensors::tensor::{Dtype, TensorView};

use crate::config::{Qwen3Config, WeightDtype};
use crate::error::{ModelError, Result};

/// A parsed model card.
pub struct ModelCard {
    pub config: Qwen3Config,
    pub tokenizer_dir: Option<PathBuf>,
}

impl ModelCard {
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|source| ModelError::Json {
                path: path.to_path_buf(),
                source,
            })?;
        let config = value.get("config").ok_or_else(|| ModelError::Config {
            path: path.to_path_buf(),
            field: "config",
            reason: "a model card needs a `config` object".into(),
        })?;
        let config = Qwen3Config::from_value(config, path)?;
        let tokenizer_dir = value
            .get("tokenizer")
            .and_then(|t| t.as_str())
            .map(|rel| path.parent().unwrap_or(Path::new(".")).join(rel));
        Ok(ModelCard {
            config,
            tokenizer_dir,
        })
    }
}

/// Names and shapes of every tensor of a Qwen3 checkpoint, and whether each
/// is a norm weight (initialised around 1).
pub fn tensor_specs(cfg: &Qwen3Config) -> Vec<(String, Vec<usize>, bool)> {
    let (hid, inter, d) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let (h, kv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let mut v = vec![(
        "model.embed_tokens.weight".to_owned(),
        vec![cfg.vocab_size, hid],
        false,
    )];
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        let mut push = |n: &str, s: Vec<usize>, norm| v.push((format!("{p}.{n}"), s, norm));
        push("input_layernorm.weight", vec![hid], true);
        push("self_attn.q_proj.weight", vec![h * d, hid], false);
        push("self_attn.k_proj.weight", vec![kv * d, hid], false);
        push("self_attn.v_proj.weight", vec![kv * d, hid], false);
        if cfg.attention_bias {
            push("self_attn.q_proj.bias", vec![h * d], false);
            push("self_attn.k_proj.bias", vec![kv * d], false);
            push("self_attn.v_proj.bias", vec![kv * d], false);
        }
        push("self_attn.o_proj.weight", vec![hid, h * d], false);
        push("self_attn.q_norm.weight", vec![d], true);
        push("self_attn.k_norm.weight", vec![d], true);
        push("post_attention_layernorm.weight", vec![hid], true);
        push("mlp.gate_proj.weight", vec![inter, hid], false);
        push("mlp.up_proj.weight", vec![inter, hid], false);
        push("mlp.down_proj.weight", vec![hid, inter], false);
    }
    v.push(("model.norm.weight".to_owned(), vec![hid], true));
    if !cfg.tie_word_embeddings {
        v.push((
            "lm_head.weight".to_owned(),
            vec![cfg.vocab_size, hid],
            false,
        ));
    }
    v
}

fn random_bytes(n: usize, norm: bool, seed: u64, index: u64, dtype: WeightDtype) -> Vec<u8> {
    // Distinct, well-mixed stream per tensor.
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    rng.set_stream(index);
    let dist = Normal::new(0.0f32, 0.02).unwrap_or_else(|_| unreachable!("constant parameters"));
    let offset = if norm { 1.0 } else { 0.0 };
    let size = match dtype {
        WeightDtype::F32 => 4,
        WeightDtype::Bf16 | WeightDtype::F16 => 2,
    };
    let mut out = Vec::with_capacity(n * size);
    for _ in 0..n {
        let x = offset + dist.sample(&mut rng);
        match dtype {
            WeightDtype::F32 => out.extend_from_slice(&x.to_le_bytes()),
            WeightDtype::Bf16 => out.extend_from_slice(&bf16::from_f32(x).to_le_bytes()),
            WeightDtype::F16 => out.extend_from_slice(&f16::from_f32(x).to_le_bytes()),
        }
    }
    out
}

/// Writes `config.json`, `model.safetensors` and (with `tokenizer_dir`) the
/// tokenizer files into `out`.
pub fn write_random_model(
    cfg: &Qwen3Config,
    out: &Path,
    seed: u64,
    tokenizer_dir: Option<&Path>,
) -> Result<()> {
    std::fs::create_dir_all(out).map_err(|e| ModelError::io(out, e))?;
    let specs = tensor_specs(cfg);
    let params: usize = specs
        .iter()
        .map(|(_, s, _)| s.iter().product::<usize>())
        .sum();
    tracing::info!(
        params,
        dtype = cfg.torch_dtype.as_hf_str(),
        "generating random weights"
    );
    let data: Vec<Vec<u8>> = specs
        .par_iter()
        .enumerate()
        .map(|(i, (_, shape, norm))| {
            random_bytes(
                shape.iter().product(),
                *norm,
                seed,
                i as u64,
                cfg.torch_dtype,
            )
        })
        .collect();
    let dtype = match cfg.torch_dtype {
        WeightDtype::F32 => Dtype::F32,
        WeightDtype::Bf16 => Dtype::BF16,
        WeightDtype::F16 => Dtype::F16,
    };
    let mut views = Vec::with_capacity(specs.len());
    for ((name, shape, _), bytes) in specs.iter().zip(&data) {
        let view =
            TensorView::new(dtype, shape.clone(), bytes).map_err(|e| ModelError::Weights {
                path: out.to_path_buf(),
                reason: format!("{name}: {e}"),
            })?;
        views.push((name.clone(), view));
    }
    let weights = out.join("model.safetensors");
    let meta = std::collections::HashMap::from([("format".to_owned(), "pt".to_owned())]);
    safetensors::serialize_to_file(views, Some(meta), &weights).map_err(|e| {
        ModelError::Weights {
            path: weights.clone(),
            reason: e.to_string(),
        }
    })?;
    let config_path = out.join("config.json");
    let json =
        serde_json::to_string_pretty(&cfg.to_hf_json()).map_err(|source| ModelError::Json {
            path: config_path.clone(),
            source,
        })?;
    std::fs::write(&config_path, json + "\n").map_err(|e| ModelError::io(&config_path, e))?;
    if let Some(dir) = tokenizer_dir {
        for f in ["tokenizer.json", "tokenizer_config.json"] {
            let src = dir.join(f);
            std::fs::copy(&src, out.join(f)).map_err(|e| ModelError::io(&src, e))?;
        }
    }
    Ok(())
}
