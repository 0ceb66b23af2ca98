//! docs/design.md §5 rules 1-6, one test per rule: the thrashing test, restore under
//! λmin, the decay, pause order, requeue and restore order. Driving the real
//! `ProgramScheduler` over real `KvCache`s through the engine harness in
//! `common` (block size 4 tokens). Rule 7 (no starvation) is in fairness.rs,
//! rules 8-10 (placement, exhaustion, leases) in replicas.rs.

mod common;

use agentd_scheduler::{PauseCause, Phase, Policy, ProgramScheduler, SchedulerConfig, State};
use common::{admit_all, assert_close, config, ids, info, pid, system_prompt, Engine, BS};

// ---------------------------------------------------------------- rule 1

/// Pause while `D > λmax·C`, and not one program more once `D ≤ λmax·C`.
#[test]
fn thrashing_test_pauses_while_demand_exceeds_lambda_max_and_stops_at_it() {
    // C = 100, λmax·C = 80; no decay, so acting blocks count fully.
    let mut eng = Engine::program(config(0.7, 0.8), 1, 100);
    admit_all(&mut eng, 0, &[(1, 5), (2, 5), (3, 5), (4, 5), (10, 10)]);
    for p in 1..=4 {
        eng.finish(pid(p));
    }
    assert_close(eng.demand(0), 20.0 + 10.0 + 1.0);

    // R grows to 59 blocks: D = 20 + 59 + 1 = 80 = λmax·C exactly: no pause.
    assert!(eng.decode(pid(10), 49 * BS));
    assert_close(eng.demand(0), 80.0);
    assert!(eng.step(0).is_empty());

    // One more token opens block 60: D = 81 > 80 → exactly one 5-block acting
    // program is paused (ties by id), D = 76.
    assert!(eng.decode(pid(10), 1));
    assert_close(eng.demand(0), 81.0);
    let d = eng.step(0);
    assert_eq!(ids(&d.paused()), vec![1]);
    assert!(d.admit.is_empty());
    assert_close(eng.demand(0), 76.0);

    // R grows to 72 blocks: D = 15 + 72 + 1 = 88. One pause leaves 83 > 80, two
    // leave 78 ≤ 80: exactly two.
    assert!(eng.decode(pid(10), 48));
    assert_eq!(eng.kv(0).blocks_held(pid(10)), 72);
    assert_close(eng.demand(0), 88.0);
    let d = eng.step(0);
    assert_eq!(ids(&d.paused()), vec![2, 3]);
    assert_close(eng.demand(0), 78.0);
    assert!(eng.step(0).is_empty(), "no further pause at D = 78");
    assert_eq!(eng.stats().pauses.of(PauseCause::Thrashing), 3);
    eng.check_kv();
}

/// Same rule with chunked prefill: a reasoning program admitted but only
/// partly prefilled counts its whole prompt in `D`, so pausing it must take
/// its whole prompt out of `D`; one pause is enough here.
#[test]
fn thrashing_test_stops_as_soon_as_demand_fits_with_chunked_prefill() {
    let mut eng = Engine::program(config(0.7, 0.8), 1, 100);
    admit_all(&mut eng, 0, &[(1, 40)]);
    // Program 2 (20 blocks) is admitted but only 2 blocks are prefilled.
    eng.prefill_chunk = Some(2 * BS);
    eng.request(pid(2), 20 * BS);
    let d = eng.step(0);
    assert_eq!(d.admit, vec![(pid(2), 0)]);
    eng.prefill_chunk = None;
    assert_eq!(eng.kv(0).blocks_held(pid(2)), 2);
    // D = 40 + (2 held + 18 promised) + 2 reserve.
    assert_close(eng.demand(0), 62.0);

    // Program 1 grows to 65 blocks: D = 65 + 20 + 2 = 87 > 80. Pausing program 2
    // (fewest blocks held) brings D to 66: program 1 must stay.
    assert!(eng.decode(pid(1), 25 * BS));
    assert_close(eng.demand(0), 87.0);
    let d = eng.step(0);
    assert_eq!(ids(&d.paused()), vec![2]);
    assert_close(eng.demand(0), 66.0);
    assert_eq!(info(&eng, 1).state, State::Active);
}

// ---------------------------------------------------------------- rule 2

/// Restore only while `D + need ≤ λmin·C`, `need` = context blocks + reserve.
#[test]
fn restore_only_while_demand_plus_need_fits_lambda_min() {
    // C = 100, λmin·C = 90.
    let mut eng = Engine::program(config(0.9, 1.0), 1, 100);
    admit_all(&mut eng, 0, &[(1, 79)]);
    assert_close(eng.demand(0), 80.0);

    // need = 10 + 1: 80 + 11 = 91 > 90 → waits.
    eng.request(pid(2), 10 * BS);
    assert!(eng.step(0).is_empty());
    assert_eq!(eng.policy.num_waiting(), 1);

    // Program 1 goes acting (its reserve leaves): 79 + 11 = 90 ≤ 90 → admitted.
    eng.finish(pid(1));
    assert_close(eng.demand(0), 79.0);
    let d = eng.step(0);
    assert_eq!(d.admit, vec![(pid(2), 0)]);
    assert_close(eng.demand(0), 90.0);

    // A one-token program (need 2) does not fit: 90 + 2 > 90.
    eng.request(pid(3), 1);
    assert!(eng.step(0).is_empty());
    assert_eq!(eng.policy.num_waiting(), 1);
}

/// Work conservation (issue 12): a replica never idles while a program waits
/// and acting programs hold the room it needs. Without decay their memory
/// counts fully forever, so the waiting program would wait for their tools;
/// instead the acting ones are paused, shortest first, just enough, and it
/// is admitted in the same step — onto their surviving cached blocks, which
/// its allocation evicts only as far as it must.
#[test]
fn an_idle_replica_pauses_acting_programs_for_a_waiting_one() {
    // C = 100, λmin·C = 90; no decay (x = 1).
    let mut eng = Engine::program(config(0.9, 1.0), 1, 100);
    admit_all(&mut eng, 0, &[(1, 20), (2, 30), (3, 35)]);
    for p in 1..=3 {
        eng.finish(pid(p));
    }
    // D = 85 with nothing running. A 10-block program (need 11): 96 > 90.
    assert_close(eng.demand(0), 85.0);
    eng.request(pid(4), 10 * BS);
    // In the same step: an idle replica with a waiting request that fits
    // once acting programs pause never waits (their blocks stay cached, so
    // a tool that returns at once costs a re-match, not a recompute).
    let d = eng.step(0);
    // Pausing program 1 (the shortest, 20 blocks) is enough: 65 + 11 ≤ 90.
    assert_eq!(ids(&d.paused()), vec![1]);
    assert_eq!(d.admit, vec![(pid(4), 0)]);
    assert!(eng.is_running(pid(4)));
    assert_eq!(eng.kv(0).blocks_held(pid(4)), 10);
    assert_eq!(eng.stats().pauses.of(PauseCause::WorkConserving), 1);
    // Program 1's blocks survived as cache (4 took free blocks): when its
    // next turn comes, the idle replica pauses 4 (now the shortest acting,
    // 65 + 22 ≤ 90) and restores 1 onto its own 20 cached blocks.
    eng.finish(pid(4));
    eng.request(pid(1), BS);
    eng.now = 1.0;
    let d = eng.step(0);
    assert_eq!((ids(&d.paused()), d.admit), (vec![4], vec![(pid(1), 0)]));
    assert_eq!(eng.last_match[&pid(1)].cached_tokens, 20 * BS);
    eng.check_kv();

    // Nothing is paused while a reasoning program runs (the replica works).
    let mut busy = Engine::program(config(0.9, 1.0), 1, 100);
    admit_all(&mut busy, 0, &[(1, 20), (2, 30), (3, 35)]);
    busy.finish(pid(1));
    busy.finish(pid(2));
    busy.request(pid(4), 10 * BS);
    busy.now = 5.0;
    assert!(busy.step(0).is_empty());
    assert_eq!(busy.policy.num_waiting(), 1);
}

/// Demand that stays between λmin·C and λmax·C causes neither pauses nor
/// restores; with λmin = λmax the same sequence restores a program and pauses
/// it again one step later.
#[test]
fn hysteresis_prevents_flapping() {
    fn run(lambda_min: f64) -> (Vec<agentd_scheduler::Decision>, Engine<ProgramScheduler>) {
        let mut eng = Engine::program(config(lambda_min, 1.0), 1, 100);
        admit_all(&mut eng, 0, &[(1, 80)]);
        assert!(eng.decode(pid(1), 13 * BS));
        // D = 93 + 1 = 94; a 5-block program (need 6) waits.
        eng.request(pid(2), 5 * BS);
        let mut out = Vec::new();
        for i in 0..6 {
            eng.now = i as f64 * 0.1;
            out.push(eng.step(0));
            assert!(eng.decode(pid(1), BS));
        }
        (out, eng)
    }

    let (with, eng) = run(0.9);
    assert!(with.iter().all(|d| d.is_empty()), "{with:?}");
    // D went from 94 to 99, always in (90, 100].
    assert_close(eng.demand(0), 99.0 + 1.0);
    let s = eng.policy.stats();
    let thrashing = eng.stats().pauses.of(PauseCause::Thrashing);
    assert_eq!((thrashing, s.restores, s.admissions), (0, 0, 1));
    assert!(info(&eng, 2).waiting);

    let (without, eng) = run(1.0);
    assert_eq!(without[0].admit, vec![(pid(2), 0)], "{without:?}");
    assert_eq!(ids(&without[1].paused()), vec![2], "{without:?}");
    let s = eng.policy.stats();
    let thrashing = eng.stats().pauses.of(PauseCause::Thrashing);
    assert_eq!((thrashing, s.admissions), (1, 2));
}

// ---------------------------------------------------------------- rule 3

/// `D(L) = |blocks of reasoning programs| + Σ_acting excl·x^(−t/Δ) + r·running`,
/// shared blocks counted once.
#[test]
fn acting_memory_is_weighted_by_decay() {
    fn setup(decay_base: f64) -> Engine<ProgramScheduler> {
        let cfg = SchedulerConfig {
            decay_base,
            decay_unit_s: 1.0,
            ..config(0.9, 1.0)
        };
        let mut eng = Engine::program(cfg, 1, 200);
        let sys = system_prompt(3 * BS);
        // 1, 2: reasoning, sharing the 3-block system prompt; 3: acting, shares
        // it too; 4: acting, nothing shared.
        for (p, own, with_sys) in [(1, 5, true), (2, 4, true), (3, 6, true), (4, 10, false)] {
            let mut toks = if with_sys { sys.clone() } else { Vec::new() };
            toks.extend(eng.own_tokens(pid(p), own * BS));
            eng.request_tokens(pid(p), &toks);
            // Admitted one per step, so each prefill shares the prompt blocks
            // the previous ones registered.
            assert_eq!(eng.step(0).admit, vec![(pid(p), 0)]);
        }
        for p in 1..=4 {
            assert_eq!(info(&eng, p).state, State::Active, "program {p}");
        }
        eng.finish(pid(3)); // acting since 0
        eng.now = 0.5;
        eng.finish(pid(4)); // acting since 0.5
        eng
    }

    let mut eng = setup(2.0);
    // The caches agree with the scenario: union of reasoning blocks 3 + 5 + 4.
    let mut reasoning: Vec<_> = [1, 2]
        .iter()
        .flat_map(|&p| eng.kv(0).block_table(pid(p)).to_vec())
        .collect();
    reasoning.sort();
    reasoning.dedup();
    assert_eq!(reasoning.len(), 12);
    assert_eq!(eng.kv(0).exclusive_blocks(pid(3)), 6);
    assert_eq!(eng.kv(0).exclusive_blocks(pid(4)), 10);
    assert_eq!(eng.kv(0).pool().num_referenced(), 12 + 6 + 10);

    for t in [0.5, 1.0, 2.5, 4.0, 10.0] {
        eng.now = t;
        let want = 12.0 + 6.0 * 2f64.powf(-t) + 10.0 * 2f64.powf(-(t - 0.5)) + 2.0;
        assert_close(eng.demand(0), want);
    }
    // Literal values: at t = 1.5, 12 + 6/2^1.5 + 10/2 + 2.
    eng.now = 1.5;
    assert_close(eng.demand(0), 19.0 + 6.0 / 8f64.sqrt());

    // x = 1 disables the decay: acting blocks count fully at any time.
    let mut flat = setup(1.0);
    for t in [0.5, 3.0, 100.0] {
        flat.now = t;
        assert_close(flat.demand(0), 12.0 + 6.0 + 10.0 + 2.0);
    }
}

// ---------------------------------------------------------------- rule 4

/// Pause order: acting before reasoning, fewest blocks first within each
/// (ids are chosen so that id order would give the opposite answer).
#[test]
fn pause_order_acting_first_then_reasoning_shortest_first() {
    let mut eng = Engine::program(config(0.8, 0.8), 1, 100);
    // 4: acting 5 blocks, 3: acting 15, 2: reasoning 8, 1: reasoning 20.
    admit_all(&mut eng, 0, &[(4, 5), (3, 15), (2, 8), (1, 20)]);
    eng.finish(pid(4));
    eng.finish(pid(3));
    assert_close(eng.demand(0), 48.0 + 2.0);
    // Program 1 grows to 71 blocks: D = 5 + 15 + 8 + 71 + 2 = 101 > 80.
    assert!(eng.decode(pid(1), 51 * BS));
    assert_close(eng.demand(0), 101.0);
    let d = eng.step(0);
    // 101 → 96 (4) → 81 (3) → 72 (2, with its reserve).
    assert_eq!(ids(&d.paused()), vec![4, 3, 2]);
    assert!(
        d.admit.is_empty(),
        "2 is not restored by the decision that paused it"
    );
    assert_close(eng.demand(0), 72.0);
    assert_eq!(info(&eng, 1).state, State::Active);
}

/// An acting program whose weighted contribution is below one block is not
/// paused by the thrashing test (pausing it would not lower `D`).
#[test]
fn acting_programs_below_one_weighted_block_are_skipped() {
    let cfg = SchedulerConfig {
        decay_base: 2.0,
        decay_unit_s: 1.0,
        ..config(0.8, 0.8)
    };
    let mut eng = Engine::program(cfg, 1, 100);
    admit_all(&mut eng, 0, &[(1, 4), (2, 10), (3, 10)]);
    eng.finish(pid(1)); // acting since 0
    eng.now = 2.5;
    eng.finish(pid(2)); // acting since 2.5
    eng.now = 3.0;
    assert!(eng.decode(pid(3), 65 * BS));
    // D = 4·2^-3 + 10·2^-0.5 + 75 + 1 = 0.5 + 7.07 + 76.
    let w2 = 10.0 * 2f64.powf(-0.5);
    assert_close(eng.demand(0), 0.5 + w2 + 76.0);
    let d = eng.step(0);
    // Program 1 comes first in the pause order but weighs 0.5 block: skipped.
    assert_eq!(ids(&d.paused()), vec![2]);
    assert_close(eng.demand(0), 0.5 + 76.0);
    assert_eq!(info(&eng, 1).state, State::Active);
    assert_eq!(info(&eng, 3).state, State::Active);
}

// ---------------------------------------------------------------- rule 5

/// A reasoning program paused at a step boundary keeps its request pending
/// in the queue (restore class) and is restored once there is room.
#[test]
fn paused_reasoning_program_requeues_its_request_and_is_restored() {
    let mut eng = Engine::program(config(0.7, 0.8), 1, 100);
    admit_all(&mut eng, 0, &[(1, 10), (2, 30)]);
    assert!(eng.decode(pid(2), 40 * BS));
    // D = 10 + 70 + 2 = 82 > 80 → pause 1 (shortest reasoning) → 71.
    eng.now = 0.5;
    let d = eng.step(0);
    assert_eq!(ids(&d.paused()), vec![1]);
    // Paused mid-request, it waits from when that request arrived (0 s).
    assert_eq!(eng.policy.queue().enqueued_at(pid(1)), Some(0.0));
    assert!(d.admit.is_empty(), "71 + 11 > 70");
    let i = info(&eng, 1);
    assert_eq!(
        (i.state, i.phase, i.waiting, i.replica),
        (State::Paused, Phase::Reasoning, true, Some(0))
    );
    assert_eq!(eng.policy.num_waiting(), 1);
    assert_eq!(eng.kv(0).blocks_held(pid(1)), 0);
    // A new program arriving now queues behind it (restore class first).
    eng.request(pid(3), BS);
    let order: Vec<u64> = eng.policy.queue().iter().map(|p| p.0).collect();
    assert_eq!(order, vec![1, 3]);

    // Program 2 ends: both are admitted, the restored one first, and it hits
    // its own 9 surviving full blocks (the last token is always recomputed).
    eng.now = 1.0;
    eng.terminate(pid(2));
    let d = eng.step(0);
    assert_eq!(d.admit, vec![(pid(1), 0), (pid(3), 0)]);
    assert_eq!(eng.last_match[&pid(1)].cached_tokens, 9 * BS);
    let s = eng.policy.stats();
    let thrashing = eng.stats().pauses.of(PauseCause::Thrashing);
    assert_eq!((s.restores, s.admissions, thrashing), (1, 3, 1));
    // Its original request is still the one in flight, and completes.
    assert_eq!(eng.pending(pid(1)), 1);
    eng.finish(pid(1));
    assert_eq!(info(&eng, 1).steps, 1);
    assert_eq!(info(&eng, 1).phase, Phase::Acting);
    eng.check_kv();
}

// ---------------------------------------------------------------- rule 6

/// Restore order: programs with a pending request (admitted before) first,
/// then new programs; shortest first within each class.
#[test]
fn restore_order_pending_requests_before_new_programs_shortest_first() {
    let mut eng = Engine::program(config(0.7, 0.8), 1, 100);
    admit_all(&mut eng, 0, &[(1, 12), (2, 6), (9, 20)]);
    assert!(eng.decode(pid(9), 50 * BS));
    // D = 12 + 6 + 70 + 3 = 91 → pause 2 (84) then 1 (71).
    let d = eng.step(0);
    assert_eq!(ids(&d.paused()), vec![2, 1]);
    // Two new programs, shorter than both paused ones.
    eng.request(pid(5), 2 * BS);
    eng.request(pid(6), BS);
    assert!(eng.step(0).is_empty(), "head needs 7: 71 + 7 > 70");
    let order: Vec<u64> = eng.policy.queue().iter().map(|p| p.0).collect();
    assert_eq!(order, vec![2, 1, 6, 5]);

    eng.now = 1.0;
    eng.terminate(pid(9));
    let d = eng.step(0);
    assert_eq!(
        d.admit,
        vec![(pid(2), 0), (pid(1), 0), (pid(6), 0), (pid(5), 0)]
    );
    let s = eng.policy.stats();
    assert_eq!((s.restores, s.admissions), (2, 5));
}

/// With one replica the queue's order is strict for a restore whose own
/// blocks survive at home (it waits for room there): a smaller program
/// behind it does not take the room it waits for (`admit.rs`, sticky).
#[test]
fn a_sticky_restore_keeps_its_place_in_the_queue() {
    // C = 100, λmin·C = 90; no tier, no decay.
    let mut eng = Engine::program(config(0.9, 1.0), 1, 100);
    admit_all(&mut eng, 0, &[(1, 20), (2, 30), (3, 35)]);
    for p in 1..=3 {
        eng.finish(pid(p));
    }
    // The idle replica pauses 1 (the shortest acting) for 4; 1's 20 blocks
    // stay cached at home.
    eng.request(pid(4), 10 * BS);
    let d = eng.step(0);
    assert_eq!((ids(&d.paused()), d.admit), (vec![1], vec![(pid(4), 0)]));
    // 4 reasons (the replica works, nothing is paused for room). 1's next
    // turn adds 30 blocks: need 50 + 1 − 20 cached = 31, 76 + 31 > 90.
    eng.request(pid(1), 30 * BS);
    eng.now = 1.0;
    assert!(eng.step(0).is_empty());
    // A 2-block newcomer would fit (76 + 3 ≤ 90) but queues behind 1.
    eng.request(pid(5), 2 * BS);
    eng.now = 2.0;
    let d = eng.step(0);
    assert!(d.admit.is_empty(), "passed the sticky restore: {d:?}");
    assert_eq!(eng.policy.num_waiting(), 2);
    // 4 goes acting: the idle replica pauses acting programs for 1 first.
    eng.finish(pid(4));
    eng.now = 3.0;
    let d = eng.step(0);
    assert_eq!(d.admit.first(), Some(&(pid(1), 0)), "{d:?}");
    eng.check_kv();
}
