//! vLLM's dev-mode routes, served when `VLLM_SERVER_DEV_MODE=1` (vLLM's
//! switch; `agentd serve` reads it, [`dev_mode_from_env`]), as RL trainers
//! drive vLLM (SkyRL, prime-rl, AReaL's vLLM path). Paths, query
//! parameters and bodies as in `vllm/entrypoints/serve/dev/`
//! (`rlhf/api_router.py`: `/pause`, `/resume`, `/is_paused`, `/abort_requests`,
//! `/get_world_size`, `/weight_info`; `sleep/api_router.py`: `/sleep`,
//! `/wake_up`, `/is_sleeping`; `cache/api_router.py`:
//! `/reset_prefix_cache`), mapped onto the same engine controls as
//! SGLang's routes. Errors are the server's JSON errors.

use agentd_engine::{MemoryTags, PauseMode};
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use super::sglang::control::blocking;
use super::sglang::memory::{parse_tags, release, resume};
use crate::app::SharedState;
use crate::error::ApiError;

/// `VLLM_SERVER_DEV_MODE` as vLLM reads it (`bool(int(...))`, unset = 0).
pub fn dev_mode_from_env() -> Result<bool, String> {
    parse_dev_mode(std::env::var("VLLM_SERVER_DEV_MODE").ok().as_deref())
}

fn parse_dev_mode(v: Option<&str>) -> Result<bool, String> {
    match v {
        None => Ok(false),
        Some(v) => v
            .trim()
            .parse::<i64>()
            .map(|n| n != 0)
            .map_err(|_| format!("VLLM_SERVER_DEV_MODE={v:?} is not an integer")),
    }
}

/// The dev-mode routes (merged into the protected router).
pub fn router() -> Router<SharedState> {
    Router::new()
        .route("/pause", post(pause))
        .route("/resume", post(resume_generation))
        .route("/is_paused", get(is_paused))
        .route("/abort_requests", post(abort_requests))
        .route("/sleep", post(sleep))
        .route("/wake_up", post(wake_up))
        .route("/is_sleeping", get(is_sleeping))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .route("/get_world_size", get(get_world_size))
        .route("/weight_info", get(weight_info))
        .route("/collective_rpc", post(super::vllm_rpc::collective_rpc))
        .merge(super::vllm_weights::router())
}

/// A query string's pairs, percent-decoded (`+` is a space).
pub(crate) fn query_pairs(q: Option<&str>) -> Result<Vec<(String, String)>, ApiError> {
    let decode = |s: &str| -> Result<String, ApiError> {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' => {
                    let hex = bytes
                        .get(i + 1..i + 3)
                        .and_then(|h| std::str::from_utf8(h).ok())
                        .and_then(|h| u8::from_str_radix(h, 16).ok())
                        .ok_or_else(|| {
                            ApiError::invalid("query", format!("bad percent-escape in {s:?}"))
                        })?;
                    out.push(hex);
                    i += 2;
                }
                b => out.push(b),
            }
            i += 1;
        }
        String::from_utf8(out)
            .map_err(|_| ApiError::invalid("query", format!("{s:?} is not UTF-8")))
    };
    q.unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            Ok((decode(k)?, decode(v)?))
        })
        .collect()
}

/// The last value of `key`, if given.
pub(crate) fn param<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// A boolean query parameter as FastAPI parses one.
fn flag(pairs: &[(String, String)], key: &'static str, default: bool) -> Result<bool, ApiError> {
    match param(pairs, key).map(str::to_ascii_lowercase).as_deref() {
        None => Ok(default),
        Some("1" | "true" | "yes" | "on") => Ok(true),
        Some("0" | "false" | "no" | "off") => Ok(false),
        Some(other) => Err(ApiError::invalid(
            key,
            format!("{key}={other:?} is not a boolean"),
        )),
    }
}

/// vLLM's `PauseMode`: `abort` (default), `wait`, `keep`.
fn pause_mode(pairs: &[(String, String)]) -> Result<PauseMode, ApiError> {
    match param(pairs, "mode").unwrap_or("abort") {
        "abort" => Ok(PauseMode::Abort),
        "wait" => Ok(PauseMode::Wait),
        "keep" => Ok(PauseMode::InPlace),
        other => Err(ApiError::invalid(
            "mode",
            format!("Invalid mode: '{other}'. Expected one of ['abort', 'wait', 'keep']."),
        )),
    }
}

/// `POST /pause?mode=abort|wait|keep&clear_cache=true`: `{"status":
/// "paused"}` once the engine paused; with `abort` or `wait` (nothing left
/// running) the prefix cache is then cleared unless `clear_cache=false`.
async fn pause(
    State(state): State<SharedState>,
    RawQuery(q): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let pairs = query_pairs(q.as_deref())?;
    let mode = pause_mode(&pairs)?;
    // vLLM's deprecated spelling of mode=wait.
    let mode = match flag(&pairs, "wait_for_inflight_requests", false)? {
        true if mode == PauseMode::Abort => PauseMode::Wait,
        _ => mode,
    };
    let clear = flag(&pairs, "clear_cache", true)? && mode != PauseMode::InPlace;
    let engine = state.engine.clone();
    blocking(move || {
        engine.pause(mode);
        if clear {
            // Nothing runs or waits after abort or wait.
            if let Err(e) = engine.flush_cache() {
                tracing::warn!(error = %e, "pause: the prefix cache was not cleared");
            }
        }
    })
    .await?;
    Ok(Json(json!({"status": "paused"})))
}

/// `POST /resume`: `{"status": "resumed"}`.
async fn resume_generation(State(state): State<SharedState>) -> Json<Value> {
    state.engine.resume();
    Json(json!({"status": "resumed"}))
}

#[derive(Debug, Default, serde::Deserialize)]
struct AbortRequestsReq {
    #[serde(default)]
    request_ids: Option<Vec<String>>,
}

/// `POST /abort_requests {request_ids?}`: `{"status": "aborted",
/// "aborted": n}` without pausing; no ids aborts everything in the engine.
/// Ids are the `rid`s of `/generate` requests and the `request_id`s of
/// `/inference/v1/generate` requests in flight (unknown ones are counted,
/// as vLLM counts the ids it was given).
async fn abort_requests(
    State(state): State<SharedState>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let req: AbortRequestsReq = super::sglang::control::body_or_default(&body)?;
    let aborted = match req.request_ids.filter(|ids| !ids.is_empty()) {
        Some(ids) => {
            for id in &ids {
                state.rl.abort(id);
            }
            ids.len()
        }
        None => state.engine.abort_all(),
    };
    Ok(Json(json!({"status": "aborted", "aborted": aborted})))
}

/// `GET /is_paused`: `{"is_paused": bool}`.
async fn is_paused(State(state): State<SharedState>) -> Json<Value> {
    Json(json!({"is_paused": state.engine.paused().is_some()}))
}

/// `POST /sleep?level=1|2&mode=abort|wait|keep`: 200, empty. Level 1
/// (vLLM: weights offloaded to host memory, KV discarded) frees the KV
/// pool, the weights being in host memory already on the CPU; level 2
/// (weights discarded too) also drops the weights, which `/wake_up`
/// reloads from the path they came from. What runs is aborted (or, with
/// `wait`, finishes) first; `keep` is refused: kept requests hold KV.
async fn sleep(
    State(state): State<SharedState>,
    RawQuery(q): RawQuery,
) -> Result<StatusCode, ApiError> {
    let pairs = query_pairs(q.as_deref())?;
    let tags = match param(&pairs, "level").unwrap_or("1") {
        "1" => MemoryTags {
            kv_cache: true,
            weights: false,
        },
        "2" => MemoryTags::ALL,
        other => {
            return Err(ApiError::invalid(
                "level",
                format!("sleep level must be 1 or 2, got {other:?}"),
            ))
        }
    };
    let mode = pause_mode(&pairs)?;
    if mode == PauseMode::InPlace {
        return Err(ApiError::invalid(
            "mode",
            "mode=keep cannot sleep: kept requests hold the KV cache a sleep frees",
        ));
    }
    let engine = state.engine.clone();
    let was_paused = engine.paused();
    blocking(move || engine.pause(mode)).await?;
    let released = release(&state.engine, Some(tags)).await;
    // The pause only drained the engine: the release holds new submissions
    // now (until /wake_up); a pause the trainer made stays.
    if was_paused.is_none() {
        state.engine.resume();
    }
    released?;
    Ok(StatusCode::OK)
}

/// `POST /wake_up?tags=weights&tags=kv_cache`: 200, empty; no tags wakes
/// everything asleep.
async fn wake_up(
    State(state): State<SharedState>,
    RawQuery(q): RawQuery,
) -> Result<StatusCode, ApiError> {
    let pairs = query_pairs(q.as_deref())?;
    let tags: Vec<&str> = pairs
        .iter()
        .filter(|(k, _)| k == "tags")
        .map(|(_, v)| v.as_str())
        .collect();
    let tags = parse_tags(&tags)?;
    resume(&state, tags).await?;
    Ok(StatusCode::OK)
}

/// `GET /is_sleeping`: `{"is_sleeping": bool}`.
async fn is_sleeping(State(state): State<SharedState>) -> Json<Value> {
    Json(json!({"is_sleeping": state.engine.released_memory().any()}))
}

/// `POST /reset_prefix_cache`: `{"success": bool}`, false (as in vLLM)
/// while requests run or wait.
async fn reset_prefix_cache(
    State(state): State<SharedState>,
    RawQuery(q): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let pairs = query_pairs(q.as_deref())?;
    // Running requests keep their blocks either way; no external cache.
    flag(&pairs, "reset_running_requests", false)?;
    flag(&pairs, "reset_external", false)?;
    let ok = state.engine.flush_cache().is_ok();
    Ok(Json(json!({"success": ok})))
}

/// `GET /get_world_size`: 1 (one process; replicas are data parallel
/// inside it).
async fn get_world_size(RawQuery(q): RawQuery) -> Result<Json<Value>, ApiError> {
    let pairs = query_pairs(q.as_deref())?;
    flag(&pairs, "include_dp", true)?;
    Ok(Json(json!({"world_size": 1})))
}

/// `GET /weight_info`: `{"weight_version": ...}`.
async fn weight_info(State(state): State<SharedState>) -> Json<Value> {
    Json(json!({"weight_version": state.rl.weight_version()}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_mode_switch_and_query_strings() {
        assert_eq!(parse_dev_mode(None), Ok(false));
        assert_eq!(parse_dev_mode(Some("0")), Ok(false));
        assert_eq!(parse_dev_mode(Some(" 1 ")), Ok(true));
        assert!(parse_dev_mode(Some("yes")).is_err());
        let pairs = query_pairs(Some("tags=weights&tags=kv%5Fcache&mode=a+b&x")).unwrap();
        let tags: Vec<&str> = pairs
            .iter()
            .filter(|(k, _)| k == "tags")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(tags, ["weights", "kv_cache"]);
        assert_eq!(param(&pairs, "mode"), Some("a b"));
        assert_eq!(param(&pairs, "x"), Some(""));
        assert!(query_pairs(Some("a=%f")).is_err());
        assert!(query_pairs(Some("a=%ff")).is_err(), "not UTF-8");
    }
}
