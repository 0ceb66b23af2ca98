//! The waiting bound's period, and what a rotation may cost (issue 12).
//!
//! Bounded waiting (`admit.rs`) pauses residents for *overdue* programs, so
//! that residency rotates instead of some programs waiting without bound.
//! Each rotated-out context must come back: by copies from the host KV tier
//! when the tier still holds it, else by recompute. Two rules make that
//! rotation cheap by construction rather than by tuning:
//!
//! * **The period follows the step.** With `rotate_after_turns = k` the
//!   bound is `k` median *turn* times (a request's time from arrival, or
//!   its program's restore, to its last token), measured by the scheduler
//!   itself from the `now`s it is given: one flag fits a 1.5 s swe step on
//!   a CPU and a 20 s long-context step alike (a fixed 3 s bound rotated the
//!   CPU long workload mid-turn).
//! * **Rotation is bounded by the tier.** A resident is paused for an
//!   overdue program only while the contexts parked on that replica (its
//!   paused programs', which only the tiers keep, less the blocks that
//!   residents still hold) fit [`HOST_KEEP_FRACTION`] of its host tier
//!   afterwards, and only while it
//!   is acting (between turns: a turn is never cut for rotation). Past that
//!   the tier would drop the contexts due back next and every rotation
//!   would recompute (`agentd simulate` swe at 192 programs collapsed from
//!   313 to 21.6 steps/min with a 10 s bound); instead the program policy
//!   falls back to its waiting order. With no tier nothing is rotated, and
//!   the policy is exactly the one without this bound: rotating acting
//!   programs out to recompute them on return costs far more than it takes
//!   off the tail (`agentd simulate` swe, H100 costs, no tier, 96 / 192
//!   programs: 304.9 / 297.4 steps/min with p99 170.5 / 478.1 s unrotated;
//!   a bound of 2 median turns 138.8 / 138.3, p99 132.6 / 294.5 s; 4 turns
//!   189.9 / 167.8, 131.2 / 327.3 s; 8 turns 231.3 / 208.2, 148.2 / 364.4 s).
//!
//! * **Past the tier, only a long wait rotates, by recompute.** Once the
//!   tier is full a queued program would wait for residents to end their
//!   programs (30-135 turns of swe): at 192 swe or bimodal programs with a
//!   3.46M-token tier the p99 turn was 3.8-7.2x the median, a convoy of
//!   long contexts restored together after 140-220 s. A program queued
//!   `recompute_after_turns` (default 8) median turns rotates acting
//!   residents out anyway, parked for recompute: a context just rotated
//!   out is the one due back last, so its blocks are the ones to drop
//!   (Belady), and the tier keeps those due back sooner. Only where that
//!   is cheap: the victims' prefill at the replica's measured rate must
//!   fit `recompute_turn_share` (0.2) of a median turn. On H100 costs
//!   that holds for 20k-token contexts and cuts bimodal's p99/p50 from
//!   7.2 to 3.7-3.8; on the CPU, where prefill is the bottleneck, it
//!   mostly does not, and rotating anyway cost up to 37% of the
//!   steps/min (`config.rs` has the figures).
//!
//! An explicit `max_wait_s` is the user's hard bound: it rotates whatever
//! the tier holds (`admit.rs` states its guarantee).

use crate::program::Program;
use crate::{Memory, Park, Phase, ProgramId, ProgramScheduler, State};

/// Part of a host tier that contexts parked by rotation may fill: the
/// rest absorbs blocks shared among parked programs but no resident
/// (counted once per program here) and the copies of onloaded blocks.
pub(crate) const HOST_KEEP_FRACTION: f64 = 0.9;

/// The shortest measured bound (seconds): requests that end at once
/// (`max_tokens` 1, errors) must not make every step rotate.
const MIN_BOUND_S: f64 = 1.0;

/// The bound one decision applies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct WaitBound {
    /// Queued this long (seconds), a program is overdue; residents this
    /// long may be paused for it. Infinite: no bound.
    pub after_s: f64,
    /// The bound is the measured one (`rotate_after_turns`): rotation
    /// pauses acting programs only, within the host tier's room.
    pub gated: bool,
    /// Queued this long, a program may rotate acting programs out past
    /// the tier's room, for recompute (`recompute_after_turns`; infinite
    /// when off, without a tier or under `max_wait_s`).
    pub recompute_after_s: f64,
}

impl ProgramScheduler {
    /// `max_wait_s` when set; else `rotate_after_turns` median turns while
    /// some replica has a host tier; else none.
    pub(crate) fn wait_bound(&self, mem: &dyn Memory) -> WaitBound {
        if self.cfg.max_wait_s.is_finite() {
            return WaitBound {
                after_s: self.cfg.max_wait_s,
                gated: false,
                recompute_after_s: f64::INFINITY,
            };
        }
        let tier = (0..mem.num_replicas()).any(|r| mem.host_capacity(r) > 0);
        let turns = |k: f64| match self.turns.median() {
            Some(m) if tier && k.is_finite() => (k * m).max(MIN_BOUND_S),
            _ => f64::INFINITY,
        };
        let after_s = turns(self.cfg.rotate_after_turns);
        WaitBound {
            after_s,
            gated: true,
            recompute_after_s: turns(self.cfg.recompute_after_turns).max(after_s),
        }
    }

    /// A request of `p` finished now: its turn time joins the median.
    pub(crate) fn record_turn(&mut self, p: ProgramId, now: f64) {
        if let Some(prog) = self.programs.get(&p) {
            self.turns
                .record(now - prog.request_at.max(prog.admitted_at));
        }
    }

    /// Whether `q` may be paused for an overdue program under `bound`.
    pub(crate) fn rotatable(&self, q: &Program, now: f64, bound: WaitBound) -> bool {
        now - q.admitted_at >= bound.after_s && (!bound.gated || q.phase == Phase::Acting)
    }

    /// Whether `q`'s context is parked on `l`: paused there, so only the
    /// tiers keep its KV. A program paused for recompute is not: its blocks are dropped when
    /// evicted (`park.rs`), so no tier keeps them.
    pub(crate) fn parked_on(q: &Program, l: usize) -> bool {
        q.state == State::Paused && q.replica == Some(l) && q.park != Some(Park::Recompute)
    }

    /// Blocks a context parked on `l` by pausing `p` takes in the tier
    /// that no resident program keeps on the device: its context (or what
    /// it holds when decoding grew it past the last request, as
    /// [`Self::mark_paused`] records it) less the blocks residents share
    /// with it. The tier keeps a block once however many programs parked
    /// it, and blocks residents reference (the common system prompt) stay
    /// on the device: counted per program, a 1,024-token system prompt
    /// made 40% of the CPU bench's parked contexts at 192 programs, the
    /// gate shut while the tier still had room, and programs queued behind
    /// the residents for 20-40 s (p99 2.3x the request policy's).
    pub(crate) fn parked_size(&self, l: usize, p: ProgramId, mem: &dyn Memory) -> f64 {
        let Some(q) = self.programs.get(&p) else {
            return 0.0;
        };
        let context = mem.blocks_for(q.context_tokens);
        let resident = q.state == State::Active && q.replica == Some(l);
        let (size, shared) = if resident {
            let held = mem.blocks_held(l, p);
            (context.max(held), held - mem.exclusive(l, p).min(held))
        } else {
            (context, mem.shared_prefix(l, p))
        };
        size.saturating_sub(shared) as f64
    }

    /// Blocks of the contexts parked on `l`: programs paused there, whose
    /// KV only the tiers keep.
    pub(crate) fn parked_blocks(&self, l: usize, mem: &dyn Memory) -> f64 {
        self.programs
            .iter()
            .filter(|(_, q)| Self::parked_on(q, l))
            .map(|(p, _)| self.parked_size(l, *p, mem))
            .sum()
    }

    /// The share of `r`'s pool admissions may fill. The band between λmin
    /// and λmax is room left for residents' growth (a tool's output,
    /// decoded tokens), so that it pauses no one; a pause is dear when it
    /// drops a context to recompute, cheap when the host tier keeps it. So
    /// the band is closed (the ceiling is λmax) while the tier holds,
    /// besides the contexts parked there, a band's worth more within
    /// [`HOST_KEEP_FRACTION`]: growth then pauses acting programs into the
    /// tier, and the fuller pool decodes larger batches. Open, the pool ran
    /// 0.94 full against the request policy's 0.99 and took 4.2% more
    /// engine steps for the same tokens (`agentd simulate` toolorch, 96
    /// programs, H100, 3.46M-token tier: 169.4 steps/min against 170.4).
    /// Closing it everywhere (λmin 1.0) cost where the tier fills: swe at
    /// 192 programs p99 64.8 -> 82.7 s (520k tokens recomputed against
    /// 170k), and the CPU long cell with a one-pool tier 134.1 -> 124.2
    /// steps/min (`cpu-avx512`, 48 programs; `cpu-avx2` 110.5 -> 101.2).
    ///
    /// Measuring the parked contexts walks every program, so the ceiling
    /// is cached for `demand_refresh_s`, as the demand is: measured at
    /// every decision it doubled the scheduling time per step at 192
    /// programs (352 -> 789 µs, swe).
    pub(crate) fn admission_ceiling(&mut self, r: usize, now: f64, mem: &dyn Memory) -> f64 {
        let (lo, hi) = (self.cfg.lambda_min, self.cfg.lambda_max);
        if lo >= hi || mem.host_capacity(r) == 0 {
            return lo;
        }
        match self.ceiling.get(r) {
            Some(&(c, at)) if now - at <= self.cfg.demand_refresh_s => return c,
            None => return lo,
            _ => {}
        }
        let band = (hi - lo) * mem.capacity(r) as f64;
        let c = if self.parked_blocks(r, mem) + band <= Self::parking_room(r, mem) {
            hi
        } else {
            lo
        };
        self.ceiling[r] = (c, now);
        c
    }

    /// Whether `l`'s host tier keeps what pausing `victims` parks, once
    /// `unit`'s members parked on `l` leave it.
    pub(crate) fn tier_keeps(
        &self,
        l: usize,
        parked: f64,
        victims: impl Iterator<Item = ProgramId>,
        unit: &[ProgramId],
        mem: &dyn Memory,
    ) -> bool {
        let leaving: f64 = unit
            .iter()
            .filter(|m| self.programs.get(m).is_some_and(|q| Self::parked_on(q, l)))
            .map(|m| self.parked_size(l, *m, mem))
            .sum();
        let parking: f64 = victims.map(|v| self.parked_size(l, v, mem)).sum();
        parked - leaving + parking <= Self::parking_room(l, mem)
    }

    /// Blocks of `l`'s host tier that parked contexts may fill
    /// ([`HOST_KEEP_FRACTION`] of it): the one bound both the tier gate
    /// and the admission ceiling read.
    fn parking_room(l: usize, mem: &dyn Memory) -> f64 {
        HOST_KEEP_FRACTION * mem.host_capacity(l) as f64
    }
}

#[cfg(test)]
mod tests {
    use crate::tools::{ToolStats, MIN_SAMPLES, SAMPLES};

    #[test]
    fn the_median_waits_for_enough_turns_and_follows_the_last_window() {
        let mut t = ToolStats::default();
        for _ in 0..MIN_SAMPLES - 1 {
            t.record(1.0);
        }
        assert_eq!(t.median(), None);
        t.record(3.0);
        assert_eq!(t.median(), Some(1.0));
        for _ in 0..SAMPLES {
            t.record(20.0);
        }
        assert_eq!(t.median(), Some(20.0), "old turns leave the window");
        t.record(f64::NAN);
        t.record(-1.0);
        assert_eq!(t.median(), Some(20.0), "nonsense times are ignored");
    }
}
