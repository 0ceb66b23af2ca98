//! One typed wrapper per kernel of `kernels/`. Pointers are device addresses
//! (see [`Arg`]); shapes are checked here or by the caller's plan, so a wrong
//! call fails with an error, not a fault on the GPU. The attention kernels'
//! wrappers are in `attn_ops.rs`, the device MoE's in `moe_device.rs`.

use crate::device::{Arg, Gpu};
use crate::error::{CudaError, Result};
use crate::plan::{AttnShape, Dtype};

pub(crate) fn name(base: &str, dt: Dtype) -> String {
    format!("{base}_{}", dt.suffix())
}

pub(crate) fn i32_of(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| CudaError::Unsupported(format!("{what} = {v} exceeds i32")))
}

/// Grid for a grid-stride loop over `n` elements.
fn stride_grid(n: usize) -> u32 {
    n.div_ceil(256).clamp(1, 65_535) as u32
}

impl Gpu {
    /// `residual[t] = emb[ids[t]]` (f32).
    pub fn embed(
        &self,
        dt: Dtype,
        residual: u64,
        emb: u64,
        ids: u64,
        tokens: usize,
        hidden: usize,
    ) -> Result<()> {
        self.launch(
            &name("embed", dt),
            (tokens as u32, 1, 1),
            256,
            0,
            &[
                Arg::Ptr(residual),
                Arg::Ptr(emb),
                Arg::Ptr(ids),
                Arg::I32(i32_of("hidden", hidden)?),
            ],
        )
    }

    /// Fused residual add + RMSNorm (see kernels/layers.cu): `rows` selects
    /// input rows without updating the residual (the final norm).
    #[allow(clippy::too_many_arguments)]
    pub fn add_rms_norm(
        &self,
        dt: Dtype,
        residual: u64,
        delta: Option<u64>,
        rows: Option<u64>,
        w: u64,
        out: u64,
        n_rows: usize,
        hidden: usize,
        eps: f32,
    ) -> Result<()> {
        self.launch(
            &name("add_rms_norm", dt),
            (n_rows as u32, 1, 1),
            256,
            0,
            &[
                Arg::Ptr(residual),
                Arg::Ptr(delta.unwrap_or(0)),
                Arg::Ptr(rows.unwrap_or(0)),
                Arg::Ptr(w),
                Arg::Ptr(out),
                Arg::I32(i32_of("hidden", hidden)?),
                Arg::F32(eps),
            ],
        )
    }

    /// Per-head RMSNorm (when `w` is given) and neox RoPE, in place on
    /// `heads` heads starting `head_offset` elements into each row.
    #[allow(clippy::too_many_arguments)]
    pub fn head_norm_rope(
        &self,
        dt: Dtype,
        x: u64,
        w: Option<u64>,
        positions: u64,
        cos_sin: u64,
        tokens: usize,
        heads: usize,
        head_offset: usize,
        row_stride: usize,
        head_dim: usize,
        eps: f32,
    ) -> Result<()> {
        if !head_dim.is_multiple_of(2) || head_dim > 2048 {
            return Err(CudaError::Unsupported(format!(
                "RoPE over head_dim {head_dim}"
            )));
        }
        self.launch(
            &name("head_norm_rope", dt),
            (tokens as u32, heads as u32, 1),
            (head_dim / 2) as u32,
            0,
            &[
                Arg::Ptr(x),
                Arg::Ptr(w.unwrap_or(0)),
                Arg::Ptr(positions),
                Arg::Ptr(cos_sin),
                Arg::I32(i32_of("head_offset", head_offset)?),
                Arg::I32(i32_of("row_stride", row_stride)?),
                Arg::I32(head_dim as i32),
                Arg::F32(eps),
            ],
        )
    }

    /// Q and K normed per head and rotated, K and V written to their cache
    /// slots, in one launch (`kernels/layers.cu` `qkv_prologue`): what two
    /// [`Gpu::head_norm_rope`] and one [`Gpu::reshape_and_cache`] do.
    #[allow(clippy::too_many_arguments)]
    pub fn qkv_prologue(
        &self,
        dt: Dtype,
        qkv: u64,
        norms: (Option<u64>, Option<u64>),
        positions: u64,
        cos_sin: u64,
        cache: (u64, u64),
        slots: u64,
        tokens: usize,
        num_heads: usize,
        shape: &AttnShape,
        eps: f32,
    ) -> Result<()> {
        let d = shape.head_dim;
        if !d.is_multiple_of(2) || d > 2048 {
            return Err(CudaError::Unsupported(format!("RoPE over head_dim {d}")));
        }
        let row_stride = (num_heads + 2 * shape.num_kv_heads) * d;
        self.launch(
            &name("qkv_prologue", dt),
            (tokens as u32, (num_heads + shape.num_kv_heads) as u32, 1),
            (d / 2) as u32,
            0,
            &[
                Arg::Ptr(qkv),
                Arg::Ptr(norms.0.unwrap_or(0)),
                Arg::Ptr(norms.1.unwrap_or(0)),
                Arg::Ptr(positions),
                Arg::Ptr(cos_sin),
                Arg::Ptr(cache.0),
                Arg::Ptr(cache.1),
                Arg::Ptr(slots),
                Arg::I32(i32_of("heads", num_heads)?),
                Arg::I32(i32_of("kv_heads", shape.num_kv_heads)?),
                Arg::I32(i32_of("row_stride", row_stride)?),
                Arg::I32(d as i32),
                Arg::I32(i32_of("block_size", shape.block_size)?),
                Arg::F32(eps),
            ],
        )
    }

    /// `x[t, i] += bias[i]` over `tokens` rows of `width` (f32 bias).
    pub fn add_bias(
        &self,
        dt: Dtype,
        x: u64,
        bias: u64,
        tokens: usize,
        width: usize,
    ) -> Result<()> {
        let n = tokens * width;
        self.launch(
            &name("add_bias", dt),
            (stride_grid(n), 1, 1),
            256,
            0,
            &[
                Arg::Ptr(x),
                Arg::Ptr(bias),
                Arg::I64(n as i64),
                Arg::I32(i32_of("width", width)?),
            ],
        )
    }

    /// In place: each of `rows` rows of `hidden` RMS-normed with `w`.
    pub fn rms_norm_rows(
        &self,
        dt: Dtype,
        x: u64,
        w: u64,
        rows: usize,
        hidden: usize,
        eps: f32,
    ) -> Result<()> {
        self.launch(
            &name("rms_norm_rows", dt),
            (rows as u32, 1, 1),
            256,
            0,
            &[
                Arg::Ptr(x),
                Arg::Ptr(w),
                Arg::I32(i32_of("hidden", hidden)?),
                Arg::F32(eps),
            ],
        )
    }

    /// GLM's interleaved RoPE over the first `rot_dim` dims of each of
    /// `heads` heads from `head_offset` in rows of `row_stride` (see
    /// `kernels/layers.cu`); `cos_sin` rows are `rot_dim` wide.
    #[allow(clippy::too_many_arguments)]
    pub fn head_rope_interleaved(
        &self,
        dt: Dtype,
        x: u64,
        positions: u64,
        cos_sin: u64,
        tokens: usize,
        heads: usize,
        head_offset: usize,
        row_stride: usize,
        head_dim: usize,
        rot_dim: usize,
    ) -> Result<()> {
        if !rot_dim.is_multiple_of(2) || rot_dim == 0 || rot_dim > head_dim || rot_dim > 2048 {
            return Err(CudaError::Unsupported(format!(
                "interleaved RoPE over {rot_dim} of {head_dim} dims"
            )));
        }
        self.launch(
            &name("head_rope_interleaved", dt),
            (tokens as u32, heads as u32, 1),
            (rot_dim / 2) as u32,
            0,
            &[
                Arg::Ptr(x),
                Arg::Ptr(positions),
                Arg::Ptr(cos_sin),
                Arg::I32(i32_of("head_offset", head_offset)?),
                Arg::I32(i32_of("row_stride", row_stride)?),
                Arg::I32(head_dim as i32),
                Arg::I32(rot_dim as i32),
            ],
        )
    }

    /// GLM-4.5's prologue per head: optional RMSNorm over the whole head,
    /// then neox RoPE over its first `rot_dim` dims (`cos_sin` rows
    /// `rot_dim` wide); see `kernels/layers.cu`.
    #[allow(clippy::too_many_arguments)]
    pub fn head_norm_rope_partial(
        &self,
        dt: Dtype,
        x: u64,
        w: Option<u64>,
        positions: u64,
        cos_sin: u64,
        tokens: usize,
        heads: usize,
        head_offset: usize,
        row_stride: usize,
        head_dim: usize,
        rot_dim: usize,
        eps: f32,
    ) -> Result<()> {
        let ok = head_dim.is_multiple_of(2)
            && head_dim <= 1024
            && rot_dim.is_multiple_of(2)
            && rot_dim > 0
            && rot_dim <= head_dim;
        if !ok {
            return Err(CudaError::Unsupported(format!(
                "partial RoPE over {rot_dim} of {head_dim} dims"
            )));
        }
        self.launch(
            &name("head_norm_rope_partial", dt),
            (tokens as u32, heads as u32, 1),
            (head_dim / 2) as u32,
            0,
            &[
                Arg::Ptr(x),
                Arg::Ptr(w.unwrap_or(0)),
                Arg::Ptr(positions),
                Arg::Ptr(cos_sin),
                Arg::I32(i32_of("head_offset", head_offset)?),
                Arg::I32(i32_of("row_stride", row_stride)?),
                Arg::I32(head_dim as i32),
                Arg::I32(rot_dim as i32),
                Arg::F32(eps),
            ],
        )
    }

    /// `out[i] = x[rows[i]]` for `n` rows of `hidden`.
    pub fn gather_rows(
        &self,
        dt: Dtype,
        out: u64,
        x: u64,
        rows: u64,
        n: usize,
        hidden: usize,
    ) -> Result<()> {
        let args = [
            Arg::Ptr(out),
            Arg::Ptr(x),
            Arg::Ptr(rows),
            Arg::I32(i32_of("hidden", hidden)?),
        ];
        self.launch(&name("gather_rows", dt), (n as u32, 1, 1), 256, 0, &args)
    }

    /// `acc[rows[i]] += w[i] · y[i]` (f32 `acc`) for `n` rows of `hidden`.
    #[allow(clippy::too_many_arguments)]
    pub fn scatter_add_rows(
        &self,
        dt: Dtype,
        acc: u64,
        y: u64,
        rows: u64,
        w: u64,
        n: usize,
        hidden: usize,
    ) -> Result<()> {
        let args = [
            Arg::Ptr(acc),
            Arg::Ptr(y),
            Arg::Ptr(rows),
            Arg::Ptr(w),
            Arg::I32(i32_of("hidden", hidden)?),
        ];
        self.launch(
            &name("scatter_add_rows", dt),
            (n as u32, 1, 1),
            256,
            0,
            &args,
        )
    }

    /// `out[k] = acc[k]` rounded to `dt`, `n` values.
    pub fn cast_rows(&self, dt: Dtype, out: u64, acc: u64, n: usize) -> Result<()> {
        let args = [Arg::Ptr(out), Arg::Ptr(acc), Arg::I64(n as i64)];
        self.launch(
            &name("cast_rows", dt),
            (stride_grid(n), 1, 1),
            256,
            0,
            &args,
        )
    }

    /// `out[t, i] = silu(gu[t, i]) · gu[t, inter + i]`.
    pub fn silu_mul(
        &self,
        dt: Dtype,
        out: u64,
        gu: u64,
        tokens: usize,
        inter: usize,
    ) -> Result<()> {
        let n = tokens * inter;
        self.launch(
            &name("silu_mul", dt),
            (stride_grid(n), 1, 1),
            256,
            0,
            &[
                Arg::Ptr(out),
                Arg::Ptr(gu),
                Arg::I64(n as i64),
                Arg::I32(i32_of("inter", inter)?),
            ],
        )
    }

    /// Deterministic uniform values in `[lo, hi)` (synthetic weights).
    pub fn fill_uniform(
        &self,
        dt: Dtype,
        out: u64,
        n: usize,
        seed: u64,
        lo: f32,
        hi: f32,
    ) -> Result<()> {
        self.launch(
            &name("fill_uniform", dt),
            (stride_grid(n), 1, 1),
            256,
            0,
            &[
                Arg::Ptr(out),
                Arg::I64(n as i64),
                Arg::U64(seed),
                Arg::F32(lo),
                Arg::F32(hi),
            ],
        )
    }

    /// New K/V rows into their cache slots (`slots`: i64 per token).
    #[allow(clippy::too_many_arguments)]
    pub fn reshape_and_cache(
        &self,
        dt: Dtype,
        src: u64,
        k_offset: usize,
        v_offset: usize,
        row_stride: usize,
        k_cache: u64,
        v_cache: u64,
        slots: u64,
        tokens: usize,
        shape: &AttnShape,
    ) -> Result<()> {
        self.launch(
            &name("reshape_and_cache", dt),
            (tokens as u32, 1, 1),
            256,
            0,
            &[
                Arg::Ptr(src),
                Arg::I32(i32_of("k_offset", k_offset)?),
                Arg::I32(i32_of("v_offset", v_offset)?),
                Arg::I32(i32_of("row_stride", row_stride)?),
                Arg::Ptr(k_cache),
                Arg::Ptr(v_cache),
                Arg::Ptr(slots),
                Arg::I32(shape.num_kv_heads as i32),
                Arg::I32(shape.head_dim as i32),
                Arg::I32(i32_of("block_size", shape.block_size)?),
            ],
        )
    }

    /// Copies whole blocks `pairs[2i] -> pairs[2i+1]` (i64) in one layer's K and V.
    pub fn copy_blocks(
        &self,
        k_cache: u64,
        v_cache: u64,
        pairs: u64,
        n_pairs: usize,
        shape: &AttnShape,
    ) -> Result<()> {
        let bytes = shape.num_kv_heads * shape.block_size * shape.head_dim * 2;
        if !bytes.is_multiple_of(16) {
            return Err(CudaError::Unsupported(format!(
                "blocks of {bytes} bytes (not a multiple of 16)"
            )));
        }
        self.launch(
            "copy_blocks",
            (n_pairs as u32, 2, 1),
            256,
            0,
            &[
                Arg::Ptr(k_cache),
                Arg::Ptr(v_cache),
                Arg::Ptr(pairs),
                Arg::I32(i32_of("block", bytes / 16)?),
            ],
        )
    }
}
