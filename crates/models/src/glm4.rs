//! GLM-4-0414 dense (`Glm4ForCausalLM`, transformers' `modeling_glm4.py`).
//!
//! Differs from Qwen3 in four ways: q/k/v projections carry a bias
//! (`attention_bias`), no per-head q/k norm, RoPE rotates only the first
//! `partial_rotary_factor` (0.5) of each head with GLM's interleaved pairs
//! (dims 2i, 2i+1), and each layer has four RMSNorms, the sub-blocks' outputs
//! being normed again before they join the residual stream:
//!
//! ```text
//! x += post_self_attn_layernorm(attn(input_layernorm(x)))
//! x += post_mlp_layernorm(mlp(post_attention_layernorm(x)))
//! ```
//!
//! The MLP's gate and up projections are stored fused (`gate_up_proj`).

use crate::config::ModelConfig;
use crate::error::Result;
use crate::layers::{add_in_place, norm_weight, rms_norm, RopeStyle};
use crate::loader::Weights;
use crate::mlp::Mlp;
use crate::model::DecoderLayer;
use crate::self_attn::{SelfAttention, StepCtx};
use crate::synth::TensorSpecs;

struct Glm4Layer {
    input_layernorm: Vec<f32>,
    self_attn: SelfAttention,
    post_self_attn_layernorm: Vec<f32>,
    post_attention_layernorm: Vec<f32>,
    mlp: Mlp,
    post_mlp_layernorm: Vec<f32>,
}

impl DecoderLayer for Glm4Layer {
    fn forward(&self, x: &mut [f32], ctx: &mut StepCtx<'_>) -> Result<()> {
        let eps = ctx.eps;
        let h = rms_norm(x, &self.input_layernorm, eps);
        let a = self.self_attn.forward(&h, ctx)?;
        add_in_place(x, &rms_norm(&a, &self.post_self_attn_layernorm, eps));
        let h = rms_norm(x, &self.post_attention_layernorm, eps);
        let m = self.mlp.forward(&h)?;
        add_in_place(x, &rms_norm(&m, &self.post_mlp_layernorm, eps));
        Ok(())
    }
}

pub(crate) fn load_layer(w: &Weights, p: &str, cfg: &ModelConfig) -> Result<Box<dyn DecoderLayer>> {
    let hid = cfg.hidden_size;
    let norm = |n: &str| norm_weight(w, &format!("{p}.{n}.weight"), hid);
    Ok(Box::new(Glm4Layer {
        input_layernorm: norm("input_layernorm")?,
        self_attn: SelfAttention::load(w, &format!("{p}.self_attn"), cfg, RopeStyle::Interleaved)?,
        post_self_attn_layernorm: norm("post_self_attn_layernorm")?,
        post_attention_layernorm: norm("post_attention_layernorm")?,
        mlp: Mlp::load_fused(w, &format!("{p}.mlp"), hid, cfg.intermediate_size)?,
        post_mlp_layernorm: norm("post_mlp_layernorm")?,
    }))
}

/// The tensors of one layer (`make-model`).
pub(crate) fn layer_specs(cfg: &ModelConfig, p: &str, s: &mut TensorSpecs) {
    let (hid, inter) = (cfg.hidden_size, cfg.intermediate_size);
    s.norm(&format!("{p}.input_layernorm.weight"), hid);
    s.attention(cfg, &format!("{p}.self_attn"));
    s.norm(&format!("{p}.post_self_attn_layernorm.weight"), hid);
    s.norm(&format!("{p}.post_attention_layernorm.weight"), hid);
    s.weight(
        &format!("{p}.mlp.gate_up_proj.weight"),
        vec![2 * inter, hid],
    );
    s.weight(&format!("{p}.mlp.down_proj.weight"), vec![hid, inter]);
    s.norm(&format!("{p}.post_mlp_layernorm.weight"), hid);
}
