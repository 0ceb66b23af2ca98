//! MoE routing: from one token's router logits to its experts and their
//! weights, as transformers computes them (`Qwen3MoeSparseMoeBlock`,
//! `Glm4MoeMoE.route_tokens_to_experts`), in f32.
//!
//! Ties in the scores go to the lower expert index, so a token's choice is a
//! pure function of its own logits (never of the batch).

use crate::config::{MoeConfig, RouterKind};

/// One chosen expert and the weight its output is scaled by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    pub expert: usize,
    pub weight: f32,
}

/// Indices of the `k` largest of `scores`, best first; ties to the lower index.
fn top_k(scores: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    // total_cmp orders NaN above everything; router logits come from finite
    // weights, and a NaN row would only pick arbitrary experts, never panic.
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// The experts of one token given its router `logits` (`[num_experts]`) and,
/// for GLM-4.5, the `e_score_correction_bias`. Sorted by expert index (the
/// order outputs are summed in, as transformers' loop over experts).
pub fn route(logits: &[f32], bias: Option<&[f32]>, cfg: &MoeConfig) -> Vec<Choice> {
    let k = cfg.num_experts_per_tok;
    let mut choices = match &cfg.router {
        RouterKind::Softmax => {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let exp: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
            let sum: f32 = exp.iter().sum();
            let probs: Vec<f32> = exp.iter().map(|e| e / sum).collect();
            let chosen = top_k(&probs, k);
            let mut c: Vec<Choice> = chosen
                .iter()
                .map(|&e| Choice {
                    expert: e,
                    weight: probs[e],
                })
                .collect();
            if cfg.norm_topk_prob {
                let s: f32 = c.iter().map(|c| c.weight).sum();
                c.iter_mut().for_each(|c| c.weight /= s);
            }
            c
        }
        RouterKind::GroupedSigmoid {
            n_group,
            topk_group,
            routed_scaling_factor,
        } => grouped_sigmoid(
            logits,
            bias,
            cfg,
            *n_group,
            *topk_group,
            *routed_scaling_factor,
        ),
    };
    choices.sort_by_key(|c| c.expert);
    choices
}

/// GLM-4.5 / DeepSeek-V3 routing: sigmoid scores; choice on score + bias,
/// restricted to the `topk_group` groups whose two best biased scores sum
/// highest; weights are the unbiased scores (normalised, then scaled).
fn grouped_sigmoid(
    logits: &[f32],
    bias: Option<&[f32]>,
    cfg: &MoeConfig,
    n_group: usize,
    topk_group: usize,
    scale: f64,
) -> Vec<Choice> {
    let scores: Vec<f32> = logits.iter().map(|l| 1.0 / (1.0 + (-l).exp())).collect();
    let mut choice: Vec<f32> = match bias {
        Some(b) => scores.iter().zip(b).map(|(s, b)| s + b).collect(),
        None => scores.clone(),
    };
    let per = scores.len() / n_group.max(1);
    if n_group > 1 {
        let group_scores: Vec<f32> = choice
            .chunks(per)
            .map(|g| top_k(g, 2).iter().map(|&i| g[i]).sum())
            .collect();
        let keep = top_k(&group_scores, topk_group);
        for (g, chunk) in choice.chunks_mut(per).enumerate() {
            if !keep.contains(&g) {
                // transformers fills masked experts with 0.0 (not -inf), so
                // one can still win over negative biased scores; kept as is
                // to choose what it chooses.
                chunk.iter_mut().for_each(|s| *s = 0.0);
            }
        }
    }
    let mut c: Vec<Choice> = top_k(&choice, cfg.num_experts_per_tok)
        .into_iter()
        .map(|e| Choice {
            expert: e,
            weight: scores[e],
        })
        .collect();
    if cfg.norm_topk_prob {
        let s: f32 = c.iter().map(|c| c.weight).sum::<f32>() + 1e-20;
        c.iter_mut().for_each(|c| c.weight /= s);
    }
    c.iter_mut().for_each(|c| c.weight *= scale as f32);
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DenseLayers;

    fn cfg(router: RouterKind, k: usize, norm: bool) -> MoeConfig {
        MoeConfig {
            num_experts: 8,
            num_experts_per_tok: k,
            moe_intermediate_size: 4,
            norm_topk_prob: norm,
            router,
            n_shared_experts: 0,
            dense_layers: DenseLayers::FirstK(0),
            num_nextn_predict_layers: 0,
        }
    }

    #[test]
    fn softmax_top_k_with_and_without_norm() {
        let logits = [0.0, 2.0, 1.0, -1.0, 3.0, 0.5, 0.0, 0.0];
        let c = route(&logits, None, &cfg(RouterKind::Softmax, 2, false));
        assert_eq!(c.iter().map(|c| c.expert).collect::<Vec<_>>(), [1, 4]);
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        assert!((c[1].weight - 3f32.exp() / z).abs() < 1e-6);
        let c = route(&logits, None, &cfg(RouterKind::Softmax, 2, true));
        assert!((c[0].weight + c[1].weight - 1.0).abs() < 1e-6);
        assert!((c[1].weight - 1.0 / (1.0 + (-1f32).exp())).abs() < 1e-6);
    }

    /// Equal scores go to the lower index, whatever their position.
    #[test]
    fn ties_go_to_the_lower_expert() {
        let logits = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0];
        let c = route(&logits, None, &cfg(RouterKind::Softmax, 3, true));
        assert_eq!(c.iter().map(|c| c.expert).collect::<Vec<_>>(), [0, 2, 3]);
        let w = 1.0 / 3.0;
        assert!(c.iter().all(|c| (c.weight - w).abs() < 1e-6));
    }

    /// The bias steers the choice but not the weights; groups outside the
    /// best `topk_group` are never chosen.
    #[test]
    fn grouped_sigmoid_uses_bias_for_choice_only() {
        let router = RouterKind::GroupedSigmoid {
            n_group: 4,
            topk_group: 2,
            routed_scaling_factor: 2.5,
        };
        let logits = [0.0, 0.1, 3.0, -3.0, 1.0, 1.0, -2.0, -2.0];
        // Group scores (two best biased scores): g0 ~ 1.03, g1 ~ 1.0,
        // g2 ~ 1.46, g3 ~ 0.24 + 2 * bias.
        let mut bias = [0.0f32; 8];
        bias[6] = 0.5;
        bias[7] = 0.5;
        let c = route(&logits, Some(&bias), &cfg(router.clone(), 2, true));
        let experts: Vec<usize> = c.iter().map(|c| c.expert).collect();
        let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
        // Groups 2 (experts 4, 5) and 3 (6, 7 with bias ~0.62) win; then
        // experts 4 and 5 (0.73) beat 6 and 7 (0.12 + 0.5).
        assert_eq!(experts, [4, 5]);
        let total = 2.0 * sig(1.0);
        assert!((c[0].weight - sig(1.0) / total * 2.5).abs() < 1e-6);
        // Without norm the weights are the plain scores times the scale.
        let c = route(&logits, Some(&bias), &cfg(router, 2, false));
        assert!((c[0].weight - sig(1.0) * 2.5).abs() < 1e-6);
    }
}
