//! Decode attention over a long paged context, timed alone on every kernel
//! path the CPU has: one layer's `paged_attention_on` for a batch of decode
//! tokens, each over `ctx` cached tokens spread over shuffled blocks of a
//! pool larger than the batch (as the engine's allocator leaves them).
//!
//! ```text
//! cargo bench -p agentd-models --bench attention_decode
//! ATTN_CTX=4096 ATTN_BATCH=32 ATTN_PATHS=avx512,avx2 cargo bench -p agentd-models --bench attention_decode
//! ```
//!
//! Why a bench of its own: at 4k-token contexts a decode step of the bench
//! shapes is mostly this kernel (`perf` on `agentd bench-model`, batch 32),
//! and it streams K and V once per step, so its rate is read against the
//! machine's memory bandwidth: the table gives µs per call and the K/V bytes
//! read per second. Shapes: GQA 1 with head dim 64 and GQA 4 with head dim
//! 128 (the bench cards'), block sizes 16 and 32. Each cell is the median
//! of `ATTN_ROUNDS` (default 5) rounds with the paths interleaved, each
//! round's figure the median of at least 5 calls.

mod common;

use std::time::Duration;

use agentd_models::attention::{paged_attention_on, AttentionShape};
use agentd_models::cpu_kernels::KernelPath;
use agentd_models::{BatchBuilder, BatchInput, KvCacheConfig, LogitsFor, PagedKvCache};

use common::{list, median, median_secs};

/// At least this long of calls per cell and path (and at most `MAX_CALLS`).
const MIN_TIME: Duration = Duration::from_millis(200);
const MAX_CALLS: usize = 100;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// (query heads, KV heads, head dim): the two bench cards' attention.
const SHAPES: [(usize, usize, usize); 2] = [(8, 8, 64), (8, 2, 128)];

/// One cell: a filled cache and a decode batch over it.
struct Cell {
    cache: PagedKvCache,
    batch: BatchInput,
    q: Vec<f32>,
    shape: AttentionShape,
    /// K and V bytes one call reads.
    bytes: f64,
}

/// `batch` sequences of `ctx` tokens over a pool of 1.5x their blocks,
/// block ids shuffled (a fixed-seed LCG: the same layout every run).
fn cell(shape: (usize, usize, usize), bs: usize, ctx: usize, batch: usize) -> Result<Cell> {
    let (h, kvh, d) = shape;
    let per_seq = ctx.div_ceil(bs);
    let num_blocks = (per_seq * batch * 3).div_ceil(2) + 1;
    let cfg = KvCacheConfig {
        num_layers: 1,
        num_blocks,
        block_size: bs,
        num_kv_heads: kvh,
        head_dim: d,
    };
    let mut cache = PagedKvCache::new(cfg)?;
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in (1..ids.len()).rev() {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        ids.swap(i, (x >> 33) as usize % (i + 1));
    }
    let tokens = vec![0u32; ctx];
    let k: Vec<f32> = (0..ctx * kvh * d)
        .map(|i| (i as f32 * 0.37).sin())
        .collect();
    let v: Vec<f32> = (0..ctx * kvh * d)
        .map(|i| (i as f32 * 0.91).sin())
        .collect();
    let mut decode = BatchBuilder::new(bs);
    for s in 0..batch {
        let table = &ids[s * per_seq..(s + 1) * per_seq];
        let mut fill = BatchBuilder::new(bs);
        fill.push(&tokens, 0, table, LogitsFor::Last);
        cache.write(0, &fill.build().slot_mapping, &k, &v);
        decode.push(&tokens[..1], ctx - 1, table, LogitsFor::Last);
    }
    let batch_input = decode.build();
    batch_input.validate(bs, num_blocks, 1 << 20, batch)?;
    let q = (0..batch * h * d)
        .map(|i| (i as f32 * 0.13).sin())
        .collect();
    Ok(Cell {
        cache,
        batch: batch_input,
        q,
        shape: AttentionShape {
            num_heads: h,
            num_kv_heads: kvh,
            head_dim: d,
            block_size: bs,
        },
        bytes: (batch * ctx * kvh * d * 2 * 4) as f64,
    })
}

fn main() -> Result<()> {
    let ctxs: Vec<usize> = list("ATTN_CTX", "512,4096,8192")
        .iter()
        .map(|s| s.parse())
        .collect::<std::result::Result<_, _>>()?;
    let batches: Vec<usize> = list("ATTN_BATCH", "1,32")
        .iter()
        .map(|s| s.parse())
        .collect::<std::result::Result<_, _>>()?;
    let rounds: usize = std::env::var("ATTN_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let wanted = list("ATTN_PATHS", "avx512,avx2,neon,portable");
    let paths: Vec<KernelPath> = KernelPath::ALL
        .into_iter()
        .filter(|p| p.supported() && wanted.iter().any(|w| w == p.name()))
        .collect();
    let cpu = agentd_models::cpu_kernels::cpu_model_name();
    println!("CPU: {cpu}; threads: {}", rayon::current_num_threads());
    println!();
    println!("| heads q/kv x d | block | ctx | batch | path | µs per call | K/V GB/s |");
    println!("|---|---:|---:|---:|---|---:|---:|");
    for &shape in &SHAPES {
        for bs in [16, 32] {
            for &ctx in &ctxs {
                for &b in &batches {
                    let c = cell(shape, bs, ctx, b)?;
                    let mut out = vec![0f32; c.q.len()];
                    let mut per_path = vec![Vec::new(); paths.len()];
                    for _ in 0..rounds {
                        for (i, &path) in paths.iter().enumerate() {
                            let call = || {
                                let layer = c.cache.layer(0);
                                paged_attention_on(
                                    path, &c.q, layer, &c.batch, c.shape, 0.125, &mut out,
                                );
                                std::hint::black_box(&out);
                            };
                            per_path[i].push(median_secs(call, MIN_TIME, MAX_CALLS));
                        }
                    }
                    for (i, path) in paths.iter().enumerate() {
                        let s = median(std::mem::take(&mut per_path[i]));
                        println!(
                            "| {}/{} x {} | {bs} | {ctx} | {b} | {path} | {:.1} | {:.1} |",
                            shape.0,
                            shape.1,
                            shape.2,
                            s * 1e6,
                            c.bytes / s / 1e9
                        );
                    }
                }
            }
        }
    }
    Ok(())
}
