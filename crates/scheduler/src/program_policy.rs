//! The program scheduler (DESIGN §4).
//!
//! Demand of replica L with capacity C blocks:
//! `D(L) = |blocks referenced on L| − Σ_{q acting} excl(q)·(1 − f(now − since_q)) + r·running(L)`.
//! Blocks referenced by reasoning programs count fully (shared ones once, since
//! the pool counts distinct blocks); an acting program's exclusive blocks count
//! with the decay `f`, because the longer its tool runs the cheaper it is to let
//! them go. Blocks shared only among acting programs are counted fully — a
//! conservative over-estimate that keeps the computation O(programs on L).
//!
//! * Pause while `D > λmax·C`: acting before reasoning, shortest first.
//! * Restore while `D + need ≤ λmin·C`, from the global queue in its order,
//!   placing each program by best fit, but on its previous replica while its own
//!   cached blocks survive there. λmin < λmax is the hysteresis that stops a
//!   program from being restored only to be paused again a step later.

use std::collections::{BTreeSet, HashMap};

use tracing::debug;

use crate::program::Program;
use crate::queue::{QueueClass, WaitingQueue};
use crate::{
    Decision, Memory, Phase, Placement, Policy, PolicyStats, ProgramId, ProgramInfo, Route,
    SchedulerConfig, State,
};

/// Admissions per decision, so one step boundary never stalls on a long queue.
const MAX_ADMITS_PER_STEP: usize = 64;

/// Program-level policy state: the program table, per-replica active sets and
/// the global waiting queue.
pub struct ProgramScheduler {
    cfg: SchedulerConfig,
    programs: HashMap<ProgramId, Program>,
    /// Active programs per replica (ordered: deterministic iteration).
    active: Vec<BTreeSet<ProgramId>>,
    queue: WaitingQueue,
    /// Reasoning programs active per replica (the `running(L)` of the demand).
    running: Vec<usize>,
    /// Last computed demand per replica and when (for placement elsewhere).
    demand: Vec<(f64, f64)>,
    stats: PolicyStats,
}

impl ProgramScheduler {
    pub fn new(cfg: SchedulerConfig, num_replicas: usize) -> Self {
        let queue = WaitingQueue::new(cfg.aging_tokens_per_s);
        Self {
            cfg,
            programs: HashMap::new(),
            active: vec![BTreeSet::new(); num_replicas.max(1)],
            queue,
            running: vec![0; num_replicas.max(1)],
            demand: vec![(0.0, f64::NEG_INFINITY); num_replicas.max(1)],
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

    /// `D(L)` as defined in the module docs, in blocks.
    pub fn demand(&self, l: usize, now: f64, mem: &dyn Memory) -> f64 {
        let mut d = mem.referenced(l) as f64;
        for p in &self.active[l] {
            let Some(prog) = self.programs.get(p) else {
                continue;
            };
            match prog.phase {
                Phase::Acting => {
                    let f = self.cfg.decay(now - prog.acting_since);
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
    fn update(&mut self, p: ProgramId, change: impl FnOnce(&mut Program)) {
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
    fn pause_order(&self, l: usize, mem: &dyn Memory) -> Vec<(ProgramId, Phase, usize)> {
        let mut v: Vec<(ProgramId, Phase, usize)> = self.active[l]
            .iter()
            .filter_map(|p| {
                let prog = self.programs.get(p)?;
                Some((*p, prog.phase, mem.blocks_held(l, *p)))
            })
            .collect();
        v.sort_by_key(|&(p, phase, held)| (phase == Phase::Reasoning, held, p));
        v
    }

    /// Marks `p` paused; a reasoning program's request goes back to the queue.
    fn mark_paused(&mut self, p: ProgramId, now: f64, mem: &dyn Memory) {
        let Some(l) = self.programs.get(&p).and_then(|q| q.replica) else {
            return;
        };
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
            prog.waiting = true;
            prog.waiting_since = now;
            self.queue
                .push(p, QueueClass::Restore, prog.context_tokens, now);
        }
    }

    /// Thrashing test on `l`: pause until `D ≤ λmax·C`.
    fn relieve(&mut self, l: usize, now: f64, mem: &dyn Memory, out: &mut Decision) -> f64 {
        let mut d = self.demand(l, now, mem);
        let cap = self.cfg.lambda_max * mem.capacity(l) as f64;
        if d <= cap {
            return d;
        }
        for (p, phase, held) in self.pause_order(l, mem) {
            if d <= cap {
                break;
            }
            let excl = mem.exclusive(l, p) as f64;
            let freed = match phase {
                Phase::Acting => {
                    let since = self.programs.get(&p).map_or(now, |q| q.acting_since);
                    excl * self.cfg.decay(now - since)
                }
                // Its whole term of `D` goes: the blocks only it references,
                // the blocks of its prompt not prefilled yet, its reserve.
                Phase::Reasoning => {
                    let want = self
                        .programs
                        .get(&p)
                        .map_or(0, |q| mem.blocks_for(q.context_tokens));
                    excl + want.saturating_sub(held) as f64 + self.cfg.decode_reserve_blocks as f64
                }
            };
            if phase == Phase::Acting && freed < 1.0 {
                // Its memory already counts as (almost) free in D: pausing it
                // would not bring D down, only throw away a cache that costs
                // nothing until blocks actually run out (then `preempt` takes it).
                continue;
            }
            debug!(replica = l, program = %p, ?phase, held, demand = d, cap, "thrashing: pause");
            self.mark_paused(p, now, mem);
            self.stats.pauses += 1;
            out.pause.push(p);
            d -= freed;
        }
        d
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
    fn need(&mut self, p: ProgramId, now: f64, mem: &dyn Memory) -> (f64, bool) {
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

    /// Restores from the global queue while some replica has room under λmin.
    fn admit(&mut self, l: usize, now: f64, mem: &dyn Memory, out: &mut Decision) {
        if self.queue.is_empty() {
            return;
        }
        let n = self.active.len();
        let mut tentative: Vec<f64> = (0..n)
            .map(|r| {
                if r != l && now - self.demand[r].1 > self.cfg.demand_refresh_s {
                    let d = self.demand(r, now, mem);
                    self.demand[r] = (d, now);
                }
                self.demand[r].0
            })
            .collect();
        let mut running = self.running.clone();
        let mut empty: Vec<bool> = (0..n).map(|r| self.active[r].is_empty()).collect();
        let mut reserved = vec![false; n];
        let candidates: Vec<ProgramId> = self.queue.iter().take(MAX_ADMITS_PER_STEP).collect();
        for p in candidates {
            // Paused by this very decision: its blocks are still referenced in
            // `mem` (the engine has not applied the pause yet), so `need` would
            // count them as shared and restore it at once — a flap within one
            // step. It waits for the next step, which sees the pause applied.
            if out.pause.contains(&p) {
                continue;
            }
            let Some(home) = self.programs.get(&p).map(|q| q.replica) else {
                self.queue.remove(p);
                continue;
            };
            let (need, own_survives) = self.need(p, now, mem);
            // While its own blocks survive on its previous replica, a program
            // waits for room there: anywhere else it would recompute its whole
            // context, which costs more than the wait (recompute ∝ c²).
            let sticky = home.filter(|_| own_survives);
            // (replica, need, slack after placing)
            let mut best: Option<(usize, f64, f64)> = None;
            for r in 0..n {
                if running[r] >= self.cfg.max_running || sticky.is_some_and(|h| h != r) {
                    continue;
                }
                if reserved[r] {
                    continue;
                }
                let room = self.cfg.lambda_min * mem.capacity(r) as f64 - tentative[r];
                // An empty replica takes any program whose context fits its
                // pool at all (its decode reserve aside: the engine caps a
                // sequence at the pool), or a program larger than λmin·C
                // would wait forever.
                let reserve = self.cfg.decode_reserve_blocks as f64;
                let fits = need <= room || (empty[r] && need - reserve <= mem.capacity(r) as f64);
                if !fits {
                    continue;
                }
                let better = |slack: f64| match self.cfg.placement {
                    Placement::BestFit => room - need < slack,
                    Placement::MostRoom => room - need > slack,
                };
                if best.is_none_or(|(_, _, slack)| better(slack)) {
                    best = Some((r, need, room - need));
                }
            }
            // Work conservation: `l` runs nothing while `p` has waited
            // `idle_reclaim_after_s` and its acting programs hold the room:
            // pause them rather than idle. (Not at once: an idle instant
            // between two turns is common and the acting programs' tools
            // usually return within it; the simulator's swe sweep lost 16% of
            // its hit rate pausing at once.)
            let waited = self.programs.get(&p).map_or(0.0, |q| now - q.waiting_since);
            if best.is_none()
                && running[l] == 0
                && !reserved[l]
                && waited >= self.cfg.idle_reclaim_after_s
                && sticky.is_none_or(|h| h == l)
            {
                let room = self.cfg.lambda_min * mem.capacity(l) as f64 - tentative[l];
                if let Some(freed) = self.reclaim_acting(l, now, mem, need, room, out) {
                    tentative[l] -= freed;
                    self.demand[l].0 -= freed;
                    empty[l] = self.active[l].is_empty();
                    best = Some((l, need, 0.0));
                }
            }
            if best.is_none() && sticky.is_some() {
                continue;
            }
            let Some((r, need, _)) = best else {
                // Backfilling with a reservation (as in EASY backfilling): the
                // first program that fits nowhere reserves the replica with the
                // most room, where nothing behind it may be placed, so it runs
                // as soon as that replica drains; smaller programs behind it
                // may still use the other replicas' room. With one replica this
                // is strict queue order.
                let most_room = (0..n).filter(|&r| !reserved[r]).max_by(|&a, &b| {
                    let ra = self.cfg.lambda_min * mem.capacity(a) as f64 - tentative[a];
                    let rb = self.cfg.lambda_min * mem.capacity(b) as f64 - tentative[b];
                    ra.total_cmp(&rb).then(b.cmp(&a))
                });
                match most_room {
                    Some(r) => {
                        reserved[r] = true;
                        if reserved.iter().all(|&x| x) {
                            break;
                        }
                        continue;
                    }
                    None => break,
                }
            };
            empty[r] = false;
            tentative[r] += need;
            // Until `r` recomputes its demand at its own next step, placements
            // from other replicas' steps must see this admission too.
            self.demand[r].0 += need;
            running[r] += 1;
            self.queue.remove(p);
            let restore = self.programs.get(&p).is_some_and(|q| q.admitted_once);
            if restore {
                self.stats.restores += 1;
            } else {
                self.stats.admissions += 1;
            }
            debug!(program = %p, replica = r, need, restore, "admit");
            self.update(p, |prog| {
                prog.admitted_once = true;
                prog.waiting = false;
                prog.state = State::Active;
                prog.replica = Some(r);
            });
            self.active[r].insert(p);
            out.admit.push((p, r));
        }
    }

    /// Pauses acting programs of `l` (pause order: shortest first; their
    /// full blocks stay cached, evictable) until a program needing `need`
    /// blocks fits into `room`, or into the empty replica. Pauses nothing and
    /// returns `None` when even pausing every acting program would not make
    /// it fit; otherwise the demand freed.
    fn reclaim_acting(
        &mut self,
        l: usize,
        now: f64,
        mem: &dyn Memory,
        need: f64,
        room: f64,
        out: &mut Decision,
    ) -> Option<f64> {
        let acting: Vec<(ProgramId, f64)> = self
            .pause_order(l, mem)
            .into_iter()
            .filter(|&(_, phase, _)| phase == Phase::Acting)
            .map(|(q, _, _)| {
                let since = self.programs.get(&q).map_or(now, |x| x.acting_since);
                (q, mem.exclusive(l, q) as f64 * self.cfg.decay(now - since))
            })
            .collect();
        if acting.is_empty() {
            return None;
        }
        let total: f64 = acting.iter().map(|a| a.1).sum();
        // With every active program of `l` acting, pausing them all empties
        // it, and an empty replica takes any program its pool holds.
        let empties = acting.len() == self.active[l].len();
        let reserve = self.cfg.decode_reserve_blocks as f64;
        let fits_empty = empties && need - reserve <= mem.capacity(l) as f64;
        if need > room + total && !fits_empty {
            return None;
        }
        let mut freed = 0.0;
        for (q, w) in acting {
            if need <= room + freed {
                break;
            }
            debug!(replica = l, program = %q, need, room, "work-conserving: pause acting");
            self.mark_paused(q, now, mem);
            self.stats.work_conserving_pauses += 1;
            out.pause.push(q);
            freed += w;
        }
        Some(freed)
    }

    fn terminate(&mut self, p: ProgramId) {
        self.update(p, |prog| prog.state = State::Terminated);
        if let Some(prog) = self.programs.remove(&p) {
            if let Some(r) = prog.replica {
                self.active[r].remove(&p);
            }
        }
        self.queue.remove(p);
    }
}

impl Policy for ProgramScheduler {
    fn on_request(&mut self, p: ProgramId, now: f64, context_tokens: usize) -> Route {
        self.programs
            .entry(p)
            .or_insert_with(|| Program::new(now, context_tokens));
        self.update(p, |prog| {
            prog.context_tokens = context_tokens;
            prog.last_activity = now;
            prog.phase = Phase::Reasoning;
            prog.in_flight += 1;
        });
        let Some(prog) = self.programs.get_mut(&p) else {
            return Route::Queued;
        };
        if prog.state == State::Active {
            if let Some(replica) = prog.replica {
                return Route::Run { replica };
            }
        }
        if !prog.waiting {
            prog.waiting = true;
            prog.waiting_since = now;
            let class = if prog.admitted_once {
                QueueClass::Restore
            } else {
                QueueClass::New
            };
            self.queue.push(p, class, context_tokens, now);
        }
        Route::Queued
    }

    fn on_request_finished(&mut self, p: ProgramId, now: f64, context_tokens: usize) -> bool {
        self.update(p, |prog| {
            prog.in_flight = prog.in_flight.saturating_sub(1);
            prog.context_tokens = context_tokens;
            prog.steps += 1;
            prog.last_activity = now;
            if prog.in_flight == 0 {
                prog.phase = Phase::Acting;
                prog.acting_since = now;
            }
        });
        false
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
        for p in &gone {
            debug!(program = %p, "lease expired");
            self.terminate(*p);
        }
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
        let order = self.pause_order(replica, mem);
        let victim = order
            .iter()
            .map(|v| v.0)
            .find(|p| *p != protect)
            .or_else(|| order.first().map(|v| v.0))?;
        debug!(replica, program = %victim, "blocks exhausted: pause");
        self.mark_paused(victim, now, mem);
        self.stats.exhaustion_pauses += 1;
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

    fn program(&self, p: ProgramId) -> Option<ProgramInfo> {
        self.programs.get(&p).map(|q| q.info(p))
    }
}
