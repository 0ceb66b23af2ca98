//! A tiny engine for the scheduler's tests: it owns one real [`KvCache`] per
//! replica and plays the engine's part exactly as `agentd-sim` does — prefix
//! matching and prefill on admission, slot allocation and commits on decode,
//! `pause` / `release` when the policy says so, and the exhaustion loop that
//! asks the policy for victims when an allocation fails. No mocks: every block
//! count the policy reads comes from the caches.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

use agentd_kv::{KvCache, PrefixMatch};
use agentd_scheduler::{
    Decision, Placement, Policy, ProgramId, ProgramScheduler, Replicas, Route, SchedulerConfig,
};

/// Tokens per block in every test (small, so block counts stay readable).
pub const BS: usize = 4;

pub fn pid(n: u64) -> ProgramId {
    ProgramId(n)
}

/// A config with DESIGN's λmin / λmax knobs, no decay, no aging, reserve 1.
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

pub struct Engine<P: Policy> {
    pub policy: P,
    pub kv: Vec<KvCache>,
    pub now: f64,
    /// Each program's full context (prompt + generated + tool output).
    pub ctx: BTreeMap<ProgramId, Vec<u32>>,
    /// The replica holding the program's KV state (resident or paused).
    pub home: BTreeMap<ProgramId, usize>,
    /// Sequences in flight per replica (admitted, request not finished).
    pub running: Vec<BTreeSet<ProgramId>>,
    /// Requests submitted and not finished, per program.
    pub pending: BTreeMap<ProgramId, u32>,
    /// Prefix match of each program's latest (re)start.
    pub last_match: BTreeMap<ProgramId, PrefixMatch>,
    /// When set, admission prefills at most this many tokens (chunked prefill);
    /// [`Engine::catch_up`] computes the rest.
    pub prefill_chunk: Option<usize>,
    pub log: Vec<Logged>,
}

impl Engine<ProgramScheduler> {
    pub fn program(cfg: SchedulerConfig, replicas: usize, blocks: usize) -> Self {
        Engine::new(ProgramScheduler::new(cfg, replicas), replicas, blocks)
    }

    /// `D(L)` now, read from the real caches.
    pub fn demand(&self, r: usize) -> f64 {
        self.policy.demand(r, self.now, &Replicas(&self.kv))
    }
}

impl<P: Policy> Engine<P> {
    pub fn new(policy: P, replicas: usize, blocks: usize) -> Self {
        Self {
            policy,
            kv: (0..replicas).map(|_| KvCache::new(blocks, BS, 0)).collect(),
            now: 0.0,
            ctx: BTreeMap::new(),
            home: BTreeMap::new(),
            running: vec![BTreeSet::new(); replicas],
            pending: BTreeMap::new(),
            last_match: BTreeMap::new(),
            prefill_chunk: None,
            log: Vec::new(),
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
        let ctx = self.ctx.entry(p).or_default();
        ctx.extend_from_slice(toks);
        let len = ctx.len();
        *self.pending.entry(p).or_default() += 1;
        let route = self.policy.on_request(p, self.now, len);
        self.log.push(Logged::Route(p, route));
        if let Route::Run { replica } = route {
            self.start_on(p, replica);
            self.prefill(p);
        }
        route
    }

    /// Starts (or restarts) `p` on `r`: moves its KV there if it lived
    /// elsewhere and matches its prefix. Allocation waits for [`Engine::prefill`],
    /// as in the engine, where every admission of a decision is matched before
    /// the step's batch allocates.
    pub fn start_on(&mut self, p: ProgramId, r: usize) {
        if let Some(&h) = self.home.get(&p) {
            if h != r {
                self.kv[h].release(p);
            }
        }
        self.home.insert(p, r);
        let ctx = &self.ctx[&p];
        let m = self.kv[r].match_prefix(p, ctx);
        self.last_match.insert(p, m);
        self.running[r].insert(p);
    }

    /// Prefills a started `p` (at most `prefill_chunk` tokens). False when it
    /// is not running (any more) or was paused for lack of blocks.
    pub fn prefill(&mut self, p: ProgramId) -> bool {
        if !self.is_running(p) {
            return false;
        }
        let r = self.home[&p];
        let n = self.ctx[&p].len() - self.kv[r].num_computed(p);
        let n = self.prefill_chunk.map_or(n, |c| n.min(c));
        self.compute(p, n)
    }

    /// Computes every uncomputed token of `p`'s context. False when `p` was
    /// paused for lack of blocks.
    pub fn catch_up(&mut self, p: ProgramId) -> bool {
        let r = self.home[&p];
        let n = self.ctx[&p].len() - self.kv[r].num_computed(p);
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
    /// exhaustion asks the policy for victims like the engine does.
    fn compute(&mut self, p: ProgramId, n: usize) -> bool {
        let r = self.home[&p];
        loop {
            if self.kv[r].allocate_slots(p, n).is_ok() {
                let from = self.kv[r].num_computed(p);
                let toks = self.ctx[&p][from..from + n].to_vec();
                self.kv[r].commit(p, &toks).expect("slots were allocated");
                return true;
            }
            let victim = self.policy.preempt(r, self.now, &Replicas(&self.kv), p);
            self.log.push(Logged::Preempt(r, p, victim));
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

    fn pause_on(&mut self, p: ProgramId, r: usize) {
        assert_eq!(
            self.home.get(&p),
            Some(&r),
            "{p} paused on replica {r} where it does not live"
        );
        self.running[r].remove(&p);
        self.kv[r].pause(p);
    }

    /// One step boundary of replica `r`: the policy's decision, applied.
    pub fn step(&mut self, r: usize) -> Decision {
        let d = self.policy.schedule(r, self.now, &Replicas(&self.kv));
        self.log.push(Logged::Decision(r, d.clone()));
        for &p in &d.pause {
            self.pause_on(p, r);
        }
        for &(p, m) in &d.admit {
            self.start_on(p, m);
        }
        for &(p, _) in &d.admit {
            self.prefill(p);
        }
        d
    }

    /// The latest request of `p` finished (it was running and fully computed).
    pub fn finish(&mut self, p: ProgramId) -> bool {
        let r = self.home[&p];
        assert!(self.running[r].contains(&p), "{p} is not running");
        let len = self.ctx[&p].len();
        let left = self.pending.get_mut(&p).expect("pending request");
        *left -= 1;
        if *left == 0 {
            self.running[r].remove(&p);
        }
        let dropped = self.policy.on_request_finished(p, self.now, len);
        self.log.push(Logged::Finished(p, dropped));
        if dropped {
            self.kv[r].pause(p);
        }
        dropped
    }

    pub fn terminate(&mut self, p: ProgramId) {
        self.policy.on_terminate(p);
        self.forget(p);
    }

    /// Lease expiry at `now`.
    pub fn expire_at(&mut self, now: f64) -> Vec<ProgramId> {
        self.now = now;
        let gone = self.policy.expire(now);
        self.log.push(Logged::Expired(gone.clone()));
        for &p in &gone {
            self.forget(p);
        }
        gone
    }

    fn forget(&mut self, p: ProgramId) {
        if let Some(h) = self.home.remove(&p) {
            self.kv[h].release(p);
        }
        for r in &mut self.running {
            r.remove(&p);
        }
        self.pending.remove(&p);
        self.ctx.remove(&p);
    }

    pub fn is_running(&self, p: ProgramId) -> bool {
        self.running.iter().any(|r| r.contains(&p))
    }

    pub fn check_kv(&self) {
        for (r, kv) in self.kv.iter().enumerate() {
            if let Err(e) = kv.check_invariants() {
                panic!("replica {r}: {e}");
            }
        }
    }
}
