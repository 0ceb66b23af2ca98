//! Rule 12: random sequences of engine events (requests, finishes, decodes
//! with exhaustion preemption, steps with their decisions applied,
//! terminations, lease expiry) on 1–3 replicas of real `KvCache`s, with or
//! without a host tier (and so with or without rotation). After every
//! event the KV invariants hold and the scheduler's view agrees with itself
//! and with the caches; the same sequence replays to the same decisions.

mod common;

use std::collections::BTreeMap;

use agentd_scheduler::{
    Lifecycle, PauseCause, Placement, Policy, ProgramId, ProgramScheduler, RequestScheduler,
    SchedulerConfig, State,
};
use common::{config, pid, system_prompt, Engine, BS};
use proptest::prelude::*;

const PROGRAMS: u8 = 8;
/// Longest event sequence: long enough for eight finished turns, after
/// which the measured waiting bound is known and may rotate.
const EVENTS: usize = 200;

#[derive(Debug, Clone)]
enum Ev {
    /// A new turn of `p`: its context grows by `extra` tokens (a new program
    /// starts with the shared system prompt when `sys`).
    Request {
        p: u8,
        extra: u8,
        sys: bool,
    },
    /// `p`'s request finishes (if it is running and fully computed).
    Finish {
        p: u8,
    },
    /// `p` decodes `n` tokens (if running); may exhaust blocks.
    Decode {
        p: u8,
        n: u8,
    },
    /// Time advances `dt` tenths of a second, then replica `r` steps.
    Step {
        r: u8,
        dt: u8,
    },
    Terminate {
        p: u8,
    },
    /// Time advances `dt` tenths of a second, then leases are checked.
    Expire {
        dt: u8,
    },
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        4 => (0..PROGRAMS, 1u8..40, any::<bool>())
            .prop_map(|(p, extra, sys)| Ev::Request { p, extra, sys }),
        3 => (0..PROGRAMS).prop_map(|p| Ev::Finish { p }),
        3 => (0..PROGRAMS, 1u8..24).prop_map(|(p, n)| Ev::Decode { p, n }),
        6 => (0u8..3, 0u8..10).prop_map(|(r, dt)| Ev::Step { r, dt }),
        1 => (0..PROGRAMS).prop_map(|p| Ev::Terminate { p }),
        1 => (0u8..120).prop_map(|dt| Ev::Expire { dt }),
    ]
}

#[derive(Debug, Clone)]
struct Setup {
    replicas: usize,
    blocks: usize,
    /// Host tier slots per replica (0: none).
    host: usize,
    cfg: SchedulerConfig,
}

fn setup() -> impl Strategy<Value = Setup> {
    setup_with(
        prop_oneof![Just(0usize), 8usize..96].boxed(),
        // The measured bound (a short one, so that short sequences reach
        // it), or the hard one.
        // Under the measured bound, rotation past the tier after two of
        // its bounds, or never.
        prop_oneof![
            Just((f64::INFINITY, 0.5, 1.0)),
            Just((f64::INFINITY, 0.5, f64::INFINITY)),
            Just((1.0, 1.0, f64::INFINITY))
        ]
        .boxed(),
    )
}

/// Setups that reach rotation past the tier: a small tier that fills, and
/// the measured bound with rotation past the tier after two of its bounds.
fn setup_past_the_tier() -> impl Strategy<Value = Setup> {
    setup_with(
        (8usize..32).boxed(),
        Just((f64::INFINITY, 0.5, 1.0)).boxed(),
    )
}

/// Host tier slots, and (`max_wait_s`, `rotate_after_turns`,
/// `recompute_after_turns`), from the strategies given.
fn setup_with(
    host: BoxedStrategy<usize>,
    bounds: BoxedStrategy<(f64, f64, f64)>,
) -> impl Strategy<Value = Setup> {
    (
        1usize..=3,
        12usize..48,
        prop_oneof![Just((0.6, 0.8)), Just((0.9, 1.0)), Just((1.0, 1.0))],
        prop_oneof![Just(1.0), Just(2.0)],
        any::<bool>(),
        0usize..3,
        host,
        bounds,
        (any::<bool>(), any::<bool>()),
    )
        .prop_map(
            |(
                replicas,
                blocks,
                (lmin, lmax),
                decay,
                best_fit,
                reserve,
                host,
                (wait, turns, past),
                (swap, yield_to_queue),
            )| {
                let cfg = SchedulerConfig {
                    max_wait_s: wait,
                    rotate_after_turns: turns,
                    recompute_after_turns: past,
                    swap_for_waiting: swap,
                    yield_to_queue,
                    decay_base: decay,
                    decay_unit_s: 1.0,
                    decode_reserve_blocks: reserve,
                    aging_tokens_per_s: 64.0,
                    lease_s: 5.0,
                    placement: if best_fit {
                        Placement::BestFit
                    } else {
                        Placement::MostRoom
                    },
                    ..config(lmin, lmax)
                };
                Setup {
                    replicas,
                    blocks,
                    host,
                    cfg,
                }
            },
        )
}

/// Applies one event the way an engine would (events that make no sense in
/// the current state, e.g. finishing a program that is not running, are
/// skipped).
fn apply<P: Policy>(eng: &mut Engine<P>, e: &Ev) {
    let n = eng.kvs().len();
    match *e {
        Ev::Request { p, extra, sys } => {
            let p = pid(p as u64);
            if eng.pending(p) > 0 {
                return; // one turn at a time
            }
            let mut toks = Vec::new();
            if sys && !eng.ctx.contains_key(&p) {
                toks = system_prompt(3 * BS);
            }
            toks.extend(eng.own_tokens(p, extra as usize));
            eng.request_tokens(p, &toks);
        }
        Ev::Finish { p } => {
            let p = pid(p as u64);
            let done = eng
                .home(p)
                .is_some_and(|r| eng.kv(r).num_computed(p) == eng.ctx[&p].len());
            if eng.is_running(p) && done {
                eng.finish(p);
            }
        }
        Ev::Decode { p, n: k } => {
            let p = pid(p as u64);
            if eng.is_running(p) {
                eng.decode(p, k as usize);
            }
        }
        Ev::Step { r, dt } => {
            eng.now += dt as f64 * 0.1;
            let r = r as usize % n;
            let d = eng.step(r);
            // Never paused and (re)admitted by the same decision (a flap).
            for (p, _) in &d.admit {
                assert!(!d.pauses(*p), "{p} paused and admitted at once: {d:?}");
            }
            // A running program left partly computed by an earlier exhaustion
            // catches up when it is its replica's turn (the engine's next step).
            let running: Vec<ProgramId> = eng.running(r).to_vec();
            for p in running {
                if eng.running(r).contains(&p) {
                    eng.catch_up(p);
                }
            }
        }
        Ev::Terminate { p } => {
            let p = pid(p as u64);
            if eng.ctx.contains_key(&p) {
                eng.terminate(p);
            }
        }
        Ev::Expire { dt } => {
            let t = eng.now + dt as f64 * 0.1;
            eng.expire_at(t);
        }
    }
}

/// Everything that must hold between two events of the program scheduler.
fn check_program(eng: &Engine<ProgramScheduler>) -> Result<(), TestCaseError> {
    for (r, kv) in eng.kvs().iter().enumerate() {
        kv.check_invariants()
            .map_err(|e| TestCaseError::fail(format!("replica {r}: {e}")))?;
    }
    let n = eng.kvs().len();
    let mut active_on: BTreeMap<ProgramId, usize> = BTreeMap::new();
    for r in 0..n {
        for p in eng.policy.active_programs(r) {
            prop_assert!(
                active_on.insert(p, r).is_none(),
                "{p} is active on two replicas"
            );
            let i = eng.policy.program(p).expect("active programs are tracked");
            prop_assert_eq!((i.state, i.replica), (State::Active, Some(r)));
        }
    }
    let queued: Vec<ProgramId> = eng.policy.queue().iter().collect();
    for p in &queued {
        prop_assert!(!active_on.contains_key(p), "{p} both waiting and active");
        prop_assert!(eng.policy.program(*p).is_some_and(|i| i.waiting));
    }
    // Waiting = has a pending request and is not active.
    let mut pending_inactive: Vec<ProgramId> = eng
        .pending_programs()
        .filter(|&(p, k)| k > 0 && !active_on.contains_key(&p))
        .map(|(p, _)| p)
        .collect();
    pending_inactive.sort();
    let mut q = queued.clone();
    q.sort();
    prop_assert_eq!(&q, &pending_inactive);
    prop_assert_eq!(eng.policy.num_waiting(), pending_inactive.len());
    // The lifecycle read off each record agrees with where the program is.
    for (p, in_flight) in eng.pending_programs() {
        let i = eng.policy.program(p).expect("every record has a snapshot");
        let want = if q.binary_search(&p).is_ok() {
            Lifecycle::Queued
        } else if active_on.contains_key(&p) && in_flight > 0 {
            Lifecycle::Running
        } else if active_on.contains_key(&p) {
            Lifecycle::Acting
        } else if i.steps == 0 && in_flight == 0 {
            i.lifecycle // Idle (a group member before its request) or Paused
        } else {
            Lifecycle::Paused
        };
        prop_assert_eq!(i.lifecycle, want, "{}", p);
        prop_assert_eq!(i.in_flight, in_flight);
    }
    // KV is referenced only where the scheduler says the program is active,
    // and the engine runs only active programs.
    for (r, kv) in eng.kvs().iter().enumerate() {
        for p in eng.ctx.keys() {
            if kv.is_resident(*p) {
                prop_assert_eq!(active_on.get(p), Some(&r), "{} resident on {}", p, r);
            }
        }
        for p in eng.running(r) {
            prop_assert_eq!(active_on.get(p), Some(&r), "{} running on {}", p, r);
        }
    }
    Ok(())
}

fn run_program(s: &Setup, evs: &[Ev]) -> Result<Engine<ProgramScheduler>, TestCaseError> {
    let mut eng = Engine::program(s.cfg.clone(), s.replicas, s.blocks).with_host_tier(s.host);
    for e in evs {
        apply(&mut eng, e);
        check_program(&eng)?;
    }
    Ok(eng)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn program_scheduler_random_events_keep_invariants_and_replay(
        s in setup(),
        evs in proptest::collection::vec(ev(), 1..EVENTS),
    ) {
        let a = run_program(&s, &evs)?;
        let b = run_program(&s, &evs)?;
        prop_assert_eq!(&a.log, &b.log, "same events, different decisions");
        prop_assert_eq!(a.policy.stats(), b.policy.stats());
    }

    /// The baseline under the same events: KV invariants, waiting count, and
    /// determinism.
    #[test]
    fn request_scheduler_random_events_keep_invariants_and_replay(
        s in setup(),
        evs in proptest::collection::vec(ev(), 1..EVENTS),
    ) {
        let run = |evs: &[Ev]| -> Result<Engine<RequestScheduler>, TestCaseError> {
            let mut eng = Engine::new(
                RequestScheduler::new(s.cfg.clone(), s.replicas),
                s.replicas,
                s.blocks,
            )
            .with_host_tier(s.host);
            for e in evs {
                apply(&mut eng, e);
                for (r, kv) in eng.kvs().iter().enumerate() {
                    kv.check_invariants()
                        .map_err(|e| TestCaseError::fail(format!("replica {r}: {e}")))?;
                }
                let waiting = eng
                    .pending_programs()
                    .filter(|&(p, k)| k > 0 && !eng.is_running(p))
                    .count();
                prop_assert_eq!(eng.policy.num_waiting(), waiting);
            }
            Ok(eng)
        };
        let a = run(&evs)?;
        let b = run(&evs)?;
        prop_assert_eq!(&a.log, &b.log);
    }
}

/// The random sequences above are not vacuous: over a fixed sample they
/// exercise every path the properties are about.
#[test]
fn random_events_exercise_pauses_restores_exhaustion_and_expiry() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    let mut runner = TestRunner::deterministic();
    let events = || proptest::collection::vec(ev(), 1..EVENTS);
    // Rotation past the tier needs a small tier full while the queue is
    // overdue twice over; since admission fills the band while the tier
    // has room (`rotation.rs::admission_ceiling`) fewer programs queue, so
    // a sample of setups with a small tier reaches it.
    let samples = [
        (1024, (setup().boxed(), events()).boxed()),
        (512, (setup_past_the_tier().boxed(), events()).boxed()),
    ];
    let (mut pauses, mut restores, mut exhausted, mut expired, mut moved) = (0, 0, 0, 0, 0);
    // Rotations under the measured bound (with a tier) and the hard one.
    let (mut measured, mut hard, mut swapped, mut yielded) = (0, 0, 0, 0);
    // Rotations past the tier (parked for recompute).
    let mut past = 0;
    let runs = samples
        .iter()
        .flat_map(|(n, strategy)| std::iter::repeat_n(strategy, *n));
    for strategy in runs {
        let (s, evs) = strategy.new_tree(&mut runner).unwrap().current();
        let eng = run_program(&s, &evs).unwrap();
        let st = eng.policy.stats();
        let by_cause = eng.stats().pauses;
        pauses += by_cause.of(PauseCause::Thrashing);
        restores += st.restores;
        exhausted += by_cause.of(PauseCause::Exhaustion);
        swapped += by_cause.of(PauseCause::TierSwap);
        yielded += by_cause.of(PauseCause::Yielded);
        if s.cfg.max_wait_s.is_finite() {
            hard += by_cause.of(PauseCause::Overdue);
        } else {
            measured += by_cause.of(PauseCause::Overdue);
            if s.cfg.recompute_after_turns.is_finite() && s.host > 0 {
                past += st.parks.of(agentd_scheduler::Park::Recompute);
            }
        }
        for l in &eng.log {
            match l {
                common::Logged::Expired(v) => expired += v.len(),
                common::Logged::Decision(r, d) => {
                    moved += d.admit.iter().filter(|(_, m)| m != r).count()
                }
                _ => {}
            }
        }
    }
    assert!(
        pauses >= 10 && restores >= 10 && exhausted >= 10 && expired >= 10 && moved >= 10,
        "pauses {pauses} restores {restores} exhausted {exhausted} expired {expired} moved {moved}"
    );
    // The measured bound needs eight finished turns, a queue overdue by a
    // second, an acting resident and room in a small tier at once, and
    // (half the sequences swap for waiting programs, which takes acting
    // residents before the bound does) the switch off: rare in random
    // sequences (its rules are tested one by one in rotation.rs, and 1,536
    // sequences run in about a second), so this only shows that the path
    // runs under the invariant checks.
    assert!(
        measured >= 1 && hard >= 10 && swapped >= 10 && yielded >= 10 && past >= 1,
        "rotations: measured bound {measured}, hard bound {hard}, past the tier {past}; \
         tier swaps {swapped}; yields {yielded}"
    );
}
