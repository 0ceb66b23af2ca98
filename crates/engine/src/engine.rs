//! The engine handle: start workers, submit requests, observe.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use agentd_models::{CpuRunner, Model, ModelConfig, ModelError, StepRunner};
use tokio::sync::mpsc;
use tracing::info;

use crate::core::{Core, Signals};
use crate::metrics::MetricsSnapshot;
use crate::worker::{self, Shared};
use crate::{EngineConfig, EngineError, Event, GenerateRequest, ProgramEnded, ProgramStatus};

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
    max_model_len: usize,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
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

impl Drop for RequestStream {
    fn drop(&mut self) {
        self.signals.cancelled.store(true, Ordering::Relaxed);
    }
}

impl Engine {
    /// Loads the model from a Hugging Face directory and starts one worker per replica.
    pub fn start(model_dir: &Path, cfg: EngineConfig) -> Result<Self, StartError> {
        info!(dir = %model_dir.display(), "loading model");
        let model = Model::load(model_dir)?;
        Self::with_model(Arc::new(model), cfg)
    }

    /// Starts on the CPU runtime: one [`CpuRunner`] per replica, the cores
    /// split between them unless `threads_per_replica` says otherwise.
    pub fn with_model(model: Arc<Model>, cfg: EngineConfig) -> Result<Self, StartError> {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let threads_each = cfg
            .threads_per_replica
            .unwrap_or(cores / cfg.replicas.max(1))
            .max(1);
        let runners = (0..cfg.replicas)
            .map(|r| {
                let runner = CpuRunner::new(
                    model.clone(),
                    cfg.num_blocks,
                    cfg.block_size,
                    threads_each,
                    &format!("agentd-r{r}"),
                )?;
                Ok(Box::new(runner) as Box<dyn StepRunner>)
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Self::with_runners(model.config().clone(), runners, cfg)
    }

    /// Starts one worker per runner (`cfg.replicas` of them, each with a
    /// cache of `cfg.num_blocks` blocks of `cfg.block_size` tokens): the
    /// CPU runtime, the CUDA backend, or any other [`StepRunner`].
    pub fn with_runners(
        mc: ModelConfig,
        runners: Vec<Box<dyn StepRunner>>,
        cfg: EngineConfig,
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
        let max_len = max_model_len(&cfg, mc.max_position_embeddings)?;
        let mut core = Core::new(cfg.clone(), max_len, mc.vocab_size);
        core.enable_kv_events();
        let shared = Arc::new(Shared {
            core: Mutex::new(core),
            wake: (0..cfg.replicas).map(|_| Condvar::new()).collect(),
            eos: mc.eos_token_ids.clone(),
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
                max_model_len: max_len,
            }),
        })
    }

    /// Queues a request. Never blocks; refuses with `Overloaded` when too many
    /// requests already wait.
    pub fn submit(&self, req: GenerateRequest) -> Result<RequestStream, EngineError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let signals = Arc::new(Signals::default());
        self.inner.shared.lock().submit(req, tx, signals.clone())?;
        self.inner.shared.wake_all();
        Ok(RequestStream { rx, signals })
    }

    /// Ends a program: its requests are cancelled, its KV released. False if
    /// no such program exists.
    pub fn release(&self, program: &str) -> bool {
        let found = self.inner.shared.lock().release(program);
        self.inner.shared.wake_all();
        found
    }

    /// A stream of named programs' terminations (release, `final`, lease
    /// expiry), from now on, in the order they happen. Each call gets its own
    /// stream; dropping it unsubscribes.
    pub fn subscribe_ended(&self) -> mpsc::UnboundedReceiver<ProgramEnded> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.inner.shared.lock().ended_subscribers.push(tx);
        rx
    }

    pub fn programs(&self) -> Vec<ProgramStatus> {
        self.inner.shared.lock().program_status()
    }

    /// Longest prompt + output a request may have.
    pub fn max_model_len(&self) -> usize {
        self.inner.max_model_len
    }

    pub fn model_config(&self) -> &ModelConfig {
        &self.inner.config
    }

    pub fn metrics(&self) -> MetricsSnapshot {
        let core = self.inner.shared.lock();
        let stats = agentd_scheduler::Policy::stats(&core.replicas.policy);
        let (mut queries, mut hits, mut referenced, mut total) = (0, 0, 0, 0);
        for kv in &core.replicas.kv {
            queries += kv.stats().query_tokens;
            hits += kv.stats().hit_tokens;
            referenced += kv.pool().num_referenced();
            total += kv.pool().num_blocks();
        }
        let mut programs: Vec<(&'static str, &'static str, usize)> = Vec::new();
        for s in core.program_status() {
            match programs
                .iter_mut()
                .find(|(ph, st, _)| *ph == s.phase && *st == s.state)
            {
                Some(e) => e.2 += 1,
                None => programs.push((s.phase, s.state, 1)),
            }
        }
        MetricsSnapshot {
            num_requests_running: core.num_running(),
            num_requests_waiting: core.num_waiting(),
            kv_cache_usage: referenced as f64 / total.max(1) as f64,
            prefix_cache_queries: queries,
            prefix_cache_hits: hits,
            num_preemptions: stats.exhaustion_pauses + stats.pauses + stats.work_conserving_pauses,
            prompt_tokens: core.counters.prompt_tokens,
            generation_tokens: core.counters.generation_tokens,
            block_size: core.cfg.block_size,
            num_gpu_blocks: core.cfg.num_blocks,
            ttft_s: core.counters.ttft_s.clone(),
            e2e_s: core.counters.e2e_s.clone(),
            queue_wait_s: core.counters.queue_wait_s.clone(),
            lock_hold_s: core.counters.lock_hold_s.clone(),
            batch_tokens: core.counters.batch_tokens,
            batch_budget: core.counters.batch_budget,
            exhaustion_preemptions: core.replicas.stats().exhaustion_preemptions,
            programs,
            pauses: stats.pauses + stats.exhaustion_pauses + stats.work_conserving_pauses,
            restores: stats.restores,
            recomputed_tokens: core.replicas.stats().recomputed_tokens,
            requests_finished: core.counters.requests_finished,
        }
    }

    /// Stops the workers after their current step; later submissions fail.
    pub fn shutdown(&self) {
        self.inner.shared.lock().shutdown = true;
        self.inner.shared.wake_all();
    }
}
