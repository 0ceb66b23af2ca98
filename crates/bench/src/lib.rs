//! `agentd bench`: an agentic workload driver for any OpenAI-compatible
//! endpoint (agentd, vLLM).
//!
//! Programs share a system prompt, then run T turns: append a tool output,
//! generate exactly O tokens (`max_tokens` + `ignore_eos`), sleep a tool
//! time. N programs run at once (closed loop); each target is swept over
//! the concurrency levels with the same seeds, and each level reports
//! steps/min, output tok/s, step latency and TTFT percentiles, the prefix
//! hit rate (from `/metrics` deltas and from `cached_tokens`) against the
//! ideal an unlimited cache would reach, preemptions and errors.
//!
//! - [`workload`]: presets (mirroring the simulator's), program plans, the
//!   ideal hit rate; [`dist`]: tool-time and token-count distributions.
//! - [`client`]: the HTTP client (token-id completions or chat, streamed or
//!   not, deadlines); [`prom`]: Prometheus text parsing.
//! - [`driver`]: one level; [`result`]: its summary row; [`report`]: the
//!   table, markdown and SVG plot.
//! - [`rollout`]: the RL rollout benchmark (iterations of groups, weight
//!   swaps between them).

pub mod client;
mod conversation;
pub mod dist;
pub mod driver;
pub mod prom;
pub mod report;
pub mod result;
pub mod rollout;
pub mod workload;

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

pub use client::{Client, ClientError, Mode, SessionFinal};
pub use dist::{Count, CountArg, ToolTime};
pub use driver::RunConfig;
pub use result::LevelRow;
pub use workload::BenchWorkload;

/// One endpoint under test.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub name: String,
    pub url: String,
    /// An NVIDIA Dynamo frontend (see [`client`]): how its programs end.
    pub dynamo: Option<SessionFinal>,
}

impl std::str::FromStr for Target {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, url) = s
            .split_once('=')
            .ok_or_else(|| format!("target {s:?}: expected NAME=URL"))?;
        if name.is_empty() || !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!("target {s:?}: expected NAME=http://HOST:PORT"));
        }
        Ok(Target {
            name: name.to_string(),
            url: url.trim_end_matches('/').to_string(),
            dynamo: None,
        })
    }
}

/// Sweep settings shared by all targets.
#[derive(Debug, Clone)]
pub struct SweepConfig {
    pub run: RunConfig,
    pub concurrency: Vec<usize>,
    /// Per-request deadline.
    pub request_timeout: Duration,
    pub stream: bool,
    /// The `model` field; default: the first id of the target's `/v1/models`.
    pub model: Option<String>,
    /// Pause between levels so the server drains cancelled work.
    pub settle: Duration,
    pub progress: bool,
}

/// Runs every target over every level, one after another; returns the rows
/// (a target that is unreachable or fails mid-run gets rows saying so, and
/// its remaining levels are skipped).
pub async fn run_sweep(targets: &[Target], cfg: &SweepConfig) -> Vec<LevelRow> {
    let mut rows = Vec::new();
    let bar = if cfg.progress {
        ProgressBar::new(1000)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    for t in targets {
        let mut client = match Client::new(&t.url, cfg.request_timeout, cfg.stream) {
            Ok(c) => c,
            Err(e) => {
                for &c in &cfg.concurrency {
                    rows.push(LevelRow::failed(&t.name, c, e.to_string()));
                }
                continue;
            }
        };
        client.dynamo = t.dynamo;
        if let Err(e) = client.use_model(cfg.model.as_ref()).await {
            tracing::error!(target = %t.name, error = %e, "target unreachable");
            say(&bar, format!("{}: unreachable: {e}", t.name));
            for &c in &cfg.concurrency {
                rows.push(LevelRow::failed(&t.name, c, e.to_string()));
            }
            continue;
        }
        tracing::info!(target = %t.name, url = %t.url, model = %client.model, "benchmarking");
        for (i, &c) in cfg.concurrency.iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(cfg.settle).await;
            }
            let row = driver::run_level(&client, &cfg.run, &t.name, c, &bar).await;
            say(&bar, format!(
                "{} c={}: {:.1} steps/min, hit {:.3} (ideal {:.3}), p50 {:.2}s p99 {:.2}s, {} errors",
                row.target,
                row.concurrency,
                row.steps_per_min,
                row.prefix_hit_rate,
                row.ideal_hit_rate,
                row.p50_step_s,
                row.p99_step_s,
                row.errors
            ));
            if let Some(p) = &row.placement {
                say(
                    &bar,
                    format!(
                        "{} c={}: steps per worker {:?}, programs per worker {:?}, {} programs split across workers",
                        row.target, row.concurrency, p.steps, p.programs, p.split_programs
                    ),
                );
            }
            let stop = row.aborted;
            rows.push(row);
            if stop {
                say(
                    &bar,
                    format!(
                        "{}: stopped by errors; skipping its remaining levels",
                        t.name
                    ),
                );
                break;
            }
        }
    }
    bar.finish_and_clear();
    rows
}

/// A line above the progress bar, or on stderr when there is no bar (not a
/// terminal, or --no-progress).
fn say(bar: &ProgressBar, msg: String) {
    if bar.is_hidden() {
        eprintln!("{msg}");
    } else {
        bar.println(msg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        let t: Target = "vllm=http://127.0.0.1:8000/".parse().unwrap();
        assert_eq!(t.name, "vllm");
        assert_eq!(t.url, "http://127.0.0.1:8000");
        assert_eq!(t.dynamo, None);
        assert!("nourl".parse::<Target>().is_err());
        assert!("a=ftp://x".parse::<Target>().is_err());
        assert!("=http://x".parse::<Target>().is_err());
    }
}
