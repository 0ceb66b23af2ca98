//! One replica step through the engine's own core and the engine's own
//! step protocol ([`agentd_scheduler::Step`]): the scheduler's decision
//! applied, a mixed batch planned (decode first, then prefill chunks under
//! the token budget, pausing by the policy's order when blocks run out), the
//! batch's tokens committed as if the forward ran, the step finished, and
//! the replica's clock advanced by the step-time model. Only the cost model
//! and the clock are the simulator's; everything else is
//! [`agentd_scheduler::ReplicaSet`].

use std::time::Instant;

use agentd_scheduler::StepError;

use crate::cost::StepWork;
use crate::engine::{append_tokens, Event, SimCtx};
use crate::{SimError, Simulation};

impl Simulation {
    pub(crate) fn step(&mut self, r: usize) -> Result<(), SimError> {
        let t0 = Instant::now();
        let begun = self.core.begin_step(r, self.now, &SimCtx(&self.programs));
        self.metrics.sched_ns += t0.elapsed().as_nanos();
        self.metrics.sched_calls += 1;
        let mut step = begun.map_err(|e| invariant(self.now, e))?;
        let sched = step.scheduled();
        for e in &sched.expired {
            self.programs.remove(&e.program);
        }
        for st in &sched.started {
            self.record_start(st);
            if st.replica != r {
                self.dirty = true;
            }
        }

        let (plan, copies) = step
            .plan(
                &mut self.core,
                self.cfg.max_batched_tokens,
                &SimCtx(&self.programs),
            )
            .map_err(|e| invariant(self.now, e))?;
        // Copies decided since this replica's last step (its admissions,
        // and starts at arrival), carried out before the forward.
        let mut shape = StepWork {
            copied_tokens: copies.len() * self.cfg.block_size,
            ..StepWork::default()
        };
        if self.metrics.in_window(self.now) {
            self.metrics.copied_tokens += shape.copied_tokens as u64;
        }
        for s in &plan.seqs {
            let Some(prog) = self.programs.get_mut(&s.program) else {
                continue;
            };
            let (from, to) = (s.num_computed, s.num_computed + s.num_new);
            step.commit(&mut self.core, s.program, &prog.context[from..to])
                .map_err(|e| invariant(self.now, e))?;
            if s.decoding {
                shape.add_decode(from);
            } else {
                shape.add_prefill(from, s.num_new);
            }
            if s.wants_logits {
                shape.rows += 1;
                // The step's logits for the last token sample the next one.
                append_tokens(prog, s.program, 1);
                prog.generated += 1;
                if self.metrics.in_window(self.now) {
                    self.metrics.output_tokens += 1;
                }
                if prog.generated >= prog.gen_target {
                    self.replicas[r].finishing.push(s.program);
                }
            }
            self.note_computed(s.program, r);
        }
        let dt = (shape.tokens > 0).then(|| self.cfg.cost.step_time(&shape));
        step.finish(&mut self.core, dt)
            .map_err(|e| invariant(self.now, e))?;
        let Some(dt) = dt else {
            self.replicas[r].busy = false;
            return Ok(());
        };
        self.metrics.engine_steps += 1;
        self.push(self.now + dt, Event::Step(r));
        Ok(())
    }
}

/// A step that broke the protocol or the KV invariants: the run is void.
fn invariant(time: f64, e: StepError) -> SimError {
    SimError::Invariant {
        time,
        detail: e.to_string(),
    }
}
