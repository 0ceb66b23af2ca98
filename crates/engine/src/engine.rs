//! The engine handle: start workers, submit requests, observe.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use agentd_runtime::{
    LoadedModel, ModelConfig, ModelError, SequenceSampler, StepRunner, WeightLoader,
};
use agentd_scheduler::{GroupId, ToolId};
use tokio::sync::mpsc;
use tracing::info;

use crate::api::name_hash;
use crate::board::{Board, Snapshot};
use crate::core::{Core, Signals};
use crate::inbox::{Inbox, Released, Submitted};
use crate::worker::{self, Shared, Wake};
use crate::{EngineConfig, EngineError, Event, GenerateRequest, ProgramEnded};

/// Output tokens a request's context has room for from its submission
/// (more grow it the usual way): 32 KiB per request at most.
const RESERVED_OUTPUT_TOKENS: usize = 8192;

/// Why the engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("invalid engine configuration: {0}")]
    Config(String),
    #[error("could not start a worker thread: {0}")]
    Thread(#[from] std::io::Error),
}

struct Inner {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    config: ModelConfig,
    /// Loads weight updates as the serving weights were loaded; `None`
    /// when the engine was started from bare runners.
    loader: Option<Arc<dyn WeightLoader>>,
    max_model_len: usize,
    max_waiting: usize,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shared.inbox.close();
        self.shared.section(|core| core.shutdown = true);
        self.shared.wake_all();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

/// The longest prompt + output a request may have: the model's window,
/// capped by `--max-model-len`, and never more than one replica's pool holds
/// (a lone sequence must always fit, so none is refused or stuck for lack of
/// blocks). Blocks are allocated as sequences grow; this bounds only one
/// sequence. An explicit `--max-model-len` the pool cannot hold is an error
/// naming both numbers; the model's own window is lowered with a warning, as
/// vLLM does when no length was asked for.
fn max_model_len(cfg: &EngineConfig, model_window: usize) -> Result<usize, StartError> {
    let pool = cfg.num_blocks.saturating_mul(cfg.block_size);
    match cfg.max_model_len {
        Some(m) if m > pool => Err(StartError::Config(format!(
            "--max-model-len {m} does not fit one replica's KV pool of {pool} tokens \
             ({} blocks of {}); give the pool more memory or lower --max-model-len",
            cfg.num_blocks, cfg.block_size
        ))),
        Some(m) => Ok(m.min(model_window)),
        None if model_window > pool => {
            tracing::warn!(
                model_window,
                pool_tokens = pool,
                "the model's context window does not fit one replica's KV pool; \
                 serving at most {pool} tokens per sequence"
            );
            Ok(pool)
        }
        None => Ok(model_window),
    }
}

/// A running engine. Cheap to clone; the workers stop when the last clone is
/// dropped (or on [`Engine::shutdown`]).
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

/// The events of one request. Dropping it cancels the request: the engine
/// notices at its next step boundary and frees what only it held.
pub struct RequestStream {
    rx: mpsc::UnboundedReceiver<Event>,
    signals: Arc<Signals>,
}

impl RequestStream {
    pub async fn next(&mut self) -> Option<Event> {
        self.rx.recv().await
    }

    /// Prompt tokens reused from the KV cache when the request first started
    /// (0 until then). The final [`Event::Finished`] usage carries the same.
    pub fn cached_tokens(&self) -> usize {
        self.signals.cached_tokens.load(Ordering::Relaxed)
    }

    /// For callers outside an async runtime (tests, offline tools).
    pub fn blocking_next(&mut self) -> Option<Event> {
        self.rx.blocking_recv()
    }
}

/// Cancels a request from outside its stream (SGLang's `/abort_request`,
/// `pause_generation` in `abort` mode): it ends at its replica's next step
/// boundary with finish reason `abort`, and its stream still receives the
/// tokens it had and the finish.
#[derive(Clone)]
pub struct AbortHandle(Arc<Signals>);

impl AbortHandle {
    pub fn abort(&self) {
        self.0.cancelled.store(true, Ordering::Relaxed);
    }
}

impl RequestStream {
    /// A handle that cancels this request without dropping its stream.
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle(self.signals.clone())
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        self.signals.cancelled.store(true, Ordering::Relaxed);
    }
}

impl Engine {
    /// Starts on `model`'s backend: one runner per replica (the cores split
    /// between them unless `threads_per_replica` says otherwise), and
    /// later weights ([`Engine::load_weights`]) loaded as `model` was.
    pub fn with_model(model: Arc<dyn LoadedModel>, cfg: EngineConfig) -> Result<Self, StartError> {
        let threads_each = cfg.threads_each();
        let runners = (0..cfg.replicas)
            .map(|r| {
                model.clone().runner(
                    &format!("agentd-r{r}"),
                    cfg.num_blocks,
                    cfg.block_size,
                    threads_each,
                )
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Self::start(model.config().clone(), runners, cfg, Some(model.loader()))
    }

    /// Starts one worker per runner (`cfg.replicas` of them, each with a
    /// cache of `cfg.num_blocks` blocks of `cfg.block_size` tokens): the
    /// CPU runtime, the CUDA backend, or any other [`StepRunner`]. Such an
    /// engine loads no weights ([`Engine::load_weights`] refuses).
    pub fn with_runners(
        mc: ModelConfig,
        runners: Vec<Box<dyn StepRunner>>,
        cfg: EngineConfig,
    ) -> Result<Self, StartError> {
        Self::start(mc, runners, cfg, None)
    }

    /// [`Engine::with_runners`] with a loader for weight updates (the
    /// runners take what it loads: `StepRunner::swap_model`).
    pub fn with_runners_and_loader(
        mc: ModelConfig,
        runners: Vec<Box<dyn StepRunner>>,
        cfg: EngineConfig,
        loader: Arc<dyn WeightLoader>,
    ) -> Result<Self, StartError> {
        Self::start(mc, runners, cfg, Some(loader))
    }

    fn start(
        mc: ModelConfig,
        runners: Vec<Box<dyn StepRunner>>,
        cfg: EngineConfig,
        loader: Option<Arc<dyn WeightLoader>>,
    ) -> Result<Self, StartError> {
        cfg.scheduler.validate().map_err(StartError::Config)?;
        if cfg.replicas == 0
            || cfg.num_blocks == 0
            || cfg.block_size == 0
            || cfg.max_num_batched_tokens == 0
        {
            return Err(StartError::Config(
                "replicas, num_blocks, block_size and max_num_batched_tokens must be positive"
                    .into(),
            ));
        }
        if runners.len() != cfg.replicas
            || runners
                .iter()
                .any(|r| r.num_blocks() != cfg.num_blocks || r.block_size() != cfg.block_size)
        {
            return Err(StartError::Config(format!(
                "{} runners for {} replicas, each must have {} blocks of {} tokens",
                runners.len(),
                cfg.replicas,
                cfg.num_blocks,
                cfg.block_size
            )));
        }
        let mut runners = runners;
        for r in &mut runners {
            r.enable_host_tier(cfg.host_blocks)
                .map_err(|e| StartError::Config(e.to_string()))?;
        }
        let max_len = max_model_len(&cfg, mc.max_position_embeddings)?;
        let mut core = Core::new(cfg.clone());
        core.enable_kv_events();
        let shared = Arc::new(Shared {
            core: Mutex::new(core),
            wake: Wake::new(cfg.replicas),
            inbox: Inbox::default(),
            board: Board::default(),
            eos: mc.eos_token_ids.clone(),
            vocab: mc.vocab_size,
            threads_per_replica: cfg.threads_each(),
        });
        let mut threads = Vec::with_capacity(cfg.replicas);
        for (r, runner) in runners.into_iter().enumerate() {
            let s = shared.clone();
            let t = std::thread::Builder::new()
                .name(format!("agentd-replica-{r}"))
                .spawn(move || worker::run(r, s, runner))?;
            threads.push(t);
        }
        info!(
            replicas = cfg.replicas,
            blocks_per_replica = cfg.num_blocks,
            block_size = cfg.block_size,
            policy = %cfg.scheduler.policy,
            "engine started"
        );
        Ok(Self {
            inner: Arc::new(Inner {
                shared,
                threads: Mutex::new(threads),
                config: mc,
                loader,
                max_model_len: max_len,
                max_waiting: cfg.max_waiting,
            }),
        })
    }

    /// Queues a request. Runs on the caller's thread: validation and the
    /// sampler's setup (penalties over the prompt, the grammar's start
    /// state) are O(prompt), done here without the engine lock; the request
    /// then goes into the inbox, and a worker routes it (prefix matching)
    /// at its next step. Refuses with `Overloaded` when too many requests
    /// already wait. Never waits for the engine lock. Traced under a
    /// `request` span of its own ([`Engine::submit_traced`]).
    pub fn submit(&self, req: GenerateRequest) -> Result<RequestStream, EngineError> {
        let span = crate::request_span(None, req.program.as_deref(), None, req.prompt.len());
        self.submit_traced(req, span)
    }

    /// [`Engine::submit`] under `span`, the request's span made by the
    /// caller ([`crate::request_span`]: the server's, with its request id
    /// and tenant); the engine records the request's queueing, admission,
    /// pauses, restores and end on it, and its steps follow from it.
    pub fn submit_traced(
        &self,
        req: GenerateRequest,
        span: tracing::Span,
    ) -> Result<RequestStream, EngineError> {
        let (shared, limit) = (&self.inner.shared, self.inner.max_waiting);
        shared.inbox.check(limit)?;
        self.validate(&req)?;
        let room = req.sampling.max_tokens.min(RESERVED_OUTPUT_TOKENS);
        let sampler = SequenceSampler::new(req.sampling, &req.prompt)?;
        let mut prompt = req.prompt;
        // Room for the tokens it may generate, made here rather than by a
        // reallocation of the whole context under the engine lock when the
        // first token is committed (validated: prompt + max_tokens fits the
        // window).
        prompt.reserve_exact(room);
        let (tx, rx) = mpsc::unbounded_channel();
        let signals = Arc::new(Signals::default());
        let sub = Submitted {
            program: req.program,
            prompt,
            sampler,
            final_request: req.final_request,
            parent_program: req.parent_program,
            cache_salt: req.cache_salt,
            group: req.group.map(|g| (GroupId(name_hash(&g.name)), g.size)),
            tool: req.tool.as_deref().map(|t| ToolId(name_hash(t))),
            tx,
            signals: signals.clone(),
            arrived: Instant::now(),
            released: Released::No,
            span,
        };
        shared.inbox.push(sub, limit)?;
        shared.wake_all();
        Ok(RequestStream { rx, signals })
    }

    /// The checks of the prompt against the model; the sampling parameters
    /// are checked by [`SequenceSampler::new`].
    fn validate(&self, req: &GenerateRequest) -> Result<(), EngineError> {
        if req.prompt.is_empty() {
            return Err(EngineError::Invalid("the prompt is empty".into()));
        }
        let vocab = self.inner.config.vocab_size;
        if let Some(&t) = req.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::Invalid(format!(
                "token id {t} is outside the vocabulary (size {vocab})"
            )));
        }
        req.sampling.controls.validate_vocab(vocab)?;
        // `max_model_len` never exceeds one replica's pool (checked at
        // start), so a request within it always fits when alone.
        let (max_tokens, max) = (req.sampling.max_tokens, self.inner.max_model_len);
        if req.prompt.len().saturating_add(max_tokens) > max {
            return Err(EngineError::ContextTooLong {
                prompt: req.prompt.len(),
                max_tokens,
                max,
            });
        }
        Ok(())
    }

    /// Ends a program: its requests are cancelled, its KV released — also
    /// requests of it still in the inbox. False if no such program exists.
    pub fn release(&self, program: &str) -> bool {
        let shared = &self.inner.shared;
        let (found, waiting) = shared.section(|core| {
            let found = core.release(program);
            // Under the engine lock, so no worker drains the inbox meanwhile.
            (found, shared.inbox.release(program, found))
        });
        shared.wake_all();
        found || waiting
    }

    /// The named program, whose request just finished, runs `tool` (the
    /// server read it from the tool calls it returned): that tool's observed
    /// durations set the program's decay while it acts. False when no such
    /// program is known (ended, or never seen).
    pub fn note_tool(&self, program: &str, tool: &str) -> bool {
        self.inner.shared.section(|core| {
            let Some(p) = core.replicas.programs().id_of(program) else {
                return false;
            };
            let now = core.now();
            core.replicas.note_tool(p, ToolId(name_hash(tool)), now);
            true
        })
    }

    /// A stream of named programs' terminations (release, `final`, lease
    /// expiry), from now on, in the order they happen. Each call gets its own
    /// stream; dropping it unsubscribes.
    pub fn subscribe_ended(&self) -> mpsc::UnboundedReceiver<ProgramEnded> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.inner
            .shared
            .section(|core| core.ended_subscribers.push(tx));
        rx
    }

    /// The engine's metrics and program table, without the engine lock: a
    /// snapshot at least as new as anything the caller saw before asking,
    /// unless the engine is stuck in one critical section for longer than
    /// [`crate::READ_WAIT`], in which case the latest one
    /// ([`crate::board`] explains the protocol).
    pub async fn snapshot(&self) -> Arc<Snapshot> {
        let shared = &self.inner.shared;
        let pushed = shared.inbox.pushed();
        match shared.board.read(pushed, || shared.wake_all()).await {
            Ok(snap) => snap,
            // Routing the inbox is CPU work: not on a runtime thread.
            Err(stale) => {
                let shared = shared.clone();
                tokio::task::spawn_blocking(move || shared.snapshot_now())
                    .await
                    .ok()
                    .flatten()
                    .unwrap_or(stale)
            }
        }
    }

    /// [`Engine::snapshot`] for callers outside an async runtime.
    pub fn snapshot_blocking(&self) -> Arc<Snapshot> {
        let shared = &self.inner.shared;
        let pushed = shared.inbox.pushed();
        shared
            .board
            .read_blocking(pushed, || shared.wake_all())
            .unwrap_or_else(|stale| shared.snapshot_now().unwrap_or(stale))
    }

    /// The state the workers share (for [`crate::control`]).
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.inner.shared
    }

    /// Longest prompt + output a request may have.
    pub fn max_model_len(&self) -> usize {
        self.inner.max_model_len
    }

    pub fn model_config(&self) -> &ModelConfig {
        &self.inner.config
    }

    /// Loads the checkpoint in `dir` the way the serving weights were
    /// loaded (backend, dtype), for [`Engine::swap_weights`] or
    /// [`Engine::resume_memory`]. Runs on the caller's thread, off the
    /// engine lock.
    pub fn load_weights(&self, dir: &Path) -> Result<Arc<dyn LoadedModel>, ModelError> {
        match &self.inner.loader {
            Some(l) => l.load(dir),
            None => Err(ModelError::Backend {
                backend: "engine",
                message: "started from bare runners: no weight loader for this backend".into(),
            }),
        }
    }

    /// Stops the workers after their current step; later submissions fail.
    pub fn shutdown(&self) {
        self.inner.shared.inbox.close();
        self.inner.shared.section(|core| core.shutdown = true);
        self.inner.shared.wake_all();
    }
}
