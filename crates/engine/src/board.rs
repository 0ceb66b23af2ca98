//! What readers (`/metrics`, `/programs`) see of the engine without taking
//! its lock: a [`Snapshot`] the lock's holder publishes as it releases the
//! lock, behind a mutex of its own that guards only an `Arc` swap.
//!
//! Freshness: every acquisition of the engine lock takes the next sequence
//! number, and a snapshot carries the number of the critical section that
//! built it and how many inbox submissions had been routed by then. A
//! reader wants a snapshot at least as new as the section in progress (or
//! last finished) when it arrived, and one that includes every submission
//! pushed before it asked, so it sees every effect the client could have
//! caused or observed before asking (a submitted or finished request, a
//! release). If the latest snapshot is older, the reader asks for one and
//! waits — at most [`READ_WAIT`] — for the next section to publish it. If
//! none did (every worker in a long forward, outside the lock), the reader
//! takes the lock only if it is free, routes what the inbox holds and
//! builds the snapshot itself; if a worker holds the lock (a long critical
//! section), it answers with the latest one. A reader therefore waits at
//! most `READ_WAIT` plus one snapshot build, and never for a held lock.
//!
//! Cost: a snapshot is built only when a reader asked, and at most once per
//! [`MIN_REBUILD`]. Building walks every program (a `String` clone of its
//! name and a few hash lookups each): measured 24 µs at 96 programs and
//! 140 µs at 500 (0.28 µs a program, `Core::snapshot` on this project's
//! 2-core test machine). Built every step, that would be the largest part
//! of a step's lock time at 500 programs; built on demand at most 40 times a
//! second it costs at most 5.6 ms of lock time per second (0.56%), and only
//! while someone polls. Prometheus scraping every 15 s costs 140 µs per
//! 15 s.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::core::Core;
use crate::{MetricsSnapshot, ProgramStatus};

/// Longest a reader waits for a fresh snapshot before answering with the
/// latest one (a step of the CPU runtime at batch 32 takes ~150-400 ms, so
/// a reader arriving mid-step usually gets that step's result).
pub const READ_WAIT: Duration = Duration::from_millis(250);

/// Snapshots are built at most this often (see the module's cost note).
pub const MIN_REBUILD: Duration = Duration::from_millis(25);

/// The engine as of one critical section.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub metrics: MetricsSnapshot,
    /// Named programs, sorted by id.
    pub programs: Vec<ProgramStatus>,
}

impl Snapshot {
    /// The program named `id` (a binary search of the sorted table).
    pub fn program(&self, id: &str) -> Option<&ProgramStatus> {
        self.programs
            .binary_search_by(|p| p.id.as_str().cmp(id))
            .ok()
            .map(|i| &self.programs[i])
    }
}

struct Latest {
    /// The sequence number of the section that built it.
    seq: u64,
    /// Inbox submissions routed when it was built.
    routed: u64,
    snap: Arc<Snapshot>,
    built: Option<Instant>,
}

pub(crate) struct Board {
    /// Taken under the engine lock by each critical section.
    seq: AtomicU64,
    latest: Mutex<Latest>,
    /// A reader wants a snapshot newer than the latest.
    asked: AtomicBool,
    /// Wakes readers on each publish: blocking ones, and async ones.
    published: Condvar,
    notify: Notify,
}

impl Default for Board {
    fn default() -> Self {
        Self {
            seq: AtomicU64::new(0),
            latest: Mutex::new(Latest {
                seq: 0,
                routed: 0,
                snap: Arc::new(Snapshot::default()),
                built: None,
            }),
            asked: AtomicBool::new(false),
            published: Condvar::new(),
            notify: Notify::new(),
        }
    }
}

impl Board {
    fn latest(&self) -> MutexGuard<'_, Latest> {
        self.latest.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A critical section begins (under the engine lock): its number.
    pub fn begin(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Critical section `seq` ends (still under the lock); `routed` counts
    /// the inbox submissions routed so far. Publishes a new snapshot when a
    /// reader asked and one is due. (The section's own hold time is
    /// recorded after this, so a snapshot has the hold times of the
    /// sections before the one that built it.)
    pub fn end(&self, core: &Core, seq: u64, routed: u64) {
        let due = |l: &Latest| l.built.is_none_or(|t| t.elapsed() >= MIN_REBUILD);
        if !self.asked.load(Ordering::Acquire) || !due(&self.latest()) {
            return;
        }
        self.asked.store(false, Ordering::Release);
        self.publish(seq, routed, Arc::new(core.snapshot()));
    }

    /// Builds and publishes a snapshot now, due or not: a reader's fallback
    /// when every worker was busy outside the lock for [`READ_WAIT`] (a
    /// long forward) and so published nothing.
    pub fn publish_now(&self, core: &Core, seq: u64, routed: u64) -> Arc<Snapshot> {
        let snap = Arc::new(core.snapshot());
        self.publish(seq, routed, snap.clone());
        snap
    }

    /// Makes `snap`, built by section `seq`, the latest (unless a later
    /// section's is already) and wakes the readers.
    fn publish(&self, seq: u64, routed: u64, snap: Arc<Snapshot>) {
        let mut l = self.latest();
        if seq >= l.seq {
            *l = Latest {
                seq,
                routed,
                snap,
                built: Some(Instant::now()),
            };
        }
        drop(l);
        self.published.notify_all();
        self.notify.notify_waiters();
    }

    /// The latest snapshot if it is fresh for a reader that arrived at
    /// `target`.
    fn fresh(&self, target: Target) -> Option<Arc<Snapshot>> {
        let l = self.latest();
        target.met(&l).then(|| l.snap.clone())
    }

    /// What a reader arriving now needs; `pushed` counts the inbox
    /// submissions made so far.
    fn target(&self, pushed: u64) -> Target {
        Target {
            seq: self.seq.load(Ordering::Acquire),
            routed: pushed,
        }
    }

    fn ask(&self, kick: &impl Fn()) {
        self.asked.store(true, Ordering::Release);
        kick();
    }

    /// A snapshot fresh for a reader arriving now (see the module docs);
    /// `kick` wakes idle workers so that one publishes. `Err` with the
    /// latest one when none came within [`READ_WAIT`].
    pub async fn read(&self, pushed: u64, kick: impl Fn()) -> Result<Arc<Snapshot>, Arc<Snapshot>> {
        let target = self.target(pushed);
        let deadline = Instant::now() + READ_WAIT;
        loop {
            // Registered before the check: a publish in between still wakes it.
            let notified = self.notify.notified();
            if let Some(s) = self.fresh(target) {
                return Ok(s);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.latest().snap.clone());
            }
            self.ask(&kick);
            // Re-ask each MIN_REBUILD: a build that was not due yet is due then.
            let _ = tokio::time::timeout(left.min(MIN_REBUILD), notified).await;
        }
    }

    /// [`Board::read`] for callers outside an async runtime.
    pub fn read_blocking(
        &self,
        pushed: u64,
        kick: impl Fn(),
    ) -> Result<Arc<Snapshot>, Arc<Snapshot>> {
        let target = self.target(pushed);
        let deadline = Instant::now() + READ_WAIT;
        let mut l = self.latest();
        loop {
            if target.met(&l) {
                return Ok(l.snap.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(l.snap.clone());
            }
            drop(l);
            self.ask(&kick);
            l = self.latest();
            if target.met(&l) {
                return Ok(l.snap.clone());
            }
            l = match self.published.wait_timeout(l, left.min(MIN_REBUILD)) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
    }
}

/// The freshness a reader needs.
#[derive(Debug, Clone, Copy)]
struct Target {
    seq: u64,
    routed: u64,
}

impl Target {
    fn met(&self, l: &Latest) -> bool {
        l.seq >= self.seq && l.routed >= self.routed
    }
}
