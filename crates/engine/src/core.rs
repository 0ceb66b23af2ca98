//! The engine's shared state — every replica's block bookkeeping, the policy
//! and the program table — and the operations on it. Workers call in here
//! under one mutex, for microseconds per step; nothing here touches tensors.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use agentd_kv::{KvCache, ProgramId};
use agentd_models::SequenceSampler;
use agentd_scheduler::{Policy, Replicas, Route};
use tokio::sync::mpsc::UnboundedSender;
use tracing::debug;

use crate::metrics::Counters;
use crate::{
    EndReason, EngineConfig, EngineError, Event, FinishReason, GenerateRequest, ProgramEnded,
};

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
    pub sampler: SequenceSampler,
    pub tx: UnboundedSender<Event>,
    pub signals: Arc<Signals>,
    /// Prompt tokens reused when it first started (reported in usage).
    pub cached_tokens: Option<usize>,
    /// Longest prefix of `tokens` ever computed, to count recomputation.
    pub max_computed: usize,
    pub arrived: Instant,
    pub first_token: Option<Instant>,
    pub final_request: bool,
}

impl Req {
    fn is_cancelled(&self) -> bool {
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
    /// Replica whose cache holds the program's blocks (kept while paused).
    pub home: Option<usize>,
    /// Release once nothing of it is in a batch (release call, final flag,
    /// one-off program).
    pub release_pending: bool,
    /// Why it is pending release (announced once it is reaped).
    pub end_reason: Option<EndReason>,
    pub steps: u64,
    /// The program that spawned it (`GenerateRequest::parent_program`).
    pub parent_program: Option<String>,
}

/// A sequence planned into a step.
pub(crate) struct SeqPlan {
    pub program: ProgramId,
    pub new_tokens: Vec<u32>,
    pub num_cached: usize,
    pub block_table: Vec<u32>,
    pub wants_logits: bool,
}

pub(crate) struct Core {
    pub cfg: EngineConfig,
    pub kv: Vec<KvCache>,
    pub policy: Box<dyn Policy>,
    pub names: HashMap<String, ProgramId>,
    pub programs: HashMap<ProgramId, Prog>,
    /// Programs whose current request runs on each replica, in start order.
    pub running: Vec<Vec<ProgramId>>,
    /// Programs inside each replica's model forward right now.
    pub in_flight: Vec<HashSet<ProgramId>>,
    pub counters: Counters,
    pub eos: Vec<u32>,
    pub max_model_len: usize,
    pub vocab_size: usize,
    pub started: Instant,
    pub shutdown: bool,
    /// Subscribers to program terminations. Unbounded so that announcing
    /// never blocks a worker under the lock and no end is ever dropped.
    pub ended_subscribers: Vec<UnboundedSender<ProgramEnded>>,
    pub(crate) next_program: u64,
}

impl Core {
    pub fn new(cfg: EngineConfig, eos: Vec<u32>, max_model_len: usize, vocab_size: usize) -> Self {
        let n = cfg.replicas.max(1);
        Self {
            kv: (0..n)
                .map(|_| KvCache::new(cfg.num_blocks, cfg.block_size, cfg.cache_salt))
                .collect(),
            policy: agentd_scheduler::build_policy(&cfg.scheduler, n),
            names: HashMap::new(),
            programs: HashMap::new(),
            running: vec![Vec::new(); n],
            in_flight: vec![HashSet::new(); n],
            counters: Counters::default(),
            eos,
            max_model_len,
            vocab_size,
            started: Instant::now(),
            shutdown: false,
            ended_subscribers: Vec::new(),
            next_program: 1,
            cfg,
        }
    }

    pub fn now(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Requests not running: queued in the policy or behind their program's
    /// current request.
    pub fn num_waiting(&self) -> usize {
        self.policy.num_waiting()
    }

    pub fn num_running(&self) -> usize {
        self.running.iter().map(Vec::len).sum()
    }

    /// Validates and enqueues a request. Returns the replicas to wake.
    pub fn submit(
        &mut self,
        req: GenerateRequest,
        tx: UnboundedSender<Event>,
        signals: Arc<Signals>,
    ) -> Result<(), EngineError> {
        if self.shutdown {
            return Err(EngineError::ShuttingDown);
        }
        self.validate(&req)?;
        let waiting = self.num_waiting();
        if waiting >= self.cfg.max_waiting {
            return Err(EngineError::Overloaded {
                waiting,
                limit: self.cfg.max_waiting,
            });
        }
        let sampler = SequenceSampler::new(req.sampling.clone(), &req.prompt)
            .map_err(|e| EngineError::Invalid(e.to_string()))?;
        let p = match &req.program {
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
        self.counters.prompt_tokens += req.prompt.len() as u64;
        let r = Req {
            prompt_len: req.prompt.len(),
            tokens: req.prompt,
            sampler,
            tx,
            signals,
            cached_tokens: None,
            max_computed: 0,
            arrived: Instant::now(),
            first_token: None,
            final_request: req.final_request || req.program.is_none(),
        };
        let Some(prog) = self.programs.get_mut(&p) else {
            return Err(EngineError::Invalid("program vanished".into()));
        };
        // A new request revives a program whose release was still pending.
        prog.release_pending = false;
        prog.end_reason = None;
        if let Some(parent) = req.parent_program {
            prog.parent_program = Some(parent);
        }
        if prog.current.is_none() {
            prog.current = Some(r);
            self.route(p);
            return Ok(());
        }
        // The program is busy: run the request now as a sibling rather than
        // after the current one (DESIGN §2: concurrent requests of one
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
        Ok(())
    }

    fn validate(&self, req: &GenerateRequest) -> Result<(), EngineError> {
        if req.prompt.is_empty() {
            return Err(EngineError::Invalid("the prompt is empty".into()));
        }
        if let Some(&t) = req.prompt.iter().find(|&&t| t as usize >= self.vocab_size) {
            return Err(EngineError::Invalid(format!(
                "token id {t} is outside the vocabulary (size {})",
                self.vocab_size
            )));
        }
        req.sampling
            .validate()
            .map_err(|e| EngineError::Invalid(e.to_string()))?;
        let max_tokens = req.sampling.max_tokens;
        if req.prompt.len() + max_tokens > self.max_model_len {
            return Err(EngineError::ContextTooLong {
                prompt: req.prompt.len(),
                max_tokens,
                max: self.max_model_len,
            });
        }
        let needed = (req.prompt.len() + max_tokens).div_ceil(self.cfg.block_size);
        if needed > self.cfg.num_blocks {
            return Err(EngineError::TooLargeForCache {
                needed,
                capacity: self.cfg.num_blocks,
            });
        }
        Ok(())
    }

    /// Hands `p`'s current request to the policy; starts it if the program is
    /// active somewhere.
    fn route(&mut self, p: ProgramId) {
        let now = self.now();
        let Some(len) = self
            .programs
            .get(&p)
            .and_then(|q| q.current.as_ref())
            .map(|r| r.tokens.len())
        else {
            return;
        };
        if let Route::Run { replica } = self.policy.on_request(p, now, len) {
            self.start_on(p, replica);
        }
    }

    /// Starts (or restores) `p`'s current request on replica `r`.
    pub fn start_on(&mut self, p: ProgramId, r: usize) {
        let Some(prog) = self.programs.get_mut(&p) else {
            return;
        };
        if let Some(h) = prog.home {
            if h != r {
                self.kv[h].release(p);
            }
        }
        prog.home = Some(r);
        let Some(req) = prog.current.as_mut() else {
            return;
        };
        let m = self.kv[r].match_prefix(p, &req.tokens);
        let recomputed = req.max_computed.saturating_sub(m.cached_tokens);
        self.counters.recomputed_tokens += recomputed as u64;
        if req.cached_tokens.is_none() {
            let cached = m.cached_tokens.min(req.prompt_len);
            req.cached_tokens = Some(cached);
            req.signals.cached_tokens.store(cached, Ordering::Relaxed);
        }
        debug!(program = %p, replica = r, cached = m.cached_tokens, recomputed, "start");
        if !self.running[r].contains(&p) {
            self.running[r].push(p);
        }
    }

    /// Drops `p`'s KV references on `r`; its request (if any) stays current
    /// and waits in the policy's queue with its generated tokens kept.
    fn pause_on(&mut self, p: ProgramId, r: usize) {
        self.running[r].retain(|q| *q != p);
        self.kv[r].pause(p);
    }

    /// Step bookkeeping before the forward of replica `r`: leases,
    /// cancellations, the policy's decision, and the batch plan.
    pub fn plan(&mut self, r: usize) -> Vec<SeqPlan> {
        let now = self.now();
        for p in self.policy.expire(now) {
            if let Some(prog) = self.programs.get_mut(&p) {
                prog.release_pending = true;
                prog.end_reason = Some(EndReason::LeaseExpired);
            }
            self.reap(p);
        }
        let cancelled: Vec<ProgramId> = self.running[r]
            .iter()
            .copied()
            .filter(|p| {
                self.programs
                    .get(p)
                    .and_then(|q| q.current.as_ref())
                    .is_none_or(Req::is_cancelled)
            })
            .collect();
        for p in cancelled {
            self.finish(p, FinishReason::Cancelled);
        }
        let decision = self.policy.schedule(r, now, &Replicas(&self.kv));
        for p in decision.pause {
            self.pause_on(p, r);
        }
        for (p, m) in decision.admit {
            self.start_on(p, m);
        }
        self.build_batch(r, now)
    }

    fn build_batch(&mut self, r: usize, now: f64) -> Vec<SeqPlan> {
        let decoding = |core: &Core, p: ProgramId| {
            core.programs
                .get(&p)
                .and_then(|q| q.current.as_ref())
                .is_some_and(|req| {
                    req.tokens.len() > req.prompt_len
                        && req.tokens.len() == core.kv[r].num_computed(p) + 1
                })
        };
        let mut order: Vec<(bool, ProgramId)> = self.running[r]
            .iter()
            .map(|&p| (!decoding(self, p), p))
            .collect();
        order.sort_by_key(|&(prefill, _)| prefill);
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut plan = Vec::new();
        for (_, p) in order {
            if budget == 0 {
                break;
            }
            if !self.running[r].contains(&p) {
                continue;
            }
            let Some(len) = self
                .programs
                .get(&p)
                .and_then(|q| q.current.as_ref())
                .map(|q| q.tokens.len())
            else {
                continue;
            };
            let computed = self.kv[r].num_computed(p);
            let n = (len - computed).min(budget);
            if n == 0 || !self.reserve(r, p, n, now) {
                continue;
            }
            let Some(req) = self.programs.get(&p).and_then(|q| q.current.as_ref()) else {
                continue;
            };
            plan.push(SeqPlan {
                program: p,
                new_tokens: req.tokens[computed..computed + n].to_vec(),
                num_cached: computed,
                block_table: self.kv[r].block_table(p).iter().map(|b| b.0).collect(),
                wants_logits: computed + n == len,
            });
            budget -= n;
        }
        // A victim paused after being planned must not run.
        plan.retain(|s| self.running[r].contains(&s.program));
        self.in_flight[r] = plan.iter().map(|s| s.program).collect();
        plan
    }

    /// Allocates slots for `n` tokens of `p`, pausing by the policy's order
    /// while blocks are short. False when `p` itself had to be paused.
    fn reserve(&mut self, r: usize, p: ProgramId, n: usize, now: f64) -> bool {
        loop {
            if self.kv[r].allocate_slots(p, n).is_ok() {
                return true;
            }
            match self.policy.preempt(r, now, &Replicas(&self.kv), p) {
                None => return false,
                Some(v) => {
                    debug!(replica = r, victim = %v, "blocks exhausted: pause");
                    self.pause_on(v, r);
                    if v == p {
                        return false;
                    }
                }
            }
        }
    }

    /// Step bookkeeping after the forward: commit the computed tokens, sample
    /// where logits were produced, stream, finish.
    pub fn commit(&mut self, r: usize, plan: &[SeqPlan], logits: &[Vec<f32>]) {
        let mut rows = logits.iter();
        for s in plan {
            let row = if s.wants_logits { rows.next() } else { None };
            let p = s.program;
            if self.kv[r].commit(p, &s.new_tokens).is_err() {
                continue; // released meanwhile
            }
            let computed = self.kv[r].num_computed(p);
            let eos = self.eos.clone();
            let Some(req) = self.programs.get_mut(&p).and_then(|q| q.current.as_mut()) else {
                continue;
            };
            req.max_computed = req.max_computed.max(computed);
            let Some(row) = row else { continue };
            let out = match req.sampler.sample(row) {
                Ok(o) => o,
                Err(e) => {
                    tracing::error!(program = %p, error = %e, "sampling failed");
                    self.finish(p, FinishReason::Cancelled);
                    continue;
                }
            };
            req.tokens.push(out.token_id);
            self.counters.generation_tokens += 1;
            if req.first_token.is_none() {
                let now = Instant::now();
                req.first_token = Some(now);
                self.counters
                    .ttft_s
                    .observe((now - req.arrived).as_secs_f64());
            }
            let finish = req.sampler.finish_reason(out.token_id, &eos);
            let sent = req.tx.send(Event::Token(crate::TokenEvent {
                token_id: out.token_id,
                logprob: out.logprob,
                top: out.top,
            }));
            match (finish, sent) {
                (_, Err(_)) => self.finish(p, FinishReason::Cancelled),
                (Some(f), Ok(())) => self.finish(
                    p,
                    match f {
                        agentd_models::sampling::FinishReason::Stop => FinishReason::Stop,
                        agentd_models::sampling::FinishReason::Length => FinishReason::Length,
                    },
                ),
                (None, Ok(())) => {}
            }
        }
        self.in_flight[r].clear();
        let pending: Vec<ProgramId> = self
            .programs
            .iter()
            .filter(|(_, q)| q.release_pending)
            .map(|(p, _)| *p)
            .collect();
        for p in pending {
            self.reap(p);
        }
    }

    /// The model failed on this step: end its requests rather than retry a
    /// batch that may fail again, and keep serving the rest.
    pub fn abort_step(&mut self, r: usize, plan: &[SeqPlan]) {
        self.in_flight[r].clear();
        for s in plan {
            self.kv[r].pause(s.program);
            self.finish(s.program, FinishReason::Cancelled);
        }
    }
}
