//! Which program a request belongs to (DESIGN §2, §6).
//!
//! Order: body `program_id`, then `extra_body.program_id` (clients that send
//! `extra_body` inline instead of merging it), then the `X-Session-ID`
//! header. None of them makes the request a one-off program of its own.
//! `tool_resources` is read the same way (body, then `extra_body`).

use agentd_tools::ToolResources;
use axum::http::HeaderMap;

use crate::error::ApiError;
use crate::protocol::CommonParams;

pub const SESSION_HEADER: &str = "x-session-id";

/// Longest program id accepted (ids are kept in memory and on `/programs`).
const MAX_ID_LEN: usize = 256;

/// The program id, the `final` flag and the declared tool resources of a
/// request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ProgramRef {
    pub program: Option<String>,
    pub final_request: bool,
    pub tool_resources: Option<ToolResources>,
}

/// A program id from a URL or a body: 1 to [`MAX_ID_LEN`] bytes.
pub fn check(id: &str) -> Result<(), ApiError> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(ApiError::invalid(
            "program_id",
            format!("program_id must be 1 to {MAX_ID_LEN} bytes long"),
        ));
    }
    Ok(())
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
        check(id)?;
    }
    let final_request = c
        .final_request
        .or_else(|| extra.and_then(|e| e.final_request))
        .unwrap_or(false);
    if final_request && program.is_none() {
        tracing::debug!("`final` without a program id: the request is one-off anyway");
    }
    let tool_resources = match c
        .tool_resources
        .as_ref()
        .or_else(|| extra.and_then(|e| e.tool_resources.as_ref()))
    {
        None => None,
        Some(v) => {
            let spec = ToolResources::from_json(v)
                .map_err(|e| ApiError::invalid("tool_resources", e.to_string()))?;
            if program.is_none() && !spec.is_empty() {
                return Err(ApiError::invalid(
                    "tool_resources",
                    "tool_resources need a program id (program_id, extra_body.program_id or the X-Session-ID header)",
                ));
            }
            Some(spec)
        }
    };
    tracing::debug!(program = ?program, source, final_request, tools = tool_resources.is_some(), "program resolved");
    Ok(ProgramRef {
        program,
        final_request,
        tool_resources,
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

    #[test]
    fn tool_resources_from_body_then_extra_body() {
        let h = HeaderMap::new();
        let r = resolve(
            &common(r#"{"program_id":"p","tool_resources":{"dirs":["a"]},"extra_body":{"tool_resources":{"dirs":["b"]}}}"#),
            &h,
        )
        .unwrap();
        assert_eq!(r.tool_resources.unwrap().dirs, vec!["a"]);
        let r = resolve(
            &common(r#"{"extra_body":{"program_id":"p","tool_resources":{"docker_ids":["c1"],"pids":[7]}}}"#),
            &h,
        )
        .unwrap();
        let t = r.tool_resources.unwrap();
        assert_eq!((t.docker_ids, t.pids), (vec!["c1".to_string()], vec![7]));
        let e = resolve(&common(r#"{"tool_resources":{"dirs":["a"]}}"#), &h).unwrap_err();
        assert!(e.to_string().contains("need a program id"), "{e}");
        let e = resolve(
            &common(r#"{"program_id":"p","tool_resources":{"dir":"a"}}"#),
            &h,
        )
        .unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
    }
}
