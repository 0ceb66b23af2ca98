//! The paged attention kernels' wrappers (`kernels/attention.cu`,
//! `kernels/decode_1p.cu`): decode by split-K (two-pass or single-pass,
//! then the reduce) and prefill over tiles. Launch geometry comes from
//! `plan.rs`.

use crate::device::{Arg, Gpu};
use crate::error::{CudaError, Result};
use crate::ops::{i32_of, name};
use crate::plan::{
    decode_plan, prefill_smem_bytes, AttnShape, DecodeKernel, DecodePlan, Dtype, ATTN_THREADS,
};

/// Scratch of the split-K decode: unnormalised partial outputs, maxima and sums.
pub struct DecodeScratch {
    pub out: u64,
    pub max: u64,
    pub sum: u64,
}

impl DecodeScratch {
    /// The three parts inside `tmp`, which holds `rows * (head_dim + 2)`
    /// floats (`rows` from [`Gpu::decode_scratch_len`]).
    pub fn within(gpu: &Gpu, tmp: &crate::device::Buf<f32>, rows: usize, head_dim: usize) -> Self {
        DecodeScratch {
            out: gpu.ptr(tmp, 0),
            max: gpu.ptr(tmp, rows * head_dim),
            sum: gpu.ptr(tmp, rows * (head_dim + 1)),
        }
    }
}

impl Gpu {
    /// The split-K plan and scratch sizes (floats) for a decode batch.
    pub fn decode_scratch_len(
        shape: &AttnShape,
        num_seqs: usize,
        max_context: usize,
    ) -> (DecodePlan, usize) {
        let plan = decode_plan(shape, num_seqs, max_context);
        let rows = num_seqs * shape.num_heads * plan.num_partitions;
        (plan, rows)
    }

    /// Decode attention: token s of the batch is the one new token of
    /// sequence s, by `kernel` (both take the same split and scratch).
    /// `scratch` holds `rows * head_dim`, `rows`, `rows` floats
    /// (see [`Gpu::decode_scratch_len`]) when the plan has several partitions.
    #[allow(clippy::too_many_arguments)]
    pub fn paged_decode(
        &self,
        dt: Dtype,
        kernel: DecodeKernel,
        shape: &AttnShape,
        out: u64,
        q: u64,
        q_stride: usize,
        k_cache: u64,
        v_cache: u64,
        block_tables: u64,
        max_blocks: usize,
        context_lens: u64,
        num_seqs: usize,
        max_context: usize,
        scale: f32,
        scratch: &DecodeScratch,
    ) -> Result<()> {
        shape.check()?;
        let plan = decode_plan(shape, num_seqs, max_context);
        if let DecodeKernel::SinglePass { group } = kernel {
            if shape.group() > group {
                return Err(CudaError::Unsupported(format!(
                    "the single-pass decode instance for groups of {group} given {}",
                    shape.group()
                )));
            }
        }
        self.launch(
            &kernel.name(dt, shape),
            (
                shape.num_kv_heads as u32,
                num_seqs as u32,
                plan.num_partitions as u32,
            ),
            ATTN_THREADS,
            kernel.smem_bytes(shape, &plan),
            &[
                Arg::Ptr(out),
                Arg::Ptr(scratch.out),
                Arg::Ptr(scratch.max),
                Arg::Ptr(scratch.sum),
                Arg::Ptr(q),
                Arg::I32(i32_of("q_stride", q_stride)?),
                Arg::Ptr(k_cache),
                Arg::Ptr(v_cache),
                Arg::Ptr(block_tables),
                Arg::I32(i32_of("max_blocks", max_blocks)?),
                Arg::Ptr(context_lens),
                Arg::I32(shape.num_heads as i32),
                Arg::I32(shape.num_kv_heads as i32),
                Arg::I32(i32_of("block_size", shape.block_size)?),
                Arg::F32(scale),
                Arg::I32(plan.partition as i32),
                Arg::I32(plan.num_partitions as i32),
            ],
        )?;
        if plan.num_partitions == 1 {
            return Ok(());
        }
        self.launch(
            &name("paged_decode_reduce", dt),
            (shape.num_heads as u32, num_seqs as u32, 1),
            shape.head_dim as u32,
            0,
            &[
                Arg::Ptr(out),
                Arg::Ptr(scratch.out),
                Arg::Ptr(scratch.max),
                Arg::Ptr(scratch.sum),
                Arg::Ptr(context_lens),
                Arg::I32(shape.num_heads as i32),
                Arg::I32(shape.head_dim as i32),
                Arg::I32(plan.partition as i32),
                Arg::I32(plan.num_partitions as i32),
            ],
        )
    }

    /// Prefill attention over tiles from [`crate::plan::prefill_tiles`].
    #[allow(clippy::too_many_arguments)]
    pub fn paged_prefill(
        &self,
        dt: Dtype,
        shape: &AttnShape,
        out: u64,
        q: u64,
        q_stride: usize,
        k_cache: u64,
        v_cache: u64,
        block_tables: u64,
        max_blocks: usize,
        cu_seqlens: u64,
        context_lens: u64,
        tiles: u64,
        num_tiles: usize,
        scale: f32,
    ) -> Result<()> {
        shape.check()?;
        let kernel = format!("paged_prefill_{}_d{}", dt.suffix(), shape.head_dim);
        self.launch(
            &kernel,
            (shape.num_kv_heads as u32, num_tiles as u32, 1),
            ATTN_THREADS,
            prefill_smem_bytes(shape.head_dim),
            &[
                Arg::Ptr(out),
                Arg::Ptr(q),
                Arg::I32(i32_of("q_stride", q_stride)?),
                Arg::Ptr(k_cache),
                Arg::Ptr(v_cache),
                Arg::Ptr(block_tables),
                Arg::I32(i32_of("max_blocks", max_blocks)?),
                Arg::Ptr(cu_seqlens),
                Arg::Ptr(context_lens),
                Arg::Ptr(tiles),
                Arg::I32(shape.num_heads as i32),
                Arg::I32(shape.num_kv_heads as i32),
                Arg::I32(i32_of("block_size", shape.block_size)?),
                Arg::F32(scale),
            ],
        )
    }
}
