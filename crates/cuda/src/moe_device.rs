//! The sparse MoE block with no host round trip (`--device-moe`,
//! `kernels/moe.cu`): the router product, then on the device the routing
//! (`moe_route`, the CPU router's rules), the pairs grouped per expert
//! and padded to GEMM blocks (`moe_align_*`), gate/up and down as grouped
//! GEMMs over every expert at once (`moe_gemm`, tensor cores), and each
//! token's choices summed in expert order (`moe_combine`, no atomics: the
//! sum order is the host path's). Buffers are sized from the token count
//! alone ([`device_bounds`]), so nothing waits for the routing. Shared
//! experts then add as on the host path.

use crate::device::{Arg, Buf, Gpu};
use crate::error::{CudaError, Result};
use crate::forward::StepPtrs;
use crate::model::{GpuModel, SparseFfn};
use crate::moe_plan::{device_bounds, router_args, DeviceBounds, MOE_BN};
use crate::ops::i32_of;
use crate::plan::Dtype;

/// The routing and grouping of one sparse layer's step, on the device.
struct Routed {
    /// Tokens routed, choices per token, and the buffer bounds.
    tokens: usize,
    topk: usize,
    bounds: DeviceBounds,
    ids: Buf<i32>,
    weights: Buf<f32>,
    offsets: Buf<i32>,
    block_expert: Buf<i32>,
    num_blocks: Buf<i32>,
    sorted: Buf<i32>,
    row_of: Buf<i32>,
}

impl GpuModel {
    /// [`GpuModel::moe_forward`] on the device alone.
    pub(crate) fn moe_forward_device(&self, step: &StepPtrs, ffn: &SparseFfn) -> Result<()> {
        let (gpu, dt, t) = (&*self.gpu, self.dtype, step.t);
        let moe = self.moe_cfg()?;
        let (hid, inter) = (self.cfg.hidden_size, moe.moe_intermediate_size);
        let b = device_bounds(t, moe);
        let logits = self.router_logits(step, ffn)?;
        let r = self.route_on_device(&logits, ffn, t, &b)?;
        let gu = gpu.zeros::<u16>(b.max_rows * 2 * inter)?;
        let act = gpu.zeros::<u16>(b.max_rows * inter)?;
        let out = gpu.zeros::<u16>(b.max_rows * hid)?;
        let p = |x: &Buf<u16>| gpu.ptr(x, 0);
        let tables = (&ffn.tables.gate_up, &ffn.tables.down);
        let gemm = |out: u64, a: u64, w: &Buf<u64>, n: usize, kk: usize, gather: bool| {
            gpu.moe_gemm(dt, &r, (out, a, gpu.ptr(w, 0)), (n, kk), gather)
        };
        gemm(p(&gu), step.ws.x, tables.0, 2 * inter, hid, true)?;
        gpu.silu_mul(dt, p(&act), p(&gu), b.max_rows, inter)?;
        gemm(p(&out), p(&act), tables.1, hid, inter, false)?;
        let acc = gpu.zeros::<f32>(t * hid)?;
        gpu.moe_combine(dt, &r, gpu.ptr(&acc, 0), p(&out), hid)?;
        self.shared_into_acc(step, ffn, &acc)?;
        gpu.cast_rows(dt, step.ws.down, gpu.ptr(&acc, 0), t * hid)
    }

    /// Routes `t` tokens' router `logits` and lays their pairs out per
    /// expert, all on the stream.
    fn route_on_device(
        &self,
        logits: &Buf<f32>,
        ffn: &SparseFfn,
        t: usize,
        b: &DeviceBounds,
    ) -> Result<Routed> {
        let gpu = &*self.gpu;
        let moe = self.moe_cfg()?;
        let e = moe.num_experts;
        let r = Routed {
            tokens: t,
            topk: moe.num_experts_per_tok,
            bounds: *b,
            ids: gpu.zeros::<i32>(b.pairs)?,
            weights: gpu.zeros::<f32>(b.pairs)?,
            offsets: gpu.zeros::<i32>(e + 1)?,
            block_expert: gpu.zeros::<i32>(b.max_blocks)?,
            num_blocks: gpu.zeros::<i32>(1)?,
            sorted: gpu.zeros::<i32>(b.max_rows)?,
            row_of: gpu.zeros::<i32>(b.pairs)?,
        };
        let (kind, n_group, topk_group, scale) = router_args(moe);
        let route = RouteScalars {
            tokens: i32_of("tokens", t)?,
            experts: i32_of("experts", e)?,
            topk: i32_of("top-k", moe.num_experts_per_tok)?,
            kind,
            norm: i32::from(moe.norm_topk_prob),
            n_group,
            topk_group,
            scale,
        };
        let p = r.ptrs(gpu);
        let bias = ffn.tables.bias.as_ref().map_or(0, |x| gpu.ptr(x, 0));
        let grid = (t.div_ceil(128) as u32, 1, 1);
        gpu.launch(
            "moe_route",
            grid,
            128,
            0,
            &route_args(&p, gpu.ptr(logits, 0), bias, &route),
        )?;
        let pairs = i32_of("pairs", b.pairs)?;
        let count = align_count_args(&p, pairs, route.experts);
        gpu.launch("moe_align_count", (1, 1, 1), 1024, 0, &count)?;
        let scatter = align_scatter_args(&p, pairs);
        gpu.launch("moe_align_scatter", (e as u32, 1, 1), 256, 0, &scatter)?;
        Ok(r)
    }
}

impl Gpu {
    /// The grouped GEMM over every used M-block of `r`: `out[row] =
    /// a[src(row)] · W_e^T` with `W_e` read from the address table
    /// `weights` (`io` = (out, a, weights)); `nk` = (N, K); `gather`: rows
    /// of `a` by token.
    fn moe_gemm(
        &self,
        dt: Dtype,
        r: &Routed,
        io: (u64, u64, u64),
        nk: (usize, usize),
        gather: bool,
    ) -> Result<()> {
        let (n, k) = nk;
        if !k.is_multiple_of(8) {
            return Err(CudaError::Unsupported(format!(
                "grouped GEMM over K = {k} (a multiple of 8)"
            )));
        }
        self.launch(
            &format!("moe_gemm_{}", dt.suffix()),
            (n.div_ceil(MOE_BN) as u32, r.bounds.max_blocks as u32, 1),
            128,
            0,
            &gemm_args(&r.ptrs(self), io, nk, gather, r.topk)?,
        )
    }

    /// `acc[t] = Σ_j w[t, j] · y[row_of[t, j]]` in f32 over `hidden`
    /// columns, each token's choices in expert order.
    fn moe_combine(&self, dt: Dtype, r: &Routed, acc: u64, y: u64, hidden: usize) -> Result<()> {
        self.launch(
            &format!("moe_combine_{}", dt.suffix()),
            (r.tokens as u32, 1, 1),
            256,
            0,
            &combine_args(&r.ptrs(self), acc, y, r.topk, hidden)?,
        )
    }
}

/// The device layout of a routing (for `agentd-gpu-check`): the routed
/// expert ids and weights, `[tokens * k]`, and `moe_align`'s offsets,
/// block experts, sorted pairs and pair rows, downloaded.
pub struct RoutedDownload {
    pub ids: Vec<i32>,
    pub weights: Vec<f32>,
    pub offsets: Vec<i32>,
    pub block_expert: Vec<i32>,
    pub sorted: Vec<i32>,
    pub row_of: Vec<i32>,
}

impl GpuModel {
    /// Routes `logits` (`[t, experts]` f32, on the device) with layer
    /// `layer`'s sparse block on the device and downloads the result.
    pub fn route_for_check(
        &self,
        layer: usize,
        logits: &Buf<f32>,
        t: usize,
    ) -> Result<RoutedDownload> {
        let gpu = &*self.gpu;
        let (Some(moe), Some(crate::model::Ffn::Sparse(ffn))) = (
            self.cfg.moe.as_ref(),
            self.layers.get(layer).map(|l| &l.ffn),
        ) else {
            return Err(CudaError::Unsupported(format!(
                "layer {layer} is not sparse"
            )));
        };
        let b = device_bounds(t, moe);
        let r = self.route_on_device(logits, ffn, t, &b)?;
        let nb = gpu
            .download(&r.num_blocks)?
            .first()
            .copied()
            .unwrap_or(0)
            .max(0) as usize;
        let offsets = gpu.download(&r.offsets)?;
        let used = offsets.last().copied().unwrap_or(0).max(0) as usize;
        let mut block_expert = gpu.download(&r.block_expert)?;
        block_expert.truncate(nb);
        let mut sorted = gpu.download(&r.sorted)?;
        sorted.truncate(used);
        Ok(RoutedDownload {
            ids: gpu.download(&r.ids)?,
            weights: gpu.download(&r.weights)?,
            offsets,
            block_expert,
            sorted,
            row_of: gpu.download(&r.row_of)?,
        })
    }
}

/// The device addresses of a routing's buffers ([`Routed`]).
#[derive(Debug, Clone, Copy)]
struct RoutedPtrs {
    ids: u64,
    weights: u64,
    offsets: u64,
    block_expert: u64,
    num_blocks: u64,
    sorted: u64,
    row_of: u64,
}

impl Routed {
    fn ptrs(&self, gpu: &Gpu) -> RoutedPtrs {
        RoutedPtrs {
            ids: gpu.ptr(&self.ids, 0),
            weights: gpu.ptr(&self.weights, 0),
            offsets: gpu.ptr(&self.offsets, 0),
            block_expert: gpu.ptr(&self.block_expert, 0),
            num_blocks: gpu.ptr(&self.num_blocks, 0),
            sorted: gpu.ptr(&self.sorted, 0),
            row_of: gpu.ptr(&self.row_of, 0),
        }
    }
}

/// `moe_route`'s scalar arguments.
struct RouteScalars {
    tokens: i32,
    experts: i32,
    topk: i32,
    kind: i32,
    norm: i32,
    n_group: i32,
    topk_group: i32,
    scale: f32,
}

// The launches' argument lists, in the order of kernels/moe.cu's
// signatures (tested against them below).

fn route_args(p: &RoutedPtrs, logits: u64, bias: u64, s: &RouteScalars) -> Vec<Arg> {
    vec![
        Arg::Ptr(p.ids),
        Arg::Ptr(p.weights),
        Arg::Ptr(logits),
        Arg::Ptr(bias),
        Arg::I32(s.tokens),
        Arg::I32(s.experts),
        Arg::I32(s.topk),
        Arg::I32(s.kind),
        Arg::I32(s.norm),
        Arg::I32(s.n_group),
        Arg::I32(s.topk_group),
        Arg::F32(s.scale),
    ]
}

fn align_count_args(p: &RoutedPtrs, pairs: i32, experts: i32) -> Vec<Arg> {
    vec![
        Arg::Ptr(p.offsets),
        Arg::Ptr(p.block_expert),
        Arg::Ptr(p.num_blocks),
        Arg::Ptr(p.ids),
        Arg::I32(pairs),
        Arg::I32(experts),
    ]
}

fn align_scatter_args(p: &RoutedPtrs, pairs: i32) -> Vec<Arg> {
    vec![
        Arg::Ptr(p.sorted),
        Arg::Ptr(p.row_of),
        Arg::Ptr(p.offsets),
        Arg::Ptr(p.ids),
        Arg::I32(pairs),
    ]
}

/// `io` = (out, a, the experts' address table); `nk` = (N, K).
fn gemm_args(
    p: &RoutedPtrs,
    io: (u64, u64, u64),
    nk: (usize, usize),
    gather: bool,
    topk: usize,
) -> Result<Vec<Arg>> {
    Ok(vec![
        Arg::Ptr(io.0),
        Arg::Ptr(io.1),
        Arg::Ptr(io.2),
        Arg::Ptr(p.sorted),
        Arg::Ptr(p.block_expert),
        Arg::Ptr(p.num_blocks),
        Arg::I32(i32_of("N", nk.0)?),
        Arg::I32(i32_of("K", nk.1)?),
        Arg::I32(i32::from(gather)),
        Arg::I32(i32_of("top-k", topk)?),
    ])
}

fn combine_args(p: &RoutedPtrs, acc: u64, y: u64, topk: usize, hidden: usize) -> Result<Vec<Arg>> {
    Ok(vec![
        Arg::Ptr(acc),
        Arg::Ptr(y),
        Arg::Ptr(p.row_of),
        Arg::Ptr(p.weights),
        Arg::I32(i32_of("top-k", topk)?),
        Arg::I32(i32_of("hidden", hidden)?),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch_sig::{params_in, values};

    const MOE: &str = include_str!("../../../kernels/moe.cu");

    fn params(marker: &str) -> Vec<String> {
        params_in(MOE, marker)
    }

    /// Each argument's value names the parameter it must land in (`w` and
    /// `weights` are the routing weights, except in the GEMM, where
    /// `weights` is the experts' address table: given the same value).
    fn v(name: &str) -> u64 {
        let names = [
            "ids",
            "weights",
            "logits",
            "bias",
            "tokens",
            "E",
            "k",
            "kind",
            "norm",
            "n_group",
            "topk_group",
            "scale",
            "offsets",
            "block_expert",
            "num_blocks",
            "pairs",
            "sorted",
            "row_of",
            "out",
            "a",
            "N",
            "K",
            "gather",
            "acc",
            "y",
            "hidden",
        ];
        let name = match name {
            "w" => "weights",
            "topk" => "k",
            n => n,
        };
        names
            .iter()
            .position(|n| *n == name)
            .map(|i| i as u64 + 1)
            .unwrap_or_else(|| panic!("unknown parameter {name}"))
    }

    #[test]
    fn launch_arguments_follow_the_kernels_signatures() {
        let p = RoutedPtrs {
            ids: v("ids"),
            weights: v("weights"),
            offsets: v("offsets"),
            block_expert: v("block_expert"),
            num_blocks: v("num_blocks"),
            sorted: v("sorted"),
            row_of: v("row_of"),
        };
        let i = |n: &str| v(n) as i32;
        let s = RouteScalars {
            tokens: i("tokens"),
            experts: i("E"),
            topk: i("k"),
            kind: i("kind"),
            norm: i("norm"),
            n_group: i("n_group"),
            topk_group: i("topk_group"),
            scale: v("scale") as f32,
        };
        let want = |marker: &str| params(marker).iter().map(|n| v(n)).collect::<Vec<u64>>();
        let route = route_args(&p, v("logits"), v("bias"), &s);
        assert_eq!(values(&route), want("void moe_route"));
        let count = align_count_args(&p, i("pairs"), i("E"));
        assert_eq!(values(&count), want("void moe_align_count"));
        let scatter = align_scatter_args(&p, i("pairs"));
        assert_eq!(values(&scatter), want("void moe_align_scatter"));
        let io = (v("out"), v("a"), v("weights"));
        let nk = (v("N") as usize, v("K") as usize);
        let gemm = gemm_args(&p, io, nk, v("gather") != 0, v("k") as usize).unwrap();
        // gather is a flag (1): compare it as one.
        let mut want_gemm = want("AGENTD_BF16_F16(moe_gemm,");
        want_gemm[8] = 1;
        assert_eq!(values(&gemm), want_gemm);
        let combine = combine_args(&p, v("acc"), v("y"), v("k") as usize, v("hidden") as usize);
        assert_eq!(
            values(&combine.unwrap()),
            want("AGENTD_BF16_F16(moe_combine,")
        );
    }
}
