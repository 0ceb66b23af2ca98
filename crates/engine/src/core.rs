//! The engine's shared state — the scheduling core ([`ReplicaSet`]: every
//! replica's block bookkeeping, running sets and the policy, the same code the
//! simulator runs) and the engine's requests — and the operations on it.
//! Workers call in here under one mutex, for bookkeeping only: no tensors, no
//! sampling (the worker samples outside the lock).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use agentd_kv::{BlockCopy, ProgramId};
use agentd_models::{SampleOutput, SequenceSampler};
use agentd_scheduler::{build_policy, Contexts, GroupId, ReplicaSet, Step, StepError, ToolId};
use tokio::sync::mpsc::UnboundedSender;
use tracing::debug;
use tracing::error;
use tracing::Span;

use crate::inbox::{Released, Submitted};
use crate::metrics::Counters;
use crate::outbox::Outbox;
use crate::prompt_lp::{PromptLp, PromptRows};
use crate::trace::{self, Cause, Mark};
use crate::{EndReason, EngineConfig, Event, FinishReason, ProgramEnded, Usage};

/// State a request shares with its caller's [`crate::RequestStream`].
#[derive(Debug, Default)]
pub(crate) struct Signals {
    /// Set by the caller to cancel (or by dropping the stream).
    pub cancelled: AtomicBool,
    /// Prompt tokens reused when the request first started, readable before
    /// the final usage arrives (a caller that stops early on a stop string
    /// still reports it).
    pub cached_tokens: AtomicUsize,
}

/// One request of a program.
pub(crate) struct Req {
    /// Prompt plus the tokens generated so far: what the KV must hold.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Taken by the worker while the step that samples for this request runs
    /// outside the lock; put back at commit.
    pub sampler: Option<SequenceSampler>,
    /// Unique per request: a sampler comes back only to the request it left.
    pub id: u64,
    pub tx: UnboundedSender<Event>,
    pub signals: Arc<Signals>,
    /// Prompt tokens reused when it first started (reported in usage).
    pub cached_tokens: Option<usize>,
    pub arrived: Instant,
    pub first_token: Option<Instant>,
    pub final_request: bool,
    /// `GenerateRequest::cache_salt`.
    pub cache_salt: u64,
    /// `GenerateRequest::group`, hashed.
    pub group: Option<(GroupId, Option<usize>)>,
    /// `GenerateRequest::tool`, hashed: noted when the request finishes.
    pub tool: Option<ToolId>,
    /// The prompt's logprobs, when the request asked for them
    /// (`SamplingParams::prompt_logprobs`).
    pub prompt_lp: Option<PromptLp>,
    /// Its `request` span ([`crate::trace`]).
    pub span: Span,
}

impl Req {
    pub(crate) fn is_cancelled(&self) -> bool {
        self.signals.cancelled.load(Ordering::Relaxed) || self.tx.is_closed()
    }
}

/// A program as the engine tracks it.
pub(crate) struct Prog {
    pub name: Option<String>,
    /// The request being served (or waiting for the program's restore).
    pub current: Option<Req>,
    /// Sibling sequences: requests that arrived while `current` was busy
    /// (parallel tool calls, sub-agents sharing a session). Each runs at once
    /// as a one-off program of its own, sharing this program's prefix through
    /// the prefix cache; releasing this program cancels them.
    pub children: Vec<ProgramId>,
    /// For a sibling: the program it belongs to.
    pub parent: Option<ProgramId>,
    /// For a sibling whose request carried the final flag: release the
    /// parent once it ends.
    pub release_parent: bool,
    /// Release once nothing of it is in a batch (release call, final flag,
    /// one-off program).
    pub release_pending: bool,
    /// Why it is pending release (announced once it is reaped).
    pub end_reason: Option<EndReason>,
    pub steps: u64,
    /// The program that spawned it (`GenerateRequest::parent_program`).
    pub parent_program: Option<String>,
    /// Paused (why, since when) and not started again: its next start is
    /// a restore ([`crate::trace`]).
    pub paused: Option<(Cause, Instant)>,
}

/// A sequence planned into a step.
pub(crate) struct SeqPlan {
    pub program: ProgramId,
    pub new_tokens: Vec<u32>,
    pub num_cached: usize,
    pub block_table: Vec<u32>,
    /// The request's sampler, lent for the step when it wants logits.
    pub sampler: Option<SequenceSampler>,
    pub request: u64,
    /// Set when this chunk computes prompt positions whose logprobs the
    /// request wants: every new token's logits are then computed.
    pub prompt: Option<PromptRows>,
    /// A decode step (one token), not a prefill chunk.
    pub decoding: bool,
    /// The request's span, which the step's span follows from (an id, not
    /// a handle: the request cannot end while its step runs, its program
    /// being in flight).
    pub span: Option<tracing::Id>,
}

impl SeqPlan {
    pub fn wants_logits(&self) -> bool {
        self.sampler.is_some()
    }
}

/// A step's plan: the batch, and whether planning it changed anything
/// readers can see (an idle re-plan changes nothing).
pub(crate) struct StepBatch {
    pub seqs: Vec<SeqPlan>,
    /// Copies between the KV tiers the runner carries out before the
    /// forward (decided by this plan or by routing since the last one).
    pub copies: Vec<BlockCopy>,
    pub changed: bool,
}

/// What the worker produced for one planned sequence outside the lock.
pub(crate) struct Sampled {
    /// `None` when sampling failed (the request ends, `finish` says how).
    pub output: Option<SampleOutput>,
    pub finish: Option<FinishReason>,
}

/// The engine's requests as the scheduling core sees them.
pub(crate) struct Requests<'a>(pub &'a HashMap<ProgramId, Prog>);

impl Contexts for Requests<'_> {
    fn context(&self, p: ProgramId) -> Option<&[u32]> {
        let req = self.0.get(&p)?.current.as_ref()?;
        Some(&req.tokens)
    }
    fn generated(&self, p: ProgramId) -> usize {
        self.0
            .get(&p)
            .and_then(|q| q.current.as_ref())
            .map_or(0, |r| r.tokens.len() - r.prompt_len)
    }
    fn cache_salt(&self, p: ProgramId) -> u64 {
        self.0
            .get(&p)
            .and_then(|q| q.current.as_ref())
            .map_or(0, |r| r.cache_salt)
    }
    fn group(&self, p: ProgramId) -> Option<(GroupId, Option<usize>)> {
        self.0.get(&p)?.current.as_ref()?.group
    }
    fn full_prefill(&self, p: ProgramId) -> bool {
        self.0
            .get(&p)
            .and_then(|q| q.current.as_ref())
            .and_then(|r| r.prompt_lp.as_ref())
            .is_some_and(|l| !l.done)
    }
}

pub(crate) struct Core {
    pub cfg: EngineConfig,
    /// The scheduling core: KV caches, running sets, homes, the policy.
    pub replicas: ReplicaSet,
    pub names: HashMap<String, ProgramId>,
    pub programs: HashMap<ProgramId, Prog>,
    /// Each replica's open step, from its plan to its end (the programs
    /// in its batch are inside the model forward: a release waits for them).
    steps: Vec<Option<Step>>,
    pub counters: Counters,
    pub started: Instant,
    pub shutdown: bool,
    /// Subscribers to program terminations. Unbounded so that announcing
    /// never blocks a worker under the lock and no end is ever dropped.
    pub ended_subscribers: Vec<UnboundedSender<ProgramEnded>>,
    /// Events for callers' streams, sent once the lock is released.
    pub outbox: Outbox,
    /// Pause, weight swap: trainer commands the workers carry out at step
    /// boundaries ([`crate::control`]).
    pub(crate) control: crate::control::Control,
    pub(crate) next_program: u64,
    next_request: u64,
}

impl Core {
    pub fn new(cfg: EngineConfig) -> Self {
        let n = cfg.replicas.max(1);
        Self {
            replicas: ReplicaSet::new(
                build_policy(&cfg.scheduler, n),
                n,
                cfg.num_blocks,
                cfg.block_size,
                cfg.cache_salt,
                cfg!(debug_assertions),
            )
            .with_host_tier(cfg.host_blocks),
            names: HashMap::new(),
            programs: HashMap::new(),
            steps: (0..n).map(|_| None).collect(),
            counters: Counters::default(),
            started: Instant::now(),
            shutdown: false,
            ended_subscribers: Vec::new(),
            outbox: Outbox::default(),
            control: Default::default(),
            next_program: 1,
            next_request: 1,
            cfg,
        }
    }

    pub fn now(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Requests not running: queued in the policy or behind their program's
    /// current request.
    pub fn num_waiting(&self) -> usize {
        use agentd_scheduler::Policy;
        self.replicas.policy.num_waiting()
    }

    pub fn num_running(&self) -> usize {
        self.replicas.num_running()
    }

    /// Takes in the submissions drained from the inbox, in arrival order:
    /// each becomes its program's current request (creating the program) or
    /// a sibling of it, and is routed — started at once, with its prefix
    /// matched, when its program is active on a replica.
    pub fn accept(&mut self, submitted: Vec<Submitted>) {
        for s in submitted {
            self.accept_one(s);
        }
    }

    fn accept_one(&mut self, sub: Submitted) {
        self.counters.prompt_tokens += sub.prompt.len() as u64;
        if sub.released != Released::No {
            // Released before any worker saw it: what a release right after
            // it reached the engine would have done.
            let usage = Usage {
                prompt_tokens: sub.prompt.len(),
                ..Usage::default()
            };
            let reason = FinishReason::Cancelled;
            self.outbox.push(&sub.tx, Event::Finished { reason, usage });
            self.outbox
                .mark_owned(sub.span, Mark::Finished { reason, usage });
            if let (Released::CancelAndAnnounce, Some(name)) = (sub.released, sub.program) {
                self.announce_end(ProgramEnded {
                    id: name,
                    reason: EndReason::Released,
                    at: Instant::now(),
                });
            }
            return;
        }
        let p = match &sub.program {
            Some(name) => match self.names.get(name) {
                Some(&p) => p,
                None => {
                    let p = self.new_program(Some(name.clone()));
                    self.names.insert(name.clone(), p);
                    p
                }
            },
            None => self.new_program(None),
        };
        let id = self.next_request;
        self.next_request += 1;
        let prompt_lp = sub.sampler.params().prompt_logprobs.map(PromptLp::new);
        let r = Req {
            prompt_len: sub.prompt.len(),
            tokens: sub.prompt,
            sampler: Some(sub.sampler),
            id,
            tx: sub.tx,
            signals: sub.signals,
            cached_tokens: None,
            arrived: sub.arrived,
            first_token: None,
            final_request: sub.final_request || sub.program.is_none(),
            cache_salt: sub.cache_salt,
            group: sub.group,
            tool: sub.tool,
            prompt_lp,
            span: sub.span,
        };
        let Some(prog) = self.programs.get_mut(&p) else {
            return;
        };
        // A new request revives a program whose release was still pending.
        prog.release_pending = false;
        prog.end_reason = None;
        if let Some(parent) = sub.parent_program {
            prog.parent_program = Some(parent);
        }
        if prog.current.is_none() {
            prog.current = Some(r);
            self.route(p);
            return;
        }
        // The program is busy: run the request now as a sibling rather than
        // after the current one (docs/design.md §2: concurrent requests of one
        // program are allowed). Its own block table starts from the cached
        // prefix; the program's table continues from its main line.
        let s = self.new_program(None);
        if let Some(q) = self.programs.get_mut(&p) {
            q.children.push(s);
        }
        if let Some(sib) = self.programs.get_mut(&s) {
            sib.parent = Some(p);
            sib.release_parent = r.final_request;
            sib.current = Some(Req {
                final_request: true,
                ..r
            });
        }
        debug!(program = %p, sibling = %s, "parallel request runs as a sibling");
        self.route(s);
    }

    /// Hands `p`'s current request to the scheduling core; it starts at
    /// once if the program is active somewhere.
    fn route(&mut self, p: ProgramId) {
        let now = self.now();
        match self.replicas.on_request(p, now, &Requests(&self.programs)) {
            Some(st) => self.note_start(st),
            None => {
                let waiting = self.num_waiting();
                if let Some(req) = self.programs.get(&p).and_then(|q| q.current.as_ref()) {
                    self.outbox.mark(&req.span, Mark::Queued { waiting });
                }
            }
        }
    }

    /// Records what a (re)start reused: the prompt tokens served from the
    /// cache when the request first started (its usage); traces the
    /// admission, or the restore when the program had been paused.
    fn note_start(&mut self, st: agentd_scheduler::Started) {
        let Some(prog) = self.programs.get_mut(&st.program) else {
            return;
        };
        let paused = prog.paused.take();
        let Some(req) = prog.current.as_mut() else {
            return;
        };
        let (replica, cached_tokens) = (st.replica, st.matched.cached_tokens);
        if req.cached_tokens.is_none() {
            let cached = cached_tokens.min(req.prompt_len);
            req.cached_tokens = Some(cached);
            req.signals.cached_tokens.store(cached, Ordering::Relaxed);
            let queue_s = req.arrived.elapsed().as_secs_f64();
            self.counters.queue_wait_s.observe(queue_s);
            let admitted = Mark::Admitted {
                replica,
                cached_tokens: cached,
                queue_s,
            };
            self.outbox.mark(&req.span, admitted);
        }
        if let Some((cause, since)) = paused {
            let restored = Mark::Restored {
                replica,
                cached_tokens,
                cause,
                paused_s: since.elapsed().as_secs_f64(),
            };
            self.outbox.mark(&req.span, restored);
        }
    }

    /// `p` was paused (its KV released) for `cause`: traced on its request
    /// if one is in flight, and as the cause of its next start's restore.
    pub(crate) fn note_pause(&mut self, p: ProgramId, cause: Cause) {
        let Some(prog) = self.programs.get_mut(&p) else {
            return;
        };
        prog.paused.get_or_insert((cause, Instant::now()));
        if let Some(req) = &prog.current {
            self.outbox.mark(&req.span, Mark::Paused { cause });
        }
    }

    /// Step bookkeeping before the forward of replica `r`: cancellations,
    /// then its [`Step`] begun (leases, the policy's decision) and planned.
    /// A step with a batch stays open until [`Core::end_step`] or
    /// [`Core::abort_step`]; one without is finished here.
    pub fn plan(&mut self, r: usize) -> StepBatch {
        let now = self.now();
        let mut batch = StepBatch {
            seqs: Vec::new(),
            copies: Vec::new(),
            changed: self.finish_cancelled(r),
        };
        let before = agentd_scheduler::Policy::stats(&self.replicas.policy);
        let begun = self.replicas.begin_step(r, now, &Requests(&self.programs));
        let mut step = match begun {
            Ok(step) => step,
            Err(e) => {
                protocol_bug(r, &e);
                return batch;
            }
        };
        let sched = step.scheduled();
        batch.changed |= !(sched.expired.is_empty() && sched.decision.is_empty());
        if !sched.decision.pause.is_empty() {
            let after = agentd_scheduler::Policy::stats(&self.replicas.policy);
            let cause = trace::pause_cause(&before, &after);
            for &p in &sched.decision.pause {
                self.note_pause(p, cause);
            }
        }
        for &p in &sched.expired {
            if let Some(prog) = self.programs.get_mut(&p) {
                prog.release_pending = true;
                prog.end_reason = Some(EndReason::LeaseExpired);
            }
            self.reap(p);
        }
        for &st in &sched.started {
            self.note_start(st);
        }
        // An admitted request cancelled while it waited ends here, before
        // any step computes its prompt.
        batch.changed |= self.finish_cancelled(r);
        let budget = self.cfg.max_num_batched_tokens;
        let planned = step.plan(&mut self.replicas, budget, &Requests(&self.programs));
        let (plan, copies) = match planned {
            Ok(planned) => planned,
            Err(e) => {
                protocol_bug(r, &e);
                self.close(step);
                return batch;
            }
        };
        batch.changed |= !(plan.seqs.is_empty() && plan.preempted.is_empty());
        for &p in &plan.preempted {
            self.note_pause(p, trace::KV_EXHAUSTED);
        }
        batch.copies = copies;
        if plan.seqs.is_empty() {
            self.close(step);
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
            let Some(req) = self
                .programs
                .get_mut(&s.program)
                .and_then(|q| q.current.as_mut())
            else {
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

    /// Finishes `step` (its invariants checked in debug builds).
    fn close(&mut self, step: Step) {
        let r = step.replica();
        if let Err(e) = step.finish(&mut self.replicas) {
            protocol_bug(r, &e);
        }
    }

    /// Step bookkeeping after the forward and sampling, in one go:
    /// [`Core::commit_seqs`] then [`Core::end_step`].
    #[cfg(test)]
    pub fn commit(&mut self, r: usize, plan: Vec<SeqPlan>, sampled: Vec<Option<Sampled>>) {
        self.commit_seqs(r, plan.into_iter().zip(sampled));
        self.end_step(r);
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
            let Some(req) = self.programs.get_mut(&p).and_then(|q| q.current.as_mut()) else {
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

    /// The end of replica `r`'s step: its programs leave the forward,
    /// releases that waited for it are carried out, and the step is
    /// finished.
    pub fn end_step(&mut self, r: usize) {
        let step = self.steps[r].take();
        let pending: Vec<ProgramId> = self
            .programs
            .iter()
            .filter(|(_, q)| q.release_pending)
            .map(|(p, _)| *p)
            .collect();
        for p in pending {
            self.reap(p);
        }
        match step {
            Some(step) => self.close(step),
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Instant;

    use agentd_models::{SamplingParams, SequenceSampler};
    use tokio::sync::mpsc;

    use super::*;

    fn submitted(prompt: Vec<u32>) -> (Submitted, mpsc::UnboundedReceiver<Event>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let params = SamplingParams {
            max_tokens: 4,
            ..SamplingParams::greedy()
        };
        let sub = Submitted {
            program: None,
            sampler: SequenceSampler::new(params, &prompt).expect("valid"),
            prompt,
            final_request: false,
            parent_program: None,
            cache_salt: 0,
            group: None,
            tool: None,
            tx,
            signals: Arc::new(Signals::default()),
            arrived: Instant::now(),
            released: Released::No,
            span: Span::none(),
        };
        (sub, rx)
    }

    /// A planned sequence whose slots vanish before its commit (nothing in
    /// the engine does that today; the path must not hang the request): it
    /// ends with an error instead of waiting for a sampler that never comes
    /// back.
    #[test]
    fn a_failed_commit_ends_the_request_with_an_error() {
        let mut core = Core::new(EngineConfig {
            num_blocks: 16,
            ..EngineConfig::default()
        });
        let (sub, mut rx) = submitted((1..40).collect());
        core.accept(vec![sub]);
        let step = core.plan(0);
        assert_eq!(step.seqs.len(), 1, "the prompt is planned");
        assert!(step.seqs[0].wants_logits(), "its sampler is lent");
        let p = step.seqs[0].program;
        // The fault: the sequence loses its KV between plan and commit.
        core.replicas.pause_on(p, 0);
        core.commit(0, step.seqs, vec![None]);
        core.outbox.take().deliver();
        match rx.try_recv() {
            Ok(Event::Finished { reason, usage }) => {
                assert_eq!(reason, FinishReason::Error);
                assert_eq!(usage.prompt_tokens, 39);
            }
            other => panic!("expected the request to end, got {other:?}"),
        }
        assert_eq!(core.num_running(), 0);
        assert!(core.programs.is_empty(), "the one-off program is released");
    }
}
