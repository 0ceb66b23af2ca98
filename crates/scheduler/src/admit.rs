//! Admission from the one global queue (docs/design.md §5 rules 2, 7,
//! 8 and 13), at a step boundary of
//! replica `l`.
//!
//! Candidates come in this order:
//! 1. *overdue* programs — queued at least the waiting bound `T`
//!    (`max_wait_s`, or `rotate_after_turns` median turns with a host tier:
//!    `rotation.rs`) — oldest first;
//! 2. the queue's own order: restores before new programs, shortest first
//!    with aging.
//!
//! With `admit_prefill_s` set (off by default), a replica with prompts
//! still to prefill takes a *new* program only while the prefill queued
//! there, the newcomer's included, is computed within that many seconds at
//! the replica's measured rate (`rates.rs`); a newcomer held back by it
//! waits without holding blocks, and the next candidates are tried.
//!
//! A candidate's first admission takes the waiting members of its group
//! with it (one *unit*, one replica, so the members share their prompt's
//! blocks); a member admitted before is restored alone (`unit`). A
//! unit goes where `D + need ≤ λ·C` (most room, or best fit; λ is λmin,
//! or λmax while the host tier has room for the band:
//! `rotation.rs::admission_ceiling`), on its
//! previous replica while its own blocks survive there. When it fits nowhere:
//! * **work conservation** — if `l` runs nothing, acting programs of `l`
//!   are paused for it (their blocks stay cached, evictable): a replica
//!   never idles while a waiting program would fit once its tool-waiting
//!   programs let go;
//! * **swapping for room** (`swap_for_waiting`) — with a host tier and one
//!   replica, acting programs are paused for it while the tier keeps what
//!   they park: their KV comes back by copies;
//! * **bounded waiting** — if it is overdue, programs of `l` resident for at
//!   least `T` are paused for it, acting ones first, then reasoning ones
//!   (pause order within each); under the measured bound only acting ones,
//!   and only while the host tier keeps what they park (`rotation.rs`);
//! * otherwise the first unit that fits nowhere reserves the replica with
//!   the most room (EASY backfilling): nothing behind it is placed there
//!   until it runs, while smaller programs may use the others.
//!
//! **The waiting bound.** With `T = max_wait_s`, the oldest queued program
//! whose context fits one replica's pool is admitted within `2T` of being
//! queued, at a step boundary: at `T` it is the first candidate of every
//! step; every program resident at that moment has been resident for `T`
//! by `2T` and may be paused for it, and a replica emptied of them takes any
//! context its pool holds. Overdue programs are admitted oldest first. The
//! price is recompute: a program paused for an overdue one waits in turn, so
//! at extreme oversubscription residency rotates with a period of about `T`
//! instead of some programs waiting without bound.
//!
//! Who is paused, and in which order: `admit/victims.rs`.
//!
//! A group is never half-admitted while some replica could hold it whole: it
//! waits (reserving, as above) for that room; only a group larger than any
//! replica's λmin·C is admitted member by member.

mod victims;

use crate::rotation::WaitBound;
use crate::{Decision, Memory, Phase, Placement, ProgramId, ProgramScheduler, State};
use tracing::debug;
use victims::{Ask, Victims};

/// Admissions per decision, so one step boundary never stalls on a long queue.
const MAX_ADMITS_PER_STEP: usize = 64;

/// The per-replica view one decision builds up as it places units.
struct Room {
    /// Demand of each replica including this decision's placements.
    tentative: Vec<f64>,
    running: Vec<usize>,
    empty: Vec<bool>,
    /// Replicas held for a unit that fits nowhere yet.
    reserved: Vec<bool>,
    /// The smallest need [`ProgramScheduler::make_room`] failed to free
    /// room for in this decision, per kind of victim (a group's members
    /// are never its victims, so only failures of units without a group
    /// count). Pausing is monotone in `need` and placements only take
    /// room, so a larger need fails too until some pause frees room: at 96
    /// programs each overdue candidate re-ran the same failing pass
    /// (pause order, exclusive blocks of every resident), up to 200 µs of
    /// the engine lock in a decision that admitted nothing.
    failed: [f64; 3],
    /// The waiting bound of this decision (`rotation.rs`).
    wait: WaitBound,
    /// Blocks parked per replica, measured when a rotation or a tier swap
    /// first asks.
    parked: Vec<Option<f64>>,
    /// Prefill seconds queued per replica, this decision's admissions
    /// included (`admit_prefill_s`; zeros while the bound is off).
    backlog_s: Vec<f64>,
    /// The share of each replica's pool admissions may fill in this
    /// decision: λmin, or λmax while its host tier has room for the band
    /// (`rotation.rs::admission_ceiling`).
    ceiling: Vec<f64>,
}

impl Room {
    /// Blocks replica `r` may still take in this decision.
    fn left(&self, r: usize, mem: &dyn Memory) -> f64 {
        self.ceiling[r] * mem.capacity(r) as f64 - self.tentative[r]
    }

    fn known_to_fail(&self, victims: Victims, need: f64) -> bool {
        need >= self.failed[victims as usize]
    }

    fn note_failed(&mut self, victims: Victims, need: f64, grouped: bool) {
        if !grouped {
            let f = &mut self.failed[victims as usize];
            *f = f.min(need);
        }
    }
}

impl ProgramScheduler {
    /// Restores from the global queue while some replica has room under its
    /// admission ceiling.
    pub(crate) fn admit(&mut self, l: usize, now: f64, mem: &dyn Memory, out: &mut Decision) {
        if self.queue.is_empty() {
            return;
        }
        let n = self.active.len();
        let tentative = (0..n)
            .map(|r| {
                if r != l && now - self.demand[r].1 > self.cfg.demand_refresh_s {
                    let d = self.demand(r, now, mem);
                    self.demand[r] = (d, now);
                }
                self.demand[r].0
            })
            .collect();
        let ceiling = (0..n)
            .map(|r| self.admission_ceiling(r, now, mem))
            .collect();
        let mut room = Room {
            tentative,
            running: self.running.clone(),
            empty: (0..n).map(|r| self.active[r].is_empty()).collect(),
            reserved: vec![false; n],
            failed: [f64::INFINITY; 3],
            wait: self.wait_bound(mem),
            parked: vec![None; n],
            backlog_s: (0..n).map(|r| self.prefill_backlog_s(r, mem)).collect(),
            ceiling,
        };
        for p in self.candidates(now, room.wait.after_s) {
            // Admitted already with its group, or paused by this very
            // decision: its blocks are still referenced in `mem` (the engine
            // has not applied the pause yet), so `need` would count them as
            // shared and restore it at once — a flap within one step.
            if !self.queue.contains(p) || out.pauses(p) {
                continue;
            }
            if !self.place_unit(p, l, now, mem, &mut room, out) {
                break;
            }
        }
    }

    /// Seconds replica `r` needs to prefill what its reasoning programs'
    /// prompts still lack, at its measured rate (0 while the bound is off
    /// or the rate unknown).
    fn prefill_backlog_s(&self, r: usize, mem: &dyn Memory) -> f64 {
        if !self.cfg.admit_prefill_s.is_finite() {
            return 0.0;
        }
        let bs = mem.block_size();
        self.active[r]
            .iter()
            .filter_map(|p| {
                let prog = self.programs.get(p)?;
                let held = mem.blocks_held(r, *p) * bs;
                let left = prog.context_tokens.checked_sub(held)?;
                let reasoning = prog.phase == Phase::Reasoning;
                (reasoning && left > 0).then(|| mem.prefill_s(r, held, left))?
            })
            .sum()
    }

    /// The prompt tokens a unit needing `need` blocks would prefill when
    /// admitted, for the compute bound: `None` (not bounded) while the
    /// bound is off, for a unit with a member admitted before (a restore's
    /// context mostly comes back from the cache or the tier) and for an
    /// overdue one (the waiting bound comes first).
    fn cold_prefill(
        &self,
        unit: &[ProgramId],
        need: f64,
        overdue: bool,
        mem: &dyn Memory,
    ) -> Option<usize> {
        let bounded = self.cfg.admit_prefill_s.is_finite() && !overdue;
        let cold = unit
            .iter()
            .all(|m| self.programs.get(m).is_some_and(|q| !q.admitted_once));
        (bounded && cold).then(|| need.max(0.0) as usize * mem.block_size())
    }

    /// Whether `r`'s queued prefill, with `tokens` more, is computed within
    /// the bound (always, while `r` has nothing queued).
    fn within_compute(&self, r: usize, tokens: usize, mem: &dyn Memory, room: &Room) -> bool {
        let queued = room.backlog_s[r];
        queued <= 0.0
            || queued + mem.prefill_s(r, 0, tokens).unwrap_or(0.0) <= self.cfg.admit_prefill_s
    }

    /// Overdue programs oldest first, then the queue's order.
    fn candidates(&self, now: f64, after_s: f64) -> Vec<ProgramId> {
        let mut v: Vec<ProgramId> = self
            .queue
            .overdue(now - after_s, self.cfg.max_bypass)
            .take(MAX_ADMITS_PER_STEP)
            .collect();
        let rest: Vec<ProgramId> = self
            .queue
            .iter()
            .take(MAX_ADMITS_PER_STEP)
            .filter(|p| !v.contains(p))
            .collect();
        v.extend(rest);
        v
    }

    /// Queued for the waiting bound: it may pause programs for room.
    pub(crate) fn overdue(&self, p: ProgramId, now: f64, after_s: f64) -> bool {
        self.queue
            .enqueued_at(p)
            .is_some_and(|at| now - at >= after_s)
    }

    /// `p` and the other waiting members of its group, `p` first; `None`
    /// while an announced group still gathers its members.
    ///
    /// Only a group's first admission is one unit (its shared prompt
    /// computed once); a member admitted before is restored alone. Restored
    /// together, a group whose members' next requests queued at once became
    /// one unit of ~88k tokens that pausing tool-waiting programs could not
    /// make room for while single programs took every block freed: whole
    /// groups waited 60-120 s for their next turn. `agentd simulate swe
    /// --concurrency 128 --group-size 8 --host-kv-tokens 3460000`: p99 per
    /// turn 158.8 -> 37.4 s, slowest group 1218 -> 799 s, 327.8 -> 329.8
    /// steps/min (the request policy: 35.2 s, 815 s, 331.6).
    fn unit(&self, p: ProgramId, now: f64, after_s: f64) -> Option<Vec<ProgramId>> {
        let Some(q) = self.programs.get(&p) else {
            return Some(vec![p]);
        };
        let Some(g) = q.group.filter(|_| !q.admitted_once) else {
            return Some(vec![p]);
        };
        if self.groups.gathering(g, now, self.cfg.group_gather_s) && !self.overdue(p, now, after_s)
        {
            return None;
        }
        let mut unit = vec![p];
        if let Some(group) = self.groups.get(g) {
            let first_admission = |m: &ProgramId| {
                *m != p
                    && self.queue.contains(*m)
                    && self.programs.get(m).is_some_and(|q| !q.admitted_once)
            };
            unit.extend(group.members.iter().copied().filter(first_admission));
        }
        Some(unit)
    }

    /// Blocks the unit adds, its members' shared prompt counted once, and
    /// whether its first member's own blocks survive on its previous replica.
    fn unit_need(&mut self, unit: &[ProgramId], now: f64, mem: &dyn Memory) -> (f64, bool) {
        let (mut total, own_survives) = self.need(unit[0], now, mem);
        for &m in &unit[1..] {
            let (need, _) = self.need(m, now, mem);
            // A member never admitted has no blocks to measure its sharing
            // on: its prompt's full blocks are those of the group's first.
            let shared = match self.programs.get(&m) {
                Some(q) if q.replica.is_none() => (q.group_shared_tokens / mem.block_size()) as f64,
                _ => 0.0,
            };
            let floor = 1.0 + self.cfg.decode_reserve_blocks as f64;
            total += (need - shared).max(floor.min(need));
        }
        (total, own_survives)
    }

    /// Places one unit (or reserves for it). False when every replica is
    /// reserved: nothing further can be placed in this decision.
    fn place_unit(
        &mut self,
        p: ProgramId,
        l: usize,
        now: f64,
        mem: &dyn Memory,
        room: &mut Room,
        out: &mut Decision,
    ) -> bool {
        let Some(home) = self.programs.get(&p).map(|q| q.replica) else {
            self.queue.remove(p);
            return true;
        };
        let Some(mut unit) = self.unit(p, now, room.wait.after_s) else {
            return true;
        };
        let (mut need, own_survives) = self.unit_need(&unit, now, mem);
        let overdue = self.overdue(p, now, room.wait.after_s);
        let mut cold = self.cold_prefill(&unit, need, overdue, mem);
        // While its own blocks survive on its previous replica, a program
        // waits for room there: anywhere else it would recompute its whole
        // context, which costs more than the wait (recompute ∝ c²).
        let sticky = home.filter(|_| own_survives);
        let mut best = self.best_replica(need, sticky, mem, room, cold);
        if best.is_none()
            && cold.is_some()
            && self.best_replica(need, sticky, mem, room, None).is_some()
        {
            // Its blocks would fit, its prompt would not be computed
            // soon: it waits, holding nothing, while the queued prefill
            // drains (a later, shorter one may still fit the bound).
            debug!(program = %p, need, "compute bound: wait");
            return true;
        }
        if best.is_none() && unit.len() > 1 && !self.could_ever_fit(need, mem) {
            // Larger than any replica's room: member by member.
            unit.truncate(1);
            need = self.unit_need(&unit, now, mem).0;
            cold = self.cold_prefill(&unit, need, overdue, mem);
            best = self.best_replica(need, sticky, mem, room, None);
        }
        let here = sticky.is_none_or(|h| h == l) && !room.reserved[l];
        if best.is_none() && here {
            let ask = Ask {
                l,
                need,
                unit: &unit,
                victims: Victims::Acting,
            };
            let victims = self.victims_for(&ask, overdue, now, mem, room);
            best = self.room_by_pausing(ask, victims, now, mem, room, out);
        }
        if best.is_none() && sticky.is_some() {
            return self.wait_at_home(mem, room);
        }
        let Some(r) = best else {
            return self.reserve_for(mem, room);
        };
        if let Some(tokens) = cold {
            room.backlog_s[r] += mem.prefill_s(r, 0, tokens).unwrap_or(0.0);
        }
        room.empty[r] = false;
        room.tentative[r] += need;
        // Until `r` recomputes its demand at its own next step, placements
        // from other replicas' steps must see this admission too.
        self.demand[r].0 += need;
        room.running[r] += unit.len();
        for m in unit {
            self.admit_one(m, r, now, out);
        }
        true
    }

    fn admit_one(&mut self, p: ProgramId, r: usize, now: f64, out: &mut Decision) {
        self.queue.admit(p);
        let restore = self.programs.get(&p).is_some_and(|q| q.admitted_once);
        if restore {
            self.stats.restores += 1;
        } else {
            self.stats.admissions += 1;
        }
        debug!(program = %p, replica = r, restore, "admit");
        self.update(p, |prog| {
            prog.admitted_once = true;
            prog.waiting = false;
            prog.state = State::Active;
            prog.replica = Some(r);
            prog.admitted_at = now;
            prog.park = None;
        });
        self.active[r].insert(p);
        out.admit.push((p, r));
    }

    /// The replica a unit needing `need` blocks fits now, if any; with
    /// `prefill` tokens to compute, only a replica whose queued prefill
    /// stays within the compute bound.
    fn best_replica(
        &self,
        need: f64,
        sticky: Option<usize>,
        mem: &dyn Memory,
        room: &Room,
        prefill: Option<usize>,
    ) -> Option<usize> {
        // (replica, slack after placing)
        let mut best: Option<(usize, f64)> = None;
        for r in 0..room.tentative.len() {
            if room.running[r] >= self.cfg.max_running
                || sticky.is_some_and(|h| h != r)
                || room.reserved[r]
                || prefill.is_some_and(|t| !self.within_compute(r, t, mem, room))
            {
                continue;
            }
            let left = room.left(r, mem);
            // An empty replica takes any unit whose context fits its pool at
            // all (its decode reserve aside: the engine caps a sequence at
            // the pool), or a program larger than λmin·C would wait forever.
            let reserve = self.cfg.decode_reserve_blocks as f64;
            let fits = need <= left || (room.empty[r] && need - reserve <= mem.capacity(r) as f64);
            if !fits {
                continue;
            }
            let better = |slack: f64| match self.cfg.placement {
                Placement::BestFit => left - need < slack,
                Placement::MostRoom => left - need > slack,
            };
            if best.is_none_or(|(_, slack)| better(slack)) {
                best = Some((r, left - need));
            }
        }
        best.map(|(r, _)| r)
    }

    /// A unit whose own blocks survive at home fits nowhere: it waits for
    /// room there. Returns what `place_unit` does: false once nothing more
    /// can be placed in this decision.
    ///
    /// With one replica the queue's order is strict (`reserve_for`)
    /// for sticky programs too: a restore waiting for room at home
    /// reserves it, so later, smaller candidates do not take the room
    /// it waits for. Skipping it instead let them pass until the
    /// bypass bound: `agentd simulate` long (1-2k-token tasks, 6-10
    /// turns, 512-token tool outputs, 32-64 output tokens),
    /// cpu-avx512, a 65,536-token pool and a 262,144-token tier, p99
    /// per step 24.9 -> 21.6 s at 32 programs and 35.4 -> 28.8 s at
    /// 48 (the request policy's 20.6 / 28.9), 116.5 -> 116.3-116.4
    /// steps/min; swe with an H100 tier at 96, 27.8 against 29.5 s.
    /// The price: new programs wait behind such restores (there at
    /// 192 programs the slowest first request 75.7 -> 156.8 s, p99
    /// per step 136.0 -> 134.6 s).
    /// Several replicas keep skipping: 768 programs on 8 replicas
    /// ran 2552 steps/min skipping, 2503 reserving the home (kv
    /// imbalance 0.09 -> 0.25).
    fn wait_at_home(&self, mem: &dyn Memory, room: &mut Room) -> bool {
        if mem.num_replicas() == 1 {
            return self.reserve_for(mem, room);
        }
        true
    }

    /// Whether some replica, drained, could hold `need` blocks under λmin.
    fn could_ever_fit(&self, need: f64, mem: &dyn Memory) -> bool {
        (0..self.active.len()).any(|r| need <= self.cfg.lambda_min * mem.capacity(r) as f64)
    }

    /// Backfilling with a reservation (as in EASY backfilling): the first
    /// unit that fits nowhere reserves the replica with the most room, where
    /// nothing behind it may be placed, so it runs as soon as that replica
    /// drains; smaller units behind it may still use the other replicas'
    /// room. With one replica this is strict queue order. False once every
    /// replica is reserved.
    fn reserve_for(&self, mem: &dyn Memory, room: &mut Room) -> bool {
        let left = |r: usize| room.left(r, mem);
        let most_room = (0..room.reserved.len())
            .filter(|&r| !room.reserved[r])
            .max_by(|&a, &b| left(a).total_cmp(&left(b)).then(b.cmp(&a)));
        match most_room {
            Some(r) => {
                room.reserved[r] = true;
                !room.reserved.iter().all(|&x| x)
            }
            None => false,
        }
    }
}
