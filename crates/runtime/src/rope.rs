//! RoPE's tables, shared by every backend: the inverse frequencies of a
//! config, one batch's cos/sin rows ([`RopeBatch`]) and which dims a head
//! pairs up ([`RopeStyle`]). The CPU backend rotates with them directly; the
//! CUDA backend builds its device-resident table from the same
//! [`RopeBatch`], so both rotate by bit-identical angles.

use crate::config::{ModelConfig, RopeScaling};

/// RoPE angles of one batch's positions, shared by all layers of a step.
#[derive(Debug, Clone)]
pub struct RopeBatch {
    /// `[T, head_dim / 2]` cosines and sines.
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
}

/// Inverse frequencies of a config (as transformers computes them, in f32),
/// one per rotated pair: `rotary_dim / 2` of them.
pub fn inv_freq(cfg: &ModelConfig) -> Vec<f32> {
    let d = cfg.rotary_dim;
    let factor = match cfg.rope_scaling {
        RopeScaling::None => 1.0,
        RopeScaling::Linear { factor } => factor as f32,
    };
    (0..d / 2)
        .map(|i| {
            let exponent = (2 * i) as f32 / d as f32;
            1.0 / (cfg.rope_theta as f32).powf(exponent) / factor
        })
        .collect()
}

/// Which dims of a head's rotated part RoPE pairs up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Dim `i` with dim `i + rotary_dim / 2` (transformers' `rotate_half`;
    /// Qwen3, Qwen3-MoE, GLM-4.5).
    Neox,
    /// Dims `2i` and `2i + 1` (GLM-4-0414's `rotate_half_llm`).
    Interleaved,
}

impl RopeBatch {
    pub fn new(inv_freq: &[f32], positions: &[u32]) -> Self {
        let half = inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for &f in inv_freq {
                // The angle rounds to f32 like transformers' `freqs`; cos/sin
                // are then taken in f64 to keep their own error negligible.
                let a = (p as f32 * f) as f64;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        RopeBatch { cos, sin, half }
    }

    /// `[T, head_dim / 2]` cosines, one row per position given to [`Self::new`].
    pub fn cos(&self) -> &[f32] {
        &self.cos
    }

    /// `[T, head_dim / 2]` sines.
    pub fn sin(&self) -> &[f32] {
        &self.sin
    }

    /// Rotated pairs per head (`rotary_dim / 2`): the width of a row of
    /// [`Self::cos`] and [`Self::sin`].
    pub fn half(&self) -> usize {
        self.half
    }
}
