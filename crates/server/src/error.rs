//! Errors of the HTTP API, rendered in OpenAI's shape
//! `{"error": {"message", "type", "param", "code"}}` with the status a client
//! (and vLLM-compatible tooling) expects.

use agentd_chat::ChatError;
use agentd_engine::EngineError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// Everything a handler can refuse a request with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not JSON or not the expected shape.
    #[error("{0}")]
    BadJson(String),
    /// A field has a value the server cannot honour.
    #[error("{message}")]
    InvalidParam {
        param: Option<&'static str>,
        message: String,
    },
    /// The prompt plus the requested completion do not fit the model.
    #[error("{0}")]
    ContextTooLong(String),
    #[error("The model `{0}` does not exist.")]
    ModelNotFound(String),
    #[error("program `{0}` does not exist")]
    ProgramNotFound(String),
    #[error("Response with id '{0}' not found.")]
    ResponseNotFound(String),
    #[error("missing or invalid API key")]
    Unauthorized,
    /// The request clashes with the current state (a resource being
    /// reclaimed, an environment already being prepared).
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Overloaded(String),
    #[error("{0}")]
    Unavailable(String),
    /// A server-side fault (broken template, tokenizer failure).
    #[error("{0}")]
    Internal(String),
    /// A refusal made below the handlers (unknown route, wrong method, body
    /// over the limit, malformed chunking), rewritten by
    /// [`crate::fallback::json_errors`] with the status the stack chose.
    #[error("{message}")]
    Http { status: StatusCode, message: String },
}

impl ApiError {
    pub fn invalid(param: &'static str, message: impl Into<String>) -> Self {
        ApiError::InvalidParam {
            param: Some(param),
            message: message.into(),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadJson(_) | ApiError::InvalidParam { .. } | ApiError::ContextTooLong(_) => {
                StatusCode::BAD_REQUEST
            }
            ApiError::ModelNotFound(_)
            | ApiError::ProgramNotFound(_)
            | ApiError::ResponseNotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Overloaded(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Http { status, .. } => *status,
        }
    }

    /// OpenAI's `type` field.
    fn kind(&self) -> &'static str {
        match self {
            ApiError::BadJson(_) | ApiError::InvalidParam { .. } | ApiError::ContextTooLong(_) => {
                "invalid_request_error"
            }
            ApiError::ModelNotFound(_)
            | ApiError::ProgramNotFound(_)
            | ApiError::ResponseNotFound(_) => "NotFoundError",
            ApiError::Unauthorized => "authentication_error",
            ApiError::Conflict(_) => "conflict_error",
            ApiError::Overloaded(_) => "rate_limit_error",
            ApiError::Unavailable(_) => "service_unavailable",
            ApiError::Internal(_) => "internal_server_error",
            ApiError::Http { status, .. } => kind_of_status(*status),
        }
    }

    fn code(&self) -> Option<&'static str> {
        match self {
            ApiError::ContextTooLong(_) => Some("context_length_exceeded"),
            ApiError::ModelNotFound(_) => Some("model_not_found"),
            ApiError::Unauthorized => Some("invalid_api_key"),
            _ => None,
        }
    }

    fn param(&self) -> Option<&'static str> {
        match self {
            ApiError::InvalidParam { param, .. } => *param,
            ApiError::ContextTooLong(_) => Some("messages"),
            ApiError::ModelNotFound(_) => Some("model"),
            _ => None,
        }
    }

    /// The JSON body (also sent as an SSE event when a stream fails late).
    pub fn body(&self) -> serde_json::Value {
        serde_json::to_value(ErrorBody {
            error: ErrorDetail {
                message: self.to_string(),
                kind: self.kind(),
                param: self.param(),
                code: self.code(),
            },
        })
        .unwrap_or(serde_json::Value::Null)
    }
}

/// OpenAI's `type` for a status chosen below the handlers.
fn kind_of_status(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "NotFoundError",
        408 => "timeout_error",
        409 => "conflict_error",
        429 => "rate_limit_error",
        503 => "service_unavailable",
        500..=599 => "internal_server_error",
        _ => "invalid_request_error",
    }
}

#[derive(Serialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Serialize)]
struct ErrorDetail {
    message: String,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'static str>,
    code: Option<&'static str>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(status = status.as_u16(), error = %self, "request failed");
        } else {
            tracing::debug!(status = status.as_u16(), error = %self, "request refused");
        }
        (status, axum::Json(self.body())).into_response()
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Overloaded { .. } => ApiError::Overloaded(e.to_string()),
            EngineError::ContextTooLong { .. } => ApiError::ContextTooLong(e.to_string()),
            EngineError::Invalid(m) => ApiError::InvalidParam {
                param: None,
                message: m,
            },
            EngineError::InvalidSampling(e) => ApiError::InvalidParam {
                param: Some(e.field),
                message: e.message,
            },
            EngineError::ShuttingDown => ApiError::Unavailable(e.to_string()),
        }
    }
}

impl From<ChatError> for ApiError {
    fn from(e: ChatError) -> Self {
        if e.is_client_error() {
            let tools =
                matches!(&e, ChatError::InvalidRequest { at, .. } if at.starts_with("tools"));
            ApiError::InvalidParam {
                param: Some(if tools { "tools" } else { "messages" }),
                message: e.to_string(),
            }
        } else {
            ApiError::Internal(e.to_string())
        }
    }
}

impl ApiError {
    /// A tools error, blamed on request field `param` when it is the
    /// client's fault.
    pub fn tools(param: &'static str, e: agentd_tools::ToolError) -> Self {
        use agentd_tools::ToolError as T;
        match e {
            e if e.is_client_error() => ApiError::invalid(param, e.to_string()),
            T::Busy(_) | T::AlreadyPreparing(_) => ApiError::Conflict(e.to_string()),
            T::DockerUnavailable { .. } => ApiError::Unavailable(e.to_string()),
            e => ApiError::Internal(e.to_string()),
        }
    }
}

impl From<agentd_runtime::ModelError> for ApiError {
    fn from(e: agentd_runtime::ModelError) -> Self {
        ApiError::Internal(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_shape_and_status() {
        let e = ApiError::from(EngineError::ContextTooLong {
            prompt: 10,
            max_tokens: 5,
            max: 12,
        });
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let b = e.body();
        assert_eq!(b["error"]["code"], "context_length_exceeded");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert!(b["error"]["message"].as_str().unwrap().contains("12"));

        let e = ApiError::from(EngineError::Overloaded {
            waiting: 3,
            limit: 3,
        });
        assert_eq!(e.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            ApiError::from(EngineError::ShuttingDown).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        let b = ApiError::ModelNotFound("x".into()).body();
        assert_eq!(b["error"]["param"], "model");
        assert!(b["error"].get("code").is_some());
    }
}
