//! Server-sent events in OpenAI's framing: one `data: {json}\n\n` per chunk,
//! then `data: [DONE]\n\n`.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use serde::Serialize;

/// The stream's terminator.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// One event carrying `value` as JSON.
pub fn event(value: &impl Serialize) -> Bytes {
    // Our response types always serialise; an error here would be a bug,
    // reported to the client as an error event rather than a panic.
    let json = serde_json::to_string(value).unwrap_or_else(|e| {
        tracing::error!(error = %e, "cannot serialise a stream chunk");
        r#"{"error":{"message":"internal serialisation error","type":"internal_server_error","param":null,"code":null}}"#.to_string()
    });
    Bytes::from(format!("data: {json}\n\n"))
}

/// One event with an `event:` name line, as the Responses API frames them
/// (`event: response.output_text.delta`).
pub fn named_event(name: &str, value: &impl Serialize) -> Bytes {
    let data = event(value);
    let mut out = Vec::with_capacity(name.len() + 8 + data.len());
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(&data);
    Bytes::from(out)
}

/// A streaming response. When the client goes away hyper drops the body,
/// and with it the stream and the engine request inside it (cancelling it).
pub fn response(stream: impl Stream<Item = Bytes> + Send + 'static) -> Response {
    (
        [
            (CONTENT_TYPE, "text/event-stream"),
            (CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream.map(Ok::<_, Infallible>)),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    #[test]
    fn framing() {
        let e = super::event(&serde_json::json!({"a": 1}));
        assert_eq!(&e[..], b"data: {\"a\":1}\n\n");
    }
}
