//! `agentd simulate`: a discrete-event simulator that drives the *real*
//! [`agentd_kv`] allocator and [`agentd_scheduler`] policies with a model of GPU
//! step time, to reproduce the thrashing regime (96–1,000 programs, 1–64
//! replicas) in seconds on a laptop.
//!
//! Nothing of the policy is re-implemented here: each replica step runs the
//! engine's own core, [`agentd_scheduler::ReplicaSet`] (decisions applied to
//! the KV caches, each step's batch planned — decode first, then prefill
//! chunks under a token budget — and victims paused when blocks run out; the
//! step protocol is docs/design.md §6); the simulator only supplies the
//! programs' token contexts and advances time by the [`cost`] model.

pub mod cost;
mod engine;
mod metrics;
mod result;
mod step;
pub mod workload;

pub use cost::{CostPreset, StepCost, StepWork, H100_QWEN3_8B_FP8_KV_TOKENS};
pub use engine::Simulation;
pub use result::RunResult;
pub use workload::Workload;

use agentd_scheduler::SchedulerConfig;

/// Everything one simulation run needs.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub workload: Workload,
    pub scheduler: SchedulerConfig,
    /// Programs running at once (closed loop: a finished program is replaced).
    pub concurrency: usize,
    pub replicas: usize,
    /// Simulated seconds.
    pub duration_s: f64,
    /// Simulated seconds excluded from the rates at the start.
    pub warmup_s: f64,
    pub seed: u64,
    /// KV capacity of each replica, in tokens.
    pub kv_tokens: usize,
    /// Host-tier capacity behind each replica's pool, in tokens (0: none):
    /// evicted cached blocks are copied there and back, at
    /// [`StepCost::copy_token_s`] each.
    pub host_kv_tokens: usize,
    pub block_size: usize,
    /// Token budget of one step (vLLM's `max_num_batched_tokens`).
    pub max_batched_tokens: usize,
    pub cost: StepCost,
    /// The first `concurrency` programs join mid-history, at a turn uniform
    /// over their plan (as `agentd bench --stationary-start`).
    pub stationary_start: bool,
    /// Check the KV pool invariants after every step (slow on large pools).
    pub check_invariants: bool,
}

impl SimConfig {
    pub fn new(workload: Workload, scheduler: SchedulerConfig) -> Self {
        Self {
            workload,
            scheduler,
            concurrency: 48,
            replicas: 1,
            duration_s: 3600.0,
            warmup_s: 300.0,
            seed: 1,
            kv_tokens: H100_QWEN3_8B_FP8_KV_TOKENS,
            host_kv_tokens: 0,
            block_size: 16,
            max_batched_tokens: 8192,
            cost: StepCost::default(),
            stationary_start: false,
            check_invariants: cfg!(debug_assertions),
        }
    }
}

/// Runs one simulation to completion.
pub fn run(cfg: &SimConfig) -> Result<RunResult, SimError> {
    Simulation::new(cfg.clone())?.run()
}

/// Errors of a simulation run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("invalid simulation config: {0}")]
    Config(String),
    #[error("KV invariant violated at t={time:.3}s: {detail}")]
    Invariant { time: f64, detail: String },
}
