//! The vLLM-like baseline (`RequestScheduler`), rule 11, over real `KvCache`s.

mod common;

use agentd_scheduler::{PauseCause, Policy, RequestScheduler, Route, State};
use common::{config, pid, Engine, Logged, BS};

fn engine(replicas: usize, blocks: usize) -> Engine<RequestScheduler> {
    Engine::new(
        RequestScheduler::new(config(0.9, 1.0), replicas),
        replicas,
        blocks,
    )
}

/// A finished request drops the program's KV (full blocks stay as evictable
/// cache); with parallel requests, only when the last one finishes.
#[test]
fn request_finished_drops_kv() {
    let mut eng = engine(1, 100);
    assert_eq!(eng.request(pid(1), 10 * BS), Route::Queued);
    assert_eq!(eng.step(0).admit, vec![(pid(1), 0)]);
    assert_eq!(eng.kv(0).blocks_held(pid(1)), 10);
    // A parallel request of the running program joins it.
    assert_eq!(eng.request(pid(1), 0), Route::Run { replica: 0 });
    assert!(!eng.finish(pid(1)), "one request still in flight");
    assert_eq!(eng.kv(0).blocks_held(pid(1)), 10);
    assert!(eng.finish(pid(1)), "last request: KV dropped");
    assert_eq!(eng.kv(0).blocks_held(pid(1)), 0);
    assert_eq!(eng.kv(0).pool().num_evictable(), 10);
    assert_eq!(eng.kv(0).pool().num_referenced(), 0);
    assert!(!eng.policy.keeps_kv_between_requests());
    eng.check_kv();
}

/// FCFS: admits while the prompt fits in free + evictable blocks and stops at
/// the first request that does not fit, even if a later one would.
#[test]
fn fcfs_admission_stops_at_first_request_that_does_not_fit() {
    let mut eng = engine(1, 50);
    eng.request(pid(1), 30 * BS);
    assert_eq!(eng.step(0).admit, vec![(pid(1), 0)]);
    assert!(eng.finish(pid(1)));
    // 20 free + 30 evictable.
    assert_eq!(eng.kv(0).pool().num_free(), 20);
    assert_eq!(eng.kv(0).pool().num_available(), 50);

    eng.request(pid(2), 25 * BS); // fits only by evicting cached blocks
    eng.request(pid(3), 30 * BS); // 25 left: does not fit
    eng.request(pid(4), 2 * BS); // would fit, but is behind 3
    let d = eng.step(0);
    assert_eq!(d.admit, vec![(pid(2), 0)]);
    assert_eq!(eng.kv(0).pool().num_evictable(), 25);
    assert_eq!(eng.policy.num_waiting(), 2);
    assert!(eng.step(0).is_empty(), "still blocked by 3");

    assert!(eng.finish(pid(2)));
    let d = eng.step(0);
    assert_eq!(d.admit, vec![(pid(3), 0), (pid(4), 0)]);
    assert_eq!(eng.policy.num_waiting(), 0);
    let s = eng.policy.stats();
    assert_eq!((s.admissions, s.restores), (4, 0));
    eng.check_kv();
}

/// On exhaustion the newest running request is preempted, even when it is
/// the one asking for blocks; it goes back to the front of the queue.
#[test]
fn preempt_picks_newest_running_request_even_the_requester() {
    let mut eng = engine(1, 20);
    eng.request(pid(1), 5 * BS);
    eng.step(0);
    eng.request(pid(2), 5 * BS);
    eng.step(0);
    // 2 (the newest) needs 12 blocks, 10 are available: it preempts itself.
    assert!(!eng.decode(pid(2), 12 * BS));
    let victims: Vec<_> = eng
        .log
        .iter()
        .filter_map(|l| match l {
            Logged::Preempt(_, asking, v) => Some((asking.0, v.map(|v| v.0))),
            _ => None,
        })
        .collect();
    assert_eq!(victims, vec![(2, Some(2))]);
    assert!(eng.is_running(pid(1)));
    assert_eq!(eng.kv(0).blocks_held(pid(1)), 5);
    let i = eng.policy.program(pid(2)).unwrap();
    assert_eq!((i.state, i.waiting), (State::Paused, true));

    eng.terminate(pid(2));

    // 3 queues; then blocks run out again: the newest running request is 1.
    eng.request(pid(3), BS);
    assert_eq!(eng.policy.num_waiting(), 1);
    let (policy, mem) = eng.core.policy_and_memory();
    assert_eq!(policy.preempt(0, 0.0, &mem, pid(3)), Some(pid(1)));
    assert_eq!(policy.preempt(0, 0.0, &mem, pid(3)), None);
    eng.pause_on(pid(1), 0);
    // A preempted request goes back to the front of the queue, ahead of 3.
    let d = eng.step(0);
    assert_eq!(d.admit, vec![(pid(1), 0), (pid(3), 0)]);
    // Pauses are counted where the core applies them: the first exhaustion
    // (through its own reserve), not the one driven by hand above.
    assert_eq!(eng.stats().pauses.of(PauseCause::Exhaustion), 1);
    assert_eq!(eng.policy.stats().restores, 1);
    eng.check_kv();
}

/// A program's next request goes to the replica it ran on, even when another
/// replica is idle; its cached prefix is hit there.
#[test]
fn sticky_routing_sends_next_request_to_previous_replica() {
    let mut eng = engine(2, 100);
    eng.request(pid(1), 10 * BS); // → 0 (tie)
    eng.request(pid(2), 10 * BS); // → 1
    eng.request(pid(3), 10 * BS); // → 0 (tie 1/1)
    assert_eq!(eng.step(0).admit, vec![(pid(1), 0), (pid(3), 0)]);
    assert_eq!(eng.step(1).admit, vec![(pid(2), 1)]);
    assert!(eng.finish(pid(1)));
    assert!(eng.finish(pid(2)));
    // Load: replica 0 runs 3, replica 1 nothing. 1's next turn still goes to 0.
    eng.request(pid(1), 3 * BS);
    assert!(eng.step(1).is_empty());
    assert_eq!(eng.step(0).admit, vec![(pid(1), 0)]);
    assert_eq!(eng.last_match[&pid(1)].cached_tokens, 10 * BS);
    assert_eq!(eng.policy.program(pid(1)).unwrap().replica, Some(0));
}

/// A new program goes to the replica with the fewest queued + running
/// requests, lowest index on ties.
#[test]
fn new_programs_go_to_least_loaded_replica() {
    let mut eng = engine(3, 100);
    for p in 1..=4 {
        eng.request(pid(p), 2 * BS); // 0, 1, 2, then 0 again
    }
    eng.request(pid(5), 2 * BS); // loads 2 / 1 / 1 → 1
    assert_eq!(eng.step(1).admit, vec![(pid(2), 1), (pid(5), 1)]);
    // Loads 2 / 2 / 1 → 2; after 2 and 5 finish, 1 has 0 → 1.
    eng.request(pid(6), 2 * BS);
    assert!(eng.finish(pid(2)));
    assert!(eng.finish(pid(5)));
    eng.request(pid(7), 2 * BS);
    assert_eq!(eng.step(0).admit, vec![(pid(1), 0), (pid(4), 0)]);
    assert_eq!(eng.step(2).admit, vec![(pid(3), 2), (pid(6), 2)]);
    assert_eq!(eng.step(1).admit, vec![(pid(7), 1)]);
}
