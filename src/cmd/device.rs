//! `agentd serve --device cuda`: the engine on the CUDA backend, one GPU per
//! replica, its KV pool sized from device memory as vLLM's
//! `--gpu-memory-utilization` does (unless `--num-kv-blocks` or
//! `--kv-cache-memory` gives it). Without the `cuda` feature the flag
//! explains how to get it.

use std::path::Path;

use agentd_engine::{Engine, EngineConfig};
use agentd_models::LoadDtype;
use anyhow::Result;

use super::kv_size::KvPlan;

/// The GPU paths not yet validated on a device, each behind its flag.
/// (Read only by the CUDA build.)
#[derive(Debug, Clone, Copy, Default)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub struct GpuPaths {
    /// `--device-sampling`.
    pub device_sampling: bool,
    /// `--fused-prologue`, `--single-pass-decode`, `--device-moe`.
    pub kernels: agentd_cuda::Kernels,
    /// `--cuda-graphs` without `--enforce-eager`.
    pub graphs: bool,
}

#[cfg(feature = "cuda")]
pub fn start_cuda(
    model_dir: &Path,
    mut cfg: EngineConfig,
    dtype: LoadDtype,
    kv: &mut KvPlan,
    paths: GpuPaths,
) -> Result<Engine> {
    use std::sync::Arc;

    use agentd_cuda::{Dtype, Gpu, GpuModel};
    use agentd_models::loader::Weights;
    use agentd_runtime::{ModelConfig, WeightDtype};
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
    let mut models = Vec::with_capacity(cfg.replicas);
    let mut sized = Vec::with_capacity(cfg.replicas);
    for r in 0..cfg.replicas {
        let open = if paths.graphs {
            Gpu::new_for_graphs
        } else {
            Gpu::new
        };
        let gpu = Arc::new(open(r).with_context(|| format!("opening CUDA device {r}"))?);
        let (free_at_start, total) = gpu.memory()?;
        tracing::info!(replica = r, device = %gpu.name(), "uploading weights");
        let model = Arc::new(GpuModel::from_weights(
            gpu.clone(),
            mc.clone(),
            &weights,
            dtype,
        )?);
        if let Some(u) = kv.gpu_utilization {
            gpu.synchronize()?;
            let (free, _) = gpu.memory()?;
            let m = super::kv_size::GpuMemory {
                total,
                free_at_start,
                weights: free_at_start.saturating_sub(free),
                activation_peak: profile_step(&gpu, &model, &cfg)?,
            };
            let blocks = super::kv_size::gpu_kv_blocks(m, u, kv.bytes_per_block as u64)?;
            tracing::info!(replica = r, ?m, blocks, "KV cache sized from device memory");
            sized.push(blocks);
        }
        models.push(model);
    }
    // One pool size for every replica: the smallest device's.
    if let Some(&blocks) = sized.iter().min() {
        kv.num_blocks = blocks;
        cfg.num_blocks = blocks;
        let window = cfg.max_model_len.unwrap_or(mc.max_position_embeddings);
        super::kv_size::check_window(kv, window, "--gpu-memory-utilization")?;
    }
    let loader = agentd_cuda::GpuLoader {
        gpus: models.iter().map(|m| m.gpu().clone()).collect(),
        dtype,
    };
    let window = cfg.max_model_len.unwrap_or(mc.max_position_embeddings);
    let runners = runners(models, &cfg, paths, window)?;
    Ok(Engine::with_runners_and_loader(
        mc,
        runners,
        cfg,
        Arc::new(loader),
    )?)
}

/// One runner per replica's model, with the paths `paths` turns on
/// (`window`: the longest context a decode graph covers).
#[cfg(feature = "cuda")]
fn runners(
    models: Vec<std::sync::Arc<agentd_cuda::GpuModel>>,
    cfg: &EngineConfig,
    paths: GpuPaths,
    window: usize,
) -> Result<Vec<Box<dyn agentd_runtime::StepRunner>>> {
    let mut out: Vec<Box<dyn agentd_runtime::StepRunner>> = Vec::with_capacity(models.len());
    for (r, model) in models.into_iter().enumerate() {
        // What runs, not only what was asked: a flag a model cannot use
        // (the fused prologue on GLM, device MoE on a dense model, the
        // single-pass decode on a group above 8) falls back quietly.
        let used = model.kernels_for(paths.kernels);
        let decode = agentd_cuda::DecodeKernel::choose(
            used.single_pass_decode,
            &model.attn_shape(cfg.block_size),
        );
        tracing::info!(replica = r, kernels = ?used, ?decode, device_sampling = paths.device_sampling, graphs = paths.graphs, "CUDA paths");
        let mut runner = agentd_cuda::GpuRunner::new(model, cfg.num_blocks, cfg.block_size)?
            .with_replica(r)
            .with_device_sampling(paths.device_sampling)
            .with_kernels(paths.kernels);
        if paths.graphs {
            runner = runner.with_graphs(cfg.scheduler.max_running.saturating_mul(2), window);
        }
        out.push(Box::new(runner));
    }
    Ok(out)
}

/// The activation peak of the largest step the engine plans: one sequence
/// of `max_num_batched_tokens` new tokens with the logits of every one
/// (what a batch of that many decodes, or a prefill chunk scoring its
/// prompt logprobs, asks for), on a pool just large enough for it.
#[cfg(feature = "cuda")]
fn profile_step(
    gpu: &agentd_cuda::Gpu,
    model: &std::sync::Arc<agentd_cuda::GpuModel>,
    cfg: &EngineConfig,
) -> Result<u64> {
    use agentd_runtime::{BatchBuilder, LogitsFor, StepRunner};

    let c = model.config();
    let tokens = cfg
        .max_num_batched_tokens
        .min(c.max_position_embeddings)
        .max(1);
    let blocks = tokens.div_ceil(cfg.block_size.max(1));
    let mut runner = agentd_cuda::GpuRunner::new(model.clone(), blocks, cfg.block_size)?;
    let ids: Vec<u32> = (0..tokens)
        .map(|i| (i % c.vocab_size.max(1)) as u32)
        .collect();
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut b = BatchBuilder::new(cfg.block_size);
    b.push(&ids, 0, &table, LogitsFor::All);
    let batch = b.build();
    let peak = gpu.peak_during(|| {
        runner
            .step(&batch)
            .map(drop)
            .map_err(agentd_cuda::CudaError::Model)
    })?;
    tracing::info!(tokens, peak_bytes = peak, "profiled the largest step");
    Ok(peak)
}

#[cfg(not(feature = "cuda"))]
pub fn start_cuda(
    _model_dir: &Path,
    _cfg: EngineConfig,
    _dtype: LoadDtype,
    _kv: &mut KvPlan,
    _paths: GpuPaths,
) -> Result<Engine> {
    anyhow::bail!(
        "this agentd was built without CUDA: rebuild with `cargo build --release --features cuda` \
         (needs a CUDA 13 nvcc; scripts/build-gpu-check.sh shows how to get one)"
    )
}
