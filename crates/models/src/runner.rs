//! A model bound to one replica's KV cache: the unit the engine's worker runs
//! each step. The engine sees only this trait, so the CPU runtime here and the
//! CUDA backend (`agentd-cuda`) plug into the same batching loop.

use std::sync::Arc;

use crate::attention::PagedKvCache;
use crate::batch::BatchInput;
use crate::error::{ModelError, Result};
use crate::logits::Logits;
use crate::model::Model;

/// One replica's model and cache.
pub trait StepRunner: Send {
    /// Runs one batch (writing its new K/V into the cache) and returns one
    /// f32 logits row per entry of `batch.logits_indices`.
    fn step(&mut self, batch: &BatchInput) -> Result<Logits>;

    /// Tokens per cache block.
    fn block_size(&self) -> usize;

    /// Blocks in the cache.
    fn num_blocks(&self) -> usize;

    /// Where the step runs, for logs ("cpu", "cuda:0").
    fn device(&self) -> String;

    /// The runner's CPU compute threads, if it has its own: the engine
    /// samples a step's rows on them once the forward is done, so sampling
    /// uses the replica's share of the cores and no more. `None` (a GPU
    /// backend) makes the engine keep a pool of its own per replica.
    fn compute_pool(&self) -> Option<&rayon::ThreadPool> {
        None
    }
}

/// The CPU runtime on its own rayon pool (replicas split the cores, so they
/// never fight over one pool).
pub struct CpuRunner {
    model: Arc<Model>,
    cache: PagedKvCache,
    pool: rayon::ThreadPool,
}

impl CpuRunner {
    /// A runner with a cache of `num_blocks` blocks and `threads` compute threads.
    pub fn new(
        model: Arc<Model>,
        num_blocks: usize,
        block_size: usize,
        threads: usize,
        name: &str,
    ) -> Result<Self> {
        let cache = model.new_cache(num_blocks, block_size)?;
        let prefix = name.to_string();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(move |i| format!("{prefix}-t{i}"))
            .build()
            .map_err(|e| ModelError::Backend {
                backend: "cpu",
                message: format!("thread pool: {e}"),
            })?;
        Ok(CpuRunner { model, cache, pool })
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }
}

impl StepRunner for CpuRunner {
    fn step(&mut self, batch: &BatchInput) -> Result<Logits> {
        let (model, cache) = (&self.model, &mut self.cache);
        let logits = self.pool.install(|| model.forward(batch, cache))?;
        if batch.logits_indices.is_empty() {
            return Ok(Logits::empty());
        }
        Logits::from_tensor(logits)
    }

    fn block_size(&self) -> usize {
        self.cache.block_size()
    }

    fn num_blocks(&self) -> usize {
        self.cache.num_blocks()
    }

    fn device(&self) -> String {
        format!("cpu ({} threads)", self.threads())
    }

    fn compute_pool(&self) -> Option<&rayon::ThreadPool> {
        Some(&self.pool)
    }
}
