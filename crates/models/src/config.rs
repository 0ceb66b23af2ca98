//! Qwen3 `config.json`, parsed field by field so that a bad or incomplete config
//! names the field at fault instead of failing with a generic serde message.
//!
//! Both spellings that transformers has written over time are accepted:
//! `torch_dtype` / `dtype`, and `rope_theta` + `rope_scaling` at top level /
//! `rope_parameters` (transformers 5).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{ModelError, Result};

/// Architectures this crate can run.
pub const SUPPORTED_ARCHITECTURES: &str = "Qwen3ForCausalLM";

/// RoPE frequency scaling from `rope_scaling` / `rope_parameters`.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE (`rope_type` absent or `"default"`).
    None,
    /// Position interpolation: frequencies divided by `factor`.
    Linear { factor: f64 },
}

/// Weight dtype declared by the checkpoint. The CPU runtime computes in f32
/// whatever the checkpoint stores (bf16 matmuls are slower than f32 on these
/// CPUs, see ENVIRONMENT.md); this records what the files hold.
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

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "float32" | "f32" => Some(WeightDtype::F32),
            "bfloat16" | "bf16" => Some(WeightDtype::Bf16),
            "float16" | "f16" | "half" => Some(WeightDtype::F16),
            _ => None,
        }
    }
}

/// The fields of a Qwen3 `config.json` this runtime uses.
#[derive(Debug, Clone)]
pub struct Qwen3Config {
    pub architecture: String,
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
}

impl Qwen3Config {
    /// Reads `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        if !path.is_file() {
            return Err(ModelError::MissingFile {
                path,
                what: "a Hugging Face model directory needs config.json",
            });
        }
        Self::from_file(&path)
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
        let architecture = f.architecture()?;
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
        let rope = f.obj.get("rope_parameters").and_then(Value::as_object);
        let rope_theta = match f.opt_f64("rope_theta")? {
            Some(t) => t,
            None => rope
                .and_then(|r| r.get("rope_theta"))
                .and_then(Value::as_f64)
                .unwrap_or(10_000.0),
        };
        let scaling_obj = match f.obj.get("rope_scaling") {
            Some(Value::Object(o)) => Some(o),
            _ => rope,
        };
        let rope_scaling = f.rope_scaling(scaling_obj)?;
        let dtype_str = f
            .opt_str("torch_dtype")?
            .or(f.opt_str("dtype")?)
            .unwrap_or("float32");
        let torch_dtype = WeightDtype::parse(dtype_str).ok_or_else(|| ModelError::Config {
            path: f.path.clone(),
            field: "torch_dtype",
            reason: format!("unsupported dtype {dtype_str:?} (float32, bfloat16, float16)"),
        })?;
        let cfg = Qwen3Config {
            architecture,
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
            attention_bias: f.opt_bool("attention_bias")?.unwrap_or(false),
            max_position_embeddings: f.usize("max_position_embeddings")?,
            torch_dtype,
            bos_token_id: f.opt_token("bos_token_id")?,
            eos_token_ids: f.token_list("eos_token_id")?,
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
        serde_json::json!({
            "architectures": [self.architecture],
            "model_type": "qwen3",
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
            "max_window_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_scaling": rope_scaling,
            "rope_theta": self.rope_theta,
            "sliding_window": null,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": self.torch_dtype.as_hf_str(),
            "use_cache": true,
            "use_sliding_window": false,
            "vocab_size": self.vocab_size,
        })
    }
}

/// Typed access to the fields of one JSON object, with errors naming the field.
struct Fields<'a> {
    path: PathBuf,
    obj: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn err(&self, field: &'static str, reason: impl Into<String>) -> ModelError {
        ModelError::Config {
            path: self.path.clone(),
            field,
            reason: reason.into(),
        }
    }

    fn present(&self, field: &'static str) -> Option<&Value> {
        self.obj.get(field).filter(|v| !v.is_null())
    }

    fn architecture(&self) -> Result<String> {
        let archs: Vec<String> = match self.present("architectures") {
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            Some(_) => return Err(self.err("architectures", "expected a list of strings")),
            None => Vec::new(),
        };
        let model_type = self.opt_str("model_type")?;
        if archs.iter().any(|a| a == SUPPORTED_ARCHITECTURES)
            || (archs.is_empty() && model_type == Some("qwen3"))
        {
            return Ok(SUPPORTED_ARCHITECTURES.to_owned());
        }
        let found = if archs.is_empty() {
            vec![model_type.unwrap_or("(none)").to_owned()]
        } else {
            archs
        };
        Err(ModelError::UnsupportedArchitecture {
            path: self.path.clone(),
            found,
            supported: SUPPORTED_ARCHITECTURES,
        })
    }

    fn usize(&self, field: &'static str) -> Result<usize> {
        self.opt_usize(field)?
            .ok_or_else(|| self.err(field, "missing (required)"))
    }

    fn opt_usize(&self, field: &'static str) -> Result<Option<usize>> {
        match self.present(field) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    self.err(field, format!("expected a non-negative integer, got {v}"))
                }),
        }
    }

    fn opt_f64(&self, field: &'static str) -> Result<Option<f64>> {
        match self.present(field) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a number, got {v}"))),
        }
    }

    fn opt_bool(&self, field: &'static str) -> Result<Option<bool>> {
        match self.present(field) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a boolean, got {v}"))),
        }
    }

    fn opt_str(&self, field: &'static str) -> Result<Option<&str>> {
        match self.present(field) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a string, got {v}"))),
        }
    }

    fn opt_token(&self, field: &'static str) -> Result<Option<u32>> {
        match self.opt_usize(field)? {
            None => Ok(None),
            Some(n) => u32::try_from(n)
                .map(Some)
                .map_err(|_| self.err(field, "token id out of range")),
        }
    }

    /// `eos_token_id` may be one id or a list of ids.
    fn token_list(&self, field: &'static str) -> Result<Vec<u32>> {
        match self.present(field) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| self.err(field, format!("expected token ids, got {v}")))
                })
                .collect(),
            Some(_) => Ok(self.opt_token(field)?.into_iter().collect()),
        }
    }

    fn rope_scaling(&self, obj: Option<&Map<String, Value>>) -> Result<RopeScaling> {
        let Some(obj) = obj else {
            return Ok(RopeScaling::None);
        };
        let kind = obj
            .get("rope_type")
            .or_else(|| obj.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        match kind {
            "default" => Ok(RopeScaling::None),
            "linear" => {
                let factor = obj
                    .get("factor")
                    .and_then(Value::as_f64)
                    .filter(|f| *f > 0.0)
                    .ok_or_else(|| self.err("rope_scaling", "linear scaling needs factor > 0"))?;
                Ok(RopeScaling::Linear { factor })
            }
            other => Err(self.err(
                "rope_scaling",
                format!("rope_type {other:?} is not supported (default, linear)"),
            )),
        }
    }
}
