//! Host-side launch planning for the kernels in `kernels/`: everything about a
//! launch that can be decided (and tested) without a GPU. The constants here
//! must match the `#define`s in `kernels/attention.cu`.

use agentd_runtime::rope::RopeBatch;

use crate::error::{CudaError, Result};

/// Element type of activations, weights and the KV cache on the GPU. Both
/// compute in f32; bf16 is what Qwen3 checkpoints ship in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    Bf16,
    F16,
}

impl Dtype {
    /// Suffix of the kernel entry points (`add_rms_norm_bf16`, ...).
    pub fn suffix(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
        }
    }

    /// Bit pattern of `x` rounded to this type (round to nearest even).
    pub fn encode(self, x: f32) -> u16 {
        match self {
            Dtype::Bf16 => half::bf16::from_f32(x).to_bits(),
            Dtype::F16 => half::f16::from_f32(x).to_bits(),
        }
    }

    pub fn decode(self, bits: u16) -> f32 {
        match self {
            Dtype::Bf16 => half::bf16::from_bits(bits).to_f32(),
            Dtype::F16 => half::f16::from_bits(bits).to_f32(),
        }
    }

    pub fn encode_all(self, xs: &[f32]) -> Vec<u16> {
        xs.iter().map(|&x| self.encode(x)).collect()
    }

    pub fn decode_all(self, bits: &[u16]) -> Vec<f32> {
        bits.iter().map(|&b| self.decode(b)).collect()
    }
}

/// Threads per CTA of both attention kernels.
pub const ATTN_THREADS: u32 = 128;
/// Largest and smallest context partition of the split-K decode kernel.
pub const DECODE_PARTITION_MAX: usize = 512;
pub const DECODE_PARTITION_MIN: usize = 64;
/// CTAs a decode launch should have to keep every multiprocessor busy (about
/// two per SM of an H100/H200).
pub const DECODE_MIN_CTAS: usize = 264;
/// Floats of the decode kernel's PV partial sums (TOKP * HC * D = 1024 * 4).
const DECODE_PV_FLOATS: usize = 4096;
/// Head dimensions the attention kernels are instantiated for.
pub const HEAD_DIMS: [usize; 4] = [16, 32, 64, 128];
/// Query heads per KV head the kernels handle (registers per thread in decode).
pub const MAX_GROUP: usize = 16;
/// (token, head) rows per prefill CTA, and keys per shared-memory tile.
pub const PREFILL_ROWS: usize = 32;
pub const PREFILL_BK: usize = 32;
/// Dynamic shared memory a Hopper or Blackwell CTA may opt into.
pub const MAX_SMEM_BYTES: usize = 99 * 1024;

/// Attention geometry of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
}

impl AttnShape {
    pub fn group(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    /// Whether the kernels were built for this shape.
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Err(CudaError::Unsupported(m));
        if !HEAD_DIMS.contains(&self.head_dim) {
            return bad(format!(
                "head_dim {} (kernels exist for {HEAD_DIMS:?})",
                self.head_dim
            ));
        }
        if self.num_kv_heads == 0 || !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(format!(
                "{} query heads over {} KV heads",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.group() > MAX_GROUP {
            return bad(format!(
                "{} query heads per KV head (at most {MAX_GROUP})",
                self.group()
            ));
        }
        if self.block_size == 0 {
            return bad("block size 0".into());
        }
        Ok(())
    }
}

/// How the decode kernel splits the longest context of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodePlan {
    pub partition: usize,
    pub num_partitions: usize,
    pub smem_bytes: usize,
}

/// Split-K: the context is cut into partitions, each a CTA, combined by
/// `paged_decode_reduce`. Partitions shrink (down to 64 tokens) until the
/// launch has enough CTAs to fill the GPU: one sequence of a few thousand
/// tokens is otherwise a handful of CTAs, each reading its K/V serially.
pub fn decode_plan(shape: &AttnShape, num_seqs: usize, max_context: usize) -> DecodePlan {
    let (g, d) = (shape.group(), shape.head_dim);
    let mut p = DECODE_PARTITION_MAX;
    let ctas = |p: usize| shape.num_kv_heads * num_seqs * max_context.div_ceil(p).max(1);
    while p > DECODE_PARTITION_MIN && ctas(p) < DECODE_MIN_CTAS {
        p /= 2;
    }
    DecodePlan {
        partition: p,
        num_partitions: max_context.div_ceil(p).max(1),
        smem_bytes: 4 * (g * d + g * p + DECODE_PV_FLOATS),
    }
}

/// Query heads per KV head the single-pass decode kernel is built for
/// (`paged_decode_1p_*_g{G}`; a group is rounded up to the next one).
pub const SINGLE_PASS_GROUPS: [usize; 4] = [1, 2, 4, 8];

/// The kernels a step may use beyond the path validated on an H200, each
/// behind its flag until a device run has checked it (`kernels/NOTES.md`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Kernels {
    /// Q/K norm + RoPE and the cache write in one launch (`--fused-prologue`).
    pub fused_prologue: bool,
    /// Decode attention in one pass over K and V (`--single-pass-decode`).
    pub single_pass_decode: bool,
    /// MoE routing, grouping and the expert products on the device, with no
    /// synchronisation (`--device-moe`).
    pub device_moe: bool,
}

/// Which kernel runs a decode step's attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeKernel {
    /// `paged_decode_*`: scores to shared memory, a CTA-wide softmax, then
    /// a second sweep over V (the validated kernel).
    TwoPass,
    /// `paged_decode_1p_*_g{group}`: K and V read together, online softmax
    /// per token slot (`kernels/decode_1p.cu`); `group` is the instance's.
    SinglePass { group: usize },
}

impl DecodeKernel {
    /// The single-pass kernel when asked for and built for the shape's
    /// group; otherwise the two-pass one.
    pub fn choose(single_pass: bool, shape: &AttnShape) -> Self {
        let g = shape.group();
        match SINGLE_PASS_GROUPS.iter().find(|&&b| b >= g) {
            Some(&group) if single_pass => DecodeKernel::SinglePass { group },
            _ => DecodeKernel::TwoPass,
        }
    }

    /// The entry point for `dt` and the shape's head dimension.
    pub fn name(self, dt: Dtype, shape: &AttnShape) -> String {
        let (t, d) = (dt.suffix(), shape.head_dim);
        match self {
            DecodeKernel::TwoPass => format!("paged_decode_{t}_d{d}"),
            DecodeKernel::SinglePass { group } => format!("paged_decode_1p_{t}_d{d}_g{group}"),
        }
    }

    /// Dynamic shared memory of the launch (`plan`: the step's split).
    pub fn smem_bytes(self, shape: &AttnShape, plan: &DecodePlan) -> usize {
        match self {
            DecodeKernel::TwoPass => plan.smem_bytes,
            DecodeKernel::SinglePass { group } => {
                // q, the slots' P·V, their maxima and sums (decode_1p.cu).
                let d = shape.head_dim;
                let slots = ATTN_THREADS as usize / (d / 8);
                4 * (group * d + slots * group * d + 2 * slots * group)
            }
        }
    }
}

/// Whether the CUDA backend runs `cfg`, a config of one of the four
/// families: Qwen3 dense and Qwen3-MoE (q/k norm, neox RoPE over whole
/// heads; softmax top-k routing), GLM-4-0414 dense (no q/k norm,
/// interleaved RoPE over a leading part of each head) and GLM-4.5 (neox
/// RoPE over a leading part, heads up to 1024 dims), on an attention shape
/// the kernels take; otherwise an error saying what does not fit.
pub fn supported(cfg: &agentd_runtime::ModelConfig) -> Result<()> {
    use agentd_runtime::Family;
    let ok = match cfg.family {
        Family::Qwen3 => cfg.qk_norm && cfg.rotary_dim == cfg.head_dim,
        // Qwen3's attention; the experts routed by softmax top-k.
        Family::Qwen3Moe => {
            cfg.qk_norm
                && cfg.rotary_dim == cfg.head_dim
                && cfg.moe.as_ref().is_some_and(|m| {
                    m.router == agentd_runtime::config::RouterKind::Softmax
                        && m.n_shared_experts == 0
                })
        }
        // q/k/v bias, optional q/k norm, neox RoPE over a leading part of
        // each head (one block of threads holds a head: at most 1024 dims).
        Family::Glm4Moe => cfg.rotary_dim <= cfg.head_dim && cfg.head_dim <= 1024,
        Family::Glm4 => !cfg.qk_norm && cfg.rotary_dim <= cfg.head_dim,
    };
    if !ok {
        return Err(CudaError::Unsupported(format!(
            "a {} config with qk_norm {} and rotary_dim {} of head_dim {}",
            cfg.family, cfg.qk_norm, cfg.rotary_dim, cfg.head_dim
        )));
    }
    AttnShape {
        num_heads: cfg.num_attention_heads,
        num_kv_heads: cfg.num_key_value_heads,
        head_dim: cfg.head_dim,
        block_size: 1,
    }
    .check()
}

/// Prefill tiles: `(sequence, first new-token index)` pairs, each covering up
/// to `PREFILL_ROWS / group` consecutive new tokens of one sequence.
pub fn prefill_tiles(cu_seqlens: &[usize], group: usize) -> Vec<i32> {
    let bq = (PREFILL_ROWS / group.max(1)).max(1);
    let mut tiles = Vec::new();
    for (s, w) in cu_seqlens.windows(2).enumerate() {
        let q_len = w[1].saturating_sub(w[0]);
        for q0 in (0..q_len).step_by(bq) {
            tiles.push(s as i32);
            tiles.push(q0 as i32);
        }
    }
    tiles
}

/// Dynamic shared memory of the prefill kernel (see its smem comment).
pub fn prefill_smem_bytes(head_dim: usize) -> usize {
    let (r, k, d) = (PREFILL_ROWS, PREFILL_BK, head_dim);
    4 * (2 * r * d + k * (d + 1) + k * d + r * k + 3 * r)
}

/// `[max_pos, head_dim]` table for the RoPE kernel: per position, the cosines
/// then the sines of the `head_dim / 2` angles, taken from the runtime's
/// [`RopeBatch`] (f32 angle, f64 cos/sin), the one the CPU backend rotates
/// with, so both paths rotate by the same values.
pub fn rope_table(inv_freq: &[f32], max_pos: usize) -> Vec<f32> {
    let positions: Vec<u32> = (0..max_pos as u32).collect();
    let rope = RopeBatch::new(inv_freq, &positions);
    let half = inv_freq.len();
    let mut table = Vec::with_capacity(max_pos * 2 * half);
    for p in 0..max_pos {
        table.extend_from_slice(&rope.cos()[p * half..(p + 1) * half]);
        table.extend_from_slice(&rope.sin()[p * half..(p + 1) * half]);
    }
    table
}

/// Block tables as one row-major `[num_seqs, max_blocks]` matrix (rows padded
/// with block 0, never read: the kernels stop at each context length).
pub fn block_table_matrix(tables: &[Vec<u32>]) -> (Vec<i32>, usize) {
    let width = tables.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let mut m = vec![0i32; tables.len() * width];
    for (row, t) in m.chunks_mut(width).zip(tables) {
        for (dst, &b) in row.iter_mut().zip(t) {
            *dst = b as i32;
        }
    }
    (m, width)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_four_families_run_on_shapes_the_kernels_take() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/golden");
        let cfg = |name: &str| agentd_runtime::ModelConfig::from_dir(&dir.join(name)).unwrap();
        // Every golden fixture (each family, tied and untied, GQA 1-4).
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert!(names.len() >= 8, "{names:?}");
        for ok in &names {
            assert!(supported(&cfg(ok)).is_ok(), "{ok}");
        }
        let glm = cfg("glm4-gqa2");
        assert!(
            glm.rotary_dim < glm.head_dim,
            "a partial rotation is tested"
        );
        let glm45 = cfg("glm4moe-gqa2");
        let odd = agentd_runtime::ModelConfig {
            family: agentd_runtime::Family::Glm4Moe,
            head_dim: 2048,
            rotary_dim: 64,
            ..glm45
        };
        let e = supported(&odd).unwrap_err().to_string();
        assert!(e.contains("glm4_moe") || e.contains("head"), "{e}");
        // A Qwen3 config without its q/k norms is not one the kernels know.
        let odd = agentd_runtime::ModelConfig {
            qk_norm: false,
            ..cfg("gqa2-untied")
        };
        assert!(supported(&odd).is_err());
    }

    fn shape(h: usize, kv: usize, d: usize) -> AttnShape {
        AttnShape {
            num_heads: h,
            num_kv_heads: kv,
            head_dim: d,
            block_size: 16,
        }
    }

    #[test]
    fn shapes_outside_the_built_kernels_are_refused() {
        assert!(shape(16, 8, 128).check().is_ok());
        assert!(shape(32, 8, 64).check().is_ok());
        assert!(shape(4, 1, 16).check().is_ok());
        assert!(shape(16, 8, 96).check().is_err());
        assert!(shape(12, 8, 128).check().is_err());
        assert!(shape(64, 2, 128).check().is_err());
    }

    #[test]
    fn decode_partitions_cover_the_longest_context() {
        let s = shape(32, 8, 128);
        // A big batch keeps the largest partition.
        let big = decode_plan(&s, 128, 1025);
        assert_eq!((big.partition, big.num_partitions), (512, 3));
        assert_eq!(decode_plan(&s, 128, 1).num_partitions, 1);
        assert_eq!(decode_plan(&s, 128, 513).num_partitions, 2);
        // One sequence: partitions shrink until there are enough CTAs, and
        // always cover the whole context.
        for ctx in [1, 100, 1025, 40960] {
            let p = decode_plan(&s, 1, ctx);
            assert!(p.partition >= DECODE_PARTITION_MIN);
            assert!(p.partition * p.num_partitions >= ctx);
            assert!(p.partition * (p.num_partitions - 1) < ctx);
        }
        assert_eq!(decode_plan(&s, 1, 1025).partition, 64);
        assert_eq!(decode_plan(&s, 1, 40960).partition, 512);
        // Every supported shape fits the shared memory a CTA may opt into.
        for g in [1, 2, 4, 8, 16] {
            for d in HEAD_DIMS {
                let p = decode_plan(&shape(8 * g, 8, d), 1000, 4096);
                assert!(p.smem_bytes <= MAX_SMEM_BYTES, "group {g} dim {d}");
            }
        }
        assert!(prefill_smem_bytes(128) <= MAX_SMEM_BYTES);
    }

    #[test]
    fn prefill_tiles_cover_each_new_token_once() {
        let cu = [0usize, 1, 40, 40 + 17, 200];
        for group in [1, 2, 4, 8, 16] {
            let tiles = prefill_tiles(&cu, group);
            let bq = PREFILL_ROWS / group;
            let mut seen: Vec<Vec<bool>> =
                cu.windows(2).map(|w| vec![false; w[1] - w[0]]).collect();
            for t in tiles.chunks(2) {
                let (s, q0) = (t[0] as usize, t[1] as usize);
                let q_len = cu[s + 1] - cu[s];
                for (i, slot) in seen[s]
                    .iter_mut()
                    .enumerate()
                    .take((q0 + bq).min(q_len))
                    .skip(q0)
                {
                    assert!(!*slot, "token {i} of seq {s} twice");
                    *slot = true;
                }
            }
            assert!(seen.iter().flatten().all(|&x| x), "group {group}");
        }
    }

    #[test]
    fn rope_table_matches_the_cpu_rotation() {
        let inv: Vec<f32> = (0..64)
            .map(|i| 1.0 / 1e6f32.powf(2.0 * i as f32 / 128.0))
            .collect();
        let table = rope_table(&inv, 300);
        let positions = [0u32, 1, 17, 299];
        let rope = RopeBatch::new(&inv, &positions);
        for (t, &p) in positions.iter().enumerate() {
            let row = &table[p as usize * 128..(p as usize + 1) * 128];
            assert_eq!(&row[..64], &rope.cos()[t * 64..(t + 1) * 64]);
            assert_eq!(&row[64..], &rope.sin()[t * 64..(t + 1) * 64]);
        }
    }

    #[test]
    fn block_tables_pad_to_the_longest() {
        let (m, w) = block_table_matrix(&[vec![3, 1], vec![7], vec![2, 5, 9]]);
        assert_eq!(w, 3);
        assert_eq!(m, vec![3, 1, 0, 7, 0, 0, 2, 5, 9]);
        assert_eq!(block_table_matrix(&[]).1, 1);
    }

    #[test]
    fn dtype_round_trips() {
        for dt in [Dtype::Bf16, Dtype::F16] {
            for x in [0.0f32, 1.0, -2.5, 0.125] {
                assert_eq!(dt.decode(dt.encode(x)), x);
            }
        }
        assert!((Dtype::Bf16.decode(Dtype::Bf16.encode(1.001)) - 1.0).abs() < 1e-2);
    }
}
