//! One replica's loop: plan under the lock, run the model outside it, commit
//! under the lock again.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use agentd_models::{BatchBuilder, LogitsFor, StepRunner};
use tracing::{error, info};

use crate::core::{Core, SeqPlan};

/// How long an idle worker sleeps before re-checking leases and decay.
const IDLE_TICK: Duration = Duration::from_millis(50);

pub(crate) struct Shared {
    pub core: Mutex<Core>,
    /// One per replica; all share `core`'s mutex.
    pub wake: Vec<Condvar>,
}

impl Shared {
    /// A poisoned lock means a worker panicked mid-step; the bookkeeping is
    /// still the best state there is, so keep serving the other programs.
    pub fn lock(&self) -> MutexGuard<'_, Core> {
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
        let plan = {
            let mut core = shared.lock();
            loop {
                if core.shutdown {
                    info!(replica = r, "worker stopped");
                    return;
                }
                let plan = core.plan(r);
                if !plan.is_empty() {
                    break plan;
                }
                core = match shared.wake[r].wait_timeout(core, IDLE_TICK) {
                    Ok((g, _)) => g,
                    Err(e) => e.into_inner().0,
                };
            }
        };
        // Admissions may have placed programs on other replicas.
        shared.wake_all();
        let result = forward(runner.as_mut(), &plan);
        let mut core = shared.lock();
        match result {
            Ok(rows) => core.commit(r, &plan, &rows),
            Err(e) => {
                error!(replica = r, error = %e, "model forward failed; aborting the step's requests");
                core.abort_step(r, &plan);
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
        let logits = if s.wants_logits {
            LogitsFor::Last
        } else {
            LogitsFor::None
        };
        b.push(&s.new_tokens, s.num_cached, &s.block_table, logits);
    }
    runner.step(&b.build())
}
