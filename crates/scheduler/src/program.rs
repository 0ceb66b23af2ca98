//! The program table: one record per program, the one place its scheduling
//! state lives (docs/design.md §2). The policy keeps the table
//! ([`crate::Policy::programs`]); the core ([`crate::ReplicaSet`]) reads it
//! and keeps the fields it owns there (the replica holding the program's KV,
//! the longest context ever computed), so no second map per program exists.

use std::collections::HashMap;

use crate::{GroupId, Park, ProgramId, ToolId};

// What the engine keeps on the record (name, siblings, release): `life.rs`.
mod life;
pub use life::{EndReason, Ended, Life};

/// What a program is doing (docs/design.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// It has a request in flight or queued: it needs the model.
    Reasoning,
    /// Its last request finished; its tool is running.
    Acting,
}

/// Whether a program's KV is resident.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Placed on a replica, KV referenced.
    Active,
    /// KV references dropped (blocks may still survive as evictable cache).
    Paused,
    /// Ended; its KV is released.
    Terminated,
}

/// Where a program is in its life, read off its record
/// ([`ProgramInfo::lifecycle`]).
///
/// ```text
/// Idle ─▶ Queued ─▶ Running ─▶ Acting ─▶ Running ─▶ … ─▶ Released
///           ▲          │          │
///           └──────────┴────┐     ▼
///                        Paused (acting, KV references dropped)
/// ```
/// A running program paused for room goes back to `Queued` with its
/// request; an acting one paused becomes `Paused` and is `Queued` again when
/// its next request arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lifecycle {
    /// Known (it joined a group) but no request has arrived yet.
    Idle,
    /// A request waits for the program's admission or restore.
    Queued,
    /// Resident, a request running.
    Running,
    /// Resident, its tool running (no request in flight).
    Acting,
    /// Not resident (its KV references dropped), no request waiting.
    Paused,
    /// Ended; its KV is released.
    Released,
}

impl Lifecycle {
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Idle => "idle",
            Lifecycle::Queued => "queued",
            Lifecycle::Running => "running",
            Lifecycle::Acting => "acting",
            Lifecycle::Paused => "paused",
            Lifecycle::Released => "released",
        }
    }
}

/// A snapshot of one program for introspection (`GET /programs`).
#[derive(Debug, Clone, PartialEq)]
pub struct ProgramInfo {
    pub id: ProgramId,
    pub phase: Phase,
    pub state: State,
    /// Current replica when active, last replica when paused.
    pub replica: Option<usize>,
    pub context_tokens: usize,
    /// Requests completed (its siblings' included).
    pub steps: u64,
    pub waiting: bool,
    /// Requests submitted and not finished.
    pub in_flight: u32,
    /// Where it is in its life (derived from the fields above).
    pub lifecycle: Lifecycle,
    /// Its rollout group, if any.
    pub group: Option<GroupId>,
    /// The tool it said it runs (acting), if any.
    pub tool: Option<ToolId>,
    /// The last keep / swap / recompute choice for its KV, while it holds.
    pub park: Option<Park>,
}

/// The scheduler's record of a program.
#[derive(Debug, Clone)]
pub(crate) struct Program {
    pub phase: Phase,
    pub state: State,
    /// Where the policy placed it: current replica when active, last one
    /// when paused (the request policy routes before admitting, so this may
    /// lead `home`).
    pub replica: Option<usize>,
    /// The replica holding its KV, resident or paused (the core's: set when
    /// a request starts there, cleared when the program ends).
    pub home: Option<usize>,
    /// Longest prefix of its context ever computed (the core's: what a
    /// restore that misses the cache recomputes).
    pub ever_computed: usize,
    pub context_tokens: usize,
    /// Requests submitted and not finished: the one count of them.
    pub in_flight: u32,
    pub acting_since: f64,
    /// When its current turn's first request arrived (turn times).
    pub request_at: f64,
    pub last_activity: f64,
    /// Requests completed, its siblings' included ([`Life::parent`]): the
    /// one count of them.
    pub steps: u64,
    /// True once it has been admitted at least once (restore vs. first admission).
    pub admitted_once: bool,
    pub waiting: bool,
    /// When it last started waiting for admission.
    pub waiting_since: f64,
    /// When it was last admitted (restored or first started): bounded
    /// waiting never pauses a program resident for less than the bound.
    pub admitted_at: f64,
    pub group: Option<GroupId>,
    /// Leading tokens shared with its group's first member.
    pub group_shared_tokens: usize,
    /// The tool its current acting phase runs, when named.
    pub tool: Option<ToolId>,
    /// Cached (shared prefix blocks, measured at) for restore-need estimates.
    pub shared_estimate: Option<(usize, f64)>,
    /// The policy's last keep / swap / recompute choice for it
    /// (`park.rs`): set when it is kept or paused, cleared when it is
    /// admitted again (or, kept, when its next request arrives).
    pub park: Option<Park>,
    /// The engine's part: name, siblings, release (`life.rs`).
    pub life: Life,
}

impl Program {
    pub fn new(now: f64, context_tokens: usize) -> Self {
        Self {
            phase: Phase::Reasoning,
            state: State::Paused,
            replica: None,
            home: None,
            ever_computed: 0,
            context_tokens,
            in_flight: 0,
            acting_since: now,
            request_at: now,
            last_activity: now,
            steps: 0,
            admitted_once: false,
            waiting: false,
            waiting_since: now,
            admitted_at: now,
            group: None,
            group_shared_tokens: 0,
            tool: None,
            shared_estimate: None,
            park: None,
            life: Life::default(),
        }
    }

    /// The replica on which this program counts as running (active and reasoning).
    pub fn running_on(&self) -> Option<usize> {
        match (self.state, self.phase) {
            (State::Active, Phase::Reasoning) => self.replica,
            _ => None,
        }
    }

    pub fn lifecycle(&self) -> Lifecycle {
        match (self.state, self.phase) {
            (State::Terminated, _) => Lifecycle::Released,
            _ if self.waiting => Lifecycle::Queued,
            (State::Active, Phase::Reasoning) => Lifecycle::Running,
            (State::Active, Phase::Acting) => Lifecycle::Acting,
            (State::Paused, _) if !self.admitted_once && self.in_flight == 0 => Lifecycle::Idle,
            (State::Paused, _) => Lifecycle::Paused,
        }
    }

    pub fn info(&self, id: ProgramId) -> ProgramInfo {
        ProgramInfo {
            id,
            phase: self.phase,
            state: self.state,
            replica: self.replica,
            context_tokens: self.context_tokens,
            steps: self.steps,
            waiting: self.waiting,
            in_flight: self.in_flight,
            lifecycle: self.lifecycle(),
            group: self.group,
            tool: self.tool,
            park: self.park,
        }
    }
}

/// Every program's record, by id.
#[derive(Debug, Clone, Default)]
pub struct ProgramTable {
    records: HashMap<ProgramId, Program>,
    /// Named programs' ids, and the last id minted (`life.rs`).
    names: HashMap<String, ProgramId>,
    last_id: u64,
}

impl ProgramTable {
    /// A snapshot of `p`'s record.
    pub fn info(&self, p: ProgramId) -> Option<ProgramInfo> {
        self.records.get(&p).map(|q| q.info(p))
    }
    /// Requests of `p` submitted and not finished.
    pub fn in_flight(&self, p: ProgramId) -> u32 {
        self.records.get(&p).map_or(0, |q| q.in_flight)
    }
    /// The replica holding `p`'s KV (resident or paused).
    pub fn home(&self, p: ProgramId) -> Option<usize> {
        self.records.get(&p).and_then(|q| q.home)
    }
    /// Programs with a record.
    pub fn len(&self) -> usize {
        self.records.len()
    }
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
    /// Every program with its requests in flight (in no particular order).
    pub fn in_flight_all(&self) -> impl Iterator<Item = (ProgramId, u32)> + '_ {
        self.records.iter().map(|(&p, q)| (p, q.in_flight))
    }
    pub(crate) fn get(&self, p: &ProgramId) -> Option<&Program> {
        self.records.get(p)
    }
    pub(crate) fn get_mut(&mut self, p: &ProgramId) -> Option<&mut Program> {
        self.records.get_mut(p)
    }
    /// `p`'s record, made by `new` when it has none.
    pub(crate) fn get_or_insert(
        &mut self,
        p: ProgramId,
        new: impl FnOnce() -> Program,
    ) -> &mut Program {
        self.records.entry(p).or_insert_with(new)
    }
    pub(crate) fn remove(&mut self, p: &ProgramId) -> Option<Program> {
        self.records.remove(p)
    }
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&ProgramId, &Program)> {
        self.records.iter()
    }
}
