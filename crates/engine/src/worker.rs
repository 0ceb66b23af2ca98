//! One replica's loop: plan under the lock, run the model and sample outside
//! it, commit under the lock again.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use agentd_kv::BlockCopy;
use agentd_runtime::StepRunner;
use tracing::{error, info, warn};

use crate::board::{Board, Snapshot};
use crate::control::{Point, RunnerOp};
use crate::core::{Core, Sampled, SeqPlan};
use crate::inbox::Inbox;
use crate::outbox::Outbox;
use crate::sample::{run_step, StepEnv, StepTiming};
use crate::trace;

/// A held engine lock. Each acquisition is one numbered critical section
/// ([`Board::begin`]), ended by an explicit [`Held::end`]: it publishes a
/// snapshot if a reader asked, refreshes the inbox's waiting count and
/// records the hold time — in `lock_hold_s`, or `lock_idle_hold_s` for an
/// idle re-plan — and, with the lock free, delivers the events earlier
/// sections deferred and then those this one queued ([`crate::outbox`]); a
/// commit's section defers its own ([`Held::defer_events`]). Dropping a section without ending it only
/// unlocks (a panic unwinding through it); debug builds stop on any other.
pub(crate) struct Held<'a> {
    guard: MutexGuard<'a, Core>,
    shared: &'a Shared,
    since: Instant,
    seq: u64,
    idle: bool,
    defer: bool,
    open: Open,
}

/// Marks a section not yet ended ([`Held::end`] forgets it).
struct Open;

impl Drop for Open {
    fn drop(&mut self) {
        debug_assert!(
            std::thread::panicking(),
            "an engine lock section was left without Held::end"
        );
    }
}

impl Held<'_> {
    /// This section was an idle re-plan: nothing changed.
    pub fn set_idle(&mut self) {
        self.idle = true;
    }

    /// This section's events wait for the end of the next section (a step
    /// commit's: delivering wakes a runtime thread per stream, and on 2
    /// cores those threads took the CPU from a plan section that followed
    /// at once, held 1-2 ms for 0.1-0.2 ms of its own work).
    pub fn defer_events(&mut self) {
        self.defer = true;
    }

    /// Ends the section (see [`Held`]).
    pub fn end(self) {
        let Held {
            mut guard,
            shared,
            since,
            seq,
            idle,
            defer,
            open,
        } = self;
        std::mem::forget(open);
        let core = &mut *guard;
        shared.board.end(core, seq, shared.inbox.taken());
        shared.inbox.settle(core.num_waiting());
        let held = since.elapsed().as_secs_f64();
        if idle {
            core.counters.lock_idle_hold_s.observe(held);
        } else {
            core.counters.lock_hold_s.observe(held);
        }
        let queued = core.outbox.take();
        let outbox = if defer {
            core.deferred.append(queued);
            Outbox::default()
        } else {
            // Events deferred by an earlier section go first: a commit's
            // last token before the finish a later section queued (an
            // abort, a release), or the stream would end without it.
            let mut out = core.deferred.take();
            out.append(queued);
            out
        };
        drop(guard);
        outbox.deliver();
    }
}

impl std::ops::Deref for Held<'_> {
    type Target = Core;
    fn deref(&self) -> &Core {
        &self.guard
    }
}

impl std::ops::DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Core {
        &mut self.guard
    }
}

/// How long an idle worker sleeps before re-checking leases and decay.
const IDLE_TICK: Duration = Duration::from_millis(50);

/// Wake-ups of idle workers. A kick sets every replica's flag under this
/// mutex, so a kick between a worker's empty plan and its wait is not lost
/// (the flag makes the wait return at once).
pub(crate) struct Wake {
    kicked: Mutex<Vec<bool>>,
    cv: Vec<Condvar>,
}

impl Wake {
    pub fn new(replicas: usize) -> Self {
        Self {
            kicked: Mutex::new(vec![false; replicas]),
            cv: (0..replicas).map(|_| Condvar::new()).collect(),
        }
    }

    fn kicked(&self) -> MutexGuard<'_, Vec<bool>> {
        self.kicked.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn kick_all(&self) {
        self.kicked().fill(true);
        for cv in &self.cv {
            cv.notify_one();
        }
    }

    /// Forgets kicks of `r` so far: called before it looks at the state, so
    /// only kicks after that look wake it (a worker's own kicks after its
    /// step would otherwise cost it an idle re-plan each).
    fn clear(&self, r: usize) {
        self.kicked()[r] = false;
    }

    /// Sleeps until kicked or `timeout` passes.
    fn wait(&self, r: usize, timeout: Duration) {
        let mut k = self.kicked();
        if !k[r] {
            k = match self.cv[r].wait_timeout(k, timeout) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
        k[r] = false;
    }
}

pub(crate) struct Shared {
    pub core: Mutex<Core>,
    pub wake: Wake,
    /// Submissions not yet routed (pushed without the engine lock).
    pub inbox: Inbox,
    /// What readers see without the engine lock.
    pub board: Board,
    /// End-of-sequence tokens, read by workers outside the lock.
    pub eos: Vec<u32>,
    /// The model's vocabulary (a device plan's masks cover it).
    pub vocab: usize,
    /// Threads of the pool a worker samples on when its runner has none
    /// (the CPU runner lends its own).
    pub threads_per_replica: usize,
}

impl Shared {
    /// The engine lock (see [`Held`]). A poisoned lock means a worker
    /// panicked mid-step; the bookkeeping is still the best state there is,
    /// so keep serving the other programs.
    pub fn lock(&self) -> Held<'_> {
        self.held(self.core.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The engine lock if it is free now.
    pub fn try_lock(&self) -> Option<Held<'_>> {
        let guard = match self.core.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(self.held(guard))
    }

    /// A critical section begins on the acquired `guard`.
    fn held<'a>(&'a self, guard: MutexGuard<'a, Core>) -> Held<'a> {
        Held {
            guard,
            shared: self,
            since: Instant::now(),
            seq: self.board.begin(),
            idle: false,
            defer: false,
            open: Open,
        }
    }

    /// One section of the engine lock around `f`.
    pub fn section<T>(&self, f: impl FnOnce(&mut Core) -> T) -> T {
        let mut core = self.lock();
        let out = f(&mut core);
        core.end();
        out
    }

    /// A reader's fallback ([`crate::board`]): with the lock free, route
    /// the inbox's submissions and publish a snapshot built now.
    pub fn snapshot_now(&self) -> Option<Arc<Snapshot>> {
        let mut core = self.try_lock()?;
        if core.accepts() {
            let submitted = self.inbox.take();
            core.accept(submitted);
        }
        let snap = self.board.publish_now(&core, core.seq, self.inbox.taken());
        core.end();
        Some(snap)
    }

    pub fn wake_all(&self) {
        self.wake.kick_all();
    }
}

pub(crate) fn run(r: usize, shared: Arc<Shared>, mut runner: Box<dyn StepRunner>) {
    info!(
        replica = r,
        blocks = runner.num_blocks(),
        device = %runner.device(),
        "worker started"
    );
    // The runner's compute pool samples too (the forward is done by then);
    // a runner without one (CUDA) gets a persistent pool of the same size.
    let own_pool = if runner.compute_pool().is_none() {
        rayon::ThreadPoolBuilder::new()
            .num_threads(shared.threads_per_replica)
            .thread_name(move |i| format!("agentd-r{r}-sample{i}"))
            .build()
            .map_err(|e| warn!(replica = r, error = %e, "no sampling pool; sampling on the worker"))
            .ok()
    } else {
        None
    };
    // A commit's stream events wait for the next section (`Held::end`).
    while let Some(next) = next_plan(r, &shared) {
        let (mut plan, copies) = match next {
            Next::Step(plan, copies) => (plan, copies),
            Next::Swap(op, copies) => {
                swap(r, &shared, runner.as_mut(), op, &copies);
                continue;
            }
        };
        // The step's span covers its forward, sampling and commit.
        let step = step_span(r, &plan);
        let _in_step = step.enter();
        // Admissions may have placed programs on other replicas.
        shared.wake_all();
        let env = StepEnv {
            eos: &shared.eos,
            vocab: shared.vocab,
            own_pool: own_pool.as_ref(),
        };
        let (sampled, timing) = run_step(runner.as_mut(), &copies, &mut plan, &env);
        match sampled {
            Ok(sampled) => commit(r, &shared, plan, sampled, timing),
            Err(e) => {
                error!(replica = r, error = %e, "model forward failed; ending the step's requests");
                let mut core = shared.lock();
                timing.record(&mut core);
                core.abort_step(r, plan);
                core.flush_kv_events(r);
                core.defer_events();
                core.end();
            }
        }
        shared.wake_all();
    }
    info!(replica = r, "worker stopped");
}

/// Gives replica `r`'s runner new weights between steps (the engine is
/// drained: [`crate::control`]), after the tier copies planned so far.
fn swap(
    r: usize,
    shared: &Shared,
    runner: &mut dyn StepRunner,
    op: RunnerOp,
    copies: &[BlockCopy],
) {
    let t = Instant::now();
    let result = runner
        .copy_blocks(copies)
        .and_then(|()| op.apply(runner))
        .map_err(|e| e.to_string());
    match &result {
        Ok(()) => info!(
            replica = r,
            seconds = t.elapsed().as_secs_f64(),
            "runner weights or memory changed"
        ),
        Err(e) => error!(replica = r, error = %e, "changing the runner's weights or memory failed"),
    }
    shared.section(|core| core.swap_done(r, result));
    shared.wake_all();
}

/// The span of replica `r`'s step of `plan`, following from the spans of
/// the requests in it ([`crate::trace`]); made outside the engine lock.
fn step_span(r: usize, plan: &[SeqPlan]) -> tracing::Span {
    let decode = plan.iter().filter(|s| s.decoding).count();
    let prefill = plan
        .iter()
        .filter(|s| !s.decoding)
        .map(|s| s.new_tokens.len())
        .sum();
    let span = trace::step_span(r, plan.len(), prefill, decode);
    if !span.is_disabled() {
        for id in plan.iter().filter_map(|s| s.span.clone()) {
            span.follows_from(id);
        }
    }
    span
}

/// Step times go to `/metrics` with the step's commit.
impl StepTiming {
    fn record(self, core: &mut Core) {
        core.counters.forward_s.observe(self.forward_s);
        if let Some(s) = self.sample_s {
            core.counters.sample_s.observe(s);
        }
    }
}

/// Sequences committed per section of the engine lock. A commit touches
/// each sequence's bookkeeping cold (the forward and sampling streamed the
/// step's logits, 58 MB at 96 rows of Qwen's vocabulary, through the
/// caches and the TLB): measured 3–15 µs a sequence on the 2-core build
/// machine, so 96 in one section held the lock 0.4–0.9 ms and sections of
/// 16 still 150–360 µs.
const COMMIT_SECTION_SEQS: usize = 8;

/// Submissions routed per section of the engine lock. Routing matches a
/// prompt against the prefix cache and may start it at once (allocation,
/// events): 10–60 µs each at 96 programs, so a burst routed in the plan's
/// own section held the lock up to 0.8 ms.
const ACCEPT_SECTION_SUBMISSIONS: usize = 4;

/// Commits replica `r`'s step in sections of [`COMMIT_SECTION_SEQS`]
/// sequences (the first records `timing`), then ends it; the stream events
/// it queues go out at the end of the next section ([`Held::defer_events`]).
fn commit(
    r: usize,
    shared: &Shared,
    plan: Vec<SeqPlan>,
    sampled: Vec<Option<Sampled>>,
    timing: StepTiming,
) {
    let mut seqs = plan.into_iter().zip(sampled).peekable();
    let seconds = timing.forward_s + timing.sample_s.unwrap_or(0.0);
    let mut timing = Some(timing);
    loop {
        let mut core = shared.lock();
        if let Some(t) = timing.take() {
            t.record(&mut core);
        }
        core.commit_seqs(r, seqs.by_ref().take(COMMIT_SECTION_SEQS));
        let done = seqs.peek().is_none();
        if done {
            core.end_step(r, Some(seconds));
            core.flush_kv_events(r);
        }
        core.defer_events();
        core.end();
        if done {
            return;
        }
    }
}

/// Plans replica `r`'s next step, waiting while there is nothing to run;
/// `None` once the engine shuts down.
///
/// New submissions are routed first, [`ACCEPT_SECTION_SUBMISSIONS`] per
/// section, and taken from the inbox under the engine lock (a release
/// looks for its program's submissions there under the same lock); the
/// plan then gets a section of its own. Submissions arriving meanwhile are
/// routed too: a steady stream holds the plan back only while it outpaces
/// routing, which the inbox's back-pressure bounds.
///
/// The previous commit's events go out at the end of the first section
/// here ([`Held::defer_events`]), before that section's own: tokens reach
/// the streams one section (~0.1 ms) later.
///
/// Returns the batch with the copies between the KV tiers to carry out
/// before its forward: those of idle plans too, since no forward ran since.
fn next_plan(r: usize, shared: &Shared) -> Option<Next> {
    let mut copies = Vec::new();
    loop {
        shared.wake.clear(r);
        let mut core = shared.lock();
        let mut fresh = false;
        loop {
            if core.shutdown {
                core.end();
                return None;
            }
            // Paused, or a weight swap draining: new work waits in the inbox.
            if !core.accepts() {
                break;
            }
            let submitted = shared.inbox.take_up_to(ACCEPT_SECTION_SUBMISSIONS);
            if submitted.is_empty() {
                break;
            }
            fresh = true;
            core.accept(submitted);
            core.end();
            core = shared.lock();
        }
        match core.control_point(r) {
            Point::Run => {}
            Point::Swap(op) => {
                core.end();
                return Some(Next::Swap(op, copies));
            }
            Point::Hold { idle } => {
                if idle && !fresh {
                    core.set_idle();
                }
                core.end();
                shared.wake.wait(r, IDLE_TICK);
                continue;
            }
        }
        let mut step = core.plan(r);
        if step.seqs.is_empty() && !(fresh || step.changed) {
            core.set_idle();
        }
        core.end();
        copies.append(&mut step.copies);
        if !step.seqs.is_empty() {
            return Some(Next::Step(step.seqs, copies));
        }
        shared.wake.wait(r, IDLE_TICK);
    }
}

/// What a worker does next.
enum Next {
    /// Run this batch, after these copies between the KV tiers.
    Step(Vec<SeqPlan>, Vec<BlockCopy>),
    /// Change the runner's weights or memory, after these copies.
    Swap(RunnerOp, Vec<BlockCopy>),
}
