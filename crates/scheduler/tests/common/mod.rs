//! A tiny engine for the scheduler's tests over the real core
//! ([`ReplicaSet`], the one the engine and `agentd-sim` use): it only owns the
//! programs' token contexts and says when requests arrive, decode and finish;
//! prefix matching, pauses, releases and the exhaustion loop that asks the
//! policy for victims are the core's. No mocks: every block count the policy
//! reads comes from the caches.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};

use agentd_kv::PrefixMatch;
use agentd_scheduler::{
    Contexts, Decision, GroupId, Placement, Policy, ProgramId, ProgramScheduler, ReplicaSet, Route,
    SchedulerConfig, StepPlan, StepWork,
};

/// Tokens per block in every test (small, so block counts stay readable).
pub const BS: usize = 4;

pub fn pid(n: u64) -> ProgramId {
    ProgramId(n)
}

/// A config with the given λmin / λmax (docs/design.md §5 rules 1-2), no
/// decay, no aging, reserve 1.
pub fn config(lambda_min: f64, lambda_max: f64) -> SchedulerConfig {
    SchedulerConfig {
        lambda_min,
        lambda_max,
        decay_base: 1.0,
        decay_unit_s: 1.0,
        decode_reserve_blocks: 1,
        aging_tokens_per_s: 0.0,
        lease_s: 1800.0,
        placement: Placement::MostRoom,
        ..SchedulerConfig::DEFAULT
    }
}

/// First tokens of the shared system prompt (the same for every program).
pub fn system_prompt(tokens: usize) -> Vec<u32> {
    (0..tokens as u32).map(|i| 900_000_000 + i).collect()
}

/// What happened at one engine call, for the determinism checks.
#[derive(Debug, Clone, PartialEq)]
pub enum Logged {
    Route(ProgramId, Route),
    Decision(usize, Decision),
    Preempt(usize, ProgramId, Option<ProgramId>),
    Expired(Vec<ProgramId>),
    Finished(ProgramId, bool),
}

/// Each grouped program's group and the group's announced size.
pub type Groups = BTreeMap<ProgramId, (GroupId, Option<usize>)>;

/// The harness's contexts: each program's full token context, and groups.
struct Ctx<'a>(&'a BTreeMap<ProgramId, Vec<u32>>, &'a Groups);

impl Contexts for Ctx<'_> {
    fn context(&self, p: ProgramId) -> Option<&[u32]> {
        self.0.get(&p).map(Vec::as_slice)
    }
    fn generated(&self, _p: ProgramId) -> usize {
        0
    }
    fn group(&self, p: ProgramId) -> Option<(GroupId, Option<usize>)> {
        self.1.get(&p).copied()
    }
}

pub struct Engine<P: Policy> {
    /// The engine's own core: KV caches, running sets, homes, the policy.
    pub core: ReplicaSet<P>,
    pub now: f64,
    /// Each program's full context (prompt + generated + tool output).
    pub ctx: BTreeMap<ProgramId, Vec<u32>>,
    /// Programs that belong to a group (RL rollouts, `n` choices).
    pub groups: Groups,
    /// Prefix match of each program's latest (re)start.
    pub last_match: BTreeMap<ProgramId, PrefixMatch>,
    /// When set, admission prefills at most this many tokens (chunked prefill);
    /// [`Engine::catch_up`] computes the rest.
    pub prefill_chunk: Option<usize>,
    pub log: Vec<Logged>,
}

impl<P: Policy> Deref for Engine<P> {
    type Target = ReplicaSet<P>;
    fn deref(&self) -> &ReplicaSet<P> {
        &self.core
    }
}

impl<P: Policy> DerefMut for Engine<P> {
    fn deref_mut(&mut self) -> &mut ReplicaSet<P> {
        &mut self.core
    }
}

impl Engine<ProgramScheduler> {
    pub fn program(cfg: SchedulerConfig, replicas: usize, blocks: usize) -> Self {
        Engine::new(ProgramScheduler::new(cfg, replicas), replicas, blocks)
    }

    /// `D(L)` now, read from the real caches.
    pub fn demand(&self, r: usize) -> f64 {
        self.core.policy.demand(r, self.now, &self.core.memory())
    }
}

impl<P: Policy> Engine<P> {
    pub fn new(policy: P, replicas: usize, blocks: usize) -> Self {
        Self {
            core: ReplicaSet::new(policy, replicas, blocks, BS, 0, true),
            now: 0.0,
            ctx: BTreeMap::new(),
            groups: BTreeMap::new(),
            last_match: BTreeMap::new(),
            prefill_chunk: None,
            log: Vec::new(),
        }
    }

    /// The same engine with a host KV tier of `slots` blocks per replica.
    pub fn with_host_tier(self, slots: usize) -> Self {
        Self {
            core: self.core.with_host_tier(slots),
            ..self
        }
    }

    /// Tokens unique to `p` (so programs share nothing unless told to).
    pub fn own_tokens(&self, p: ProgramId, n: usize) -> Vec<u32> {
        let from = self.ctx.get(&p).map_or(0, Vec::len) as u32;
        (0..n as u32)
            .map(|i| (p.0 as u32 + 1) * 1_000_000 + from + i)
            .collect()
    }

    /// A request of `p` whose context grows by `extra` tokens of its own.
    pub fn request(&mut self, p: ProgramId, extra: usize) -> Route {
        let toks = self.own_tokens(p, extra);
        self.request_tokens(p, &toks)
    }

    /// A request of `p` whose context grows by `toks`.
    pub fn request_tokens(&mut self, p: ProgramId, toks: &[u32]) -> Route {
        self.ctx.entry(p).or_default().extend_from_slice(toks);
        let started = self
            .core
            .on_request(p, self.now, &Ctx(&self.ctx, &self.groups));
        let route = match started {
            Some(s) => {
                self.last_match.insert(p, s.matched);
                Route::Run { replica: s.replica }
            }
            None => Route::Queued,
        };
        self.log.push(Logged::Route(p, route));
        if started.is_some() {
            self.prefill(p);
        }
        route
    }

    /// Prefills a started `p` (at most `prefill_chunk` tokens). False when it
    /// is not running (any more) or was paused for lack of blocks.
    pub fn prefill(&mut self, p: ProgramId) -> bool {
        if !self.core.is_running(p) {
            return false;
        }
        let r = self.home(p).expect("running programs have a home");
        let n = self.ctx[&p].len() - self.core.kv(r).num_computed(p);
        let n = self.prefill_chunk.map_or(n, |c| n.min(c));
        self.compute(p, n)
    }

    /// Computes every uncomputed token of `p`'s context. False when `p` was
    /// paused for lack of blocks.
    pub fn catch_up(&mut self, p: ProgramId) -> bool {
        let r = self.home(p).expect("known program");
        let n = self.ctx[&p].len() - self.core.kv(r).num_computed(p);
        self.compute(p, n)
    }

    /// Decodes `n` tokens of a running `p` (allocating as it goes, pausing by
    /// the policy's order when blocks run out). False when `p` itself was paused.
    pub fn decode(&mut self, p: ProgramId, n: usize) -> bool {
        let toks = self.own_tokens(p, n);
        self.ctx.get_mut(&p).expect("known program").extend(toks);
        self.catch_up(p)
    }

    /// Allocates and commits the next `n` tokens of `p` on its replica; on
    /// exhaustion the core asks the policy for victims, as in the engine.
    fn compute(&mut self, p: ProgramId, n: usize) -> bool {
        let r = self.home(p).expect("known program");
        let mut victims = Vec::new();
        let ok = self.core.reserve(r, p, n, self.now, &mut victims);
        // The log records each preempt call's answer, as the policy gave it.
        for &v in &victims {
            self.log.push(Logged::Preempt(r, p, Some(v)));
        }
        if !ok {
            if victims.last() != Some(&p) {
                self.log.push(Logged::Preempt(r, p, None));
            }
            return false;
        }
        let from = self.core.kv(r).num_computed(p);
        let toks = self.ctx[&p][from..from + n].to_vec();
        self.core.commit(r, p, &toks).expect("slots were allocated");
        true
    }

    /// One step boundary of replica `r`: the policy's decision, applied.
    pub fn step(&mut self, r: usize) -> Decision {
        let s = self
            .core
            .schedule(r, self.now, &Ctx(&self.ctx, &self.groups));
        self.log.push(Logged::Decision(r, s.decision.clone()));
        for st in &s.started {
            self.last_match.insert(st.program, st.matched);
        }
        for &(p, _) in &s.decision.admit {
            self.prefill(p);
        }
        s.decision
    }

    /// One batch of `r` as the engine runs it: the core's plan (decodes
    /// first, then prefill chunks under `budget`, in-batch prefix sharing),
    /// then every planned sequence's tokens committed.
    pub fn run_batch(&mut self, r: usize, budget: usize) -> StepPlan {
        let plan = self
            .core
            .plan_batch(r, self.now, budget, &Ctx(&self.ctx, &self.groups));
        for s in &plan.seqs {
            let toks = self.ctx[&s.program][s.num_computed..s.num_computed + s.num_new].to_vec();
            self.core
                .commit(r, s.program, &toks)
                .expect("planned slots");
        }
        plan
    }

    /// The latest request of `p` finished (it was running and fully computed).
    pub fn finish(&mut self, p: ProgramId) -> bool {
        assert!(self.core.is_running(p), "{p} is not running");
        let len = self.ctx[&p].len();
        let dropped = self.core.finish_request(p, self.now, len);
        self.log.push(Logged::Finished(p, dropped));
        dropped
    }

    /// Requests of `p` still in flight.
    pub fn pending_of(&self, p: ProgramId) -> u32 {
        self.core.pending(p)
    }

    pub fn terminate(&mut self, p: ProgramId) {
        self.core.terminate(p);
        self.ctx.remove(&p);
    }

    /// Lease expiry at `now`.
    pub fn expire_at(&mut self, now: f64) -> Vec<ProgramId> {
        self.now = now;
        let gone: Vec<ProgramId> = self.core.expire(now).iter().map(|e| e.program).collect();
        self.log.push(Logged::Expired(gone.clone()));
        for p in &gone {
            self.ctx.remove(p);
        }
        gone
    }

    /// Computes running `p`'s context through the one step protocol
    /// (`begin_step`, `plan`, `commit`, `finish`), one step per budget of
    /// `budgets` in turn, each step reporting `seconds(work)` to `r`'s
    /// step-time fit as the engine reports its measured forward. Returns
    /// the steps run.
    pub fn compute_in_steps(
        &mut self,
        r: usize,
        p: ProgramId,
        budgets: &[usize],
        seconds: impl Fn(&StepWork) -> f64,
    ) -> usize {
        let mut steps = 0;
        while self.core.kv(r).num_computed(p) < self.ctx[&p].len() {
            let ctx = Ctx(&self.ctx, &self.groups);
            let budget = budgets[steps % budgets.len()];
            let mut step = self.core.begin_step(r, self.now, &ctx).expect("step");
            let (plan, _) = step.plan(&mut self.core, budget, &ctx).expect("plan");
            for s in &plan.seqs {
                let toks = &self.ctx[&s.program][s.num_computed..s.num_computed + s.num_new];
                step.commit(&mut self.core, s.program, toks).expect("slots");
            }
            let dt = seconds(step.work());
            step.finish(&mut self.core, Some(dt)).expect("invariants");
            self.now += dt;
            steps += 1;
        }
        steps
    }

    pub fn check_kv(&self) {
        for r in 0..self.core.num_replicas() {
            if let Err(e) = self.core.verify(r) {
                panic!("replica {r}: {e}");
            }
        }
    }
}

// Shared by the rule tests (rules.rs, fairness.rs, replicas.rs).

pub const EPS: f64 = 1e-9;

pub fn assert_close(got: f64, want: f64) {
    assert!((got - want).abs() < EPS, "got {got}, want {want}");
}

/// Requests `(id, blocks)` programs (contexts of exactly `blocks` full blocks),
/// runs one step of `r` and checks that all of them were admitted there.
pub fn admit_all(eng: &mut Engine<ProgramScheduler>, r: usize, progs: &[(u64, usize)]) {
    for &(p, blocks) in progs {
        eng.request(pid(p), blocks * BS);
    }
    let d = eng.step(r);
    assert!(d.pause.is_empty(), "{d:?}");
    let mut got: Vec<u64> = d.admit.iter().map(|&(p, _)| p.0).collect();
    got.sort();
    let mut want: Vec<u64> = progs.iter().map(|&(p, _)| p).collect();
    want.sort();
    assert_eq!(got, want, "{d:?}");
    for &(p, blocks) in progs {
        assert_eq!(
            eng.kv(eng.home(pid(p)).expect("admitted"))
                .blocks_held(pid(p)),
            blocks
        );
    }
}

/// Program 1, paused for 3 and parked in the host tier, asks for its next
/// turn; `dt` seconds after 3 finishes its own, replica 0 pauses 3 for 1
/// and 1's blocks come back by copies from the tier, not by prefill.
pub fn back_from_the_tier(eng: &mut Engine<ProgramScheduler>, dt: f64) {
    eng.request(pid(1), BS);
    eng.finish(pid(3));
    eng.now += dt;
    let d = eng.step(0);
    assert_eq!(
        (ids(&d.paused()), d.admit.clone()),
        (vec![3], vec![(pid(1), 0)])
    );
    assert!(eng.kv(0).host_copies().1 > 0, "restored without onloads");
}

pub fn ids(v: &[agentd_scheduler::ProgramId]) -> Vec<u64> {
    v.iter().map(|p| p.0).collect()
}

pub fn info(eng: &Engine<ProgramScheduler>, p: u64) -> agentd_scheduler::ProgramInfo {
    eng.policy.program(pid(p)).expect("tracked program")
}
