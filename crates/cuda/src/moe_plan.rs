//! Qwen3-MoE and GLM-4.5 on the GPU, the host half: a sparse layer's router logits (one
//! `[tokens, experts]` f32 download a layer) routed as the CPU backend
//! routes them ([`agentd_runtime::router::route`]: softmax, top-k, ties to
//! the lower expert, renormalised when `norm_topk_prob`), then grouped per
//! expert for the device: each busy expert's tokens and weights, laid end
//! to end, experts in index order (the order every token's outputs are
//! summed in, as on the CPU). Pure and always built; tested in CI.

use agentd_runtime::config::MoeConfig;
use agentd_runtime::router::route;

use crate::error::{CudaError, Result};

/// One busy expert's run in [`MoePlan::tokens`] / [`MoePlan::weights`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertRun {
    pub expert: usize,
    pub offset: usize,
    pub len: usize,
}

/// A sparse layer's routing, grouped per expert.
#[derive(Debug, Clone, PartialEq)]
pub struct MoePlan {
    /// Token rows, each expert's in token order.
    pub tokens: Vec<i32>,
    /// The routing weight of each entry of `tokens`.
    pub weights: Vec<f32>,
    /// Busy experts in index order.
    pub runs: Vec<ExpertRun>,
}

impl MoePlan {
    /// The most tokens one expert takes (its scratch rows).
    pub fn max_len(&self) -> usize {
        self.runs.iter().map(|r| r.len).max().unwrap_or(0)
    }
}

/// Routes `tokens` rows of `logits` (`[tokens, num_experts]`; `bias`:
/// GLM-4.5's `e_score_correction_bias`).
pub fn plan(
    logits: &[f32],
    tokens: usize,
    bias: Option<&[f32]>,
    cfg: &MoeConfig,
) -> Result<MoePlan> {
    let e = cfg.num_experts;
    if e == 0 || logits.len() != tokens * e {
        return Err(CudaError::Unsupported(format!(
            "{} router logits for {tokens} tokens of {e} experts",
            logits.len()
        )));
    }
    let mut per_expert: Vec<Vec<(i32, f32)>> = vec![Vec::new(); e];
    for (t, row) in logits.chunks_exact(e).enumerate() {
        let t = i32::try_from(t).map_err(|_| CudaError::Unsupported("token index".into()))?;
        for c in route(row, bias, cfg) {
            per_expert[c.expert].push((t, c.weight));
        }
    }
    let mut out = MoePlan {
        tokens: Vec::with_capacity(tokens * cfg.num_experts_per_tok),
        weights: Vec::with_capacity(tokens * cfg.num_experts_per_tok),
        runs: Vec::new(),
    };
    for (expert, list) in per_expert.into_iter().enumerate() {
        if list.is_empty() {
            continue;
        }
        out.runs.push(ExpertRun {
            expert,
            offset: out.tokens.len(),
            len: list.len(),
        });
        for (t, w) in list {
            out.tokens.push(t);
            out.weights.push(w);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentd_runtime::config::{DenseLayers, RouterKind};

    fn cfg(k: usize, norm: bool) -> MoeConfig {
        MoeConfig {
            num_experts: 4,
            num_experts_per_tok: k,
            moe_intermediate_size: 8,
            norm_topk_prob: norm,
            router: RouterKind::Softmax,
            n_shared_experts: 0,
            dense_layers: DenseLayers::Qwen {
                decoder_sparse_step: 1,
                mlp_only_layers: Vec::new(),
            },
            num_nextn_predict_layers: 0,
        }
    }

    #[test]
    fn tokens_are_grouped_per_expert_in_expert_then_token_order() {
        // Token 0 prefers experts 2, 0; token 1: 1, 2; token 2: 2, 3.
        let logits = [
            1.0, 0.0, 3.0, -1.0, //
            0.0, 4.0, 2.0, 0.5, //
            0.0, 0.0, 5.0, 4.0,
        ];
        let p = plan(&logits, 3, None, &cfg(2, true)).unwrap();
        let runs: Vec<(usize, usize)> = p.runs.iter().map(|r| (r.expert, r.len)).collect();
        assert_eq!(runs, [(0, 1), (1, 1), (2, 3), (3, 1)]);
        assert_eq!(p.tokens, [0, 1, 0, 1, 2, 2]);
        assert_eq!(p.max_len(), 3);
        // Each token's weights are the CPU router's, summing to 1 (norm_topk_prob).
        for t in 0..3 {
            let want = route(&logits[t * 4..(t + 1) * 4], None, &cfg(2, true));
            let got: Vec<(usize, f32)> = p
                .runs
                .iter()
                .flat_map(|r| (r.offset..r.offset + r.len).map(move |i| (r.expert, i)))
                .filter(|&(_, i)| p.tokens[i] == t as i32)
                .map(|(e, i)| (e, p.weights[i]))
                .collect();
            let want: Vec<(usize, f32)> = want.iter().map(|c| (c.expert, c.weight)).collect();
            assert_eq!(got, want, "token {t}");
            assert!((got.iter().map(|g| g.1).sum::<f32>() - 1.0).abs() < 1e-6);
        }
        assert!(plan(&logits[..5], 3, None, &cfg(2, true)).is_err());
    }
}
