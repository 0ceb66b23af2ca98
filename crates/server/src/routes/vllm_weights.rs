//! vLLM's weight-transfer routes in dev mode
//! (`vllm/entrypoints/serve/dev/rlhf/api_router.py`) with the semantics of
//! vLLM's shared-disk backend (`vllm/distributed/weight_transfer/
//! disk_engine.py`), the one that reads a checkpoint directory:
//! `/init_weight_transfer_engine {init_info}`, `/start_weight_update`,
//! `/update_weights {update_info: {path}}`, `/finish_weight_update
//! {weight_version?}`, each answering vLLM's `{"message": ...}`. vLLM has
//! no route that takes a directory in one call: its `/update_weights` is
//! this backend's middle step. The load and swap are SGLang's
//! `update_weights_from_disk` ([`load_and_swap`]): no sequence mixes two
//! versions, no cached block crosses them, and a refused update leaves the
//! old weights serving. Unlike vLLM, `/update_weights` also works outside
//! a start/finish session (it then is the whole update).

use std::path::Path;

use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::sglang::control::{body_or_default, load_and_swap};
use crate::app::{parse_json, SharedState};
use crate::error::ApiError;

/// The dev-mode weight routes (merged into [`super::vllm_dev::router`]).
pub fn router() -> axum::Router<SharedState> {
    use axum::routing::post;
    axum::Router::new()
        .route("/init_weight_transfer_engine", post(init))
        .route("/start_weight_update", post(start))
        .route("/update_weights", post(update_weights))
        .route("/finish_weight_update", post(finish))
}

/// A body vLLM reads with `body.get(key)`: a JSON object with `key`.
fn required(body: &Bytes, key: &'static str) -> Result<Value, ApiError> {
    let v: Map<String, Value> = parse_json(body)?;
    match v.get(key) {
        Some(x) if !x.is_null() => Ok(x.clone()),
        _ => Err(ApiError::invalid(
            key,
            format!("Missing '{key}' in request body"),
        )),
    }
}

/// `POST /init_weight_transfer_engine {init_info}`: the disk backend needs
/// no rendezvous; the body is checked as vLLM checks it.
async fn init(body: Bytes) -> Result<Json<Value>, ApiError> {
    required(&body, "init_info")?;
    Ok(Json(json!({"message": "Weight transfer initialized"})))
}

/// `POST /start_weight_update`: opens a session for one checkpoint; 409
/// while one is open (vLLM: "already active").
async fn start(State(state): State<SharedState>) -> Result<Json<Value>, ApiError> {
    let mut session = state.rl.weight_session();
    if session.is_some() {
        return Err(ApiError::Conflict(
            "A shared-disk weight update is already active".into(),
        ));
    }
    *session = Some(false);
    Ok(Json(json!({"message": "Weight update started"})))
}

/// vLLM's `DiskWeightTransferUpdateInfo`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DiskUpdateInfo {
    path: Option<String>,
}

/// The checkpoint directory of `update_info`, checked as vLLM's disk
/// backend checks it: a non-empty absolute path of a directory holding
/// `.safetensors` files.
fn checkpoint_dir(update_info: Value) -> Result<String, ApiError> {
    let info: DiskUpdateInfo = serde_json::from_value(update_info).map_err(|e| {
        ApiError::invalid(
            "update_info",
            format!(
                "update_info: {e}. This server loads weights from a checkpoint directory \
                 (vLLM's disk backend: {{\"path\": \"/abs/dir\"}}); the nccl and ipc \
                 backends' fields are not supported"
            ),
        )
    })?;
    let path = info.path.filter(|p| !p.is_empty()).ok_or_else(|| {
        ApiError::invalid(
            "path",
            "`path` must be a non-empty absolute local directory",
        )
    })?;
    let dir = Path::new(&path);
    if !dir.is_absolute() {
        return Err(ApiError::invalid(
            "path",
            "`path` must be an absolute local directory",
        ));
    }
    if !dir.is_dir() {
        return Err(ApiError::invalid(
            "path",
            format!("Shared-disk checkpoint path must be a local directory: {path}"),
        ));
    }
    let has_safetensors = std::fs::read_dir(dir)
        .map_err(|e| ApiError::invalid("path", format!("cannot read {path}: {e}")))?
        .filter_map(Result::ok)
        .any(|e| {
            e.file_name().to_string_lossy().ends_with(".safetensors")
                && e.file_type().is_ok_and(|t| t.is_file())
        });
    if !has_safetensors {
        return Err(ApiError::invalid(
            "path",
            format!("Shared-disk checkpoint directory contains no safetensors files: {path}"),
        ));
    }
    Ok(path)
}

/// `POST /update_weights {update_info: {path}}`: `{"message": "Weights
/// updated"}` once the checkpoint serves. A bad path, another architecture
/// or a tensor of the wrong shape is a 400 with the old weights serving;
/// so is a second checkpoint in one session (vLLM: "exactly one").
async fn update_weights(
    State(state): State<SharedState>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let path = checkpoint_dir(required(&body, "update_info")?)?;
    if *state.rl.weight_session() == Some(true) {
        return Err(ApiError::Conflict(
            "The disk backend accepts exactly one checkpoint per update session".into(),
        ));
    }
    match load_and_swap(&state, &path).await? {
        Ok(report) => {
            let mut session = state.rl.weight_session();
            if session.is_some() {
                *session = Some(true);
            }
            tracing::info!(path, paused = report.num_paused_requests, "update_weights");
            Ok(Json(json!({"message": "Weights updated"})))
        }
        Err(message) => {
            tracing::warn!(%message, "update_weights refused");
            Err(ApiError::invalid("update_info", message))
        }
    }
}

#[derive(Debug, Default, Deserialize)]
struct FinishReq {
    weight_version: Option<String>,
}

/// `POST /finish_weight_update {weight_version?}`: closes the session and
/// names the new weights' version (`/weight_info`, `/v1/models`). 409
/// without a session, or when it loaded nothing (vLLM raises both).
async fn finish(State(state): State<SharedState>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let req: FinishReq = body_or_default(&body)?;
    let mut session = state.rl.weight_session();
    let loaded = session
        .take()
        .ok_or_else(|| ApiError::Conflict("No shared-disk weight update is active".into()))?;
    if !loaded {
        return Err(ApiError::Conflict(
            "No checkpoint was loaded during the shared-disk update session".into(),
        ));
    }
    if let Some(v) = req.weight_version {
        state.rl.set_weight_version(v);
    }
    Ok(Json(json!({"message": "Weight update finished"})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn update_info_is_the_disk_backends() {
        let err = |v: Value| checkpoint_dir(v).unwrap_err().to_string();
        assert!(
            err(json!({"names": ["w"], "dtype_names": ["bf16"], "shapes": [[1]]}))
                .contains("disk backend")
        );
        assert!(err(json!({})).contains("non-empty"));
        assert!(err(json!({"path": "rel/dir"})).contains("absolute"));
        assert!(err(json!({"path": "/nonexistent/ckpt"})).contains("must be a local directory"));
        let empty = std::env::temp_dir();
        let e = err(json!({"path": empty.join("agentd-no-such-dir-7").display().to_string()}));
        assert!(e.contains("local directory"), "{e}");
    }
}
