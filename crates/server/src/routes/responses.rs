//! OpenAI's Responses API: `POST /v1/responses` (whole, streamed or in the
//! background), `GET /v1/responses/{id}`, `DELETE /v1/responses/{id}` and
//! `POST /v1/responses/{id}/cancel`. See [`crate::responses`].

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream;
use serde_json::{json, Value};

use crate::app::{parse_json, SharedState};
use crate::error::ApiError;
use crate::responses::protocol::ResponsesRequest;
use crate::responses::run::{drive, prepare, release_all};
use crate::sse;
use crate::tenant::Caller;

pub async fn create(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: ResponsesRequest = parse_json(&body)?;
    crate::fields::check(&req.common.extra, crate::fields::Endpoint::Responses)?;
    let (stream, background) = (req.common.stream, req.background);
    // Rendering the conversation and tokenizing it is CPU work: on the
    // blocking pool, in the caller's tenant scope (as chat completions).
    let prepared = {
        let (state, caller) = (state.clone(), Caller::current());
        crate::offload::run(move || caller.scope_sync(|| prepare(&state, &headers, req))).await?
    };
    if background {
        let object = prepared.object.clone();
        tokio::spawn(drive(state, prepared, |_| true));
        return Ok(Json(object).into_response());
    }
    if !stream {
        let object = drive(state, prepared, |_| true).await;
        return Ok(Json(object).into_response());
    }
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
    tokio::spawn(async move {
        let mut seq = 0u64;
        drive(state, prepared, move |events| {
            events.into_iter().all(|mut e| {
                e["sequence_number"] = json!(seq);
                seq += 1;
                let name = e["type"].as_str().unwrap_or("response.event").to_string();
                tx.send(sse::named_event(&name, &e)).is_ok()
            })
        })
        .await;
    });
    let events = stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
    Ok(sse::response(events))
}

pub async fn retrieve(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let (found, ended) = state.responses.get(&id, Caller::current());
    release_all(&state, ended);
    let stored = found.ok_or(ApiError::ResponseNotFound(id))?;
    Ok(Json(stored.object).into_response())
}

pub async fn delete(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let caller = Caller::current();
    let (_, ended) = state
        .responses
        .remove(&id, caller)
        .ok_or_else(|| ApiError::ResponseNotFound(id.clone()))?;
    state.responses.cancel(&id, caller);
    release_all(&state, ended.into_iter().collect());
    Ok(Json(
        json!({"id": id, "object": "response.deleted", "deleted": true}),
    ))
}

/// Cancels a running response; the response object as it then stands
/// (`cancelled`, with the output generated so far, once its task noticed).
pub async fn cancel(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let caller = Caller::current();
    let (found, _) = state.responses.get(&id, caller);
    let stored = found.ok_or_else(|| ApiError::ResponseNotFound(id.clone()))?;
    if stored.object.status.is_final() {
        return Err(ApiError::invalid(
            "response_id",
            format!(
                "response '{id}' has already finished; only a running response can be cancelled"
            ),
        ));
    }
    state.responses.cancel(&id, caller);
    // The generating task stores the cancelled object within a step.
    for _ in 0..200 {
        let (found, _) = state.responses.get(&id, caller);
        match found {
            Some(s) if s.object.status.is_final() => return Ok(Json(s.object).into_response()),
            None => break,
            Some(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
        }
    }
    let mut object = stored.object;
    object.status = crate::responses::protocol::Status::Cancelled;
    Ok(Json(object).into_response())
}
