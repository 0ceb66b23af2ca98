//! SGLang's control routes (`python/sglang/srt/entrypoints/http_server.py`):
//! what an RL trainer calls between rollouts. Bodies, status codes and
//! response shapes as SGLang's; the engine side is `agentd_engine`'s
//! control commands (`crates/engine/src/control.rs`).

use std::time::Duration;

use agentd_engine::{ControlError, GenerateRequest, PauseMode, SwapReport};
use agentd_runtime::SamplingParams;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::app::{parse_json, SharedState};
use crate::error::ApiError;

/// SGLang's `HEALTH_CHECK_TIMEOUT` default.
const HEALTH_CHECK_TIMEOUT: Duration = Duration::from_secs(20);

/// A body that may be empty (SGLang's optional request models): `{}` then.
pub(crate) fn body_or_default<T: for<'de> Deserialize<'de> + Default>(
    body: &Bytes,
) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    parse_json(body)
}

/// Runs a blocking engine command on the blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::Internal(format!("engine command failed: {e}")))
}

#[derive(Debug, Default, Deserialize)]
pub struct AbortReq {
    #[serde(default)]
    rid: Option<String>,
    #[serde(default)]
    abort_all: bool,
}

/// `POST /abort_request {rid | abort_all}`: 200 with an empty body; an
/// unknown `rid` is a no-op, as in SGLang. The aborted requests finish
/// with `finish_reason.type == "abort"` and what they had generated.
pub async fn abort_request(
    State(state): State<SharedState>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: AbortReq = body_or_default(&body)?;
    if req.abort_all {
        let n = state.engine.abort_all();
        tracing::info!(requests = n, "abort_request: abort_all");
    } else if let Some(rid) = req.rid.as_deref().filter(|r| !r.is_empty()) {
        let found = state.rl.abort(rid);
        tracing::info!(rid, found, "abort_request");
    }
    Ok(StatusCode::OK.into_response())
}

#[derive(Debug, Default, Deserialize)]
pub struct PauseReq {
    mode: Option<String>,
}

/// `POST /pause_generation {mode: abort|retract|in_place}` (default
/// `abort`); returns once the engine has paused.
pub async fn pause_generation(
    State(state): State<SharedState>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let req: PauseReq = body_or_default(&body)?;
    let mode = match req.mode.as_deref().unwrap_or("abort") {
        "abort" => PauseMode::Abort,
        "retract" => PauseMode::Retract,
        "in_place" => PauseMode::InPlace,
        other => {
            return Err(ApiError::invalid(
                "mode",
                format!(
                    "Invalid mode: '{other}'. Expected one of ['abort', 'retract', 'in_place']."
                ),
            ))
        }
    };
    let engine = state.engine.clone();
    blocking(move || engine.pause(mode)).await?;
    Ok(Json(
        json!({"message": "Generation paused successfully.", "status": "ok"}),
    ))
}

/// `POST /continue_generation`.
pub async fn continue_generation(
    State(state): State<SharedState>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    // SGLang's body (`torch_empty_cache`) has nothing to do here.
    let _: Option<Value> = body_or_default(&body)?;
    state.engine.resume();
    Ok(Json(
        json!({"message": "Generation continued successfully.", "status": "ok"}),
    ))
}

/// `GET|POST /flush_cache`: refused (400) while requests run or wait.
pub async fn flush_cache(State(state): State<SharedState>) -> Result<Response, ApiError> {
    match state.engine.flush_cache() {
        Ok(_) => Ok((
            StatusCode::OK,
            "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n",
        )
            .into_response()),
        Err(e) => Err(ApiError::Http {
            status: StatusCode::BAD_REQUEST,
            message: format!("Cache not flushed: {e}"),
        }),
    }
}

/// `GET /model_info` (and SGLang's older `/get_model_info`).
pub async fn model_info(State(state): State<SharedState>) -> Json<Value> {
    Json(json!({
        "model_path": state.rl.model_path(),
        "tokenizer_path": state.model_root,
        "is_generation": true,
        "preferred_sampling_params": Value::Null,
        "weight_version": state.rl.weight_version(),
        "has_image_understanding": false,
        "has_audio_understanding": false,
        "model_type": state.model_type(),
    }))
}

/// `GET /server_info` (and `/get_server_info`): the serving parameters a
/// client reads, by SGLang's names.
pub async fn server_info(State(state): State<SharedState>) -> Json<Value> {
    let paused = state.engine.paused().map(|m| m.as_str());
    Json(json!({
        "model_path": state.rl.model_path(),
        "tokenizer_path": state.model_root,
        "served_model_name": state.model_name,
        "context_length": state.max_model_len,
        "weight_version": state.rl.weight_version(),
        "tp_size": 1,
        "dp_size": 1,
        "version": env!("CARGO_PKG_VERSION"),
        "internal_states": [{
            "paused": paused,
            "num_requests": state.engine.num_requests(),
            "memory_released": state.engine.released_memory().names(),
        }],
    }))
}

/// `GET /weight_version` (and `/get_weight_version`).
pub async fn weight_version(State(state): State<SharedState>) -> Json<Value> {
    Json(json!({"weight_version": state.rl.weight_version()}))
}

#[derive(Debug, Deserialize)]
pub struct UpdateWeightVersionReq {
    new_version: String,
    #[serde(default = "yes")]
    abort_all_requests: bool,
}

fn yes() -> bool {
    true
}

/// `POST /update_weight_version {new_version, abort_all_requests=true}`.
pub async fn update_weight_version(
    State(state): State<SharedState>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let req: UpdateWeightVersionReq = parse_json(&body)?;
    if req.abort_all_requests {
        state.engine.abort_all();
    }
    state.rl.set_weight_version(req.new_version.clone());
    Ok(Json(json!({
        "success": true,
        "message": format!("Weight version updated to {}", req.new_version),
        "new_version": req.new_version,
    })))
}

/// `GET /health_generate`: one greedy token from `input_ids [0]`; 200 once
/// the engine answers, 503 when it does not within 20 s (a paused engine
/// does not answer).
pub async fn health_generate(State(state): State<SharedState>) -> StatusCode {
    let req = GenerateRequest {
        prompt: vec![0],
        sampling: SamplingParams {
            max_tokens: 1,
            ..SamplingParams::greedy()
        },
        ..GenerateRequest::default()
    };
    let Ok(mut stream) = state.engine.submit(req) else {
        return StatusCode::SERVICE_UNAVAILABLE;
    };
    match tokio::time::timeout(HEALTH_CHECK_TIMEOUT, stream.next()).await {
        Ok(Some(_)) => StatusCode::OK,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

#[derive(Debug, Deserialize)]
pub struct UpdateWeightsFromDiskReq {
    model_path: String,
    load_format: Option<String>,
    #[serde(default = "yes")]
    flush_cache: bool,
    #[serde(default)]
    abort_all_requests: bool,
    weight_version: Option<String>,
}

/// `POST /update_weights_from_disk`: `{success, message,
/// num_paused_requests}`, 200 or 400. The checkpoint is read on the
/// blocking pool, outside the engine lock; the engine swaps it in between
/// steps once what was submitted before has finished (or at once when
/// paused) and flushes the cache. A bad path, another architecture or a
/// tensor of the wrong shape is a 400 with the old weights still serving.
pub async fn update_weights_from_disk(
    State(state): State<SharedState>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: UpdateWeightsFromDiskReq = parse_json(&body)?;
    let fail = |message: String| {
        tracing::warn!(%message, "update_weights_from_disk refused");
        (
            StatusCode::BAD_REQUEST,
            Json(json!({"success": false, "message": message, "num_paused_requests": 0})),
        )
            .into_response()
    };
    match req.load_format.as_deref() {
        None | Some("auto") | Some("safetensors") => {}
        Some(other) => {
            return Ok(fail(format!(
                "load_format {other:?} is not supported (auto or safetensors)"
            )))
        }
    }
    if !req.flush_cache {
        tracing::info!(
            "flush_cache=false: the cache is flushed anyway, so no block crosses weight versions"
        );
    }
    if req.abort_all_requests {
        state.engine.abort_all();
    }
    let report = match load_and_swap(&state, &req.model_path).await? {
        Ok(r) => r,
        Err(message) => return Ok(fail(message)),
    };
    let mut message = "Succeeded to update model weights.".to_string();
    if let Some(v) = req.weight_version {
        message.push_str(&format!(" Weight version updated to {v}."));
        state.rl.set_weight_version(v);
    }
    Ok(Json(json!({
        "success": true,
        "message": message,
        "num_paused_requests": report.num_paused_requests,
    }))
    .into_response())
}

/// Loads the checkpoint in the directory `path` on the blocking pool,
/// outside the engine lock, and swaps it in: the engine does so between
/// steps once what was submitted before has finished (or at once when
/// paused) and flushes the cache, so no sequence and no cached block mixes
/// two versions. The one weight update of SGLang's and vLLM's routes.
/// `Ok(Err(message))` is a refusal (a bad path, another architecture, a
/// tensor of the wrong shape, requests paused in place): the old weights
/// still serve.
pub(crate) async fn load_and_swap(
    state: &SharedState,
    path: &str,
) -> Result<Result<SwapReport, String>, ApiError> {
    let (dir, engine) = (path.to_string(), state.engine.clone());
    let t = std::time::Instant::now();
    let loaded = blocking(move || engine.load_weights(std::path::Path::new(&dir))).await?;
    let model = match loaded {
        Ok(m) => m,
        Err(e) => {
            return Ok(Err(format!(
                "Failed to load the weights from {path}: {e}. The old weights are still serving."
            )))
        }
    };
    let load_s = t.elapsed().as_secs_f64();
    let engine = state.engine.clone();
    let report = match blocking(move || engine.swap_weights(model)).await? {
        Ok(r) => r,
        Err(e @ (ControlError::Incompatible(_) | ControlError::PausedInPlace { .. })) => {
            return Ok(Err(format!("{e}. The old weights are still serving.")))
        }
        Err(e) => return Ok(Err(e.to_string())),
    };
    tracing::info!(
        path,
        load_s,
        swap_s = t.elapsed().as_secs_f64() - load_s,
        "weights updated from disk"
    );
    state.rl.set_model_path(path.to_string());
    Ok(Ok(report))
}
