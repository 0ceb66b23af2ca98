//! Submissions on their way to the workers. The caller's thread validates a
//! request and builds its sampler (penalty setup over the whole prompt,
//! grammar start: O(prompt)), then pushes it here under a lock of its own
//! that only ever guards a `Vec` push or swap; the first worker to plan
//! drains it under the engine lock and does the routing and prefix matching
//! there. So an HTTP thread never waits for the engine lock to submit, and
//! never matches a 100k-token prompt against the prefix cache itself.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use agentd_runtime::SequenceSampler;
use agentd_scheduler::{GroupId, ToolId};
use tokio::sync::mpsc::UnboundedSender;

use crate::core::Signals;
use crate::{EngineError, Event};

/// One validated request, with its sampler built.
pub(crate) struct Submitted {
    pub program: Option<String>,
    pub prompt: Vec<u32>,
    pub sampler: SequenceSampler,
    pub final_request: bool,
    pub parent_program: Option<String>,
    pub cache_salt: u64,
    /// The request's group (hashed name, announced size).
    pub group: Option<(GroupId, Option<usize>)>,
    /// The tool the program runs once this request finishes (hashed name).
    pub tool: Option<ToolId>,
    pub tx: UnboundedSender<Event>,
    pub signals: Arc<Signals>,
    /// When it was submitted: its queue wait counts the inbox too.
    pub arrived: Instant,
    /// Its program was released while it waited here: it ends cancelled,
    /// as it would have had it reached the engine before the release.
    pub released: Released,
    /// Its `request` span ([`crate::trace`]).
    pub span: tracing::Span,
}

/// What a release that found a submission in the inbox left on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    No,
    /// Cancel it; the engine already announced the program's end.
    Cancel,
    /// Cancel it and announce the end: the program existed only here.
    CancelAndAnnounce,
}

#[derive(Default)]
struct State {
    items: Vec<Submitted>,
    /// Requests the policy had queued when the engine lock was last
    /// released (`Policy::num_waiting`).
    queued: usize,
    /// Submissions taken by a worker and not yet routed: they count as
    /// waiting until the policy's count includes them.
    draining: usize,
    /// Submissions ever pushed, and ever taken by a worker (a reader's
    /// snapshot must include every submission made before it asked).
    pushed: u64,
    taken: u64,
    closed: bool,
}

impl State {
    fn waiting(&self) -> usize {
        self.queued + self.draining + self.items.len()
    }
}

/// The submissions not yet seen by a worker.
#[derive(Default)]
pub(crate) struct Inbox(Mutex<State>);

impl Inbox {
    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing here can panic while holding it; recover anyway.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Early refusals before the caller spends O(prompt) on a sampler.
    pub fn check(&self, limit: usize) -> Result<(), EngineError> {
        refuse(&self.state(), limit)
    }

    /// Queues `s`, or refuses it: shutting down, or `limit` requests already
    /// wait (queued by the policy, or submitted and not yet routed — the
    /// back-pressure counts both, so a burst cannot overshoot the limit).
    pub fn push(&self, s: Submitted, limit: usize) -> Result<(), EngineError> {
        let mut st = self.state();
        refuse(&st, limit)?;
        st.items.push(s);
        st.pushed += 1;
        Ok(())
    }

    /// Takes every submission, in arrival order (called under the engine
    /// lock; [`Inbox::settle`] ends the drain).
    pub fn take(&self) -> Vec<Submitted> {
        self.take_up_to(usize::MAX)
    }

    /// Takes the `n` oldest submissions, in arrival order (called under
    /// the engine lock, which is released after routing them:
    /// [`Inbox::settle`] ends the drain).
    pub fn take_up_to(&self, n: usize) -> Vec<Submitted> {
        let mut st = self.state();
        let items: Vec<Submitted> = if n >= st.items.len() {
            std::mem::take(&mut st.items)
        } else {
            st.items.drain(..n).collect()
        };
        st.draining += items.len();
        st.taken += items.len() as u64;
        items
    }

    /// Called as the engine lock is released: the policy now queues
    /// `queued` requests and every drained submission is routed.
    pub fn settle(&self, queued: usize) {
        let mut st = self.state();
        st.queued = queued;
        st.draining = 0;
    }

    /// A release of `program` (called under the engine lock, so no worker
    /// drains meanwhile): every submission of it still here ends cancelled.
    /// `announced` says whether the engine already ended the program; if
    /// not, the first such submission announces its end. True if any was
    /// found.
    pub fn release(&self, program: &str, announced: bool) -> bool {
        let mut st = self.state();
        let mut found = false;
        for s in st
            .items
            .iter_mut()
            .filter(|s| s.program.as_deref() == Some(program) && s.released == Released::No)
        {
            s.released = if announced || found {
                Released::Cancel
            } else {
                Released::CancelAndAnnounce
            };
            found = true;
        }
        found
    }

    /// Submissions ever pushed.
    pub fn pushed(&self) -> u64 {
        self.state().pushed
    }

    /// Submissions ever taken by a worker: under the engine lock, all of
    /// them are routed already.
    pub fn taken(&self) -> u64 {
        self.state().taken
    }

    /// Later submissions are refused with `ShuttingDown`.
    pub fn close(&self) {
        self.state().closed = true;
    }
}

fn refuse(st: &State, limit: usize) -> Result<(), EngineError> {
    if st.closed {
        return Err(EngineError::ShuttingDown);
    }
    let waiting = st.waiting();
    if waiting >= limit {
        return Err(EngineError::Overloaded { waiting, limit });
    }
    Ok(())
}
