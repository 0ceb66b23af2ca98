//! New weights for running GPU runners (`/update_weights_from_disk` and
//! the other weight-update routes, issue 31): [`GpuLoader`] loads a
//! checkpoint onto every replica's device as the serving one was loaded
//! (same dtype), and [`GpuWeights`] hands each [`crate::GpuRunner`] its
//! device's copy (`StepRunner::swap_model`). The new copy is uploaded while
//! the old one still serves, so a swap needs free device memory for a
//! second copy of the weights (a lower `--gpu-memory-utilization` leaves
//! it; otherwise the load fails and the old weights keep serving).

use std::path::Path;
use std::sync::Arc;

use agentd_runtime::loader::Weights;
use agentd_runtime::{LoadedModel, ModelConfig, ModelError, StepRunner, WeightLoader};

use crate::device::Gpu;
use crate::model::GpuModel;
use crate::plan::Dtype;

/// Loads checkpoints onto each replica's GPU (replica `r` on `gpus[r]`).
#[derive(Clone)]
pub struct GpuLoader {
    pub gpus: Vec<Arc<Gpu>>,
    pub dtype: Dtype,
}

/// One checkpoint on every replica's GPU.
pub struct GpuWeights {
    cfg: ModelConfig,
    /// Replica `r`'s copy, on `loader.gpus[r]`.
    models: Vec<Arc<GpuModel>>,
    loader: GpuLoader,
}

impl GpuWeights {
    /// Replica `r`'s copy.
    pub fn replica(&self, r: usize) -> Option<&Arc<GpuModel>> {
        self.models.get(r)
    }
}

fn backend(message: String) -> ModelError {
    ModelError::Backend {
        backend: "cuda",
        message,
    }
}

impl WeightLoader for GpuLoader {
    fn load(&self, dir: &Path) -> agentd_runtime::Result<Arc<dyn LoadedModel>> {
        let cfg = ModelConfig::from_dir(dir)?;
        let w = Weights::from_dir(dir, &candle_core::Device::Cpu)?;
        let models = self
            .gpus
            .iter()
            .map(|g| {
                GpuModel::from_weights(g.clone(), cfg.clone(), &w, self.dtype)
                    .map(Arc::new)
                    .map_err(|e| backend(e.to_string()))
            })
            .collect::<agentd_runtime::Result<_>>()?;
        Ok(Arc::new(GpuWeights {
            cfg,
            models,
            loader: self.clone(),
        }))
    }
}

impl LoadedModel for GpuWeights {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// GPU runners are built per device at start (`serve --device cuda`);
    /// these weights only replace theirs.
    fn runner(
        self: Arc<Self>,
        _name: &str,
        _num_blocks: usize,
        _block_size: usize,
        _threads: usize,
    ) -> agentd_runtime::Result<Box<dyn StepRunner>> {
        Err(backend(
            "GPU runners are built per device at start; loaded weights only swap in".into(),
        ))
    }

    fn loader(&self) -> Arc<dyn WeightLoader> {
        Arc::new(self.loader.clone())
    }
}
