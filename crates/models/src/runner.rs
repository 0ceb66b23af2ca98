//! The CPU runtime's [`StepRunner`]: a [`Model`] bound to one replica's
//! cache on its own rayon pool, and [`Model`] as the runtime's
//! [`LoadedModel`] (the contract is `agentd_runtime::runner`).

use std::path::Path;
use std::sync::Arc;

use agentd_kv::BlockCopy;
use agentd_runtime::runner::no_host_tier;
pub use agentd_runtime::runner::{LoadedModel, StepRunner, WeightLoader};

use crate::attention::tier_copy::{self, TierCopies};
use crate::attention::PagedKvCache;
use crate::batch::BatchInput;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::loader::LoadDtype;
use crate::logits::Logits;
use crate::memory::{trim_heap, MemoryTags};
use crate::model::Model;

impl LoadedModel for Model {
    fn config(&self) -> &ModelConfig {
        Model::config(self)
    }

    fn runner(
        self: Arc<Self>,
        name: &str,
        num_blocks: usize,
        block_size: usize,
        threads: usize,
    ) -> Result<Box<dyn StepRunner>> {
        let r = CpuRunner::new(self, num_blocks, block_size, threads, name)?;
        Ok(Box::new(r))
    }

    fn loader(&self) -> Arc<dyn WeightLoader> {
        Arc::new(CpuLoader(self.load_dtype()))
    }
}

/// Loads checkpoints for the CPU runtime with matrices in one dtype.
#[derive(Debug, Clone, Copy)]
pub struct CpuLoader(pub LoadDtype);

impl WeightLoader for CpuLoader {
    fn load(&self, dir: &Path) -> Result<Arc<dyn LoadedModel>> {
        Ok(Arc::new(Model::load_as(dir, self.0)?))
    }
}

/// The CPU model behind `model`, refusing another backend's weights.
fn cpu_model(model: Arc<dyn LoadedModel>) -> Result<Arc<Model>> {
    let any: Arc<dyn std::any::Any + Send + Sync> = model;
    any.downcast::<Model>().map_err(|_| ModelError::Backend {
        backend: "cpu",
        message: "the weights were loaded by another backend".into(),
    })
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

    /// The weights, unless memory is released (no step runs then).
    fn model(&self) -> Result<Arc<Model>> {
        match (&self.model, self.cache.is_released()) {
            (Some(model), false) => Ok(model.clone()),
            _ => Err(ModelError::Backend {
                backend: "cpu",
                message: "a step while memory is released".into(),
            }),
        }
    }
}

fn logits_of(batch: &BatchInput, logits: candle_core::Tensor) -> Result<Logits> {
    if batch.logits_indices.is_empty() {
        return Ok(Logits::empty());
    }
    Logits::from_tensor(logits)
}

impl StepRunner for CpuRunner {
    fn step(&mut self, batch: &BatchInput) -> Result<Logits> {
        let model = self.model()?;
        let cache = &mut self.cache;
        let logits = self.pool.install(|| model.forward(batch, cache))?;
        logits_of(batch, logits)
    }

    /// The copies run on their own thread, layer by layer, and the forward
    /// takes each layer back just before computing it
    /// (`attention::tier_copy`): a step waits for the copies of the layer
    /// it is on, not for all of them.
    fn step_after_copies(&mut self, copies: &[BlockCopy], batch: &BatchInput) -> Result<Logits> {
        if copies.is_empty() {
            return self.step(batch);
        }
        let model = self.model()?;
        let Some(host) = self.host.as_mut() else {
            return Err(no_host_tier("cpu"));
        };
        let plan = TierCopies::plan(&self.cache, host, copies)?;
        let pool = &self.pool;
        let logits = tier_copy::beside(&mut self.cache, host, &plan, |cache, before| {
            pool.install(|| model.forward_with(batch, cache, before))
        })?;
        logits_of(batch, logits)
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

    fn swap_model(&mut self, model: Arc<dyn LoadedModel>) -> Result<()> {
        let model = cpu_model(model)?;
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

    fn resume_memory(
        &mut self,
        tags: MemoryTags,
        weights: Option<Arc<dyn LoadedModel>>,
    ) -> Result<()> {
        if tags.weights {
            let model = cpu_model(weights.ok_or_else(|| ModelError::Backend {
                backend: "cpu",
                message: "resuming the weights needs the loaded model".into(),
            })?)?;
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
        // Checked whole before any block moves, as beside a forward.
        TierCopies::plan(&self.cache, host, copies)?.apply_all(&mut self.cache, host);
        Ok(())
    }
}
