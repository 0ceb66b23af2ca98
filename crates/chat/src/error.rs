//! The crate's error type.
//!
//! Every variant except [`ChatError::TemplateLoad`] is caused by the client's
//! request, so the server maps them to HTTP 400 (OpenAI's
//! `invalid_request_error`); `TemplateLoad` is a deployment problem (a broken
//! `tokenizer_config.json`) and belongs in a 500 or a startup failure.

use thiserror::Error;

/// Errors from turning a chat request into a prompt.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ChatError {
    /// A message, tool definition or option is not a valid OpenAI chat request.
    /// `at` is a JSON-path-like location such as `messages[2].tool_calls[0]`.
    #[error("{at}: {message}")]
    InvalidRequest { at: String, message: String },

    /// The chat template rejected the conversation: either the template called
    /// `raise_exception(...)` (the message is the template's own text) or it
    /// failed while rendering these messages.
    #[error("chat template error: {0}")]
    Template(String),

    /// The model's chat template could not be loaded or compiled.
    #[error("cannot load chat template: {0}")]
    TemplateLoad(String),
}

impl ChatError {
    pub(crate) fn invalid(at: impl Into<String>, message: impl Into<String>) -> Self {
        ChatError::InvalidRequest {
            at: at.into(),
            message: message.into(),
        }
    }

    /// True when the error is the client's fault (HTTP 400), false when the
    /// server's template configuration is broken.
    pub fn is_client_error(&self) -> bool {
        !matches!(self, ChatError::TemplateLoad(_))
    }
}
