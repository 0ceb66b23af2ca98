//! `agentd bench`: the agentic workload driver (crate `agentd-bench`)
//! against one or more OpenAI-compatible targets; prints a table with each
//! target's ratio to the first, writes JSON, an SVG plot and markdown.

use std::path::PathBuf;
use std::time::Duration;

use agentd_bench::{
    report, run_sweep, BenchWorkload, LevelRow, Mode, RunConfig, SessionFinal, SweepConfig, Target,
};
use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;

use super::bench_rollout::{Common, RolloutArgs};
use super::workload_args::WorkloadShapeArgs;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// NAME=URL of an OpenAI-compatible server; repeat for several (run one
    /// after another; the first is the baseline of the ratios).
    #[arg(long = "target", required_unless_present_any = ["dynamo_targets", "vllm_targets"])]
    targets: Vec<Target>,
    /// NAME=URL of an NVIDIA Dynamo frontend (run after the --target ones
    /// unless --order says otherwise):
    /// programs as Dynamo sessions (x-dynamo-session-id), token ids from
    /// nvext.engine_data (the frontend refuses return_token_ids), the
    /// serving worker of each step from nvext.worker_id (rows' `placement`).
    #[arg(long = "dynamo-target")]
    dynamo_targets: Vec<Target>,
    /// How a program's end reaches a Dynamo target: last-turn (the final
    /// header on its last call: the worker releases it), terminal (a
    /// separate one-token final request, what dynamo.thunderagent_router
    /// expects) or none.
    #[arg(long, default_value = "last-turn")]
    dynamo_final: SessionFinal,
    /// Target names, comma-separated, in the order to run them (the first is
    /// the baseline of the ratios); every target once. Default: the
    /// --target ones as given, then the --dynamo-target ones. Why: on
    /// 2-core machines the arm that runs first is often ahead, so a fair
    /// comparison runs it both ways (benches/results/ta-swe-abba/).
    #[arg(long, value_delimiter = ',')]
    order: Vec<String>,
    /// Workload preset (as in `agentd simulate`): swe or toolorch; or
    /// rollout: RL iterations of program groups with weight swaps between
    /// them (swe-shaped programs; flags under "Rollout").
    #[arg(long, default_value = "swe")]
    workload: WorkloadArg,
    /// Concurrent programs, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [4usize, 8, 16, 32, 48])]
    concurrency: Vec<usize>,
    /// Measured seconds per level.
    #[arg(long, default_value_t = 60.0)]
    duration_s: f64,
    /// Seconds at the start of each level excluded from the rates (default:
    /// 20% of --duration-s).
    #[arg(long)]
    warmup_s: Option<f64>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The first N programs join at a uniform turn of their plan, their
    /// earlier turns sent as history (stand-in outputs): the window sees
    /// steady-state program ages, not one cohort's first turns. Their first
    /// requests prefill whole contexts: give the warm-up time for that.
    #[arg(long)]
    stationary_start: bool,
    /// tokens: /v1/completions with token-id prompts (exact counts); chat:
    /// /v1/chat/completions with one word per token (approximate counts).
    #[arg(long, default_value = "tokens")]
    mode: Mode,
    /// Send whole requests instead of streaming (no TTFT).
    #[arg(long)]
    no_stream: bool,
    #[command(flatten)]
    shape: WorkloadShapeArgs,
    /// Granularity of the client's ideal cache: 1 (default) counts every
    /// reusable token; 16 floors to full blocks as vLLM's hashing does.
    #[arg(long, default_value_t = 1)]
    block_size: usize,
    /// Deadline of each request, seconds.
    #[arg(long, default_value_t = 300.0)]
    request_timeout_s: f64,
    /// Stop a target after this many errors in a row (default: max(4, concurrency)).
    #[arg(long)]
    max_consecutive_errors: Option<usize>,
    /// Exit non-zero when more errors than this occurred in total.
    #[arg(long, default_value_t = 0)]
    max_errors: usize,
    /// The `model` field (default: the first id in the target's /v1/models).
    #[arg(long)]
    model: Option<String>,
    /// Seconds to wait between levels.
    #[arg(long, default_value_t = 2.0)]
    settle_s: f64,
    /// Write {"rows": [...], ...} here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write an SVG plot (steps/min and hit rate against concurrency) here.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Write the table as markdown here.
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    no_progress: bool,
    #[command(flatten)]
    rollout: RolloutArgs,
}

/// `--workload`: a preset of the sweep, or the rollout benchmark.
#[derive(Debug, Clone)]
enum WorkloadArg {
    Preset(Box<BenchWorkload>),
    Rollout,
}

impl std::str::FromStr for WorkloadArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "rollout" => Ok(WorkloadArg::Rollout),
            s => s
                .parse::<BenchWorkload>()
                .map(|w| WorkloadArg::Preset(Box::new(w)))
                .map_err(|e| format!("{e} (or rollout)")),
        }
    }
}

impl BenchArgs {
    fn workload(&self) -> BenchWorkload {
        let mut w = match &self.workload {
            WorkloadArg::Preset(w) => (**w).clone(),
            WorkloadArg::Rollout => {
                let mut w = BenchWorkload::from(agentd_sim::Workload::swe());
                w.name = "rollout".into();
                w
            }
        };
        self.shape.apply(&mut w);
        w
    }
}

/// `targets` in the order `order` names them (unchanged when it is empty):
/// each target named exactly once, no unknown name.
fn in_order(targets: Vec<Target>, order: &[String]) -> Result<Vec<Target>> {
    if order.is_empty() {
        return Ok(targets);
    }
    let mut names: Vec<&str> = targets.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    let mut asked: Vec<&str> = order.iter().map(String::as_str).collect();
    asked.sort_unstable();
    if names != asked {
        bail!(
            "--order must name every target once: targets {:?}, --order {:?}",
            targets.iter().map(|t| &t.name).collect::<Vec<_>>(),
            order
        );
    }
    let mut targets = targets;
    // Every name is in `order` (checked above); a stable sort keeps targets
    // of one name in the order given.
    targets.sort_by_key(|t| order.iter().position(|n| n == &t.name));
    Ok(targets)
}

fn load_avg() -> Option<String> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

pub fn run(args: BenchArgs) -> Result<()> {
    if matches!(args.workload, WorkloadArg::Rollout) {
        if !args.order.is_empty() {
            bail!("--order is for the agentic sweep, not --workload rollout");
        }
        return super::bench_rollout::run(
            &args.rollout,
            Common {
                targets: &args.targets,
                workload: args.workload(),
                seed: args.seed,
                request_timeout_s: args.request_timeout_s,
                model: args.model.clone(),
                json: args.json.as_ref(),
                plot: args.plot.as_ref(),
                markdown: args.markdown.as_ref(),
            },
        );
    }
    if args.targets.is_empty() && args.dynamo_targets.is_empty() {
        bail!("--vllm-target is for --workload rollout; give --target or --dynamo-target");
    }
    if args.concurrency.is_empty() || args.concurrency.contains(&0) {
        bail!("--concurrency needs levels >= 1");
    }
    if !(args.duration_s > 0.0 && args.request_timeout_s > 0.0) {
        bail!("--duration-s and --request-timeout-s must be > 0");
    }
    let workload = args.workload();
    let targets: Vec<Target> = args
        .targets
        .iter()
        .cloned()
        .chain(args.dynamo_targets.iter().map(|t| Target {
            dynamo: Some(args.dynamo_final),
            ..t.clone()
        }))
        .collect();
    let targets = in_order(targets, &args.order)?;
    let cfg = sweep_config(&args, &workload);
    let description = describe(&workload);
    eprintln!("agentd bench: {description}");
    let load_start = load_avg();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let rows: Vec<LevelRow> = runtime.block_on(run_sweep(&targets, &cfg));
    let load_end = load_avg();
    println!("{description}");
    print!("{}", report::table(&rows).render());
    if targets.len() > 1 {
        println!("steps/min ratios between targets:");
        print!("{}", report::pair_ratios(&rows).render());
    }
    if let (Some(a), Some(b)) = (&load_start, &load_end) {
        println!("load average (1/5/15 min): start {a}, end {b}");
    }
    let loads = [load_start, load_end];
    write_outputs(&args, &cfg, &rows, &targets, &description, loads)?;
    check_errors(&rows, args.max_errors)
}

/// The sweep's configuration from the flags (warm-up 20% of the window
/// unless given; a run id from the clock).
fn sweep_config(args: &BenchArgs, workload: &BenchWorkload) -> SweepConfig {
    let warmup_s = args.warmup_s.unwrap_or(args.duration_s * 0.2);
    let run_id = format!(
        "bench-{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0)
    );
    SweepConfig {
        run: RunConfig {
            workload: workload.clone(),
            mode: args.mode,
            duration_s: args.duration_s,
            warmup_s,
            seed: args.seed,
            block_size: args.block_size,
            max_consecutive_errors: args.max_consecutive_errors,
            run_id,
            stationary_start: args.stationary_start,
        },
        concurrency: args.concurrency.clone(),
        request_timeout: Duration::from_secs_f64(args.request_timeout_s),
        stream: !args.no_stream,
        model: args.model.clone(),
        settle: Duration::from_secs_f64(args.settle_s.max(0.0)),
        progress: !args.no_progress,
    }
}

/// One line naming the workload's shape.
fn describe(workload: &BenchWorkload) -> String {
    format!(
        "{} workload: system {} tokens, task {}, turns {}, tool {} tokens, output {} tokens, tool time {}",
        workload.name,
        workload.system_tokens,
        workload.task_tokens,
        workload.turns,
        workload.tool_tokens,
        workload.output_tokens,
        workload.tool_time
    )
}

/// The JSON, plot and markdown files the flags ask for.
fn write_outputs(
    args: &BenchArgs,
    cfg: &SweepConfig,
    rows: &[LevelRow],
    targets: &[Target],
    description: &str,
    [load_start, load_end]: [Option<String>; 2],
) -> Result<()> {
    if let Some(path) = &args.json {
        let doc = json!({
            "rows": rows,
            "workload": description,
            "config": {
                "targets": targets.iter().map(|t| json!({"name": t.name, "url": t.url,
                    "dynamo_final": t.dynamo.map(|f| format!("{f:?}"))})).collect::<Vec<_>>(),
                "concurrency": args.concurrency,
                "duration_s": args.duration_s,
                "warmup_s": cfg.run.warmup_s,
                "seed": args.seed,
                "stationary_start": args.stationary_start,
                "mode": format!("{:?}", args.mode).to_lowercase(),
                "stream": !args.no_stream,
                "block_size": args.block_size,
            },
            "load_avg": {"start": load_start, "end": load_end},
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.plot {
        let title = format!("agentd bench: {}", cfg.run.workload.name);
        std::fs::write(path, report::plot(rows, &title).to_svg())
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.markdown {
        std::fs::write(path, report::markdown(rows))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// Fails the command when a target stopped on errors or the errors pass
/// `--max-errors`, after printing each level's messages.
fn check_errors(rows: &[LevelRow], max_errors: usize) -> Result<()> {
    let errors: usize = rows.iter().map(|r| r.errors).sum();
    let stopped: Vec<&str> = rows
        .iter()
        .filter(|r| r.aborted)
        .map(|r| r.target.as_str())
        .collect();
    for r in rows.iter().filter(|r| !r.error_messages.is_empty()) {
        for m in &r.error_messages {
            eprintln!("error: {} c={}: {m}", r.target, r.concurrency);
        }
    }
    if !stopped.is_empty() {
        bail!("targets stopped by errors: {}", stopped.join(", "));
    }
    if errors > max_errors {
        bail!("{errors} request errors (more than --max-errors {max_errors})");
    }
    Ok(())
}
