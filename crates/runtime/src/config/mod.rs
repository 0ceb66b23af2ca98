//! A model's `config.json` (every family: [`Family`]), parsed field by field so
//! that a bad or incomplete config names the field at fault instead of failing
//! with a generic serde message.
//!
//! Both spellings that transformers has written over time are accepted:
//! `torch_dtype` / `dtype`, and `rope_theta` + `rope_scaling` at top level /
//! `rope_parameters` (transformers 5).

use std::path::Path;

use serde_json::Value;

use crate::error::{ModelError, Result};

mod family;
mod fields;
mod generation;
mod moe;

pub use family::Family;
use fields::Fields;
pub use generation::GenerationConfig;
pub use moe::{DenseLayers, MoeConfig, RouterKind};

/// RoPE frequency scaling from `rope_scaling` / `rope_parameters`.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE (`rope_type` absent or `"default"`).
    None,
    /// Position interpolation: frequencies divided by `factor`.
    Linear { factor: f64 },
}

/// A weight dtype: the one a checkpoint declares (`torch_dtype`), or the one
/// matrices are cast to at load (`agentd_models::loader::LoadDtype`). The CPU
/// runtime keeps 16-bit matrices as they are and widens them exactly inside
/// the products, which accumulate in f32 (the `matmul` module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDtype {
    F32,
    Bf16,
    F16,
}

impl WeightDtype {
    pub fn as_hf_str(self) -> &'static str {
        match self {
            WeightDtype::F32 => "float32",
            WeightDtype::Bf16 => "bfloat16",
            WeightDtype::F16 => "float16",
        }
    }

    /// The candle dtype of this weight dtype.
    #[cfg(feature = "candle")]
    pub fn to_candle(self) -> candle_core::DType {
        match self {
            WeightDtype::F32 => candle_core::DType::F32,
            WeightDtype::Bf16 => candle_core::DType::BF16,
            WeightDtype::F16 => candle_core::DType::F16,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            WeightDtype::F32 => 4,
            WeightDtype::Bf16 | WeightDtype::F16 => 2,
        }
    }

    /// The names transformers and vLLM use (`float32`/`float`,
    /// `bfloat16`, `float16`/`half`) and the short ones.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "float32" | "float" | "f32" => Some(WeightDtype::F32),
            "bfloat16" | "bf16" => Some(WeightDtype::Bf16),
            "float16" | "f16" | "half" => Some(WeightDtype::F16),
            _ => None,
        }
    }
}

/// The fields of a `config.json` this runtime uses, for every family.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    pub max_position_embeddings: usize,
    pub torch_dtype: WeightDtype,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// Leading dims of each head that RoPE rotates (`partial_rotary_factor`
    /// × `head_dim`; GLM rotates half).
    pub rotary_dim: usize,
    /// RMSNorm on each query and key head before RoPE (Qwen3; GLM-4.5's
    /// `use_qk_norm`).
    pub qk_norm: bool,
    /// The experts of the MoE families.
    pub moe: Option<MoeConfig>,
}

/// The name the config had while only Qwen3 ran; kept so code written
/// against it still builds.
pub type Qwen3Config = ModelConfig;

impl ModelConfig {
    /// Reads `dir/config.json`; the end-of-generation ids of
    /// `dir/generation_config.json` join its own, as in vLLM (Qwen3 ends on
    /// `<|im_end|>` by config.json and also on `<|endoftext|>` by its
    /// generation config).
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        if !path.is_file() {
            return Err(ModelError::MissingFile {
                path,
                what: "a Hugging Face model directory needs config.json",
            });
        }
        let mut cfg = Self::from_file(&path)?;
        if let Some(g) = GenerationConfig::from_dir(dir) {
            for id in g.eos_token_ids {
                if !cfg.eos_token_ids.contains(&id) {
                    cfg.eos_token_ids.push(id);
                }
            }
        }
        Ok(cfg)
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        let value: Value = serde_json::from_str(&text).map_err(|source| ModelError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_value(&value, path)
    }

    /// Parses an already-read JSON value; `path` only labels errors.
    pub fn from_value(value: &Value, path: &Path) -> Result<Self> {
        let f = Fields {
            path: path.to_path_buf(),
            obj: value.as_object().ok_or_else(|| ModelError::Config {
                path: path.to_path_buf(),
                field: "(root)",
                reason: "expected a JSON object".into(),
            })?,
        };
        let family = f.family()?;
        let hidden_size = f.usize("hidden_size")?;
        let num_attention_heads = f.usize("num_attention_heads")?;
        // Qwen3 states head_dim; older configs derive it from the hidden size.
        let head_dim = match f.opt_usize("head_dim")? {
            Some(d) => d,
            None => hidden_size / num_attention_heads.max(1),
        };
        let num_key_value_heads = f
            .opt_usize("num_key_value_heads")?
            .unwrap_or(num_attention_heads);
        let (rope_theta, rope_scaling) = f.rope()?;
        let torch_dtype = f.dtype()?;
        let rotary_dim = f.rotary_dim(family, head_dim)?;
        let qk_norm = match family {
            Family::Qwen3 | Family::Qwen3Moe => true,
            Family::Glm4 => false,
            Family::Glm4Moe => f.opt_bool("use_qk_norm")?.unwrap_or(false),
        };
        let default_bias = family == Family::Glm4;
        let cfg = ModelConfig {
            family,
            vocab_size: f.usize("vocab_size")?,
            hidden_size,
            intermediate_size: f.usize("intermediate_size")?,
            num_hidden_layers: f.usize("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rope_theta,
            rope_scaling,
            rms_norm_eps: f.opt_f64("rms_norm_eps")?.unwrap_or(1e-6),
            tie_word_embeddings: f.opt_bool("tie_word_embeddings")?.unwrap_or(false),
            attention_bias: f.opt_bool("attention_bias")?.unwrap_or(default_bias),
            max_position_embeddings: f.usize("max_position_embeddings")?,
            torch_dtype,
            bos_token_id: f.opt_token("bos_token_id")?,
            eos_token_ids: f.token_list("eos_token_id")?,
            rotary_dim,
            qk_norm,
            moe: MoeConfig::parse(&f, family)?,
        };
        cfg.check(path)?;
        Ok(cfg)
    }

    fn check(&self, path: &Path) -> Result<()> {
        let err = |field: &'static str, reason: String| ModelError::Config {
            path: path.to_path_buf(),
            field,
            reason,
        };
        for (field, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if v == 0 {
                return Err(err(field, "must be positive".into()));
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(err(
                "num_key_value_heads",
                format!(
                    "{} does not divide num_attention_heads {}",
                    self.num_key_value_heads, self.num_attention_heads
                ),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(err("head_dim", "must be even for RoPE".into()));
        }
        if self.rotary_dim < 2 || !self.rotary_dim.is_multiple_of(2) {
            return Err(err(
                "partial_rotary_factor",
                format!(
                    "rotates {} dims of each head, needs an even number >= 2",
                    self.rotary_dim
                ),
            ));
        }
        if self.rope_theta.is_nan() || self.rope_theta <= 0.0 {
            return Err(err("rope_theta", "must be positive".into()));
        }
        Ok(())
    }

    /// Query heads per KV head (the GQA ratio).
    pub fn gqa_ratio(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// Writes the config as Hugging Face writes it (used by `make-model`).
    pub fn to_hf_json(&self) -> Value {
        let rope_scaling = match &self.rope_scaling {
            RopeScaling::None => Value::Null,
            RopeScaling::Linear { factor } => {
                serde_json::json!({"rope_type": "linear", "factor": factor})
            }
        };
        let eos = match self.eos_token_ids.as_slice() {
            [] => Value::Null,
            [one] => Value::from(*one),
            many => Value::from(many.to_vec()),
        };
        let mut v = serde_json::json!({
            "architectures": [self.family.architecture()],
            "model_type": self.family.model_type(),
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initializer_range": 0.02,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "partial_rotary_factor": self.rotary_dim as f64 / self.head_dim as f64,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_scaling": rope_scaling,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": self.torch_dtype.as_hf_str(),
            "use_cache": true,
            "vocab_size": self.vocab_size,
        });
        if let Some(obj) = v.as_object_mut() {
            if matches!(self.family, Family::Qwen3 | Family::Qwen3Moe) {
                // Required by candle-transformers' stock Qwen3 configs
                // (`bench-model`'s baseline); transformers' defaults.
                obj.insert("max_window_layers".into(), self.num_hidden_layers.into());
                obj.insert("sliding_window".into(), Value::Null);
                obj.insert("use_sliding_window".into(), false.into());
            }
            if self.family == Family::Glm4Moe {
                obj.insert("use_qk_norm".into(), self.qk_norm.into());
            }
            if let Some(moe) = &self.moe {
                moe.write_hf(obj);
            }
        }
        v
    }
}
