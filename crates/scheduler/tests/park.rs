//! Keep, swap or recompute (`park.rs`, issue 32 item 3) on the real
//! `ProgramScheduler` over real `KvCache`s, with the replica's step-time
//! fit learned from real steps: with a host tier a paused program is
//! swapped (a copy costs less than its prefill), without one recomputed;
//! an acting program whose tool is expected back before its KV could be
//! restored is kept; each choice is counted and shown on its record.

mod common;

use agentd_scheduler::{Park, Policy, ProgramScheduler, State, StepWork, ToolId};
use common::{config, ids, info, pid, Engine, BS};

type Eng = Engine<ProgramScheduler>;

/// A step's "true" time: 1 ms fixed, 0.2 ms a token, 2 µs an attention
/// pair (a slow prefill: long contexts cost more per token).
fn seconds(w: &StepWork) -> f64 {
    1e-3 + 0.2e-3 * w.tokens as f64 + 2e-6 * w.prefill_pairs
}

/// A replica of 300 blocks (λmin·C = 270) whose step-time fit has learned
/// from the steps prefilling a 512-token program in chunks of 8-32 tokens;
/// that program then ends (its blocks are evictable).
fn warmed(host_slots: Option<usize>) -> Eng {
    let mut eng = Engine::program(config(0.9, 1.0), 1, 300);
    if let Some(slots) = host_slots {
        eng = eng.with_host_tier(slots);
    }
    let w = pid(999);
    // Queued: the first step admits it, the steps compute it.
    eng.request(w, 512);
    let steps = eng.compute_in_steps(0, w, &[8, 12, 16, 24, 32], seconds);
    assert!(steps >= 16, "{steps} steps do not warm the fit");
    assert!(eng.rates(0).prefill_s(0, 128).is_some(), "fit not warm");
    eng.finish(w);
    eng.terminate(w);
    eng
}

/// Admits `p` with a context of `blocks` full blocks and ends its turn.
fn acting(eng: &mut Eng, p: u64, blocks: usize) {
    eng.request(pid(p), blocks * BS);
    let d = eng.step(0);
    assert!(eng.is_running(pid(p)), "{p} not admitted: {d:?}");
    eng.finish(pid(p));
}

fn park(eng: &Eng, p: u64) -> Option<Park> {
    info(eng, p).park
}

#[test]
fn with_a_tier_every_pause_swaps_even_past_what_it_holds() {
    // 0.9 × 20 slots = 18 blocks parked at most.
    let mut eng = warmed(Some(20));
    acting(&mut eng, 2, 20);
    acting(&mut eng, 1, 30);
    acting(&mut eng, 3, 10);
    // 221 blocks for 4 where 210 are left: work conservation pauses the
    // acting programs shortest first, 3 then 2.
    eng.request(pid(4), 220 * BS);
    let d = eng.step(0);
    assert_eq!(ids(&d.paused()), vec![3, 2], "{d:?}");
    assert_eq!(
        (park(&eng, 3), park(&eng, 2)),
        (Some(Park::Swap), Some(Park::Swap))
    );
    eng.finish(pid(4));
    acting(&mut eng, 5, 5);
    // 21 blocks for 6 where 15 are left: 5 and 1 are paused. The tier is
    // full, and a copy still costs less than the prefill: swap (recomputing
    // the cheaper contexts of a full tier measured worse, park.rs).
    eng.request(pid(6), 20 * BS);
    let d = eng.step(0);
    assert_eq!(ids(&d.paused()), vec![5, 1], "{d:?}");
    assert_eq!(
        (park(&eng, 5), park(&eng, 1)),
        (Some(Park::Swap), Some(Park::Swap))
    );
    let parks = eng.policy.stats().parks;
    assert_eq!(
        Park::ALL.map(|k| parks.of(k)),
        [0, 4, 0],
        "keep, swap, recompute"
    );
    // A restore clears the choice.
    eng.finish(pid(6));
    eng.request(pid(5), BS);
    eng.step(0);
    assert!(eng.is_running(pid(5)));
    assert_eq!(park(&eng, 5), None);
    eng.check_kv();
}

#[test]
fn without_a_tier_every_pause_recomputes() {
    let mut eng = warmed(None);
    acting(&mut eng, 1, 30);
    eng.request(pid(2), 250 * BS);
    let d = eng.step(0);
    assert_eq!(ids(&d.paused()), vec![1]);
    assert_eq!(park(&eng, 1), Some(Park::Recompute));
}

#[test]
fn a_tool_expected_back_before_a_restore_keeps_its_program() {
    let mut eng = warmed(None);
    let quick = ToolId(7);
    // Eight 10 ms runs of `quick` by program 1 (30 blocks: a restore
    // recomputes 120 tokens, ~40 ms at the fitted rate).
    acting(&mut eng, 1, 30);
    for _ in 0..8 {
        let now = eng.now;
        eng.note_tool(pid(1), quick, now);
        eng.now += 0.01;
        eng.request(pid(1), 0);
        eng.finish(pid(1));
    }
    let now = eng.now;
    eng.note_tool(pid(1), quick, now);
    acting(&mut eng, 2, 40);
    eng.now += 0.005;
    // 221 blocks where 200 are left: 1 comes first in the pause order
    // (shortest) but is kept; 2 is paused.
    eng.request(pid(3), 220 * BS);
    let d = eng.step(0);
    assert_eq!(ids(&d.paused()), vec![2], "{d:?}");
    assert_eq!(info(&eng, 1).state, State::Active);
    assert_eq!(park(&eng, 1), Some(Park::Keep));
    // Kept again by the next decision: counted once per acting period.
    eng.request(pid(4), 30 * BS);
    eng.step(0);
    let parks = eng.policy.stats().parks;
    assert_eq!(parks.of(Park::Keep), 1);
    // Its next request ends the acting period: the choice is cleared.
    eng.request(pid(1), 1);
    assert_eq!(park(&eng, 1), None);
    eng.check_kv();
}
