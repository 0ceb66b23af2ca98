//! The GPU host KV tier (`agentd_cuda::GpuHostTier`): blocks offloaded to
//! pinned host memory and onloaded into other device blocks come back bit
//! for bit in every layer, and the copy bandwidth each way (against the
//! PCIe / C2C figure of the machine, printed by the caller's nvidia-smi).

use std::path::Path;
use std::sync::Arc;

use agentd_cuda::{Dtype, Gpu, GpuHostTier, GpuModel, Result};
use agentd_models::synth::ModelCard;
use agentd_runtime::{BlockCopy, BlockId};

use crate::Report;

pub fn run(gpu: &Arc<Gpu>, report: &mut Report) -> Result<()> {
    let cfg = ModelCard::from_file(Path::new("models/qwen3-0.6b.json"))?.config;
    let model = GpuModel::random(gpu.clone(), cfg, Dtype::Bf16, 3)?;
    let blocks = 4096;
    let mut cache = model.new_cache(blocks, 16)?;
    cache.fill_random(gpu, Dtype::Bf16, 21)?;
    let mut tier = GpuHostTier::new(gpu, &cache, 2048)?;
    let layers = cache.config().num_layers;
    let before: Vec<_> = (0..layers)
        .map(|l| cache.download_layer(gpu, l))
        .collect::<Result<_>>()?;
    // Out: device 100..164 -> host 0..64 and device 7 -> host 500; the
    // device blocks are then overwritten; back: host -> device 2000.., 3000.
    let mut out: Vec<BlockCopy> = (0..64)
        .map(|i| BlockCopy::Offload {
            device: BlockId(100 + i),
            host: i,
        })
        .collect();
    out.push(BlockCopy::Offload {
        device: BlockId(7),
        host: 500,
    });
    tier.enqueue(gpu, &cache, &out)?;
    tier.wait_all(gpu)?;
    cache.fill_random(gpu, Dtype::Bf16, 22)?;
    let mut back: Vec<BlockCopy> = (0..64)
        .map(|i| BlockCopy::Onload {
            host: i,
            device: BlockId(2000 + i),
        })
        .collect();
    back.push(BlockCopy::Onload {
        host: 500,
        device: BlockId(3000),
    });
    tier.enqueue(gpu, &cache, &back)?;
    tier.wait_all(gpu)?;
    gpu.synchronize()?;
    let block = cache.config().num_kv_heads * 16 * cache.config().head_dim;
    let mut wrong = 0usize;
    for (l, (k0, v0)) in before.iter().enumerate() {
        let (k1, v1) = cache.download_layer(gpu, l)?;
        let pairs = (0..64).map(|i| (100 + i, 2000 + i)).chain([(7, 3000)]);
        for (src, dst) in pairs {
            let (s, d) = (src * block, dst * block);
            wrong += usize::from(k0[s..s + block] != k1[d..d + block]);
            wrong += usize::from(v0[s..s + block] != v1[d..d + block]);
        }
    }
    report.check(
        "host tier: blocks differing after a round trip",
        wrong as f64,
        0.0,
    );
    // Bandwidth: 1024 blocks (all layers, K and V) each way.
    let n = 1024u32;
    let out: Vec<BlockCopy> = (0..n)
        .map(|i| BlockCopy::Offload {
            device: BlockId(i),
            host: i,
        })
        .collect();
    let back: Vec<BlockCopy> = (0..n)
        .map(|i| BlockCopy::Onload {
            host: i,
            device: BlockId(i),
        })
        .collect();
    let bytes = (n as usize * block * 2 * 2 * layers) as f64;
    for (what, copies) in [("device -> host", &out), ("host -> device", &back)] {
        tier.enqueue(gpu, &cache, copies)?;
        tier.wait_all(gpu)?;
        let ms = gpu.time_ms(|| {
            tier.enqueue(gpu, &cache, copies)?;
            tier.wait_all(gpu)
        })?;
        println!(
            "host tier {what}: {:.1} MB in {ms:.2} ms = {:.1} GB/s",
            bytes / 1e6,
            bytes / (ms as f64 / 1e3) / 1e9
        );
    }
    Ok(())
}
