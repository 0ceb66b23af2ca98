//! `GET /programs` and `POST /programs/release` (docs/design.md §2).

use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use agentd_engine::ProgramStatus;

use crate::app::{parse_json, SharedState};
use crate::error::ApiError;
use crate::protocol::ReleaseRequest;
use crate::tenant::{Caller, ProgramKey};

/// The caller's programs, under the ids the caller gave them.
pub async fn list(State(state): State<SharedState>) -> Json<Vec<ProgramStatus>> {
    let caller = Caller::current();
    // The engine's published snapshot: no engine lock here.
    let snapshot = state.engine.snapshot().await;
    let mine = snapshot
        .programs
        .iter()
        .filter_map(|p| {
            let id = caller.own(&p.id)?.to_string();
            Some(ProgramStatus { id, ..p.clone() })
        })
        .collect();
    Json(mine)
}

/// Ends a program: cancels its requests and frees its KV. 404 if unknown.
pub async fn release(
    State(state): State<SharedState>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let req: ReleaseRequest = parse_json(&body)?;
    let key = Caller::current().program_key(&req.program_id);
    if end(&state, &key) {
        tracing::info!(program = %req.program_id, "program released by client");
        Ok(Json(
            json!({"released": true, "program_id": req.program_id}),
        ))
    } else {
        // Its first request may be racing this release: that request will
        // run as the program's last.
        state.released.remember(&key);
        Err(ApiError::ProgramNotFound(req.program_id))
    }
}

/// Ends the program under `key` (the caller's tenant key): in the engine
/// (its tool resources follow through the engine's end event), or, when
/// the engine does not know it, in the tool registry (resources declared
/// for a program that never ran, or whose engine side already ended).
/// False when neither has it live. Shared by `/programs/release` and
/// vLLM's `/finish_session`.
pub(crate) fn end(state: &SharedState, key: &ProgramKey) -> bool {
    if state.engine.release(key.as_str()) {
        return true;
    }
    let live = state
        .tools
        .registry
        .program(key.as_str())
        .is_some_and(|p| p.ended.is_none());
    if live {
        let n = state.tools.program_ended(key.as_str(), "released");
        tracing::info!(program = %key, reclaiming = n, "program known only to the tool registry released");
    }
    live
}
