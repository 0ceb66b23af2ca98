//! Scheduler flags shared by every subcommand that runs a policy.

use agentd_scheduler::{PolicyKind, SchedulerConfig};
use clap::Args;

#[derive(Args, Debug, Clone)]
pub struct SchedulerArgs {
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Restore only while demand + need <= lambda_min x capacity.
    #[arg(long, default_value_t = 0.9)]
    pub lambda_min: f64,
    /// Pause while demand > lambda_max x capacity.
    #[arg(long, default_value_t = 1.0)]
    pub lambda_max: f64,
    /// Base x of the acting-memory decay f(t) = x^(-t/unit); 1 disables decay.
    #[arg(long, default_value_t = 2.0)]
    pub decay_base: f64,
    /// Time unit of the decay, seconds.
    #[arg(long, default_value_t = 1.0)]
    pub decay_unit_s: f64,
    /// KV blocks reserved per running sequence for decode growth.
    #[arg(long, default_value_t = 1)]
    pub decode_reserve_blocks: usize,
    /// Restore-queue aging: context tokens forgiven per second of waiting.
    #[arg(long, default_value_t = 256.0)]
    pub aging_tokens_per_s: f64,
    /// Inactivity lease after which a program is terminated, seconds.
    #[arg(long, default_value_t = 1800.0)]
    pub program_lease_s: f64,
    /// Most sequences running on one replica.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
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
            ..SchedulerConfig::default()
        }
    }
}
