//! A model argument (`serve Qwen/Qwen3-8B`) turned into a local directory as
//! `huggingface_hub` (and so vLLM) does it, in this order:
//!
//! 1. a local directory of that name;
//! 2. the shared Hugging Face cache ([`cache`]): `HF_HUB_CACHE`, else
//!    `HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub` or
//!    `~/.cache/huggingface/hub` (or `--download-dir`), the revision found
//!    through `refs/<revision>`;
//! 3. a download from `HF_ENDPOINT` (default <https://huggingface.co>) with
//!    `HF_TOKEN` ([`client`]) of only the files a model needs, into that same
//!    cache, unless `HF_HUB_OFFLINE` is set (then a clear error naming the
//!    missing files and the cache path, and no network).

pub mod cache;
pub mod client;
mod error;
pub mod progress;

use std::path::{Path, PathBuf};

pub use error::{HubError, Result};
pub use progress::{env_true, Progress};

use cache::RepoCache;
use client::{Client, Sibling};

/// Where and how to reach the Hub: the environment huggingface_hub reads.
#[derive(Debug, Clone)]
pub struct HubConfig {
    pub endpoint: String,
    pub token: Option<String>,
    /// The cache directory (`models--owner--name` folders live here).
    pub cache_dir: PathBuf,
    pub offline: bool,
}

impl HubConfig {
    /// From `HF_ENDPOINT`, `HF_TOKEN` (else the token file `huggingface-cli
    /// login` writes), `HF_HUB_OFFLINE` and the cache variables;
    /// `download_dir` (vLLM's `--download-dir`) replaces the cache directory.
    pub fn from_env(download_dir: Option<&Path>) -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let home = var("HOME").map(PathBuf::from);
        let hf_home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| home.map(|h| h.join(".cache")))
                .unwrap_or_else(|| PathBuf::from(".cache"))
                .join("huggingface")
        });
        let cache_dir = download_dir
            .map(Path::to_path_buf)
            .or_else(|| var("HF_HUB_CACHE").map(PathBuf::from))
            .unwrap_or_else(|| hf_home.join("hub"));
        let token_file = var("HF_TOKEN_PATH")
            .map(PathBuf::from)
            .unwrap_or_else(|| hf_home.join("token"));
        let token = var("HF_TOKEN").or_else(|| {
            std::fs::read_to_string(token_file)
                .ok()
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty())
        });
        HubConfig {
            endpoint: var("HF_ENDPOINT").unwrap_or_else(|| "https://huggingface.co".to_owned()),
            token,
            cache_dir,
            offline: env_true("HF_HUB_OFFLINE"),
        }
    }
}

/// What a model argument must provide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Config, weights and (unless `--tokenizer` names another) tokenizer.
    Model { tokenizer: bool },
    /// Only the tokenizer and chat template (`--tokenizer`).
    Tokenizer,
}

/// Where a model argument was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Directory,
    Cache,
    Downloaded,
}

#[derive(Debug, Clone)]
pub struct Resolved {
    pub dir: PathBuf,
    pub source: Source,
}

/// A check of the configuration files, run after they are downloaded and
/// before the weights are: `Err(reason)` stops the download. `serve` sizes
/// the KV cache from `config.json` here, so a pool that cannot hold the
/// model's window is refused before a multi-gigabyte download, not after.
pub type BeforeWeights<'a> = &'a dyn Fn(&Path) -> std::result::Result<(), String>;

/// `model` as a local directory (see the crate docs for the order).
pub fn resolve(
    model: &str,
    revision: Option<&str>,
    need: Need,
    cfg: &HubConfig,
) -> Result<Resolved> {
    resolve_checked(model, revision, need, cfg, &|_| Ok(()))
}

/// [`resolve`], with `check` run on a download's configuration files
/// before its weights are fetched (not on a directory or a cached copy:
/// the caller checks those itself, as it loads them).
pub fn resolve_checked(
    model: &str,
    revision: Option<&str>,
    need: Need,
    cfg: &HubConfig,
    check: BeforeWeights<'_>,
) -> Result<Resolved> {
    if Path::new(model).is_dir() {
        return Ok(Resolved {
            dir: PathBuf::from(model),
            source: Source::Directory,
        });
    }
    if !is_repo_id(model) {
        return Err(HubError::NotARepoId(model.to_owned()));
    }
    let revision = revision.unwrap_or("main");
    let repo = RepoCache::new(&cfg.cache_dir, model);
    let cached = repo.commit_of(revision).map(|c| repo.snapshot(&c));
    let missing = match &cached {
        Some(dir) if dir.is_dir() => missing(dir, need),
        _ => vec![format!("refs/{revision} and its snapshot")],
    };
    if missing.is_empty() {
        let dir = cached.unwrap_or_default();
        tracing::info!(repo = model, revision, dir = %dir.display(), "model found in the Hugging Face cache");
        return Ok(Resolved {
            dir,
            source: Source::Cache,
        });
    }
    if cfg.offline {
        return Err(HubError::Offline {
            repo: model.to_owned(),
            revision: revision.to_owned(),
            cache: repo.root,
            missing: missing.join(", "),
        });
    }
    let dir = download(model, revision, need, cfg, &repo, check)?;
    Ok(Resolved {
        dir,
        source: Source::Downloaded,
    })
}

fn missing(dir: &Path, need: Need) -> Vec<String> {
    match need {
        Need::Model { tokenizer } => cache::missing_files(dir, !tokenizer),
        Need::Tokenizer => ["tokenizer.json"]
            .into_iter()
            .filter(|f| !dir.join(f).is_file())
            .map(str::to_owned)
            .collect(),
    }
}

/// `owner/name`: two non-empty parts of the characters the Hub allows.
pub fn is_repo_id(s: &str) -> bool {
    let ok = |p: &str| {
        !p.is_empty()
            && !p.starts_with(['.', '-'])
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    };
    matches!(s.split_once('/'), Some((o, n)) if ok(o) && ok(n))
}

/// The files of a revision a model needs, small ones first so that the
/// weights' index is known before the shards are chosen.
fn wanted(files: &[Sibling], need: Need) -> (Vec<Sibling>, Vec<Sibling>) {
    const META: &[&str] = &[
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "chat_template.json",
        "model.safetensors.index.json",
    ];
    let weights = matches!(need, Need::Model { .. });
    let meta = files
        .iter()
        .filter(|f| META.contains(&f.rfilename.as_str()))
        .filter(|f| weights || f.rfilename != "model.safetensors.index.json")
        .cloned()
        .collect();
    let shards = files
        .iter()
        .filter(|f| weights && f.rfilename.ends_with(".safetensors") && !f.rfilename.contains('/'))
        .cloned()
        .collect();
    (meta, shards)
}

fn download(
    model: &str,
    revision: &str,
    need: Need,
    cfg: &HubConfig,
    repo: &RepoCache,
    check: BeforeWeights<'_>,
) -> Result<PathBuf> {
    let client = Client::new(&cfg.endpoint, cfg.token.clone());
    tracing::info!(repo = model, revision, endpoint = %cfg.endpoint, cache = %cfg.cache_dir.display(), "fetching the file list from the Hub");
    let info = client.list(model, revision)?;
    if !cache::is_commit(&info.sha) {
        return Err(HubError::Listing {
            repo: model.to_owned(),
            detail: format!("names commit {:?}, not a commit id", info.sha),
        });
    }
    let (meta, mut shards) = wanted(&info.siblings, need);
    if matches!(need, Need::Model { .. }) && shards.is_empty() {
        return Err(HubError::Listing {
            repo: model.to_owned(),
            detail: "holds no *.safetensors file (agentd reads safetensors checkpoints)".into(),
        });
    }
    repo.write_ref(revision, &info.sha)?;
    let snapshot = repo.snapshot(&info.sha);
    fetch_all(&client, model, &info.sha, &meta, repo, "Downloading config")?;
    // With an index, only the shards it lists (a repo may also hold a
    // consolidated copy of the same weights).
    let index = snapshot.join("model.safetensors.index.json");
    if index.is_file() {
        let listed = cache::missing_files(&snapshot, true);
        shards.retain(|s| listed.contains(&s.rfilename));
    }
    check(&snapshot).map_err(|reason| HubError::Refused {
        repo: model.to_owned(),
        reason,
        weights_bytes: shards.iter().filter_map(Sibling::bytes).sum(),
    })?;
    fetch_all(
        &client,
        model,
        &info.sha,
        &shards,
        repo,
        "Downloading weights",
    )?;
    let still = missing(&snapshot, need);
    if !still.is_empty() {
        return Err(HubError::Listing {
            repo: model.to_owned(),
            detail: format!("lacks files a model needs: {}", still.join(", ")),
        });
    }
    tracing::info!(repo = model, revision, commit = %info.sha, dir = %snapshot.display(), "model downloaded into the Hugging Face cache");
    Ok(snapshot)
}

fn fetch_all(
    client: &Client,
    model: &str,
    commit: &str,
    files: &[Sibling],
    repo: &RepoCache,
    label: &str,
) -> Result<()> {
    let total = files.iter().filter_map(Sibling::bytes).sum();
    let bar = Progress::bytes(label, total);
    for f in files {
        bar.set_message(&f.rfilename);
        if !bar.is_visible() {
            tracing::info!(file = %f.rfilename, bytes = f.bytes().unwrap_or(0), "downloading");
        }
        if let Err(e) = client.download(model, commit, f, repo, &bar) {
            bar.abandon();
            return Err(e);
        }
    }
    bar.set_message("");
    bar.finish();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids() {
        assert!(is_repo_id("Qwen/Qwen3-8B"));
        assert!(is_repo_id("zai-org/GLM-4.5-Air"));
        for bad in ["Qwen3-8B", "a/b/c", "/abs", "./x", "a/", "a/..", "a b/c"] {
            assert!(!is_repo_id(bad), "{bad}");
        }
    }
}
