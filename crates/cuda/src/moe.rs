//! Qwen3-MoE's sparse block on the GPU: the router product on the device,
//! its `[tokens, experts]` f32 logits downloaded (a few hundred KB; one
//! synchronisation a sparse layer) and routed on the host exactly as the
//! CPU backend routes ([`crate::moe_plan`]), then per busy expert, in index
//! order: its tokens' rows gathered, its SwiGLU MLP by cuBLAS, the output
//! added into an f32 accumulator with the routing weight; the sum rounded
//! into the pending MLP output. Correct first: a step with sparse layers
//! synchronises per layer and is never captured into a graph.

use crate::device::Buf;
use crate::error::{CudaError, Result};
use crate::forward::StepPtrs;
use crate::model::GpuModel;
use crate::moe_plan::plan;

impl GpuModel {
    /// `step.ws.down = Σ_e w_e · expert_e(step.ws.x)` for each token's
    /// routed experts (`gate`: the router, `experts`: fused gate/up, down).
    pub(crate) fn moe_forward(
        &self,
        step: &StepPtrs,
        gate: &Buf<u16>,
        experts: &[(Buf<u16>, Buf<u16>)],
    ) -> Result<()> {
        let (gpu, dt, t) = (&*self.gpu, self.dtype, step.t);
        let moe =
            self.cfg.moe.as_ref().ok_or_else(|| {
                CudaError::Unsupported("a sparse layer without a MoE config".into())
            })?;
        let (hid, e, inter) = (
            self.cfg.hidden_size,
            moe.num_experts,
            moe.moe_intermediate_size,
        );
        let logits = gpu.zeros::<f32>(t * e)?;
        gpu.linear(
            dt,
            step.ws.x,
            gpu.ptr(gate, 0),
            gpu.ptr(&logits, 0),
            true,
            t,
            e,
            hid,
        )?;
        let routed = plan(&gpu.download(&logits)?, t, moe)?;
        let n = routed.max_len();
        let rows = gpu.upload(&routed.tokens)?;
        let weights = gpu.upload(&routed.weights)?;
        let xs = gpu.zeros::<u16>(n * hid)?;
        let gu = gpu.zeros::<u16>(n * 2 * inter)?;
        let act = gpu.zeros::<u16>(n * inter)?;
        let out = gpu.zeros::<u16>(n * hid)?;
        let acc = gpu.zeros::<f32>(t * hid)?;
        let p = |b: &Buf<u16>| gpu.ptr(b, 0);
        for run in &routed.runs {
            let (gate_up, down) = experts.get(run.expert).ok_or_else(|| {
                CudaError::Unsupported(format!("expert {} of {}", run.expert, experts.len()))
            })?;
            let (r, w) = (gpu.ptr(&rows, run.offset), gpu.ptr(&weights, run.offset));
            let m = run.len;
            gpu.gather_rows(dt, p(&xs), step.ws.x, r, m, hid)?;
            gpu.linear(dt, p(&xs), p(gate_up), p(&gu), false, m, 2 * inter, hid)?;
            gpu.silu_mul(dt, p(&act), p(&gu), m, inter)?;
            gpu.linear(dt, p(&act), p(down), p(&out), false, m, hid, inter)?;
            gpu.scatter_add_rows(dt, gpu.ptr(&acc, 0), p(&out), r, w, m, hid)?;
        }
        gpu.cast_rows(dt, step.ws.down, gpu.ptr(&acc, 0), t * hid)
    }
}
