//! GLM-4.5 / 4.6 / 4.5-Air MoE (`Glm4MoeForCausalLM`, transformers'
//! `modeling_glm4_moe.py`): a pre-norm layer like Qwen3's (two RMSNorms, not
//! GLM-4-0414's four), attention with q/k/v bias, optional per-head q/k norm
//! (`use_qk_norm`) and RoPE over the first `partial_rotary_factor` (0.5) of
//! each head with neox pairing; the first `first_k_dense_replace` layers
//! have a dense MLP, the others a sparse MoE block ([`crate::moe`]) with a
//! grouped sigmoid router (`e_score_correction_bias` for the choice only,
//! `n_group` / `topk_group`, `routed_scaling_factor`) and shared experts.
//!
//! The multi-token-prediction layers that GLM-4.5 checkpoints append
//! (`num_nextn_predict_layers`, stored as `model.layers.{num_hidden_layers}`)
//! are not loaded: only layers below `num_hidden_layers` are read, so their
//! tensors are never copied out of the mapping. `make-model` writes them
//! (`mtp_layer_specs`) so that the skipping is tested on real names.

//!
//! Every one of those differences is a config option of the shared blocks, so
//! GLM-4.5's layer is Qwen3-MoE's pre-norm MoE layer, loaded from its config.

pub(crate) use crate::qwen3_moe::{layer_specs, load_layer};

use crate::config::ModelConfig;
use crate::synth::TensorSpecs;

/// The tensors of MTP layer `layer` (`>= num_hidden_layers`) as GLM-4.5
/// checkpoints store them (vLLM's `glm4_moe_mtp.py` reads these names): a
/// full sparse decoder layer, `enorm` / `hnorm` (embedding and hidden-state
/// norms), `eh_proj` (`[hidden, 2 * hidden]`) and `shared_head.{norm,head}`.
pub(crate) fn mtp_layer_specs(cfg: &ModelConfig, layer: usize, s: &mut TensorSpecs) {
    let (hid, vocab) = (cfg.hidden_size, cfg.vocab_size);
    let p = format!("model.layers.{layer}");
    layer_specs(cfg, &p, layer, s);
    s.norm(&format!("{p}.enorm.weight"), hid);
    s.norm(&format!("{p}.hnorm.weight"), hid);
    s.weight(&format!("{p}.eh_proj.weight"), vec![hid, 2 * hid]);
    s.norm(&format!("{p}.shared_head.norm.weight"), hid);
    s.weight(&format!("{p}.shared_head.head.weight"), vec![vocab, hid]);
}
