//! vLLM's `POST /collective_rpc` in dev mode
//! (`vllm/entrypoints/serve/dev/rpc/api_router.py`): `{method, args?,
//! kwargs?, timeout?}` calls `method` on every worker and answers
//! `{"results": [one per worker]}`.
//!
//! agentd has no Python workers to call arbitrary methods on, so it serves
//! the method trainers call through this route on a stock vLLM:
//! `reload_weights` (vLLM's sleep-mode recipe after `/sleep?level=2` and
//! `/wake_up`; RL scripts after writing a checkpoint), with its
//! `weights_path` keyword (default: the directory the weights came from)
//! and `is_checkpoint_format` (only `true`: a checkpoint directory). The
//! load and swap are the other weight routes' ([`load_and_swap`]): no
//! sequence mixes two versions, no cached block crosses them, a refused
//! load leaves the old weights serving. The one "worker" answers `null`,
//! as vLLM's `reload_weights` does. Any other method (a trainer's worker
//! extension such as SkyRL's `update_weights_disk`) is a 400 that names
//! what is served, where vLLM would fail inside the worker.

use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Map, Value};

use super::sglang::control::load_and_swap;
use crate::app::{parse_json, SharedState};
use crate::error::ApiError;

/// The methods served, for the error that refuses the others.
const METHODS: &str = "reload_weights";

/// `POST /collective_rpc`.
pub async fn collective_rpc(
    State(state): State<SharedState>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let body: Map<String, Value> = parse_json(&body)?;
    let method = match body.get("method") {
        Some(Value::String(m)) => m.as_str(),
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(
                "method",
                "Missing 'method' in request body",
            ))
        }
        Some(_) => return Err(ApiError::invalid("method", "'method' must be a string")),
    };
    let args = match body.get("args") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(a)) => a.as_slice(),
        Some(_) => return Err(ApiError::invalid("args", "'args' must be a list")),
    };
    let kwargs = match body.get("kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(k)) => k.clone(),
        Some(_) => return Err(ApiError::invalid("kwargs", "'kwargs' must be an object")),
    };
    match body.get("timeout") {
        None | Some(Value::Null) | Some(Value::Number(_)) => {}
        Some(_) => return Err(ApiError::invalid("timeout", "'timeout' must be a number")),
    }
    match method {
        "reload_weights" => reload_weights(&state, args, kwargs).await,
        other => Err(ApiError::invalid(
            "method",
            format!(
                "collective_rpc method {other:?} is not served: agentd runs no Python \
                 workers; it serves {METHODS}"
            ),
        )),
    }
}

/// `reload_weights(weights_path=None, is_checkpoint_format=True)`.
async fn reload_weights(
    state: &SharedState,
    args: &[Value],
    mut kwargs: Map<String, Value>,
) -> Result<Json<Value>, ApiError> {
    if !args.is_empty() {
        return Err(ApiError::invalid(
            "args",
            "reload_weights takes keyword arguments only (weights_path, is_checkpoint_format)",
        ));
    }
    let path = match kwargs.remove("weights_path") {
        None | Some(Value::Null) => state.rl.model_path(),
        Some(Value::String(p)) if !p.is_empty() => p,
        Some(_) => {
            return Err(ApiError::invalid(
                "weights_path",
                "'weights_path' must be a non-empty directory path",
            ))
        }
    };
    match kwargs.remove("is_checkpoint_format") {
        None | Some(Value::Null) | Some(Value::Bool(true)) => {}
        Some(_) => {
            return Err(ApiError::invalid(
                "is_checkpoint_format",
                "only checkpoint-format weights (a safetensors directory) can be reloaded",
            ))
        }
    }
    if let Some(k) = kwargs.keys().next() {
        return Err(ApiError::invalid(
            "kwargs",
            format!("reload_weights has no keyword {k:?} (weights_path, is_checkpoint_format)"),
        ));
    }
    match load_and_swap(state, &path).await? {
        Ok(report) => {
            tracing::info!(
                path,
                paused = report.num_paused_requests,
                "collective_rpc reload_weights"
            );
            Ok(Json(json!({"results": [null]})))
        }
        Err(message) => {
            tracing::warn!(%message, "collective_rpc reload_weights refused");
            Err(ApiError::invalid("weights_path", message))
        }
    }
}
