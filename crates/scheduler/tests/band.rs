//! The band between λmin and λmax closes while the host tier has room for
//! it (issue 32; `rotation.rs::admission_ceiling`): admissions fill the
//! pool to λmax·C, since growth past it then pauses acting programs into
//! the tier instead of dropping their contexts. Driving the real
//! `ProgramScheduler` over real `KvCache`s (block size 4 tokens, C = 100
//! blocks, λmin / λmax = 0.9 / 1.0, reserve 1).

mod common;

use agentd_scheduler::{PauseCause, Policy, ProgramScheduler};
use common::{admit_all, assert_close, config, ids, pid, Engine, BS};

type Eng = Engine<ProgramScheduler>;

fn engine(host_slots: Option<usize>) -> Eng {
    let eng = Engine::program(config(0.9, 1.0), 1, 100);
    match host_slots {
        Some(slots) => eng.with_host_tier(slots),
        None => eng,
    }
}

#[test]
fn with_room_in_the_tier_admission_fills_the_band() {
    for (tier, admitted) in [(None, false), (Some(200), true), (Some(12), true)] {
        let mut eng = engine(tier);
        admit_all(&mut eng, 0, &[(1, 79)]);
        // need 10 + 1: 80 + 11 = 91, over λmin·C = 90, under λmax·C = 100.
        eng.request(pid(2), 10 * BS);
        eng.now += 0.1;
        let d = eng.step(0);
        assert_eq!(
            d.admit == vec![(pid(2), 0)],
            admitted,
            "tier {tier:?}: {d:?}"
        );
        assert!(d.pause.is_empty(), "tier {tier:?}: {d:?}");
        assert_eq!(eng.policy.num_waiting(), usize::from(!admitted));
        eng.check_kv();
    }
}

/// Program 1 (20 blocks) goes acting and is swapped to the tier for 3 (28
/// blocks); 0.3 s later (past the cached ceiling's 0.25 s) 4 asks for 6
/// blocks with `D` = 90: inside the band. Returns the engine and that step's
/// decision.
fn new_program_inside_the_band(host_slots: usize) -> (Eng, agentd_scheduler::Decision) {
    let mut eng = engine(Some(host_slots));
    admit_all(&mut eng, 0, &[(1, 20), (2, 60)]);
    eng.finish(pid(1));
    eng.request(pid(3), 28 * BS);
    eng.now += 0.1;
    let d = eng.step(0);
    assert_eq!((ids(&d.paused()), d.admit), (vec![1], vec![(pid(3), 0)]));
    assert_eq!(eng.stats().pauses.of(PauseCause::TierSwap), 1);
    assert_close(eng.demand(0), 90.0);
    eng.request(pid(4), 5 * BS);
    eng.now += 0.3;
    let d = eng.step(0);
    eng.check_kv();
    (eng, d)
}

#[test]
fn the_band_stays_closed_while_the_tier_keeps_a_band_more() {
    // Parked 20 + band 10 = 30 ≤ 0.9 · 40.
    let (eng, d) = new_program_inside_the_band(40);
    assert_eq!(d.admit, vec![(pid(4), 0)], "{d:?}");
    assert_eq!(eng.policy.num_waiting(), 0);
}

#[test]
fn a_tier_full_of_parked_contexts_opens_the_band() {
    // Parked 20 + band 10 = 30 > 0.9 · 30: growth would have to drop
    // contexts, so admission stops at λmin again.
    let (eng, d) = new_program_inside_the_band(30);
    assert!(d.is_empty(), "{d:?}");
    assert_eq!(eng.policy.num_waiting(), 1);
}
