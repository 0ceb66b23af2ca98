//! [`GpuRunner`]: the CUDA backend as the engine's [`StepRunner`]: one GPU
//! model and its device-resident KV cache per replica.

use std::sync::Arc;

use agentd_runtime::sampling::device::{draw_rows, Drawn, RowPlan};
use agentd_runtime::{BatchInput, BlockCopy, Logits, ModelError, StepRunner};

use crate::error::CudaError;
use crate::model::{GpuKvCache, GpuQwen3};

pub struct GpuRunner {
    model: Arc<GpuQwen3>,
    cache: GpuKvCache,
    device: String,
    /// Rows drawn on the GPU (`--device-sampling`); off: logits come back
    /// to the host sampler (the path validated on an H200).
    draw_on_device: bool,
}

impl GpuRunner {
    pub fn new(model: Arc<GpuQwen3>, num_blocks: usize, block_size: usize) -> crate::Result<Self> {
        let cache = model.new_cache(num_blocks, block_size)?;
        let device = format!("cuda ({})", model.gpu().name());
        Ok(GpuRunner {
            model,
            cache,
            device,
            draw_on_device: false,
        })
    }

    /// Draws rows on the GPU (`kernels/sample.cu`) instead of handing the
    /// engine logits.
    pub fn with_device_sampling(mut self, on: bool) -> Self {
        self.draw_on_device = on;
        self
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
        let flat = self
            .model
            .forward(batch, &mut self.cache)
            .map_err(to_model_error)?;
        if flat.is_empty() {
            return Ok(Logits::empty());
        }
        Logits::from_flat(flat, self.model.config().vocab_size)
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
        self.copy_blocks(copies)?;
        self.model
            .forward_and_draw(batch, &mut self.cache, plans)
            .map_err(to_model_error)
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
