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
//!   tier over PCIe Gen5 x16 at ~25 GB/s effective ≈ 3 ns; the engine's copies
//!   run before the forward, so they add to the step.

/// Step-time constants (seconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCost {
    pub fixed_s: f64,
    pub per_token_s: f64,
    pub attn_pair_s: f64,
    pub kv_read_s: f64,
    pub copy_token_s: f64,
}

impl Default for StepCost {
    fn default() -> Self {
        Self {
            fixed_s: 5.0e-3,
            per_token_s: 25.0e-6,
            attn_pair_s: 1.5e-9,
            kv_read_s: 22.0e-9,
            copy_token_s: 3.0e-9,
        }
    }
}

/// What one step computes, summed over its sequences.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepShape {
    /// New tokens computed (prefill chunks plus one per decoding sequence).
    pub tokens: usize,
    /// Attention (query, key) pairs of the prefill chunks.
    pub prefill_pairs: f64,
    /// Context tokens read by decoding sequences.
    pub decode_context: usize,
    /// Tokens copied between the KV tiers before the forward.
    pub copied_tokens: usize,
}

impl StepShape {
    pub fn add_prefill(&mut self, cached: usize, n: usize) {
        self.tokens += n;
        self.prefill_pairs += n as f64 * (cached as f64 + n as f64 / 2.0);
    }
    pub fn add_decode(&mut self, context: usize) {
        self.tokens += 1;
        self.decode_context += context;
    }
}

impl StepCost {
    pub fn step_time(&self, s: &StepShape) -> f64 {
        self.fixed_s
            + self.per_token_s * s.tokens as f64
            + self.attn_pair_s * s.prefill_pairs
            + self.kv_read_s * s.decode_context as f64
            + self.copy_token_s * s.copied_tokens as f64
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
        let mut small = StepShape::default();
        let mut large = StepShape::default();
        for _ in 0..32 {
            small.add_decode(1_000);
            large.add_decode(30_000);
        }
        assert!(c.step_time(&large) > 2.0 * c.step_time(&small));
    }

    #[test]
    fn prefill_attention_is_quadratic() {
        let mut a = StepShape::default();
        a.add_prefill(0, 8_000);
        let mut b = StepShape::default();
        b.add_prefill(0, 16_000);
        assert!(b.prefill_pairs > 3.9 * a.prefill_pairs);
    }
}
