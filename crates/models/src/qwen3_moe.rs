//! Qwen3-MoE (`Qwen3MoeForCausalLM`, e.g. Qwen3-30B-A3B; transformers'
//! `modeling_qwen3_moe.py`): Qwen3's attention and pre-norm layer, with a
//! sparse MoE block ([`crate::moe`]: softmax router, top-k
//! `num_experts_per_tok`, optional `norm_topk_prob`, no shared expert) in
//! every layer that `decoder_sparse_step` / `mlp_only_layers` make sparse;
//! the others keep a dense MLP of `intermediate_size`.

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::RopeStyle;
use crate::loader::Weights;
use crate::mlp::Mlp;
use crate::model::DecoderLayer;
use crate::moe::{Ffn, SparseMoe};
use crate::qwen3::PreNormLayer;
use crate::synth::TensorSpecs;

pub(crate) fn load_layer(
    w: &Weights,
    p: &str,
    layer: usize,
    cfg: &ModelConfig,
) -> Result<Box<dyn DecoderLayer>> {
    let ffn = moe_or_dense(w, &format!("{p}.mlp"), layer, cfg)?;
    Ok(Box::new(PreNormLayer::load(
        w,
        p,
        cfg,
        RopeStyle::Neox,
        ffn,
    )?))
}

/// Layer `layer`'s feed-forward block `{p}`: sparse where the config says,
/// else a dense MLP of `intermediate_size` (shared with GLM-4.5).
pub(crate) fn moe_or_dense(w: &Weights, p: &str, layer: usize, cfg: &ModelConfig) -> Result<Ffn> {
    let moe = cfg.moe.as_ref().ok_or_else(|| ModelError::Config {
        path: "config.json".into(),
        field: "model_type",
        reason: format!("{} has no MoE fields", cfg.family),
    })?;
    if moe.is_sparse(layer) {
        Ok(Ffn::Sparse(Box::new(SparseMoe::load(w, p, cfg, moe)?)))
    } else {
        Ok(Ffn::Dense(Mlp::load(
            w,
            p,
            cfg.hidden_size,
            cfg.intermediate_size,
        )?))
    }
}

/// The tensors of one layer (`make-model`).
pub(crate) fn layer_specs(cfg: &ModelConfig, p: &str, layer: usize, s: &mut TensorSpecs) {
    let hid = cfg.hidden_size;
    s.norm(&format!("{p}.input_layernorm.weight"), hid);
    s.attention(cfg, &format!("{p}.self_attn"));
    s.norm(&format!("{p}.post_attention_layernorm.weight"), hid);
    moe_specs(cfg, &format!("{p}.mlp"), layer, s);
}

/// The tensors of layer `layer`'s feed-forward block `{p}`.
pub(crate) fn moe_specs(cfg: &ModelConfig, p: &str, layer: usize, s: &mut TensorSpecs) {
    let hid = cfg.hidden_size;
    let Some(moe) = cfg.moe.as_ref().filter(|m| m.is_sparse(layer)) else {
        s.mlp(p, hid, cfg.intermediate_size);
        return;
    };
    s.weight(&format!("{p}.gate.weight"), vec![moe.num_experts, hid]);
    if matches!(moe.router, crate::config::RouterKind::GroupedSigmoid { .. }) {
        s.weight(
            &format!("{p}.gate.e_score_correction_bias"),
            vec![moe.num_experts],
        );
    }
    for e in 0..moe.num_experts {
        s.mlp(&format!("{p}.experts.{e}"), hid, moe.moe_intermediate_size);
    }
    if moe.n_shared_experts > 0 {
        let inter = moe.n_shared_experts * moe.moe_intermediate_size;
        s.mlp(&format!("{p}.shared_experts"), hid, inter);
    }
}
