//! The one core that applies the policy's decisions to the replicas' KV
//! caches — the same code for the engine, the simulator and the scheduler's
//! test harness, so that `agentd simulate` measures the engine's own
//! behaviour and a scheduling change is made once.
//!
//! It owns, per replica, the [`KvCache`] and the list of programs whose
//! request runs there; and the policy, which keeps the program table
//! (`program.rs`) where the core records, per program, its home replica and
//! the longest context it ever computed. Callers own the token contexts (the engine's
//! requests, the simulator's synthetic programs) and lend them through
//! [`Contexts`]. Nothing here reads a clock: `now` is passed in.
//!
//! A replica's step is a [`crate::Step`] (`step.rs`), opened by
//! [`ReplicaSet::begin_step`]: the one way the engine and the simulator
//! change the caches. The step's parts below ([`ReplicaSet::schedule`],
//! [`ReplicaSet::plan_batch`], [`ReplicaSet::reserve`],
//! [`ReplicaSet::commit`], [`ReplicaSet::pause_on`],
//! [`ReplicaSet::expire`]) are public, hidden from the docs, only for the
//! scheduler's own test harness, which drives them one by one.

use std::collections::HashMap;

use agentd_kv::{BlockCopy, KvCache, KvError, KvEvent, PrefixMatch, ProgramId};
use tracing::debug;

mod batch;

pub use batch::MIN_PREFILL_CHUNK;

use crate::{
    Decision, Ended, GroupId, GroupJoin, PauseCause, PauseCounts, Policy, ProgramTable, Replicas,
    Route, StepError, StepRates, StepWork, ToolId,
};

/// How often (seconds of `now`) leases are checked: `Policy::expire` walks
/// every program, so not at every step of every replica; a quarter second is
/// far below any sensible lease (default 30 min).
pub const LEASE_CHECK_S: f64 = 0.25;

/// The token contexts of programs' current requests, owned by the caller.
pub trait Contexts {
    /// The context `p`'s current request must have in KV: its prompt plus
    /// the tokens generated so far. `None` when `p` has no request.
    fn context(&self, p: ProgramId) -> Option<&[u32]>;
    /// Tokens `p`'s current request has generated so far.
    fn generated(&self, p: ProgramId) -> usize;
    /// The prefix-cache salt of `p`'s current request (its tenant's mixed
    /// with its `cache_salt`): it shares KV only with requests of equal salt.
    fn cache_salt(&self, _p: ProgramId) -> u64 {
        0
    }
    /// The group of `p`'s current request and the group's announced size.
    fn group(&self, _p: ProgramId) -> Option<(GroupId, Option<usize>)> {
        None
    }
    /// `p`'s current request computes its context from the first token,
    /// reusing no KV (its own or the prefix cache's): vLLM's rule for a
    /// request with `prompt_logprobs`, whose every prompt position needs
    /// its logits. Once its prompt is computed a restore matches as usual.
    fn full_prefill(&self, _p: ProgramId) -> bool {
        false
    }
}

/// A program (re)started on a replica, with what of its context was cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started {
    pub program: ProgramId,
    pub replica: usize,
    pub matched: PrefixMatch,
    /// Length of the context that was matched.
    pub context_tokens: usize,
}

/// What one schedule call did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scheduled {
    /// The policy's decision, as applied.
    pub decision: Decision,
    /// The admissions, matched (in decision order).
    pub started: Vec<Started>,
    /// Programs whose inactivity lease ran out: terminated, KV released.
    pub expired: Vec<Ended>,
}

/// One sequence of a step's batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    pub program: ProgramId,
    /// Tokens of its context already in KV; the new ones start here.
    pub num_computed: usize,
    /// Tokens computed in this step (slots allocated).
    pub num_new: usize,
    /// A decode step: one token, sampled by the previous step.
    pub decoding: bool,
    /// The step reaches the end of its context: its logits sample a token.
    pub wants_logits: bool,
}

/// A step's batch and the programs paused because blocks ran out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepPlan {
    pub seqs: Vec<Planned>,
    /// Victims of block exhaustion, in the order they were paused.
    pub preempted: Vec<ProgramId>,
    /// Tokens of budget left unused (a batch below its budget while requests
    /// wait is lost throughput).
    pub budget_left: usize,
    /// Prefills held back a step because a sequence planned before them
    /// computes their next block in this step (in-batch prefix sharing).
    pub deferred: usize,
}

/// Counters the core keeps about what it applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoreStats {
    /// Tokens computed before that had to be computed again on a (re)start.
    pub recomputed_tokens: u64,
    /// Every pause applied, by cause (the one count of them: the engine's
    /// metrics and trace and the simulator read it).
    pub pauses: PauseCounts,
    /// Context tokens read by decoding sequences, summed over the steps
    /// that ran a forward ([`StepWork::decode_context`]). Over the decode
    /// tokens it is the mean context a decode row attends over: what tells
    /// a dearer forward token from a longer one when two runs' forward
    /// time per token differ (`benches/lib/pair_metrics.py`).
    pub decode_context_tokens: u64,
    /// Attention (query, key) pairs of prefill chunks over the same steps
    /// ([`StepWork::prefill_pairs`], rounded).
    pub prefill_attention_pairs: u64,
}

/// The replicas, their KV caches and running sets, and the policy.
pub struct ReplicaSet<P: Policy = Box<dyn Policy>> {
    /// One KV cache per replica, changed only through the core
    /// ([`ReplicaSet::kv`] reads one).
    kv: Vec<KvCache>,
    pub policy: P,
    /// Programs with a request running on each replica, in start order.
    running: Vec<Vec<ProgramId>>,
    /// Each group's first member alive: the others' shared prompt is
    /// measured against its context.
    group_first: HashMap<GroupId, ProgramId>,
    next_lease_check: f64,
    check_invariants: bool,
    stats: CoreStats,
    /// This set's id (`step.rs`: a step is used only on its own set).
    id: u64,
    /// Replicas with a [`crate::Step`] open.
    open: Vec<bool>,
    /// Each replica's step-time fit, from the seconds its driver reports
    /// at [`crate::Step::finish`] (`rates.rs`).
    rates: Vec<StepRates>,
    /// The largest share of a decoding step's time its prefill chunks may
    /// take (`SchedulerConfig::prefill_share`; 1: no cap).
    prefill_share: f64,
}

impl<P: Policy> ReplicaSet<P> {
    /// `replicas` caches of `num_blocks` blocks of `block_size` tokens each.
    /// `check_invariants` makes [`ReplicaSet::verify`] walk the pools (debug
    /// builds and tests; O(blocks) per call).
    pub fn new(
        policy: P,
        replicas: usize,
        num_blocks: usize,
        block_size: usize,
        salt: u64,
        check_invariants: bool,
    ) -> Self {
        let n = replicas.max(1);
        Self {
            kv: (0..n)
                .map(|_| KvCache::new(num_blocks, block_size, salt))
                .collect(),
            policy,
            running: vec![Vec::new(); n],
            group_first: HashMap::new(),
            next_lease_check: 0.0,
            check_invariants,
            stats: CoreStats::default(),
            id: crate::step::next_set_id(),
            open: vec![false; n],
            rates: vec![StepRates::default(); n],
            prefill_share: 1.0,
        }
    }

    /// The step balance of `cfg` (`SchedulerConfig::prefill_share`).
    pub fn with_step_balance(mut self, cfg: &crate::SchedulerConfig) -> Self {
        self.prefill_share = cfg.prefill_share;
        self
    }

    /// Puts a host tier of `slots` blocks behind each replica's pool
    /// (`agentd_kv::HostTier`; 0: none).
    pub fn with_host_tier(mut self, slots: usize) -> Self {
        for kv in &mut self.kv {
            kv.enable_host_tier(slots);
        }
        self
    }

    pub fn num_replicas(&self) -> usize {
        self.kv.len()
    }
    /// Replica `r`'s KV cache, to read.
    pub fn kv(&self, r: usize) -> &KvCache {
        &self.kv[r]
    }
    /// Every replica's KV cache, to read.
    pub fn kvs(&self) -> &[KvCache] {
        &self.kv
    }
    /// The caches as the policies see them.
    pub fn memory(&self) -> Replicas<'_> {
        Replicas(&self.kv, &self.rates)
    }
    /// The policy, to call, with the caches it reads.
    pub fn policy_and_memory(&mut self) -> (&mut P, Replicas<'_>) {
        (&mut self.policy, Replicas(&self.kv, &self.rates))
    }
    /// Starts recording KV events on every replica's cache
    /// (`--kv-events-config`); call it while the caches are still empty.
    pub fn enable_kv_events(&mut self) {
        for kv in &mut self.kv {
            kv.enable_events();
        }
    }
    /// Replica `r`'s KV events since the last drain.
    pub fn drain_kv_events(&mut self, r: usize) -> Vec<KvEvent> {
        self.kv[r].drain_events()
    }
    pub(crate) fn drain_copies(&mut self, r: usize) -> Vec<BlockCopy> {
        self.kv[r].drain_copies()
    }
    pub(crate) fn id(&self) -> u64 {
        self.id
    }
    /// Marks a step of `r` open; false when one is open already.
    pub(crate) fn open_step(&mut self, r: usize) -> bool {
        !std::mem::replace(&mut self.open[r], true)
    }
    pub(crate) fn close_step(&mut self, r: usize) {
        self.open[r] = false;
    }
    /// Programs with a request running on `r`, in start order.
    pub fn running(&self, r: usize) -> &[ProgramId] {
        &self.running[r]
    }
    pub fn num_running(&self) -> usize {
        self.running.iter().map(Vec::len).sum()
    }
    pub fn is_running(&self, p: ProgramId) -> bool {
        self.home(p).is_some_and(|r| self.running[r].contains(&p))
    }
    /// The program table (the policy keeps it; `program.rs`).
    pub fn programs(&self) -> &ProgramTable {
        self.policy.programs()
    }
    /// The program table, for the driver's part of each record
    /// ([`crate::Life`]); the scheduling fields stay the policy's.
    pub fn programs_mut(&mut self) -> &mut ProgramTable {
        self.policy.programs_mut()
    }
    /// The replica holding `p`'s KV (resident or paused).
    pub fn home(&self, p: ProgramId) -> Option<usize> {
        self.programs().home(p)
    }
    /// Requests of `p` submitted and not finished.
    pub fn pending(&self, p: ProgramId) -> u32 {
        self.programs().in_flight(p)
    }
    /// Every program with its requests in flight (in no particular order).
    pub fn pending_programs(&self) -> impl Iterator<Item = (ProgramId, u32)> + '_ {
        self.programs().in_flight_all()
    }
    pub fn blocks_held(&self, p: ProgramId) -> usize {
        self.home(p).map_or(0, |h| self.kv[h].blocks_held(p))
    }
    pub fn stats(&self) -> CoreStats {
        self.stats
    }
    /// Replica `r`'s step-time fit (`rates.rs`).
    pub fn rates(&self, r: usize) -> &StepRates {
        &self.rates[r]
    }
    /// A step of `r` that computed `work` took `seconds`.
    pub(crate) fn observe_step(&mut self, r: usize, work: &StepWork, seconds: f64) {
        self.rates[r].observe(work, seconds);
        self.stats.decode_context_tokens += work.decode_context as u64;
        self.stats.prefill_attention_pairs += work.prefill_pairs.round() as u64;
    }

    /// A request of `p` arrived (its context is in `ctx`); it starts at once
    /// when the policy routes it to a replica where `p` is active.
    pub fn on_request(&mut self, p: ProgramId, now: f64, ctx: &impl Contexts) -> Option<Started> {
        let len = ctx.context(p)?.len();
        if let Some((group, size)) = ctx.group(p) {
            let first = *self.group_first.entry(group).or_insert(p);
            let shared_tokens = match (ctx.context(p), ctx.context(first)) {
                (Some(a), Some(b)) if first != p => {
                    a.iter().zip(b).take_while(|(x, y)| x == y).count()
                }
                _ => 0,
            };
            let join = GroupJoin {
                group,
                size,
                shared_tokens,
            };
            self.policy.join_group(p, join, now);
        }
        let mem = Replicas(&self.kv, &self.rates);
        match self.policy.on_request(p, now, len, &mem) {
            Route::Run { replica } => self.start_on(p, replica, ctx),
            Route::Queued => None,
            Route::Yield { replica } => {
                self.pause_on(p, replica);
                self.stats.pauses.add(PauseCause::Yielded);
                None
            }
        }
    }

    /// Starts (or restores) `p`'s request on `r`: moves its KV there if it
    /// lived elsewhere, matches its context's prefix (its own blocks, then
    /// the prefix cache) and adds it to `r`'s running set. Slots are
    /// allocated later, by [`ReplicaSet::plan_batch`].
    fn start_on(&mut self, p: ProgramId, r: usize, ctx: &impl Contexts) -> Option<Started> {
        let Some(prog) = self.policy.programs_mut().get_mut(&p) else {
            debug_assert!(false, "{p} started without a record");
            return None;
        };
        let ever = prog.ever_computed;
        if let Some(h) = prog.home.replace(r) {
            if h != r {
                self.kv[h].release(p);
            }
        }
        let tokens = ctx.context(p)?;
        let matched = if ctx.full_prefill(p) {
            self.kv[r].match_nothing(p, ctx.cache_salt(p))
        } else {
            self.kv[r].match_prefix_salted(p, tokens, ctx.cache_salt(p))
        };
        // Computed before (this request or an earlier turn) and lost since;
        // capped by this context, whose last token is always computed.
        let recomputed = ever
            .min(tokens.len().saturating_sub(1))
            .saturating_sub(matched.cached_tokens);
        self.stats.recomputed_tokens += recomputed as u64;
        debug!(program = %p, replica = r, cached = matched.cached_tokens, recomputed, "start");
        if !self.running[r].contains(&p) {
            self.running[r].push(p);
        }
        Some(Started {
            program: p,
            replica: r,
            matched,
            context_tokens: tokens.len(),
        })
    }

    /// Drops `p`'s KV references on `r`; its request (if any) stays in
    /// flight with its generated tokens and waits for the program's restore.
    #[doc(hidden)]
    pub fn pause_on(&mut self, p: ProgramId, r: usize) {
        self.running[r].retain(|q| *q != p);
        // The policy's choice for it (`park.rs`); none: the tier takes what
        // the device evicts, as the request policy's pauses do.
        let park = self.policy.programs().get(&p).and_then(|q| q.park);
        if park == Some(crate::Park::Recompute) {
            self.kv[r].pause_for_recompute(p);
        } else {
            self.kv[r].pause(p);
        }
    }

    /// Step boundary of `r`: lease expiry, the policy's decision, applied.
    #[doc(hidden)]
    pub fn schedule(&mut self, r: usize, now: f64, ctx: &impl Contexts) -> Scheduled {
        let expired = if now >= self.next_lease_check {
            self.next_lease_check = now + LEASE_CHECK_S;
            self.expire(now)
        } else {
            Vec::new()
        };
        let decision = self
            .policy
            .schedule(r, now, &Replicas(&self.kv, &self.rates));
        for &(p, cause) in &decision.pause {
            if let Some(h) = self.home(p) {
                self.pause_on(p, h);
                self.stats.pauses.add(cause);
            }
        }
        let started = decision
            .admit
            .iter()
            .filter_map(|&(p, m)| self.start_on(p, m, ctx))
            .collect();
        Scheduled {
            decision,
            started,
            expired,
        }
    }

    /// Terminates the programs whose lease ran out and releases their KV
    /// ([`ReplicaSet::schedule`] calls it every [`LEASE_CHECK_S`] of `now`).
    /// They have no request in flight, so no batch holds them.
    #[doc(hidden)]
    pub fn expire(&mut self, now: f64) -> Vec<Ended> {
        let gone = self.policy.expire(now);
        let mut ended = Vec::with_capacity(gone.len());
        for p in gone {
            debug!(program = %p, "lease expired");
            ended.extend(self.terminate(p));
        }
        ended
    }

    /// Pauses every program running on `r` by the policy's own order, as
    /// block exhaustion does (SGLang's `pause_generation` in `retract`
    /// mode): their requests go back to the queue with the tokens generated
    /// so far, their KV references are dropped, and a later admission
    /// restores them (recomputing what the cache lost). The policy may pause
    /// idle programs of `r` on the way (its order puts acting ones first).
    /// Returns the programs paused. Only between steps: refused while `r`
    /// has a [`crate::Step`] open (its batch is inside the forward).
    pub fn retract(&mut self, r: usize, now: f64) -> Result<Vec<ProgramId>, StepError> {
        self.between_steps(r)?;
        let mut paused = Vec::new();
        // Each call pauses a distinct program of the policy's; the bound
        // only guards against a policy that would not.
        let bound = self.programs().len() + 1;
        while let Some(&protect) = self.running[r].first() {
            if paused.len() > bound {
                break;
            }
            let Some(v) = self
                .policy
                .preempt(r, now, &Replicas(&self.kv, &self.rates), protect)
            else {
                break;
            };
            self.pause_on(v, r);
            self.stats.pauses.add(PauseCause::Retracted);
            paused.push(v);
        }
        Ok(paused)
    }

    /// Forgets every cached block of `r` that no program running there
    /// holds ([`KvCache::flush`]: SGLang's `flush_cache`, and after a
    /// weight swap). Returns the device blocks freed. Only between steps,
    /// as [`ReplicaSet::retract`].
    pub fn flush(&mut self, r: usize) -> Result<usize, StepError> {
        self.between_steps(r)?;
        let running = &self.running[r];
        Ok(self.kv[r].flush(|p| running.contains(&p)))
    }

    /// `Ok` when `r` exists and has no step open.
    fn between_steps(&self, r: usize) -> Result<(), StepError> {
        match self.open.get(r) {
            None => Err(StepError::NoReplica(r)),
            Some(true) => Err(StepError::AlreadyOpen(r)),
            Some(false) => Ok(()),
        }
    }

    /// Marks the next `tokens` of `p`'s context on `r` as computed. Returns
    /// the tokens now computed.
    #[doc(hidden)]
    pub fn commit(&mut self, r: usize, p: ProgramId, tokens: &[u32]) -> Result<usize, KvError> {
        self.kv[r].commit(p, tokens)?;
        let computed = self.kv[r].num_computed(p);
        if let Some(prog) = self.policy.programs_mut().get_mut(&p) {
            prog.ever_computed = prog.ever_computed.max(computed);
        }
        Ok(computed)
    }

    /// A request of `p` finished with a context of `context_tokens`. The
    /// program stops running once no request of it is left; a request-level
    /// policy drops its KV references then (returns true when it did).
    pub fn finish_request(&mut self, p: ProgramId, now: f64, context_tokens: usize) -> bool {
        let home = self.home(p);
        let drop_kv = self.policy.on_request_finished(p, now, context_tokens);
        self.policy.programs_mut().credit_parent(p);
        if self.pending(p) == 0 {
            if let Some(h) = home {
                self.running[h].retain(|q| *q != p);
            }
        }
        if drop_kv {
            if let Some(h) = home {
                self.kv[h].pause(p);
            }
        }
        drop_kv
    }

    /// `p`, acting since its request finished, runs `tool`.
    pub fn note_tool(&mut self, p: ProgramId, tool: ToolId, now: f64) {
        self.policy.on_tool(p, tool, now);
    }

    /// The program ended (release, final request, lease): its KV is
    /// released and the policy forgets it (its record goes with it: what
    /// it said last is returned, `None` when it had none).
    pub fn terminate(&mut self, p: ProgramId) -> Option<Ended> {
        if let Some(h) = self.home(p) {
            self.running[h].retain(|q| *q != p);
            self.kv[h].release(p);
        }
        self.group_first.retain(|_, first| *first != p);
        let ended = self.policy.programs_mut().take_end(p);
        self.policy.on_terminate(p);
        ended
    }

    /// Checks replica `r`'s KV invariants (`agentd_kv` docs) when enabled.
    pub fn verify(&self, r: usize) -> Result<(), String> {
        if !self.check_invariants {
            return Ok(());
        }
        self.kv[r].check_invariants()?;
        for &p in &self.running[r] {
            if self.home(p) != Some(r) {
                return Err(format!("{p} runs on replica {r} but lives elsewhere"));
            }
        }
        Ok(())
    }
}
