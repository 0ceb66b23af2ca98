//! What can go wrong between a model id and a local directory, each with
//! what to do about it.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{0:?} is neither a directory nor a repository id of the form owner/name")]
    NotARepoId(String),
    #[error(
        "HF_HUB_OFFLINE is set and {repo} (revision {revision}) is not in the cache at {}: \
         missing {missing}; start once without HF_HUB_OFFLINE to download it",
        .cache.display()
    )]
    Offline {
        repo: String,
        revision: String,
        cache: PathBuf,
        missing: String,
    },
    #[error(
        "{repo}: HTTP {status} from {url}: the repository is private or gated (or does not \
         exist); set HF_TOKEN to a token that can read it{}",
        token_note(.token_sent)
    )]
    Unauthorized {
        repo: String,
        status: u16,
        url: String,
        token_sent: bool,
    },
    #[error("{repo}: revision {revision:?} not found (HTTP 404 from {url})")]
    RevisionNotFound {
        repo: String,
        revision: String,
        url: String,
    },
    #[error("{repo}: repository not found (HTTP 404 from {url})")]
    RepoNotFound { repo: String, url: String },
    #[error("{url}: HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{url}: {reason}")]
    Http { url: String, reason: String },
    #[error("{repo}: the Hub's file list {detail}")]
    Listing { repo: String, detail: String },
    #[error(
        "downloading {file} of {repo}: {reason}; the partial file {} is kept and the next \
         start resumes it",
        .partial.display()
    )]
    Interrupted {
        repo: String,
        file: String,
        reason: String,
        partial: PathBuf,
    },
    #[error("downloading {file} of {repo}: {reason}; the download was discarded, start again")]
    Corrupt {
        repo: String,
        file: String,
        reason: String,
    },
    #[error("{reason} (checked before downloading {weights_bytes} bytes of weights of {repo})")]
    Refused {
        repo: String,
        reason: String,
        weights_bytes: u64,
    },
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn token_note(sent: &bool) -> &'static str {
    if *sent {
        " (the token sent was refused)"
    } else {
        ""
    }
}

impl HubError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| HubError::Io { path, source }
    }
}

pub type Result<T, E = HubError> = std::result::Result<T, E>;
