//! [`GpuRunner`]: the CUDA backend as the engine's [`StepRunner`]: one GPU
//! model and its device-resident KV cache per replica.

use std::sync::Arc;

use agentd_runtime::runner::no_host_tier;
use agentd_runtime::sampling::device::{draw_rows, Drawn, RowPlan};
use agentd_runtime::{
    BatchInput, BlockCopy, LoadedModel, Logits, MemoryTags, ModelError, StepRunner,
};

use crate::device::Gpu;
use crate::error::CudaError;
use crate::forward::StepOpts;
use crate::graph::{DecodeGraphs, GraphLogits};
use crate::model::{GpuKvCache, GpuModel};
use crate::plan::Kernels;
use crate::tier::GpuHostTier;
use crate::weights::GpuWeights;

pub struct GpuRunner {
    /// `None` while the weights are released (`release_memory`).
    model: Option<Arc<GpuModel>>,
    gpu: Arc<Gpu>,
    /// Its buffers are dropped while the KV cache is released.
    cache: GpuKvCache,
    device: String,
    /// Rows drawn on the GPU (`--device-sampling`); off: logits come back
    /// to the host sampler (the path validated on an H200).
    draw_on_device: bool,
    /// The host KV tier (`--kv-offloading-size`), if any.
    tier: Option<GpuHostTier>,
    /// `--fused-prologue`, `--single-pass-decode`, `--device-moe`.
    kernels: Kernels,
    /// Decode graphs (`--cuda-graphs`; needs a [`crate::Gpu::new_for_graphs`]
    /// device).
    graphs: Option<DecodeGraphs>,
    /// Which replica this is: its copy of new weights ([`GpuWeights`]).
    replica: usize,
}

impl GpuRunner {
    pub fn new(model: Arc<GpuModel>, num_blocks: usize, block_size: usize) -> crate::Result<Self> {
        let cache = model.new_cache(num_blocks, block_size)?;
        let device = format!("cuda ({})", model.gpu().name());
        Ok(GpuRunner {
            gpu: model.gpu().clone(),
            model: Some(model),
            cache,
            device,
            draw_on_device: false,
            tier: None,
            kernels: Kernels::default(),
            graphs: None,
            replica: 0,
        })
    }

    /// Runs the kernels `kernels` turns on (each off by default: the
    /// validated path).
    pub fn with_kernels(mut self, kernels: Kernels) -> Self {
        self.kernels = kernels;
        self
    }

    /// This runner serves replica `r` (it takes `r`'s copy of new weights).
    pub fn with_replica(mut self, r: usize) -> Self {
        self.replica = r;
        self
    }

    /// Replays decode steps of up to `max_batch` sequences as CUDA graphs
    /// (the model's GPU must be [`crate::Gpu::new_for_graphs`]).
    pub fn with_graphs(mut self, max_batch: usize, max_model_len: usize) -> Self {
        self.graphs = Some(DecodeGraphs::new(max_batch, max_model_len));
        self
    }

    /// A decode step replayed as a graph, if one covers it (the tier's
    /// copies waited for first: a replay cannot wait per layer).
    fn replay(
        &mut self,
        copies: &[BlockCopy],
        batch: &BatchInput,
    ) -> agentd_runtime::Result<Option<GraphLogits>> {
        let Some(graphs) = self.graphs.as_mut() else {
            return Ok(None);
        };
        if let (Some(t), false) = (&self.tier, copies.is_empty()) {
            t.wait_all(&self.gpu).map_err(to_model_error)?;
        }
        let model = self.model.as_ref().ok_or_else(released)?;
        model
            .forward_graph(batch, &mut self.cache, graphs, self.kernels)
            .map_err(to_model_error)
    }

    /// Draws rows on the GPU (`kernels/sample.cu`) instead of handing the
    /// engine logits.
    pub fn with_device_sampling(mut self, on: bool) -> Self {
        self.draw_on_device = on;
        self
    }
    /// Queues the tier's copies (none: nothing; copies without a tier: the
    /// engine's error for a runner without one).
    fn queue_copies(&mut self, copies: &[BlockCopy]) -> agentd_runtime::Result<()> {
        if copies.is_empty() {
            return Ok(());
        }
        let Some(tier) = self.tier.as_mut() else {
            return Err(no_host_tier(&self.device));
        };
        tier.enqueue(&self.gpu, &self.cache, copies)
            .map_err(to_model_error)
    }

    /// Takes `weights`' copy for this replica (a swap or a resume), on this
    /// runner's device; the decode graphs, which hold the old weights'
    /// addresses, are dropped and captured again.
    fn take_weights(&mut self, weights: Arc<dyn LoadedModel>) -> agentd_runtime::Result<()> {
        let any: Arc<dyn std::any::Any + Send + Sync> = weights;
        let weights = any.downcast::<GpuWeights>().map_err(|_| {
            to_model_error(CudaError::Unsupported(
                "the weights were loaded by another backend".into(),
            ))
        })?;
        let next = weights.replica(self.replica).cloned().ok_or_else(|| {
            to_model_error(CudaError::Unsupported(format!(
                "the new weights have no copy for replica {}",
                self.replica
            )))
        })?;
        if !Arc::ptr_eq(next.gpu(), &self.gpu) {
            return Err(to_model_error(CudaError::Unsupported(
                "the new weights are on another device".into(),
            )));
        }
        self.gpu.synchronize().map_err(to_model_error)?;
        self.model = Some(next);
        if let Some(g) = self.graphs.as_mut() {
            g.clear();
        }
        Ok(())
    }
}

/// The error of a step while the weights are released.
fn released() -> ModelError {
    ModelError::Backend {
        backend: "cuda",
        message: "the weights are released (resume_memory_occupation first)".into(),
    }
}

/// A step's [`StepOpts`] from the runner's fields (borrowed apart from its
/// cache, which the step takes mutably).
fn opts(tier: &Option<GpuHostTier>, kernels: Kernels) -> StepOpts<'_> {
    StepOpts {
        tier: tier.as_ref(),
        kernels,
    }
}

fn to_model_error(e: CudaError) -> ModelError {
    match e {
        CudaError::Model(m) => m,
        other => ModelError::Backend {
            backend: "cuda",
            message: other.to_string(),
        },
    }
}

impl StepRunner for GpuRunner {
    fn step(&mut self, batch: &BatchInput) -> agentd_runtime::Result<Logits> {
        self.step_after_copies(&[], batch)
    }

    /// The tier's copies are queued on their own stream; each layer of the
    /// forward waits for its own layer's copies only.
    fn step_after_copies(
        &mut self,
        copies: &[BlockCopy],
        batch: &BatchInput,
    ) -> agentd_runtime::Result<Logits> {
        self.queue_copies(copies)?;
        if let Some(out) = self.replay(copies, batch)? {
            let model = self.model.as_ref().ok_or_else(released)?;
            let flat = model.graph_logits(&out).map_err(to_model_error)?;
            return Logits::from_flat(flat, model.config().vocab_size);
        }
        let model = self.model.as_ref().ok_or_else(released)?;
        let flat = model
            .forward_after(batch, &mut self.cache, opts(&self.tier, self.kernels))
            .map_err(to_model_error)?;
        if flat.is_empty() {
            return Ok(Logits::empty());
        }
        Logits::from_flat(flat, model.config().vocab_size)
    }

    fn step_and_draw(
        &mut self,
        copies: &[BlockCopy],
        batch: &BatchInput,
        plans: &[RowPlan],
    ) -> agentd_runtime::Result<Vec<Drawn>> {
        if !self.draw_on_device {
            let logits = self.step_after_copies(copies, batch)?;
            return draw_rows(&logits, plans);
        }
        self.queue_copies(copies)?;
        if let Some(out) = self.replay(copies, batch)? {
            let model = self.model.as_ref().ok_or_else(released)?;
            return model
                .draw_at(out.ptr, out.rows, plans)
                .map_err(to_model_error);
        }
        let model = self.model.as_ref().ok_or_else(released)?;
        model
            .forward_and_draw(
                batch,
                &mut self.cache,
                opts(&self.tier, self.kernels),
                plans,
            )
            .map_err(to_model_error)
    }

    fn enable_host_tier(&mut self, slots: usize) -> agentd_runtime::Result<()> {
        self.gpu.synchronize().map_err(to_model_error)?;
        self.tier = match slots {
            0 => None,
            n => Some(GpuHostTier::new(&self.gpu, &self.cache, n).map_err(to_model_error)?),
        };
        Ok(())
    }

    /// Copies with no step after them (before a weight swap): the main
    /// stream waits for all of them.
    fn copy_blocks(&mut self, copies: &[BlockCopy]) -> agentd_runtime::Result<()> {
        self.queue_copies(copies)?;
        if let Some(t) = &self.tier {
            t.wait_all(&self.gpu).map_err(to_model_error)?;
        }
        Ok(())
    }

    /// New weights between steps ([`GpuRunner::take_weights`]).
    fn swap_model(&mut self, model: Arc<dyn LoadedModel>) -> agentd_runtime::Result<()> {
        self.take_weights(model)
    }

    /// Gives the KV pool's device memory (the engine flushed every block
    /// first) and this replica's weights back, then trims the device's
    /// stream-ordered pool so the memory returns to the device (SGLang's
    /// `release_memory_occupation`). The host tier's pinned memory stays.
    fn release_memory(&mut self, tags: MemoryTags) -> agentd_runtime::Result<()> {
        if let Some(t) = &self.tier {
            t.wait_all(&self.gpu).map_err(to_model_error)?;
        }
        self.gpu.synchronize().map_err(to_model_error)?;
        if let Some(g) = self.graphs.as_mut() {
            g.clear();
        }
        if tags.kv_cache {
            self.cache.release();
        }
        if tags.weights {
            self.model = None;
        }
        self.gpu.trim_pool().map_err(to_model_error)
    }

    /// A zeroed KV pool of the same geometry, and `weights` (loaded by the
    /// engine's loader) when the weights were released.
    fn resume_memory(
        &mut self,
        tags: MemoryTags,
        weights: Option<Arc<dyn LoadedModel>>,
    ) -> agentd_runtime::Result<()> {
        if tags.weights {
            let w = weights.ok_or_else(|| {
                to_model_error(CudaError::Unsupported(
                    "resuming the weights needs the loaded weights".into(),
                ))
            })?;
            self.take_weights(w)?;
        }
        if tags.kv_cache {
            self.cache.restore(&self.gpu).map_err(to_model_error)?;
        }
        Ok(())
    }

    fn draws_on_device(&self) -> bool {
        self.draw_on_device
    }

    fn block_size(&self) -> usize {
        self.cache.config().block_size
    }

    fn num_blocks(&self) -> usize {
        self.cache.config().num_blocks
    }

    fn device(&self) -> String {
        self.device.clone()
    }
}
