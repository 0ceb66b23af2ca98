//! Issue 12's rules past the knee, on the real `ProgramScheduler` over real
//! `KvCache`s (block size 4): groups admitted whole, the waiting bound, and
//! per-tool pause order, and docs/design.md §5 rule 7 (no program starves: aging, the
//! bypass bound).

mod common;

use agentd_scheduler::{
    GroupId, PauseCause, Policy, Route, SchedulerConfig, ToolId, TOOL_MIN_SAMPLES,
};
use common::{config, ids, pid, system_prompt, Engine, BS};

/// Members `first..first + n` of group 7 (announced size `n`): an 8-block
/// shared prompt and 2 blocks of their own each.
fn request_group(eng: &mut Engine<agentd_scheduler::ProgramScheduler>, first: u64, n: u64) {
    for m in first..first + n {
        eng.groups.insert(pid(m), (GroupId(7), Some(n as usize)));
        let mut toks = system_prompt(8 * BS);
        toks.extend(eng.own_tokens(pid(m), 2 * BS));
        eng.request_tokens(pid(m), &toks);
    }
}

/// A group is admitted whole, on one replica, or not at all: room for one
/// member is not room for the group (its members are done only when the
/// slowest is).
#[test]
fn a_group_is_never_half_admitted() {
    // C = 100, λmin·C = 90. Program 1 runs with 72 blocks: D = 73, 17 left.
    let mut eng = Engine::program(config(0.9, 1.0), 1, 100);
    eng.request(pid(1), 72 * BS);
    assert_eq!(eng.step(0).admit, vec![(pid(1), 0)]);
    // Four members: the first needs 8 + 2 + 1 = 11 (it alone would fit), each
    // other one 2 + 1 beyond the shared prompt: 20 for the group.
    // Admission only: the batches below compute (as the engine does).
    eng.prefill_chunk = Some(0);
    request_group(&mut eng, 10, 4);
    eng.now = 0.1;
    let d = eng.step(0);
    assert!(d.admit.is_empty(), "half of a group admitted: {d:?}");
    assert!(d.pause.is_empty(), "a reasoning program runs: {d:?}");
    // Program 1 ends: the whole group goes in one decision.
    eng.finish(pid(1));
    eng.terminate(pid(1));
    eng.now = 0.2;
    let d = eng.step(0);
    let mut got = ids(&d.admit.iter().map(|a| a.0).collect::<Vec<_>>());
    got.sort();
    assert_eq!(got, vec![10, 11, 12, 13], "{d:?}");
    // In-batch prefix sharing: the first member planned computes the shared
    // prompt; the others wait a step and take its 8 blocks from the cache.
    let first = eng.run_batch(0, 1000);
    assert_eq!((first.seqs.len(), first.deferred), (1, 3), "{first:?}");
    let second = eng.run_batch(0, 1000);
    assert_eq!(second.seqs.len(), 3, "{second:?}");
    for s in &second.seqs {
        assert_eq!((s.num_computed, s.num_new), (8 * BS, 2 * BS), "{s:?}");
    }
    for m in 10..14 {
        assert_eq!(eng.kv(0).num_computed(pid(m)), 10 * BS);
    }
    assert_eq!(eng.kv(0).pool().num_referenced(), 8 + 4 * 2);
    eng.check_kv();
}

/// Only a group's first admission is one unit: a member admitted before is
/// restored alone, so a group whose next requests queue together does not
/// wait for room for all of them at once (`admit.rs`, `unit`).
#[test]
fn a_group_member_is_restored_alone() {
    let mut eng = Engine::program(config(0.9, 1.0), 1, 100);
    request_group(&mut eng, 10, 4);
    assert_eq!(eng.step(0).admit.len(), 4);
    eng.run_batch(0, 1000);
    eng.run_batch(0, 1000);
    for m in 10..14 {
        eng.finish(pid(m));
    }
    // Program 1 needs 81 blocks: the replica runs nothing, so the acting
    // members are paused for it (work conservation); then it ends.
    eng.now = 1.0;
    eng.request(pid(1), 80 * BS);
    let d = eng.step(0);
    assert_eq!(ids(&d.paused()), vec![10, 11, 12, 13]);
    assert_eq!(d.admit, vec![(pid(1), 0)]);
    eng.finish(pid(1));
    eng.terminate(pid(1));
    // Program 2 leaves room for one member's restore, not two.
    eng.now = 2.0;
    eng.request(pid(2), 75 * BS);
    assert_eq!(eng.step(0).admit, vec![(pid(2), 0)]);
    eng.now = 3.0;
    eng.request(pid(10), BS);
    eng.request(pid(11), BS);
    // Both next requests queue in one step. As one unit (the 8 shared
    // blocks; each member's 2 own, 1 new and 1 reserved) they would not
    // fit; the first is restored alone, the second waits for room.
    let d = eng.step(0);
    assert_eq!(d.admit, vec![(pid(10), 0)], "{d:?}");
    assert_eq!(eng.policy.num_waiting(), 1);
    eng.check_kv();
}

/// An announced group waits for its members (at most `group_gather_s`) so
/// its first arrivals are not admitted alone, even on an empty pool.
#[test]
fn an_announced_group_gathers_its_members_before_admission() {
    let cfg = SchedulerConfig {
        group_gather_s: 0.5,
        ..config(0.9, 1.0)
    };
    let mut eng = Engine::program(cfg, 1, 100);
    // Two of four announced members arrive.
    for m in [10u64, 11] {
        eng.groups.insert(pid(m), (GroupId(7), Some(4)));
        let mut toks = system_prompt(8 * BS);
        toks.extend(eng.own_tokens(pid(m), 2 * BS));
        eng.request_tokens(pid(m), &toks);
    }
    assert!(eng.step(0).admit.is_empty(), "admitted while gathering");
    eng.now = 0.2;
    assert!(eng.step(0).admit.is_empty(), "admitted while gathering");
    // Past the gathering window the members present go together.
    eng.now = 0.6;
    let d = eng.step(0);
    assert_eq!(d.admit, vec![(pid(10), 0), (pid(11), 0)]);
    eng.check_kv();
}

/// The waiting bound: a program queued for `max_wait_s` pauses programs
/// resident for at least as long (a reasoning one if need be) and starts.
#[test]
fn an_overdue_program_displaces_long_resident_ones() {
    let cfg = SchedulerConfig {
        max_wait_s: 2.0,
        ..config(0.9, 1.0)
    };
    let mut eng = Engine::program(cfg, 1, 100);
    // Two programs of 44 blocks fill λmin·C: D = 2 × 45 = 90.
    eng.request(pid(1), 44 * BS);
    eng.request(pid(2), 44 * BS);
    assert_eq!(eng.step(0).admit.len(), 2);
    eng.request(pid(3), 30 * BS);
    eng.now = 1.0;
    assert!(eng.step(0).is_empty(), "not overdue yet");
    eng.now = 2.0;
    let d = eng.step(0);
    // Both were resident for 2 s and both are reasoning: shortest first,
    // ties by id; one pause frees 45 ≥ 31.
    assert_eq!(ids(&d.paused()), vec![1]);
    assert_eq!(d.admit, vec![(pid(3), 0)]);
    assert_eq!(eng.stats().pauses.of(PauseCause::Overdue), 1);
    eng.check_kv();

    // Without the bound (the default) program 3 simply waits.
    let mut off = Engine::program(config(0.9, 1.0), 1, 100);
    off.request(pid(1), 44 * BS);
    off.request(pid(2), 44 * BS);
    off.step(0);
    off.request(pid(3), 30 * BS);
    off.now = 100.0;
    assert!(off.step(0).is_empty());
    assert_eq!(off.policy.num_waiting(), 1);
}

/// Records `n` acting durations of `tool` through program 50's turns.
fn tool_history(eng: &mut Engine<agentd_scheduler::ProgramScheduler>, tool: ToolId, secs: f64) {
    for _ in 0..TOOL_MIN_SAMPLES {
        eng.finish(pid(50));
        eng.core.note_tool(pid(50), tool, eng.now);
        eng.now += secs;
        eng.request(pid(50), 1);
        eng.step(0);
        assert!(eng.is_running(pid(50)));
    }
}

/// Tools named by their programs go by their observed durations: a program
/// 0.1 s into a 20 s test run is paused before a smaller one in a 0.3 s file
/// read, which is back before its blocks could serve anyone else.
#[test]
fn named_tools_order_pauses_by_expected_remaining_time() {
    let (read, test) = (ToolId(1), ToolId(2));
    let mut eng = Engine::program(config(0.9, 1.0), 1, 100);
    eng.request(pid(50), BS);
    eng.step(0);
    tool_history(&mut eng, read, 0.3);
    tool_history(&mut eng, test, 20.0);
    eng.finish(pid(50));
    eng.terminate(pid(50));

    // X (10 blocks) in a read, Y (20 blocks) in a test run.
    eng.request(pid(1), 10 * BS);
    eng.request(pid(2), 20 * BS);
    assert_eq!(eng.step(0).admit.len(), 2);
    eng.finish(pid(1));
    eng.finish(pid(2));
    eng.core.note_tool(pid(1), read, eng.now);
    eng.core.note_tool(pid(2), test, eng.now);
    eng.now += 0.1;
    // Z needs 69 of the 60 left: pausing either one alone makes room.
    // Shortest first would pause X, whose read is 0.2 s from done.
    eng.request(pid(3), 68 * BS);
    let d = eng.step(0);
    assert_eq!(ids(&d.paused()), vec![2], "{d:?}");
    assert_eq!(d.admit, vec![(pid(3), 0)]);
    eng.check_kv();
}

// ---------------------------------------------------------------- rule 7

/// One large program (60 blocks) against a stream of small ones (5 blocks,
/// two arrivals per 0.1 s step, each running 4 steps). Returns the step at
/// which the large one was admitted, if within `bound` steps of its arrival,
/// and how many small programs were admitted meanwhile.
fn large_program_under_stream(aging: f64, max_bypass: u64, bound: usize) -> (Option<usize>, u64) {
    let cfg = SchedulerConfig {
        aging_tokens_per_s: aging,
        max_bypass,
        ..config(0.9, 1.0)
    };
    let mut eng = Engine::program(cfg, 1, 100);
    let large = pid(1);
    let mut next = 100;
    let mut started: Vec<(usize, agentd_scheduler::ProgramId)> = Vec::new();
    let warmup = 5;
    for k in 0..warmup + bound {
        eng.now = k as f64 * 0.1;
        for _ in 0..2 {
            eng.request(pid(next), 5 * BS);
            next += 1;
        }
        if k == warmup {
            eng.request(large, 60 * BS);
        }
        let d = eng.step(0);
        assert!(d.pause.is_empty(), "{d:?}");
        for &(p, _) in &d.admit {
            if p == large {
                return (Some(k - warmup), eng.policy.stats().admissions);
            }
            started.push((k, p));
        }
        // Small programs that ran 4 steps finish and end.
        let (done, rest): (Vec<_>, Vec<_>) = started.into_iter().partition(|&(s, _)| k >= s + 3);
        started = rest;
        for (_, p) in done {
            eng.finish(p);
            eng.terminate(p);
        }
        eng.check_kv();
    }
    (None, eng.policy.stats().admissions)
}

/// With aging a large program overtakes later small arrivals and is admitted
/// within a bounded number of steps; without aging (and with the bypass
/// bound lifted) it starves for as long.
#[test]
fn aging_prevents_starvation() {
    const BOUND: usize = 40;
    // 256 tokens/s: after (240 − 20)/256 s ≈ 9 steps new small programs queue
    // behind the large one, then the running ones drain.
    let (with, _) = large_program_under_stream(256.0, u64::MAX, BOUND);
    let k = with.expect("admitted with aging");
    assert!((9..=15).contains(&k), "admitted after {k} steps");

    let (without, small_admitted) = large_program_under_stream(0.0, u64::MAX, BOUND);
    assert_eq!(without, None, "starves without aging");
    // …while the small programs kept flowing (this is starvation, not a stall).
    assert!(small_admitted >= 2 * BOUND as u64, "{small_admitted}");
}

/// The bypass bound alone (no aging): once `max_bypass` later arrivals have
/// been admitted ahead of the large program it is overdue, nothing new is
/// admitted past it, and it starts as soon as the running programs drain —
/// an adversarial stream of small arrivals cannot starve it.
#[test]
fn bounded_bypass_prevents_starvation_without_aging() {
    const BOUND: usize = 40;
    for k_max in [4u64, 16] {
        let (admitted, _) = large_program_under_stream(0.0, k_max, BOUND);
        let k = admitted.expect("admitted under the bypass bound");
        // Two arrivals a step: the bound is reached after k_max / 2 steps,
        // then the running small programs (4 steps each) drain.
        let limit = k_max as usize / 2 + 5;
        assert!(
            k <= limit,
            "K = {k_max}: admitted after {k} steps > {limit}"
        );
    }
}

/// `yield_to_queue`: a resident program whose tool returns while the
/// program queued longest is overdue and fits nowhere takes its place in
/// the queue (its blocks stay cached and match again on restore) instead
/// of starting ahead of it; before that program is overdue, with room for
/// it, with the option off, or without a host tier to keep what it parks,
/// it starts at once.
#[test]
fn a_returning_resident_yields_to_a_queued_program_that_has_no_room() {
    let setup_with_tier = |yield_to_queue: bool, tier: usize| {
        // No swapping for room: program 3 waits for it. A queued program
        // is overdue after 1 s (the hard bound; by default a median turn).
        let cfg = SchedulerConfig {
            yield_to_queue,
            swap_for_waiting: false,
            max_wait_s: 1.0,
            ..config(0.9, 1.0)
        };
        let mut eng = Engine::program(cfg, 1, 100).with_host_tier(tier);
        // Programs 1 and 2 of 44 blocks run: D = 2 × 45 = 90 = λmin·C.
        eng.request(pid(1), 44 * BS);
        eng.request(pid(2), 44 * BS);
        assert_eq!(eng.step(0).admit.len(), 2);
        // Program 1 calls a tool and stays resident (D = 44 + 45 = 89);
        // program 3 (31 blocks with its reserve) has no room.
        assert!(!eng.finish(pid(1)));
        eng.now = 0.5;
        eng.request(pid(3), 30 * BS);
        assert!(eng.step(0).admit.is_empty(), "no room for program 3");
        eng
    };
    let setup = |yield_to_queue: bool| setup_with_tier(yield_to_queue, 200);

    // Program 3 has waited 0.5 s, under the bound: program 1 starts.
    let mut early = setup(true);
    early.now = 1.0;
    assert_eq!(early.request(pid(1), 2 * BS), Route::Run { replica: 0 });

    let mut eng = setup(true);
    eng.now = 2.0;
    // Its tool returns: program 3, queued 1.5 s, fits nowhere.
    assert_eq!(eng.request(pid(1), 2 * BS), Route::Queued);
    assert!(!eng.is_running(pid(1)));
    assert_eq!(eng.stats().pauses.of(PauseCause::Yielded), 1);
    let queued: Vec<u64> = eng.policy.queue().by_arrival().map(|p| p.0).collect();
    assert_eq!(queued, vec![3, 1], "queued behind program 3");
    eng.check_kv();
    // Program 2's turn ends: the replica runs nothing, so its acting
    // programs let go (work conservation) and the queue is served; program
    // 1's own blocks were kept cached and match again.
    assert!(!eng.finish(pid(2)));
    eng.now = 3.0;
    let admitted: Vec<u64> = eng.step(0).admit.iter().map(|a| a.0 .0).collect();
    assert!(admitted.contains(&1), "admitted: {admitted:?}");
    assert!(eng.last_match[&pid(1)].cached_tokens >= 44 * BS);
    eng.check_kv();

    // Off: it starts at once, ahead of program 3.
    let mut off = setup(false);
    off.now = 2.0;
    assert_eq!(off.request(pid(1), 2 * BS), Route::Run { replica: 0 });
    assert_eq!(off.stats().pauses.of(PauseCause::Yielded), 0);

    // On, but program 2 has ended: program 3 fits beside program 1 (D = 44
    // + 2 unprefilled + 1 = 47, 47 + 31 ≤ 90), so program 1 starts at once.
    let mut room = setup(true);
    assert!(!room.finish(pid(2)));
    room.terminate(pid(2));
    room.now = 2.0;
    assert_eq!(room.request(pid(1), 2 * BS), Route::Run { replica: 0 });
    assert_eq!(room.stats().pauses.of(PauseCause::Yielded), 0);

    // A tier too small to keep program 1's 44 blocks (0.9 × 40 = 36):
    // yielding would lose its KV, so it starts at once.
    let mut small = setup_with_tier(true, 40);
    small.now = 2.0;
    assert_eq!(small.request(pid(1), 2 * BS), Route::Run { replica: 0 });
    // No tier at all: the same.
    let mut none = setup_with_tier(true, 0);
    none.now = 2.0;
    assert_eq!(none.request(pid(1), 2 * BS), Route::Run { replica: 0 });
}
