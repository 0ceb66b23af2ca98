//! Sampling on the GPU (`kernels/sample.cu`, `--device-sampling`): a step's
//! logits stay on the device and one CTA per row draws the row's token by
//! its [`RowPlan`] (the layout: [`crate::sampling`]); only the tokens and
//! the requested logprobs come back, a few words a row where the host
//! sampler needed `vocab` floats (78 MB at batch 128 for Qwen3's
//! vocabulary, 42-65 ms on an H200: kernels/NOTES.md).

use agentd_runtime::sampling::device::{Drawn, RowPlan};
use agentd_runtime::BatchInput;

use crate::device::{Arg, Gpu};
use crate::error::{CudaError, Result};
use crate::forward::StepOpts;
use crate::model::{GpuKvCache, GpuModel};
use crate::sampling::{pack, unpack, SAMPLE_THREADS};

impl GpuModel {
    /// One step whose logits rows are drawn on the device: `plans[i]` for
    /// row `i` (one per logits index of `batch`), run with `opts`.
    pub fn forward_and_draw(
        &self,
        batch: &BatchInput,
        cache: &mut GpuKvCache,
        opts: StepOpts<'_>,
        plans: &[RowPlan],
    ) -> Result<Vec<Drawn>> {
        let Some(l) = self.forward_device_after(batch, cache, opts)? else {
            self.gpu.synchronize()?;
            return Ok(Vec::new());
        };
        self.draw_at(l.logits_ptr(&self.gpu), l.rows, plans)
    }

    /// Draws the `rows` logits rows at `logits` (one per plan; spent).
    pub(crate) fn draw_at(
        &self,
        logits: u64,
        rows: usize,
        plans: &[RowPlan],
    ) -> Result<Vec<Drawn>> {
        if rows != plans.len() {
            return Err(CudaError::Unsupported(format!(
                "{rows} logits rows for {} sampling plans",
                plans.len()
            )));
        }
        self.gpu.sample_rows(logits, self.cfg.vocab_size, plans)
    }
}

impl Gpu {
    /// Draws `plans.len()` rows of `vocab` f32 logits at `logits` (edited
    /// in place: the caller's logits are spent) and downloads the draws.
    pub fn sample_rows(&self, logits: u64, vocab: usize, plans: &[RowPlan]) -> Result<Vec<Drawn>> {
        if plans.is_empty() {
            return Ok(Vec::new());
        }
        let p = pack(plans, vocab)?;
        let params = self.upload(&p.params)?;
        let edits = self.upload(&p.edits)?;
        let masks = self.upload(&p.masks)?;
        let saved = self.zeros::<f32>(p.num_edits())?;
        let out = self.zeros::<u32>(p.rows * p.out_stride)?;
        let int = |what: &str, v: usize| {
            i32::try_from(v)
                .map_err(|_| CudaError::Unsupported(format!("{what} = {v} exceeds i32")))
        };
        let rows = u32::try_from(p.rows)
            .map_err(|_| CudaError::Unsupported(format!("{} rows exceed u32", p.rows)))?;
        self.launch(
            "sample_rows",
            (rows, 1, 1),
            SAMPLE_THREADS,
            0,
            &[
                Arg::Ptr(logits),
                Arg::I32(int("vocab", vocab)?),
                Arg::Ptr(self.ptr(&params, 0)),
                Arg::Ptr(self.ptr(&edits, 0)),
                Arg::Ptr(self.ptr(&masks, 0)),
                Arg::Ptr(self.ptr(&saved, 0)),
                Arg::Ptr(self.ptr(&out, 0)),
                Arg::I32(int("output stride", p.out_stride)?),
            ],
        )?;
        // A few words a row: a plain (synchronising) download.
        let words = self.download(&out)?;
        unpack(&words, plans, p.out_stride)
    }
}
