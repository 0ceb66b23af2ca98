//! `agentd simulate`: sweep policies × concurrency levels through the
//! discrete-event simulator, print a table with ratios against the first
//! policy, and write JSON and an SVG plot.

use std::path::PathBuf;
use std::time::Instant;

use agentd_report::{Plot, Series, Table};
use agentd_scheduler::{PolicyKind, SchedulerConfig};
use agentd_sim::{CostPreset, RunResult, SimConfig, Workload, H100_QWEN3_8B_FP8_KV_TOKENS};
use anyhow::Context;
use clap::Args;

use super::scheduler_args::SchedulerArgs;
use super::workload_args::WorkloadShapeArgs;

#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// Workload preset: swe, toolorch, bimodal (swe with 70% 0.3 s reads and
    /// 30% 20 s test runs, named to the scheduler) or long (programs joining
    /// with 1-2k-token histories, 14 turns of 32 generated tokens).
    #[arg(long, default_value = "swe")]
    workload: Workload,
    /// Concurrent programs, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [24usize, 48, 96])]
    concurrency: Vec<usize>,
    /// Policies to compare, comma-separated; the first is the baseline of the ratios.
    #[arg(long, value_delimiter = ',', default_values_t = [PolicyKind::Request, PolicyKind::Program])]
    policy: Vec<PolicyKind>,
    /// Data-parallel replicas (one KV pool each).
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// Simulated seconds per run.
    #[arg(long, default_value_t = 3600.0)]
    duration_s: f64,
    /// Simulated seconds excluded from the rates (default: 10% of the duration).
    #[arg(long)]
    warmup_s: Option<f64>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// KV capacity per replica in tokens (default: an H100 with Qwen3-8B in FP8).
    #[arg(long, default_value_t = H100_QWEN3_8B_FP8_KV_TOKENS)]
    kv_tokens: usize,
    /// Host-tier capacity per replica in tokens (0: none): evicted cached
    /// blocks are copied there and back over PCIe instead of recomputed.
    #[arg(long, default_value_t = 0)]
    host_kv_tokens: usize,
    /// Step-time model: h100 (Qwen3-8B FP8 on one H100), cpu-avx2,
    /// cpu-avx512 or cpu-portable (the CPU bench shape on a 2-core EPYC,
    /// per kernel path).
    #[arg(long, default_value = "h100")]
    cost: CostPreset,
    /// Tokens of one step's budget (max_num_batched_tokens).
    #[arg(long, default_value_t = 8192)]
    max_batched_tokens: usize,
    /// Programs per rollout group (GRPO's n samples of one task, sharing it):
    /// admitted and restored together; 1: no groups.
    #[arg(long, default_value_t = 1)]
    group_size: usize,
    /// The first N programs join at a uniform turn of their plan, their
    /// earlier turns in the first prompt as history no cache holds (as
    /// `agentd bench --stationary-start`); not with --group-size > 1.
    #[arg(long)]
    stationary_start: bool,
    /// Check the KV pool invariants after every step (slow).
    #[arg(long)]
    check_invariants: bool,
    /// Write the runs as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write an SVG plot (steps/min and hit rate against concurrency) here.
    #[arg(long)]
    plot: Option<PathBuf>,
    #[command(flatten)]
    sched: SchedulerArgs,
    /// The preset's shape changed flag for flag as `agentd bench` takes it.
    #[command(flatten)]
    shape: WorkloadShapeArgs,
}

/// The workload preset with the shape flags applied (as `agentd bench`
/// applies them), in the simulator's form.
fn workload(args: &SimulateArgs) -> anyhow::Result<Workload> {
    let mut w = args.workload.clone();
    if args.shape.any() {
        let mut shaped = agentd_bench::BenchWorkload::from(w.clone());
        args.shape.apply(&mut shaped);
        w = shaped.to_sim(w).map_err(anyhow::Error::msg)?;
        if args.shape.tool_time.is_some() {
            // A tool time given by flag replaces the preset's named tools.
            w.tools.clear();
        }
    }
    w.group_size = args.group_size.max(1);
    Ok(w)
}

pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    let base = workload(&args)?;
    let total = args.policy.len() * args.concurrency.len();
    let mut runs: Vec<RunResult> = Vec::with_capacity(total);
    let started = Instant::now();
    for &c in &args.concurrency {
        for &policy in &args.policy {
            let mut sched: SchedulerConfig = args.sched.to_config(policy);
            sched.policy = policy;
            let mut cfg = SimConfig::new(base.clone(), sched);
            cfg.concurrency = c;
            cfg.replicas = args.replicas;
            cfg.duration_s = args.duration_s;
            cfg.warmup_s = args.warmup_s.unwrap_or(args.duration_s * 0.1);
            cfg.seed = args.seed;
            cfg.kv_tokens = args.kv_tokens;
            cfg.host_kv_tokens = args.host_kv_tokens;
            cfg.block_size = args.sched.block_size;
            cfg.max_batched_tokens = args.max_batched_tokens;
            cfg.cost = args.cost.into();
            cfg.check_invariants = args.check_invariants;
            cfg.stationary_start = args.stationary_start;
            let r =
                agentd_sim::run(&cfg).with_context(|| format!("{policy} at concurrency {c}"))?;
            eprintln!(
                "[{}/{}] {:>7} c={:<4} {:>8.1} steps/min  hit {:.3}  ({:.1}s wall, {:.1}s total)",
                runs.len() + 1,
                total,
                r.policy,
                c,
                r.steps_per_min,
                r.prefix_hit_rate,
                r.wall_s,
                started.elapsed().as_secs_f64()
            );
            if r.groups_completed > 0 {
                eprintln!(
                    "        groups of {}: {} done, makespan p50 {:.1}s max {:.1}s",
                    args.group_size,
                    r.groups_completed,
                    r.group_makespan_p50_s,
                    r.group_makespan_max_s
                );
            }
            runs.push(r);
        }
    }
    print!("{}", table(&runs, &args.policy).render());
    if let Some(path) = &args.json {
        let doc = serde_json::json!({ "runs": runs });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, plot(&runs, &args).to_svg())
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn table(runs: &[RunResult], policies: &[PolicyKind]) -> Table {
    let base = policies
        .first()
        .map(ToString::to_string)
        .unwrap_or_default();
    let mut t = Table::new([
        "policy".to_string(),
        "conc".into(),
        "steps/min".into(),
        format!("x {base}"),
        "hit".into(),
        "ideal".into(),
        "recomputed".into(),
        "copied".into(),
        "pauses".into(),
        "restores".into(),
        "preempt".into(),
        "kv_imbal".into(),
        "p50_s".into(),
        "p99_s".into(),
        "max_s".into(),
        "first_p50".into(),
        "first_max".into(),
        "sched_us".into(),
    ]);
    for r in runs {
        let baseline = runs
            .iter()
            .find(|b| b.policy == base && b.concurrency == r.concurrency)
            .map_or(0.0, |b| b.steps_per_min);
        let ratio = if baseline > 0.0 {
            r.steps_per_min / baseline
        } else {
            0.0
        };
        t.row([
            r.policy.clone(),
            r.concurrency.to_string(),
            format!("{:.1}", r.steps_per_min),
            format!("{ratio:.2}"),
            format!("{:.3}", r.prefix_hit_rate),
            format!("{:.3}", r.ideal_hit_rate),
            r.recomputed_tokens.to_string(),
            r.copied_tokens.to_string(),
            r.pauses.to_string(),
            r.restores.to_string(),
            r.preemptions.to_string(),
            format!("{:.3}", r.kv_imbalance),
            format!("{:.1}", r.p50_step_s),
            format!("{:.1}", r.p99_step_s),
            format!("{:.1}", r.max_step_s),
            format!("{:.1}", r.first_p50_s),
            format!("{:.1}", r.first_max_s),
            format!("{:.2}", r.sched_us_per_step),
        ]);
    }
    t
}

fn plot(runs: &[RunResult], args: &SimulateArgs) -> Plot {
    let series = |f: fn(&RunResult) -> f64| -> Vec<Series> {
        args.policy
            .iter()
            .map(|p| Series {
                name: p.to_string(),
                points: runs
                    .iter()
                    .filter(|r| r.policy == p.to_string())
                    .map(|r| (r.concurrency as f64, f(r)))
                    .collect(),
            })
            .collect()
    };
    Plot::steps_and_hit_rate(
        format!(
            "agentd simulate: {} workload, {} cost, {} replica(s), {} KV tokens each",
            args.workload.name, args.cost, args.replicas, args.kv_tokens
        ),
        series(|r| r.steps_per_min),
        series(|r| r.prefix_hit_rate),
    )
}
