//! The mixture-of-experts fields of `qwen3_moe` and `glm4_moe` configs.
//!
//! Defaults are transformers' (`Qwen3MoeConfig`, `Glm4MoeConfig`) for the
//! optional fields; the sizes that define the model are required.

use serde_json::Value;

use super::fields::Fields;
use super::Family;
use crate::error::Result;

/// How the router turns its logits into expert choices and weights.
#[derive(Debug, Clone, PartialEq)]
pub enum RouterKind {
    /// Qwen3-MoE: softmax over all experts, then top-k.
    Softmax,
    /// GLM-4.5: sigmoid scores; experts chosen on score +
    /// `e_score_correction_bias` within the best `topk_group` of `n_group`
    /// groups; weights are the plain scores times `routed_scaling_factor`.
    GroupedSigmoid {
        n_group: usize,
        topk_group: usize,
        routed_scaling_factor: f64,
    },
}

/// Which layers are dense rather than sparse.
#[derive(Debug, Clone, PartialEq)]
pub enum DenseLayers {
    /// Qwen3-MoE: layer `i` is sparse when `(i + 1) % decoder_sparse_step == 0`
    /// and `i` is not in `mlp_only_layers`.
    Qwen {
        decoder_sparse_step: usize,
        mlp_only_layers: Vec<usize>,
    },
    /// GLM-4.5: the first `first_k_dense_replace` layers are dense.
    FirstK(usize),
}

#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    /// Routed experts per sparse layer.
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub norm_topk_prob: bool,
    pub router: RouterKind,
    /// Always-on experts (GLM-4.5), one SwiGLU MLP of
    /// `n_shared_experts * moe_intermediate_size`.
    pub n_shared_experts: usize,
    pub dense_layers: DenseLayers,
    /// GLM-4.5's multi-token-prediction layers (`num_nextn_predict_layers`,
    /// transformers 5's `num_mtp_layers`), stored after the decoder layers
    /// as `model.layers.{num_hidden_layers + i}`: written by `make-model`,
    /// never loaded (the runtime does not speculate). 0 when absent.
    pub num_nextn_predict_layers: usize,
}

impl MoeConfig {
    pub(super) fn parse(f: &Fields<'_>, family: Family) -> Result<Option<Self>> {
        let cfg = match family {
            Family::Qwen3 | Family::Glm4 => return Ok(None),
            Family::Qwen3Moe => MoeConfig {
                // transformers 5 writes `num_local_experts`; hub configs
                // `num_experts`.
                num_experts: match f.opt_usize("num_local_experts")? {
                    Some(n) => n,
                    None => f.usize("num_experts")?,
                },
                num_experts_per_tok: f.usize("num_experts_per_tok")?,
                moe_intermediate_size: f.usize("moe_intermediate_size")?,
                norm_topk_prob: f.opt_bool("norm_topk_prob")?.unwrap_or(false),
                router: RouterKind::Softmax,
                n_shared_experts: 0,
                dense_layers: DenseLayers::Qwen {
                    decoder_sparse_step: f.opt_usize("decoder_sparse_step")?.unwrap_or(1),
                    mlp_only_layers: f.usize_list("mlp_only_layers")?,
                },
                num_nextn_predict_layers: 0,
            },
            Family::Glm4Moe => MoeConfig {
                num_experts: f.usize("n_routed_experts")?,
                num_experts_per_tok: f.usize("num_experts_per_tok")?,
                moe_intermediate_size: f.usize("moe_intermediate_size")?,
                norm_topk_prob: f.opt_bool("norm_topk_prob")?.unwrap_or(true),
                router: RouterKind::GroupedSigmoid {
                    n_group: f.opt_usize("n_group")?.unwrap_or(1),
                    topk_group: f.opt_usize("topk_group")?.unwrap_or(1),
                    routed_scaling_factor: f.opt_f64("routed_scaling_factor")?.unwrap_or(1.0),
                },
                n_shared_experts: f.opt_usize("n_shared_experts")?.unwrap_or(1),
                dense_layers: DenseLayers::FirstK(
                    f.opt_usize("first_k_dense_replace")?.unwrap_or(1),
                ),
                // transformers defaults `num_mtp_layers` to 1; a config that
                // names neither has no MTP tensors to skip or write.
                num_nextn_predict_layers: match f.opt_usize("num_nextn_predict_layers")? {
                    Some(n) => n,
                    None => f.opt_usize("num_mtp_layers")?.unwrap_or(0),
                },
            },
        };
        cfg.check(f)?;
        Ok(Some(cfg))
    }

    fn check(&self, f: &Fields<'_>) -> Result<()> {
        let k = self.num_experts_per_tok;
        if self.num_experts == 0 || self.moe_intermediate_size == 0 {
            return Err(f.err("num_experts", "experts and their size must be positive"));
        }
        if k == 0 || k > self.num_experts {
            return Err(f.err(
                "num_experts_per_tok",
                format!("{k} is not in 1..={}", self.num_experts),
            ));
        }
        if let DenseLayers::Qwen {
            decoder_sparse_step: 0,
            ..
        } = self.dense_layers
        {
            return Err(f.err("decoder_sparse_step", "must be positive"));
        }
        if let RouterKind::GroupedSigmoid {
            n_group,
            topk_group,
            ..
        } = self.router
        {
            // Each group's score is its two best experts (transformers'
            // `topk(2)`), and the chosen groups must hold k experts.
            let ok = n_group > 0
                && self.num_experts.is_multiple_of(n_group)
                && self.num_experts / n_group >= 2
                && topk_group >= 1
                && topk_group <= n_group
                && topk_group * (self.num_experts / n_group) >= k;
            if !ok {
                return Err(f.err(
                    "n_group",
                    format!(
                        "n_group {n_group} / topk_group {topk_group} do not fit {} experts \
                         choosing {k}",
                        self.num_experts
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Whether decoder layer `layer` has the sparse MoE block.
    pub fn is_sparse(&self, layer: usize) -> bool {
        match &self.dense_layers {
            DenseLayers::Qwen {
                decoder_sparse_step,
                mlp_only_layers,
            } => {
                !mlp_only_layers.contains(&layer)
                    && (layer + 1).is_multiple_of((*decoder_sparse_step).max(1))
            }
            DenseLayers::FirstK(k) => layer >= *k,
        }
    }

    /// The MoE fields as the family's `config.json` spells them.
    pub(super) fn write_hf(&self, obj: &mut serde_json::Map<String, Value>) {
        let mut set = |k: &str, v: Value| {
            obj.insert(k.to_owned(), v);
        };
        set("num_experts_per_tok", self.num_experts_per_tok.into());
        set("moe_intermediate_size", self.moe_intermediate_size.into());
        set("norm_topk_prob", self.norm_topk_prob.into());
        match &self.dense_layers {
            DenseLayers::Qwen {
                decoder_sparse_step,
                mlp_only_layers,
            } => {
                set("num_experts", self.num_experts.into());
                set("decoder_sparse_step", (*decoder_sparse_step).into());
                set("mlp_only_layers", mlp_only_layers.clone().into());
            }
            DenseLayers::FirstK(k) => {
                set("n_routed_experts", self.num_experts.into());
                set("first_k_dense_replace", (*k).into());
                set("n_shared_experts", self.n_shared_experts.into());
                set(
                    "num_nextn_predict_layers",
                    self.num_nextn_predict_layers.into(),
                );
            }
        }
        if let RouterKind::GroupedSigmoid {
            n_group,
            topk_group,
            routed_scaling_factor,
        } = &self.router
        {
            set("n_group", (*n_group).into());
            set("topk_group", (*topk_group).into());
            set("routed_scaling_factor", (*routed_scaling_factor).into());
        }
    }
}
