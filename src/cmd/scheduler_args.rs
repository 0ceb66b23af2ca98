//! Scheduler flags shared by every subcommand that runs a policy.

use agentd_scheduler::{Placement, PolicyKind, SchedulerConfig};
use clap::Args;

/// Flag defaults are the library's defaults, so the two cannot drift apart.
const DEFAULTS: SchedulerConfig = SchedulerConfig::DEFAULT;

#[derive(Args, Debug, Clone)]
pub struct SchedulerArgs {
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Restore only while demand + need <= lambda_min x capacity.
    #[arg(long, default_value_t = DEFAULTS.lambda_min)]
    pub lambda_min: f64,
    /// Pause while demand > lambda_max x capacity.
    #[arg(long, default_value_t = DEFAULTS.lambda_max)]
    pub lambda_max: f64,
    /// Base x of the acting-memory decay f(t) = x^(-t/unit); 1 disables decay.
    #[arg(long, default_value_t = DEFAULTS.decay_base)]
    pub decay_base: f64,
    /// Time unit of the decay, seconds.
    #[arg(long, default_value_t = DEFAULTS.decay_unit_s)]
    pub decay_unit_s: f64,
    /// KV blocks reserved per running sequence for decode growth.
    #[arg(long, default_value_t = DEFAULTS.decode_reserve_blocks)]
    pub decode_reserve_blocks: usize,
    /// Restore-queue aging: context tokens forgiven per second of waiting.
    #[arg(long, default_value_t = DEFAULTS.aging_tokens_per_s)]
    pub aging_tokens_per_s: f64,
    /// Inactivity lease after which a program is terminated, seconds.
    #[arg(long, default_value_t = DEFAULTS.lease_s)]
    pub program_lease_s: f64,
    /// Where restored programs go when their previous replica has no room or
    /// cache left: most-room or best-fit.
    #[arg(long, default_value = "most-room")]
    pub placement: Placement,
    /// Most sequences running on one replica.
    #[arg(long, default_value_t = DEFAULTS.max_running)]
    pub max_num_seqs: usize,
    /// Work conservation: a replica running nothing pauses acting programs
    /// for a program that has waited this long (seconds).
    #[arg(long, default_value_t = DEFAULTS.idle_reclaim_after_s)]
    pub idle_reclaim_after_s: f64,
}

impl SchedulerArgs {
    pub fn to_config(&self, policy: PolicyKind) -> SchedulerConfig {
        SchedulerConfig {
            policy,
            lambda_min: self.lambda_min,
            lambda_max: self.lambda_max,
            decay_base: self.decay_base,
            decay_unit_s: self.decay_unit_s,
            decode_reserve_blocks: self.decode_reserve_blocks,
            aging_tokens_per_s: self.aging_tokens_per_s,
            lease_s: self.program_lease_s,
            max_running: self.max_num_seqs,
            placement: self.placement,
            idle_reclaim_after_s: self.idle_reclaim_after_s,
            ..SchedulerConfig::default()
        }
    }
}
