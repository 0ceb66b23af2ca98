//! The model argument of `serve`, `generate` and `bench-model`: a local
//! directory or a Hugging Face repository id (`owner/name`), resolved as
//! vLLM resolves it (agentd-hub: the directory, the shared cache, then the
//! Hub), with vLLM's `--revision`, `--download-dir` and `--tokenizer`.

use std::path::PathBuf;

use agentd_hub::{BeforeWeights, HubConfig, Need, Source};
use anyhow::{Context, Result};
use clap::Args;

/// Where a repository id is fetched from (the environment says the rest:
/// `HF_ENDPOINT`, `HF_TOKEN`, `HF_HUB_OFFLINE`, `HF_HOME`, `HF_HUB_CACHE`).
#[derive(Args, Debug, Clone, Default)]
pub struct HubArgs {
    /// Branch, tag or commit of a repository id (default: main).
    #[arg(long)]
    pub revision: Option<String>,
    /// The Hugging Face cache to download into and read from (default:
    /// HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub).
    #[arg(long)]
    pub download_dir: Option<PathBuf>,
}

impl HubArgs {
    fn config(&self) -> HubConfig {
        HubConfig::from_env(self.download_dir.as_deref())
    }

    /// The local directory of `model` (a directory or a repo id), fetching
    /// what is missing; `tokenizer_elsewhere` when `--tokenizer` names
    /// another source (then the model's own tokenizer is optional).
    pub fn model_dir(&self, model: &str, tokenizer_elsewhere: bool) -> Result<PathBuf> {
        self.model_dir_checked(model, tokenizer_elsewhere, &|_| Ok(()))
    }

    /// [`HubArgs::model_dir`], with `check` run on a download's
    /// configuration files before its weights are fetched.
    pub fn model_dir_checked(
        &self,
        model: &str,
        tokenizer_elsewhere: bool,
        check: BeforeWeights<'_>,
    ) -> Result<PathBuf> {
        let need = Need::Model {
            tokenizer: !tokenizer_elsewhere,
        };
        let revision = self.revision.as_deref();
        let r = agentd_hub::resolve_checked(model, revision, need, &self.config(), check)
            .with_context(|| format!("model {model}"))?;
        if r.source != Source::Directory {
            tracing::info!(model, dir = %r.dir.display(), "model files");
        }
        Ok(r.dir)
    }

    /// The directory of `--tokenizer` (a directory or a repo id; the
    /// repository's default revision, as vLLM's `--tokenizer-revision`
    /// defaults).
    pub fn tokenizer_dir(&self, tokenizer: &str) -> Result<PathBuf> {
        let r = agentd_hub::resolve(tokenizer, None, Need::Tokenizer, &self.config())
            .with_context(|| format!("tokenizer {tokenizer}"))?;
        Ok(r.dir)
    }
}
