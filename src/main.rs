//! `agentd` — an LLM inference engine whose unit of scheduling is the agent program.
//!
//! Each subcommand lives in its own module under `src/cmd/`; this file only parses
//! the command line and sets up logging.

mod cmd;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "agentd",
    version,
    about = "LLM inference for agentic workloads"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// OpenAI-compatible HTTP server on the engine: `agentd serve Qwen/Qwen3-8B` (a Hugging
    /// Face repository id or a model directory; default: the embedded tiny Qwen3).
    #[command(after_help = cmd::vllm_flags::HELP)]
    Serve(Box<cmd::serve::ServeArgs>),
    /// Discrete-event simulation of the scheduler and KV allocator under agent load.
    Simulate(Box<cmd::simulate::SimulateArgs>),
    /// Write a random-weight Hugging Face model directory from a model card.
    MakeModel(cmd::make_model::MakeModelArgs),
    /// Generate from a prompt offline (no server) through the paged runtime.
    Generate(cmd::generate::GenerateArgs),
    /// Agentic benchmark of OpenAI-compatible servers (agentd, vLLM): steps/min and hit rate vs concurrency.
    Bench(Box<cmd::bench::BenchArgs>),
    /// Measure prefill/decode throughput against stock candle-transformers.
    BenchModel(cmd::bench_model::BenchModelArgs),
}

/// Runs the subcommand; a failure is one line on stderr (`error: ` and the
/// chain of causes, outermost first: e.g. the model directory, then the
/// file and tensor at fault) and exit status 1.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let line = format!("{e:#}").replace('\n', " ");
            eprintln!("error: {line}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    // vLLM's two-letter short flags (`-tp 2`), which clap's one-letter
    // shorts cannot spell: answered by the long flags they stand for.
    let cli = Cli::parse_from(std::env::args_os().map(|a| match a.to_str() {
        Some("-tp") => "--tensor-parallel-size".into(),
        Some("-pp") => "--pipeline-parallel-size".into(),
        Some("-dp") => "--data-parallel-size".into(),
        _ => a,
    }));
    let otlp = match &cli.command {
        Command::Serve(args) => args.otlp_traces_endpoint.as_deref(),
        _ => None,
    };
    // The log, and the span exporter, flushed when the command returns.
    let _telemetry = cmd::telemetry::init(otlp)?;
    match cli.command {
        Command::Serve(args) => cmd::serve::run(*args),
        Command::Simulate(args) => cmd::simulate::run(*args),
        Command::MakeModel(a) => cmd::make_model::run(a),
        Command::Generate(a) => cmd::generate::run(a),
        Command::Bench(a) => cmd::bench::run(*a),
        Command::BenchModel(a) => cmd::bench_model::run(a),
    }
}
