//! The server's shared state, its router and the accept loop.

use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentd_chat::{ChatTemplate, OutputFormat, UnknownParser};
use agentd_engine::{Engine, ProgramEnded};
use agentd_runtime::sampling::GrammarCompiler;
use agentd_runtime::{SamplingParams, Tokenizer};
use agentd_tools::{Tools, ToolsConfig};
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc::UnboundedReceiver;
use tower_http::timeout::RequestBodyTimeoutLayer;

use crate::error::ApiError;
use crate::fallback;
use crate::listener::{serve_connections, ConnectionLimits};
use crate::program_id::ProgramRef;
use crate::responses::store::ResponseStore;
use crate::routes;
use crate::routes::sglang::control as sgl;
use crate::routes::sglang::memory as sgl_mem;
use crate::tenant::{ApiKeys, ProgramKey};
use crate::tombstone::Tombstones;

/// `model_type` of `dir/config.json`; empty when unreadable (the model
/// loader, which runs first, reports a broken config itself).
fn read_model_type(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v.get("model_type")?.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// How long a shutdown with `--reclaim-on-exit` waits for the reclaims.
const RECLAIM_ON_EXIT_WAIT: Duration = Duration::from_secs(60);

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
    /// The keys clients must present, one per tenant (see [`crate::tenant`]).
    pub api_keys: ApiKeys,
    /// Tool resources of the programs (docs/design.md §10).
    pub tools: Arc<Tools>,
    /// Stored responses of `/v1/responses` (bounded; see
    /// [`crate::responses::store`]). Public so tests can shrink its bounds.
    pub responses: ResponseStore,
    /// The engine's program ends, subscribed at construction (so none is
    /// missed) and taken by [`serve`], which hands them to `tools`.
    ended: Mutex<Option<UnboundedReceiver<ProgramEnded>>>,
    next_id: AtomicU64,
    /// Releases that found no program (see [`Tombstones`]).
    pub released: Tombstones,
    /// Timeouts and the connection cap of [`serve`].
    pub connections: ConnectionLimits,
    /// How generations are split into reasoning, content and tool calls:
    /// the model family's format unless [`AppState::set_parsers`] overrides.
    pub output_format: OutputFormat,
    /// `config.json` `model_type` (empty when absent).
    model_type: String,
    /// The CPU kernel path the model runs on ("avx512", "avx2", "neon",
    /// "portable"), as the binary chose it; shown by `/metrics` as
    /// `agentd:cpu_kernels_info`. `None` (the default) shows nothing.
    pub cpu_kernels: Option<String>,
    /// Compiles structured-output grammars against the model's vocabulary
    /// (built once here: the token trie costs ~0.1 s); `None` when the
    /// tokenizer's byte spelling is unknown.
    pub grammar: Option<Arc<GrammarCompiler>>,
    /// The sampling a request gets for each field it leaves unset: the
    /// model's `generation_config.json` (vLLM's `--generation-config auto`,
    /// set by `agentd serve`), else [`SamplingParams::default`].
    pub sampling_defaults: SamplingParams,
    /// The RL trainer surfaces' state: weight version, `rid`s in flight.
    pub rl: Arc<crate::rl::RlState>,
    /// vLLM's dev-mode routes are served (`VLLM_SERVER_DEV_MODE=1`;
    /// `routes::vllm_dev`).
    pub dev_mode: bool,
}

pub type SharedState = Arc<AppState>;

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("cannot load the tokenizer of {dir}: {source}")]
    Tokenizer {
        dir: String,
        source: agentd_runtime::ModelError,
    },
    #[error("cannot load the chat template of {dir}: {source}")]
    Template {
        dir: String,
        source: agentd_chat::ChatError,
    },
    #[error("cannot set up tool resources: {0}")]
    Tools(#[from] agentd_tools::ToolError),
}

impl AppState {
    /// State for `engine`, serving the model in `model_dir` (its tokenizer
    /// and chat template) under `model_name`, with the default tool setup
    /// (no sandbox root: directories are refused).
    pub fn new(
        engine: Engine,
        model_dir: &Path,
        model_name: String,
        api_key: Option<String>,
    ) -> Result<Self, SetupError> {
        Self::with_tools(
            engine,
            model_dir,
            model_name,
            api_key,
            ToolsConfig::default(),
        )
    }

    /// [`AppState::new`] with the tool side configured.
    pub fn with_tools(
        engine: Engine,
        model_dir: &Path,
        model_name: String,
        api_key: Option<String>,
        tools: ToolsConfig,
    ) -> Result<Self, SetupError> {
        Self::with_tokenizer(engine, model_dir, model_dir, model_name, api_key, tools)
    }

    /// [`AppState::with_tools`] with the tokenizer and chat template read
    /// from `tokenizer_dir` (vLLM's `--tokenizer`) instead of the model's.
    pub fn with_tokenizer(
        engine: Engine,
        model_dir: &Path,
        tokenizer_dir: &Path,
        model_name: String,
        api_key: Option<String>,
        tools: ToolsConfig,
    ) -> Result<Self, SetupError> {
        let dir = model_dir.display().to_string();
        let tokenizer =
            Tokenizer::from_dir(tokenizer_dir).map_err(|source| SetupError::Tokenizer {
                dir: tokenizer_dir.display().to_string(),
                source,
            })?;
        let config = tokenizer_dir.join("tokenizer_config.json");
        let template = if config.is_file() {
            Some(
                ChatTemplate::from_tokenizer_config_file(&config).map_err(|source| {
                    SetupError::Template {
                        dir: tokenizer_dir.display().to_string(),
                        source,
                    }
                })?,
            )
        } else {
            tracing::warn!(
                dir = %tokenizer_dir.display(),
                "no tokenizer_config.json: chat completions are disabled"
            );
            None
        };
        let model_type = read_model_type(model_dir);
        let max_model_len = engine.max_model_len();
        let mc = engine.model_config();
        let grammar = match GrammarCompiler::new(&tokenizer, mc.vocab_size, &mc.eos_token_ids) {
            Ok(g) => Some(Arc::new(g)),
            Err(e) => {
                tracing::warn!(error = %e, "structured outputs are disabled");
                None
            }
        };
        let tools = Arc::new(Tools::new(tools)?);
        let ended = Mutex::new(Some(engine.subscribe_ended()));
        Ok(AppState {
            engine,
            tokenizer: Arc::new(tokenizer),
            template,
            model_name,
            model_root: dir.clone(),
            max_model_len,
            api_keys: ApiKeys::new(api_key),
            tools,
            responses: ResponseStore::default(),
            ended,
            next_id: AtomicU64::new(0),
            released: Tombstones::default(),
            connections: ConnectionLimits::default(),
            output_format: OutputFormat::for_model_type(&model_type),
            model_type,
            cpu_kernels: None,
            grammar,
            sampling_defaults: SamplingParams::default(),
            rl: Arc::new(crate::rl::RlState::new(dir.clone())),
            dev_mode: false,
        })
    }

    /// `config.json`'s `model_type` (empty when absent).
    pub fn model_type(&self) -> &str {
        &self.model_type
    }

    /// Chooses the output parsers by vLLM's names (`--tool-call-parser`,
    /// `--reasoning-parser`); `None` keeps the family's.
    pub fn set_parsers(
        &mut self,
        tool: Option<&str>,
        reasoning: Option<&str>,
    ) -> Result<(), UnknownParser> {
        self.output_format = OutputFormat::resolve(&self.model_type, tool, reasoning)?;
        Ok(())
    }

    /// Declares a request's `tool_resources` for its program. Called before
    /// the request reaches the engine, so that its end (a `final` request
    /// may finish at once) always comes after the declaration.
    pub fn declare_tools(
        &self,
        key: Option<&ProgramKey>,
        program: &ProgramRef,
    ) -> Result<(), ApiError> {
        let (Some(key), Some(spec)) = (key, &program.tool_resources) else {
            return Ok(());
        };
        let declared = self
            .tools
            .declare(key.as_str(), spec)
            .map_err(|e| ApiError::tools("tool_resources", e))?;
        tracing::info!(program = %key, resources = declared.len(), "tool resources declared with a request");
        Ok(())
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
        .route("/v1/responses", post(routes::responses::create))
        .route(
            "/v1/responses/{id}",
            get(routes::responses::retrieve).delete(routes::responses::delete),
        )
        .route("/v1/responses/{id}/cancel", post(routes::responses::cancel))
        .route("/v1/models", get(routes::info::models))
        // vLLM's tokenizer routes (RL trainers tokenize through the server).
        .route("/tokenize", post(routes::tokenize::tokenize))
        .route("/detokenize", post(routes::tokenize::detokenize))
        // vLLM's token-in generate and vllm-router's session release
        // (SkyRL's data plane: routes/vllm_tokens).
        .route(
            "/inference/v1/generate",
            post(routes::vllm_tokens::generate),
        )
        .route("/finish_session", post(routes::vllm_tokens::finish_session))
        // SGLang's native surface (RL trainers: routes/sglang).
        .route(
            "/generate",
            post(routes::sglang::generate::generate).put(routes::sglang::generate::generate),
        )
        .route("/abort_request", post(sgl::abort_request))
        .route("/pause_generation", post(sgl::pause_generation))
        .route("/continue_generation", post(sgl::continue_generation))
        .route("/flush_cache", get(sgl::flush_cache).post(sgl::flush_cache))
        .route("/model_info", get(sgl::model_info))
        .route("/get_model_info", get(sgl::model_info))
        .route("/server_info", get(sgl::server_info))
        .route("/get_server_info", get(sgl::server_info))
        .route("/weight_version", get(sgl::weight_version))
        .route("/get_weight_version", get(sgl::weight_version))
        .route("/update_weight_version", post(sgl::update_weight_version))
        .route("/health_generate", get(sgl::health_generate))
        .route(
            "/update_weights_from_disk",
            post(sgl::update_weights_from_disk),
        )
        .route(
            "/release_memory_occupation",
            get(sgl_mem::release_memory_occupation).post(sgl_mem::release_memory_occupation),
        )
        .route(
            "/resume_memory_occupation",
            get(sgl_mem::resume_memory_occupation).post(sgl_mem::resume_memory_occupation),
        )
        .route("/metrics", get(routes::info::metrics))
        .route("/programs", get(routes::programs::list))
        .route("/programs/release", post(routes::programs::release))
        .route("/programs/{id}", get(routes::tools::program))
        .route("/programs/{id}/resources", post(routes::tools::declare))
        .route(
            "/programs/{id}/environment",
            post(routes::tools::prepare).get(routes::tools::environment),
        )
        .merge(match state.dev_mode {
            true => routes::vllm_dev::router(),
            false => Router::new(),
        })
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ));
    Router::new()
        .route("/health", get(routes::info::health))
        .merge(protected)
        .fallback(fallback::no_route)
        .method_not_allowed_fallback(fallback::wrong_method)
        // A body that stalls (no bytes for this long) fails like a head that
        // does: the slow-client limit covers both halves of a request.
        .layer(RequestBodyTimeoutLayer::new(
            state.connections.header_read_timeout,
        ))
        .layer(middleware::map_response(fallback::json_errors))
        .with_state(state)
}

/// `Authorization: Bearer <key>` when the server was started with keys;
/// the rest of the request runs as the key's tenant.
async fn require_api_key(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    if state.api_keys.is_open() {
        return next.run(req).await;
    }
    let caller = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .and_then(|token| state.api_keys.caller(token));
    match caller {
        Some(caller) => caller.scope(next.run(req)).await,
        None => {
            tracing::debug!(path = %req.uri().path(), "rejected: missing or wrong API key");
            ApiError::Unauthorized.into_response()
        }
    }
}

/// The credentials of an `Authorization: Bearer <token>` value; the scheme
/// is case-insensitive (RFC 9110 §11.1).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Serves `state` on `listener` until `shutdown` resolves; then stops the
/// engine (and, with `reclaim_on_exit`, reclaims every live program's tool
/// resources before returning).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: SharedState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let engine = state.engine.clone();
    let tools = state.tools.clone();
    let ended = state.ended.lock().unwrap_or_else(|e| e.into_inner()).take();
    let forwarder = ended.map(|mut rx| {
        let tools = tools.clone();
        tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                tools.engine_ended(&ev.id, ev.reason.as_str(), Some(ev.at));
            }
        })
    });
    let sweeper = tools.orphan_lease.map(|lease| {
        let (tools, engine) = (tools.clone(), engine.clone());
        // Often enough that an orphan outlives the lease by a fraction of it.
        let every = (lease / 4).clamp(Duration::from_millis(50), Duration::from_secs(30));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                let snapshot = engine.snapshot().await;
                let running = snapshot.programs.iter().map(|p| p.id.clone()).collect();
                tools.sweep_orphans(&running);
            }
        })
    });
    let limits = state.connections;
    let app = router(state);
    serve_connections(listener, app, limits, shutdown).await;
    tracing::info!("server stopped; shutting the engine down");
    engine.shutdown();
    for task in forwarder.into_iter().chain(sweeper) {
        task.abort();
    }
    if tools.reclaim_on_exit {
        let n = tools.registry.end_all("server_shutdown");
        tracing::info!(
            resources = n,
            "--reclaim-on-exit: reclaiming every live program's tool resources"
        );
        if !tools.registry.wait_idle(RECLAIM_ON_EXIT_WAIT).await {
            tracing::error!(
                still_running = tools.registry.in_progress(),
                "reclaims still running at exit"
            );
        }
        let m = tools.registry.metrics();
        tracing::info!(
            reclaimed = m.reclaimed_total,
            failed = m.failed_total,
            live = m.live,
            "tool resources at exit"
        );
    }
    Ok(())
}
