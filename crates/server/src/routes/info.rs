//! `GET /health`, `GET /v1/models`, `GET /metrics`.

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::Json;

use crate::app::SharedState;
use crate::metrics;
use crate::protocol::{unix_now, ModelCard, ModelList};

/// Liveness: 200 with an empty body, as vLLM. Never behind the API key, so
/// load balancers can probe it.
pub async fn health() -> impl IntoResponse {
    axum::http::StatusCode::OK
}

pub async fn models(State(state): State<SharedState>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![ModelCard {
            id: state.model_name.clone(),
            object: "model",
            created: unix_now(),
            owned_by: "agentd",
            root: state.model_root.clone(),
            max_model_len: state.max_model_len,
            sampling_defaults: (&state.sampling_defaults).into(),
            weight_version: state.rl.weight_version(),
        }],
    })
}

pub async fn metrics(State(state): State<SharedState>) -> impl IntoResponse {
    // A snapshot the engine's workers publish: no engine lock here.
    let snapshot = state.engine.snapshot().await;
    let mut text = metrics::render(&snapshot.metrics, &state.model_name);
    text.push_str(&metrics::render_tools(
        &state.tools.registry.metrics(),
        &state.model_name,
    ));
    if let Some(path) = &state.cpu_kernels {
        text.push_str(&metrics::render_cpu_kernels(path));
    }
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        text,
    )
}
