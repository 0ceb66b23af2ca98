//! The sparse MoE block on the GPU (Qwen3-MoE; GLM-4.5 with its grouped
//! sigmoid router, correction bias and shared experts): the router product on the device,
//! its `[tokens, experts]` f32 logits downloaded (a few hundred KB; one
//! synchronisation a sparse layer) and routed on the host exactly as the
//! CPU backend routes ([`crate::moe_plan`]), then per busy expert, in index
//! order: its tokens' rows gathered, its SwiGLU MLP by cuBLAS, the output
//! added into an f32 accumulator with the routing weight; the sum rounded
//! into the pending MLP output. Correct first: a step with sparse layers
//! synchronises per layer and is never captured into a graph.
//! `--device-moe` routes on the device instead (`moe_device.rs`).

use crate::device::Buf;
use crate::error::{CudaError, Result};
use crate::forward::StepPtrs;
use crate::model::{GpuModel, SparseFfn};
use crate::moe_plan::plan;

impl GpuModel {
    /// `step.ws.down = Σ_e w_e · expert_e(step.ws.x)` for each token's
    /// routed experts, plus the shared experts' output (after the routed
    /// sum, as transformers adds it).
    pub(crate) fn moe_forward(&self, step: &StepPtrs, ffn: &SparseFfn) -> Result<()> {
        let (gpu, dt, t) = (&*self.gpu, self.dtype, step.t);
        let moe = self.moe_cfg()?;
        let (hid, inter) = (self.cfg.hidden_size, moe.moe_intermediate_size);
        let logits = self.router_logits(step, ffn)?;
        let bias = ffn.correction_bias.as_deref();
        let routed = plan(&gpu.download(&logits)?, t, bias, moe)?;
        let rows = gpu.upload(&routed.tokens)?;
        let weights = gpu.upload(&routed.weights)?;
        let s = Scratch::new(gpu, routed.max_len(), hid, inter)?;
        let acc = gpu.zeros::<f32>(t * hid)?;
        for run in &routed.runs {
            let expert = ffn.experts.get(run.expert).ok_or_else(|| {
                CudaError::Unsupported(format!("expert {} of {}", run.expert, ffn.experts.len()))
            })?;
            let (r, w) = (gpu.ptr(&rows, run.offset), gpu.ptr(&weights, run.offset));
            gpu.gather_rows(dt, gpu.ptr(&s.xs, 0), step.ws.x, r, run.len, hid)?;
            let acc_rw = (gpu.ptr(&acc, 0), r, w);
            self.expert_into_acc(&s, expert, gpu.ptr(&s.xs, 0), run.len, inter, acc_rw)?;
        }
        self.shared_into_acc(step, ffn, &acc)?;
        gpu.cast_rows(dt, step.ws.down, gpu.ptr(&acc, 0), t * hid)
    }

    /// The MoE config a sparse layer runs by.
    pub(crate) fn moe_cfg(&self) -> Result<&agentd_runtime::config::MoeConfig> {
        self.cfg
            .moe
            .as_ref()
            .ok_or_else(|| CudaError::Unsupported("a sparse layer without a MoE config".into()))
    }

    /// The router product: `[tokens, experts]` f32 logits.
    pub(crate) fn router_logits(&self, step: &StepPtrs, ffn: &SparseFfn) -> Result<Buf<f32>> {
        let (gpu, e) = (&*self.gpu, self.moe_cfg()?.num_experts);
        let logits = gpu.zeros::<f32>(step.t * e)?;
        let (x, gate) = (step.ws.x, gpu.ptr(&ffn.gate, 0));
        let hid = self.cfg.hidden_size;
        gpu.linear(
            self.dtype,
            x,
            gate,
            gpu.ptr(&logits, 0),
            true,
            step.t,
            e,
            hid,
        )?;
        Ok(logits)
    }

    /// The shared experts' output (GLM-4.5) added into `acc` after the
    /// routed sum, as transformers adds it.
    pub(crate) fn shared_into_acc(
        &self,
        step: &StepPtrs,
        ffn: &SparseFfn,
        acc: &Buf<f32>,
    ) -> Result<()> {
        let (Some(shared), Some(moe)) = (&ffn.shared, self.cfg.moe.as_ref()) else {
            return Ok(());
        };
        let (gpu, t, hid) = (&*self.gpu, step.t, self.cfg.hidden_size);
        let inter = moe.n_shared_experts * moe.moe_intermediate_size;
        let s = Scratch::new(gpu, t, hid, inter)?;
        let all: Vec<i32> = (0..t).map(|i| i as i32).collect();
        let (all, ones) = (gpu.upload(&all)?, gpu.upload(&vec![1f32; t])?);
        let acc_rw = (gpu.ptr(acc, 0), gpu.ptr(&all, 0), gpu.ptr(&ones, 0));
        self.expert_into_acc(&s, shared, step.ws.x, t, inter, acc_rw)
    }

    /// One SwiGLU MLP (`mlp`: fused gate/up, down; `inter` units) over `m`
    /// rows at `x`, its output added into the f32 accumulator at `rw.0`,
    /// rows `rw.1` with weights `rw.2`.
    fn expert_into_acc(
        &self,
        s: &Scratch,
        mlp: &(Buf<u16>, Buf<u16>),
        x: u64,
        m: usize,
        inter: usize,
        rw: (u64, u64, u64),
    ) -> Result<()> {
        let (gpu, dt, hid) = (&*self.gpu, self.dtype, self.cfg.hidden_size);
        let p = |b: &Buf<u16>| gpu.ptr(b, 0);
        let (gate_up, down) = mlp;
        gpu.linear(dt, x, p(gate_up), p(&s.gu), false, m, 2 * inter, hid)?;
        gpu.silu_mul(dt, p(&s.act), p(&s.gu), m, inter)?;
        gpu.linear(dt, p(&s.act), p(down), p(&s.out), false, m, hid, inter)?;
        gpu.scatter_add_rows(dt, rw.0, p(&s.out), rw.1, rw.2, m, hid)
    }
}

/// One MLP's scratch rows: its gathered input, gate/up, activation, output.
struct Scratch {
    xs: Buf<u16>,
    gu: Buf<u16>,
    act: Buf<u16>,
    out: Buf<u16>,
}

impl Scratch {
    fn new(gpu: &crate::device::Gpu, rows: usize, hid: usize, inter: usize) -> Result<Self> {
        Ok(Scratch {
            xs: gpu.zeros::<u16>(rows * hid)?,
            gu: gpu.zeros::<u16>(rows * 2 * inter)?,
            act: gpu.zeros::<u16>(rows * inter)?,
            out: gpu.zeros::<u16>(rows * hid)?,
        })
    }
}
