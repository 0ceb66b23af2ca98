//! A model bound to one replica's KV cache: the unit the engine's worker runs
//! each step. The engine sees only these traits, so the CPU runtime
//! (`agentd-models`) and the CUDA backend (`agentd-cuda`) plug into the same
//! batching loop, and the binary picks one.
//!
//! - [`StepRunner`]: one replica's model and cache, driven step by step.
//! - [`LoadedModel`]: a backend's loaded weights: the runners the engine
//!   starts from them, and what a weight update or a resume hands to the
//!   runners (opaque to the engine; each backend takes its own kind back).
//! - [`WeightLoader`]: loads another checkpoint the way the serving one was
//!   loaded (backend, dtype), for `/update_weights_from_disk` and a resume of
//!   released weights.

use std::any::Any;
use std::path::Path;
use std::sync::Arc;

use agentd_kv::BlockCopy;

use crate::batch::BatchInput;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::logits::Logits;
use crate::memory::MemoryTags;
use crate::sampling::device::{draw_rows, Drawn, RowPlan};

/// A backend's loaded weights. `Any` so that a runner can take its own
/// backend's kind back from the `Arc<dyn LoadedModel>` the engine passes on
/// (and refuse another backend's).
pub trait LoadedModel: Any + Send + Sync {
    /// The model's `config.json`.
    fn config(&self) -> &ModelConfig;

    /// A runner over these weights with a cache of `num_blocks` blocks of
    /// `block_size` tokens and `threads` compute threads (named after
    /// `name`).
    fn runner(
        self: Arc<Self>,
        name: &str,
        num_blocks: usize,
        block_size: usize,
        threads: usize,
    ) -> Result<Box<dyn StepRunner>>;

    /// Loads other checkpoints as these weights were loaded.
    fn loader(&self) -> Arc<dyn WeightLoader>;
}

/// Loads a checkpoint directory into weights a backend's runners take.
pub trait WeightLoader: Send + Sync {
    fn load(&self, dir: &Path) -> Result<Arc<dyn LoadedModel>>;
}

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
    fn swap_model(&mut self, model: Arc<dyn LoadedModel>) -> Result<()> {
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
    fn resume_memory(
        &mut self,
        tags: MemoryTags,
        weights: Option<Arc<dyn LoadedModel>>,
    ) -> Result<()> {
        drop(weights);
        Err(no_release(&self.device(), tags))
    }

    /// The allocator's copies between the tiers for this step, in order,
    /// then the step. A runner may overlap the two as long as the step sees
    /// every copy done (the CPU runner copies layer by layer beside the
    /// forward); by default, one after the other.
    fn step_after_copies(&mut self, copies: &[BlockCopy], batch: &BatchInput) -> Result<Logits> {
        self.copy_blocks(copies)?;
        self.step(batch)
    }

    /// [`StepRunner::step_after_copies`], then each logits row drawn by its
    /// plan (`plans[i]` for row `i`) where the logits are: only the tokens
    /// (and requested logprobs) come back (`sampling::device`). By default
    /// on the host, by the reference the device kernels follow; a GPU
    /// runner overrides it and keeps its logits on the device.
    fn step_and_draw(
        &mut self,
        copies: &[BlockCopy],
        batch: &BatchInput,
        plans: &[RowPlan],
    ) -> Result<Vec<Drawn>> {
        let logits = self.step_after_copies(copies, batch)?;
        draw_rows(&logits, plans)
    }

    /// Whether [`StepRunner::step_and_draw`] samples on a device (the
    /// engine then plans rows instead of reading logits; `--device-sampling`).
    fn draws_on_device(&self) -> bool {
        false
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

/// The error of a runner without a host tier asked to use one.
pub fn no_host_tier(device: &str) -> ModelError {
    ModelError::Backend {
        backend: "runner",
        message: format!("{device} has no host KV tier (--kv-offloading-size)"),
    }
}
