//! Fetches a model repository from the Hugging Face hub into the local cache
//! (feature `hub`; off by default, the machines here have no hub access).

use std::path::PathBuf;

use hf_hub::HFClientSync;

use crate::error::{ModelError, Result};

/// Downloads `owner/name` (config, tokenizer and safetensors files only) and
/// returns the local snapshot directory, ready for [`crate::Qwen3Model::load`].
pub fn fetch_model(repo_id: &str, revision: Option<&str>) -> Result<PathBuf> {
    let (owner, name) = repo_id
        .split_once('/')
        .ok_or_else(|| ModelError::Hub(format!("{repo_id:?} is not an owner/name repo id")))?;
    let client = HFClientSync::new().map_err(|e| ModelError::Hub(e.to_string()))?;
    tracing::info!(repo_id, "fetching from the hub");
    client
        .model(owner, name)
        .snapshot_download()
        .maybe_revision(revision.map(str::to_owned))
        .allow_patterns(vec![
            "*.json".to_owned(),
            "*.safetensors".to_owned(),
            "tokenizer*".to_owned(),
        ])
        .send()
        .map_err(|e| ModelError::Hub(format!("{repo_id}: {e}")))
}
