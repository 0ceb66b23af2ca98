//! Qwen3-MoE and GLM-4.5 on the GPU, the host half: a sparse layer's router logits (one
//! `[tokens, experts]` f32 download a layer) routed as the CPU backend
//! routes them ([`agentd_runtime::router::route`]: softmax, top-k, ties to
//! the lower expert, renormalised when `norm_topk_prob`), then grouped per
//! expert for the device: each busy expert's tokens and weights, laid end
//! to end, experts in index order (the order every token's outputs are
//! summed in, as on the CPU). Pure and always built; tested in CI.

use agentd_runtime::config::{MoeConfig, RouterKind};
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

/// Rows per M-block and columns per N-block of the grouped GEMM, and the
/// most experts the routing kernel holds (`MOE_BM`, `MOE_BN`,
/// `MOE_MAX_EXPERTS` in kernels/moe.cu).
pub const MOE_BM: usize = 64;
pub const MOE_BN: usize = 64;
pub const MOE_MAX_EXPERTS: usize = 256;
/// The most choices per token the routing kernel sorts.
pub const MOE_MAX_TOPK: usize = 16;

/// Whether the device path (`--device-moe`) takes this config: its
/// routing holds at most 256 experts and 16 choices, groups that divide
/// the experts, and its GEMM loads 16 bytes (8 halves) at a time.
pub fn device_fits(cfg: &MoeConfig, hidden: usize) -> Result<()> {
    let (e, k, inter) = (
        cfg.num_experts,
        cfg.num_experts_per_tok,
        cfg.moe_intermediate_size,
    );
    let groups_ok = match cfg.router {
        RouterKind::Softmax => true,
        RouterKind::GroupedSigmoid {
            n_group,
            topk_group,
            ..
        } => n_group >= 1 && e.is_multiple_of(n_group) && topk_group <= n_group,
    };
    let ok = (1..=MOE_MAX_EXPERTS).contains(&e)
        && (1..=MOE_MAX_TOPK.min(e)).contains(&k)
        && hidden.is_multiple_of(8)
        && inter.is_multiple_of(8)
        && groups_ok;
    if ok {
        return Ok(());
    }
    Err(CudaError::Unsupported(format!(
        "device MoE with {e} experts, top-{k}, hidden {hidden}, expert width {inter}"
    )))
}

/// The routing kernel's arguments for `cfg.router`: (kind, n_group,
/// topk_group, scale); kind 0 is softmax, 1 grouped sigmoid.
pub fn router_args(cfg: &MoeConfig) -> (i32, i32, i32, f32) {
    match cfg.router {
        RouterKind::Softmax => (0, 1, 1, 1.0),
        RouterKind::GroupedSigmoid {
            n_group,
            topk_group,
            routed_scaling_factor,
        } => (
            1,
            n_group as i32,
            topk_group as i32,
            routed_scaling_factor as f32,
        ),
    }
}

/// Buffer sizes of the device path for a step of `tokens` tokens, known
/// before routing (so nothing waits for it): every (token, choice) pair
/// has a row, each busy expert's run is padded to [`MOE_BM`] rows, and at
/// most `min(experts, pairs)` experts are busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceBounds {
    pub pairs: usize,
    pub max_blocks: usize,
    pub max_rows: usize,
}

pub fn device_bounds(tokens: usize, cfg: &MoeConfig) -> DeviceBounds {
    let pairs = tokens * cfg.num_experts_per_tok;
    let busy = cfg.num_experts.min(pairs);
    let max_blocks = (pairs + busy * (MOE_BM - 1)).div_ceil(MOE_BM);
    DeviceBounds {
        pairs,
        max_blocks,
        max_rows: max_blocks * MOE_BM,
    }
}

/// What `moe_align_count` + `moe_align_scatter` build from the routed
/// expert of each pair (`ids`, `[tokens * k]`), on the host: the reference
/// the device check compares with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aligned {
    /// First row of each expert's padded run, and the end (`[E + 1]`).
    pub offsets: Vec<i32>,
    /// The expert of each used M-block.
    pub block_expert: Vec<i32>,
    /// The pair in each row, -1 on padding (`offsets[E]` rows).
    pub sorted: Vec<i32>,
    /// The row of each pair.
    pub row_of: Vec<i32>,
}

pub fn align(ids: &[i32], num_experts: usize) -> Aligned {
    let mut per: Vec<Vec<i32>> = vec![Vec::new(); num_experts];
    for (i, &e) in ids.iter().enumerate() {
        if let Some(list) = usize::try_from(e).ok().and_then(|e| per.get_mut(e)) {
            list.push(i as i32);
        }
    }
    let mut out = Aligned {
        offsets: Vec::with_capacity(num_experts + 1),
        block_expert: Vec::new(),
        sorted: Vec::new(),
        row_of: vec![-1; ids.len()],
    };
    for (e, pairs) in per.iter().enumerate() {
        out.offsets.push(out.sorted.len() as i32);
        let blocks = pairs.len().div_ceil(MOE_BM);
        out.block_expert
            .extend(std::iter::repeat_n(e as i32, blocks));
        for &p in pairs {
            out.row_of[p as usize] = out.sorted.len() as i32;
            out.sorted.push(p);
        }
        out.sorted
            .resize(out.offsets[e] as usize + blocks * MOE_BM, -1);
    }
    out.offsets.push(out.sorted.len() as i32);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentd_runtime::config::DenseLayers;

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

    /// The device layout groups pairs as the host plan does (expert, then
    /// token order), pads each run to whole M-blocks with -1, maps every
    /// pair to its row, and stays within the bounds known before routing.
    #[test]
    fn the_device_layout_is_the_host_grouping_padded_to_blocks() {
        let logits = [
            1.0, 0.0, 3.0, -1.0, //
            0.0, 4.0, 2.0, 0.5, //
            0.0, 0.0, 5.0, 4.0,
        ];
        let c = cfg(2, true);
        let p = plan(&logits, 3, None, &c).unwrap();
        // Each token's choices in expert order, as moe_route writes them.
        let mut ids = Vec::new();
        for t in 0..3 {
            ids.extend(
                route(&logits[t * 4..(t + 1) * 4], None, &c)
                    .iter()
                    .map(|c| c.expert as i32),
            );
        }
        let a = align(&ids, 4);
        assert_eq!(a.offsets, [0, 64, 128, 192, 256]);
        assert_eq!(a.block_expert, [0, 1, 2, 3]);
        for run in &p.runs {
            let first = a.offsets[run.expert] as usize;
            let tokens: Vec<i32> = a.sorted[first..first + run.len]
                .iter()
                .map(|&i| i / 2)
                .collect();
            assert_eq!(
                tokens,
                p.tokens[run.offset..run.offset + run.len],
                "expert {}",
                run.expert
            );
            assert!(
                a.sorted[first + run.len..a.offsets[run.expert + 1] as usize]
                    .iter()
                    .all(|&x| x == -1)
            );
        }
        for (pair, &row) in a.row_of.iter().enumerate() {
            assert_eq!(a.sorted[row as usize], pair as i32);
        }
        let b = device_bounds(3, &c);
        assert_eq!(b.pairs, 6);
        assert!(a.block_expert.len() <= b.max_blocks && a.sorted.len() <= b.max_rows);
    }

    #[test]
    fn device_bounds_cover_the_worst_spread_and_the_config_limits_hold() {
        let c = cfg(2, true);
        // 100 tokens: 200 pairs; all on one expert -> 4 blocks; spread over
        // all 4 experts unevenly -> at most 200/64 + 4 blocks.
        for ids in [
            vec![0i32; 200],
            (0..200).map(|i| i % 4).collect(),
            (0..200)
                .map(|i| if i < 130 { 1 } else { 3 })
                .collect::<Vec<i32>>(),
        ] {
            let a = align(&ids, 4);
            let b = device_bounds(100, &c);
            assert!(
                a.block_expert.len() <= b.max_blocks,
                "{} > {}",
                a.block_expert.len(),
                b.max_blocks
            );
            assert_eq!(a.sorted.iter().filter(|&&x| x >= 0).count(), 200);
        }
        assert!(device_fits(&c, 64).is_ok());
        assert!(device_fits(&c, 60).is_err());
        let mut wide = cfg(2, true);
        wide.num_experts = 300;
        assert!(device_fits(&wide, 64).is_err());
        assert_eq!(router_args(&c), (0, 1, 1, 1.0));
    }
}
