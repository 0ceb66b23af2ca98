//! Deterministic random-weight checkpoints in Hugging Face layout, for tests
//! and benchmarks where no real weights can be downloaded (`agentd make-model`).
//!
//! A *model card* is a small JSON file: `{"tokenizer": "qwen3", "config": {...}}`
//! where `config` is a `config.json` of any supported family and `tokenizer` (optional) names a
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

use crate::config::{Family, ModelConfig, WeightDtype};
use crate::error::{ModelError, Result};

/// A parsed model card.
pub struct ModelCard {
    pub config: ModelConfig,
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
        let config = ModelConfig::from_value(config, path)?;
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

/// Names and shapes of a checkpoint's tensors, each marked as a norm weight
/// (initialised around 1) or not; each family lists its layers' tensors.
#[derive(Default)]
pub struct TensorSpecs(pub Vec<(String, Vec<usize>, bool)>);

impl TensorSpecs {
    pub fn weight(&mut self, name: &str, shape: Vec<usize>) {
        self.0.push((name.to_owned(), shape, false));
    }

    pub fn norm(&mut self, name: &str, dim: usize) {
        self.0.push((name.to_owned(), vec![dim], true));
    }

    /// `{p}.{q,k,v,o}_proj` (+ biases, + q/k norms as the config says).
    pub fn attention(&mut self, cfg: &ModelConfig, p: &str) {
        let (hid, d) = (cfg.hidden_size, cfg.head_dim);
        let (h, kv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        for (n, rows) in [("q", h * d), ("k", kv * d), ("v", kv * d)] {
            self.weight(&format!("{p}.{n}_proj.weight"), vec![rows, hid]);
            if cfg.attention_bias {
                self.weight(&format!("{p}.{n}_proj.bias"), vec![rows]);
            }
        }
        self.weight(&format!("{p}.o_proj.weight"), vec![hid, h * d]);
        if cfg.qk_norm {
            self.norm(&format!("{p}.q_norm.weight"), d);
            self.norm(&format!("{p}.k_norm.weight"), d);
        }
    }

    /// `{p}.gate_proj`, `{p}.up_proj`, `{p}.down_proj`.
    pub fn mlp(&mut self, p: &str, hid: usize, inter: usize) {
        self.weight(&format!("{p}.gate_proj.weight"), vec![inter, hid]);
        self.weight(&format!("{p}.up_proj.weight"), vec![inter, hid]);
        self.weight(&format!("{p}.down_proj.weight"), vec![hid, inter]);
    }
}

/// Names and shapes of every tensor of a checkpoint of `cfg`'s family.
pub fn tensor_specs(cfg: &ModelConfig) -> Vec<(String, Vec<usize>, bool)> {
    let (hid, vocab) = (cfg.hidden_size, cfg.vocab_size);
    let mut s = TensorSpecs::default();
    s.weight("model.embed_tokens.weight", vec![vocab, hid]);
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        match cfg.family {
            Family::Qwen3 => crate::qwen3::layer_specs(cfg, &p, &mut s),
            Family::Glm4 => crate::glm4::layer_specs(cfg, &p, &mut s),
            Family::Qwen3Moe => crate::qwen3_moe::layer_specs(cfg, &p, i, &mut s),
            Family::Glm4Moe => crate::glm4_moe::layer_specs(cfg, &p, i, &mut s),
        }
    }
    s.norm("model.norm.weight", hid);
    if !cfg.tie_word_embeddings {
        s.weight("lm_head.weight", vec![vocab, hid]);
    }
    // Last, so that the other tensors' random streams (by index) are those
    // of the same card without MTP layers.
    if cfg.family == Family::Glm4Moe {
        let n = cfg.moe.as_ref().map_or(0, |m| m.num_nextn_predict_layers);
        for i in 0..n {
            crate::glm4_moe::mtp_layer_specs(cfg, cfg.num_hidden_layers + i, &mut s);
        }
    }
    s.0
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
    cfg: &ModelConfig,
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
