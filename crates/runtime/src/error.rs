//! Errors of the model runtime, every backend's included (one type, so the
//! engine and the server handle a CPU and a CUDA failure alike). Every
//! variant names what the user must fix (a file, a tensor, a config field, a
//! batch field) so that a bad model directory or a malformed batch never
//! ends in a panic.

use std::path::PathBuf;

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, ModelError>;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: missing file ({what})")]
    MissingFile { path: PathBuf, what: &'static str },
    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: config field `{field}`: {reason}")]
    Config {
        path: PathBuf,
        field: &'static str,
        reason: String,
    },
    #[error("tensor `{tensor}` not found in {files}")]
    MissingTensor { tensor: String, files: String },
    #[error("{file}: tensor `{tensor}` has shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        file: PathBuf,
        tensor: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("{file}: tensor `{tensor}` has dtype {found}, supported are f32, bf16 and f16")]
    UnsupportedDtype {
        file: PathBuf,
        tensor: String,
        found: String,
    },
    #[error("{path}: {reason}")]
    Weights { path: PathBuf, reason: String },
    #[error("invalid batch: {0}")]
    Batch(String),
    #[error(
        "sequence {seq}: position {position} is beyond max_position_embeddings {max} of the model"
    )]
    ContextTooLong {
        seq: usize,
        position: usize,
        max: usize,
    },
    #[error("KV cache does not match the model: {0}")]
    CacheMismatch(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("sampling: {0}")]
    Sampling(String),
    /// The CPU kernel path asked for cannot run here (`agentd_models`'
    /// `CpuKernelsError`, converted there).
    #[error("CPU kernels: {0}")]
    CpuKernels(String),
    /// A tensor operation of the CPU backend failed.
    #[cfg(feature = "candle")]
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// A failure inside another backend's runner (e.g. the CUDA backend).
    #[error("{backend} backend: {message}")]
    Backend {
        backend: &'static str,
        message: String,
    },
}

impl ModelError {
    /// An I/O failure on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.into(),
            source,
        }
    }
}
