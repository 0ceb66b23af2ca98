//! One replica's loop: plan under the lock, run the model and sample outside
//! it, commit under the lock again.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use agentd_models::{BatchBuilder, LogitsFor, StepRunner};
use tracing::{error, info};

use crate::core::{Core, Sampled, SeqPlan};
use crate::FinishReason;

/// A held engine lock that records its hold time when released.
pub(crate) struct Held<'a> {
    guard: MutexGuard<'a, Core>,
    since: Instant,
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

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let held = self.since.elapsed().as_secs_f64();
        self.guard.counters.lock_hold_s.observe(held);
    }
}

/// How long an idle worker sleeps before re-checking leases and decay.
const IDLE_TICK: Duration = Duration::from_millis(50);

/// Below this many rows to sample, one thread does it: a thread costs
/// ~20 µs to start, a greedy row ~0.1 ms, a temperature row ~1 ms.
const PARALLEL_SAMPLING_MIN_ROWS: usize = 4;

pub(crate) struct Shared {
    pub core: Mutex<Core>,
    /// One per replica; all share `core`'s mutex.
    pub wake: Vec<Condvar>,
    /// End-of-sequence tokens, read by workers outside the lock.
    pub eos: Vec<u32>,
}

impl Shared {
    /// The engine lock, timed: how long it is held goes to the
    /// `lock_hold_s` histogram when the guard drops. A poisoned lock means a
    /// worker panicked mid-step; the bookkeeping is still the best state
    /// there is, so keep serving the other programs.
    pub fn lock(&self) -> Held<'_> {
        Held {
            guard: self.lock_untimed(),
            since: Instant::now(),
        }
    }

    /// The plain guard, for waiting on a condition variable; its holder
    /// records the hold time itself.
    fn lock_untimed(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn wake_all(&self) {
        for cv in &self.wake {
            cv.notify_one();
        }
    }
}

pub(crate) fn run(r: usize, shared: Arc<Shared>, mut runner: Box<dyn StepRunner>) {
    info!(
        replica = r,
        blocks = runner.num_blocks(),
        device = %runner.device(),
        "worker started"
    );
    loop {
        let mut plan = {
            let mut core = shared.lock_untimed();
            let mut since = Instant::now();
            loop {
                if core.shutdown {
                    info!(replica = r, "worker stopped");
                    return;
                }
                let plan = core.plan(r);
                let held = since.elapsed().as_secs_f64();
                core.counters.lock_hold_s.observe(held);
                if !plan.is_empty() {
                    break plan;
                }
                core = match shared.wake[r].wait_timeout(core, IDLE_TICK) {
                    Ok((g, _)) => g,
                    Err(e) => e.into_inner().0,
                };
                since = Instant::now();
            }
        };
        // Admissions may have placed programs on other replicas.
        shared.wake_all();
        let result = forward(runner.as_mut(), &plan);
        let sampled = result.map(|rows| sample(&mut plan, &rows, &shared.eos));
        let mut core = shared.lock();
        match sampled {
            Ok(sampled) => core.commit(r, plan, sampled),
            Err(e) => {
                error!(replica = r, error = %e, "model forward failed; aborting the step's requests");
                core.abort_step(r, plan);
            }
        }
        core.flush_kv_events(r);
        drop(core);
        shared.wake_all();
    }
}

/// Runs the model on the planned batch; one logits row per sequence that
/// asked for one, in plan order.
fn forward(runner: &mut dyn StepRunner, plan: &[SeqPlan]) -> agentd_models::Result<Vec<Vec<f32>>> {
    let mut b = BatchBuilder::new(runner.block_size());
    for s in plan {
        let logits = if s.wants_logits() {
            LogitsFor::Last
        } else {
            LogitsFor::None
        };
        b.push(&s.new_tokens, s.num_cached, &s.block_table, logits);
    }
    runner.step(&b.build())
}

/// Samples each sequence's next token from its logits row with its own
/// sampler, outside the engine lock, in parallel across sequences (each
/// sampler owns its RNG, so the result does not depend on the split). The
/// result is aligned with `plan`: `None` where no logits were asked for.
fn sample(plan: &mut [SeqPlan], rows: &[Vec<f32>], eos: &[u32]) -> Vec<Option<Sampled>> {
    let mut outs: Vec<Option<Sampled>> = plan.iter().map(|_| None).collect();
    let mut rows = rows.iter();
    let mut jobs: Vec<Job<'_>> = Vec::with_capacity(plan.len());
    for (s, out) in plan.iter_mut().zip(outs.iter_mut()) {
        if let Some(sampler) = s.sampler.as_mut() {
            let row = rows.next().map_or(&[][..], Vec::as_slice);
            jobs.push((sampler, row, out));
        }
    }
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    if jobs.len() >= PARALLEL_SAMPLING_MIN_ROWS && threads > 1 {
        let chunk = jobs.len().div_ceil(threads);
        std::thread::scope(|scope| {
            for c in jobs.chunks_mut(chunk) {
                scope.spawn(move || c.iter_mut().for_each(|j| sample_one(j, eos)));
            }
        });
    } else {
        jobs.iter_mut().for_each(|j| sample_one(j, eos));
    }
    outs
}

type Job<'a> = (
    &'a mut agentd_models::SequenceSampler,
    &'a [f32],
    &'a mut Option<Sampled>,
);

/// One row. A sampler error (or a missing row) ends the request.
fn sample_one((sampler, row, out): &mut Job<'_>, eos: &[u32]) {
    **out = Some(match sampler.sample(row) {
        Ok(output) => {
            let finish = sampler
                .finish_reason(output.token_id, eos)
                .map(|f| match f {
                    agentd_models::sampling::FinishReason::Stop => FinishReason::Stop,
                    agentd_models::sampling::FinishReason::Length => FinishReason::Length,
                });
            Sampled {
                output: Some(output),
                finish,
            }
        }
        Err(e) => {
            error!(error = %e, "sampling failed; ending the request");
            Sampled {
                output: None,
                finish: Some(FinishReason::Cancelled),
            }
        }
    });
}
