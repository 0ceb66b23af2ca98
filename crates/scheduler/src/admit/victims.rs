//! Making room for a unit that fits nowhere by pausing programs of the
//! replica that steps (`admit.rs` says when): who may be paused
//! ([`Victims`]), in which order, and whether the host tier keeps what they
//! park.

use super::Room;
use crate::program::Program;
use crate::{Decision, Memory, Park, PauseCause, Phase, ProgramId, ProgramScheduler};
use tracing::debug;

impl ProgramScheduler {
    /// Who may be paused for a unit that fits nowhere, in the order tried:
    /// tool-waiting programs once it waited `idle_reclaim_after_s` with
    /// nothing running on `ask.l` (work conservation), tool-waiting ones
    /// the tier keeps (swapping for room, one replica only), then any
    /// resident one once it is overdue.
    ///
    /// Swapping for room stays off with several replicas: `agentd simulate`
    /// swe, 768 programs on 8 replicas, 3.46M-token tier (H100 costs; the
    /// request policy 2681.2 steps/min, off 2617.6) ran 2488.6 with it on
    /// every replica (kv imbalance 0.53: homes of 19 to 187 programs, a
    /// swapped context stays at home while the tier keeps it), 2488.6 too
    /// with it only on the replica with the most room once parked, and
    /// 2610.8 with it plus a paused program leaving a full home for a
    /// replica with room once it had waited its recompute time (swap off
    /// with that: 2627.3).
    pub(super) fn victims_for(
        &self,
        ask: &Ask<'_>,
        overdue: bool,
        now: f64,
        mem: &dyn Memory,
        room: &Room,
    ) -> [Option<Victims>; 3] {
        let l = ask.l;
        let p = ask.unit.first().copied();
        let waited = p
            .and_then(|p| self.programs.get(&p))
            .map_or(0.0, |q| now - q.waiting_since);
        let idle = room.running[l] == 0 && waited >= self.cfg.idle_reclaim_after_s;
        let one = mem.num_replicas() == 1 && mem.host_capacity(l) > 0;
        let swap = !idle && self.cfg.swap_for_waiting && one;
        [
            idle.then_some(Victims::Acting),
            swap.then_some(Victims::ActingToTier),
            overdue.then_some(Victims::Resident),
        ]
    }

    /// No replica has room for a unit: pause others on `ask.l` for it,
    /// trying each class of `victims` in turn.
    pub(super) fn room_by_pausing(
        &mut self,
        mut ask: Ask<'_>,
        victims: [Option<Victims>; 3],
        now: f64,
        mem: &dyn Memory,
        room: &mut Room,
        out: &mut Decision,
    ) -> Option<usize> {
        for v in victims.into_iter().flatten() {
            ask.victims = v;
            if let Some(r) = self.make_room(&ask, now, mem, room, out) {
                return Some(r);
            }
        }
        None
    }

    /// Pauses programs of `ask.l` (acting only, or any resident for at
    /// least `max_wait_s`; pause order: acting first, shortest first) until
    /// a unit needing `ask.need` blocks fits, or fits the emptied replica.
    /// Pauses nothing and returns `None` when even pausing every eligible
    /// program would not make room — nor when this decision already saw it
    /// fail for a need no larger ([`Room::failed`]).
    fn make_room(
        &mut self,
        ask: &Ask<'_>,
        now: f64,
        mem: &dyn Memory,
        room: &mut Room,
        out: &mut Decision,
    ) -> Option<usize> {
        if room.known_to_fail(ask.victims, ask.need) {
            return None;
        }
        let grouped = ask
            .unit
            .first()
            .and_then(|u| self.programs.get(u))
            .is_some_and(|u| u.group.is_some());
        let mut kept = Vec::new();
        let chosen = self.choose_victims(ask, now, mem, room, out, &mut kept);
        self.note_kept(&kept);
        let Some(Chosen {
            victims,
            freed,
            park,
        }) = chosen
        else {
            room.note_failed(ask.victims, ask.need, grouped);
            return None;
        };
        let l = ask.l;
        for q in victims {
            debug!(replica = l, program = %q, need = ask.need, victims = ?ask.victims, "make room: pause");
            if self
                .programs
                .get(&q)
                .is_some_and(|x| x.running_on().is_some())
            {
                room.running[l] = room.running[l].saturating_sub(1);
            }
            self.mark_paused_as(q, now, mem, park);
            let cause = match ask.victims {
                Victims::Acting => PauseCause::WorkConserving,
                Victims::ActingToTier => PauseCause::TierSwap,
                Victims::Resident => PauseCause::Overdue,
            };
            out.pause.push((q, cause));
        }
        room.tentative[l] -= freed;
        self.demand[l].0 -= freed;
        room.empty[l] = self.active[l].is_empty();
        // Room was freed: what failed before may fit now.
        room.failed = [f64::INFINITY; 3];
        Some(l)
    }

    /// The victims [`ProgramScheduler::make_room`] pauses — the shortest
    /// prefix of the eligible programs' pause order that makes room — with
    /// the blocks they free; `None` when no prefix does (or, under the
    /// measured waiting bound, when the host tier would not keep what they
    /// park and the unit has not waited `recompute_after_s`: then they are
    /// parked for recompute, `rotation.rs`). Acting programs cheaper to
    /// keep than to pause (`park.rs`) are never victims: they are added to
    /// `kept`.
    fn choose_victims(
        &self,
        ask: &Ask<'_>,
        now: f64,
        mem: &dyn Memory,
        room: &mut Room,
        out: &Decision,
        kept: &mut Vec<ProgramId>,
    ) -> Option<Chosen> {
        let (l, need) = (ask.l, ask.need);
        let unit_group = ask
            .unit
            .first()
            .and_then(|u| self.programs.get(u))
            .and_then(|u| u.group);
        let eligible = |q: &Program, id: ProgramId| {
            let ok = match ask.victims {
                Victims::Acting | Victims::ActingToTier => q.phase == Phase::Acting,
                Victims::Resident => self.rotatable(q, now, room.wait),
            };
            let in_unit_group = unit_group.is_some_and(|g| q.group == Some(g));
            ok && !in_unit_group && !out.pauses(id)
        };
        let order: Vec<(ProgramId, f64)> = self
            .pause_order(l, now, mem)
            .into_iter()
            .filter(|&(q, _, _)| self.programs.get(&q).is_some_and(|x| eligible(x, q)))
            .filter(|&(q, _, _)| {
                let keep = self.keeps(l, q, now, mem);
                if keep {
                    kept.push(q);
                }
                !keep
            })
            .map(|(q, phase, held)| (q, self.freed_by_pausing(l, q, phase, held, now, mem)))
            .collect();
        if order.is_empty() {
            return None;
        }
        let left = room.left(l, mem);
        let total: f64 = order.iter().map(|v| v.1).sum();
        // Pausing every active program of `l` empties it, and an empty
        // replica takes any unit its pool holds.
        let empties = order.len() == self.active[l].len();
        let reserve = self.cfg.decode_reserve_blocks as f64;
        let fits_empty = empties && need - reserve <= mem.capacity(l) as f64;
        if need > left + total && !fits_empty {
            return None;
        }
        // The victims: a prefix of the pause order.
        let (mut freed, mut k) = (0.0, 0);
        while k < order.len() && need > left + freed {
            freed += order[k].1;
            k += 1;
        }
        let chosen = &order[..k];
        let gated = match ask.victims {
            Victims::Acting => false,
            Victims::ActingToTier => true,
            Victims::Resident => room.wait.gated,
        };
        let mut park = None;
        if gated {
            let parked = *room.parked[l].get_or_insert_with(|| self.parked_blocks(l, mem));
            let parks = chosen.iter().map(|v| v.0);
            if self.tier_keeps(l, parked, parks, ask.unit, mem) {
                room.parked[l] = None;
            } else if self.past_the_tier(ask, chosen, now, mem, room) {
                // Parked for recompute: the parked blocks do not change.
                park = Some(Park::Recompute);
            } else {
                return None;
            }
        }
        Some(Chosen {
            victims: chosen.iter().map(|v| v.0).collect(),
            freed,
            park,
        })
    }

    /// Whether the unit `ask` makes room for has waited long enough to
    /// rotate `victims` out past the tier's room, and recomputing them
    /// costs at most `recompute_turn_share` of a median turn
    /// (`rotation.rs`).
    fn past_the_tier(
        &self,
        ask: &Ask<'_>,
        victims: &[(ProgramId, f64)],
        now: f64,
        mem: &dyn Memory,
        room: &Room,
    ) -> bool {
        let waited = ask
            .unit
            .first()
            .is_some_and(|u| self.overdue(*u, now, room.wait.recompute_after_s));
        if ask.victims != Victims::Resident || !waited {
            return false;
        }
        let turn = self.turns.median().unwrap_or(f64::INFINITY);
        let recompute: f64 = victims
            .iter()
            .map(|(q, _)| {
                // Unpriced before the replica measured its prefill rate,
                // as `park.rs` leaves a pause unpriced then.
                self.programs
                    .get(q)
                    .and_then(|prog| {
                        Self::recompute_s(ask.l, prog, mem.blocks_held(ask.l, *q), mem)
                    })
                    .unwrap_or(0.0)
            })
            .sum();
        recompute <= self.cfg.recompute_turn_share * turn
    }
}

/// What [`ProgramScheduler::choose_victims`] picked: the programs to pause,
/// the blocks that frees, and their KV's fate when the choice fixes it.
struct Chosen {
    victims: Vec<ProgramId>,
    freed: f64,
    park: Option<Park>,
}

/// What [`ProgramScheduler::make_room`] makes room for: a unit needing
/// `need` blocks on replica `l`, by pausing `victims`.
pub(super) struct Ask<'a> {
    pub(super) l: usize,
    pub(super) need: f64,
    pub(super) unit: &'a [ProgramId],
    pub(super) victims: Victims,
}

/// Who [`ProgramScheduler::make_room`] may pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Victims {
    /// Work conservation: tool-waiting programs only.
    Acting = 0,
    /// Swapping for a waiting program (`swap_for_waiting`): tool-waiting
    /// programs, only while the host tier keeps what they park.
    ActingToTier = 1,
    /// Bounded waiting: programs resident for at least the bound
    /// ([`ProgramScheduler::rotatable`]).
    Resident = 2,
}
