//! One replica step: apply the scheduler's decision, plan a mixed batch
//! (decode tokens first, then prefill chunks under the token budget), allocate
//! slots (pausing by the policy's order when blocks run out), commit the tokens
//! and advance the replica's clock by the step-time model.

use std::time::Instant;

use agentd_kv::ProgramId;
use agentd_scheduler::Replicas;

use crate::cost::StepShape;
use crate::engine::{append_tokens, Event};
use crate::{SimError, Simulation};

impl Simulation {
    pub(crate) fn step(&mut self, r: usize) -> Result<(), SimError> {
        let t0 = Instant::now();
        let decision = self.policy.schedule(r, self.now, &Replicas(&self.kv));
        self.metrics.sched_ns += t0.elapsed().as_nanos();
        self.metrics.sched_calls += 1;
        for p in decision.pause {
            self.pause_on(p, r);
        }
        for (p, m) in decision.admit {
            self.start_on(p, m);
            if m != r {
                self.dirty = true;
            }
        }

        // Decode first (one token each, latency-critical), then prefill chunks.
        let mut order: Vec<(bool, ProgramId)> = self.replicas[r]
            .running
            .iter()
            .map(|&p| (!self.is_decoding(p, r), p))
            .collect();
        order.sort_by_key(|&(prefill, _)| prefill);
        let mut budget = self.cfg.max_batched_tokens;
        let mut shape = StepShape::default();
        for (_, p) in order {
            if budget == 0 {
                break;
            }
            if !self.replicas[r].running.contains(&p) {
                continue; // paused by an earlier allocation in this step
            }
            let Some(prog) = self.programs.get(&p) else {
                continue;
            };
            let computed = self.kv[r].num_computed(p);
            let n = (prog.context.len() - computed).min(budget);
            if n == 0 || !self.reserve(r, p, n) {
                continue;
            }
            let decoding = self.is_decoding(p, r);
            let Some(prog) = self.programs.get_mut(&p) else {
                continue;
            };
            self.kv[r]
                .commit(p, &prog.context[computed..computed + n])
                .map_err(|e| SimError::Invariant {
                    time: self.now,
                    detail: e.to_string(),
                })?;
            if decoding {
                shape.add_decode(computed);
            } else {
                shape.add_prefill(computed, n);
            }
            budget -= n;
            if computed + n == prog.context.len() {
                // The step's logits for the last token sample the next one.
                append_tokens(prog, p, 1);
                prog.generated += 1;
                if self.metrics.in_window(self.now) {
                    self.metrics.output_tokens += 1;
                }
                if prog.generated >= prog.gen_target {
                    self.replicas[r].finishing.push(p);
                }
            }
            self.note_computed(p, r);
        }

        if self.cfg.check_invariants {
            self.kv[r]
                .check_invariants()
                .map_err(|detail| SimError::Invariant {
                    time: self.now,
                    detail,
                })?;
        }
        if shape.tokens == 0 {
            self.replicas[r].busy = false;
            return Ok(());
        }
        self.metrics.engine_steps += 1;
        let dt = self.cfg.cost.step_time(&shape);
        self.push(self.now + dt, Event::Step(r));
        Ok(())
    }

    /// A sequence whose only uncomputed token is the one it sampled last.
    fn is_decoding(&self, p: ProgramId, r: usize) -> bool {
        self.programs.get(&p).is_some_and(|prog| {
            prog.generated > 0 && prog.context.len() == self.kv[r].num_computed(p) + 1
        })
    }

    /// Allocates slots for `n` tokens of `p`, pausing victims chosen by the
    /// policy while blocks are short. False when `p` itself was paused.
    fn reserve(&mut self, r: usize, p: ProgramId, n: usize) -> bool {
        loop {
            if self.kv[r].allocate_slots(p, n).is_ok() {
                return true;
            }
            let victim = self.policy.preempt(r, self.now, &Replicas(&self.kv), p);
            match victim {
                None => return false,
                Some(v) => {
                    self.pause_on(v, r);
                    if v == p {
                        return false;
                    }
                }
            }
        }
    }
}
