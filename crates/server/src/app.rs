//! The server's shared state, its router and the accept loop.

use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use agentd_chat::ChatTemplate;
use agentd_engine::Engine;
use agentd_models::Tokenizer;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::routes;

/// Everything the handlers share.
pub struct AppState {
    pub engine: Engine,
    pub tokenizer: Arc<Tokenizer>,
    /// `None` when the model ships no chat template: chat requests get a 400
    /// saying so, text completions still work.
    pub template: Option<ChatTemplate>,
    /// The name clients must use in `model` (`--served-model-name`).
    pub model_name: String,
    /// Where the weights came from (`/v1/models` `root`).
    pub model_root: String,
    pub max_model_len: usize,
    pub api_key: Option<String>,
    next_id: AtomicU64,
}

pub type SharedState = Arc<AppState>;

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("cannot load the tokenizer of {dir}: {source}")]
    Tokenizer {
        dir: String,
        source: agentd_models::ModelError,
    },
    #[error("cannot load the chat template of {dir}: {source}")]
    Template {
        dir: String,
        source: agentd_chat::ChatError,
    },
}

impl AppState {
    /// State for `engine`, serving the model in `model_dir` (its tokenizer
    /// and chat template) under `model_name`.
    pub fn new(
        engine: Engine,
        model_dir: &Path,
        model_name: String,
        api_key: Option<String>,
    ) -> Result<Self, SetupError> {
        let dir = model_dir.display().to_string();
        let tokenizer = Tokenizer::from_dir(model_dir).map_err(|source| SetupError::Tokenizer {
            dir: dir.clone(),
            source,
        })?;
        let config = model_dir.join("tokenizer_config.json");
        let template = if config.is_file() {
            Some(
                ChatTemplate::from_tokenizer_config_file(&config).map_err(|source| {
                    SetupError::Template {
                        dir: dir.clone(),
                        source,
                    }
                })?,
            )
        } else {
            tracing::warn!(
                dir,
                "no tokenizer_config.json: chat completions are disabled"
            );
            None
        };
        let max_model_len = engine.max_model_len();
        Ok(AppState {
            engine,
            tokenizer: Arc::new(tokenizer),
            template,
            model_name,
            model_root: dir,
            max_model_len,
            api_key,
            next_id: AtomicU64::new(0),
        })
    }

    /// A response id such as `chatcmpl-18c2f...-7`: unique per process run.
    pub fn request_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        format!("{prefix}-{t:x}{n}")
    }

    /// 404 unless `model` is absent or the served name.
    pub fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            Some(m) if m != self.model_name => {
                tracing::debug!(requested = m, served = %self.model_name, "unknown model");
                Err(ApiError::ModelNotFound(m.to_string()))
            }
            _ => Ok(()),
        }
    }
}

/// Parses a JSON body into `T`; any failure is OpenAI's 400.
pub fn parse_json<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        tracing::debug!(error = %e, "malformed request body");
        ApiError::BadJson(format!("invalid request body: {e}"))
    })
}

/// All routes, with the API-key check on everything but `/health`.
pub fn router(state: SharedState) -> Router {
    let protected = Router::new()
        .route("/v1/chat/completions", post(routes::chat::handle))
        .route("/v1/completions", post(routes::completions::handle))
        .route("/v1/models", get(routes::info::models))
        .route("/metrics", get(routes::info::metrics))
        .route("/programs", get(routes::programs::list))
        .route("/programs/release", post(routes::programs::release))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ));
    Router::new()
        .route("/health", get(routes::info::health))
        .merge(protected)
        .with_state(state)
}

/// `Authorization: Bearer <key>` when the server was started with a key.
async fn require_api_key(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let given = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if given != Some(key.as_str()) {
            tracing::debug!(path = %req.uri().path(), "rejected: missing or wrong API key");
            return ApiError::Unauthorized.into_response();
        }
    }
    next.run(req).await
}

/// Serves `state` on `listener` until `shutdown` resolves; then stops the
/// engine.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: SharedState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let engine = state.engine.clone();
    let app = router(state);
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await;
    tracing::info!("server stopped; shutting the engine down");
    engine.shutdown();
    result
}
