//! How many KV blocks a replica gets, as vLLM sizes its cache: from memory
//! (on the CPU `VLLM_CPU_KVCACHE_SPACE` GiB, 4 by default, or
//! `--kv-cache-memory` bytes; on CUDA `--gpu-memory-utilization` of the
//! device, measured at start by [`gpu_kv_blocks`]), unless
//! `--num-kv-blocks` gives the count.
//!
//! A pool sized from memory must hold one full window (`--max-model-len`,
//! else the model's): otherwise the start fails saying what to change, as
//! vLLM's does. An explicit `--num-kv-blocks` keeps the engine's behaviour
//! (the window is lowered to the pool with a warning).
//!
//! The cache is allocated zeroed (`vec![0.0; n]`: calloc, fresh pages mapped
//! lazily), so a 4 GiB default costs resident memory only as blocks fill.

use std::path::Path;

use anyhow::{Context, Result};

/// vLLM's default `VLLM_CPU_KVCACHE_SPACE`, GiB.
pub const DEFAULT_CPU_KV_GIB: f64 = 4.0;

/// The pool of one replica and where its size came from.
#[derive(Debug, Clone)]
pub struct KvPlan {
    pub num_blocks: usize,
    pub block_size: usize,
    pub bytes_per_block: usize,
    /// The flag or variable that set the size.
    pub source: String,
    /// CUDA: the pool is sized on each device at start from this fraction
    /// of its memory ([`gpu_kv_blocks`]); `num_blocks` is 0 until then.
    pub gpu_utilization: Option<f64>,
}

impl KvPlan {
    pub fn tokens(&self) -> usize {
        self.num_blocks.saturating_mul(self.block_size)
    }

    pub fn gib(&self) -> f64 {
        self.num_blocks as f64 * self.bytes_per_block as f64 / (1u64 << 30) as f64
    }
}

/// What the sizing reads from the command line.
pub struct KvArgs<'a> {
    pub num_kv_blocks: Option<usize>,
    pub kv_cache_memory: Option<u64>,
    pub max_model_len: Option<usize>,
    pub block_size: usize,
    pub cuda: bool,
    /// `--gpu-memory-utilization` (vLLM's default 0.9 when not given).
    pub gpu_memory_utilization: f64,
    pub model_dir: &'a Path,
}

/// The pool size per replica; `space` is `VLLM_CPU_KVCACHE_SPACE` as read.
pub fn plan(a: &KvArgs<'_>, space: Option<&str>) -> Result<KvPlan> {
    let mc = agentd_runtime::ModelConfig::from_dir(a.model_dir)
        .with_context(|| format!("reading {}", a.model_dir.display()))?;
    // The CPU cache holds f32, the CUDA cache 16-bit values.
    let shrink = if a.cuda { 2 } else { 1 };
    let per_block =
        (agentd_models::KvCacheConfig::for_model(&mc, 1, a.block_size).bytes_per_block() / shrink)
            .max(1);
    let mut plan = KvPlan {
        num_blocks: 0,
        block_size: a.block_size,
        bytes_per_block: per_block,
        source: String::new(),
        gpu_utilization: None,
    };
    let (bytes, source) = match (a.num_kv_blocks, a.kv_cache_memory) {
        (Some(n), _) => {
            plan.num_blocks = n;
            plan.source = "--num-kv-blocks".into();
            return Ok(plan);
        }
        (None, Some(b)) => (b, "--kv-cache-memory".to_owned()),
        // Sized on the device once the weights are loaded and a step is
        // profiled (`device::start_cuda`).
        (None, None) if a.cuda => {
            let u = a.gpu_memory_utilization;
            anyhow::ensure!(
                u.is_finite() && u > 0.0 && u <= 1.0,
                "--gpu-memory-utilization must be in (0, 1], got {u}"
            );
            plan.gpu_utilization = Some(u);
            plan.source = format!("--gpu-memory-utilization {u}");
            return Ok(plan);
        }
        (None, None) => {
            let gib = cpu_space_gib(space)?;
            let src = match space {
                Some(_) => format!("VLLM_CPU_KVCACHE_SPACE={gib}"),
                None => format!("VLLM_CPU_KVCACHE_SPACE unset: {gib} GiB"),
            };
            ((gib * (1u64 << 30) as f64) as u64, src)
        }
    };
    plan.num_blocks = blocks_in(bytes, per_block as u64);
    plan.source = source;
    let window = a.max_model_len.unwrap_or(mc.max_position_embeddings);
    check_window(
        &plan,
        window,
        "VLLM_CPU_KVCACHE_SPACE (GiB) or --kv-cache-memory (bytes)",
    )?;
    Ok(plan)
}

/// Whole blocks of `per_block` bytes in `bytes`; block ids are u32
/// (agentd-kv), so at most `u32::MAX - 1`.
fn blocks_in(bytes: u64, per_block: u64) -> usize {
    let n = usize::try_from(bytes / per_block.max(1)).unwrap_or(usize::MAX);
    n.min(u32::MAX as usize - 1)
}

/// A pool sized from memory must hold one request of `window` tokens;
/// the error names `raise` (what gives it more memory) and the window that
/// would fit, as vLLM's does.
pub fn check_window(plan: &KvPlan, window: usize, raise: &str) -> Result<()> {
    if plan.tokens() >= window {
        return Ok(());
    }
    let gib = |bytes: f64| bytes / (1u64 << 30) as f64;
    let per_block = plan.bytes_per_block as f64;
    let need = gib(window.div_ceil(plan.block_size.max(1)) as f64 * per_block);
    anyhow::bail!(
        "the KV cache ({}, {:.2} GiB: {} tokens at {} bytes per token) cannot hold one \
         request of the model's window of {window} tokens, which needs {need:.2} GiB; raise \
         {raise}, or lower --max-model-len to at most {}",
        plan.source,
        plan.gib(),
        plan.tokens(),
        plan.bytes_per_block / plan.block_size.max(1),
        plan.tokens(),
    );
}

/// What `--gpu-memory-utilization` sizes a CUDA pool from, in bytes, as
/// measured on the device at start (`device::start_cuda`, built with the
/// `cuda` feature).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuMemory {
    /// The device's memory.
    pub total: u64,
    /// Free once the CUDA context was up, before the model loaded (other
    /// processes hold the rest).
    pub free_at_start: u64,
    /// What loading the model took (weights, and what came with them).
    pub weights: u64,
    /// The profiled step's peak of activations and logits.
    pub activation_peak: u64,
}

/// vLLM's rule for the CUDA pool: the engine may use `utilization` of the
/// device's total memory; the KV cache gets what remains of that budget
/// after the weights and the activation peak, in blocks of
/// `bytes_per_block`. Refused, as vLLM refuses, when less than the budget
/// is free at start (other processes hold it), and when nothing remains for
/// the cache.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn gpu_kv_blocks(m: GpuMemory, utilization: f64, bytes_per_block: u64) -> Result<usize> {
    const GIB: f64 = (1u64 << 30) as f64;
    anyhow::ensure!(
        utilization.is_finite() && utilization > 0.0 && utilization <= 1.0,
        "--gpu-memory-utilization must be in (0, 1], got {utilization}"
    );
    // f64 holds byte counts exactly up to 8 PiB; rounded, so 0.9 of a
    // whole number of GiB is not a byte short.
    let budget = (m.total as f64 * utilization).round() as u64;
    anyhow::ensure!(
        m.free_at_start >= budget,
        "free memory on the device at start ({:.2}/{:.2} GiB) is less than the desired GPU \
         memory utilization ({utilization}, {:.2} GiB); lower --gpu-memory-utilization or free \
         the memory other processes use",
        m.free_at_start as f64 / GIB,
        m.total as f64 / GIB,
        budget as f64 / GIB,
    );
    let kv = budget
        .checked_sub(m.weights)
        .and_then(|b| b.checked_sub(m.activation_peak))
        .filter(|&b| b >= bytes_per_block)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "no memory left for the KV cache: {utilization} of {:.2} GiB is {:.2} GiB, the \
                 weights take {:.2} GiB and a step's activations {:.2} GiB; raise \
                 --gpu-memory-utilization or lower --max-num-batched-tokens",
                m.total as f64 / GIB,
                budget as f64 / GIB,
                m.weights as f64 / GIB,
                m.activation_peak as f64 / GIB,
            )
        })?;
    Ok(blocks_in(kv, bytes_per_block))
}

/// `VLLM_CPU_KVCACHE_SPACE` in GiB (vLLM: a number of GiB; unset or 0 means
/// the default).
fn cpu_space_gib(space: Option<&str>) -> Result<f64> {
    let Some(s) = space.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(DEFAULT_CPU_KV_GIB);
    };
    let gib: f64 = s
        .parse()
        .ok()
        .filter(|g: &f64| g.is_finite() && *g >= 0.0)
        .with_context(|| format!("VLLM_CPU_KVCACHE_SPACE={s:?} is not a size in GiB"))?;
    Ok(if gib == 0.0 { DEFAULT_CPU_KV_GIB } else { gib })
}

/// vLLM's two start lines: the pool in tokens, and how many requests of
/// `max_model_len` tokens fit at once.
pub fn log_capacity(plan: &KvPlan, max_model_len: usize, replicas: usize) {
    let tokens = plan.tokens();
    tracing::info!(
        blocks = plan.num_blocks,
        block_size = plan.block_size,
        gib = %format!("{:.2}", plan.gib()),
        sized_by = %plan.source,
        replicas,
        "KV cache size: {tokens} tokens"
    );
    tracing::info!(
        "Maximum concurrency for {max_model_len} tokens per request: {:.2}x",
        tokens as f64 / max_model_len.max(1) as f64
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    fn h200(weights: u64, peak: u64) -> GpuMemory {
        GpuMemory {
            total: 140 * G,
            free_at_start: 139 * G,
            weights,
            activation_peak: peak,
        }
    }

    #[test]
    fn gpu_pool_is_the_budget_less_weights_and_activations() {
        // Qwen3-8B in bf16 on a 140 GiB device at 0.9: 126 GiB budget,
        // 16 GiB weights, 2 GiB peak: 108 GiB of 2 MiB blocks.
        let per_block = 2 << 20;
        let n = gpu_kv_blocks(h200(16 * G, 2 * G), 0.9, per_block).unwrap();
        assert_eq!(n, (108 * G / per_block) as usize);
        // Utilization 1 takes the whole device, not only what is free:
        // refused when other processes hold some of it.
        let e = gpu_kv_blocks(h200(16 * G, 2 * G), 1.0, per_block).unwrap_err();
        assert!(e.to_string().contains("less than the desired"), "{e}");
        // Partial blocks are not allocated.
        let m = GpuMemory {
            total: 10 * G,
            free_at_start: 10 * G,
            weights: 0,
            activation_peak: 0,
        };
        assert_eq!(gpu_kv_blocks(m, 0.5, 3 * G).unwrap(), 1);
    }

    #[test]
    fn gpu_pool_refusals_name_the_fix() {
        let per_block = 2 << 20;
        // Weights and activations over the budget.
        let e = gpu_kv_blocks(h200(120 * G, 8 * G), 0.9, per_block).unwrap_err();
        assert!(
            e.to_string().contains("raise --gpu-memory-utilization"),
            "{e}"
        );
        // Less than one block left.
        let e = gpu_kv_blocks(h200(126 * G - per_block + 1, 0), 0.9, per_block).unwrap_err();
        assert!(e.to_string().contains("no memory left"), "{e}");
        for u in [0.0, -0.5, 1.5, f64::NAN] {
            assert!(gpu_kv_blocks(h200(G, G), u, per_block).is_err(), "{u}");
        }
    }

    #[test]
    fn a_pool_below_one_window_names_the_window_that_fits() {
        let plan = KvPlan {
            num_blocks: 10,
            block_size: 16,
            bytes_per_block: 1 << 20,
            source: "--gpu-memory-utilization 0.5".into(),
            gpu_utilization: Some(0.5),
        };
        assert!(check_window(&plan, 160, "x").is_ok());
        let e = check_window(&plan, 161, "--gpu-memory-utilization").unwrap_err();
        let e = e.to_string();
        assert!(e.contains("raise --gpu-memory-utilization"), "{e}");
        assert!(e.contains("--max-model-len to at most 160"), "{e}");
    }

    #[test]
    fn kv_space_semantics() {
        assert_eq!(cpu_space_gib(None).unwrap(), 4.0);
        assert_eq!(cpu_space_gib(Some("0")).unwrap(), 4.0);
        assert_eq!(cpu_space_gib(Some(" 1.5 ")).unwrap(), 1.5);
        assert!(cpu_space_gib(Some("lots")).is_err());
        assert!(cpu_space_gib(Some("-1")).is_err());
    }
}
