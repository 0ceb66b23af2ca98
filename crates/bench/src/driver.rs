//! The closed-loop driver: N programs at once against one endpoint; when a
//! program ends the next starts; a warm-up is excluded from the window.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use indicatif::ProgressBar;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::client::{Client, Mode};
use crate::conversation::Conversation;
use crate::prom::{self, Metrics};
use crate::result::{LevelRow, Sample};
use crate::workload::{ideal_hit_tokens, program_stream, BenchWorkload, ProgramPlan};

/// Everything a run needs besides the target and the concurrency.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub workload: BenchWorkload,
    pub mode: Mode,
    /// Measured seconds per level (after the warm-up).
    pub duration_s: f64,
    /// Seconds at the start of each level excluded from the rates.
    pub warmup_s: f64,
    pub seed: u64,
    /// Block size of the client's ideal-cache computation.
    pub block_size: usize,
    /// A level stops (and its target is given up) after this many errors in
    /// a row; default: max(4, concurrency).
    pub max_consecutive_errors: Option<usize>,
    /// Prefix of program ids (distinct per run so servers never mix runs).
    pub run_id: String,
    /// The first N programs join at a uniform turn of their plan, with the
    /// turns before it as history ([`ProgramPlan::join_turn`]): a window
    /// measures steady state instead of one cohort's early turns.
    pub stationary_start: bool,
}

struct Shared {
    cfg: RunConfig,
    client: Client,
    concurrency: usize,
    system: Vec<u32>,
    window_start: Instant,
    end: Instant,
    next_program: AtomicU64,
    system_seen: AtomicBool,
    samples: Mutex<Vec<Sample>>,
    /// Steps in flight: program index -> when the step was sent.
    open: Mutex<HashMap<u64, Instant>>,
    errors: AtomicUsize,
    consecutive: AtomicUsize,
    messages: Mutex<Vec<String>>,
    programs_finished: AtomicUsize,
    abort: watch::Sender<bool>,
    aborted_at: Mutex<Option<Instant>>,
}

impl Shared {
    fn stopping(&self) -> bool {
        *self.abort.borrow() || Instant::now() >= self.end
    }

    /// Resolves when the level's time is up or it was aborted.
    async fn stop_signal(&self) {
        let mut rx = self.abort.subscribe();
        tokio::select! {
            _ = tokio::time::sleep_until(self.end) => {}
            _ = rx.wait_for(|a| *a) => {}
        }
    }

    fn record_error(&self, msg: String) {
        if self.stopping() {
            // A request cut by the end of the level is not the server's fault.
            return;
        }
        let n = self.errors.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::warn!(concurrency = self.concurrency, error = %msg, "step failed");
        if let Ok(mut m) = self.messages.lock() {
            if m.len() < 5 {
                m.push(msg);
            }
        }
        let run = self.consecutive.fetch_add(1, Ordering::Relaxed) + 1;
        let limit = self
            .cfg
            .max_consecutive_errors
            .unwrap_or(self.concurrency.max(4));
        if run >= limit && !*self.abort.borrow() {
            tracing::error!(
                errors = n,
                run,
                "too many errors in a row: stopping this target"
            );
            if let Ok(mut a) = self.aborted_at.lock() {
                *a = Some(Instant::now());
            }
            if let Ok(mut m) = self.messages.lock() {
                m.push(format!("stopped after {run} consecutive errors"));
            }
            let _ = self.abort.send(true);
        }
    }
}

/// Runs one level (one target at one concurrency) and summarises it.
pub async fn run_level(
    client: &Client,
    cfg: &RunConfig,
    target: &str,
    concurrency: usize,
    bar: &ProgressBar,
) -> LevelRow {
    let start = Instant::now();
    let sh = Shared::new(client, cfg, concurrency, start);
    // Counters at the start of the window.
    let scrape = {
        let sh = sh.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep_until(sh.window_start) => sh.client.metrics().await,
                _ = async { let mut rx = sh.abort.subscribe(); let _ = rx.wait_for(|a| *a).await; } => None,
            }
        })
    };
    let ticker = spawn_ticker(&sh, bar, target, start);
    let workers: Vec<_> = (0..concurrency)
        .map(|_| tokio::spawn(worker(sh.clone())))
        .collect();
    for w in workers {
        if let Err(e) = w.await {
            sh.record_error(format!("worker task failed: {e}"));
        }
    }
    let _ = ticker.await;
    let before = scrape.await.ok().flatten();
    summarise(&sh, target, before).await
}

impl Shared {
    /// A level's shared state, its window opening `warmup_s` after `start`.
    fn new(client: &Client, cfg: &RunConfig, concurrency: usize, start: Instant) -> Arc<Self> {
        let window_start = start + Duration::from_secs_f64(cfg.warmup_s);
        let (abort, _) = watch::channel(false);
        Arc::new(Shared {
            cfg: cfg.clone(),
            client: client.clone(),
            concurrency,
            system: cfg.workload.system_prompt(),
            window_start,
            end: window_start + Duration::from_secs_f64(cfg.duration_s),
            next_program: AtomicU64::new(0),
            system_seen: AtomicBool::new(false),
            samples: Mutex::new(Vec::new()),
            open: Mutex::new(HashMap::new()),
            errors: AtomicUsize::new(0),
            consecutive: AtomicUsize::new(0),
            messages: Mutex::new(Vec::new()),
            programs_finished: AtomicUsize::new(0),
            abort,
            aborted_at: Mutex::new(None),
        })
    }
}

/// The progress bar of a level, updated every 250 ms until it stops.
fn spawn_ticker(
    sh: &Arc<Shared>,
    bar: &ProgressBar,
    target: &str,
    start: Instant,
) -> tokio::task::JoinHandle<()> {
    let sh = sh.clone();
    let bar = bar.clone();
    let cfg = &sh.cfg;
    let total = (cfg.warmup_s + cfg.duration_s).max(0.001);
    bar.set_length(1000);
    bar.set_position(0);
    let target = target.to_string();
    tokio::spawn(async move {
        loop {
            let el = start.elapsed().as_secs_f64();
            bar.set_position(((el / total).min(1.0) * 1000.0) as u64);
            let steps = sh.samples.lock().map(|s| s.len()).unwrap_or(0);
            bar.set_message(format!(
                "{target} c={}: {steps} steps, {} errors{}",
                sh.concurrency,
                sh.errors.load(Ordering::Relaxed),
                if Instant::now() < sh.window_start {
                    " (warm-up)"
                } else {
                    ""
                }
            ));
            if sh.stopping() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
}

/// The level's row from the steps that finished in its window (cut short
/// where the level aborted), the server's counters over it (`before` and
/// now), and the steps still open when it closed.
async fn summarise(sh: &Shared, target: &str, before: Option<Metrics>) -> LevelRow {
    let (window_start, end) = (sh.window_start, sh.end);
    let after = if before.is_some() {
        sh.client.metrics().await
    } else {
        None
    };
    let aborted_at = sh.aborted_at.lock().ok().and_then(|a| *a);
    let window_end = aborted_at.map_or(end, |a| a.min(end));
    let window_s = window_end
        .saturating_duration_since(window_start)
        .as_secs_f64();
    let samples = sh.samples.lock().map(|s| s.clone()).unwrap_or_default();
    let measured: Vec<Sample> = samples
        .into_iter()
        .filter(|s| s.finished >= window_start && s.finished <= window_end)
        .collect();
    let counters = match (&before, &after) {
        (Some(b), Some(a)) => Some(Counters::between(b, a)),
        _ => None,
    };
    // Cut by the level's end mid-step: open when the window closed.
    let open: Vec<f64> = sh
        .open
        .lock()
        .map(|o| {
            o.values()
                .filter(|&&t| t < window_end)
                .map(|&t| window_end.saturating_duration_since(t).as_secs_f64())
                .collect()
        })
        .unwrap_or_default();
    LevelRow::summarise(
        target,
        sh.concurrency,
        window_s,
        &measured,
        &open,
        counters.as_ref().map(Counters::as_json),
        sh.errors.load(Ordering::Relaxed),
        sh.programs_finished.load(Ordering::Relaxed),
        aborted_at.is_some(),
        sh.messages.lock().map(|m| m.clone()).unwrap_or_default(),
    )
}

/// Server counter deltas over the window (or a rollout iteration).
pub(crate) struct Counters {
    hits: Option<f64>,
    queries: Option<f64>,
    preemptions: Option<f64>,
    recomputed: Option<f64>,
    pauses: Option<f64>,
    /// Restores, pauses forced by running out of blocks mid-decode, and the
    /// batches' fill (planned tokens over their budget): where the
    /// throughput goes past the knee (agentd only; `None` for vLLM).
    restores: Option<f64>,
    exhaustion: Option<f64>,
    batch_fill: Option<f64>,
}

impl Counters {
    pub(crate) fn between(b: &Metrics, a: &Metrics) -> Counters {
        Counters {
            hits: a.delta(b, prom::PREFIX_HITS),
            queries: a.delta(b, prom::PREFIX_QUERIES),
            preemptions: a.delta(b, prom::PREEMPTIONS),
            recomputed: a.delta(b, prom::RECOMPUTED),
            pauses: a.delta(b, prom::PAUSES),
            restores: a.delta(b, prom::RESTORES),
            exhaustion: a.delta(b, prom::EXHAUSTION),
            batch_fill: match (
                a.delta(b, prom::BATCH_TOKENS),
                a.delta(b, prom::BATCH_BUDGET),
            ) {
                (Some(t), Some(budget)) if budget > 0.0 => Some(t / budget),
                _ => None,
            },
        }
    }

    pub(crate) fn as_json(&self) -> Value {
        json!({"hits": self.hits, "queries": self.queries, "preemptions": self.preemptions,
               "recomputed": self.recomputed, "pauses": self.pauses,
               "restores": self.restores, "exhaustion_preemptions": self.exhaustion,
               "batch_fill": self.batch_fill})
    }
}

async fn worker(sh: Arc<Shared>) {
    while !sh.stopping() {
        let idx = sh.next_program.fetch_add(1, Ordering::Relaxed);
        let plan = sh
            .cfg
            .workload
            .plan(program_stream(sh.cfg.seed, sh.concurrency as u64, idx));
        let pid = format!("{}-c{}-p{idx}", sh.cfg.run_id, sh.concurrency);
        let first_cohort = idx < sh.concurrency as u64;
        let join = if sh.cfg.stationary_start && first_cohort {
            plan.join_turn()
        } else {
            0
        };
        let ok = tokio::select! {
            r = run_program(&sh, idx, &pid, &plan, join) => Some(r),
            _ = sh.stop_signal() => None,
        };
        if sh.client.dynamo.is_some() {
            // A Dynamo frontend has no release route: the session's final
            // flag ends the program (on its last turn, or here).
            if let Some(&first) = sh.system.first() {
                sh.client.end_session(&pid, first).await;
            }
        } else {
            sh.client.release(&pid).await;
        }
        match ok {
            Some(true) => {
                sh.programs_finished.fetch_add(1, Ordering::Relaxed);
            }
            Some(false) => {
                // Do not spin against a failing server.
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = sh.stop_signal() => {}
                }
            }
            None => break,
        }
    }
}

/// Runs the program's turns from turn `join` (the turns before it become
/// history with stand-in outputs); false on the first failed step.
async fn run_program(sh: &Shared, idx: u64, pid: &str, plan: &ProgramPlan, join: usize) -> bool {
    let block = sh.cfg.block_size;
    let mut conv = Conversation::new(sh.cfg.mode, &sh.system);
    let history = plan.stand_in_outputs(join, sh.cfg.workload.vocab);
    for (turn, output) in plan.turns.iter().zip(history) {
        conv.history(&turn.appended, &output);
    }
    // Prompt tokens of the previous context an unlimited cache would keep
    // (none of a joined program's history was ever computed).
    let mut own = 0usize;
    for (i, turn) in plan.turns.iter().enumerate().skip(join) {
        let last = i + 1 == plan.turns.len();
        let seen = sh.system_seen.swap(true, Ordering::Relaxed);
        let shared = if seen {
            sh.cfg.workload.system_tokens
        } else {
            0
        };
        let started = Instant::now();
        if let Ok(mut o) = sh.open.lock() {
            o.insert(idx, started);
        }
        conv.user(&turn.appended);
        let reply = sh
            .client
            .step(pid, conv.prompt(), turn.output_tokens, last)
            .await;
        let finished = Instant::now();
        if let Ok(mut o) = sh.open.lock() {
            o.remove(&idx);
        }
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                sh.record_error(e.to_string());
                return false;
            }
        };
        let prompt_tokens = conv.prompt_tokens(&reply);
        if let Some(e) = conv.inexact(turn.output_tokens, prompt_tokens, &reply) {
            sh.record_error(e);
            return false;
        }
        sh.consecutive.store(0, Ordering::Relaxed);
        let ideal = ideal_hit_tokens(prompt_tokens, shared, own, block);
        if let Ok(mut s) = sh.samples.lock() {
            s.push(Sample {
                started,
                finished,
                prompt_tokens,
                completion_tokens: reply.completion_tokens,
                cached_tokens: reply.cached_tokens,
                ideal_hit_tokens: ideal,
                ttft_s: reply.ttft_s,
                program: idx,
                worker: reply.worker,
                first: i == join,
            });
        }
        own = prompt_tokens + reply.completion_tokens.saturating_sub(1);
        conv.assistant(&reply);
        if turn.tool_time_s > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(turn.tool_time_s)).await;
        }
    }
    true
}
