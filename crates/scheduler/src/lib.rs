//! Who runs, who pauses, who is restored — decided at every engine step on
//! exact block counts.
//!
//! The crate is pure and deterministic: the caller passes `now` (seconds on any
//! monotonic clock), there are no threads, timers or tensors inside, and ties are
//! broken by program id, so a simulation with a fixed seed replays exactly.
//!
//! Two policies implement [`Policy`]:
//! * [`ProgramScheduler`] — docs/design.md §5: programs keep their KV between
//!   turns; a thrashing test with hysteresis pauses (acting first, shortest
//!   first) and restores (pending requests first, shortest first with aging)
//!   through one global queue, placing programs over replicas (most room by
//!   default, or best fit; on their previous replica while their blocks
//!   survive there).
//! * [`RequestScheduler`] — the vLLM baseline: KV of finished requests becomes
//!   evictable, FCFS admission while blocks are free or evictable, the newest
//!   request is preempted (recompute) when blocks run out, sticky routing.
//!
//! [`ReplicaSet`] is the one core that applies the decisions to the replicas'
//! KV caches, used alike by the engine, the simulator and the tests; the
//! policies only read the caches, through [`Memory`]. A replica's step is a
//! [`Step`]: opened by [`ReplicaSet::begin_step`], planned, committed and
//! finished (or aborted) — the one protocol both drivers follow.

mod admit;
mod config;
mod groups;
mod memory;
mod park;
mod program;
mod program_policy;
mod queue;
mod rates;
mod replica_set;
mod request_policy;
mod rotation;
mod step;
mod tools;

pub use agentd_kv::ProgramId;
pub use config::{Placement, PolicyKind, SchedulerConfig};
pub use groups::{GroupId, GroupJoin};
pub use memory::{Memory, Replicas};
pub use park::{Park, ParkCounts};
pub use program::{EndReason, Ended, Life, Lifecycle, Phase, ProgramInfo, ProgramTable, State};
pub use program_policy::ProgramScheduler;
pub use queue::WaitingQueue;
pub use rates::{StepRates, StepWork};
pub use replica_set::{
    Contexts, CoreStats, Planned, ReplicaSet, Scheduled, Started, StepPlan, LEASE_CHECK_S,
    MIN_PREFILL_CHUNK,
};
pub use request_policy::RequestScheduler;
pub use step::{Step, StepError};
pub use tools::{ToolId, MIN_SAMPLES as TOOL_MIN_SAMPLES};

/// Where a newly arrived request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The program is active on this replica: start the request there now.
    Run { replica: usize },
    /// The request waits in the queue until a decision admits its program.
    Queued,
    /// The program is resident on this replica but yields its place to the
    /// programs queued before it (`SchedulerConfig::yield_to_queue`): the
    /// core pauses it there (its blocks stay cached, evictable) and its
    /// request waits in the queue like theirs.
    Yield { replica: usize },
}

/// Why a program was paused: the one definition the engine's metrics and
/// trace and the simulator's report count by. The core counts each pause
/// where it applies it ([`CoreStats::pauses`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PauseCause {
    /// The thrashing test: demand above λmax of the pool.
    Thrashing,
    /// Work conservation: acting programs let go for a waiting one on a
    /// replica that would otherwise idle.
    WorkConserving,
    /// Room made for a waiting program by swapping acting programs to
    /// the host tier (`swap_for_waiting`).
    TierSwap,
    /// Bounded waiting: room made for an overdue program.
    Overdue,
    /// Blocks ran out while planning a step (vLLM's preemption).
    Exhaustion,
    /// A trainer's `pause_generation` in `retract` mode.
    Retracted,
    /// A resident program whose tool returned while others queued took its
    /// place in the queue (`Route::Yield`).
    Yielded,
}

impl PauseCause {
    pub const ALL: [PauseCause; 7] = [
        PauseCause::Thrashing,
        PauseCause::WorkConserving,
        PauseCause::TierSwap,
        PauseCause::Overdue,
        PauseCause::Exhaustion,
        PauseCause::Retracted,
        PauseCause::Yielded,
    ];
    /// The name traces and logs use.
    pub fn as_str(self) -> &'static str {
        match self {
            PauseCause::Thrashing => "thrashing",
            PauseCause::WorkConserving => "work_conserving",
            PauseCause::TierSwap => "tier_swap",
            PauseCause::Overdue => "overdue",
            PauseCause::Exhaustion => "kv_exhausted",
            PauseCause::Retracted => "retracted",
            PauseCause::Yielded => "yielded",
        }
    }
}

/// Pauses counted by cause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PauseCounts([u64; 7]);

impl PauseCounts {
    pub fn of(&self, cause: PauseCause) -> u64 {
        self.0[cause as usize]
    }
    /// Every pause, whatever its cause (vLLM's `num_preemptions_total`).
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
    pub(crate) fn add(&mut self, cause: PauseCause) {
        self.0[cause as usize] += 1;
    }
}

/// What the engine must do at this step boundary.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    /// Programs to pause (on the replica they live on, the calling one),
    /// with why: drop their KV references; an in-flight request stops at
    /// this step boundary, keeps its generated tokens and waits for the
    /// program's restore.
    pub pause: Vec<(ProgramId, PauseCause)>,
    /// Programs to (re)start, with the replica they are placed on: match their
    /// prefix there and run their pending request.
    pub admit: Vec<(ProgramId, usize)>,
}

impl Decision {
    pub fn is_empty(&self) -> bool {
        self.pause.is_empty() && self.admit.is_empty()
    }
    /// The programs paused, in order.
    pub fn paused(&self) -> Vec<ProgramId> {
        self.pause.iter().map(|&(p, _)| p).collect()
    }
    /// Whether this decision pauses `p`.
    pub fn pauses(&self, p: ProgramId) -> bool {
        self.pause.iter().any(|&(q, _)| q == p)
    }
}

/// Counters a policy keeps about its own decisions (pauses are counted by
/// the core, where they are applied: [`CoreStats::pauses`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolicyStats {
    /// Paused programs admitted again.
    pub restores: u64,
    /// First admissions of new programs / requests.
    pub admissions: u64,
    /// Keep / swap / recompute choices (`park.rs`; the program policy's).
    pub parks: ParkCounts,
}

/// A scheduling policy. Calls are made by the engine at well-defined points;
/// `now` is monotonic seconds.
pub trait Policy: Send {
    /// A request of `p` arrived; its prompt is `context_tokens` long.
    /// `mem` is the replicas' memory as it stands (no decision applied
    /// since the last step boundary).
    fn on_request(
        &mut self,
        p: ProgramId,
        now: f64,
        context_tokens: usize,
        mem: &dyn Memory,
    ) -> Route;
    /// A request of `p` finished; `context_tokens` is its final context length.
    /// Returns true when the engine must drop the program's KV references now
    /// (request-level policies); false when the program keeps them.
    fn on_request_finished(&mut self, p: ProgramId, now: f64, context_tokens: usize) -> bool;
    /// `p` (about to send a request) belongs to a group; called before its
    /// `on_request`. Policies without groups ignore it.
    fn join_group(&mut self, _p: ProgramId, _join: GroupJoin, _now: f64) {}
    /// `p`, acting since its last request finished, runs `tool` (named by the
    /// request or by the tool calls it returned). Policies without per-tool
    /// statistics ignore it.
    fn on_tool(&mut self, _p: ProgramId, _tool: ToolId, _now: f64) {}
    /// The program ended (release, final request, lease). The engine releases its KV.
    fn on_terminate(&mut self, p: ProgramId);
    /// Programs whose inactivity lease ran out, in id order; the caller
    /// terminates each ([`Policy::on_terminate`]).
    fn expire(&mut self, now: f64) -> Vec<ProgramId>;
    /// The decision at a step boundary of replica `replica`.
    fn schedule(&mut self, replica: usize, now: f64, mem: &dyn Memory) -> Decision;
    /// Blocks ran out on `replica` while planning a step: choose a program to
    /// pause now (never `protect`, the one that needs the blocks, unless it is the
    /// only one). The policy marks it paused and requeues its request.
    fn preempt(
        &mut self,
        replica: usize,
        now: f64,
        mem: &dyn Memory,
        protect: ProgramId,
    ) -> Option<ProgramId>;
    /// Whether the program keeps its KV between requests.
    fn keeps_kv_between_requests(&self) -> bool;
    fn stats(&self) -> PolicyStats;
    /// Number of requests waiting to be admitted.
    fn num_waiting(&self) -> usize;
    /// The program table the policy keeps its records in (`program.rs`).
    fn programs(&self) -> &ProgramTable;
    /// The same, to change: the core keeps its fields of each record there.
    fn programs_mut(&mut self) -> &mut ProgramTable;
    /// A snapshot of one program, if the policy tracks it.
    fn program(&self, p: ProgramId) -> Option<ProgramInfo> {
        self.programs().info(p)
    }
}

/// A boxed policy is a policy (the engine and the simulator pick one at run
/// time; tests use the concrete types).
impl<T: Policy + ?Sized> Policy for Box<T> {
    fn on_request(
        &mut self,
        p: ProgramId,
        now: f64,
        context_tokens: usize,
        mem: &dyn Memory,
    ) -> Route {
        (**self).on_request(p, now, context_tokens, mem)
    }
    fn on_request_finished(&mut self, p: ProgramId, now: f64, context_tokens: usize) -> bool {
        (**self).on_request_finished(p, now, context_tokens)
    }
    fn join_group(&mut self, p: ProgramId, join: GroupJoin, now: f64) {
        (**self).join_group(p, join, now)
    }
    fn on_tool(&mut self, p: ProgramId, tool: ToolId, now: f64) {
        (**self).on_tool(p, tool, now)
    }
    fn on_terminate(&mut self, p: ProgramId) {
        (**self).on_terminate(p)
    }
    fn expire(&mut self, now: f64) -> Vec<ProgramId> {
        (**self).expire(now)
    }
    fn schedule(&mut self, replica: usize, now: f64, mem: &dyn Memory) -> Decision {
        (**self).schedule(replica, now, mem)
    }
    fn preempt(
        &mut self,
        replica: usize,
        now: f64,
        mem: &dyn Memory,
        protect: ProgramId,
    ) -> Option<ProgramId> {
        (**self).preempt(replica, now, mem, protect)
    }
    fn keeps_kv_between_requests(&self) -> bool {
        (**self).keeps_kv_between_requests()
    }
    fn stats(&self) -> PolicyStats {
        (**self).stats()
    }
    fn num_waiting(&self) -> usize {
        (**self).num_waiting()
    }
    fn programs(&self) -> &ProgramTable {
        (**self).programs()
    }
    fn programs_mut(&mut self) -> &mut ProgramTable {
        (**self).programs_mut()
    }
}

/// Builds the policy selected by `config.policy`.
pub fn build_policy(config: &SchedulerConfig, num_replicas: usize) -> Box<dyn Policy> {
    match config.policy {
        PolicyKind::Program => Box::new(ProgramScheduler::new(config.clone(), num_replicas)),
        PolicyKind::Request => Box::new(RequestScheduler::new(config.clone(), num_replicas)),
    }
}
