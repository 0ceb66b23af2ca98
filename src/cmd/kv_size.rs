//! How many KV blocks a replica gets, as vLLM sizes its cache: from memory
//! (on the CPU `VLLM_CPU_KVCACHE_SPACE` GiB, 4 by default, or
//! `--kv-cache-memory` bytes), unless `--num-kv-blocks` gives the count.
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
    pub model_dir: &'a Path,
}

/// The pool size per replica; `space` is `VLLM_CPU_KVCACHE_SPACE` as read.
pub fn plan(a: &KvArgs<'_>, space: Option<&str>) -> Result<KvPlan> {
    let mc = agentd_models::ModelConfig::from_dir(a.model_dir)
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
    };
    let (bytes, source) = match (a.num_kv_blocks, a.kv_cache_memory) {
        (Some(n), _) => {
            plan.num_blocks = n;
            plan.source = "--num-kv-blocks".into();
            return Ok(plan);
        }
        (None, Some(b)) => (b, "--kv-cache-memory".to_owned()),
        // The CUDA pool keeps the engine's default count until it is sized
        // from the device's free memory (vLLM's --gpu-memory-utilization).
        (None, None) if a.cuda => {
            plan.num_blocks = agentd_engine::EngineConfig::default().num_blocks;
            plan.source = "the default block count".into();
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
    plan.num_blocks = usize::try_from(bytes / per_block as u64).unwrap_or(usize::MAX);
    // Block ids are u32 (agentd-kv).
    plan.num_blocks = plan.num_blocks.min(u32::MAX as usize - 1);
    plan.source = source;
    let window = a.max_model_len.unwrap_or(mc.max_position_embeddings);
    if plan.tokens() < window {
        let need = window.div_ceil(a.block_size) as f64 * per_block as f64 / (1u64 << 30) as f64;
        anyhow::bail!(
            "the KV cache ({}, {:.2} GiB: {} tokens at {} bytes per token) cannot hold one \
             request of the model's window of {window} tokens, which needs {need:.2} GiB; raise \
             VLLM_CPU_KVCACHE_SPACE (GiB) or --kv-cache-memory (bytes), or lower \
             --max-model-len to at most {}",
            plan.source,
            bytes as f64 / (1u64 << 30) as f64,
            plan.tokens(),
            per_block / a.block_size.max(1),
            plan.tokens(),
        );
    }
    Ok(plan)
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

    #[test]
    fn kv_space_semantics() {
        assert_eq!(cpu_space_gib(None).unwrap(), 4.0);
        assert_eq!(cpu_space_gib(Some("0")).unwrap(), 4.0);
        assert_eq!(cpu_space_gib(Some(" 1.5 ")).unwrap(), 1.5);
        assert!(cpu_space_gib(Some("lots")).is_err());
        assert!(cpu_space_gib(Some("-1")).is_err());
    }
}
