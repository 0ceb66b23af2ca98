//! `--generation-config`: the default sampling of requests that leave a
//! field unset, as vLLM chooses it: `auto` (the default) takes the model's
//! `generation_config.json`, `vllm` the neutral defaults, a directory that
//! directory's `generation_config.json`.

use std::path::Path;

use agentd_runtime::{GenerationConfig, SamplingParams};
use anyhow::{bail, Result};

/// The defaults and what set them (for the start log and banner).
#[derive(Debug, Clone)]
pub struct Defaults {
    pub params: SamplingParams,
    pub source: String,
    /// The params come from a generation_config.json (not the neutral ones).
    pub set_by_model: bool,
}

impl Defaults {
    /// `temperature=0.6 top_p=0.95 top_k=20 ...` (the fields that matter).
    pub fn summary(&self) -> String {
        let p = &self.params;
        let mut s = format!("temperature={} top_p={}", p.temperature, p.top_p);
        if p.top_k > 0 {
            s.push_str(&format!(" top_k={}", p.top_k));
        }
        if p.min_p > 0.0 {
            s.push_str(&format!(" min_p={}", p.min_p));
        }
        if p.repetition_penalty != 1.0 {
            s.push_str(&format!(" repetition_penalty={}", p.repetition_penalty));
        }
        s
    }
}

pub fn defaults(flag: &str, model_dir: &Path) -> Result<Defaults> {
    let neutral = SamplingParams::default();
    let (gc, from) = match flag {
        "vllm" => {
            return Ok(Defaults {
                params: neutral,
                source: "--generation-config vllm (neutral)".into(),
                set_by_model: false,
            })
        }
        "auto" => (GenerationConfig::from_dir(model_dir), model_dir),
        dir => {
            let d = Path::new(dir);
            if !d.join("generation_config.json").is_file() {
                bail!("--generation-config {dir}: not auto, vllm, or a directory holding generation_config.json");
            }
            (GenerationConfig::from_dir(d), d)
        }
    };
    let Some(gc) = gc.filter(GenerationConfig::has_sampling) else {
        return Ok(Defaults {
            params: neutral,
            source: "neutral (the model sets no sampling defaults)".into(),
            set_by_model: false,
        });
    };
    let params = SamplingParams {
        temperature: gc.temperature.unwrap_or(neutral.temperature),
        top_p: gc.top_p.unwrap_or(neutral.top_p),
        // vLLM reads the file through transformers' `to_diff_dict`, which
        // drops values equal to transformers' defaults: top_k 50 is one, so
        // a stated top_k of 50 leaves vLLM's (no cut).
        top_k: gc.top_k.filter(|&k| k != 50).unwrap_or(neutral.top_k),
        min_p: gc.min_p.unwrap_or(neutral.min_p),
        repetition_penalty: gc.repetition_penalty.unwrap_or(neutral.repetition_penalty),
        ..neutral
    };
    if let Err(e) = params.validate() {
        bail!(
            "{}/generation_config.json: {} {}; start with --generation-config vllm to ignore it",
            from.display(),
            e.field,
            e.message
        );
    }
    Ok(Defaults {
        params,
        source: format!("{}/generation_config.json", from.display()),
        set_by_model: true,
    })
}
