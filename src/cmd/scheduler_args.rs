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
    /// Restore only while demand + need <= lambda_min x capacity (with a
    /// host KV tier that has room for the band, up to lambda_max x capacity).
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
    /// Bounded bypass: a queued program passed over by this many admissions
    /// of others is admitted first (oldest first); no program is overtaken
    /// more often than this.
    #[arg(long, default_value_t = DEFAULTS.max_bypass)]
    pub max_bypass: u64,
    /// Bounded waiting in time: a program queued this long (seconds) is
    /// admitted first and may pause programs resident this long to get
    /// room (the oldest waits at most about twice this; costs throughput
    /// when oversubscribed). Off (`inf`) by default.
    #[arg(long, default_value_t = DEFAULTS.max_wait_s)]
    pub max_wait_s: f64,
    /// The measured waiting bound, used without --max-wait-s: with a host
    /// KV tier, a program queued this many median turn times rotates out
    /// an acting program resident as long, while the tier keeps the
    /// contexts rotated out. No effect without a tier; `inf` turns it off.
    #[arg(long, default_value_t = DEFAULTS.rotate_after_turns)]
    pub rotate_after_turns: f64,
    /// Past the tier: a program queued this many median turn times rotates
    /// out acting programs even when the host tier cannot keep them; their
    /// contexts are recomputed on return. `inf` turns it off.
    #[arg(long, default_value_t = DEFAULTS.recompute_after_turns)]
    pub recompute_after_turns: f64,
    /// Rotation past the tier only where the contexts it drops recompute
    /// within this share of a median turn (at the measured prefill rate).
    #[arg(long, default_value_t = DEFAULTS.recompute_turn_share)]
    pub recompute_turn_share: f64,
    /// How long a group announced with a size (`n` choices, `group_size`)
    /// waits for its missing members before it is admitted without them.
    #[arg(long, default_value_t = DEFAULTS.group_gather_s)]
    pub group_gather_s: f64,
    /// Base x of the per-tool decay x^(-R/Δ): a named tool's acting memory
    /// is weighted by its expected remaining time R from the durations
    /// observed for that tool; 1 disables it.
    #[arg(long, default_value_t = DEFAULTS.tool_decay_base)]
    pub tool_decay_base: f64,
    /// The largest share of a decoding step's time its prefill chunks take
    /// (the cap follows the replica's measured step time); 1 turns it off.
    #[arg(long, default_value_t = DEFAULTS.prefill_share)]
    pub prefill_share: f64,
    /// A replica with prompts still to prefill admits a new program only
    /// while all of them are computed within this many seconds at its
    /// measured prefill rate; `inf` turns the bound off.
    #[arg(long, default_value_t = DEFAULTS.admit_prefill_s)]
    pub admit_prefill_s: f64,
    /// With a host KV tier, a waiting program that fits nowhere pauses
    /// acting programs (their KV copied to the tier) for room, instead of
    /// waiting for room under lambda-min.
    #[arg(long, default_value_t = DEFAULTS.swap_for_waiting, action = clap::ArgAction::Set)]
    pub swap_for_waiting: bool,
    /// A program still resident when its tool returns, while the program
    /// queued longest fits no replica, queues behind it (its blocks stay
    /// cached) instead of starting at once.
    #[arg(long, default_value_t = DEFAULTS.yield_to_queue, action = clap::ArgAction::Set)]
    pub yield_to_queue: bool,
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
            max_bypass: self.max_bypass,
            max_wait_s: self.max_wait_s,
            rotate_after_turns: self.rotate_after_turns,
            recompute_after_turns: self.recompute_after_turns,
            recompute_turn_share: self.recompute_turn_share,
            group_gather_s: self.group_gather_s,
            tool_decay_base: self.tool_decay_base,
            prefill_share: self.prefill_share,
            admit_prefill_s: self.admit_prefill_s,
            swap_for_waiting: self.swap_for_waiting,
            yield_to_queue: self.yield_to_queue,
            ..SchedulerConfig::default()
        }
    }
}
