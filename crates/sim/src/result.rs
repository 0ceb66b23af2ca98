use serde::Serialize;

/// One simulation run's measurements. Every field except the wall-clock
/// measurements (`sched_us_per_step`, `wall_s`) is a pure function of the
/// configuration and seed.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunResult {
    pub policy: String,
    pub workload: String,
    pub concurrency: usize,
    pub replicas: usize,
    /// Model calls completed per simulated minute (after warm-up).
    pub steps_per_min: f64,
    /// Cached prompt tokens / prompt tokens, over every (re)start of a request.
    pub prefix_hit_rate: f64,
    /// The same with an unlimited cache: every token computed before is a hit.
    pub ideal_hit_rate: f64,
    /// Tokens prefilled again although they had been computed before.
    pub recomputed_tokens: u64,
    /// Programs paused by the scheduler's decisions: every
    /// `agentd_scheduler::PauseCause` but `kv_exhausted`, which is
    /// `preemptions` (the engine's `/metrics` counts both in
    /// `agentd:program_pauses_total`, by cause in
    /// `agentd:program_pauses_by_cause_total`).
    pub pauses: u64,
    /// Paused programs restored.
    pub restores: u64,
    /// Programs or requests paused because blocks ran out mid-step.
    pub preemptions: u64,
    /// The program policy's keep / swap / recompute choices
    /// (`agentd_scheduler::Park`; zeros for the request policy).
    pub park_keep: u64,
    pub park_swap: u64,
    pub park_recompute: u64,
    /// Time average of (max − min) KV usage fraction over replicas.
    pub kv_imbalance: f64,
    /// Wall-clock microseconds of the scheduler's decision per engine step.
    pub sched_us_per_step: f64,
    pub output_tok_s: f64,
    /// Request latency (arrival to last token), seconds.
    pub p50_step_s: f64,
    pub p99_step_s: f64,
    /// The slowest request: the bound on waiting that the restore order gives.
    pub max_step_s: f64,
    /// First requests of programs only (a new program's admission).
    pub first_p50_s: f64,
    pub first_max_s: f64,
    /// Rollout groups (`--group-size` > 1) started in the window and done:
    /// spawn to the last member's end (a group's reward needs every member).
    pub groups_completed: u64,
    pub group_makespan_p50_s: f64,
    pub group_makespan_max_s: f64,
    pub programs_completed: u64,
    pub engine_steps: u64,
    pub mean_kv_usage: f64,
    pub kv_tokens: usize,
    /// Host tier per replica (tokens), and tokens copied between the tiers.
    pub host_kv_tokens: usize,
    pub copied_tokens: u64,
    pub duration_s: f64,
    pub wall_s: f64,
}
