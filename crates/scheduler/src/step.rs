//! One step of one replica as a type: the protocol every driver follows —
//! the engine's workers, `agentd simulate` and the scheduler's tests — in
//! one place, so a change to it is made once.
//!
//! ```text
//! ReplicaSet::begin_step(r, now)   leases expired, the policy's decision applied
//!   Step::plan(budget)             the batch, its slots reserved, the tier copies drained
//!   (the forward, or the simulator's step-time model)
//!   Step::commit(p, tokens)        per planned sequence
//! Step::finish(seconds)            the step's time fitted (`rates.rs`), the KV
//!                                  invariants checked, the step closed
//! Step::abort                      (the forward failed) the batch paused, the step closed
//! ```
//!
//! A replica has at most one step open: [`ReplicaSet::begin_step`] refuses a
//! second one until the first is finished or aborted, and every call checks
//! that the step belongs to the set it is given. Requests that end
//! ([`ReplicaSet::finish_request`]) and arrivals ([`ReplicaSet::on_request`])
//! happen between or during steps, as they happen.

use std::sync::atomic::{AtomicU64, Ordering};

use agentd_kv::{BlockCopy, KvError, ProgramId};

use crate::{Contexts, Policy, ReplicaSet, Scheduled, StepPlan, StepWork};

/// Ids of replica sets, so a [`Step`] is only ever used on its own set.
static NEXT_SET: AtomicU64 = AtomicU64::new(1);

pub(crate) fn next_set_id() -> u64 {
    NEXT_SET.fetch_add(1, Ordering::Relaxed)
}

/// A use of [`Step`] outside its protocol, or a failure inside it.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("no replica {0}")]
    NoReplica(usize),
    #[error("replica {0} already has a step open")]
    AlreadyOpen(usize),
    #[error("replica {0} has no step open")]
    NotOpen(usize),
    #[error("the step of replica {0} belongs to another replica set")]
    ForeignSet(usize),
    #[error("the step of replica {0} was planned already")]
    PlannedTwice(usize),
    #[error("{program} is not in the batch of replica {replica}'s step")]
    NotPlanned { program: ProgramId, replica: usize },
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error("KV invariants of replica {replica} violated: {detail}")]
    Invariant { replica: usize, detail: String },
}

/// The open step of one replica (see the module docs). It must end with
/// [`Step::finish`] or [`Step::abort`]: until then the replica can begin no
/// other step.
#[derive(Debug)]
#[must_use = "a step ends with Step::finish or Step::abort"]
pub struct Step {
    set: u64,
    replica: usize,
    now: f64,
    scheduled: Scheduled,
    /// The programs of the batch, once planned (in plan order).
    batch: Option<Vec<ProgramId>>,
    /// What the planned batch computes (and copies), for the step-time fit.
    work: StepWork,
}

impl<P: Policy> ReplicaSet<P> {
    /// Opens a step of replica `r` at `now`: leases expired (every
    /// [`crate::LEASE_CHECK_S`]) and the policy's decision applied — its
    /// victims paused, its admissions started with their prefixes matched
    /// ([`Step::scheduled`] says what was done).
    pub fn begin_step(
        &mut self,
        r: usize,
        now: f64,
        ctx: &impl Contexts,
    ) -> Result<Step, StepError> {
        if r >= self.num_replicas() {
            return Err(StepError::NoReplica(r));
        }
        if !self.open_step(r) {
            return Err(StepError::AlreadyOpen(r));
        }
        let scheduled = self.schedule(r, now, ctx);
        Ok(Step {
            set: self.id(),
            replica: r,
            now,
            scheduled,
            batch: None,
            work: StepWork::default(),
        })
    }
}

impl Step {
    pub fn replica(&self) -> usize {
        self.replica
    }

    /// What opening the step did: the decision as applied, the admissions
    /// matched, the programs whose lease ran out.
    pub fn scheduled(&self) -> &Scheduled {
        &self.scheduled
    }

    /// The programs of the batch, in plan order (empty until planned).
    pub fn batch(&self) -> &[ProgramId] {
        self.batch.as_deref().unwrap_or_default()
    }

    /// Whether `p` is in this step's batch (a release waits for it).
    pub fn holds(&self, p: ProgramId) -> bool {
        self.batch().contains(&p)
    }

    fn check<P: Policy>(&self, set: &ReplicaSet<P>) -> Result<(), StepError> {
        if set.id() == self.set {
            Ok(())
        } else {
            Err(StepError::ForeignSet(self.replica))
        }
    }

    /// Plans the batch under `budget` tokens — decodes first, then prefill
    /// chunks, slots reserved, the policy's victims paused when blocks run
    /// out — checks the KV invariants (when the set checks them), and drains
    /// the copies between the KV tiers the runner carries out before the
    /// forward (this plan's and those decided since the replica's last
    /// step). Once per step.
    pub fn plan<P: Policy>(
        &mut self,
        set: &mut ReplicaSet<P>,
        budget: usize,
        ctx: &impl Contexts,
    ) -> Result<(StepPlan, Vec<BlockCopy>), StepError> {
        self.check(set)?;
        if self.batch.is_some() {
            return Err(StepError::PlannedTwice(self.replica));
        }
        let r = self.replica;
        let plan = set.plan_batch(r, self.now, budget, ctx);
        self.batch = Some(plan.seqs.iter().map(|s| s.program).collect());
        verify(set, r)?;
        let copies = set.drain_copies(r);
        self.work = work_of(&plan, copies.len() * set.kv(r).block_size());
        Ok((plan, copies))
    }

    /// Marks `tokens`, the next of planned `p`'s context, as computed.
    /// Returns the tokens now computed.
    pub fn commit<P: Policy>(
        &self,
        set: &mut ReplicaSet<P>,
        p: ProgramId,
        tokens: &[u32],
    ) -> Result<usize, StepError> {
        self.check(set)?;
        if !self.holds(p) {
            return Err(StepError::NotPlanned {
                program: p,
                replica: self.replica,
            });
        }
        Ok(set.commit(self.replica, p, tokens)?)
    }

    /// What the planned batch computes (empty until planned).
    pub fn work(&self) -> &StepWork {
        &self.work
    }

    /// Ends the step: the replica may begin the next one. `seconds` is how
    /// long its forward (copies and sampling included) took — measured by
    /// the engine, modelled by the simulator; `None` for a step that ran
    /// no forward — and feeds the replica's step-time fit
    /// ([`ReplicaSet::rates`]). Checks the KV invariants when the set
    /// checks them (debug builds, tests); the step is closed even when
    /// they fail.
    pub fn finish<P: Policy>(
        self,
        set: &mut ReplicaSet<P>,
        seconds: Option<f64>,
    ) -> Result<(), StepError> {
        self.check(set)?;
        if let Some(s) = seconds {
            set.observe_step(self.replica, &self.work, s);
        }
        set.close_step(self.replica);
        verify(set, self.replica)
    }

    /// Ends a step whose forward failed: its batch's programs are paused on
    /// the replica (their KV references dropped, the blocks evictable; their
    /// requests stay in flight for the caller to end or retry) and returned
    /// in plan order.
    pub fn abort<P: Policy>(self, set: &mut ReplicaSet<P>) -> Result<Vec<ProgramId>, StepError> {
        self.check(set)?;
        let r = self.replica;
        let programs = self.batch.unwrap_or_default();
        for &p in &programs {
            set.pause_on(p, r);
        }
        set.close_step(r);
        verify(set, r)?;
        Ok(programs)
    }
}

/// What `plan` computes, with `copied_tokens` moved between the tiers.
fn work_of(plan: &StepPlan, copied_tokens: usize) -> StepWork {
    let mut w = StepWork {
        copied_tokens,
        ..StepWork::default()
    };
    for s in &plan.seqs {
        if s.decoding {
            w.add_decode(s.num_computed);
        } else {
            w.add_prefill(s.num_computed, s.num_new);
        }
        w.rows += usize::from(s.wants_logits);
    }
    w
}

fn verify<P: Policy>(set: &ReplicaSet<P>, r: usize) -> Result<(), StepError> {
    set.verify(r)
        .map_err(|detail| StepError::Invariant { replica: r, detail })
}
