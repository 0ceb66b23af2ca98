//! What can go wrong declaring, preparing or reclaiming a tool resource.

/// Errors of the tools crate. [`ToolError::is_client_error`] tells the
/// server which ones are the caller's fault (a 400), and
/// [`ToolError::is_retryable`] tells the reclaimer which ones to retry.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// A declaration or a spec is malformed.
    #[error("invalid {what}: {reason}")]
    Invalid { what: &'static str, reason: String },
    /// A resource the backend must not touch (outside the sandbox root, pid
    /// 1, the server's own process group, ...).
    #[error("refused {resource}: {reason}")]
    Refused { resource: String, reason: String },
    /// The resource's last owner ended and it is being reclaimed right now.
    #[error("{0} is being reclaimed; declare it again once it is reclaimed")]
    Busy(String),
    /// An environment is already being prepared for the program.
    #[error("an environment is already being prepared for program `{0}`")]
    AlreadyPreparing(String),
    #[error("no backend handles {0}")]
    NoBackend(String),
    #[error("the Docker daemon is unreachable at {socket}: {reason}")]
    DockerUnavailable { socket: String, reason: String },
    #[error("Docker API answered {status} to {op}: {message}")]
    Docker {
        op: String,
        status: u16,
        message: String,
    },
    #[error("{op}: {source}")]
    Io {
        op: String,
        #[source]
        source: std::io::Error,
    },
    /// Processes survived SIGTERM and SIGKILL.
    #[error("{0}")]
    StillAlive(String),
}

impl ToolError {
    pub fn io(op: impl Into<String>, source: std::io::Error) -> Self {
        ToolError::Io {
            op: op.into(),
            source,
        }
    }

    pub fn refused(resource: impl std::fmt::Display, reason: impl Into<String>) -> Self {
        ToolError::Refused {
            resource: resource.to_string(),
            reason: reason.into(),
        }
    }

    /// The request was wrong (HTTP 400), as opposed to the world failing.
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            ToolError::Invalid { .. } | ToolError::Refused { .. } | ToolError::NoBackend(_)
        )
    }

    /// Whether trying again later may succeed. A refusal never will; a
    /// daemon that is down or a process that lingers might.
    pub fn is_retryable(&self) -> bool {
        !matches!(
            self,
            ToolError::Invalid { .. } | ToolError::Refused { .. } | ToolError::NoBackend(_)
        )
    }
}
