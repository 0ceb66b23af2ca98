//! The embedded default model of `agentd serve`: the tiny Qwen3 of
//! `models/qwen3-tiny.json` (real Qwen3 tokenizer and chat template, random
//! weights), generated once into a cache directory, so a fresh machine with
//! no network can serve and be benchmarked.

use std::path::{Path, PathBuf};

use agentd_models::synth::{write_random_model, ModelCard};
use anyhow::{bail, Context, Result};

const DEFAULT_CARD: &str = include_str!("../../models/qwen3-tiny.json");
const DEFAULT_TOKENIZER: &[u8] = include_bytes!("../../models/qwen3/tokenizer.json");
const DEFAULT_TOKENIZER_CONFIG: &[u8] = include_bytes!("../../models/qwen3/tokenizer_config.json");
/// Bump when the embedded card or the weight generator changes, so stale
/// cached models are not served.
const DEFAULT_MODEL_VERSION: &str = "qwen3-tiny-v1";
pub const DEFAULT_MODEL_NAME: &str = "agentd-tiny-qwen3";

/// Where the default model is cached: `$XDG_CACHE_HOME/agentd`, else
/// `~/.cache/agentd`, else `target/agentd-default-model`.
fn cache_root() -> PathBuf {
    let env_dir = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env_dir("XDG_CACHE_HOME")
        .map(|d| d.join("agentd"))
        .or_else(|| env_dir("HOME").map(|h| h.join(".cache/agentd")))
        .unwrap_or_else(|| PathBuf::from("target/agentd-default-model"))
}

/// The embedded tiny Qwen3, generated on first use.
pub fn default_model() -> Result<PathBuf> {
    let root = cache_root().join(DEFAULT_MODEL_VERSION);
    let model = root.join("model");
    if model.join(".complete").is_file() {
        tracing::info!(dir = %model.display(), "serving the cached default model");
        return Ok(model);
    }
    tracing::info!(dir = %model.display(), "generating the default tiny Qwen3 (first run)");
    // Build in a scratch directory and rename, so an interrupted first run
    // never leaves a half-written model that later runs would trust.
    let scratch = root.join(format!("tmp-{}", std::process::id()));
    write_default(&scratch).with_context(|| format!("writing {}", scratch.display()))?;
    // Never delete a `model` directory that may be complete: processes
    // starting together (tests, a replica set) each generate one, and the
    // first rename wins. A complete model is only ever renamed into place
    // whole, so one without `.complete` is a stale leftover of an older
    // layout, moved aside before the second try.
    let install = || std::fs::rename(scratch.join("model"), &model);
    if let Err(e) = install() {
        if !model.join(".complete").is_file() {
            let stale = root.join(format!("stale-{}", std::process::id()));
            let retried = std::fs::rename(&model, &stale).and_then(|()| install());
            std::fs::remove_dir_all(&stale).ok();
            if retried.is_err() && !model.join(".complete").is_file() {
                bail!(
                    "cannot move the default model into {}: {e}",
                    model.display()
                );
            }
        }
    }
    std::fs::remove_dir_all(&scratch).ok();
    Ok(model)
}

fn write_default(scratch: &Path) -> Result<()> {
    let tok_dir = scratch.join("qwen3");
    std::fs::create_dir_all(&tok_dir)?;
    std::fs::write(tok_dir.join("tokenizer.json"), DEFAULT_TOKENIZER)?;
    std::fs::write(
        tok_dir.join("tokenizer_config.json"),
        DEFAULT_TOKENIZER_CONFIG,
    )?;
    let card_path = scratch.join("qwen3-tiny.json");
    std::fs::write(&card_path, DEFAULT_CARD)?;
    let card = ModelCard::from_file(&card_path)?;
    let out = scratch.join("model");
    write_random_model(&card.config, &out, 0, card.tokenizer_dir.as_deref())?;
    std::fs::write(out.join(".complete"), b"")?;
    Ok(())
}
