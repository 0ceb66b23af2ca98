use std::fmt;
use std::str::FromStr;

/// Which policy the engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    /// Program-level scheduling (docs/design.md §5).
    Program,
    /// Request-level baseline, like vLLM.
    Request,
}

impl FromStr for PolicyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "program" => Ok(Self::Program),
            "request" => Ok(Self::Request),
            other => Err(format!(
                "unknown policy '{other}' (expected program or request)"
            )),
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Program => "program",
            Self::Request => "request",
        })
    }
}

/// Where the program scheduler restores a program when its previous replica
/// has none of its blocks left (or no room).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The replica with the most room left (spreads load; each replica has its
    /// own compute, so packing one while others idle wastes throughput).
    MostRoom,
    /// The replica with the least room left that still fits (bin-packing best
    /// fit: keeps large holes for large programs).
    BestFit,
}

impl FromStr for Placement {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "most-room" => Ok(Self::MostRoom),
            "best-fit" => Ok(Self::BestFit),
            other => Err(format!(
                "unknown placement '{other}' (expected most-room or best-fit)"
            )),
        }
    }
}

/// Every knob of the scheduler (docs/design.md §5 has the rules and the
/// table of defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    pub policy: PolicyKind,
    /// Restore only while `D + need <= lambda_min * C`; with a host tier
    /// that has room for the band, up to `lambda_max * C`
    /// (`rotation.rs::admission_ceiling`).
    pub lambda_min: f64,
    /// Pause while `D > lambda_max * C`.
    pub lambda_max: f64,
    /// Base `x` of the acting-memory decay `f(t) = x^(-t/unit)`; 1 disables decay.
    pub decay_base: f64,
    /// Time unit Δ of the decay, seconds.
    pub decay_unit_s: f64,
    /// Blocks reserved per running sequence for decode growth.
    pub decode_reserve_blocks: usize,
    /// Aging of the restore queue: each second of waiting counts as this many
    /// fewer context tokens, so large programs are not starved by small ones.
    pub aging_tokens_per_s: f64,
    /// Inactivity lease: a program with no request for this long is terminated.
    pub lease_s: f64,
    /// Most sequences running on one replica (vLLM's `max_num_seqs`).
    pub max_running: usize,
    /// How stale (seconds) another replica's cached demand may be when placing.
    pub demand_refresh_s: f64,
    pub placement: Placement,
    /// Work conservation: a replica running nothing pauses acting programs
    /// for a program that has waited this long (seconds) and would not fit
    /// otherwise.
    pub idle_reclaim_after_s: f64,
    /// Bounded bypass: a queued program passed over by this many admissions
    /// of others is *overdue*: overdue programs are admitted first, oldest
    /// first, and the first that fits nowhere reserves a replica (see
    /// `admit.rs`), so no program is overtaken more than this many times.
    pub max_bypass: u64,
    /// Bounded waiting in time: a program queued this long (seconds) is
    /// overdue too, and may pause programs resident for at least this long
    /// to make room (acting ones first, then reasoning ones), so the oldest
    /// queued program waits at most about twice this. It costs throughput
    /// at high oversubscription (residency rotates, contexts are recomputed:
    /// `agentd simulate` swe at 96 programs, 298 -> 150 steps/min with 60 s):
    /// off (infinity) by default.
    pub max_wait_s: f64,
    /// The measured waiting bound (`rotation.rs`), used when `max_wait_s`
    /// is not set: with a host KV tier, a program queued this many median
    /// turn times is overdue and may rotate out acting programs resident
    /// as long, while the tier keeps the contexts rotated out. Without a
    /// tier it does nothing. Infinity turns it off. One turn: `agentd
    /// simulate` swe with a 4x tier, 768 programs on 8 replicas, 2592.5
    /// steps/min with p99/p50 2.8, against 2583.2 and 6.0 with two turns; the
    /// CPU swe bench at 96 programs 747 steps/min (p99/p50 1.35) against 730
    /// (1.86).
    pub rotate_after_turns: f64,
    /// Past the tier (`rotation.rs`): a program queued this many median
    /// turn times may rotate out acting programs resident as long even
    /// when the host tier cannot keep their contexts; those are parked for
    /// recompute (their blocks dropped when evicted), not swapped, so the
    /// tier keeps the contexts due back sooner. Without it, once the tier
    /// is full a queued program waits for residents to end their programs
    /// (30-135 turns). Priced by `recompute_turn_share`. Unpriced, in
    /// `agentd simulate` (H100 costs, copies beside the forward,
    /// 3.46M-token tier, 900 s, seeds 1 / 2), off -> 8 turns:
    /// bimodal at 192 programs 244.3 / 245.3 -> 243.4 / 243.7 steps/min,
    /// p99/p50 7.15 / 7.20 -> 3.01 / 3.02; swe at 192 244.2 / 254.0 ->
    /// 240.5 / 238.9, p99/p50 3.83 / 4.08 -> 3.18 / 3.09 (the request
    /// policy: swe 217.1 / 215.3 at 3.32 / 3.46, bimodal 239.6 / 236.7 at
    /// 2.08 / 2.22). 12 turns left p99/p50 at 3.5-3.8, 16 at 3.6-4.2; 6
    /// and 4 cut it to 2.6-2.8 and 2.2-2.4 for 2-3% and 4-6% of the
    /// steps/min. At 96 programs, on toolorch, at 768 programs on 8
    /// replicas and in the CPU shape the tier never fills and nothing
    /// changes (benches/results/sim-past-the-tier). Infinity turns it off.
    pub recompute_after_turns: f64,
    /// Rotation past the tier only where it is cheap: the contexts it
    /// drops must be recomputed (prefill at the replica's measured rate)
    /// within this share of a median turn. On a GPU a 20k-token context
    /// recomputes in well under a turn; on the CPU, where prefill is the
    /// bottleneck, a 3k-token one costs a fifth of a turn or more, and
    /// rotating anyway took steps/min (`agentd simulate --workload long`,
    /// 48 programs, 65,536-token pool, a 65,536 / 131,072-token tier,
    /// `--cost cpu-avx512`): 141.5 / 153.3 without the rotation, 89.3 /
    /// 126.9 with it unpriced, 138.8 / 153.3 at 0.2 (p99 100.5 -> 87.3 s
    /// on the first); `cpu-avx2` 113.5 / 129.8 without, 112.7 / 129.8 at
    /// 0.2 (p99 122.9 -> 102.9 s on the first). On H100
    /// costs at 192 programs 0.2 keeps p99/p50 at 3.7-4.0 (swe 242.0 /
    /// 248.5 steps/min, bimodal 249.2 / 245.0, seeds 1 / 2); 0.3 cost the
    /// CPU 3-12% and 0.1 left the H100 tails at 5.9-6.8.
    pub recompute_turn_share: f64,
    /// How long a group announced with a size waits for its missing members
    /// before it is admitted with those that arrived (seconds).
    pub group_gather_s: f64,
    /// Base `x` of the per-tool decay `x^(−R/Δ)` (`tools.rs`): a named
    /// tool's acting memory is weighted by its expected remaining time `R`
    /// rather than by the global decay; 1 (the default, as for the global
    /// decay) disables it. Named tools set the pause order whatever this is.
    pub tool_decay_base: f64,
    /// The largest share of a decoding step's time its prefill chunks may
    /// take: the chunks of a step that decodes get at most
    /// `share / (1 - share)` times the decodes' own predicted time (the
    /// fit of the replica's measured steps, `rates.rs`), so each output
    /// token waits at most `1 / (1 - share)` decode steps. 1 turns the cap
    /// off (every step takes prefill up to the token budget). Off by
    /// default: no regime measured so far gains from it. `agentd simulate
    /// --workload long` (32,768-token pool, a 262,144-token tier, 2048-token
    /// budget, 600 s) at 16 / 48 programs: on `--cost cpu-avx2` 117.0 /
    /// 121.4 steps/min off, 116.6 / 121.4 at 0.9, 115.4 / 119.9 at 0.8,
    /// 114.3 / 119.0 at 0.6; on `cpu-portable` (long prefills the
    /// bottleneck) 52.8 / 58.1 off against 52.0-52.3 / 57.3-57.9. On the
    /// engine (AMD EPYC, forced avx2 kernels, 16 programs of ~4k-token
    /// contexts joining mid-history, single runs) 0.8 ran 81.5 steps/min,
    /// p99 50.9 s, against 81.0, 28.8 s without the cap.
    pub prefill_share: f64,
    /// Compute-bounded admission: a replica with prompts still to prefill
    /// takes a new program only while all of it — theirs and the new
    /// one's — is computed within this many seconds at the replica's
    /// measured prefill rate (`rates.rs`), so admitted programs finish
    /// their turns instead of all waiting on one long prefill queue. A
    /// replica with nothing to prefill takes any program (work
    /// conservation), restores are not bounded (their context mostly comes
    /// back from the cache or the host tier), and an overdue program is
    /// admitted whatever the bound. Infinity turns it off, the default:
    /// in `agentd simulate --workload long` it bound nothing above 2 s
    /// (identical runs at 5, 10, 20, 30 s and off, on cpu-avx2,
    /// cpu-avx512 and cpu-portable costs at 16 and 48 programs): a new
    /// program there arrives behind at most a turn's prefill, and at 2 s
    /// it changed 52.8 to 52.3 steps/min (cpu-portable, 16 programs).
    pub admit_prefill_s: f64,
    /// Admission swaps for room: with a host KV tier, a waiting program
    /// that fits nowhere pauses acting programs of the replica (pause
    /// order; never those whose tool is expected back sooner than their
    /// copies, `park.rs`) while the tier keeps what they park, instead of
    /// waiting for room under λmin. The tier turns an acting program's
    /// blocks into memory a copy brings back, so holding a reasoning
    /// program back for them only leaves it queued. On by default. The
    /// CPU agentic bench (AMD EPYC, avx512 kernels, qwen3-bench shape,
    /// 2,048 blocks of 32, the default 2 GiB tier) at 192 programs, ABBA:
    /// 714 steps/min, p99 17.5 / 19.5 s, against the request policy's 703,
    /// 19.6 / 18.1 s; before it (and before the tier gate stopped counting
    /// the shared system prompt once per parked program, `rotation.rs`) the
    /// program policy ran 0.94x the request policy with p99 34-40 s, 11%
    /// of its requests queued 20-40 s. `agentd simulate` swe with a 3.46M-
    /// token tier (H100): 96 programs 329.5 -> 332.1 steps/min (p99 31.0 ->
    /// 28.8 s), 192 programs 323.0 -> 325.9 (134.4 -> 129.8 s), at ~1.5x
    /// the scheduling time per step (234 -> 357 µs at 96). It applies to
    /// a single replica only: with 8 replicas (768 programs, same tier) it
    /// made room on whichever replica stepped and unbalanced them (kv
    /// imbalance 0.05 -> 0.53, 2617.6 -> 2488.6 steps/min, p99 36 -> 66 s,
    /// against the request policy's 2681.2); placement-aware swapping is
    /// not built. Re-measured on the CPU presets in steady state (2026-12-07,
    /// `--workload long`, 65,536-token pool, 3,600 s after 3,600 s): off
    /// against on, avx512 155.7 / 155.0 against 156.3 / 154.6 steps/min at
    /// 16 / 48 programs, avx2 131.4 / 129.9 against 131.6 / 128.4, within
    /// 1.2% either way, but p99 at 16 programs 8.1 against 5.8 s (avx512)
    /// and 10.5 against 8.0 s (avx2); with a one-pool tier at 48 134.8
    /// against 134.1 and 111.2 against 110.5. So it stays on.
    pub swap_for_waiting: bool,
    /// Returning residents yield to an overdue queue: a program still
    /// resident when its tool returns, while the program queued longest is
    /// overdue (a median turn), fits no replica and the host tier keeps
    /// what the yielder parks, is paused there (blocks cached, evictable)
    /// and queued like the rest (`Route::Yield`, the rule in
    /// `program_policy.rs::yields`) instead of starting at once ahead of
    /// programs that waited longer. The request policy's FCFS does the
    /// same by construction. Off by default; measured (AMD EPYC, avx512):
    /// * the CPU long cell, GQA-1, 48 programs, against the default:
    ///   1.01x, p99 55.1 vs 57.4 s, no request started ahead of the queue
    ///   against 5-17 of ~200 (benches/results/pair-gqa1-long-48-yield-
    ///   overdue); the first rule (no overdue condition) against the
    ///   request policy: 0.99x, p99 55.3 vs 55.4 s, where the default read
    ///   1.11-1.12x request's p99 (pair-gqa1-long-48-yield-request);
    /// * 16 programs (swe and long cells): no program is overdue, no yield,
    ///   the same decisions (pair-swe-16-yield, pair-long-16-yield-overdue);
    /// * `agentd simulate`, H100, 3.46M-token tier, off -> on: swe 96 the
    ///   same, 192 272.4 -> 272.8 steps/min with p99 208.8 -> 194.4 s;
    ///   toolorch 96 / 192 the same within 0.2%; bimodal 96 the same, 192
    ///   260.8 -> 262.3 with p99 **136.6 -> 189.3 s**; 768 programs on 8
    ///   replicas 2574.4 -> 2562.0, kv imbalance 0.11 -> 0.18. Not better
    ///   everywhere, so not the default. The bimodal tail is not the
    ///   yielder's place in the shortest-first queue: queued ahead of every
    ///   program not overdue (a zero-length key) it read the same 189.3 s.
    ///   (These figures priced tier copies at 3 ns a token, `agentd-sim`
    ///   `cost.rs`.) The tail was a convoy behind a full tier, which
    ///   `recompute_after_turns` now breaks: seeds 1-6 read p99 131-202 s
    ///   with this option off too. With copies priced right (3 µs a token,
    ///   beside the forward) and that rotation unpriced, at 192 programs (seeds 1 /
    ///   2) bimodal reads 243.4 / 243.7 steps/min at p99/p50 3.01 / 3.02
    ///   off and 242.2 / 242.7 at 2.92 / 3.40 on; swe 240.5 / 238.9 at
    ///   3.18 / 3.09 off and 238.7 / 238.9 at 3.02 / 3.09 on. No gain.
    pub yield_to_queue: bool,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl SchedulerConfig {
    /// The defaults, measured with `agentd simulate` (H100 cost model, swe,
    /// toolorch and bimodal workloads at 48-192 programs; docs/results):
    /// * no decay (x = 1), where the first design had x = 2, Δ = 1 s and the
    ///   previous default was Δ = 10 s: a decayed acting program's blocks
    ///   are lent to admissions while it still references them, so when its
    ///   tool returns the pool runs out mid-decode and programs are paused
    ///   and recomputed. At 96 programs decay x = 2, Δ = 10 s gave toolorch
    ///   124 steps/min (hit 0.68) against 159 (0.88) without; bimodal 183
    ///   against 264; swe 301 against 305. The decode step is bound by KV
    ///   reads at these batches, so more resident programs add little while
    ///   every lent block costs a recompute. An idle replica still takes
    ///   acting programs' blocks at once (work conservation). With the
    ///   host tier a lent block costs a copy instead, so decay was tried
    ///   again there (2026-12-07, `agentd simulate --workload long`,
    ///   65,536-token pool, 524,288-token tier, 3,600 s after 1,800 s):
    ///   at 48 / 96 programs x = 2 gave avx512 155.7-155.9 / 152.7-152.8
    ///   steps/min against 155.7 / 152.7 without (Δ 1 s and 10 s), avx2
    ///   129.0-129.1 / 129.2-129.4 against 129.0 / 129.5, seeds 2-3
    ///   within 0.2% too, and the H100 preset (3.46M-token tier, 96
    ///   programs) swe 268.3 against 267.9, toolorch 170.2 against 170.2
    ///   (benches/results/sim-decay-tier), with more recomputed: with
    ///   the contexts in the tier the step's compute bounds what a lent
    ///   block buys (on the CPU a decoder more a step saves only its
    ///   share of the 13 ms weight stream). So no decay with a tier
    ///   either.
    /// * λmin = 0.95 (the first design: 0.9): the narrower band keeps
    ///   replicas' usage within a few percent of each other. On the CPU
    ///   benchmark's 65,536-token pool it also ran faster with a shorter
    ///   tail than 0.8 (benches/results/thunderagent-l95.md against
    ///   thunderagent-rerun.md), so the bench scripts use it too. Its cost
    ///   past the knee on the CPU: the pool holds 0.90-0.91 full against the
    ///   request policy's 0.97 (demand counts promised prefill), 16.0
    ///   sequences decode per step against 17.2, 1.00x request
    ///   (benches/results/pair-gqa4-hd128-long-48-metrics). λmin = 1.0
    ///   closed that gap for 1.01x, p99 1.04x (pair-gqa4-hd128-long-48-l100), within the
    ///   passes' spread; on the GQA-1 card it read 0.98x λmin 0.95, the
    ///   larger decode batch no cheaper per request, with p99 84 vs 63 s
    ///   (pair-gqa1-long-48-l100); the simulator's slowest steps grew 30.6
    ///   -> 52.1 s (96 programs, H100, host tier) and without a tier
    ///   throughput fell 295.5 -> 255.5 steps/min. So 0.95 stays.
    ///   Re-measured in steady state with the tier on by default
    ///   (benches/results/sim-fit-copy-heavy, H100 preset): λmin 0.98 /
    ///   1.0 bought 0.5% / 0.8% at swe 96 (0.995x request -> 1.00x) and
    ///   cost the 192-program tails: p99 64.8 -> 87.3 / 85.7 s (swe),
    ///   79.1 -> 134.9 s at 1.0 (toolorch). That toolorch tail was new
    ///   programs: the smallest reasoning programs, paused first when
    ///   demand passed λmax·C, queued anew behind a whole waiting bound;
    ///   a request paused mid-turn now keeps its place (`queue.rs`). And
    ///   the band now closes only while the host tier has room for it
    ///   (`rotation.rs::admission_ceiling`), so λmin 0.95 applies where
    ///   pauses would drop contexts (benches/results/sim-band).
    /// * a program passed over 16 times is admitted first: the slowest
    ///   request at 96 swe programs 401 -> 279 s, at 192 989 -> 542 s, at
    ///   no cost in steps/min.
    pub const DEFAULT: Self = Self {
        policy: PolicyKind::Program,
        lambda_min: 0.95,
        lambda_max: 1.0,
        decay_base: 1.0,
        decay_unit_s: 10.0,
        decode_reserve_blocks: 1,
        aging_tokens_per_s: 256.0,
        lease_s: 1800.0,
        max_running: 256,
        demand_refresh_s: 0.25,
        placement: Placement::MostRoom,
        idle_reclaim_after_s: 0.0,
        max_bypass: 16,
        max_wait_s: f64::INFINITY,
        rotate_after_turns: 1.0,
        recompute_after_turns: 8.0,
        recompute_turn_share: 0.2,
        group_gather_s: 0.05,
        tool_decay_base: 1.0,
        prefill_share: 1.0,
        admit_prefill_s: f64::INFINITY,
        swap_for_waiting: true,
        yield_to_queue: false,
    };

    /// `f(t) = x^(-t/Δ)`: the weight of an acting program's exclusive memory
    /// `t` seconds into its tool call.
    pub fn decay(&self, t: f64) -> f64 {
        decay(self.decay_base, self.decay_unit_s, t)
    }

    /// `x^(-R/Δ)` with the per-tool base: the weight of an acting program
    /// whose tool is expected to run `R` more seconds.
    pub fn tool_decay(&self, remaining: f64) -> f64 {
        decay(self.tool_decay_base, self.decay_unit_s, remaining)
    }

    /// Checks the relations the policy relies on.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0 < self.lambda_min && self.lambda_min <= self.lambda_max && self.lambda_max <= 1.0)
        {
            return Err(format!(
                "need 0 < lambda_min <= lambda_max <= 1, got {} / {}",
                self.lambda_min, self.lambda_max
            ));
        }
        if self.decay_base < 1.0 || self.tool_decay_base < 1.0 || self.decay_unit_s <= 0.0 {
            return Err("decay base must be >= 1 and its unit > 0".into());
        }
        if self.max_wait_s.is_nan()
            || self.max_wait_s <= 0.0
            || self.rotate_after_turns.is_nan()
            || self.rotate_after_turns <= 0.0
            || self.recompute_after_turns.is_nan()
            || self.recompute_after_turns <= 0.0
            || self.recompute_turn_share.is_nan()
            || self.recompute_turn_share < 0.0
            || self.group_gather_s < 0.0
            || self.idle_reclaim_after_s < 0.0
        {
            return Err(
                "max_wait_s, rotate_after_turns, recompute_after_turns must be > 0, group_gather_s, idle_reclaim_after_s and recompute_turn_share >= 0"
                    .into(),
            );
        }
        if self.admit_prefill_s.is_nan() || self.admit_prefill_s <= 0.0 {
            return Err(format!(
                "admit_prefill_s must be > 0, got {}",
                self.admit_prefill_s
            ));
        }
        if !(self.prefill_share > 0.0 && self.prefill_share <= 1.0) {
            return Err(format!(
                "prefill_share must be in (0, 1], got {}",
                self.prefill_share
            ));
        }
        if self.max_running == 0 {
            return Err("max_running must be at least 1".into());
        }
        Ok(())
    }
}

fn decay(base: f64, unit_s: f64, t: f64) -> f64 {
    if base <= 1.0 || unit_s <= 0.0 {
        return 1.0;
    }
    base.powf(-t.max(0.0) / unit_s)
}
