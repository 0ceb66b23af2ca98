//! `GET /programs` and `POST /programs/release` (DESIGN §2).

use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use agentd_engine::ProgramStatus;

use crate::app::{parse_json, SharedState};
use crate::error::ApiError;
use crate::protocol::ReleaseRequest;

pub async fn list(State(state): State<SharedState>) -> Json<Vec<ProgramStatus>> {
    Json(state.engine.programs())
}

/// Ends a program: cancels its requests and frees its KV. 404 if unknown.
pub async fn release(
    State(state): State<SharedState>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let req: ReleaseRequest = parse_json(&body)?;
    if state.engine.release(&req.program_id) {
        // Its tool resources follow through the engine's end event.
        tracing::info!(program = %req.program_id, "program released by client");
        Ok(Json(
            json!({"released": true, "program_id": req.program_id}),
        ))
    } else if state
        .tools
        .registry
        .program(&req.program_id)
        .is_some_and(|p| p.ended.is_none())
    {
        // Resources declared for a program that never ran (or whose engine
        // side already ended): the release ends them directly.
        let n = state.tools.program_ended(&req.program_id, "released");
        tracing::info!(program = %req.program_id, reclaiming = n, "program known only to the tool registry released");
        Ok(Json(
            json!({"released": true, "program_id": req.program_id}),
        ))
    } else {
        Err(ApiError::ProgramNotFound(req.program_id))
    }
}
