//! Decode CUDA graphs (`--cuda-graphs`) against the eager step on the same
//! batch and cache: logits of every real row close (a padded batch may
//! take other cuBLAS algorithms, so not bit for bit), greedy tokens equal,
//! then the step's device time both ways at the 0.6B and 8B shapes, batch
//! 1/32/128, 1k-token contexts.

use std::path::Path;
use std::sync::Arc;

use agentd_cuda::{DecodeGraphs, Dtype, Gpu, GpuKvCache, GpuModel, Kernels, Result};
use agentd_models::synth::ModelCard;
use agentd_runtime::{BatchBuilder, BatchInput, LogitsFor};

use crate::{rel_l2, Report};

const BLOCK: usize = 16;
const CONTEXT: usize = 1024;

fn decode_batch(b: usize, vocab: usize) -> BatchInput {
    let per_seq = (CONTEXT + 1).div_ceil(BLOCK);
    let mut builder = BatchBuilder::new(BLOCK);
    for s in 0..b {
        let table: Vec<u32> = ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect();
        builder.push(
            &[(s * 7919 % vocab) as u32],
            CONTEXT,
            &table,
            LogitsFor::Last,
        );
    }
    builder.build()
}

fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
            if v > bv {
                (i, v)
            } else {
                (bi, bv)
            }
        })
        .0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

pub fn run(report: &mut Report) -> Result<()> {
    let gpu = Arc::new(Gpu::new_for_graphs(0)?);
    println!("\n| model | batch | eager ms | graph ms | speed-up |\n|---|---|---|---|---|");
    for card in ["models/qwen3-0.6b.json", "models/qwen3-8b.json"] {
        let cfg = ModelCard::from_file(Path::new(card))?.config;
        let model = GpuModel::random(gpu.clone(), cfg.clone(), Dtype::Bf16, 11)?;
        for b in [1usize, 32, 128] {
            let per_seq = (CONTEXT + 1).div_ceil(BLOCK);
            let mut cache: GpuKvCache = model.new_cache(b * per_seq, BLOCK)?;
            cache.fill_random(&gpu, Dtype::Bf16, 3)?;
            let batch = decode_batch(b, cfg.vocab_size);
            let eager = model.forward(&batch, &mut cache)?;
            let mut graphs = DecodeGraphs::new(512, 8192);
            let Some(out) =
                model.forward_graph(&batch, &mut cache, &mut graphs, Kernels::default())?
            else {
                report.fail(
                    &format!("graph {card} b{b}"),
                    "no graph covers the decode step",
                );
                continue;
            };
            let replayed = model.graph_logits(&out)?;
            let v = cfg.vocab_size;
            let same = eager
                .chunks(v)
                .zip(replayed.chunks(v))
                .filter(|(a, g)| argmax(a) == argmax(g))
                .count();
            let name = Path::new(card)
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or(card);
            report.check(
                &format!("graph {name} b{b}: logits vs eager"),
                rel_l2(&replayed, &eager),
                1e-2,
            );
            report.check(
                &format!("graph {name} b{b}: greedy rows differing"),
                (b - same) as f64,
                0.0,
            );
            let (mut e, mut g) = (Vec::new(), Vec::new());
            for _ in 0..20 {
                e.push(gpu.time_ms(|| model.forward_device(&batch, &mut cache).map(drop))? as f64);
                g.push(gpu.time_ms(|| {
                    model
                        .forward_graph(&batch, &mut cache, &mut graphs, Kernels::default())
                        .map(drop)
                })? as f64);
            }
            let (e, g) = (median(e), median(g));
            let line = format!("| {name} | {b} | {e:.3} | {g:.3} | {:.2}x |", e / g);
            println!("{line}");
            report.lines.push(line);
        }
    }
    Ok(())
}
