//! Qwen3 dense (`Qwen3ForCausalLM`), after candle-transformers' `qwen3.rs` and
//! transformers' `modeling_qwen3.py`: pre-norm decoder layers of grouped-query
//! attention (RMSNorm on each query and key head, then RoPE over the whole
//! head) and a SwiGLU MLP. The same pre-norm layer, with a sparse MoE block
//! in place of the MLP, makes Qwen3-MoE and GLM-4.5 ([`PreNormLayer`]).

use crate::config::ModelConfig;
use crate::error::Result;
use crate::layers::{add_in_place, norm_weight, rms_norm, RopeStyle};
use crate::loader::Weights;
use crate::mlp::Mlp;
use crate::model::DecoderLayer;
use crate::moe::Ffn;
use crate::self_attn::{SelfAttention, StepCtx};
use crate::synth::TensorSpecs;

/// `x += attn(norm(x)); x += ffn(norm(x))`.
pub struct PreNormLayer {
    pub input_layernorm: Vec<f32>,
    pub self_attn: SelfAttention,
    pub post_attention_layernorm: Vec<f32>,
    pub ffn: Ffn,
}

impl PreNormLayer {
    /// The norms and attention of `{p}`, with `ffn` as its feed-forward block.
    pub fn load(
        w: &Weights,
        p: &str,
        cfg: &ModelConfig,
        style: RopeStyle,
        ffn: Ffn,
    ) -> Result<Self> {
        let hid = cfg.hidden_size;
        Ok(PreNormLayer {
            input_layernorm: norm_weight(w, &format!("{p}.input_layernorm.weight"), hid)?,
            self_attn: SelfAttention::load(w, &format!("{p}.self_attn"), cfg, style)?,
            post_attention_layernorm: norm_weight(
                w,
                &format!("{p}.post_attention_layernorm.weight"),
                hid,
            )?,
            ffn,
        })
    }
}

impl DecoderLayer for PreNormLayer {
    fn forward(&self, x: &mut [f32], ctx: &mut StepCtx<'_>) -> Result<()> {
        let h = rms_norm(x, &self.input_layernorm, ctx.eps);
        let a = self.self_attn.forward(&h, ctx)?;
        add_in_place(x, &a);
        let h = rms_norm(x, &self.post_attention_layernorm, ctx.eps);
        add_in_place(x, &self.ffn.forward(&h)?);
        Ok(())
    }
}

pub(crate) fn load_layer(w: &Weights, p: &str, cfg: &ModelConfig) -> Result<Box<dyn DecoderLayer>> {
    let mlp = Mlp::load(
        w,
        &format!("{p}.mlp"),
        cfg.hidden_size,
        cfg.intermediate_size,
    )?;
    Ok(Box::new(PreNormLayer::load(
        w,
        p,
        cfg,
        RopeStyle::Neox,
        Ffn::Dense(mlp),
    )?))
}

/// The tensors of one layer (`make-model`).
pub(crate) fn layer_specs(cfg: &ModelConfig, p: &str, s: &mut TensorSpecs) {
    s.norm(&format!("{p}.input_layernorm.weight"), cfg.hidden_size);
    s.attention(cfg, &format!("{p}.self_attn"));
    s.norm(
        &format!("{p}.post_attention_layernorm.weight"),
        cfg.hidden_size,
    );
    s.mlp(&format!("{p}.mlp"), cfg.hidden_size, cfg.intermediate_size);
}
