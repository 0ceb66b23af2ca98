//! The per-program registry of tool resources and its reclaimer.
//!
//! A resource is owned by every program that declared it (a refcount by
//! program); when the last owner ends, it is reclaimed in the background by
//! its backend, at most `concurrency` at a time, retried with exponential
//! backoff, and its outcome (reclaimed, or failed with the reason and the
//! attempts) stays visible on the program's record and in the counters.
//!
//! The methods that start reclaims must be called inside a tokio runtime.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::Semaphore;
use tracing::{debug, error, info, warn};

use crate::backend::Backend;
use crate::error::ToolError;
use crate::resource::Resource;

#[derive(Debug, Clone)]
pub struct ReclaimConfig {
    /// Reclaims running at once.
    pub concurrency: usize,
    /// Attempts per resource before it is marked failed.
    pub max_attempts: u32,
    /// Delay before the first retry; doubles each time.
    pub backoff: Duration,
    /// Ended programs whose records stay visible (oldest forgotten first).
    pub history: usize,
}

impl Default for ReclaimConfig {
    fn default() -> Self {
        Self {
            concurrency: 8,
            max_attempts: 3,
            backoff: Duration::from_millis(200),
            history: 4096,
        }
    }
}

/// Where a resource is in its life.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum ResourceState {
    Live,
    Reclaiming,
    Reclaimed,
    Failed { reason: String },
}

struct Entry {
    owners: BTreeSet<String>,
    state: ResourceState,
    attempts: u32,
    /// When its last owner ended.
    orphaned_at: Option<Instant>,
    /// From `orphaned_at` to the end of the reclaim.
    reclaim_latency: Option<Duration>,
    /// Program records that list it (kept while any does).
    listed_by: usize,
}

struct Record {
    resources: Vec<Resource>,
    ended: Option<String>,
    /// Last declaration: an end reported as happening before it belongs to
    /// an earlier program of the same id.
    touched: Instant,
}

impl Default for Record {
    fn default() -> Self {
        Self {
            resources: Vec::new(),
            ended: None,
            touched: Instant::now(),
        }
    }
}

#[derive(Default)]
struct Inner {
    resources: HashMap<Resource, Entry>,
    programs: HashMap<String, Record>,
    /// Ended programs, oldest first, for forgetting beyond `history`.
    ended_order: VecDeque<String>,
    in_progress: usize,
}

/// A resource as `GET /programs/{id}` shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ResourceStatus {
    pub kind: &'static str,
    pub id: String,
    #[serde(flatten)]
    pub state: ResourceState,
    pub owners: Vec<String>,
    pub attempts: u32,
    pub reclaim_latency_s: Option<f64>,
}

/// A program's tool side.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProgramResources {
    pub resources: Vec<ResourceStatus>,
    /// Why the program ended (`None` while it lives).
    pub ended: Option<String>,
}

/// Counters for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ToolMetrics {
    pub reclaimed_total: u64,
    pub failed_total: u64,
    /// Declared and not yet reclaimed or failed.
    pub live: usize,
}

pub struct Registry {
    inner: Mutex<Inner>,
    backends: Vec<Arc<dyn Backend>>,
    cfg: ReclaimConfig,
    permits: Arc<Semaphore>,
    reclaimed: AtomicU64,
    failed: AtomicU64,
}

impl Registry {
    pub fn new(backends: Vec<Arc<dyn Backend>>, cfg: ReclaimConfig) -> Arc<Self> {
        let cfg = ReclaimConfig {
            concurrency: cfg.concurrency.max(1),
            max_attempts: cfg.max_attempts.max(1),
            ..cfg
        };
        info!(
            concurrency = cfg.concurrency,
            max_attempts = cfg.max_attempts,
            backoff_ms = cfg.backoff.as_millis() as u64,
            "tool resource registry"
        );
        Arc::new(Self {
            permits: Arc::new(Semaphore::new(cfg.concurrency)),
            inner: Mutex::new(Inner::default()),
            backends,
            cfg,
            reclaimed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The bookkeeping stays consistent between statements; a panic
        // elsewhere must not stop reclaiming.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn backend(&self, r: &Resource) -> Result<&Arc<dyn Backend>, ToolError> {
        self.backends
            .iter()
            .find(|b| b.handles(r))
            .ok_or_else(|| ToolError::NoBackend(r.to_string()))
    }

    /// Adds `resources` to `program` (all or none: every one is admitted by
    /// its backend first). A program that had ended is live again. Returns
    /// the admitted forms.
    pub fn declare(
        self: &Arc<Self>,
        program: &str,
        resources: Vec<Resource>,
    ) -> Result<Vec<Resource>, ToolError> {
        let mut admitted = Vec::with_capacity(resources.len());
        for r in resources {
            let b = self.backend(&r)?;
            let a = b.admit(r)?;
            debug!(program, resource = %a, backend = b.name(), "admitted");
            admitted.push(a);
        }
        admitted.sort();
        admitted.dedup();
        let mut inner = self.lock();
        if let Some(r) = admitted.iter().find(|r| {
            inner
                .resources
                .get(r)
                .is_some_and(|e| e.state == ResourceState::Reclaiming)
        }) {
            return Err(ToolError::Busy(r.to_string()));
        }
        let inner = &mut *inner;
        let rec = inner.programs.entry(program.to_string()).or_default();
        rec.touched = Instant::now();
        if let Some(why) = rec.ended.take() {
            info!(program, previously = %why, "program declares again: live again");
        }
        for r in &admitted {
            let listed = rec.resources.contains(r);
            if !listed {
                rec.resources.push(r.clone());
            }
            let e = inner.resources.entry(r.clone()).or_insert_with(|| Entry {
                owners: BTreeSet::new(),
                state: ResourceState::Live,
                attempts: 0,
                orphaned_at: None,
                reclaim_latency: None,
                listed_by: 0,
            });
            if !listed {
                e.listed_by += 1;
            }
            if !matches!(e.state, ResourceState::Live) {
                // Reclaimed or failed before: a new life.
                e.state = ResourceState::Live;
                e.attempts = 0;
                e.orphaned_at = None;
                e.reclaim_latency = None;
            }
            e.owners.insert(program.to_string());
            info!(program, resource = %r, owners = e.owners.len(), "resource declared");
        }
        Ok(admitted)
    }

    /// Adds a resource that preparation created for `program`; if the
    /// program ended meanwhile it is reclaimed at once instead of reviving
    /// the program.
    pub fn attach(self: &Arc<Self>, program: &str, r: Resource) -> Result<(), ToolError> {
        let ended = self
            .lock()
            .programs
            .get(program)
            .is_some_and(|p| p.ended.is_some());
        self.declare(program, vec![r])?;
        if ended {
            warn!(
                program,
                "program ended while its environment was prepared: reclaiming it"
            );
            self.end_program(program, "ended_during_preparation");
        }
        Ok(())
    }

    /// `program` ended: it stops owning its resources, and those it was the
    /// last owner of are reclaimed. Returns how many were queued (0 for a
    /// program the registry never heard of, or one already ended).
    pub fn end_program(self: &Arc<Self>, program: &str, reason: &str) -> usize {
        self.end_program_at(program, reason, None)
    }

    /// [`Registry::end_program`] for an end that happened at `at`: ignored
    /// if the program declared resources since (the id was reused by a new
    /// program before the end was delivered).
    pub fn end_program_at(
        self: &Arc<Self>,
        program: &str,
        reason: &str,
        at: Option<Instant>,
    ) -> usize {
        let mut queued = Vec::new();
        {
            let mut inner = self.lock();
            let inner = &mut *inner;
            let Some(rec) = inner.programs.get_mut(program) else {
                debug!(program, reason, "ended with no tool resources");
                return 0;
            };
            if rec.ended.is_some() {
                return 0;
            }
            if at.is_some_and(|t| rec.touched > t) {
                info!(
                    program,
                    reason,
                    "end of an earlier program with this id: the current one keeps its resources"
                );
                return 0;
            }
            rec.ended = Some(reason.to_string());
            for r in &rec.resources {
                let Some(e) = inner.resources.get_mut(r) else {
                    continue;
                };
                if !e.owners.remove(program) {
                    continue;
                }
                if e.owners.is_empty() && e.state == ResourceState::Live {
                    e.state = ResourceState::Reclaiming;
                    e.orphaned_at = Some(Instant::now());
                    queued.push(r.clone());
                } else if !e.owners.is_empty() {
                    debug!(program, resource = %r, still_owned_by = e.owners.len(), "shared resource kept");
                }
            }
            inner.in_progress += queued.len();
            inner.ended_order.push_back(program.to_string());
            self.forget_old(inner);
        }
        info!(
            program,
            reason,
            reclaiming = queued.len(),
            "program ended: reclaiming its tool resources"
        );
        for r in &queued {
            let me = self.clone();
            let r = r.clone();
            tokio::spawn(async move { me.reclaim(r).await });
        }
        queued.len()
    }

    /// Live programs that declared nothing for `idle` (for the server's
    /// sweep of programs the engine never ran).
    pub fn idle_live_programs(&self, idle: Duration) -> Vec<String> {
        self.lock()
            .programs
            .iter()
            .filter(|(_, r)| r.ended.is_none() && r.touched.elapsed() >= idle)
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// Ends every program still live (server shutdown).
    pub fn end_all(self: &Arc<Self>, reason: &str) -> usize {
        let live: Vec<String> = self
            .lock()
            .programs
            .iter()
            .filter(|(_, r)| r.ended.is_none())
            .map(|(p, _)| p.clone())
            .collect();
        live.iter().map(|p| self.end_program(p, reason)).sum()
    }

    fn forget_old(&self, inner: &mut Inner) {
        while inner.ended_order.len() > self.cfg.history {
            let Some(p) = inner.ended_order.pop_front() else {
                break;
            };
            // Only forget it if it did not come back to life.
            if inner.programs.get(&p).is_none_or(|r| r.ended.is_none()) {
                continue;
            }
            let Some(rec) = inner.programs.remove(&p) else {
                continue;
            };
            for r in rec.resources {
                let Some(e) = inner.resources.get_mut(&r) else {
                    continue;
                };
                e.listed_by = e.listed_by.saturating_sub(1);
                let done = matches!(
                    e.state,
                    ResourceState::Reclaimed | ResourceState::Failed { .. }
                );
                if e.listed_by == 0 && e.owners.is_empty() && done {
                    inner.resources.remove(&r);
                }
            }
        }
    }

    async fn reclaim(self: Arc<Self>, r: Resource) {
        let mut attempt = 0;
        let outcome = loop {
            attempt += 1;
            let result = {
                let Ok(_permit) = self.permits.acquire().await else {
                    break Err(ToolError::StillAlive("the reclaimer was closed".into()));
                };
                match self.backend(&r) {
                    Ok(b) => b.reclaim(&r).await,
                    Err(e) => Err(e),
                }
            };
            if let Some(e) = self.lock().resources.get_mut(&r) {
                e.attempts = attempt;
            }
            match result {
                Ok(()) => break Ok(()),
                Err(e) if e.is_retryable() && attempt < self.cfg.max_attempts => {
                    let delay = self.cfg.backoff * 2u32.saturating_pow(attempt - 1);
                    warn!(resource = %r, attempt, error = %e, retry_in_ms = delay.as_millis() as u64, "reclaim failed; retrying");
                    tokio::time::sleep(delay).await;
                }
                Err(e) => break Err(e),
            }
        };
        let mut inner = self.lock();
        inner.in_progress = inner.in_progress.saturating_sub(1);
        let Some(e) = inner.resources.get_mut(&r) else {
            return;
        };
        e.reclaim_latency = e.orphaned_at.map(|t| t.elapsed());
        let latency_ms = e.reclaim_latency.map_or(0.0, |d| d.as_secs_f64() * 1e3);
        match outcome {
            Ok(()) => {
                e.state = ResourceState::Reclaimed;
                self.reclaimed.fetch_add(1, Ordering::Relaxed);
                info!(resource = %r, attempts = attempt, latency_ms, "resource reclaimed");
            }
            Err(err) => {
                e.state = ResourceState::Failed {
                    reason: err.to_string(),
                };
                self.failed.fetch_add(1, Ordering::Relaxed);
                error!(resource = %r, attempts = attempt, error = %err, "resource could not be reclaimed");
            }
        }
    }

    /// The program's resources and their states; `None` if never declared
    /// (or forgotten).
    pub fn program(&self, program: &str) -> Option<ProgramResources> {
        let inner = self.lock();
        let rec = inner.programs.get(program)?;
        let resources = rec
            .resources
            .iter()
            .filter_map(|r| {
                let e = inner.resources.get(r)?;
                Some(ResourceStatus {
                    kind: r.kind(),
                    id: r.id(),
                    state: e.state.clone(),
                    owners: e.owners.iter().cloned().collect(),
                    attempts: e.attempts,
                    reclaim_latency_s: e.reclaim_latency.map(|d| d.as_secs_f64()),
                })
            })
            .collect();
        Some(ProgramResources {
            resources,
            ended: rec.ended.clone(),
        })
    }

    pub fn metrics(&self) -> ToolMetrics {
        let inner = self.lock();
        ToolMetrics {
            reclaimed_total: self.reclaimed.load(Ordering::Relaxed),
            failed_total: self.failed.load(Ordering::Relaxed),
            live: inner
                .resources
                .values()
                .filter(|e| matches!(e.state, ResourceState::Live | ResourceState::Reclaiming))
                .count(),
        }
    }

    /// Reclaims still running (including those waiting to retry).
    pub fn in_progress(&self) -> usize {
        self.lock().in_progress
    }

    /// Waits until no reclaim is running, up to `timeout`; true if idle.
    pub async fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.in_progress() == 0 {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
