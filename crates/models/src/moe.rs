//! The sparse mixture-of-experts feed-forward block (Qwen3-MoE, GLM-4.5).
//!
//! Per step: the router scores every token ([`crate::router`]), tokens are
//! grouped per expert, and each expert runs one product over all of its
//! tokens (not one per token: at batch 32 with 8 of 128 experts per token an
//! expert sees ~2 tokens per step, and its weights stream once for both).
//! Experts run in parallel; each token then sums its experts' outputs, times
//! their router weights, in expert order (plus the shared experts, GLM-4.5).
//!
//! Batch invariance: a token's route depends only on its own logits, each
//! expert's product gives every row the same value whatever other rows it
//! runs with (`matmul` module), and the sum order is fixed per token; so a
//! token's output does not depend on the rest of the batch.

use rayon::prelude::*;

use crate::config::{ModelConfig, MoeConfig, RouterKind};
use crate::error::Result;
use crate::layers::{linear, norm_weight, Linear};
use crate::loader::Weights;
use crate::mlp::Mlp;
use crate::router::{route, Choice};

pub struct SparseMoe {
    gate: Linear,
    /// GLM-4.5's `e_score_correction_bias` (`[num_experts]`).
    correction_bias: Option<Vec<f32>>,
    experts: Vec<Mlp>,
    shared_experts: Option<Mlp>,
    cfg: MoeConfig,
    hidden: usize,
}

/// A dense or sparse feed-forward block, as a layer of an MoE model has.
pub enum Ffn {
    Dense(Mlp),
    Sparse(Box<SparseMoe>),
}

impl Ffn {
    pub fn forward(&self, x: &[f32]) -> Result<Vec<f32>> {
        match self {
            Ffn::Dense(m) => m.forward(x),
            Ffn::Sparse(m) => m.forward(x),
        }
    }
}

impl SparseMoe {
    /// Loads `{p}.gate` (the router), `{p}.experts.{e}.*` and, when the
    /// config has them, `{p}.gate.e_score_correction_bias` and
    /// `{p}.shared_experts.*`.
    pub fn load(w: &Weights, p: &str, model: &ModelConfig, cfg: &MoeConfig) -> Result<Self> {
        let (hid, e, inter) = (
            model.hidden_size,
            cfg.num_experts,
            cfg.moe_intermediate_size,
        );
        let correction_bias = match cfg.router {
            RouterKind::GroupedSigmoid { .. } => Some(norm_weight(
                w,
                &format!("{p}.gate.e_score_correction_bias"),
                e,
            )?),
            RouterKind::Softmax => None,
        };
        let experts = (0..e)
            .map(|i| Mlp::load(w, &format!("{p}.experts.{i}"), hid, inter))
            .collect::<Result<Vec<_>>>()?;
        let shared_experts = if cfg.n_shared_experts > 0 {
            let n = cfg.n_shared_experts * inter;
            Some(Mlp::load(w, &format!("{p}.shared_experts"), hid, n)?)
        } else {
            None
        };
        Ok(SparseMoe {
            gate: linear(w, &format!("{p}.gate"), e, hid, false)?,
            correction_bias,
            experts,
            shared_experts,
            cfg: cfg.clone(),
            hidden: hid,
        })
    }

    /// `x`: normed hidden states `[T, hidden]` → `[T, hidden]`.
    pub fn forward(&self, x: &[f32]) -> Result<Vec<f32>> {
        let hid = self.hidden;
        let t = x.len() / hid;
        let e = self.cfg.num_experts;
        let logits = self.gate.forward(x)?;
        let routes: Vec<Vec<Choice>> = logits
            .par_chunks(e)
            .map(|row| route(row, self.correction_bias.as_deref(), &self.cfg))
            .collect();
        // tokens_of[e]: the tokens routed to expert e, in token order.
        let mut tokens_of: Vec<Vec<usize>> = vec![Vec::new(); e];
        for (tok, r) in routes.iter().enumerate() {
            for c in r {
                tokens_of[c.expert].push(tok);
            }
        }
        let busy: Vec<usize> = (0..e).filter(|&i| !tokens_of[i].is_empty()).collect();
        let outs = busy
            .par_iter()
            .map(|&i| {
                let toks = &tokens_of[i];
                let mut rows = Vec::with_capacity(toks.len() * hid);
                for &tok in toks {
                    rows.extend_from_slice(&x[tok * hid..(tok + 1) * hid]);
                }
                self.experts[i].forward(&rows)
            })
            .collect::<Result<Vec<_>>>()?;
        // Where expert e's output for a token lives: (index into outs, row).
        let mut slot_of = vec![usize::MAX; e];
        for (k, &i) in busy.iter().enumerate() {
            slot_of[i] = k;
        }
        let mut out = vec![0f32; t * hid];
        out.par_chunks_mut(hid).enumerate().for_each(|(tok, o)| {
            for c in &routes[tok] {
                let k = slot_of[c.expert];
                // The row of this token among the expert's tokens.
                let row = tokens_of[c.expert].partition_point(|&x| x < tok);
                let src = &outs[k][row * hid..(row + 1) * hid];
                o.iter_mut().zip(src).for_each(|(o, s)| *o += c.weight * s);
            }
        });
        if let Some(shared) = &self.shared_experts {
            // transformers adds the shared experts after the routed sum.
            let s = shared.forward(x)?;
            out.iter_mut().zip(&s).for_each(|(o, s)| *o += s);
        }
        Ok(out)
    }
}
