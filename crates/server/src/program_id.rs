//! Which program a request belongs to (DESIGN §2, §6).
//!
//! Order: body `program_id`, then `extra_body.program_id` (clients that send
//! `extra_body` inline instead of merging it), then the `X-Session-ID`
//! header. None of them makes the request a one-off program of its own.

use axum::http::HeaderMap;

use crate::error::ApiError;
use crate::protocol::CommonParams;

pub const SESSION_HEADER: &str = "x-session-id";

/// Longest program id accepted (ids are kept in memory and on `/programs`).
const MAX_ID_LEN: usize = 256;

/// The program id and the `final` flag of a request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProgramRef {
    pub program: Option<String>,
    pub final_request: bool,
}

pub fn resolve(c: &CommonParams, headers: &HeaderMap) -> Result<ProgramRef, ApiError> {
    let extra = c.extra_body.as_ref();
    let (program, source) = if let Some(id) = &c.program_id {
        (Some(id.clone()), "body")
    } else if let Some(id) = extra.and_then(|e| e.program_id.clone()) {
        (Some(id), "extra_body")
    } else if let Some(v) = headers.get(SESSION_HEADER) {
        let id = v.to_str().map_err(|_| {
            ApiError::invalid(
                "X-Session-ID",
                "the X-Session-ID header must be visible ASCII",
            )
        })?;
        (Some(id.to_string()), "header")
    } else {
        (None, "none")
    };
    if let Some(id) = &program {
        if id.is_empty() || id.len() > MAX_ID_LEN {
            return Err(ApiError::invalid(
                "program_id",
                format!("program_id must be 1 to {MAX_ID_LEN} bytes long"),
            ));
        }
    }
    let final_request = c
        .final_request
        .or_else(|| extra.and_then(|e| e.final_request))
        .unwrap_or(false);
    if final_request && program.is_none() {
        tracing::debug!("`final` without a program id: the request is one-off anyway");
    }
    tracing::debug!(program = ?program, source, final_request, "program resolved");
    Ok(ProgramRef {
        program,
        final_request,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn common(json: &str) -> CommonParams {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn precedence_body_extra_header() {
        let mut h = HeaderMap::new();
        h.insert("X-Session-ID", HeaderValue::from_static("hdr"));
        let r = resolve(
            &common(r#"{"program_id":"b","extra_body":{"program_id":"e"}}"#),
            &h,
        );
        assert_eq!(r.unwrap().program.as_deref(), Some("b"));
        let r = resolve(
            &common(r#"{"extra_body":{"program_id":"e","final":true}}"#),
            &h,
        )
        .unwrap();
        assert_eq!(r.program.as_deref(), Some("e"));
        assert!(r.final_request);
        let r = resolve(&common("{}"), &h).unwrap();
        assert_eq!(r.program.as_deref(), Some("hdr"));
        let r = resolve(&common("{}"), &HeaderMap::new()).unwrap();
        assert_eq!(r, ProgramRef::default());
        assert!(resolve(&common(r#"{"program_id":""}"#), &h).is_err());
    }
}
