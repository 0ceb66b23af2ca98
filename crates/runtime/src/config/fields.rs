//! Typed access to a `config.json` object: every accessor names the field in
//! its error, so a bad config says what to fix.

use std::path::PathBuf;

use serde_json::{Map, Value};

use super::{Family, RopeScaling, WeightDtype};
use crate::error::{ModelError, Result};

/// Typed access to the fields of one JSON object, with errors naming the field.
pub(super) struct Fields<'a> {
    pub(super) path: PathBuf,
    pub(super) obj: &'a Map<String, Value>,
}

impl Fields<'_> {
    pub(super) fn err(&self, field: &'static str, reason: impl Into<String>) -> ModelError {
        ModelError::Config {
            path: self.path.clone(),
            field,
            reason: reason.into(),
        }
    }

    pub(super) fn present(&self, field: &'static str) -> Option<&Value> {
        self.obj.get(field).filter(|v| !v.is_null())
    }

    /// The family from `model_type` (else from `architectures`: older
    /// configs may lack `model_type`). When both are present they must agree,
    /// so a config edited to another architecture is not run as the old one.
    pub(super) fn family(&self) -> Result<Family> {
        let archs: Vec<&str> = match self.present("architectures") {
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
            Some(_) => return Err(self.err("architectures", "expected a list of strings")),
            None => Vec::new(),
        };
        let family = match self.opt_str("model_type")? {
            Some(mt) => Family::from_model_type(mt).ok_or_else(|| {
                self.err(
                    "model_type",
                    format!(
                        "unsupported model_type {mt:?} (supported: {})",
                        Family::supported()
                    ),
                )
            })?,
            None => archs
                .iter()
                .find_map(|a| Family::from_architecture(a))
                .ok_or_else(|| {
                    self.err(
                        "architectures",
                        format!(
                            "no model_type and unsupported architectures {archs:?} \
                             (supported: {})",
                            Family::supported()
                        ),
                    )
                })?,
        };
        if !archs.is_empty() && !archs.contains(&family.architecture()) {
            return Err(self.err(
                "architectures",
                format!(
                    "{archs:?} does not match model_type {family} (expects {})",
                    family.architecture()
                ),
            ));
        }
        Ok(family)
    }

    /// RoPE's base and scaling, stated at top level (transformers 4) or
    /// inside `rope_parameters` (transformers 5); the base defaults to
    /// 10,000 as in transformers.
    pub(super) fn rope(&self) -> Result<(f64, RopeScaling)> {
        let params = self.obj.get("rope_parameters").and_then(Value::as_object);
        let theta = match self.opt_f64("rope_theta")? {
            Some(t) => t,
            None => params
                .and_then(|r| r.get("rope_theta"))
                .and_then(Value::as_f64)
                .unwrap_or(10_000.0),
        };
        let scaling = match self.obj.get("rope_scaling") {
            Some(Value::Object(o)) => Some(o),
            _ => params,
        };
        Ok((theta, self.rope_scaling(scaling)?))
    }

    /// The checkpoint's dtype (`torch_dtype`, or transformers 5's `dtype`;
    /// float32 when neither is stated).
    pub(super) fn dtype(&self) -> Result<WeightDtype> {
        let name = self
            .opt_str("torch_dtype")?
            .or(self.opt_str("dtype")?)
            .unwrap_or("float32");
        WeightDtype::parse(name).ok_or_else(|| {
            self.err(
                "torch_dtype",
                format!("unsupported dtype {name:?} (float32, bfloat16, float16)"),
            )
        })
    }

    /// The leading dims of each head RoPE rotates: `partial_rotary_factor`
    /// × `head_dim` (GLM rotates half by default, the others the whole
    /// head), truncated as transformers does (`int(head_dim * factor)`).
    pub(super) fn rotary_dim(&self, family: Family, head_dim: usize) -> Result<usize> {
        let default_partial = match family {
            Family::Glm4 | Family::Glm4Moe => 0.5,
            Family::Qwen3 | Family::Qwen3Moe => 1.0,
        };
        let partial = self
            .opt_f64_or_rope("partial_rotary_factor")?
            .unwrap_or(default_partial);
        if !(partial > 0.0 && partial <= 1.0) {
            return Err(self.err("partial_rotary_factor", "must be in (0, 1]"));
        }
        Ok((head_dim as f64 * partial) as usize)
    }

    pub(super) fn usize(&self, field: &'static str) -> Result<usize> {
        self.opt_usize(field)?
            .ok_or_else(|| self.err(field, "missing (required)"))
    }

    pub(super) fn opt_usize(&self, field: &'static str) -> Result<Option<usize>> {
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

    pub(super) fn opt_f64(&self, field: &'static str) -> Result<Option<f64>> {
        match self.present(field) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a number, got {v}"))),
        }
    }

    pub(super) fn opt_bool(&self, field: &'static str) -> Result<Option<bool>> {
        match self.present(field) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a boolean, got {v}"))),
        }
    }

    pub(super) fn opt_str(&self, field: &'static str) -> Result<Option<&str>> {
        match self.present(field) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a string, got {v}"))),
        }
    }

    pub(super) fn opt_token(&self, field: &'static str) -> Result<Option<u32>> {
        match self.opt_usize(field)? {
            None => Ok(None),
            Some(n) => u32::try_from(n)
                .map(Some)
                .map_err(|_| self.err(field, "token id out of range")),
        }
    }

    /// `eos_token_id` may be one id or a list of ids.
    pub(super) fn token_list(&self, field: &'static str) -> Result<Vec<u32>> {
        match self.present(field) {
            None => Ok(Vec::new()),
            Some(Value::Array(_)) => self
                .usize_list(field)?
                .into_iter()
                .map(|n| u32::try_from(n).map_err(|_| self.err(field, "token id out of range")))
                .collect(),
            Some(_) => Ok(self.opt_token(field)?.into_iter().collect()),
        }
    }

    pub(super) fn rope_scaling(&self, obj: Option<&Map<String, Value>>) -> Result<RopeScaling> {
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

impl Fields<'_> {
    /// A list of non-negative integers (`mlp_only_layers`); absent = empty.
    pub(super) fn usize_list(&self, field: &'static str) -> Result<Vec<usize>> {
        match self.present(field) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or_else(|| self.err(field, format!("expected integers, got {v}")))
                })
                .collect(),
            Some(v) => Err(self.err(field, format!("expected a list, got {v}"))),
        }
    }

    /// A field stated at top level or (transformers 5) inside
    /// `rope_parameters`, like `partial_rotary_factor`.
    pub(super) fn opt_f64_or_rope(&self, field: &'static str) -> Result<Option<f64>> {
        if let Some(v) = self.opt_f64(field)? {
            return Ok(Some(v));
        }
        match self
            .obj
            .get("rope_parameters")
            .and_then(Value::as_object)
            .and_then(|r| r.get(field))
        {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a number, got {v}"))),
        }
    }
}
