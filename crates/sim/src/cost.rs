//! A model of one engine step's time on the GPU.
//!
//! Calibrated to Qwen3-8B served in FP8 (weights and KV cache) on one H100 SXM
//! (989 TFLOP/s dense BF16, 1979 FP8, 3.35 TB/s HBM):
//! * `fixed_s` — reading the 8.2 GB of FP8 weights once per step (2.5 ms at HBM
//!   bandwidth) plus launch, scheduling and sampling overhead (~2.5 ms, the
//!   decode step floor vLLM shows with CUDA graphs at small batch).
//! * `per_token_s` — the dense FLOPs of one token, 2 × 8.2 GFLOP, at ~40% of
//!   FP8 peak ≈ 21 µs; rounded to 25 µs (≈ 40k prefill tok/s, in line with
//!   published vLLM prefill throughput for 8B models on H100).
//! * `attn_pair_s` — attention FLOPs per (query, key) pair,
//!   4 · 36 layers · 4096 = 590 kFLOP, at ~400 TFLOP/s effective
//!   (FlashAttention-3 BF16) ≈ 1.5 ns. Prefill of n tokens after c cached ones
//!   costs n·(c + n/2) pairs.
//! * `kv_read_s` — a decode step reads each sequence's whole KV: 72 KiB per
//!   token (36 layers × 8 KV heads × 128 dims × 2 (K,V) × 1 byte) at 3.35 TB/s
//!   ≈ 22 ns per context token.
//! * `copy_token_s` — moving one token's 72 KiB between HBM and the host
//!   tier over PCIe Gen5 x16 at ~25 GB/s effective ≈ 3 µs (73,728 B /
//!   25 GB/s). Until 2026-12-07 this read 3 ns, a thousandth of the copy:
//!   simulator figures with a host tier cited before then (in `config.rs`,
//!   `rotation.rs`, docs/design.md) counted copies as free. Corrected, the
//!   copies cost the swe workload at 96 programs with a 3.46M-token tier
//!   ~18% of its steps/min (331.9 -> 270.8, H100 costs), and the program
//!   policy's lead over the request policy at 192 programs shrinks from
//!   1.23x to 1.03x (the request policy copied more but recomputed more
//!   too, which the old constant priced alone).
//! * `copy_layers` — the GPU tier copies on a stream of its own, layer by
//!   layer, and a step's layer `l` waits for that layer's copies only
//!   (`crates/cuda/src/tier.rs`): over `L` layers a step takes
//!   `max(compute + copy/L, copy + compute/L)`, the first layer's copies
//!   before the forward and the rest beside it. On the CPU the copy thread
//!   shares the two cores with the forward (`tier_copy.rs`; beside against
//!   before measured 0.93-1.12x, `benches/results/tier-copy-AMD-EPYC.md`),
//!   so there the copies add to the step (`copy_layers` 0).
//! * `per_logits_s` — per sequence that samples: the LM head row's softmax
//!   and the sampler over a 151,936-token vocabulary. On the GPU it hides
//!   in the step (0 here); on the CPU it is most of a decode row's cost.
//!
//! [`StepCost::cpu`] holds the same terms measured on a 2-core AMD EPYC
//! (`benches/results/cpu-kernels-AMD-EPYC-avx512-avx2-portable.md`,
//! `agentd bench-model`, shape qwen3-bench-gqa1: hidden 256, 4 layers,
//! 8 KV heads × 64), one set per kernel path: the regime where prefill,
//! not memory, is the bottleneck.

/// Step-time constants (seconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCost {
    pub fixed_s: f64,
    pub per_token_s: f64,
    pub attn_pair_s: f64,
    pub kv_read_s: f64,
    pub copy_token_s: f64,
    pub per_logits_s: f64,
    /// Layers the copies pipeline over beside the forward; 0: they add.
    pub copy_layers: usize,
}

impl Default for StepCost {
    fn default() -> Self {
        Self {
            fixed_s: 5.0e-3,
            per_token_s: 25.0e-6,
            attn_pair_s: 1.5e-9,
            kv_read_s: 22.0e-9,
            copy_token_s: 3.0e-6,
            per_logits_s: 0.0,
            copy_layers: 36,
        }
    }
}

/// A named set of step-time constants (`agentd simulate --cost`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CostPreset {
    /// Qwen3-8B in FP8 on one H100 ([`StepCost::default`]).
    H100,
    /// The CPU bench shape on the AVX2+FMA kernels.
    CpuAvx2,
    /// The CPU bench shape on the AVX-512 kernels.
    CpuAvx512,
    /// The CPU bench shape on the portable kernels: what an AVX2 machine
    /// ran before it had AVX2 kernels (issue 27), where long prefills are
    /// the bottleneck (issue 32's held-out runs).
    CpuPortable,
}

impl std::str::FromStr for CostPreset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "h100" => Ok(Self::H100),
            "cpu-avx2" => Ok(Self::CpuAvx2),
            "cpu-avx512" => Ok(Self::CpuAvx512),
            "cpu-portable" => Ok(Self::CpuPortable),
            other => Err(format!(
                "unknown cost preset '{other}' (expected h100, cpu-avx2, cpu-avx512 or cpu-portable)"
            )),
        }
    }
}

impl std::fmt::Display for CostPreset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::H100 => "h100",
            Self::CpuAvx2 => "cpu-avx2",
            Self::CpuAvx512 => "cpu-avx512",
            Self::CpuPortable => "cpu-portable",
        })
    }
}

impl From<CostPreset> for StepCost {
    fn from(p: CostPreset) -> Self {
        match p {
            CostPreset::H100 => Self::default(),
            CostPreset::CpuAvx2 => Self::cpu(false),
            CostPreset::CpuAvx512 => Self::cpu(true),
            CostPreset::CpuPortable => Self::cpu_portable(),
        }
    }
}

/// What one step computes is the scheduler's [`StepWork`]: the same
/// terms the engine's own step-time fit regresses on (`rates.rs`), so a
/// fit over simulated steps recovers these constants.
pub use agentd_scheduler::StepWork;

impl StepCost {
    /// The CPU bench shape, fitted to the kernel table (2 threads, tok/s):
    ///
    /// | path | prefill 512 / 4096 / 8192 | decode b1 @512 | b32 @512 | b32 @4096 |
    /// |---|---|---|---|---|
    /// | avx2 | 3914 / 2603 / 1641 | 59.7 | 390 | 176 |
    /// | avx512 | 5296 / 3504 / 2620 | 68.2 | 508 | 175 |
    ///
    /// A prefill token costs `1/rate` at an average of n/2 pairs: avx2
    /// 255 µs at 256 pairs, 384 at 2048, 609 at 4096 → ~90 ns a pair over
    /// 232 µs; avx512 50 ns over 176 µs. A batch-1 decode step (16.7 /
    /// 14.7 ms) is mostly the fixed weight stream (the 151,936 × 256 LM
    /// head); each further decoding sequence adds ~2.1 / 1.6 ms at 512
    /// tokens: its row of the matmuls, 0.6–0.9 µs per context token of
    /// attention, and the rest (1.55 / 0.95 ms) its logits row and the
    /// sampler (`per_logits_s`). Copying a token's KV (8 layers × 2 × 8 × 64 f32 =
    /// 32 KiB) to the host tier is a memcpy at ~6 GB/s: ~5 µs.
    pub fn cpu(avx512: bool) -> Self {
        if avx512 {
            Self {
                fixed_s: 13.0e-3,
                per_token_s: 176.0e-6,
                attn_pair_s: 50.0e-9,
                kv_read_s: 0.9e-6,
                copy_token_s: 3.0e-6,
                per_logits_s: 0.95e-3,
                copy_layers: 0,
            }
        } else {
            Self {
                fixed_s: 14.5e-3,
                per_token_s: 232.0e-6,
                attn_pair_s: 90.0e-9,
                kv_read_s: 0.6e-6,
                copy_token_s: 3.0e-6,
                per_logits_s: 1.55e-3,
                copy_layers: 0,
            }
        }
    }

    /// The CPU bench shape on the portable kernels, fitted to the same
    /// table's portable columns: prefill 3332 / 925 / 412 tok/s at 512 /
    /// 4096 / 8192 tokens (~190 µs a token and ~440 ns an attention pair:
    /// 9x the AVX-512 path's pairs), decode at batch 1 107 / 76 tok/s at
    /// 512 / 4096 (~1.06 µs a context token over ~8.8 ms).
    pub fn cpu_portable() -> Self {
        Self {
            fixed_s: 8.8e-3,
            per_token_s: 190.0e-6,
            attn_pair_s: 440.0e-9,
            kv_read_s: 1.06e-6,
            copy_token_s: 3.0e-6,
            per_logits_s: 1.55e-3,
            copy_layers: 0,
        }
    }

    pub fn step_time(&self, s: &StepWork) -> f64 {
        let compute = self.fixed_s
            + self.per_token_s * s.tokens as f64
            + self.attn_pair_s * s.prefill_pairs
            + self.kv_read_s * s.decode_context as f64
            + self.per_logits_s * s.rows as f64;
        let copy = self.copy_token_s * s.copied_tokens as f64;
        if self.copy_layers == 0 {
            return compute + copy;
        }
        let l = self.copy_layers as f64;
        (compute + copy / l).max(copy + compute / l)
    }
}

/// Default KV capacity in tokens: an 80 GB H100 at 90% memory utilisation,
/// less 8.2 GB of FP8 weights, at 72 KiB of FP8 KV per token:
/// (72 − 8.2) GB / 73 728 B ≈ 865k tokens.
pub const H100_QWEN3_8B_FP8_KV_TOKENS: usize = 865_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_step_grows_with_context() {
        let c = StepCost::default();
        let mut small = StepWork::default();
        let mut large = StepWork::default();
        for _ in 0..32 {
            small.add_decode(1_000);
            large.add_decode(30_000);
        }
        assert!(c.step_time(&large) > 2.0 * c.step_time(&small));
    }

    /// The CPU presets reproduce the kernel table they were fitted to
    /// (prefill tok/s at 512 / 4096 / 8192, batch-1 and batch-32 decode
    /// at 512 tokens) within 15%.
    #[test]
    fn cpu_presets_match_the_measured_table() {
        let cases = [
            (false, [3914.3, 2602.9, 1641.4], 59.73, 389.58),
            (true, [5295.9, 3504.0, 2620.2], 68.24, 507.52),
        ];
        for (avx512, prefill, b1, b32) in cases {
            let c = StepCost::cpu(avx512);
            for (n, want) in [512usize, 4096, 8192].into_iter().zip(prefill) {
                let mut s = StepWork::default();
                s.add_prefill(0, n);
                s.rows += 1;
                let got = n as f64 / c.step_time(&s);
                assert!(
                    (got / want - 1.0).abs() < 0.15,
                    "{avx512} {n}: {got} vs {want}"
                );
            }
            for (batch, want) in [(1usize, b1), (32, b32)] {
                let mut s = StepWork::default();
                for _ in 0..batch {
                    s.add_decode(512);
                    s.rows += 1;
                }
                let got = batch as f64 / c.step_time(&s);
                assert!(
                    (got / want - 1.0).abs() < 0.15,
                    "{avx512} b{batch}: {got} vs {want}"
                );
            }
        }
        assert_eq!("cpu-avx2".parse::<CostPreset>(), Ok(CostPreset::CpuAvx2));
        assert!("tpu".parse::<CostPreset>().is_err());
    }

    /// The H100 copy constant is one token's FP8 KV over PCIe at ~25 GB/s
    /// (it once read 3 ns, a thousandth of that).
    #[test]
    fn h100_copy_is_a_token_of_kv_over_pcie() {
        let token_bytes = 36.0 * 8.0 * 128.0 * 2.0;
        let want = token_bytes / 25.0e9;
        let got = StepCost::default().copy_token_s;
        assert!((got / want - 1.0).abs() < 0.05, "{got} vs {want}");
    }

    /// GPU copies overlap the forward but for the first layer's; CPU
    /// copies add to it.
    #[test]
    fn gpu_copies_run_beside_the_forward() {
        let mut s = StepWork::default();
        s.add_decode(1_000);
        s.rows += 1;
        let gpu = StepCost::default();
        let compute = gpu.step_time(&s);
        s.copied_tokens = 1_000;
        let copy = gpu.copy_token_s * 1_000.0;
        let beside = gpu.step_time(&s);
        assert!(beside > compute && beside < compute + copy, "{beside}");
        assert!((beside - (compute + copy / 36.0).max(copy + compute / 36.0)).abs() < 1e-12);
        let cpu = StepCost::cpu(true);
        let mut c = s;
        c.copied_tokens = 0;
        let cpu_compute = cpu.step_time(&c);
        assert!((cpu.step_time(&s) - cpu_compute - cpu.copy_token_s * 1_000.0).abs() < 1e-12);
    }

    #[test]
    fn prefill_attention_is_quadratic() {
        let mut a = StepWork::default();
        a.add_prefill(0, 8_000);
        let mut b = StepWork::default();
        b.add_prefill(0, 16_000);
        assert!(b.prefill_pairs > 3.9 * a.prefill_pairs);
    }
}
