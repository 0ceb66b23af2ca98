//! `agentd bench --workload rollout`: the RL rollout benchmark (crate
//! `agentd-bench`, module `rollout`) against agentd servers (SGLang's
//! weight-swap routes) and vLLM servers (generation only); prints the
//! per-iteration table and writes JSON, markdown and an SVG plot.

use std::path::PathBuf;
use std::time::Duration;

use agentd_bench::rollout::{
    report, run_rollout, IterationRow, RolloutConfig, RolloutTarget, Surface,
};
use agentd_bench::{BenchWorkload, Target};
use agentd_models::cpu_kernels;
use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;

/// Flags of `--workload rollout` (the program shape comes from the swe
/// preset and the usual shape flags: --system-tokens, --turns, ...).
#[derive(Args, Debug)]
#[command(next_help_heading = "Rollout (--workload rollout)")]
pub struct RolloutArgs {
    /// Iterations (weight swaps between them).
    #[arg(long, default_value_t = 3)]
    pub iterations: usize,
    /// Groups per iteration (distinct tasks).
    #[arg(long, default_value_t = 4)]
    pub groups: usize,
    /// Samples per group (GRPO's n; sent as group_id / group_size).
    #[arg(long, default_value_t = 4)]
    pub group_size: usize,
    /// Checkpoint directories the --target servers alternate between,
    /// comma-separated: the first is what they serve at the start,
    /// iteration k swaps to the (k mod count)-th. None: pause and continue
    /// only.
    #[arg(long, value_delimiter = ',')]
    pub weights: Vec<PathBuf>,
    /// Evict the checkpoint's files from the page cache before the driver
    /// reads them (the swap's baseline) and again before the swap.
    #[arg(long)]
    pub cold_cache: bool,
    /// Sampling temperature (each sample and turn has its own seed, except
    /// on --vllm-target servers).
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f64,
    /// /pause_generation's mode: abort, retract or in_place.
    #[arg(long, default_value = "abort")]
    pub pause_mode: String,
    /// NAME=URL of a vLLM server: the same iterations, no weight swap
    /// (paused and resumed by its dev-mode routes when they are on).
    #[arg(long = "vllm-target")]
    pub vllm_targets: Vec<Target>,
}

/// What the rollout run takes from `agentd bench`'s shared flags.
pub struct Common<'a> {
    pub targets: &'a [Target],
    pub workload: BenchWorkload,
    pub seed: u64,
    pub request_timeout_s: f64,
    pub model: Option<String>,
    pub json: Option<&'a PathBuf>,
    pub plot: Option<&'a PathBuf>,
    pub markdown: Option<&'a PathBuf>,
}

fn check(a: &RolloutArgs, c: &Common) -> Result<()> {
    if a.iterations == 0 || a.groups == 0 || a.group_size == 0 {
        bail!("--iterations, --groups and --group-size must be >= 1");
    }
    if !["abort", "retract", "in_place"].contains(&a.pause_mode.as_str()) {
        bail!(
            "--pause-mode {:?}: expected abort, retract or in_place",
            a.pause_mode
        );
    }
    if !(c.request_timeout_s > 0.0 && a.temperature >= 0.0) {
        bail!("--request-timeout-s must be > 0 and --temperature >= 0");
    }
    for w in &a.weights {
        agentd_bench::rollout::control::weight_files(w)
            .with_context(|| format!("--weights {}", w.display()))?;
    }
    Ok(())
}

/// The CPU model and the kernel path this process selects (the servers
/// the script starts on the same machine, same environment, select it too).
fn machine() -> (String, String) {
    let path =
        cpu_kernels::selected().map_or_else(|e| format!("? ({e})"), |p| p.name().to_string());
    (cpu_kernels::cpu_model_name(), path)
}

pub fn run(a: &RolloutArgs, c: Common) -> Result<()> {
    check(a, &c)?;
    let targets = rollout_targets(a, &c);
    let run_id = format!(
        "rollout-{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0)
    );
    let about = About::new(a, &c);
    eprintln!(
        "agentd bench: {}; {}; CPU {}, kernel path {}",
        about.description, about.swaps, about.cpu, about.kernels
    );
    let cfg = RolloutConfig {
        workload: c.workload.clone(),
        iterations: a.iterations,
        groups: a.groups,
        group_size: a.group_size,
        seed: c.seed,
        temperature: a.temperature,
        weights: a.weights.clone(),
        cold_cache: a.cold_cache,
        pause_mode: a.pause_mode.clone(),
        request_timeout: Duration::from_secs_f64(c.request_timeout_s),
        model: c.model.clone(),
        run_id,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let rows = runtime.block_on(run_rollout(&targets, &cfg));
    println!(
        "{}\n{}\nCPU {}, kernel path {}",
        about.description, about.swaps, about.cpu, about.kernels
    );
    print!("{}", report::table(&rows).render());
    print!("{}", report::summary(&rows).render());
    write_reports(a, &c, &targets, &rows, &about)?;
    let errors: usize = rows.iter().map(|r| r.errors).sum();
    for r in rows.iter() {
        for m in &r.error_messages {
            eprintln!("error: {} iteration {}: {m}", r.target, r.iteration);
        }
    }
    if errors > 0 {
        bail!("{errors} programs or swaps failed");
    }
    Ok(())
}

/// The SGLang-surface targets, then the vLLM-surface ones.
fn rollout_targets(a: &RolloutArgs, c: &Common) -> Vec<RolloutTarget> {
    c.targets
        .iter()
        .map(|t| (t, Surface::Sglang))
        .chain(a.vllm_targets.iter().map(|t| (t, Surface::Vllm)))
        .map(|(t, surface)| RolloutTarget {
            name: t.name.clone(),
            url: t.url.clone(),
            surface,
        })
        .collect()
}

/// What a run's reports say it was: the workload, the weight swaps and
/// the machine.
struct About {
    description: String,
    swaps: String,
    cpu: String,
    kernels: String,
}

impl About {
    fn new(a: &RolloutArgs, c: &Common) -> Self {
        let w = &c.workload;
        let description = format!(
            "rollout: {} iterations x {} groups x {} samples, temperature {}; programs: system {} tokens, task {} (shared by a group), turns {}, tool {} tokens, output {} tokens, tool time {}; seed {}",
            a.iterations, a.groups, a.group_size, a.temperature, w.system_tokens, w.task_tokens,
            w.turns, w.tool_tokens, w.output_tokens, w.tool_time, c.seed
        );
        let swaps = if a.weights.is_empty() {
            "no weights swapped (pause and continue only)".to_string()
        } else {
            format!(
                "swaps alternate between {} ({} page cache for the read and the swap)",
                a.weights
                    .iter()
                    .map(|w| w.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                if a.cold_cache { "cold" } else { "warm" }
            )
        };
        let (cpu, kernels) = machine();
        Self {
            description,
            swaps,
            cpu,
            kernels,
        }
    }
}

/// The JSON, plot and markdown reports the flags ask for.
fn write_reports(
    a: &RolloutArgs,
    c: &Common,
    targets: &[RolloutTarget],
    rows: &[IterationRow],
    about: &About,
) -> Result<()> {
    if let Some(path) = &c.json {
        let doc = json!({
            "rows": rows,
            "workload": about.description,
            "swaps": about.swaps,
            "cpu": about.cpu,
            "kernel_path": about.kernels,
            "config": {
                "targets": targets.iter().map(|t| json!({"name": t.name, "url": t.url,
                    "surface": format!("{:?}", t.surface).to_lowercase()})).collect::<Vec<_>>(),
                "iterations": a.iterations, "groups": a.groups, "group_size": a.group_size,
                "temperature": a.temperature, "seed": c.seed, "weights": a.weights,
                "cold_cache": a.cold_cache, "pause_mode": a.pause_mode,
            },
        });
        write(path, &serde_json::to_string_pretty(&doc)?)?;
    }
    if let Some(path) = &c.plot {
        write(path, &report::plot(rows, "agentd bench: rollout").to_svg())?;
    }
    if let Some(path) = &c.markdown {
        let header = format!(
            "{}\n\n{}\n\nCPU: {}; kernel path: {}",
            about.description, about.swaps, about.cpu, about.kernels
        );
        write(path, &report::markdown(rows, &header))?;
    }
    Ok(())
}

fn write(path: &PathBuf, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
