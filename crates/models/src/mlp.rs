//! The dense SwiGLU feed-forward block: `down(silu(gate(x)) * up(x))`.
//!
//! Qwen3 stores `gate_proj` and `up_proj` apart; GLM-4 stores them fused as
//! `gate_up_proj` (`[2 * inter, hidden]`, gate rows first), which is split at
//! load so both run the same products.

use crate::error::Result;
use crate::layers::{linear, silu_mul_in_place, Linear};
use crate::loader::Weights;

pub struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    /// `{p}.gate_proj`, `{p}.up_proj`, `{p}.down_proj`.
    pub fn load(w: &Weights, p: &str, hidden: usize, inter: usize) -> Result<Self> {
        Ok(Mlp {
            gate_proj: linear(w, &format!("{p}.gate_proj"), inter, hidden, false)?,
            up_proj: linear(w, &format!("{p}.up_proj"), inter, hidden, false)?,
            down_proj: linear(w, &format!("{p}.down_proj"), hidden, inter, false)?,
        })
    }

    /// `{p}.gate_up_proj` (fused) and `{p}.down_proj`.
    pub fn load_fused(w: &Weights, p: &str, hidden: usize, inter: usize) -> Result<Self> {
        let fused = w.get_matrix(&format!("{p}.gate_up_proj.weight"), &[2 * inter, hidden])?;
        Ok(Mlp {
            gate_proj: Linear::new(fused.narrow(0, 0, inter)?.contiguous()?, None)?,
            up_proj: Linear::new(fused.narrow(0, inter, inter)?.contiguous()?, None)?,
            down_proj: linear(w, &format!("{p}.down_proj"), hidden, inter, false)?,
        })
    }

    /// `x`: `[T, hidden]` → `[T, hidden]`.
    pub fn forward(&self, x: &[f32]) -> Result<Vec<f32>> {
        let mut gate = self.gate_proj.forward(x)?;
        let up = self.up_proj.forward(x)?;
        silu_mul_in_place(&mut gate, &up);
        self.down_proj.forward(&gate)
    }
}
