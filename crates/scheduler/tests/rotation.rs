//! The measured waiting bound (`rotation.rs`, issue 12) on the real
//! `ProgramScheduler` over real `KvCache`s with a host tier: its period is
//! `rotate_after_turns` median turn times, it rotates out acting programs
//! only (a turn is never cut), only while the host tier keeps what it parks
//! (past that, after `recompute_after_turns` median turns, for recompute),
//! and not at all without a tier.

mod common;

use agentd_scheduler::{
    Decision, Park, PauseCause, Policy, ProgramScheduler, SchedulerConfig, StepWork,
};
use common::{back_from_the_tier, config, ids, info, pid, Engine, BS};

type Eng = Engine<ProgramScheduler>;

/// The test config with a bound of two turns, and without swapping for
/// waiting programs (`tier_swap.rs`), which would otherwise take acting
/// programs before the bound does.
fn two_turns() -> SchedulerConfig {
    SchedulerConfig {
        rotate_after_turns: 2.0,
        swap_for_waiting: false,
        ..config(0.9, 1.0)
    }
}

/// Eleven turns of one second (program 50, one block), then it ends: the
/// median turn is 1 s, so a bound of 2 turns is 2 s.
fn one_second_turns(eng: &mut Eng) {
    eng.request(pid(50), BS);
    eng.step(0);
    for _ in 0..10 {
        eng.now += 1.0;
        eng.finish(pid(50));
        eng.request(pid(50), 1);
        eng.step(0);
    }
    eng.now += 1.0;
    eng.finish(pid(50));
    eng.terminate(pid(50));
}

/// Programs 1 and 2 (44 blocks each) hold D = 90 of λmin·C = 99 (110
/// blocks) from `t0`; program 3 (30 blocks) queues at `t0`. Returns the
/// decisions at `t0 + 2` (3 is overdue, 1 and 2 are reasoning) and right
/// after program 1 finishes its turn there.
fn overdue_behind_two(host_slots: Option<usize>) -> (Eng, Decision, Decision) {
    overdue_behind_two_with(two_turns(), host_slots, None)
}

/// [`overdue_behind_two`] with `cfg`, the replica's step-time fit first
/// learned from steps taking `step_s(work)` when given.
fn overdue_behind_two_with(
    cfg: SchedulerConfig,
    host_slots: Option<usize>,
    step_s: Option<fn(&StepWork) -> f64>,
) -> (Eng, Decision, Decision) {
    let mut eng = Engine::program(cfg, 1, 110);
    if let Some(slots) = host_slots {
        eng = eng.with_host_tier(slots);
    }
    if let Some(step_s) = step_s {
        // A 256-token program prefilled in chunks of 4-16 tokens; it ends.
        let w = pid(999);
        eng.request(w, 256);
        eng.compute_in_steps(0, w, &[4, 6, 8, 12, 16], step_s);
        assert!(eng.rates(0).prefill_s(0, 128).is_some(), "fit not warm");
        eng.finish(w);
        eng.terminate(w);
    }
    one_second_turns(&mut eng);
    let t0 = eng.now;
    eng.request(pid(1), 44 * BS);
    eng.request(pid(2), 44 * BS);
    assert_eq!(eng.step(0).admit.len(), 2);
    eng.request(pid(3), 30 * BS);
    eng.now = t0 + 1.0;
    assert!(eng.step(0).is_empty(), "not overdue yet");
    eng.now = t0 + 2.0;
    let reasoning = eng.step(0);
    eng.finish(pid(1));
    let acting = eng.step(0);
    eng.check_kv();
    (eng, reasoning, acting)
}

#[test]
fn an_overdue_program_rotates_out_an_acting_one_the_tier_keeps() {
    let (mut eng, reasoning, acting) = overdue_behind_two(Some(200));
    assert!(reasoning.is_empty(), "a turn was cut: {reasoning:?}");
    assert_eq!(ids(&acting.paused()), vec![1], "{acting:?}");
    assert_eq!(acting.admit, vec![(pid(3), 0)]);
    assert_eq!(eng.stats().pauses.of(PauseCause::Overdue), 1);
    // Admitting 3 evicted part of 1's context: to the host tier.
    assert!(eng.kv(0).host_copies().0 > 0, "no offload");
    // 1's next turn is restored once 3 is overdue to leave, by copies.
    back_from_the_tier(&mut eng, 2.0);
    assert_eq!(eng.last_match[&pid(1)].cached_tokens, 44 * BS);
    eng.check_kv();
}

#[test]
fn rotation_stops_where_the_tier_could_not_keep_the_context() {
    // 0.9 × 40 slots < the 44 blocks pausing program 1 would park.
    let (eng, reasoning, acting) = overdue_behind_two(Some(40));
    assert!(reasoning.is_empty() && acting.is_empty(), "{acting:?}");
    assert_eq!(eng.policy.num_waiting(), 1);
}

/// The tier is full (as above); program 3 keeps waiting until it has queued
/// `recompute_after_turns` (4 here) median turns, then rotates 1 out for
/// recompute: 1's blocks are dropped, not parked in the tier, and its next
/// turn recomputes what 3's admission evicted.
#[test]
fn past_the_tier_a_long_wait_rotates_for_recompute() {
    let cfg = SchedulerConfig {
        recompute_after_turns: 4.0,
        ..two_turns()
    };
    let (mut eng, reasoning, acting) = overdue_behind_two_with(cfg, Some(40), None);
    assert!(reasoning.is_empty() && acting.is_empty(), "{acting:?}");
    let t0 = eng.now - 2.0;
    eng.now = t0 + 3.5;
    assert!(eng.step(0).is_empty(), "3 queued 3.5 turns only");
    eng.now = t0 + 4.0;
    let d = eng.step(0);
    assert_eq!(ids(&d.paused()), vec![1], "{d:?}");
    assert_eq!(d.admit, vec![(pid(3), 0)]);
    assert_eq!(info(&eng, 1).park, Some(Park::Recompute));
    assert_eq!(eng.policy.stats().parks.of(Park::Recompute), 1);
    assert_eq!(eng.stats().pauses.of(PauseCause::Overdue), 1);
    eng.check_kv();
    // 1 comes back once 3 is overdue to leave; 3 is parked in the tier
    // (30 blocks fit it), 1 recomputes the blocks 3's admission evicted.
    eng.request(pid(1), BS);
    eng.finish(pid(3));
    eng.now += 2.0;
    let back = eng.step(0);
    assert_eq!(back.admit, vec![(pid(1), 0)], "{back:?}");
    assert!(eng.last_match[&pid(1)].cached_tokens < 44 * BS);
    eng.check_kv();
}

/// Past the tier only where the recompute is cheap: 1's 176 tokens must
/// prefill within `recompute_turn_share` (0.2) of the 1 s median turn.
/// With a fit learned from a slow prefill (2 ms a token: ~0.35 s) 3 waits
/// on; from a fast one (10 µs a token) 1 is rotated out at 4 turns as
/// above.
#[test]
fn past_the_tier_only_where_the_recompute_is_cheap() {
    fn slow(w: &StepWork) -> f64 {
        1e-3 + 2e-3 * w.tokens as f64
    }
    fn fast(w: &StepWork) -> f64 {
        1e-3 + 1e-5 * w.tokens as f64
    }
    let cfg = SchedulerConfig {
        recompute_after_turns: 4.0,
        ..two_turns()
    };
    for (step_s, rotates) in [(slow as fn(&StepWork) -> f64, false), (fast, true)] {
        let (mut eng, _, acting) = overdue_behind_two_with(cfg.clone(), Some(40), Some(step_s));
        assert!(acting.is_empty(), "{acting:?}");
        eng.now += 2.0;
        let d = eng.step(0);
        let want: Vec<u64> = if rotates { vec![1] } else { vec![] };
        assert_eq!(ids(&d.paused()), want, "{d:?}");
        assert_eq!(eng.policy.num_waiting(), usize::from(!rotates));
        eng.check_kv();
    }
}

#[test]
fn without_a_tier_nothing_rotates() {
    let (eng, reasoning, acting) = overdue_behind_two(None);
    assert!(reasoning.is_empty() && acting.is_empty(), "{acting:?}");
    assert_eq!(eng.stats().pauses.of(PauseCause::Overdue), 0);
}

#[test]
fn an_explicit_bound_rotates_whatever_the_tier_holds() {
    let cfg = SchedulerConfig {
        max_wait_s: 2.0,
        ..config(0.9, 1.0)
    };
    let mut eng = Engine::program(cfg, 1, 100).with_host_tier(8);
    eng.request(pid(1), 44 * BS);
    eng.request(pid(2), 44 * BS);
    eng.step(0);
    eng.request(pid(3), 30 * BS);
    eng.now = 2.0;
    // Both reasoning, the tier far too small: the hard bound cuts a turn.
    assert_eq!(ids(&eng.step(0).paused()), vec![1]);
    eng.check_kv();
}
