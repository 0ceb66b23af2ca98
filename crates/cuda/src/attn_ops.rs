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
    pub fn paged_decode(
        &self,
        io: &AttnIo,
        kernel: DecodeKernel,
        num_seqs: usize,
        max_context: usize,
        scratch: &DecodeScratch,
    ) -> Result<()> {
        let (dt, shape) = (io.dt, &io.shape);
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
        let args = decode_args(io, scratch, &plan)?;
        let grid = (
            shape.num_kv_heads as u32,
            num_seqs as u32,
            plan.num_partitions as u32,
        );
        let smem = kernel.smem_bytes(shape, &plan);
        self.launch(&kernel.name(dt, shape), grid, ATTN_THREADS, smem, &args)?;
        if plan.num_partitions == 1 {
            return Ok(());
        }
        self.launch(
            &name("paged_decode_reduce", dt),
            (shape.num_heads as u32, num_seqs as u32, 1),
            shape.head_dim as u32,
            0,
            &[
                Arg::Ptr(io.out),
                Arg::Ptr(scratch.out),
                Arg::Ptr(scratch.max),
                Arg::Ptr(scratch.sum),
                Arg::Ptr(io.context_lens),
                Arg::I32(shape.num_heads as i32),
                Arg::I32(shape.head_dim as i32),
                Arg::I32(plan.partition as i32),
                Arg::I32(plan.num_partitions as i32),
            ],
        )
    }

    /// Prefill attention over `num_tiles` tiles at `tiles` (from
    /// [`crate::plan::prefill_tiles`]); `cu_seqlens`: each sequence's first
    /// new token.
    pub fn paged_prefill(
        &self,
        io: &AttnIo,
        cu_seqlens: u64,
        tiles: u64,
        num_tiles: usize,
    ) -> Result<()> {
        let shape = &io.shape;
        shape.check()?;
        let kernel = format!("paged_prefill_{}_d{}", io.dt.suffix(), shape.head_dim);
        let args = prefill_args(io, cu_seqlens, tiles)?;
        self.launch(
            &kernel,
            (shape.num_kv_heads as u32, num_tiles as u32, 1),
            ATTN_THREADS,
            prefill_smem_bytes(shape.head_dim),
            &args,
        )
    }
}

/// What both attention kernels read and write: the element type and
/// geometry, the output rows, the queries (read in place from rows of
/// `q_stride` elements), the paged cache with its block tables and context
/// lengths, and the softmax scale.
#[derive(Debug, Clone, Copy)]
pub struct AttnIo {
    pub dt: Dtype,
    pub shape: AttnShape,
    pub out: u64,
    pub q: u64,
    pub q_stride: usize,
    pub k_cache: u64,
    pub v_cache: u64,
    pub block_tables: u64,
    pub max_blocks: usize,
    pub context_lens: u64,
    pub scale: f32,
}

impl AttnIo {
    /// The arguments both kernels take after their outputs, in their
    /// order: q, q_stride, k, v, block tables, max_blocks, context lengths,
    /// heads, KV heads, block size, scale.
    fn args(&self) -> Result<[Arg; 11]> {
        let sh = &self.shape;
        Ok([
            Arg::Ptr(self.q),
            Arg::I32(i32_of("q_stride", self.q_stride)?),
            Arg::Ptr(self.k_cache),
            Arg::Ptr(self.v_cache),
            Arg::Ptr(self.block_tables),
            Arg::I32(i32_of("max_blocks", self.max_blocks)?),
            Arg::Ptr(self.context_lens),
            Arg::I32(i32_of("heads", sh.num_heads)?),
            Arg::I32(i32_of("kv heads", sh.num_kv_heads)?),
            Arg::I32(i32_of("block_size", sh.block_size)?),
            Arg::F32(self.scale),
        ])
    }
}

/// `paged_decode_*`'s (and `paged_decode_1p_*`'s) arguments, in the order
/// of `DECODE_ARGS` in kernels/attention.cu.
fn decode_args(io: &AttnIo, scratch: &DecodeScratch, plan: &DecodePlan) -> Result<Vec<Arg>> {
    let mut args = vec![
        Arg::Ptr(io.out),
        Arg::Ptr(scratch.out),
        Arg::Ptr(scratch.max),
        Arg::Ptr(scratch.sum),
    ];
    args.extend(io.args()?);
    args.extend([
        Arg::I32(i32_of("partition", plan.partition)?),
        Arg::I32(i32_of("partitions", plan.num_partitions)?),
    ]);
    Ok(args)
}

/// `paged_prefill_*`'s arguments, in the order of `PREFILL_ARGS`: the
/// sequences' starts before the context lengths, the tiles after them.
fn prefill_args(io: &AttnIo, cu_seqlens: u64, tiles: u64) -> Result<Vec<Arg>> {
    let q = io.args()?;
    let mut args = vec![Arg::Ptr(io.out)];
    args.extend_from_slice(&q[..6]); // q .. max_blocks
    args.push(Arg::Ptr(cu_seqlens));
    args.push(q[6]); // context lengths
    args.push(Arg::Ptr(tiles));
    args.extend_from_slice(&q[7..]);
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch_sig::{params_in, values};

    const ATTENTION: &str = include_str!("../../../kernels/attention.cu");
    const DECODE_1P: &str = include_str!("../../../kernels/decode_1p.cu");

    /// Each argument's value names the parameter it must land in.
    fn value_of(name: &str) -> u64 {
        [
            "out",
            "tmp_out",
            "tmp_max",
            "tmp_sum",
            "q",
            "q_stride",
            "k_cache",
            "v_cache",
            "block_tables",
            "max_blocks",
            "context_lens",
            "num_heads",
            "num_kv_heads",
            "block_size",
            "scale",
            "P",
            "num_partitions",
            "cu_seqlens",
            "tiles",
        ]
        .iter()
        .position(|n| *n == name)
        .map(|i| i as u64 + 1)
        .unwrap_or_else(|| panic!("unknown parameter {name}"))
    }

    fn params(macro_name: &str) -> Vec<String> {
        params_in(ATTENTION, &format!("#define {macro_name}"))
    }

    #[test]
    fn launch_arguments_follow_the_kernels_signatures() {
        let v = |n: &str| value_of(n);
        let io = AttnIo {
            dt: Dtype::Bf16,
            shape: AttnShape {
                num_heads: v("num_heads") as usize,
                num_kv_heads: v("num_kv_heads") as usize,
                head_dim: 64,
                block_size: v("block_size") as usize,
            },
            out: v("out"),
            q: v("q"),
            q_stride: v("q_stride") as usize,
            k_cache: v("k_cache"),
            v_cache: v("v_cache"),
            block_tables: v("block_tables"),
            max_blocks: v("max_blocks") as usize,
            context_lens: v("context_lens"),
            scale: v("scale") as f32,
        };
        let scratch = DecodeScratch {
            out: v("tmp_out"),
            max: v("tmp_max"),
            sum: v("tmp_sum"),
        };
        let plan = DecodePlan {
            partition: v("P") as usize,
            num_partitions: v("num_partitions") as usize,
            smem_bytes: 0,
        };
        let got: Vec<u64> = values(&decode_args(&io, &scratch, &plan).unwrap());
        let want: Vec<u64> = params("DECODE_ARGS").iter().map(|n| v(n)).collect();
        assert_eq!(got, want, "decode: {:?}", params("DECODE_ARGS"));
        // The single-pass kernel takes the same list.
        let one_pass = params_in(DECODE_1P, "paged_decode_1p_##SUFFIX##_g##G");
        assert_eq!(one_pass, params("DECODE_ARGS"));
        let got: Vec<u64> = values(&prefill_args(&io, v("cu_seqlens"), v("tiles")).unwrap());
        let want: Vec<u64> = params("PREFILL_ARGS").iter().map(|n| v(n)).collect();
        assert_eq!(got, want, "prefill: {:?}", params("PREFILL_ARGS"));
    }
}
