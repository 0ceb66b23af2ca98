use crate::{GroupId, ProgramId, ToolId};

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

/// A snapshot of one program for introspection (`GET /programs`).
#[derive(Debug, Clone, PartialEq)]
pub struct ProgramInfo {
    pub id: ProgramId,
    pub phase: Phase,
    pub state: State,
    /// Current replica when active, last replica when paused.
    pub replica: Option<usize>,
    pub context_tokens: usize,
    /// Requests completed.
    pub steps: u64,
    pub waiting: bool,
    /// Its rollout group, if any.
    pub group: Option<GroupId>,
    /// The tool it said it runs (acting), if any.
    pub tool: Option<ToolId>,
}

/// The scheduler's record of a program.
#[derive(Debug, Clone)]
pub(crate) struct Program {
    pub phase: Phase,
    pub state: State,
    pub replica: Option<usize>,
    pub context_tokens: usize,
    pub in_flight: u32,
    pub acting_since: f64,
    /// When its current turn's first request arrived (turn times).
    pub request_at: f64,
    pub last_activity: f64,
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
}

impl Program {
    pub fn new(now: f64, context_tokens: usize) -> Self {
        Self {
            phase: Phase::Reasoning,
            state: State::Paused,
            replica: None,
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
        }
    }

    /// The replica on which this program counts as running (active and reasoning).
    pub fn running_on(&self) -> Option<usize> {
        match (self.state, self.phase) {
            (State::Active, Phase::Reasoning) => self.replica,
            _ => None,
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
            group: self.group,
            tool: self.tool,
        }
    }
}
