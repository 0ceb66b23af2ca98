//! A model bound to one replica's KV cache: the unit the engine's worker runs
//! each step. The engine sees only this trait, so the CPU runtime here and the
//! CUDA backend (`agentd-cuda`) plug into the same batching loop.

use std::sync::Arc;

use agentd_kv::BlockCopy;

use crate::attention::PagedKvCache;
use crate::batch::BatchInput;
use crate::error::{ModelError, Result};
use crate::logits::Logits;
use crate::memory::{trim_heap, MemoryTags};
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

    /// Puts a host tier of `slots` blocks behind the cache (docs/design.md §4);
    /// an error when the runner has none.
    fn enable_host_tier(&mut self, slots: usize) -> Result<()> {
        match slots {
            0 => Ok(()),
            _ => Err(no_host_tier(&self.device())),
        }
    }

    /// Runs the next steps on `model`'s weights (a weight update between
    /// steps; the engine checked the architecture). An error when the
    /// runner cannot swap weights in place.
    fn swap_model(&mut self, model: Arc<Model>) -> Result<()> {
        drop(model);
        Err(ModelError::Backend {
            backend: "runner",
            message: format!("{} cannot swap weights in place", self.device()),
        })
    }

    /// Gives the `tags` regions back to the system (SGLang's
    /// `release_memory_occupation`): the KV pool's storage (its contents
    /// are lost; the engine flushed every block first) and the weights.
    /// The engine runs no step until [`StepRunner::resume_memory`]. An
    /// error when the runner cannot.
    fn release_memory(&mut self, tags: MemoryTags) -> Result<()> {
        Err(no_release(&self.device(), tags))
    }

    /// Takes the released `tags` regions again: a zeroed KV pool, and
    /// `weights` (loaded by the caller) when the weights were released.
    fn resume_memory(&mut self, tags: MemoryTags, weights: Option<Arc<Model>>) -> Result<()> {
        drop(weights);
        Err(no_release(&self.device(), tags))
    }

    /// Carries out the allocator's copies between the tiers, in order
    /// (before the next [`StepRunner::step`]).
    fn copy_blocks(&mut self, copies: &[BlockCopy]) -> Result<()> {
        match copies.is_empty() {
            true => Ok(()),
            false => Err(no_host_tier(&self.device())),
        }
    }
}

fn no_release(device: &str, tags: MemoryTags) -> ModelError {
    ModelError::Backend {
        backend: "runner",
        message: format!("{device} cannot release or resume {:?}", tags.names()),
    }
}

fn no_host_tier(device: &str) -> ModelError {
    ModelError::Backend {
        backend: "runner",
        message: format!("{device} has no host KV tier (--kv-offloading-size)"),
    }
}

/// The CPU runtime on its own rayon pool (replicas split the cores, so they
/// never fight over one pool).
pub struct CpuRunner {
    /// `None` while the weights are released.
    model: Option<Arc<Model>>,
    cache: PagedKvCache,
    /// The host tier's slots, when enabled: on the CPU both tiers are host
    /// memory, so a copy is a `memcpy` of one block per layer.
    host: Option<PagedKvCache>,
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
        Ok(CpuRunner {
            model: Some(model),
            cache,
            host: None,
            pool,
        })
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }
}

impl StepRunner for CpuRunner {
    fn step(&mut self, batch: &BatchInput) -> Result<Logits> {
        let (Some(model), false) = (&self.model, self.cache.is_released()) else {
            return Err(ModelError::Backend {
                backend: "cpu",
                message: "a step while memory is released".into(),
            });
        };
        let cache = &mut self.cache;
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

    fn swap_model(&mut self, model: Arc<Model>) -> Result<()> {
        self.cache.check_model(model.config())?;
        // The old weights are freed when the last replica lets go of them.
        self.model = Some(model);
        Ok(())
    }

    /// Drops the pool's storage (and the host tier's: the flush forgot its
    /// blocks too) and this replica's hold on the weights, then trims the
    /// heap. The weights' memory returns once every replica let go.
    fn release_memory(&mut self, tags: MemoryTags) -> Result<()> {
        if tags.kv_cache {
            self.cache.release();
            if let Some(h) = self.host.as_mut() {
                h.release();
            }
        }
        if tags.weights {
            self.model = None;
        }
        trim_heap();
        Ok(())
    }

    fn resume_memory(&mut self, tags: MemoryTags, weights: Option<Arc<Model>>) -> Result<()> {
        if tags.weights {
            let model = weights.ok_or_else(|| ModelError::Backend {
                backend: "cpu",
                message: "resuming the weights needs the loaded model".into(),
            })?;
            self.cache.check_model(model.config())?;
            self.model = Some(model);
        }
        if tags.kv_cache {
            self.cache.restore()?;
            if let Some(h) = self.host.as_mut() {
                h.restore()?;
            }
        }
        Ok(())
    }

    fn enable_host_tier(&mut self, slots: usize) -> Result<()> {
        self.host = match slots {
            0 => None,
            n => Some(self.cache.with_blocks(n)?),
        };
        Ok(())
    }

    fn copy_blocks(&mut self, copies: &[BlockCopy]) -> Result<()> {
        if copies.is_empty() {
            return Ok(());
        }
        let Some(host) = self.host.as_mut() else {
            return Err(no_host_tier("cpu"));
        };
        for c in copies {
            match *c {
                BlockCopy::Offload { device, host: s } => {
                    host.copy_block_from(&self.cache, device.0, s)?
                }
                BlockCopy::Onload { host: s, device } => {
                    self.cache.copy_block_from(host, s, device.0)?
                }
            }
        }
        Ok(())
    }
}
