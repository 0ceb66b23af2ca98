//! A replica's step under the engine lock: the scheduler's [`Step`]
//! begun and planned before the forward ([`Core::plan`]), its sequences
//! committed after it ([`Core::commit_seqs`]), then finished
//! ([`Core::end_step`]) or aborted when the forward failed
//! ([`Core::abort_step`]). The worker ([`crate::worker`]) calls these in
//! its lock sections; the forward and sampling run outside the lock.

use std::time::Instant;

use agentd_kv::ProgramId;
use agentd_scheduler::{PauseCause, Step, StepError};
use tracing::error;

use crate::core::{Core, Requests, Sampled, SeqPlan, StepBatch};
use crate::{EndReason, Event, FinishReason};

impl Core {
    /// Step bookkeeping before the forward of replica `r`: cancellations,
    /// then its [`Step`] begun (leases, the policy's decision) and planned.
    /// A step with a batch stays open until [`Core::end_step`] or
    /// [`Core::abort_step`]; one without is finished here.
    pub fn plan(&mut self, r: usize) -> StepBatch {
        let now = self.now();
        let mut batch = StepBatch {
            seqs: Vec::new(),
            copies: Vec::new(),
            changed: self.finish_cancelled(r) | self.finish_cancelled_waiting(),
        };
        let begun = self.replicas.begin_step(r, now, &Requests(&self.requests));
        let mut step = match begun {
            Ok(step) => step,
            Err(e) => {
                protocol_bug(r, &e);
                return batch;
            }
        };
        let sched = step.scheduled();
        batch.changed |= !(sched.expired.is_empty() && sched.decision.is_empty());
        for &(p, cause) in &sched.decision.pause {
            self.note_pause(p, cause);
        }
        // Terminated by the core already (no request in flight, so no batch
        // holds them): what follows their end. Rare, and usually empty.
        for mut ended in sched.expired.clone() {
            ended.life.release = Some(EndReason::LeaseExpired);
            self.ended(ended);
        }
        for &st in &sched.started {
            self.note_start(st);
        }
        // An admitted request cancelled while it waited ends here, before
        // any step computes its prompt.
        batch.changed |= self.finish_cancelled(r);
        let budget = self.cfg.max_num_batched_tokens;
        let planned = step.plan(&mut self.replicas, budget, &Requests(&self.requests));
        let (plan, copies) = match planned {
            Ok(planned) => planned,
            Err(e) => {
                protocol_bug(r, &e);
                self.close(step, None);
                return batch;
            }
        };
        batch.changed |= !(plan.seqs.is_empty() && plan.preempted.is_empty());
        for &p in &plan.preempted {
            self.note_pause(p, PauseCause::Exhaustion);
        }
        batch.copies = copies;
        if plan.seqs.is_empty() {
            self.close(step, None);
            return batch;
        }
        self.counters.batch_budget += budget as u64;
        self.counters.batch_tokens += (budget - plan.budget_left) as u64;
        batch.seqs = self.seq_plans(r, &plan.seqs);
        self.steps[r] = Some(step);
        batch
    }

    /// The planned sequences with what the forward needs of them: their
    /// new tokens, block tables and (when they sample) their samplers.
    fn seq_plans(&mut self, r: usize, planned: &[agentd_scheduler::Planned]) -> Vec<SeqPlan> {
        let mut seqs = Vec::with_capacity(planned.len());
        for s in planned {
            let block_table = self
                .replicas
                .kv(r)
                .block_table(s.program)
                .iter()
                .map(|b| b.0)
                .collect();
            let Some(req) = self.requests.get_mut(&s.program) else {
                continue;
            };
            let (from, to) = (s.num_computed, s.num_computed + s.num_new);
            seqs.push(SeqPlan {
                program: s.program,
                new_tokens: req.tokens[from..to].to_vec(),
                num_cached: from,
                block_table,
                sampler: if s.wants_logits {
                    req.sampler.take()
                } else {
                    None
                },
                request: req.id,
                prompt: req
                    .prompt_lp
                    .as_ref()
                    .and_then(|lp| lp.rows(&req.tokens, req.prompt_len, from, to)),
                decoding: s.decoding,
                span: req.span.id(),
            });
        }
        seqs
    }

    /// Whether `p` is in the batch of some replica's open step.
    pub fn in_step(&self, p: ProgramId) -> bool {
        self.steps.iter().flatten().any(|s| s.holds(p))
    }

    /// Whether some replica has a step open (its batch in the forward).
    pub fn stepping(&self) -> bool {
        self.steps.iter().any(Option::is_some)
    }

    /// Finishes `step` (its invariants checked in debug builds); `seconds`:
    /// its forward and sampling, when it ran one.
    fn close(&mut self, step: Step, seconds: Option<f64>) {
        let r = step.replica();
        if let Err(e) = step.finish(&mut self.replicas, seconds) {
            protocol_bug(r, &e);
        }
    }

    /// Step bookkeeping after the forward and sampling, in one go:
    /// [`Core::commit_seqs`] then [`Core::end_step`].
    #[cfg(test)]
    pub fn commit(&mut self, r: usize, plan: Vec<SeqPlan>, sampled: Vec<Option<Sampled>>) {
        self.commit_seqs(r, plan.into_iter().zip(sampled));
        self.end_step(r, None);
    }

    /// Commits some of replica `r`'s planned sequences: their computed
    /// tokens, the samplers given back, tokens streamed, requests finished.
    /// A step's sequences may be committed over several lock sections (the
    /// worker does, [`crate::worker`]); each sequence's commit is whole, and
    /// the step's programs stay in flight until [`Core::end_step`].
    pub fn commit_seqs(
        &mut self,
        r: usize,
        seqs: impl IntoIterator<Item = (SeqPlan, Option<Sampled>)>,
    ) {
        for (s, out) in seqs {
            let p = s.program;
            let committed = match &self.steps[r] {
                Some(step) => step.commit(&mut self.replicas, p, &s.new_tokens),
                None => Err(StepError::NotOpen(r)),
            };
            let Some(req) = self.requests.get_mut(&p) else {
                continue;
            };
            if req.id != s.request {
                continue;
            }
            if let Err(e) = committed {
                // Its slots went away under the step (nothing should do
                // that: releases and pauses wait for the batch). Its sampler
                // cannot be trusted to match the KV any more, and without
                // one the request would wait for a token forever: end it.
                error!(program = %p, replica = r, error = %e, "commit of a planned sequence failed; ending its request");
                self.finish(p, FinishReason::Error);
                continue;
            }
            if s.sampler.is_some() {
                req.sampler = s.sampler;
            }
            if let (Some(rows), Some(lp)) = (s.prompt, req.prompt_lp.as_mut()) {
                lp.absorb(rows, s.num_cached, s.new_tokens.len(), req.prompt_len);
            }
            let Some(out) = out else { continue };
            let Some(output) = out.output else {
                self.finish(p, out.finish.unwrap_or(FinishReason::Error));
                continue;
            };
            req.tokens.push(output.token_id);
            self.counters.generation_tokens += 1;
            let mut prompt_logprobs = None;
            if req.first_token.is_none() {
                prompt_logprobs = req
                    .prompt_lp
                    .as_mut()
                    .map(|lp| std::mem::take(&mut lp.entries));
                let now = Instant::now();
                req.first_token = Some(now);
                self.counters
                    .ttft_s
                    .observe((now - req.arrived).as_secs_f64());
            }
            if req.tx.is_closed() {
                // The caller went away: nobody reads the token.
                self.finish(p, FinishReason::Cancelled);
                continue;
            }
            self.outbox.push(
                &req.tx,
                Event::Token(crate::TokenEvent {
                    token_id: output.token_id,
                    logprob: output.logprob,
                    top: output.top,
                    stop_token: output.stop_token,
                    prompt_logprobs,
                }),
            );
            if let Some(f) = out.finish {
                self.finish(p, f);
            }
        }
    }

    /// The end of replica `r`'s step, whose forward and sampling took
    /// `seconds`: its programs leave the forward, releases that waited for
    /// it are carried out, and the step is finished.
    pub fn end_step(&mut self, r: usize, seconds: Option<f64>) {
        let step = self.steps[r].take();
        let pending: Vec<ProgramId> = self.replicas.programs().marked_for_release().collect();
        for p in pending {
            self.reap(p);
        }
        match step {
            Some(step) => self.close(step, seconds),
            None => protocol_bug(r, &StepError::NotOpen(r)),
        }
    }

    /// The model failed on this step: the step is aborted (its batch
    /// paused) and its requests end with an error rather than retry a
    /// batch that may fail again; the engine keeps serving the rest.
    pub fn abort_step(&mut self, r: usize, plan: Vec<SeqPlan>) {
        let aborted = match self.steps[r].take() {
            Some(step) => step.abort(&mut self.replicas).map(drop),
            None => Err(StepError::NotOpen(r)),
        };
        if let Err(e) = aborted {
            protocol_bug(r, &e);
        }
        for s in plan {
            self.finish(s.program, FinishReason::Error);
        }
    }
}

/// A step used outside its protocol, or the KV invariants broken (checked
/// in debug builds only): a bug in the engine, not in a request. Debug
/// builds stop on it; a release build logs it and serves on.
fn protocol_bug(r: usize, e: &StepError) {
    error!(replica = r, error = %e, "engine step protocol violated");
    if cfg!(debug_assertions) {
        panic!("replica {r}: {e}");
    }
}
