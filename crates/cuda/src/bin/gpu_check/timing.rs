//! Decode step time at real model shapes against the HBM roofline: a decode
//! step must read every weight once and each sequence's whole KV context, so
//! (weight bytes + KV bytes) / measured copy bandwidth is its floor.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use agentd_cuda::{Dtype, Gpu, GpuModel, Kernels, Result, StepOpts};
use agentd_models::synth::ModelCard;
use agentd_runtime::{BatchBuilder, LogitsFor};

use crate::Report;

const BLOCK: usize = 16;
const CARDS: [&str; 2] = ["models/qwen3-0.6b.json", "models/qwen3-8b.json"];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Device-to-device copy bandwidth (bytes read + written per second).
fn bandwidth(gpu: &Gpu) -> Result<f64> {
    let n = 1usize << 30; // 2 GiB of u16
    let src = gpu.zeros::<u16>(n)?;
    gpu.fill_uniform(Dtype::Bf16, gpu.ptr(&src, 0), n, 7, -1.0, 1.0)?;
    let mut dst = gpu.zeros::<u16>(n)?;
    gpu.copy(&src, &mut dst)?;
    let mut times = Vec::new();
    for _ in 0..10 {
        times.push(gpu.time_ms(|| gpu.copy(&src, &mut dst))? as f64);
    }
    Ok(2.0 * (n * 2) as f64 / (median(times) / 1e3))
}

pub fn run(gpu: &Arc<Gpu>, batches: &[usize], context: usize, report: &mut Report) -> Result<()> {
    let bw = bandwidth(gpu)?;
    println!(
        "\ndevice copy bandwidth: {:.2} TB/s (read + write)",
        bw / 1e12
    );
    let mut table = vec![format!(
        "{:<12} {:>5} {:>6} {:>10} {:>10} {:>7} {:>10} {:>9} {:>8} {:>7}",
        "model",
        "batch",
        "ctx",
        "device ms",
        "floor ms",
        "ratio",
        "+logits ms",
        "tok/s",
        "1p ms",
        "1p ratio"
    )];
    // The same step with the single-pass decode attention (--single-pass-decode).
    let one_pass = StepOpts {
        tier: None,
        kernels: Kernels {
            single_pass_decode: true,
            ..Kernels::default()
        },
    };
    let mut prefill = vec![format!(
        "{:<12} {:>7} {:>10} {:>9} {:>10}",
        "model", "tokens", "device ms", "TFLOP/s", "tok/s"
    )];
    for card in CARDS {
        let cfg = ModelCard::from_file(Path::new(card))?.config;
        let name = Path::new(card)
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or(card)
            .to_string();
        println!("building {name} with random weights on the device...");
        let model = GpuModel::random(gpu.clone(), cfg.clone(), Dtype::Bf16, 11)?;
        let kv_bytes_per_token =
            2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2;
        for &b in batches {
            let per_seq = (context + 1).div_ceil(BLOCK);
            let mut cache = model.new_cache(b * per_seq, BLOCK)?;
            cache.fill_random(gpu, Dtype::Bf16, 3)?;
            let mut builder = BatchBuilder::new(BLOCK);
            let tables: Vec<Vec<u32>> = (0..b)
                .map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect())
                .collect();
            for (s, table) in tables.iter().enumerate() {
                builder.push(
                    &[(s * 7919 % cfg.vocab_size) as u32],
                    context,
                    table,
                    LogitsFor::Last,
                );
            }
            let batch = builder.build();
            for _ in 0..3 {
                model.forward(&batch, &mut cache)?;
            }
            let (mut dev, mut wall, mut dev1p) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..20 {
                let f = || {
                    model
                        .forward_device_after(&batch, &mut cache, one_pass)
                        .map(drop)
                };
                dev1p.push(gpu.time_ms(f)? as f64 / 1e3);
                dev.push(
                    gpu.time_ms(|| model.forward_device(&batch, &mut cache).map(|_| ()))? as f64
                        / 1e3,
                );
                let t0 = Instant::now();
                model.forward_rows(&batch, &mut cache)?;
                wall.push(t0.elapsed().as_secs_f64());
            }
            let (step, full, step1p) = (median(dev), median(wall), median(dev1p));
            let bytes = model.weight_bytes_per_step() + b * (context + 1) * kv_bytes_per_token;
            let floor = bytes as f64 / bw;
            let line = format!(
                "{:<12} {:>5} {:>6} {:>10.3} {:>10.3} {:>7.2} {:>10.3} {:>9.0} {:>8.3} {:>7.2}",
                name,
                b,
                context + 1,
                step * 1e3,
                floor * 1e3,
                step / floor,
                (full - step).max(0.0) * 1e3,
                b as f64 / step,
                step1p * 1e3,
                step1p / floor
            );
            println!("{line}");
            table.push(line);
        }
        // Prefill: one sequence of `context` new tokens.
        let tokens = context.max(1);
        let blocks = tokens.div_ceil(BLOCK);
        let mut cache = model.new_cache(blocks, BLOCK)?;
        let ids: Vec<u32> = (0..tokens)
            .map(|i| (i * 31 % cfg.vocab_size) as u32)
            .collect();
        let table: Vec<u32> = (0..blocks as u32).collect();
        let mut builder = BatchBuilder::new(BLOCK);
        builder.push(&ids, 0, &table, LogitsFor::Last);
        let batch = builder.build();
        model.forward(&batch, &mut cache)?;
        let mut dev = Vec::new();
        for _ in 0..5 {
            dev.push(
                gpu.time_ms(|| model.forward_device(&batch, &mut cache).map(|_| ()))? as f64 / 1e3,
            );
        }
        let step = median(dev);
        let params = model.weight_bytes_per_step() as f64 / 2.0;
        let line = format!(
            "{:<12} {:>7} {:>10.3} {:>9.1} {:>10.0}",
            name,
            tokens,
            step * 1e3,
            2.0 * params * tokens as f64 / step / 1e12,
            tokens as f64 / step
        );
        println!("prefill {line}");
        prefill.push(line);
    }
    println!("\ndecode step vs HBM floor (device time by CUDA events; +logits: the f32 logits rows a host sampler needs, through pinned memory):");
    for l in &table {
        println!("{l}");
    }
    println!("\nprefill (one sequence; matmul FLOPs 2 x params x tokens, attention excluded):");
    for l in &prefill {
        println!("{l}");
    }
    report.lines.extend(table);
    report.lines.extend(prefill);
    Ok(())
}
