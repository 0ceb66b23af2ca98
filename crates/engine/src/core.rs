//! The engine's shared state — the scheduling core ([`ReplicaSet`]: every
//! replica's block bookkeeping, running sets and the policy, the same code the
//! simulator runs) and the engine's requests — and the operations on it.
//! Workers call in here under one mutex, for bookkeeping only: no tensors, no
//! sampling (the worker samples outside the lock). A replica's step is in
//! `step.rs`; a program's life (requests ending, releases) in `lifecycle.rs`.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use agentd_kv::{BlockCopy, ProgramId};
use agentd_runtime::{SampleOutput, SequenceSampler};
use agentd_scheduler::{build_policy, Contexts, GroupId, ReplicaSet, Step, ToolId};
use tokio::sync::mpsc::UnboundedSender;
use tracing::debug;
use tracing::Span;

use crate::inbox::{Released, Submitted};
use crate::metrics::Counters;
use crate::outbox::Outbox;
use crate::prompt_lp::{PromptLp, PromptRows};
use crate::trace::{Cause, Mark};
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
pub(crate) struct Requests<'a>(pub &'a HashMap<ProgramId, Req>);

impl Contexts for Requests<'_> {
    fn context(&self, p: ProgramId) -> Option<&[u32]> {
        Some(&self.0.get(&p)?.tokens)
    }
    fn generated(&self, p: ProgramId) -> usize {
        self.0.get(&p).map_or(0, |r| r.tokens.len() - r.prompt_len)
    }
    fn cache_salt(&self, p: ProgramId) -> u64 {
        self.0.get(&p).map_or(0, |r| r.cache_salt)
    }
    fn group(&self, p: ProgramId) -> Option<(GroupId, Option<usize>)> {
        self.0.get(&p)?.group
    }
    fn full_prefill(&self, p: ProgramId) -> bool {
        self.0
            .get(&p)
            .and_then(|r| r.prompt_lp.as_ref())
            .is_some_and(|l| !l.done)
    }
}

pub(crate) struct Core {
    pub cfg: EngineConfig,
    /// The scheduling core: KV caches, running sets, homes, the policy,
    /// and the program table (each program's one record: its scheduling
    /// state, name, siblings and release, `agentd_scheduler::Life`; names
    /// become ids there, `ProgramTable::open`).
    pub replicas: ReplicaSet,
    /// The request each program is serving, or that waits for the
    /// program's restore: only programs with one in flight have an entry.
    pub requests: HashMap<ProgramId, Req>,
    /// Each replica's open step, from its plan to its end (the programs
    /// in its batch are inside the model forward: a release waits for them).
    pub(crate) steps: Vec<Option<Step>>,
    pub counters: Counters,
    pub started: Instant,
    pub shutdown: bool,
    /// Subscribers to program terminations. Unbounded so that announcing
    /// never blocks a worker under the lock and no end is ever dropped.
    pub ended_subscribers: Vec<UnboundedSender<ProgramEnded>>,
    /// Events for callers' streams, sent once the lock is released.
    pub outbox: Outbox,
    /// A step commit's events, held back until the end of the next
    /// section — whichever thread ends it — and delivered before that
    /// section's own ([`crate::worker::Held::end`]): a stream's events
    /// keep their order across sections.
    pub(crate) deferred: Outbox,
    /// Pause, weight swap: trainer commands the workers carry out at step
    /// boundaries ([`crate::control`]).
    pub(crate) control: crate::control::Control,
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
            .with_host_tier(cfg.host_blocks)
            .with_step_balance(&cfg.scheduler),
            requests: HashMap::new(),
            steps: (0..n).map(|_| None).collect(),
            counters: Counters::default(),
            started: Instant::now(),
            shutdown: false,
            ended_subscribers: Vec::new(),
            outbox: Outbox::default(),
            deferred: Outbox::default(),
            control: Default::default(),
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

    fn accept_one(&mut self, mut sub: Submitted) {
        self.counters.prompt_tokens += sub.prompt.len() as u64;
        if sub.released != Released::No {
            self.finish_released_on_arrival(sub);
            return;
        }
        let known = (sub.program.as_deref()).and_then(|n| self.replicas.programs().id_of(n));
        let p = match known {
            Some(p) => p,
            None => self.new_program(sub.program.clone()),
        };
        let parent = sub.parent_program.take();
        let r = self.request_of(sub);
        let Some(life) = self.replicas.programs_mut().life_mut(p) else {
            return;
        };
        // A new request revives a program whose release was still pending.
        life.release = None;
        if let Some(parent) = parent {
            life.parent_program = Some(parent);
        }
        if let Entry::Vacant(slot) = self.requests.entry(p) {
            slot.insert(r);
            self.route(p);
            return;
        }
        self.accept_sibling(p, r);
    }

    /// A submission released before any worker saw it: what a release
    /// right after it reached the engine would have done.
    fn finish_released_on_arrival(&mut self, sub: Submitted) {
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
    }

    /// The engine's request record of a submission, with the next id.
    fn request_of(&mut self, sub: Submitted) -> Req {
        let id = self.next_request;
        self.next_request += 1;
        let prompt_lp = sub.sampler.params().prompt_logprobs.map(PromptLp::new);
        Req {
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
        }
    }

    /// `p` is busy: `r` runs now as a sibling rather than after the
    /// current request (docs/design.md §2: concurrent requests of one
    /// program are allowed). Its own block table starts from the cached
    /// prefix; the program's table continues from its main line.
    fn accept_sibling(&mut self, p: ProgramId, r: Req) {
        let s = self.new_program(None);
        let table = self.replicas.programs_mut();
        if let Some(life) = table.life_mut(p) {
            life.children.push(s);
        }
        if let Some(sib) = table.life_mut(s) {
            sib.parent = Some(p);
            sib.release_parent = r.final_request;
        }
        let r = Req {
            final_request: true,
            ..r
        };
        self.requests.insert(s, r);
        debug!(program = %p, sibling = %s, "parallel request runs as a sibling");
        self.route(s);
    }

    /// Hands `p`'s current request to the scheduling core; it starts at
    /// once if the program is active somewhere.
    fn route(&mut self, p: ProgramId) {
        let now = self.now();
        let yields = self.replicas.stats().pauses.of(Cause::Yielded);
        match self.replicas.on_request(p, now, &Requests(&self.requests)) {
            Some(st) => self.note_start(st),
            None => {
                // Resident, it yielded its place to older queued programs
                // (the core applied that pause): its restore is traced as one.
                if self.replicas.stats().pauses.of(Cause::Yielded) > yields {
                    self.note_pause(p, Cause::Yielded);
                }
                let waiting = self.num_waiting();
                if let Some(req) = self.requests.get(&p) {
                    self.outbox.mark(&req.span, Mark::Queued { waiting });
                }
            }
        }
    }

    /// Records what a (re)start reused: the prompt tokens served from the
    /// cache when the request first started (its usage); traces the
    /// admission, or the restore when the program had been paused.
    pub(crate) fn note_start(&mut self, st: agentd_scheduler::Started) {
        let now = self.now();
        let Some(life) = self.replicas.programs_mut().life_mut(st.program) else {
            return;
        };
        let paused = life.paused.take();
        let Some(req) = self.requests.get_mut(&st.program) else {
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
                paused_s: now - since,
            };
            self.outbox.mark(&req.span, restored);
        }
    }

    /// `p` was paused (its KV released) for `cause`: traced on its request
    /// if one is in flight, and as the cause of its next start's restore.
    pub(crate) fn note_pause(&mut self, p: ProgramId, cause: Cause) {
        let now = self.now();
        let Some(life) = self.replicas.programs_mut().life_mut(p) else {
            return;
        };
        life.paused.get_or_insert((cause, now));
        if let Some(req) = self.requests.get(&p) {
            self.outbox.mark(&req.span, Mark::Paused { cause });
        }
    }
}

#[cfg(test)]
mod tests;
