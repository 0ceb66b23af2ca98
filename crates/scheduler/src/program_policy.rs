//! The program scheduler (docs/design.md §5).
//!
//! Demand of replica L with capacity C blocks:
//!
//! ```text
//! D(L) = |blocks referenced on L|
//!        − Σ_{q acting} excl(q)·(1 − f(now − since_q))
//!        + Σ_{q reasoning} unprefilled(q) + r·running(L)
//! ```
//!
//! Blocks referenced by reasoning programs count fully (shared ones once, since
//! the pool counts distinct blocks), and so do the blocks of their prompts not
//! prefilled yet; an acting program's exclusive blocks count with the decay
//! `f`, because the longer its tool runs the cheaper it is to let them go.
//! Blocks shared only among acting programs are counted fully — a
//! conservative over-estimate that keeps the computation O(programs on L).
//!
//! * Pause while `D > λmax·C`: acting before reasoning, shortest first.
//! * Restore while `D + need ≤ λmin·C`, from the global queue in its order,
//!   placing each program by the configured placement (most room by default,
//!   or best fit), but on its previous replica while its own cached blocks
//!   survive there (`admit.rs`). λmin < λmax is the hysteresis that stops a
//!   program from being restored only to be paused again a step later.

use std::collections::BTreeSet;

use tracing::debug;

use crate::groups::{GroupJoin, GroupTable};
use crate::program::{Program, ProgramTable};
use crate::queue::{QueueClass, WaitingQueue};
use crate::tools::{ToolId, ToolStats, ToolTable};
use crate::{
    Decision, Memory, Park, PauseCause, Phase, Policy, PolicyStats, ProgramId, Route,
    SchedulerConfig, State,
};

/// Program-level policy state: the program table, per-replica active sets and
/// the global waiting queue.
pub struct ProgramScheduler {
    pub(crate) cfg: SchedulerConfig,
    pub(crate) programs: ProgramTable,
    /// Active programs per replica (ordered: deterministic iteration).
    pub(crate) active: Vec<BTreeSet<ProgramId>>,
    pub(crate) queue: WaitingQueue,
    /// Reasoning programs active per replica (the `running(L)` of the demand).
    pub(crate) running: Vec<usize>,
    /// Last computed demand per replica and when (for placement elsewhere).
    pub(crate) demand: Vec<(f64, f64)>,
    /// Last computed admission ceiling per replica and when
    /// (`rotation.rs::admission_ceiling`).
    pub(crate) ceiling: Vec<(f64, f64)>,
    pub(crate) groups: GroupTable,
    pub(crate) tools: ToolTable,
    /// Recent turn times: the period of the measured waiting bound.
    pub(crate) turns: ToolStats,
    pub(crate) stats: PolicyStats,
}

impl ProgramScheduler {
    pub fn new(cfg: SchedulerConfig, num_replicas: usize) -> Self {
        let queue = WaitingQueue::new(cfg.aging_tokens_per_s);
        Self {
            cfg,
            programs: ProgramTable::default(),
            active: vec![BTreeSet::new(); num_replicas.max(1)],
            queue,
            running: vec![0; num_replicas.max(1)],
            demand: vec![(0.0, f64::NEG_INFINITY); num_replicas.max(1)],
            ceiling: vec![(0.0, f64::NEG_INFINITY); num_replicas.max(1)],
            groups: GroupTable::default(),
            tools: ToolTable::default(),
            turns: ToolStats::default(),
            stats: PolicyStats::default(),
        }
    }

    /// Programs active on `replica`, in id order (introspection and tests).
    pub fn active_programs(&self, replica: usize) -> impl Iterator<Item = ProgramId> + '_ {
        self.active.get(replica).into_iter().flatten().copied()
    }

    /// The global waiting queue, in admission order (introspection and tests).
    pub fn queue(&self) -> &WaitingQueue {
        &self.queue
    }

    /// `f` for an acting program now: its tool's remaining time when it named
    /// one with enough history (`tools.rs`), else the elapsed-time decay.
    pub(crate) fn acting_weight(&self, prog: &Program, now: f64) -> f64 {
        if self.cfg.tool_decay_base > 1.0 {
            if let Some(r) = self.expected_remaining(prog, now) {
                return self.cfg.tool_decay(r);
            }
        }
        self.cfg.decay(now - prog.acting_since)
    }

    /// `D(L)` as defined in the module docs, in blocks.
    pub fn demand(&self, l: usize, now: f64, mem: &dyn Memory) -> f64 {
        let mut d = mem.referenced(l) as f64;
        for p in &self.active[l] {
            let Some(prog) = self.programs.get(p) else {
                continue;
            };
            match prog.phase {
                Phase::Acting => {
                    let f = self.acting_weight(prog, now);
                    d -= mem.exclusive(l, *p) as f64 * (1.0 - f);
                }
                // Blocks of a prompt admitted but not prefilled yet are not
                // referenced yet; counting them now stops the next steps from
                // admitting into room that is already promised.
                Phase::Reasoning => {
                    let want = mem.blocks_for(prog.context_tokens);
                    d += want.saturating_sub(mem.blocks_held(l, *p)) as f64;
                }
            }
        }
        d + (self.cfg.decode_reserve_blocks * self.running[l]) as f64
    }

    /// Applies `change` to `p`'s record, keeping the per-replica running
    /// counts (active reasoning programs) exact.
    pub(crate) fn update(&mut self, p: ProgramId, change: impl FnOnce(&mut Program)) {
        let Some(prog) = self.programs.get_mut(&p) else {
            return;
        };
        let before = prog.running_on();
        change(prog);
        let after = prog.running_on();
        if before != after {
            if let Some(r) = before {
                self.running[r] -= 1;
            }
            if let Some(r) = after {
                self.running[r] += 1;
            }
        }
    }

    /// Active programs of `l` in pause order: acting first, then shortest first
    /// (fewest blocks held: recompute ∝ c², so short ones are cheapest to lose).
    /// Acting programs in a named tool whose durations are known go by their
    /// expected remaining time first: one 5 s into a 20 s test run before one
    /// in a 0.3 s read, which is back before its blocks could serve anyone;
    /// those with a tool expected back within a second, and the unnamed ones,
    /// keep the shortest-first order among themselves.
    pub(crate) fn pause_order(
        &self,
        l: usize,
        now: f64,
        mem: &dyn Memory,
    ) -> Vec<(ProgramId, Phase, usize)> {
        let mut v: Vec<(ProgramId, Phase, usize, u64)> = self.active[l]
            .iter()
            .filter_map(|p| {
                let prog = self.programs.get(p)?;
                let remaining = match prog.phase {
                    Phase::Acting => self.expected_remaining(prog, now).unwrap_or(0.0),
                    Phase::Reasoning => 0.0,
                };
                // Whole seconds, longest first; below one second, no tier.
                let tier = u64::MAX - remaining.clamp(0.0, 1e9) as u64;
                Some((*p, prog.phase, mem.blocks_held(l, *p), tier))
            })
            .collect();
        v.sort_by_key(|&(p, phase, held, tier)| (phase == Phase::Reasoning, tier, held, p));
        v.into_iter().map(|(p, ph, h, _)| (p, ph, h)).collect()
    }

    /// The expected remaining acting time of `prog`, when it named a tool
    /// with enough observed durations.
    pub(crate) fn expected_remaining(&self, prog: &Program, now: f64) -> Option<f64> {
        let tool = prog.tool?;
        self.tools.expected_remaining(tool, now - prog.acting_since)
    }

    /// Marks `p` paused; a reasoning program's request goes back to the queue.
    pub(crate) fn mark_paused(&mut self, p: ProgramId, now: f64, mem: &dyn Memory) {
        self.mark_paused_as(p, now, mem, None);
    }

    /// [`Self::mark_paused`], its KV's fate `park` when given (else priced,
    /// `park.rs`).
    pub(crate) fn mark_paused_as(
        &mut self,
        p: ProgramId,
        now: f64,
        mem: &dyn Memory,
        park: Option<Park>,
    ) {
        let Some(l) = self.programs.get(&p).and_then(|q| q.replica) else {
            return;
        };
        // Before it leaves the active set: its blocks are still counted
        // held, and it is not yet among the contexts parked on `l`.
        self.choose_park(l, p, mem, park);
        self.active[l].remove(&p);
        // The context grew by decoding since the request arrived.
        let held_tokens = mem.blocks_held(l, p) * mem.block_size();
        self.update(p, |prog| {
            prog.context_tokens = prog.context_tokens.max(held_tokens);
            prog.state = State::Paused;
            prog.shared_estimate = None;
        });
        let Some(prog) = self.programs.get_mut(&p) else {
            return;
        };
        if prog.phase == Phase::Reasoning && !prog.waiting {
            // Paused mid-request: the request waits from when it arrived
            // (`WaitingQueue::push`), not from now. Queued anew, a program
            // paused in its first turn — the smallest reasoning program,
            // so the first paused when demand passes λmax·C — waited a
            // whole waiting bound again: `agentd simulate` toolorch at 192
            // programs (H100, 3.46M-token tier) with λmin 1.0 paused 1,185
            // first turns this way, first requests p50 84.6 s against the
            // others' 57.5 s.
            let since = prog.request_at.min(now);
            prog.waiting = true;
            prog.waiting_since = since;
            self.queue
                .push(p, QueueClass::Restore, prog.context_tokens, since);
        }
    }

    /// Thrashing test on `l`: pause until `D ≤ λmax·C`.
    fn relieve(&mut self, l: usize, now: f64, mem: &dyn Memory, out: &mut Decision) -> f64 {
        let mut d = self.demand(l, now, mem);
        let cap = self.cfg.lambda_max * mem.capacity(l) as f64;
        if d <= cap {
            return d;
        }
        let mut kept = Vec::new();
        for (p, phase, held) in self.pause_order(l, now, mem) {
            if d <= cap {
                break;
            }
            let freed = self.freed_by_pausing(l, p, phase, held, now, mem);
            if phase == Phase::Acting && freed < 1.0 {
                // Its memory already counts as (almost) free in D: pausing it
                // would not bring D down, only throw away a cache that costs
                // nothing until blocks actually run out (then `preempt` takes it).
                continue;
            }
            if self.keeps(l, p, now, mem) {
                kept.push(p);
                continue;
            }
            debug!(replica = l, program = %p, ?phase, held, demand = d, cap, "thrashing: pause");
            self.mark_paused(p, now, mem);
            out.pause.push((p, PauseCause::Thrashing));
            d -= freed;
        }
        self.note_kept(&kept);
        d
    }

    /// What pausing `p` takes off `D(l)`: an acting program its weighted
    /// exclusive blocks; a reasoning one its whole term — the blocks only it
    /// references, the blocks of its prompt not prefilled yet, its reserve.
    pub(crate) fn freed_by_pausing(
        &self,
        l: usize,
        p: ProgramId,
        phase: Phase,
        held: usize,
        now: f64,
        mem: &dyn Memory,
    ) -> f64 {
        let excl = mem.exclusive(l, p) as f64;
        let Some(prog) = self.programs.get(&p) else {
            return excl;
        };
        match phase {
            Phase::Acting => excl * self.acting_weight(prog, now),
            Phase::Reasoning => {
                let want = mem.blocks_for(prog.context_tokens);
                excl + want.saturating_sub(held) as f64 + self.cfg.decode_reserve_blocks as f64
            }
        }
    }

    /// Blocks `p` would add when restored: its context plus the decode
    /// reserve, less the leading blocks of its chain that other programs
    /// reference (the shared system prompt, typically), and whether its own
    /// blocks still survive on its previous replica.
    ///
    /// The shared run is measured on the previous replica and assumed for the
    /// others too (every busy replica holds the common system prompt); it is
    /// cached for `demand_refresh_s` because the queue head is examined at every
    /// step of every replica while it waits.
    pub(crate) fn need(&mut self, p: ProgramId, now: f64, mem: &dyn Memory) -> (f64, bool) {
        let Some(prog) = self.programs.get(&p) else {
            return (0.0, false);
        };
        let total = mem.blocks_for(prog.context_tokens) + self.cfg.decode_reserve_blocks;
        let Some(home) = prog.replica else {
            return (total as f64, false);
        };
        let shared = match prog.shared_estimate {
            Some((s, at)) if now - at <= self.cfg.demand_refresh_s => s,
            _ => {
                let s = mem.shared_prefix(home, p);
                if let Some(prog) = self.programs.get_mut(&p) {
                    prog.shared_estimate = Some((s, now));
                }
                s
            }
        };
        let own_survives = mem.chain_block_cached(home, p, shared);
        ((total - shared.min(total)) as f64, own_survives)
    }

    fn terminate(&mut self, p: ProgramId) {
        self.update(p, |prog| prog.state = State::Terminated);
        if let Some(prog) = self.programs.remove(&p) {
            if let Some(r) = prog.replica {
                self.active[r].remove(&p);
            }
            if let Some(g) = prog.group {
                self.groups.leave(p, g);
            }
        }
        self.queue.remove(p);
    }

    /// Whether `p`, resident on `l` and back from its tool with its turn's
    /// first request, yields to the queue (`SchedulerConfig::yield_to_queue`).
    /// Rotation's rules (`rotation.rs`) applied when a tool returns:
    /// * the program queued longest is overdue under the measured waiting
    ///   bound (queued a median turn; no bound, no yield). Yielding to any
    ///   queued program cost the CPU long cell at 16 programs, where the
    ///   queue is only momentary, 0.97x with p99 1.06x
    ///   (benches/results/pair-long-16-yield-any);
    /// * it fits no replica now (this request's prompt already counted in
    ///   `l`'s demand), so `p` starting at once would take room, and
    ///   compute, ahead of it;
    /// * `l`'s host tier keeps what `p` parks: without that gate `agentd
    ///   simulate` swe at 192 programs (H100, 3.46M-token tier) recomputed
    ///   2.9M tokens and fell 272.4 -> 219.3 steps/min.
    fn yields(&mut self, p: ProgramId, l: usize, now: f64, mem: &dyn Memory) -> bool {
        if !self.cfg.yield_to_queue
            || self.programs.get(&p).is_none_or(|q| q.in_flight != 1)
            || mem.host_capacity(l) == 0
        {
            return false;
        }
        let Some(oldest) = self.queue.by_arrival().find(|q| *q != p) else {
            return false;
        };
        if !self.overdue(oldest, now, self.wait_bound(mem).after_s) {
            return false;
        }
        let (need, _) = self.need(oldest, now, mem);
        let fits = |r: usize, d: f64| d + need <= self.cfg.lambda_min * mem.capacity(r) as f64;
        debug_assert!(self.active.get(l).is_some_and(|a| a.contains(&p)));
        !(0..self.active.len()).any(|r| fits(r, self.demand(r, now, mem)))
            && self.tier_keeps(l, self.parked_blocks(l, mem), [p].into_iter(), &[], mem)
    }

    /// Whether some member of `p`'s group other than `p` is active.
    pub(crate) fn group_active(&self, p: ProgramId) -> bool {
        let Some(g) = self.programs.get(&p).and_then(|q| q.group) else {
            return false;
        };
        self.groups.get(g).is_some_and(|grp| {
            grp.members.iter().any(|m| {
                *m != p
                    && self
                        .programs
                        .get(m)
                        .is_some_and(|q| q.state == State::Active)
            })
        })
    }
}

impl Policy for ProgramScheduler {
    fn on_request(
        &mut self,
        p: ProgramId,
        now: f64,
        context_tokens: usize,
        mem: &dyn Memory,
    ) -> Route {
        self.programs
            .get_or_insert(p, || Program::new(now, context_tokens));
        if let Some(prog) = self.programs.get_mut(&p) {
            if prog.phase == Phase::Acting && prog.in_flight == 0 {
                if let Some(tool) = prog.tool.take() {
                    self.tools.record(tool, now - prog.acting_since);
                }
            }
        }
        let group_active = self.group_active(p);
        self.update(p, |prog| {
            prog.context_tokens = context_tokens;
            prog.last_activity = now;
            prog.phase = Phase::Reasoning;
            if prog.park == Some(Park::Keep) {
                prog.park = None;
            }
            if prog.in_flight == 0 {
                prog.request_at = now;
            }
            prog.in_flight += 1;
        });
        let Some(prog) = self.programs.get_mut(&p) else {
            return Route::Queued;
        };
        if prog.state == State::Active {
            if let Some(replica) = prog.replica {
                if self.yields(p, replica, now, mem) {
                    debug!(replica, program = %p, "tool returned behind the queue: yield");
                    self.mark_paused(p, now, mem);
                    return Route::Yield { replica };
                }
                return Route::Run { replica };
            }
        }
        if !prog.waiting {
            prog.waiting = true;
            prog.waiting_since = now;
            // A member whose group already runs joins it as a restore would.
            let class = if prog.admitted_once || group_active {
                QueueClass::Restore
            } else {
                QueueClass::New
            };
            self.queue.push(p, class, context_tokens, now);
        }
        Route::Queued
    }

    fn on_request_finished(&mut self, p: ProgramId, now: f64, context_tokens: usize) -> bool {
        self.record_turn(p, now);
        self.update(p, |prog| {
            prog.in_flight = prog.in_flight.saturating_sub(1);
            prog.context_tokens = context_tokens;
            prog.steps += 1;
            prog.last_activity = now;
            if prog.in_flight == 0 {
                prog.phase = Phase::Acting;
                prog.acting_since = now;
                prog.tool = None;
            }
        });
        // Its last request ended before it was admitted (cancelled while
        // it waited): nothing of it needs admission any more.
        if let Some(prog) = self.programs.get_mut(&p) {
            if prog.in_flight == 0 && prog.waiting {
                prog.waiting = false;
                self.queue.remove(p);
            }
        }
        false
    }

    fn join_group(&mut self, p: ProgramId, join: GroupJoin, now: f64) {
        let prog = self
            .programs
            .get_or_insert(p, || Program::new(now, join.shared_tokens));
        if let Some(old) = prog.group.filter(|g| *g != join.group) {
            self.groups.leave(p, old);
        }
        prog.group = Some(join.group);
        prog.group_shared_tokens = join.shared_tokens;
        self.groups.join(p, &join, now);
    }

    fn on_tool(&mut self, p: ProgramId, tool: ToolId, _now: f64) {
        if let Some(prog) = self.programs.get_mut(&p) {
            if prog.phase == Phase::Acting && prog.in_flight == 0 {
                prog.tool = Some(tool);
            }
        }
    }

    fn on_terminate(&mut self, p: ProgramId) {
        self.terminate(p);
    }

    fn expire(&mut self, now: f64) -> Vec<ProgramId> {
        let mut gone: Vec<ProgramId> = self
            .programs
            .iter()
            .filter(|(_, q)| q.in_flight == 0 && now - q.last_activity > self.cfg.lease_s)
            .map(|(p, _)| *p)
            .collect();
        gone.sort();
        gone
    }

    fn schedule(&mut self, replica: usize, now: f64, mem: &dyn Memory) -> Decision {
        let mut out = Decision::default();
        let d = self.relieve(replica, now, mem, &mut out);
        self.demand[replica] = (d, now);
        self.admit(replica, now, mem, &mut out);
        out
    }

    fn preempt(
        &mut self,
        replica: usize,
        now: f64,
        mem: &dyn Memory,
        protect: ProgramId,
    ) -> Option<ProgramId> {
        let order = self.pause_order(replica, now, mem);
        let victim = order
            .iter()
            .map(|v| v.0)
            .find(|p| *p != protect)
            .or_else(|| order.first().map(|v| v.0))?;
        debug!(replica, program = %victim, "blocks exhausted: pause");
        self.mark_paused(victim, now, mem);
        Some(victim)
    }

    fn keeps_kv_between_requests(&self) -> bool {
        true
    }

    fn stats(&self) -> PolicyStats {
        self.stats
    }

    fn num_waiting(&self) -> usize {
        self.queue.len()
    }

    fn programs(&self) -> &ProgramTable {
        &self.programs
    }

    fn programs_mut(&mut self) -> &mut ProgramTable {
        &mut self.programs
    }
}
