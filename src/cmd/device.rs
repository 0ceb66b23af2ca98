//! `agentd serve --device cuda`: the engine on the CUDA backend, one GPU per
//! replica. Without the `cuda` feature the flag explains how to get it.

use std::path::Path;

use agentd_engine::{Engine, EngineConfig};
use agentd_models::LoadDtype;
use anyhow::Result;

#[cfg(feature = "cuda")]
pub fn start_cuda(model_dir: &Path, cfg: EngineConfig, dtype: LoadDtype) -> Result<Engine> {
    use std::sync::Arc;

    use agentd_cuda::{Dtype, Gpu, GpuQwen3, GpuRunner};
    use agentd_models::loader::Weights;
    use agentd_models::{ModelConfig, StepRunner, WeightDtype};
    use anyhow::Context;

    let mc = ModelConfig::from_dir(model_dir)
        .with_context(|| format!("reading {}", model_dir.display()))?;
    // The GPU runs 16-bit weights: auto is the checkpoint's 16-bit dtype.
    let dtype = match dtype.resolve(mc.torch_dtype) {
        WeightDtype::F16 => Dtype::F16,
        WeightDtype::Bf16 => Dtype::Bf16,
        WeightDtype::F32 if dtype == LoadDtype::Auto => Dtype::Bf16,
        WeightDtype::F32 => {
            anyhow::bail!("--dtype {dtype} is not supported on CUDA (auto, bfloat16 or float16)")
        }
    };
    anyhow::ensure!(
        Gpu::available(),
        "--device cuda: no CUDA driver or device on this machine"
    );
    tracing::info!(dir = %model_dir.display(), "loading weights for the GPU");
    let weights = Weights::from_dir(model_dir, &candle_core::Device::Cpu)?;
    let mut runners: Vec<Box<dyn StepRunner>> = Vec::with_capacity(cfg.replicas);
    for r in 0..cfg.replicas {
        let gpu = Arc::new(Gpu::new(r).with_context(|| format!("opening CUDA device {r}"))?);
        tracing::info!(replica = r, device = %gpu.name(), "uploading weights");
        let model = Arc::new(GpuQwen3::from_weights(gpu, mc.clone(), &weights, dtype)?);
        runners.push(Box::new(GpuRunner::new(
            model,
            cfg.num_blocks,
            cfg.block_size,
        )?));
    }
    Ok(Engine::with_runners(mc, runners, cfg)?)
}

#[cfg(not(feature = "cuda"))]
pub fn start_cuda(_model_dir: &Path, _cfg: EngineConfig, _dtype: LoadDtype) -> Result<Engine> {
    anyhow::bail!(
        "this agentd was built without CUDA: rebuild with `cargo build --release --features cuda` \
         (needs a CUDA 13 nvcc; scripts/build-gpu-check.sh shows how to get one)"
    )
}
