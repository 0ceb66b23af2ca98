//! docs/design.md §5 rules 8-10: one global queue placing programs over replicas,
//! block exhaustion mid-step, and the inactivity lease, on the real
//! `ProgramScheduler` over real `KvCache`s (block size 4 tokens).

mod common;

use agentd_scheduler::{
    PauseCause, Phase, Placement, Policy, ProgramScheduler, SchedulerConfig, State,
};
use common::{admit_all, assert_close, config, ids, info, pid, Engine, BS};

// ---------------------------------------------------------------- rule 8

/// Three replicas (C = 100, λmin·C = 90) loaded to D = 60, 70, 80; a 14-block
/// program (need 15) arrives and replica 2 takes a step.
fn three_loaded_replicas(placement: Placement) -> Engine<ProgramScheduler> {
    let cfg = SchedulerConfig {
        placement,
        ..config(0.9, 1.0)
    };
    let mut eng = Engine::program(cfg, 3, 100);
    for p in 1..=3 {
        eng.request(pid(p), 59 * BS);
    }
    // Each needs 60: no two fit one replica, under either placement.
    let d = eng.step(0);
    assert_eq!(d.admit, vec![(pid(1), 0), (pid(2), 1), (pid(3), 2)]);
    assert!(eng.decode(pid(2), 10 * BS));
    assert!(eng.decode(pid(3), 20 * BS));
    eng.now = 1.0;
    for (r, d) in [(0, 60.0), (1, 70.0), (2, 80.0)] {
        assert_close(eng.demand(r), d);
    }
    eng.request(pid(4), 14 * BS);
    eng
}

/// One global queue: a step of replica 2 places the program on replica 0,
/// the one with the most room (30 vs 20 vs 10).
#[test]
fn global_queue_restore_places_on_replica_with_most_room() {
    let mut eng = three_loaded_replicas(Placement::MostRoom);
    let d = eng.step(2);
    assert_eq!(d.admit, vec![(pid(4), 0)]);
    assert_eq!(eng.kv(0).blocks_held(pid(4)), 14);
    assert_eq!(
        eng.policy.active_programs(0).collect::<Vec<_>>(),
        vec![pid(1), pid(4)]
    );
}

/// Best fit: the replica with the least room that still fits (room 20 on
/// replica 1; replica 2's 10 is too small, replica 0's 30 is looser).
#[test]
fn best_fit_places_on_tightest_fitting_replica() {
    let mut eng = three_loaded_replicas(Placement::BestFit);
    let d = eng.step(2);
    assert_eq!(d.admit, vec![(pid(4), 1)]);
    assert_eq!(eng.kv(1).blocks_held(pid(4)), 14);
}

/// Replica 0 holds Q (50 blocks) and P (20); Q grows and P is paused. Returns
/// with P waiting, its full blocks evictable on replica 0, replica 1 empty.
fn paused_with_cache_on_replica_0() -> Engine<ProgramScheduler> {
    let cfg = SchedulerConfig {
        placement: Placement::BestFit,
        ..config(0.9, 1.0)
    };
    let mut eng = Engine::program(cfg, 2, 100);
    admit_all(&mut eng, 0, &[(1, 50)]);
    eng.request(pid(2), 20 * BS);
    assert_eq!(eng.step(0).admit, vec![(pid(2), 0)]);
    assert!(eng.decode(pid(1), 30 * BS));
    eng.now = 1.0;
    // D = 80 + 20 + 2 = 102 > 100 → pause P; it does not fit back on 0
    // (81 + 21 > 90), and replica 1 has room but P's blocks survive on 0.
    let d = eng.step(0);
    assert_eq!(ids(&d.paused()), vec![2]);
    assert!(d.admit.is_empty(), "{d:?}");
    assert_eq!(eng.kv(0).pool().num_evictable(), 20);
    for t in [2.0, 3.0] {
        eng.now = t;
        assert!(eng.step(1).is_empty(), "P must wait for replica 0");
        assert!(eng.step(0).is_empty());
    }
    assert_eq!(info(&eng, 2).replica, Some(0));
    assert!(info(&eng, 2).waiting);
    eng
}

/// A program whose own blocks survive on its previous replica waits for it
/// (and then re-hits them); once they are evicted it moves to another replica.
#[test]
fn restore_prefers_previous_replica_while_own_blocks_survive() {
    let mut eng = paused_with_cache_on_replica_0();
    eng.now = 4.0;
    eng.terminate(pid(1));
    let d = eng.step(1);
    assert_eq!(d.admit, vec![(pid(2), 0)], "placed on its previous replica");
    assert_eq!(eng.last_match[&pid(2)].cached_tokens, 19 * BS);

    // Same start, but Q's growth evicts every one of P's cached blocks.
    let mut eng = paused_with_cache_on_replica_0();
    assert!(eng.decode(pid(1), 20 * BS));
    assert_eq!(eng.kv(0).pool().num_evictable(), 0);
    eng.finish(pid(1));
    eng.now = 4.0;
    // D(0) = 100 acting blocks (no decay) ≤ λmax·C: nothing paused.
    let d = eng.step(0);
    assert!(d.pause.is_empty());
    assert_eq!(d.admit, vec![(pid(2), 1)], "nothing left to wait for");
    assert_eq!(eng.last_match[&pid(2)].cached_tokens, 0);
    assert!(!eng.kv(0).contains(pid(2)), "its old state was released");
    eng.check_kv();
}

// ---------------------------------------------------------------- rule 9

/// Block exhaustion during a step pauses by the same order (acting first,
/// shortest first), hands back the requester only when nothing else is left,
/// and never drops a request.
#[test]
fn block_exhaustion_preempts_in_pause_order_and_never_aborts() {
    let mut eng = Engine::program(config(0.9, 1.0), 1, 80);
    // 4: acting 5, 3: acting 10, 2: reasoning 8, 5: reasoning 12, 1: reasoning 20.
    admit_all(&mut eng, 0, &[(4, 5), (3, 10), (2, 8), (5, 12), (1, 20)]);
    eng.finish(pid(4));
    eng.finish(pid(3));
    let victims = |eng: &Engine<ProgramScheduler>, from: usize| -> Vec<u64> {
        eng.log[from..]
            .iter()
            .filter_map(|l| match l {
                common::Logged::Preempt(_, _, Some(v)) => Some(v.0),
                _ => None,
            })
            .collect()
    };

    // Program 1 needs 36 blocks, 25 are available: 4 (→30) then 3 (→40).
    let mark = eng.log.len();
    assert!(eng.decode(pid(1), 36 * BS));
    assert_eq!(victims(&eng, mark), vec![4, 3]);
    assert_eq!(eng.kv(0).blocks_held(pid(1)), 56);

    // Then 30 more with 4 available: 2 (→12), 5 (→24), then itself.
    let mark = eng.log.len();
    assert!(!eng.decode(pid(1), 30 * BS));
    assert_eq!(victims(&eng, mark), vec![2, 5, 1]);
    assert_eq!(eng.policy.active_programs(0).count(), 0);
    let now = eng.now;
    let (policy, mem) = eng.core.policy_and_memory();
    assert_eq!(policy.preempt(0, now, &mem, pid(1)), None);

    let s = eng.stats().pauses;
    let by_cause = (s.of(PauseCause::Exhaustion), s.of(PauseCause::Thrashing));
    assert_eq!(by_cause, (5, 0));
    // Acting victims have nothing pending; every reasoning request waits.
    for p in [4, 3] {
        assert_eq!(
            (info(&eng, p).state, info(&eng, p).waiting),
            (State::Paused, false)
        );
    }
    for p in [2, 5, 1] {
        let i = info(&eng, p);
        assert_eq!(
            (i.state, i.phase, i.waiting),
            (State::Paused, Phase::Reasoning, true)
        );
    }
    assert_eq!(eng.policy.num_waiting(), 3);
    // And they come back: 2 and 5 fit (9 + 13), 1 (57) waits behind them.
    let d = eng.step(0);
    assert_eq!(d.admit, vec![(pid(2), 0), (pid(5), 0)]);
    assert_eq!(eng.policy.num_waiting(), 1);
    eng.check_kv();
}

// ---------------------------------------------------------------- rule 10

/// `expire(now)` terminates exactly the programs idle for longer than the
/// lease; programs with a request in flight or queued are never idle.
#[test]
fn inactivity_lease_expires_only_idle_programs() {
    let cfg = SchedulerConfig {
        lease_s: 100.0,
        ..config(0.9, 1.0)
    };
    let mut eng = Engine::program(cfg, 1, 100);
    admit_all(&mut eng, 0, &[(1, 5), (2, 5), (3, 5)]);
    eng.request(pid(4), 120 * BS); // never fits: stays queued
    assert!(eng.step(0).is_empty());
    eng.finish(pid(1)); // idle since 0
    eng.now = 50.0;
    eng.finish(pid(2)); // idle since 50; 3 keeps its request in flight

    assert!(
        eng.expire_at(100.0).is_empty(),
        "100 s is not longer than the lease"
    );
    assert_eq!(eng.expire_at(100.5), vec![pid(1)]);
    assert!(eng.policy.program(pid(1)).is_none());
    assert!(!eng.kv(0).contains(pid(1)));
    assert!(eng.expire_at(150.0).is_empty());
    assert_eq!(eng.expire_at(150.01), vec![pid(2)]);
    assert!(eng.expire_at(10_000.0).is_empty());
    assert_eq!(
        eng.policy.active_programs(0).collect::<Vec<_>>(),
        vec![pid(3)]
    );
    assert_eq!(eng.policy.num_waiting(), 1);
    assert!(eng.policy.program(pid(4)).is_some_and(|i| i.waiting));
    assert_eq!(eng.kv(0).pool().num_referenced(), 5);
    eng.check_kv();
}
