//! SGLang's `GET|POST /release_memory_occupation` and
//! `/resume_memory_occupation {tags}`: between rollouts a trainer gives the
//! engine's memory back (the KV pool, the weights) and takes it again.
//! As in SGLang's `http_server.py` the answer is 200 with a JSON `null`
//! body; SGLang asserts (and its scheduler dies) where agentd answers 400:
//! a release while requests run or wait, a resume of a tag not released.
//! The engine side is `crates/engine/src/memory.rs`.

use std::sync::Arc;

use agentd_engine::{ControlError, Engine, MemoryTags};
use agentd_runtime::LoadedModel;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::Value;

use super::control::{blocking, body_or_default};
use crate::app::SharedState;
use crate::error::ApiError;

/// SGLang's `ReleaseMemoryOccupationReqInput` / `ResumeMemoryOccupationReqInput`.
#[derive(Debug, Default, Deserialize)]
pub struct MemoryReq {
    #[serde(default)]
    tags: Option<Vec<String>>,
}

/// SGLang's tags; `None` for none or an empty list (SGLang: all of them).
/// `cuda_graph` is accepted and means nothing here (agentd captures no
/// CUDA graphs).
pub(crate) fn parse_tags<S: AsRef<str>>(tags: &[S]) -> Result<Option<MemoryTags>, ApiError> {
    if tags.is_empty() {
        return Ok(None);
    }
    let mut t = MemoryTags::default();
    for tag in tags {
        match tag.as_ref() {
            MemoryTags::KV_CACHE => t.kv_cache = true,
            MemoryTags::WEIGHTS => t.weights = true,
            "cuda_graph" => {}
            other => {
                return Err(ApiError::invalid(
                    "tags",
                    format!(
                        "unknown memory tag {other:?}: expected weights, kv_cache or cuda_graph"
                    ),
                ))
            }
        }
    }
    Ok(Some(t))
}

/// A refusal of a memory command as the 4xx/5xx it is. A runner that
/// cannot release (the CUDA runner, for now) is a 400 naming it.
pub(crate) fn control_error(e: ControlError) -> ApiError {
    match e {
        ControlError::ShuttingDown => ApiError::Unavailable(e.to_string()),
        ControlError::Swap { replica, message } => ApiError::Http {
            status: StatusCode::BAD_REQUEST,
            message: format!("replica {replica}: {message}"),
        },
        e => ApiError::Http {
            status: StatusCode::BAD_REQUEST,
            message: e.to_string(),
        },
    }
}

/// Releases `tags` (all when `None`); returns what was released now.
pub(crate) async fn release(
    engine: &Engine,
    tags: Option<MemoryTags>,
) -> Result<MemoryTags, ApiError> {
    let engine = engine.clone();
    let tags = tags.unwrap_or(MemoryTags::ALL);
    blocking(move || engine.release_memory(tags))
        .await?
        .map_err(control_error)
}

/// Resumes `tags` (what is released when `None`), reloading the weights
/// from the path they were last loaded from when they are among them.
pub(crate) async fn resume(state: &SharedState, tags: Option<MemoryTags>) -> Result<(), ApiError> {
    let released = state.engine.released_memory();
    let tags = tags.unwrap_or(released);
    if !tags.any() {
        return Err(control_error(ControlError::NotReleased(Vec::new())));
    }
    let missing = tags.minus(released);
    if missing.any() {
        return Err(control_error(ControlError::NotReleased(missing.names())));
    }
    let weights = match tags.weights {
        true => Some(load_weights(state).await?),
        false => None,
    };
    let engine = state.engine.clone();
    blocking(move || engine.resume_memory(tags, weights))
        .await?
        .map_err(control_error)
}

/// The serving checkpoint read again from disk (`/model_info`'s
/// `model_path`: the start's, or the last weight update's).
async fn load_weights(state: &SharedState) -> Result<Arc<dyn LoadedModel>, ApiError> {
    let (path, engine) = (state.rl.model_path(), state.engine.clone());
    let t = std::time::Instant::now();
    let shown = path.clone();
    let model = blocking(move || engine.load_weights(std::path::Path::new(&path)))
        .await?
        .map_err(|e| ApiError::Internal(format!("reloading the weights from {shown}: {e}")))?;
    tracing::info!(path = %shown, seconds = t.elapsed().as_secs_f64(), "weights reloaded");
    Ok(model)
}

/// `GET|POST /release_memory_occupation {tags?}`.
pub async fn release_memory_occupation(
    State(state): State<SharedState>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let req: MemoryReq = body_or_default(&body)?;
    let tags = parse_tags(req.tags.as_deref().unwrap_or_default())?;
    release(&state.engine, tags).await?;
    Ok(Json(Value::Null))
}

/// `GET|POST /resume_memory_occupation {tags?}`.
pub async fn resume_memory_occupation(
    State(state): State<SharedState>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let req: MemoryReq = body_or_default(&body)?;
    let tags = parse_tags(req.tags.as_deref().unwrap_or_default())?;
    resume(&state, tags).await?;
    Ok(Json(Value::Null))
}
