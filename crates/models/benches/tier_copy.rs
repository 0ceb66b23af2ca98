//! The host tier's copies beside the forward against before it (issue 32
//! item 5): one step that restores a paused program's context from the
//! host tier (and evicts as many blocks to it) while the batch prefills a
//! chunk of another program and decodes one token of the restored one.
//!
//! ```text
//! cargo bench -p agentd-models --bench tier_copy
//! TIER_CARDS=models/qwen3-bench.json TIER_RESTORE=256 cargo bench -p agentd-models --bench tier_copy
//! ```
//!
//! Per model card (default: the bench shapes with GQA 4 / head dim 64, GQA
//! 1 / 64 and GQA 4 / 128, random weights), restore size (blocks of 16
//! tokens) and prefill chunk, it prints the median of `TIER_ROUNDS`
//! (default 9) interleaved runs of each form, in ms: the copies alone, the
//! step alone, copies then step (`before`), and `beside`; and
//! `before / beside`. The CPU model and kernel path head the table.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use agentd_kv::{BlockCopy, BlockId};
use agentd_models::cpu_kernels;
use agentd_models::runner::LoadedModel;
use agentd_models::synth::{write_random_model, ModelCard};
use agentd_models::{BatchBuilder, BatchInput, LogitsFor, Model};

use common::{list, median};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const BS: usize = 16;

/// The workload of one measurement: `restore` blocks out and back, a
/// `chunk`-token prefill after as many cached tokens.
struct Case {
    restore: usize,
    chunk: usize,
}

impl Case {
    /// Device blocks: the restored program's context in `[0, restore)`,
    /// the evicted ones in `[restore, 2 restore)`, the prefilling
    /// program's in `[2 restore, ..)`.
    fn blocks(&self) -> usize {
        2 * self.restore + 2 * self.chunk.div_ceil(BS) + 2
    }

    fn copies(&self) -> Vec<BlockCopy> {
        let r = self.restore as u32;
        let out = (0..r).map(|b| BlockCopy::Offload {
            device: BlockId(r + b),
            host: r + b,
        });
        let back = (0..r).map(|b| BlockCopy::Onload {
            host: b,
            device: BlockId(b),
        });
        out.chain(back).collect()
    }

    fn batch(&self) -> BatchInput {
        let context = self.restore * BS - 1;
        let mut b = BatchBuilder::new(BS);
        let table: Vec<u32> = (0..self.restore as u32).collect();
        b.push(&[11], context, &table, LogitsFor::Last);
        let first = 2 * self.restore as u32;
        let blocks = 2 * self.chunk.div_ceil(BS) as u32;
        let table: Vec<u32> = (first..first + blocks).collect();
        let tokens: Vec<u32> = (0..self.chunk as u32).map(|i| 100 + i % 5000).collect();
        b.push(&tokens, self.chunk, &table, LogitsFor::Last);
        b.build()
    }
}

fn time(f: impl FnOnce() -> agentd_models::Result<()>) -> Result<f64> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

/// One row: medians of copies, step, before and beside (ms).
fn measure(model: &Arc<Model>, case: &Case, rounds: usize) -> Result<[f64; 4]> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut r = model.clone().runner("bench", case.blocks(), BS, threads)?;
    r.enable_host_tier(2 * case.restore)?;
    let (copies, batch) = (case.copies(), case.batch());
    let mut t = [(); 4].map(|_| Vec::new());
    r.step_after_copies(&copies, &batch)?; // warm-up
    for _ in 0..rounds {
        t[0].push(time(|| r.copy_blocks(&copies))?);
        t[1].push(time(|| r.step(&batch).map(drop))?);
        t[2].push(time(|| {
            r.copy_blocks(&copies)?;
            r.step(&batch).map(drop)
        })?);
        t[3].push(time(|| r.step_after_copies(&copies, &batch).map(drop))?);
    }
    Ok(t.map(median))
}

fn model_of(card: &Path, dir: &Path) -> Result<Arc<Model>> {
    let card = ModelCard::from_file(card)?;
    write_random_model(&card.config, dir, 1, None)?;
    Ok(Arc::new(Model::load(dir)?))
}

fn main() -> Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cards = list(
        "TIER_CARDS",
        "models/qwen3-bench.json,models/qwen3-bench-gqa1.json,models/qwen3-bench-gqa4-hd128.json",
    );
    let restores = list("TIER_RESTORE", "64,256");
    let chunks = list("TIER_CHUNK", "256,2048");
    let rounds = std::env::var("TIER_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(9);
    println!(
        "CPU {}; kernel path {} (AGENTD_CPU_KERNELS forces one)",
        cpu_kernels::cpu_model_name(),
        cpu_kernels::path()
    );
    println!("| card | restore blocks | chunk | copies ms | step ms | before ms | beside ms | before/beside |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let tmp = std::env::temp_dir().join(format!("agentd-tier-bench-{}", std::process::id()));
    for card in &cards {
        let dir = tmp.join(card.replace('/', "_"));
        let model = model_of(&root.join(card), &dir)?;
        for restore in &restores {
            for chunk in &chunks {
                let case = Case {
                    restore: restore.parse()?,
                    chunk: chunk.parse()?,
                };
                let [c, s, b, o] = measure(&model, &case, rounds)?;
                println!(
                    "| {card} | {restore} | {chunk} | {c:.1} | {s:.1} | {b:.1} | {o:.1} | {:.2} |",
                    b / o
                );
            }
        }
    }
    std::fs::remove_dir_all(&tmp).ok();
    Ok(())
}
