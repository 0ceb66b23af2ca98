//! `generation_config.json`: the sampling defaults a model ships (Qwen3:
//! temperature 0.6, top_p 0.95, top_k 20) and its end-of-generation ids,
//! read as vLLM's `--generation-config auto` reads them.

use std::path::Path;

use serde_json::Value;

/// The fields vLLM takes from `generation_config.json` (its
/// `get_diff_sampling_param`); absent fields stay `None`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    /// `eos_token_id`, an int or a list (Qwen3: `[151645, 151643]`).
    pub eos_token_ids: Vec<u32>,
}

impl GenerationConfig {
    /// `dir/generation_config.json`; `None` when the model ships none or it
    /// cannot be read (a warning says why: like vLLM, a broken generation
    /// config does not stop the model).
    pub fn from_dir(dir: &Path) -> Option<Self> {
        let path = dir.join("generation_config.json");
        let text = std::fs::read_to_string(&path).ok()?;
        match serde_json::from_str::<Value>(&text) {
            Ok(v) => Some(Self::from_value(&v)),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "generation_config.json ignored");
                None
            }
        }
    }

    pub fn from_value(v: &Value) -> Self {
        let f = |k: &str| v.get(k).and_then(Value::as_f64).map(|x| x as f32);
        let eos_token_ids = match v.get("eos_token_id") {
            Some(Value::Array(a)) => a.iter().filter_map(token).collect(),
            Some(one) => token(one).into_iter().collect(),
            None => Vec::new(),
        };
        GenerationConfig {
            temperature: f("temperature"),
            top_p: f("top_p"),
            top_k: v.get("top_k").and_then(Value::as_i64),
            min_p: f("min_p"),
            repetition_penalty: f("repetition_penalty"),
            eos_token_ids,
        }
    }

    /// Whether it sets any sampling default.
    pub fn has_sampling(&self) -> bool {
        self.temperature.is_some()
            || self.top_p.is_some()
            || self.top_k.is_some()
            || self.min_p.is_some()
            || self.repetition_penalty.is_some()
    }
}

fn token(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|n| u32::try_from(n).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen3_generation_config() {
        let v = serde_json::json!({
            "bos_token_id": 151643, "do_sample": true,
            "eos_token_id": [151645, 151643], "pad_token_id": 151643,
            "temperature": 0.6, "top_k": 20, "top_p": 0.95,
            "transformers_version": "4.51.0"
        });
        let g = GenerationConfig::from_value(&v);
        assert_eq!(g.temperature, Some(0.6));
        assert_eq!(g.top_k, Some(20));
        assert_eq!(g.top_p, Some(0.95));
        assert_eq!((g.min_p, g.repetition_penalty), (None, None));
        assert_eq!(g.eos_token_ids, [151645, 151643]);
        assert!(g.has_sampling());
        let one = GenerationConfig::from_value(&serde_json::json!({"eos_token_id": 2}));
        assert_eq!(one.eos_token_ids, [2]);
        assert!(!one.has_sampling());
    }
}
