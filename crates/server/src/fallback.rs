//! One place that makes every refusal an OpenAI error object.
//!
//! Handlers return [`ApiError`], but axum, its extractors and hyper's body
//! decoding refuse some requests before a handler runs: an unknown route
//! (empty 404), a wrong method (empty 405), a body over the limit (413 in
//! plain text), a malformed chunked body (400 in plain text), an extractor
//! rejection. OpenAI clients parse `{"error": {...}}` on every non-2xx, so
//! [`json_errors`] rewrites any error response that is not JSON, keeping its
//! status and headers (`Allow` on a 405).

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// Longest plain-text refusal kept as the message (axum's are ~100 bytes).
const MAX_MESSAGE: usize = 1024;

/// `Router::fallback`: no route matches the path.
pub async fn no_route(req: Request) -> ApiError {
    ApiError::Http {
        status: StatusCode::NOT_FOUND,
        message: format!("no route {} {}", req.method(), req.uri().path()),
    }
}

/// `Router::method_not_allowed_fallback`: the path exists, not the method.
pub async fn wrong_method(req: Request) -> ApiError {
    ApiError::Http {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message: format!(
            "method {} is not allowed on {}",
            req.method(),
            req.uri().path()
        ),
    }
}

/// Outermost layer: a non-2xx response without a JSON body becomes the
/// OpenAI error object with the same status; its plain text (if any) is the
/// message.
pub async fn json_errors(resp: Response) -> Response {
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) || is_json(&resp) {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, MAX_MESSAGE)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let message = match text.trim() {
        "" => status.canonical_reason().unwrap_or("error").to_string(),
        t => t.to_string(),
    };
    let mut out = ApiError::Http { status, message }.into_response();
    for (name, value) in &parts.headers {
        if name != CONTENT_TYPE && name != CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}

fn is_json(resp: &Response<Body>) -> bool {
    resp.headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"))
}
