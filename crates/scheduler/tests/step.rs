//! The step protocol ([`agentd_scheduler::Step`]) on the real core and
//! caches: one open step per replica, a step used only on its own set, the
//! batch committed only by its own programs, aborts through the step, and
//! the invariants checked when a step ends; a trainer's retract and flush
//! only between steps.

mod common;

use std::collections::BTreeMap;

use agentd_scheduler::{
    Contexts, PauseCause, ProgramId, ProgramScheduler, ReplicaSet, Step, StepError,
};
use common::{config, pid, BS};

/// Each program's full context, lent to the core.
#[derive(Default)]
struct Ctx(BTreeMap<ProgramId, Vec<u32>>);

impl Contexts for Ctx {
    fn context(&self, p: ProgramId) -> Option<&[u32]> {
        self.0.get(&p).map(Vec::as_slice)
    }
    fn generated(&self, _p: ProgramId) -> usize {
        0
    }
}

impl Ctx {
    /// `p`'s context grows by `n` tokens of its own.
    fn grow(&mut self, p: ProgramId, n: usize) {
        let c = self.0.entry(p).or_default();
        let from = c.len() as u32;
        c.extend((0..n as u32).map(|i| (p.0 as u32 + 1) * 1_000_000 + from + i));
    }
}

/// `replicas` replicas of 16 blocks each, invariants checked.
fn set(replicas: usize) -> ReplicaSet<ProgramScheduler> {
    let policy = ProgramScheduler::new(config(0.9, 0.95), replicas);
    ReplicaSet::new(policy, replicas, 16, BS, 0, true)
}

/// A whole step of `r`: begun, planned under 64 tokens, every planned
/// sequence committed, finished. Returns the programs it computed.
fn run_step(core: &mut ReplicaSet<ProgramScheduler>, ctx: &Ctx, r: usize) -> Vec<ProgramId> {
    let mut step = core.begin_step(r, 0.0, ctx).expect("no step open");
    let (plan, _copies) = step.plan(core, 64, ctx).expect("first plan");
    for s in &plan.seqs {
        let toks = &ctx.0[&s.program][s.num_computed..s.num_computed + s.num_new];
        step.commit(core, s.program, toks).expect("planned slots");
    }
    step.finish(core, None).expect("invariants hold");
    plan.seqs.iter().map(|s| s.program).collect()
}

#[test]
fn a_replica_has_one_step_open_at_a_time() {
    let (mut core, ctx) = (set(2), Ctx::default());
    let step = core.begin_step(0, 0.0, &ctx).expect("first step of 0");
    assert!(matches!(
        core.begin_step(0, 0.0, &ctx),
        Err(StepError::AlreadyOpen(0))
    ));
    // Other replicas step independently.
    let other = core.begin_step(1, 0.0, &ctx).expect("first step of 1");
    assert!(matches!(
        core.begin_step(7, 0.0, &ctx),
        Err(StepError::NoReplica(7))
    ));
    step.finish(&mut core, None).expect("empty step");
    other.finish(&mut core, None).expect("empty step");
    let again = core.begin_step(0, 0.0, &ctx).expect("0 is closed again");
    again.finish(&mut core, None).expect("empty step");
}

#[test]
fn a_step_is_planned_once_and_commits_only_its_batch() {
    let (mut core, mut ctx) = (set(1), Ctx::default());
    ctx.grow(pid(1), 3 * BS);
    assert_eq!(core.on_request(pid(1), 0.0, &ctx), None, "queued first");
    let mut step = core.begin_step(0, 0.0, &ctx).expect("open");
    let started: Vec<ProgramId> = step.scheduled().started.iter().map(|s| s.program).collect();
    assert_eq!(started, vec![pid(1)]);
    assert!(!step.holds(pid(1)), "nothing is held before the plan");
    let (plan, _) = step.plan(&mut core, 64, &ctx).expect("first plan");
    assert_eq!(plan.seqs.len(), 1);
    assert_eq!(plan.seqs[0].num_new, 3 * BS);
    assert!(step.holds(pid(1)));
    assert_eq!(step.batch(), &[pid(1)]);
    assert!(matches!(
        step.plan(&mut core, 64, &ctx),
        Err(StepError::PlannedTwice(0))
    ));
    let toks = ctx.0[&pid(1)].clone();
    assert!(matches!(
        step.commit(&mut core, pid(2), &toks),
        Err(StepError::NotPlanned { replica: 0, .. })
    ));
    assert_eq!(
        step.commit(&mut core, pid(1), &toks).expect("slots"),
        3 * BS
    );
    step.finish(&mut core, None).expect("invariants hold");
    assert_eq!(core.kv(0).num_computed(pid(1)), 3 * BS);
    assert_eq!(core.kv(0).pool().num_referenced(), 3);
}

#[test]
fn a_step_of_another_set_is_refused_and_changes_nothing() {
    let (mut a, mut b, mut ctx) = (set(1), set(1), Ctx::default());
    ctx.grow(pid(1), 2 * BS);
    a.on_request(pid(1), 0.0, &ctx);
    b.on_request(pid(1), 0.0, &ctx);
    let mut step = a.begin_step(0, 0.0, &ctx).expect("open on a");
    assert!(matches!(
        step.plan(&mut b, 64, &ctx),
        Err(StepError::ForeignSet(0))
    ));
    assert!(b.running(0).is_empty(), "b was not scheduled");
    assert_eq!(b.kv(0).pool().num_referenced(), 0);
    let (plan, _) = step.plan(&mut a, 64, &ctx).expect("a's own plan");
    assert_eq!(plan.seqs.len(), 1);
    let toks = ctx.0[&pid(1)].clone();
    assert!(matches!(
        step.commit(&mut b, pid(1), &toks),
        Err(StepError::ForeignSet(0))
    ));
    step.commit(&mut a, pid(1), &toks).expect("a's slots");
    // b has no step open: its own steps still run.
    assert_eq!(run_step(&mut b, &ctx, 0), vec![pid(1)]);
    step.finish(&mut a, None).expect("invariants hold");
    assert_eq!(a.kv(0).num_computed(pid(1)), 2 * BS);
}

#[test]
fn an_aborted_step_pauses_its_batch_with_every_block_accounted() {
    let (mut core, mut ctx) = (set(1), Ctx::default());
    ctx.grow(pid(1), 4 * BS);
    ctx.grow(pid(2), 2 * BS);
    core.on_request(pid(1), 0.0, &ctx);
    core.on_request(pid(2), 0.0, &ctx);
    let mut computed = run_step(&mut core, &ctx, 0);
    computed.sort();
    assert_eq!(computed, vec![pid(1), pid(2)]);
    // The next turn of each starts at once; its step is planned, then the
    // forward fails.
    for p in [pid(1), pid(2)] {
        core.finish_request(p, 0.0, ctx.0[&p].len());
        ctx.grow(p, BS);
        assert!(core.on_request(p, 1.0, &ctx).is_some(), "{p} is active");
    }
    let mut step = core.begin_step(0, 1.0, &ctx).expect("open");
    let (plan, _) = step.plan(&mut core, 64, &ctx).expect("plan");
    assert_eq!(plan.seqs.len(), 2);
    assert_eq!(
        core.kv(0).pool().num_referenced(),
        4 + 2 + 2,
        "each holds a new block"
    );
    let mut aborted = step.abort(&mut core).expect("invariants hold");
    aborted.sort();
    assert_eq!(aborted, vec![pid(1), pid(2)]);
    // Off the replica, their requests still in flight; the blocks they
    // computed stay cached (evictable), the new ones are free again.
    assert!(core.running(0).is_empty());
    assert_eq!(core.pending(pid(1)), 1);
    assert_eq!(core.kv(0).pool().num_referenced(), 0);
    assert_eq!(core.kv(0).pool().num_evictable(), 4 + 2);
    core.verify(0).expect("invariants hold");
    // The caller ends the requests (the engine does, with an error); the
    // next turn of each matches what it had computed.
    for (p, had) in [(pid(1), 4 * BS), (pid(2), 2 * BS)] {
        core.finish_request(p, 2.0, ctx.0[&p].len());
        assert_eq!(core.pending(p), 0);
        let st = core.on_request(p, 2.0, &ctx).expect("still active");
        assert_eq!(st.matched.cached_tokens, had, "{p}");
    }
    let mut computed = run_step(&mut core, &ctx, 0);
    computed.sort();
    assert_eq!(computed, vec![pid(1), pid(2)], "the replica steps again");
}

#[test]
fn a_step_short_of_blocks_commits_only_what_it_kept() {
    // 16 blocks; two programs of 5 blocks grow to 11 each: both cannot
    // stay. The step pauses one (the policy's decision, or blocks running
    // out in the plan), never commits it, and ends consistent.
    let (mut core, mut ctx) = (set(1), Ctx::default());
    for p in [pid(1), pid(2)] {
        ctx.grow(p, 5 * BS - 1);
        core.on_request(p, 0.0, &ctx);
    }
    assert_eq!(run_step(&mut core, &ctx, 0).len(), 2);
    for p in [pid(1), pid(2)] {
        core.finish_request(p, 0.0, ctx.0[&p].len());
        ctx.grow(p, 6 * BS);
        core.on_request(p, 1.0, &ctx);
    }
    let mut step: Step = core.begin_step(0, 1.0, &ctx).expect("open");
    let decided = step.scheduled().decision.paused();
    let (plan, _) = step.plan(&mut core, 128, &ctx).expect("plan");
    let paused: Vec<ProgramId> = decided.into_iter().chain(plan.preempted.clone()).collect();
    assert_eq!(paused.len(), 1, "{plan:?}");
    assert!(!step.holds(paused[0]));
    assert_eq!(plan.seqs.len(), 1);
    let kept = plan.seqs[0];
    assert_ne!(kept.program, paused[0]);
    let toks = &ctx.0[&kept.program][kept.num_computed..kept.num_computed + kept.num_new];
    step.commit(&mut core, kept.program, toks).expect("slots");
    step.finish(&mut core, None).expect("invariants hold");
    assert_eq!(core.kv(0).num_computed(kept.program), 11 * BS - 1);
    assert!(core.kv(0).pool().num_referenced() <= 16);
    assert_eq!(core.running(0), &[kept.program]);
}

/// A trainer's retract and flush (issue 31) change a replica only between
/// its steps: refused, changing nothing, while its step is open (the batch
/// is in the forward); carried out once the step is finished.
#[test]
fn retract_and_flush_wait_for_the_open_step() {
    let (mut core, mut ctx) = (set(1), Ctx::default());
    ctx.grow(pid(1), 3 * BS);
    ctx.grow(pid(2), 2 * BS);
    core.on_request(pid(1), 0.0, &ctx);
    core.on_request(pid(2), 0.0, &ctx);
    let mut step = core.begin_step(0, 0.0, &ctx).expect("open");
    let (plan, _) = step.plan(&mut core, 64, &ctx).expect("plan");
    assert_eq!(plan.seqs.len(), 2);
    assert!(matches!(
        core.retract(0, 0.0),
        Err(StepError::AlreadyOpen(0))
    ));
    assert!(matches!(core.flush(0), Err(StepError::AlreadyOpen(0))));
    assert!(matches!(core.flush(3), Err(StepError::NoReplica(3))));
    assert_eq!(core.running(0).len(), 2, "nothing was retracted");
    assert_eq!(core.kv(0).pool().num_referenced(), 5, "nothing was flushed");
    for s in &plan.seqs {
        let toks = &ctx.0[&s.program][s.num_computed..s.num_computed + s.num_new];
        step.commit(&mut core, s.program, toks)
            .expect("planned slots");
    }
    step.finish(&mut core, None).expect("invariants hold");
    // Between steps: both are paused with their requests in flight, their
    // computed blocks left cached; the flush then forgets them.
    let mut retracted = core.retract(0, 1.0).expect("between steps");
    retracted.sort();
    assert_eq!(retracted, vec![pid(1), pid(2)]);
    // Counted once, as retracted: a retract is not a block exhaustion.
    let pauses = core.stats().pauses;
    assert_eq!(pauses.of(PauseCause::Retracted), 2);
    assert_eq!(pauses.total(), 2);
    assert!(core.running(0).is_empty());
    assert_eq!(core.pending(pid(1)), 1);
    assert_eq!(core.kv(0).pool().num_evictable(), 5);
    assert_eq!(core.flush(0).expect("between steps"), 5);
    assert_eq!(core.kv(0).pool().num_evictable(), 0);
    assert_eq!(core.kv(0).pool().num_referenced(), 0);
    core.verify(0).expect("invariants hold");
}
