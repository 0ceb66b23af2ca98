//! What an RL trainer does to the engine between rollouts (issue 31):
//! pause generation in SGLang's three modes and resume it, abort requests,
//! flush the prefix cache, and swap in new weights between steps.
//!
//! Each is an explicit command on the engine's shared state: the caller
//! (an HTTP handler on the blocking pool) sets what it wants under the
//! engine lock and the replicas' workers carry it out at their next step
//! boundary ([`Core::control_point`], called where a worker would plan);
//! the caller waits, polling the state, until they have. Nothing here runs
//! inside a step: a step's sequences are never paused, aborted or given
//! new weights halfway through.
//!
//! - **Pause.** `abort`: every request in the engine is cancelled (it ends
//!   with finish reason `abort` and the tokens it had); `retract`: the
//!   running programs are paused by the policy's own order, as block
//!   exhaustion would, their requests requeued with their generated tokens
//!   and their KV dropped (restoring recomputes it); `in_place`: steps stop
//!   and everything keeps its KV, so a resume continues exactly where it
//!   stopped. In every mode new submissions stay in the inbox until resume.
//! - **Weights.** [`Engine::swap_weights`] holds new submissions, lets what
//!   was submitted before finish on the old weights (SGLang's writer lock
//!   on the model), then each worker swaps its runner's model between steps
//!   and the KV cache is flushed, so no sequence and no cached block mixes
//!   two versions. A paused engine swaps at once (SGLang does the same); a
//!   retracted request then recomputes its context on the new weights.

use std::sync::Arc;
use std::time::Duration;

use agentd_kv::ProgramId;
use agentd_runtime::{LoadedModel, MemoryTags, ModelConfig, StepRunner};

use crate::core::Core;
use crate::engine::Engine;

/// SGLang's `pause_generation` modes, and vLLM's `wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseMode {
    /// Every request in the engine ends now with finish reason `abort`.
    Abort,
    /// vLLM's `wait`: what was submitted runs to its end; new submissions
    /// wait for the resume.
    Wait,
    /// Running requests go back to the queue and drop their KV.
    Retract,
    /// Steps stop; requests keep their KV and resume where they stopped.
    InPlace,
}

impl PauseMode {
    /// SGLang's name of the mode.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Abort => "abort",
            Self::Wait => "wait",
            Self::Retract => "retract",
            Self::InPlace => "in_place",
        }
    }
}

/// Why a control command was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ControlError {
    #[error("the cache can be flushed only while no request runs or waits: {running} running, {waiting} waiting")]
    Busy { running: usize, waiting: usize },
    #[error("the new weights are not this model's architecture: {0}")]
    Incompatible(String),
    #[error("{running} requests are paused in place holding KV of the current weights; continue them, or pause with mode abort or retract, before updating the weights")]
    PausedInPlace { running: usize },
    #[error("another weight update is in progress")]
    SwapInProgress,
    #[error("replica {replica} could not take the new weights: {message}")]
    Swap { replica: usize, message: String },
    #[error("the engine is shutting down")]
    ShuttingDown,
    #[error("memory can be released only while no request runs or waits: {running} running, {waiting} waiting")]
    NotIdle { running: usize, waiting: usize },
    #[error("{0:?} not released: nothing to resume")]
    NotReleased(Vec<&'static str>),
    #[error("the weights are released; resume them (resume_memory_occupation with tags [\"weights\"]) first")]
    WeightsReleased,
}

/// What a weight swap did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwapReport {
    /// Requests paused (retracted or queued) across the swap: they run on
    /// the new weights once generation continues.
    pub num_paused_requests: usize,
    /// Device blocks freed by the flush that followed the swap.
    pub blocks_flushed: usize,
}

/// The control state inside the engine lock.
#[derive(Default)]
pub(crate) struct Control {
    pub paused: Option<PauseMode>,
    /// Per replica: the current pause was carried out at a step boundary.
    pub applied: Vec<bool>,
    pub swap: Option<PendingSwap>,
    /// The memory given back to the system (`crate::memory`): no step runs
    /// and new submissions wait while any is.
    pub released: MemoryTags,
}

/// What every worker does to its runner between steps.
#[derive(Clone)]
pub(crate) enum RunnerOp {
    /// Run on these weights from now on.
    Weights(Arc<dyn LoadedModel>),
    /// Give these regions back to the system.
    Release(MemoryTags),
    /// Take these regions again (the weights, when among them, loaded).
    Resume(MemoryTags, Option<Arc<dyn LoadedModel>>),
}

impl RunnerOp {
    pub(crate) fn apply(self, runner: &mut dyn StepRunner) -> agentd_runtime::Result<()> {
        match self {
            Self::Weights(model) => runner.swap_model(model),
            Self::Release(tags) => runner.release_memory(tags),
            Self::Resume(tags, model) => runner.resume_memory(tags, model),
        }
    }
}

pub(crate) struct PendingSwap {
    pub op: RunnerOp,
    /// Per replica: `None` until its worker carried `op` out (or failed to).
    pub done: Vec<Option<Result<(), String>>>,
}

/// What a worker does at a step boundary.
pub(crate) enum Point {
    /// Plan and run a step as usual.
    Run,
    /// Carry this out on the runner now, then come back.
    Swap(RunnerOp),
    /// No step: wait for a kick. `idle` when nothing changed.
    Hold { idle: bool },
}

/// How often a caller waiting for the workers looks again. A step boundary
/// comes every few milliseconds to seconds; the check is a lock and a few
/// counters.
const POLL: Duration = Duration::from_millis(2);

impl Core {
    /// Whether workers take new submissions from the inbox.
    pub(crate) fn accepts(&self) -> bool {
        self.control.paused.is_none() && self.control.swap.is_none() && !self.control.released.any()
    }

    /// Nothing submitted before now still runs or waits (a paused engine's
    /// queue is left for after the resume).
    fn drained(&self) -> bool {
        self.num_running() == 0
            && !self.stepping()
            && (self.control.paused.is_some() || self.num_waiting() == 0)
    }

    /// Replica `r`'s worker is at a step boundary: what it does next.
    pub(crate) fn control_point(&mut self, r: usize) -> Point {
        if let Some(swap) = &self.control.swap {
            if swap.done.get(r).is_some_and(Option::is_none) && self.drained() {
                return Point::Swap(swap.op.clone());
            }
            if swap.done.get(r).is_some_and(Option::is_some) {
                return Point::Hold { idle: true };
            }
        }
        if self.control.released.any() {
            // Nothing runs or waits while memory is released: a pause asked
            // for meanwhile is carried out as it stands.
            if let Some(a) = self.control.applied.get_mut(r) {
                *a = true;
            }
            return Point::Hold { idle: true };
        }
        let Some(mode) = self.control.paused else {
            return Point::Run;
        };
        let first = self.control.applied.get(r).is_some_and(|a| !a);
        if let Some(a) = self.control.applied.get_mut(r) {
            *a = true;
        }
        match mode {
            // Keep planning: cancelled requests end at the plan, queued
            // ones as soon as they are admitted (no step runs for them).
            // `wait`: what runs and waits runs to its end.
            PauseMode::Abort | PauseMode::Wait => Point::Run,
            PauseMode::Retract if first => {
                let now = self.now();
                // At the boundary: no step of `r` is open.
                let retracted = self.replicas.retract(r, now).unwrap_or_else(|e| {
                    tracing::error!(replica = r, error = %e, "retract refused");
                    Vec::new()
                });
                for &p in &retracted {
                    self.note_pause(p, agentd_scheduler::PauseCause::Retracted);
                }
                tracing::info!(
                    replica = r,
                    programs = retracted.len(),
                    "generation paused: running requests retracted"
                );
                Point::Hold { idle: false }
            }
            PauseMode::Retract | PauseMode::InPlace => Point::Hold { idle: !first },
        }
    }

    /// Sets `op` for every worker to carry out at its next step boundary
    /// (the caller checked that none is pending).
    pub(crate) fn start_op(&mut self, op: RunnerOp) {
        let n = self.replicas.num_replicas();
        self.control.swap = Some(PendingSwap {
            op,
            done: vec![None; n],
        });
    }

    /// Replica `r`'s worker carried out the pending [`RunnerOp`].
    pub(crate) fn swap_done(&mut self, r: usize, result: Result<(), String>) {
        if let Some(d) = self.control.swap.as_mut().and_then(|s| s.done.get_mut(r)) {
            *d = Some(result);
        }
    }

    /// Cancels every request in the engine (not those still in the inbox):
    /// each ends with finish reason `abort` at its replica's next plan, or
    /// as soon as it is admitted when it waits. Returns how many.
    pub(crate) fn cancel_all(&mut self) -> usize {
        let mut n = 0;
        for req in self.requests.values() {
            req.signals
                .cancelled
                .store(true, std::sync::atomic::Ordering::Relaxed);
            n += 1;
        }
        n
    }

    /// Ends the cancelled requests running on `r` (before a plan, and again
    /// after the schedule admitted some: a cancelled request never gets a
    /// step). True when any ended.
    pub(crate) fn finish_cancelled(&mut self, r: usize) -> bool {
        let running = self.replicas.running(r).to_vec();
        self.finish_cancelled_among(running)
    }

    /// Ends the cancelled requests waiting for admission (their client went
    /// away, or an abort reached them in the queue): each leaves the
    /// global queue now, before a decision could count room for it, match
    /// its prefix or pause others for it. True when any ended.
    pub(crate) fn finish_cancelled_waiting(&mut self) -> bool {
        let waiting: Vec<ProgramId> = self
            .requests
            .keys()
            .copied()
            .filter(|p| !self.replicas.is_running(*p))
            .collect();
        self.finish_cancelled_among(waiting)
    }

    /// Ends, of `programs`, those whose request was cancelled (or that have
    /// none left). True when any ended.
    fn finish_cancelled_among(&mut self, programs: Vec<ProgramId>) -> bool {
        let mut any = false;
        for p in programs {
            if self.requests.get(&p).is_none_or(|req| req.is_cancelled()) {
                self.finish(p, agentd_runtime::FinishReason::Cancelled);
                any = true;
            }
        }
        any
    }

    /// Forgets every cached block no running program holds, on every
    /// replica (called with no step open). Returns the device blocks freed.
    pub(crate) fn flush_kv(&mut self) -> usize {
        let mut freed = 0;
        for r in 0..self.replicas.num_replicas() {
            match self.replicas.flush(r) {
                Ok(n) => freed += n,
                Err(e) => tracing::error!(replica = r, error = %e, "flush refused"),
            }
        }
        freed
    }
}

/// The checks that the new weights fit the running engine: the same
/// family and every dimension the KV cache, the batch and the sampler
/// depend on (the stored dtype may differ: the loader widens it).
pub(crate) fn check_compatible(old: &ModelConfig, new: &ModelConfig) -> Result<(), ControlError> {
    let dims = |c: &ModelConfig| {
        [
            c.vocab_size,
            c.hidden_size,
            c.intermediate_size,
            c.num_hidden_layers,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            c.rotary_dim,
            c.max_position_embeddings,
        ]
    };
    const NAMES: [&str; 9] = [
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rotary_dim",
        "max_position_embeddings",
    ];
    if old.family != new.family {
        return Err(ControlError::Incompatible(format!(
            "the model is {}, the new weights are {}",
            old.family, new.family
        )));
    }
    for ((name, a), b) in NAMES.iter().zip(dims(old)).zip(dims(new)) {
        if a != b {
            return Err(ControlError::Incompatible(format!(
                "{name} is {a}, the new weights have {b}"
            )));
        }
    }
    let other = |c: &ModelConfig| {
        format!(
            "tie_word_embeddings={} attention_bias={} qk_norm={} moe={:?} rope_theta={} rope_scaling={:?} eos={:?}",
            c.tie_word_embeddings, c.attention_bias, c.qk_norm, c.moe, c.rope_theta, c.rope_scaling, c.eos_token_ids
        )
    };
    let (a, b) = (other(old), other(new));
    if a != b {
        return Err(ControlError::Incompatible(format!(
            "the model has {a}, the new weights {b}"
        )));
    }
    Ok(())
}

impl Engine {
    /// Pauses generation in `mode` and returns once every replica has
    /// carried it out at a step boundary (for `abort`: once every request
    /// in the engine has ended). Returns the requests aborted (`abort`) or
    /// still held (the others).
    pub fn pause(&self, mode: PauseMode) -> usize {
        let shared = self.shared();
        let aborted = shared.section(|core| {
            let n = core.replicas.num_replicas();
            core.control.paused = Some(mode);
            core.control.applied = vec![false; n];
            match mode {
                PauseMode::Abort => core.cancel_all(),
                _ => 0,
            }
        });
        shared.wake_all();
        tracing::info!(mode = mode.as_str(), aborted, "pausing generation");
        self.wait_for(|core| match mode {
            PauseMode::Abort | PauseMode::Wait => {
                core.num_running() == 0 && core.num_waiting() == 0
            }
            _ => core.control.applied.iter().all(|&a| a),
        });
        match mode {
            PauseMode::Abort | PauseMode::Wait => aborted,
            _ => self.num_requests(),
        }
    }

    /// Resumes generation; false when it was not paused.
    pub fn resume(&self) -> bool {
        let shared = self.shared();
        let was = shared.section(|core| {
            core.control.applied.clear();
            core.control.paused.take()
        });
        shared.wake_all();
        tracing::info!(was = was.map(|m| m.as_str()), "generation continues");
        was.is_some()
    }

    /// The current pause, if any.
    pub fn paused(&self) -> Option<PauseMode> {
        self.shared().section(|core| core.control.paused)
    }

    /// Cancels every request in the engine (SGLang's `abort_all`); each
    /// ends with finish reason `abort` and what it generated. Returns how
    /// many were cancelled.
    pub fn abort_all(&self) -> usize {
        let n = self.shared().section(|core| core.cancel_all());
        self.shared().wake_all();
        n
    }

    /// Requests running or waiting in the engine (not the inbox).
    pub fn num_requests(&self) -> usize {
        self.shared()
            .section(|core| core.num_running() + core.num_waiting())
    }

    /// SGLang's `flush_cache`: forgets every cached block, refused while a
    /// request runs or waits (a retracted request may wait: it holds no
    /// KV). Returns the device blocks freed.
    pub fn flush_cache(&self) -> Result<usize, ControlError> {
        let freed = self.shared().section(|core| {
            let (running, waiting) = (core.num_running(), core.num_waiting());
            let retracted = core.control.paused == Some(PauseMode::Retract);
            if running > 0 || core.stepping() || (waiting > 0 && !retracted) {
                return Err(ControlError::Busy { running, waiting });
            }
            Ok(core.flush_kv())
        })?;
        tracing::info!(blocks = freed, "prefix cache flushed");
        Ok(freed)
    }

    /// Swaps in `model` (loaded by the caller, off the engine lock) between
    /// steps; see the module docs. Blocks until done; refused, with the
    /// old weights still serving, when the architecture differs or the
    /// engine is paused in place with requests holding KV.
    pub fn swap_weights(&self, model: Arc<dyn LoadedModel>) -> Result<SwapReport, ControlError> {
        check_compatible(self.model_config(), model.config())?;
        let shared = self.shared();
        shared.section(|core| {
            if core.shutdown {
                return Err(ControlError::ShuttingDown);
            }
            if core.control.swap.is_some() {
                return Err(ControlError::SwapInProgress);
            }
            let running = core.num_running();
            if core.control.paused == Some(PauseMode::InPlace) && running > 0 {
                return Err(ControlError::PausedInPlace { running });
            }
            if core.control.released.weights {
                return Err(ControlError::WeightsReleased);
            }
            core.start_op(RunnerOp::Weights(model));
            Ok(())
        })?;
        shared.wake_all();
        let (mut core, failed) = self.finish_op()?;
        // Flushed even when a replica failed: blocks computed by either
        // version must not be reused by the other.
        let blocks_flushed = core.flush_kv();
        let num_paused_requests = match core.control.paused {
            Some(_) => core.num_running() + core.num_waiting(),
            None => 0,
        };
        core.end();
        shared.wake_all();
        if let Some(e) = failed {
            return Err(e);
        }
        tracing::info!(blocks_flushed, num_paused_requests, "weights swapped");
        Ok(SwapReport {
            num_paused_requests,
            blocks_flushed,
        })
    }

    /// Waits until every worker carried out the pending [`RunnerOp`]
    /// ([`Core::start_op`]) and takes it; returns the lock and the first
    /// replica's failure.
    pub(crate) fn finish_op(
        &self,
    ) -> Result<(crate::worker::Held<'_>, Option<ControlError>), ControlError> {
        self.wait_for(|core| {
            core.control
                .swap
                .as_ref()
                .is_none_or(|s| s.done.iter().all(Option::is_some))
        });
        let mut core = self.shared().lock();
        let Some(swap) = core.control.swap.take() else {
            core.end();
            return Err(ControlError::ShuttingDown);
        };
        let failed = swap
            .done
            .into_iter()
            .enumerate()
            .find_map(|(replica, d)| match d {
                Some(Err(message)) => Some(ControlError::Swap { replica, message }),
                _ => None,
            });
        Ok((core, failed))
    }

    /// Waits until `done` holds (or the engine shuts down).
    fn wait_for(&self, done: impl Fn(&Core) -> bool) {
        let shared = self.shared();
        loop {
            if shared.section(|core| core.shutdown || done(core)) {
                return;
            }
            std::thread::sleep(POLL);
        }
    }
}
