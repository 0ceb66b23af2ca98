//! Releasing the engine's memory between RL rollouts and taking it again
//! (SGLang's `release_memory_occupation` / `resume_memory_occupation`,
//! vLLM's `/sleep` / `/wake_up`; issue 31).
//!
//! As in SGLang (`scheduler_update_weights_mixin.py`), a release is
//! refused while any request runs or waits; the KV cache is flushed (its
//! blocks' contents are gone) and each worker frees its runner's pool
//! and/or drops its weights between steps ([`crate::control::RunnerOp`]).
//! While anything is released no step runs and new submissions wait in the
//! inbox, as during a pause; they run once everything is resumed. A resume
//! of the weights takes a model the caller loaded (the server reads it
//! from the path it serves), checked against the architecture.

use std::sync::Arc;

use agentd_runtime::{LoadedModel, MemoryTags};

use crate::control::{ControlError, RunnerOp};
use crate::engine::Engine;

impl Engine {
    /// Gives `tags` back to the system on every replica; returns the ones
    /// released now (those already released are left as they are, as
    /// SGLang adds tags to a set). Refused while a request runs or waits.
    pub fn release_memory(&self, tags: MemoryTags) -> Result<MemoryTags, ControlError> {
        let shared = self.shared();
        let new = shared.section(|core| {
            if core.shutdown {
                return Err(ControlError::ShuttingDown);
            }
            let new = tags.minus(core.control.released);
            if !new.any() {
                return Ok(new);
            }
            if core.control.swap.is_some() {
                return Err(ControlError::SwapInProgress);
            }
            let (running, waiting) = (core.num_running(), core.num_waiting());
            if running > 0 || waiting > 0 || core.stepping() {
                return Err(ControlError::NotIdle { running, waiting });
            }
            if new.kv_cache {
                let blocks = core.flush_kv();
                tracing::info!(blocks, "KV cache flushed before its release");
            }
            // From here new submissions wait in the inbox.
            core.control.released = core.control.released.union(new);
            core.start_op(RunnerOp::Release(new));
            Ok(new)
        })?;
        if !new.any() {
            return Ok(new);
        }
        shared.wake_all();
        let (mut core, failed) = self.finish_op()?;
        if let Some(e) = failed {
            // Runners are of one kind: none could (the CUDA runner cannot yet).
            core.control.released = core.control.released.minus(new);
            core.end();
            shared.wake_all();
            return Err(e);
        }
        core.end();
        tracing::info!(tags = ?new.names(), "memory released");
        Ok(new)
    }

    /// Takes the released `tags` back on every replica (`weights`, loaded
    /// by the caller, when the weights are among them); submissions held
    /// meanwhile run once nothing is released. `tags` must all be released.
    pub fn resume_memory(
        &self,
        tags: MemoryTags,
        weights: Option<Arc<dyn LoadedModel>>,
    ) -> Result<(), ControlError> {
        let weights = match (tags.weights, weights) {
            (true, Some(m)) => {
                crate::control::check_compatible(self.model_config(), m.config())?;
                Some(m)
            }
            (true, None) => {
                return Err(ControlError::Incompatible(
                    "resuming the weights needs the loaded model".into(),
                ))
            }
            (false, _) => None,
        };
        let shared = self.shared();
        shared.section(|core| {
            if core.shutdown {
                return Err(ControlError::ShuttingDown);
            }
            let missing = tags.minus(core.control.released);
            if missing.any() || !tags.any() {
                return Err(ControlError::NotReleased(missing.names()));
            }
            if core.control.swap.is_some() {
                return Err(ControlError::SwapInProgress);
            }
            core.start_op(RunnerOp::Resume(tags, weights));
            Ok(())
        })?;
        shared.wake_all();
        let (mut core, failed) = self.finish_op()?;
        if failed.is_none() {
            core.control.released = core.control.released.minus(tags);
        }
        core.end();
        shared.wake_all();
        match failed {
            Some(e) => Err(e),
            None => {
                tracing::info!(tags = ?tags.names(), "memory resumed");
                Ok(())
            }
        }
    }

    /// What is released now (SGLang keeps the same set; vLLM's
    /// `is_sleeping` is whether it is empty).
    pub fn released_memory(&self) -> MemoryTags {
        self.shared().section(|core| core.control.released)
    }
}
