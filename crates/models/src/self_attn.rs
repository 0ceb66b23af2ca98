//! The self-attention block every family shares: q/k/v projections (with
//! bias where the config says), optional RMSNorm per query/key head, RoPE on
//! all or the first part of each head, paged attention over the cache, and
//! the output projection.
//!
//! The families differ only in options: Qwen3 / Qwen3-MoE norm each head and
//! rotate it whole (neox pairing); GLM-4-0414 has q/k/v bias, no head norm
//! and rotates the first half with interleaved pairs; GLM-4.5 rotates the
//! first half with neox pairs and norms heads when `use_qk_norm`.

use crate::attention::{paged_attention, AttentionShape, PagedKvCache};
use crate::batch::BatchInput;
use crate::config::ModelConfig;
use crate::error::Result;
use crate::layers::{linear, norm_weight, Linear, RopeBatch, RopeStyle};
use crate::loader::Weights;

pub struct SelfAttention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    /// `(q_norm, k_norm)` weights, `[head_dim]` each.
    qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    style: RopeStyle,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

/// What one layer's step needs besides its input: which layer it is, the
/// batch, its RoPE angles, and the cache it reads and writes.
pub struct StepCtx<'a> {
    pub layer: usize,
    pub batch: &'a BatchInput,
    pub rope: &'a RopeBatch,
    pub eps: f32,
    pub cache: &'a mut PagedKvCache,
}

impl SelfAttention {
    /// Loads `{p}.q_proj` ... `{p}.o_proj` (and `{p}.q_norm` / `{p}.k_norm`
    /// when `cfg.qk_norm`).
    pub fn load(w: &Weights, p: &str, cfg: &ModelConfig, style: RopeStyle) -> Result<Self> {
        let (h, kv, d, hid) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.hidden_size,
        );
        let b = cfg.attention_bias;
        let qk_norm = if cfg.qk_norm {
            Some((
                norm_weight(w, &format!("{p}.q_norm.weight"), d)?,
                norm_weight(w, &format!("{p}.k_norm.weight"), d)?,
            ))
        } else {
            None
        };
        Ok(SelfAttention {
            q_proj: linear(w, &format!("{p}.q_proj"), h * d, hid, b)?,
            k_proj: linear(w, &format!("{p}.k_proj"), kv * d, hid, b)?,
            v_proj: linear(w, &format!("{p}.v_proj"), kv * d, hid, b)?,
            o_proj: linear(w, &format!("{p}.o_proj"), hid, h * d, false)?,
            qk_norm,
            style,
            num_heads: h,
            num_kv_heads: kv,
            head_dim: d,
        })
    }

    /// `x`: normed hidden states `[T, hidden]` → attention output `[T, hidden]`.
    pub fn forward(&self, x: &[f32], ctx: &mut StepCtx<'_>) -> Result<Vec<f32>> {
        let t = ctx.batch.num_tokens();
        let (h, kv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let mut q = self.q_proj.forward(x)?;
        let mut k = self.k_proj.forward(x)?;
        let v = self.v_proj.forward(x)?;
        let (qn, kn) = match &self.qk_norm {
            Some((q, k)) => (Some(q.as_slice()), Some(k.as_slice())),
            None => (None, None),
        };
        crate::layers::head_norm_rope(&mut q, h, d, qn, ctx.eps, ctx.rope, self.style);
        crate::layers::head_norm_rope(&mut k, kv, d, kn, ctx.eps, ctx.rope, self.style);
        // New K/V go into the cache first, so the kernel reads a sequence's
        // whole context (cached prefix and new tokens) from one place.
        ctx.cache.write(ctx.layer, &ctx.batch.slot_mapping, &k, &v);
        let shape = AttentionShape {
            num_heads: h,
            num_kv_heads: kv,
            head_dim: d,
            block_size: ctx.cache.block_size(),
        };
        let mut out = vec![0f32; t * h * d];
        let scale = 1.0 / (d as f32).sqrt();
        paged_attention(
            &q,
            ctx.cache.layer(ctx.layer),
            ctx.batch,
            shape,
            scale,
            &mut out,
        );
        self.o_proj.forward(&out)
    }
}
