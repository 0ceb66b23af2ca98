//! `agentd bench-model`: prefill and decode throughput of the runtime at
//! several batch sizes, against candle-transformers' stock model of the
//! family (Qwen3, Qwen3-MoE; the GLM families have none) on the same weights
//! in the same run (equal-length batches, since the stock model cannot batch
//! sequences of different lengths).

use std::path::PathBuf;
use std::time::Instant;

use agentd_models::cpu_kernels::KernelPath;
use agentd_models::loader::checkpoint_files;
use agentd_models::Model;
use agentd_runtime::sampling::argmax;
use agentd_runtime::{BatchBuilder, Family, LogitsFor};
use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use candle_transformers::models::{qwen3 as stock, qwen3_moe as stock_moe};
use clap::Args;
use rand::{Rng, SeedableRng};
use serde::Serialize;

#[derive(Args, Debug)]
pub struct BenchModelArgs {
    /// Hugging Face repository id (`owner/name`) or model directory (e.g.
    /// from `make-model --config models/qwen3-0.6b.json`).
    #[arg(long = "model", value_name = "MODEL")]
    pub model_arg: String,
    #[command(flatten)]
    pub hub: super::model_arg::HubArgs,
    /// The directory `--model` resolved to (set by [`run`]).
    #[arg(skip)]
    pub model: PathBuf,
    /// Batch sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub batch: Vec<usize>,
    /// Prompt length of every sequence.
    #[arg(long, default_value_t = 32)]
    pub prompt_len: usize,
    /// Timed decode steps per batch size.
    #[arg(long, default_value_t = 8)]
    pub decode_steps: usize,
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Skip the stock candle baseline.
    #[arg(long)]
    pub no_baseline: bool,
    /// Print the results as JSON too.
    #[arg(long)]
    pub json: bool,
    /// Only load the model, then print the checkpoint's bytes, the peak
    /// resident set while loading (VmHWM) and their ratio, and exit.
    #[arg(long)]
    pub load_only: bool,
    /// Our runtime's weight dtype (the stock baseline always widens the
    /// same file's weights to f32).
    #[command(flatten)]
    pub dtype: super::dtype::DtypeArg,
}

#[derive(Serialize, Default, Clone, Copy)]
struct Figures {
    prefill_tok_s: f64,
    decode_tok_s: f64,
}

#[derive(Serialize)]
struct Row {
    batch: usize,
    ours: Figures,
    stock: Option<Figures>,
}

/// What `--json` prints: the rows and what they were measured on.
#[derive(Serialize)]
struct Report<'a> {
    cpu: String,
    /// The CPU kernel path ours ran on (`AGENTD_CPU_KERNELS` or detected).
    cpu_kernels: &'static str,
    dtype: String,
    prompt_len: usize,
    decode_steps: usize,
    block_size: usize,
    threads: usize,
    rows: &'a [Row],
}

fn prompts(batch: usize, len: usize, vocab: usize) -> Vec<Vec<u32>> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
    (0..batch)
        .map(|_| (0..len).map(|_| rng.gen_range(0..vocab as u32)).collect())
        .collect()
}

fn bench_ours(model: &Model, a: &BenchModelArgs, batch: usize) -> Result<Figures> {
    let vocab = model.config().vocab_size;
    let mut seqs = prompts(batch, a.prompt_len, vocab);
    let bs = a.block_size;
    let per_seq = (a.prompt_len + a.decode_steps + 1).div_ceil(bs);
    let mut cache = model.new_cache(per_seq * batch, bs)?;
    let tables: Vec<Vec<u32>> = (0..batch)
        .map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect())
        .collect();
    let t = Instant::now();
    let mut b = BatchBuilder::new(bs);
    for (s, p) in seqs.iter().enumerate() {
        b.push(p, 0, &tables[s], LogitsFor::Last);
    }
    let mut logits = model.forward(&b.build(), &mut cache)?.to_vec2::<f32>()?;
    let prefill = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for _ in 0..a.decode_steps {
        let mut b = BatchBuilder::new(bs);
        for (s, seq) in seqs.iter_mut().enumerate() {
            seq.push(argmax(&logits[s]) as u32);
            b.push(
                &seq[seq.len() - 1..],
                seq.len() - 1,
                &tables[s],
                LogitsFor::Last,
            );
        }
        logits = model.forward(&b.build(), &mut cache)?.to_vec2::<f32>()?;
    }
    let decode = t.elapsed().as_secs_f64();
    Ok(Figures {
        prefill_tok_s: (batch * a.prompt_len) as f64 / prefill,
        decode_tok_s: (batch * a.decode_steps) as f64 / decode,
    })
}

/// candle-transformers' stock model of the checkpoint's family, where it
/// has one (Qwen3 and Qwen3-MoE; none for the GLM families).
enum Stock {
    Dense(stock::ModelForCausalLM),
    Moe(stock_moe::ModelForCausalLM),
}

impl Stock {
    fn forward(&mut self, input: &Tensor, offset: usize) -> candle_core::Result<Tensor> {
        match self {
            Stock::Dense(m) => m.forward(input, offset),
            Stock::Moe(m) => m.forward(input, offset),
        }
    }

    fn clear_kv_cache(&mut self) {
        match self {
            Stock::Dense(m) => m.clear_kv_cache(),
            Stock::Moe(m) => m.clear_kv_cache(),
        }
    }
}

fn bench_stock(
    model: &mut Stock,
    a: &BenchModelArgs,
    batch: usize,
    vocab: usize,
) -> Result<Figures> {
    model.clear_kv_cache();
    let seqs = prompts(batch, a.prompt_len, vocab);
    let flat: Vec<u32> = seqs.concat();
    let input = Tensor::from_vec(flat, (batch, a.prompt_len), &Device::Cpu)?;
    let t = Instant::now();
    let mut logits = model.forward(&input, 0)?.squeeze(1)?.to_vec2::<f32>()?;
    let prefill = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for step in 0..a.decode_steps {
        let next: Vec<u32> = logits.iter().map(|r| argmax(r) as u32).collect();
        let input = Tensor::from_vec(next, (batch, 1), &Device::Cpu)?;
        logits = model
            .forward(&input, a.prompt_len + step)?
            .squeeze(1)?
            .to_vec2::<f32>()?;
    }
    let decode = t.elapsed().as_secs_f64();
    model.clear_kv_cache();
    Ok(Figures {
        prefill_tok_s: (batch * a.prompt_len) as f64 / prefill,
        decode_tok_s: (batch * a.decode_steps) as f64 / decode,
    })
}

fn load_stock(dir: &std::path::Path, family: Family) -> Result<Stock> {
    let cfg_path = dir.join("config.json");
    let text =
        std::fs::read_to_string(&cfg_path).with_context(|| cfg_path.display().to_string())?;
    let bad = || format!("{}: not a config the stock model reads", cfg_path.display());
    let files = checkpoint_files(dir)?;
    // SAFETY: read-only mapping of files nobody modifies during the benchmark.
    let vb = unsafe {
        candle_nn::VarBuilder::from_mmaped_safetensors(&files, DType::F32, &Device::Cpu)?
    };
    Ok(match family {
        Family::Qwen3 => {
            let cfg: stock::Config = serde_json::from_str(&text).with_context(bad)?;
            Stock::Dense(stock::ModelForCausalLM::new(&cfg, vb)?)
        }
        Family::Qwen3Moe => {
            let cfg: stock_moe::Config = serde_json::from_str(&text).with_context(bad)?;
            Stock::Moe(stock_moe::ModelForCausalLM::new(&cfg, vb)?)
        }
        other => anyhow::bail!(
            "candle-transformers has no stock {other} model to compare with; pass --no-baseline"
        ),
    })
}

/// What `--load-only` prints.
#[derive(Serialize)]
struct LoadFigures {
    dtype: String,
    checkpoint_bytes: u64,
    weight_bytes: usize,
    peak_rss_bytes: u64,
    peak_rss_over_checkpoint: f64,
    load_s: f64,
}

/// The peak resident set of this process so far (`VmHWM`, Linux).
fn peak_rss_bytes() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")
        .context("reading /proc/self/status (peak RSS is measured on Linux only)")?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .context("no VmHWM line in /proc/self/status")?;
    Ok(kib * 1024)
}

/// `--load-only`: loading's peak memory against the checkpoint's size (the
/// issue's bound is 1.2x for a checkpoint loaded in its stored dtype).
fn load_only(a: &BenchModelArgs) -> Result<()> {
    let dtype = a.dtype.dtype;
    let mut checkpoint_bytes = 0;
    for f in checkpoint_files(&a.model)? {
        checkpoint_bytes += std::fs::metadata(&f)
            .with_context(|| f.display().to_string())?
            .len();
    }
    let t = Instant::now();
    let model = Model::load_as(&a.model, dtype)?;
    let load_s = t.elapsed().as_secs_f64();
    let peak = peak_rss_bytes()?;
    let f = LoadFigures {
        dtype: dtype.to_string(),
        checkpoint_bytes,
        weight_bytes: model.weight_bytes(),
        peak_rss_bytes: peak,
        peak_rss_over_checkpoint: peak as f64 / checkpoint_bytes.max(1) as f64,
        load_s,
    };
    println!(
        "dtype={} checkpoint={} B weights={} B peak_rss={} B ({:.2}x the checkpoint) load={:.1} s",
        f.dtype,
        f.checkpoint_bytes,
        f.weight_bytes,
        f.peak_rss_bytes,
        f.peak_rss_over_checkpoint,
        f.load_s
    );
    if a.json {
        println!("{}", serde_json::to_string(&f)?);
    }
    Ok(())
}

pub fn run(mut a: BenchModelArgs) -> Result<()> {
    // Weights and config only: no tokenizer is needed to time the model.
    a.model = a.hub.model_dir(&a.model_arg, true)?;
    if a.load_only {
        return load_only(&a);
    }
    let kernels = super::cpu::kernel_path()?;
    let dtype = a.dtype.dtype;
    tracing::info!(model = %a.model.display(), %dtype, "loading model");
    let model = Model::load_as(&a.model, dtype)?;
    let vocab = model.config().vocab_size;
    let mut baseline = if a.no_baseline {
        None
    } else {
        tracing::info!(family = %model.family(), "loading stock candle-transformers model");
        Some(load_stock(&a.model, model.family())?)
    };
    // Warm-up: first touches of weights and allocator pools.
    let warm = BenchModelArgs {
        decode_steps: 1,
        prompt_len: 4,
        ..clone_args(&a)
    };
    bench_ours(&model, &warm, 1)?;
    if let Some(m) = baseline.as_mut() {
        bench_stock(m, &warm, 1, vocab)?;
    }
    let rows = measure(&model, &a, baseline.as_mut(), vocab)?;
    print_report(&a, &rows, kernels)
}

/// Our model and (when loaded) stock candle's at each batch size.
fn measure(
    model: &Model,
    a: &BenchModelArgs,
    mut baseline: Option<&mut Stock>,
    vocab: usize,
) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &batch in &a.batch {
        let ours = bench_ours(model, a, batch)?;
        tracing::info!(
            batch,
            prefill = ours.prefill_tok_s,
            decode = ours.decode_tok_s,
            "ours"
        );
        let stock = match baseline.as_deref_mut() {
            Some(m) => {
                let f = bench_stock(m, a, batch, vocab)?;
                tracing::info!(
                    batch,
                    prefill = f.prefill_tok_s,
                    decode = f.decode_tok_s,
                    "stock"
                );
                Some(f)
            }
            None => None,
        };
        rows.push(Row { batch, ours, stock });
    }
    Ok(rows)
}

/// The table, and with `--json` the report line (naming the CPU and the
/// kernel path it ran).
fn print_report(a: &BenchModelArgs, rows: &[Row], kernels: KernelPath) -> Result<()> {
    let cpu = agentd_models::cpu_kernels::cpu_model_name();
    println!(
        "prompt_len={} decode_steps={} block_size={} threads={} cpu_kernels={kernels} cpu=\"{cpu}\"",
        a.prompt_len,
        a.decode_steps,
        a.block_size,
        rayon_threads()
    );
    println!(
        "{:>5} | {:>12} {:>12} {:>6} | {:>12} {:>12} {:>6}",
        "batch", "prefill ours", "stock", "ratio", "decode ours", "stock", "ratio"
    );
    for r in rows {
        let (sp, sd) = r
            .stock
            .map_or((f64::NAN, f64::NAN), |s| (s.prefill_tok_s, s.decode_tok_s));
        println!(
            "{:>5} | {:>12.1} {:>12.1} {:>5.2}x | {:>12.2} {:>12.2} {:>5.2}x",
            r.batch,
            r.ours.prefill_tok_s,
            sp,
            r.ours.prefill_tok_s / sp,
            r.ours.decode_tok_s,
            sd,
            r.ours.decode_tok_s / sd
        );
    }
    if a.json {
        let report = Report {
            cpu,
            cpu_kernels: kernels.name(),
            dtype: a.dtype.dtype.to_string(),
            prompt_len: a.prompt_len,
            decode_steps: a.decode_steps,
            block_size: a.block_size,
            threads: rayon_threads(),
            rows,
        };
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(())
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn clone_args(a: &BenchModelArgs) -> BenchModelArgs {
    BenchModelArgs {
        model_arg: a.model_arg.clone(),
        hub: a.hub.clone(),
        model: a.model.clone(),
        batch: a.batch.clone(),
        prompt_len: a.prompt_len,
        decode_steps: a.decode_steps,
        block_size: a.block_size,
        no_baseline: a.no_baseline,
        json: a.json,
        load_only: a.load_only,
        dtype: a.dtype,
    }
}
