//! [`GpuRunner`]: the CUDA backend as the engine's [`StepRunner`]: one GPU
//! model and its device-resident KV cache per replica.

use std::sync::Arc;

use agentd_runtime::{BatchInput, Logits, ModelError, StepRunner};

use crate::error::CudaError;
use crate::model::{GpuKvCache, GpuQwen3};

pub struct GpuRunner {
    model: Arc<GpuQwen3>,
    cache: GpuKvCache,
    device: String,
}

impl GpuRunner {
    pub fn new(model: Arc<GpuQwen3>, num_blocks: usize, block_size: usize) -> crate::Result<Self> {
        let cache = model.new_cache(num_blocks, block_size)?;
        let device = format!("cuda ({})", model.gpu().name());
        Ok(GpuRunner {
            model,
            cache,
            device,
        })
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
