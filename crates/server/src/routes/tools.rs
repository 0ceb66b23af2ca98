//! Tool resources of a program (docs/design.md §10): `POST /programs/{id}/resources`,
//! `GET /programs/{id}`, `POST|GET /programs/{id}/environment`.

use std::time::Duration;

use agentd_tools::{EnvironmentSpec, ToolResources};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::app::{parse_json, SharedState};
use crate::error::ApiError;
use crate::program_id;
use crate::tenant::Caller;

/// Longest `?wait=` accepted, seconds.
const MAX_WAIT_S: f64 = 600.0;

/// Declares resources: the body is a `tool_resources` object
/// (`{"docker": [...], "dirs": [...], "pids": [...]}`) or `{"tool_resources": {...}}`.
pub async fn declare(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    program_id::check(&id)?;
    let key = Caller::current().program_key(&id);
    let v: Value = parse_json(&body)?;
    let v = v.get("tool_resources").cloned().unwrap_or(v);
    let spec = ToolResources::from_json(&v).map_err(|e| ApiError::tools("tool_resources", e))?;
    let declared = state
        .tools
        .declare(key.as_str(), &spec)
        .map_err(|e| ApiError::tools("tool_resources", e))?;
    tracing::info!(program = %key, resources = declared.len(), "tool resources declared");
    Ok(Json(json!({
        "program_id": id,
        "declared": declared.len(),
        "tool_resources": state.tools.registry.program(key.as_str()),
    })))
}

/// The program as the engine and the tool side see it; 404 if neither does.
pub async fn program(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    program_id::check(&id)?;
    let key = Caller::current().program_key(&id);
    let engine = state
        .engine
        .snapshot()
        .await
        .program(key.as_str())
        .map(|p| agentd_engine::ProgramStatus {
            id: id.clone(),
            ..p.clone()
        });
    let tools = state.tools.registry.program(key.as_str());
    let env = state.tools.environments.status(key.as_str()).map(|mut s| {
        s.program_id.clone_from(&id);
        s
    });
    if engine.is_none() && tools.is_none() && env.is_none() {
        return Err(ApiError::ProgramNotFound(id));
    }
    Ok(Json(json!({
        "id": id,
        "engine": engine,
        "tool_resources": tools,
        "environment": env,
    })))
}

/// Starts preparing the program's environment in the background: 202 with
/// the pending status.
pub async fn prepare(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    program_id::check(&id)?;
    let spec: EnvironmentSpec = serde_json::from_slice(&body).map_err(|e| {
        ApiError::invalid(
            "environment",
            format!("invalid environment spec: {e} (expected {{\"local\": {{\"command\", \"workdir\"?, \"timeout_s\"?}}}} or {{\"docker\": {{\"image\", \"cmd\"?, \"timeout_s\"?}}}})"),
        )
    })?;
    let key = Caller::current().program_key(&id);
    let mut status = state
        .tools
        .environments
        .start(key.as_str(), spec)
        .map_err(|e| ApiError::tools("environment", e))?;
    status.program_id = id;
    Ok((StatusCode::ACCEPTED, Json(status)).into_response())
}

#[derive(Debug, Deserialize)]
pub struct WaitQuery {
    wait: Option<String>,
}

/// The preparation status; `?wait=S` long-polls until it is no longer
/// pending or S seconds pass.
pub async fn environment(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    Query(q): Query<WaitQuery>,
) -> Result<Response, ApiError> {
    program_id::check(&id)?;
    let wait = match q.wait.as_deref() {
        None => 0.0,
        Some(w) => w
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && (0.0..=MAX_WAIT_S).contains(s))
            .ok_or_else(|| {
                ApiError::invalid(
                    "wait",
                    format!("wait must be a number of seconds in [0, {MAX_WAIT_S}]"),
                )
            })?,
    };
    let key = Caller::current().program_key(&id);
    let envs = &state.tools.environments;
    let status = if wait > 0.0 {
        envs.wait(key.as_str(), Duration::from_secs_f64(wait)).await
    } else {
        envs.status(key.as_str())
    };
    match status {
        Some(mut s) => {
            s.program_id.clone_from(&id);
            Ok(Json(s).into_response())
        }
        None => Err(ApiError::ProgramNotFound(id)),
    }
}
