//! Which program a request belongs to (docs/design.md §2, §9).
//!
//! Order: body `program_id`, then `extra_body.program_id` (clients that send
//! `extra_body` inline instead of merging it), then the `X-Session-ID`
//! header, then NVIDIA Dynamo's `x-dynamo-session-id` header, then the
//! SGLang Model Gateway's `X-SMG-Routing-Key`, then
//! `nvext.agent_context.session_id`, then `.trajectory_id`: agentd's own
//! names first, so a client that sets both is never overridden by a router.
//! None of them makes the request a one-off program of its own. The final
//! flag: body `final`, `extra_body.final`, `x-dynamo-session-final`,
//! `nvext.agent_context.trajectory_final`. `x-dynamo-parent-session-id` is
//! recorded on the program (subagents) and shown on `/programs`.
//! `tool_resources` is read the same way (body, then `extra_body`).

use agentd_tools::ToolResources;
use axum::http::HeaderMap;

use crate::error::ApiError;
use crate::protocol::CommonParams;

pub const SESSION_HEADER: &str = "x-session-id";
pub const DYNAMO_SESSION: &str = "x-dynamo-session-id";
pub const DYNAMO_FINAL: &str = "x-dynamo-session-final";
pub const DYNAMO_PARENT: &str = "x-dynamo-parent-session-id";
/// SGLang Model Gateway's session-affinity header (`X-SMG-Routing-Key`).
pub const SMG_ROUTING_KEY: &str = "x-smg-routing-key";

/// Longest program id accepted (ids are kept in memory and on `/programs`).
const MAX_ID_LEN: usize = 256;

/// The program id, the `final` flag and the declared tool resources of a
/// request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ProgramRef {
    pub program: Option<String>,
    pub final_request: bool,
    pub tool_resources: Option<ToolResources>,
    /// The program that spawned this one (`x-dynamo-parent-session-id`).
    pub parent: Option<String>,
    /// The body's `cache_salt` (checked non-empty).
    pub cache_salt: Option<String>,
    /// `group_id` (body or `extra_body`), checked like a program id.
    pub group: Option<String>,
    /// `group_size`, 1 to [`MAX_GROUP_SIZE`].
    pub group_size: Option<usize>,
    /// `tool_name` (body or `extra_body`), 1 to [`MAX_ID_LEN`] bytes.
    pub tool_name: Option<String>,
}

/// The largest `group_size` accepted (GRPO groups are 4 to 64 samples).
pub const MAX_GROUP_SIZE: u64 = 1024;

/// `group_id`, `group_size` and `tool_name` from the body or `extra_body`.
type GroupAndTool = (Option<String>, Option<usize>, Option<String>);

fn group_and_tool(c: &CommonParams) -> Result<GroupAndTool, ApiError> {
    let extra = c.extra_body.as_ref();
    let group = c
        .group_id
        .clone()
        .or_else(|| extra.and_then(|e| e.group_id.clone()));
    let size = c.group_size.or_else(|| extra.and_then(|e| e.group_size));
    let tool = c
        .tool_name
        .clone()
        .or_else(|| extra.and_then(|e| e.tool_name.clone()));
    if let Some(g) = &group {
        check_len("group_id", g)?;
    }
    let size = match size {
        None => None,
        Some(n) if (1..=MAX_GROUP_SIZE).contains(&n) && group.is_some() => usize::try_from(n).ok(),
        Some(_) if group.is_none() => {
            return Err(ApiError::invalid(
                "group_size",
                "group_size needs a group_id",
            ))
        }
        Some(n) => {
            return Err(ApiError::invalid(
                "group_size",
                format!("group_size must be 1 to {MAX_GROUP_SIZE}, got {n}"),
            ))
        }
    };
    if let Some(t) = &tool {
        check_len("tool_name", t)?;
    }
    Ok((group, size, tool))
}

/// A program id from a URL or a body: 1 to [`MAX_ID_LEN`] bytes.
pub fn check(id: &str) -> Result<(), ApiError> {
    check_len("program_id", id)
}

/// An id-like field (`program_id`, `group_id`, `tool_name`): 1 to
/// [`MAX_ID_LEN`] bytes.
fn check_len(field: &'static str, v: &str) -> Result<(), ApiError> {
    if v.is_empty() || v.len() > MAX_ID_LEN {
        return Err(ApiError::invalid(
            field,
            format!("{field} must be 1 to {MAX_ID_LEN} bytes long"),
        ));
    }
    Ok(())
}

pub fn resolve(c: &CommonParams, headers: &HeaderMap) -> Result<ProgramRef, ApiError> {
    let extra = c.extra_body.as_ref();
    let agent = c.nvext.as_ref().and_then(|n| n.agent_context.as_ref());
    let (program, source) = if let Some(id) = &c.program_id {
        (Some(id.clone()), "body")
    } else if let Some(id) = extra.and_then(|e| e.program_id.clone()) {
        (Some(id), "extra_body")
    } else if let Some(id) = header(headers, SESSION_HEADER)? {
        (Some(id), "header")
    } else if let Some(id) = header(headers, DYNAMO_SESSION)? {
        (Some(id), "dynamo header")
    } else if let Some(id) = header(headers, SMG_ROUTING_KEY)? {
        (Some(id), "smg header")
    } else if let Some(id) = agent.and_then(|a| a.session_id.clone().or(a.trajectory_id.clone())) {
        (Some(id), "nvext")
    } else {
        (None, "none")
    };
    if c.cache_salt.as_deref() == Some("") {
        // vLLM: "Parameter 'cache_salt' must be a non-empty string if provided."
        return Err(ApiError::invalid(
            "cache_salt",
            "cache_salt must be a non-empty string if provided",
        ));
    }
    let parent = header(headers, DYNAMO_PARENT)?;
    if let Some(id) = &parent {
        check(id)?;
    }
    if let Some(id) = &program {
        check(id)?;
    }
    let final_request = c
        .final_request
        .or_else(|| extra.and_then(|e| e.final_request))
        .or(bool_header(headers, DYNAMO_FINAL)?)
        .or_else(|| agent.and_then(|a| a.trajectory_final))
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
    let (group, group_size, tool_name) = group_and_tool(c)?;
    tracing::debug!(program = ?program, source, final_request, tools = tool_resources.is_some(), ?group, "program resolved");
    Ok(ProgramRef {
        program,
        final_request,
        tool_resources,
        parent,
        cache_salt: c.cache_salt.clone(),
        group,
        group_size,
        tool_name,
    })
}

/// A header's value as text; 400 when it is not visible ASCII.
fn header(headers: &HeaderMap, name: &'static str) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get(name) else {
        return Ok(None);
    };
    let s = v
        .to_str()
        .map_err(|_| ApiError::invalid(name, format!("the {name} header must be visible ASCII")))?;
    Ok(Some(s.to_string()))
}

/// `true`/`false` (or `1`/`0`, any case); 400 otherwise.
fn bool_header(headers: &HeaderMap, name: &'static str) -> Result<Option<bool>, ApiError> {
    match header(headers, name)?.map(|s| s.to_ascii_lowercase()) {
        None => Ok(None),
        Some(s) if s == "true" || s == "1" => Ok(Some(true)),
        Some(s) if s == "false" || s == "0" => Ok(Some(false)),
        Some(_) => Err(ApiError::invalid(
            name,
            format!("the {name} header must be true or false"),
        )),
    }
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
