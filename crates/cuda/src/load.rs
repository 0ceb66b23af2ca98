//! A checkpoint mapped by the runtime's loader, uploaded layer by layer in
//! the layout [`GpuModel`](crate::model) runs: matrices in the serving dtype
//! straight from the file ([`stage`]), fused where the forward fuses them
//! (Q/K/V rows concatenated, gate and up), norms and biases in f32.

use std::sync::Arc;

use agentd_runtime::config::RouterKind;
use agentd_runtime::loader::Weights;
use agentd_runtime::{Family, Qwen3Config};

use crate::device::{Buf, Gpu};
use crate::error::Result;
use crate::model::{Ffn, Layer, SparseFfn};
use crate::plan::Dtype;
use crate::stage;

/// What one upload reads from and writes to.
pub(crate) struct Upload<'a> {
    pub(crate) gpu: &'a Arc<Gpu>,
    pub(crate) cfg: &'a Qwen3Config,
    pub(crate) w: &'a Weights,
    pub(crate) dtype: Dtype,
}

impl Upload<'_> {
    /// A tensor read as f32 on the host (norms, biases, routing bias).
    pub(crate) fn host(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        Ok(self.w.get_f32(name, shape)?)
    }

    /// Matrices from the mapped file to the device in `dtype` (bf16
    /// checkpoints bit for bit, no f32 stage); several are appended into one.
    pub(crate) fn mat(&self, names: &[(&str, usize, usize)]) -> Result<Buf<u16>> {
        let mut bits = Vec::new();
        for &(name, rows, cols) in names {
            stage::append_matrix(self.w, name, &[rows, cols], self.dtype, &mut bits)?;
        }
        self.gpu.upload(&bits)
    }

    /// A vector of `n` in f32 on the device.
    pub(crate) fn vec(&self, name: &str, n: usize) -> Result<Buf<f32>> {
        self.gpu.upload(&self.host(name, &[n])?)
    }

    fn glm(&self) -> bool {
        self.cfg.family == Family::Glm4
    }

    /// A SwiGLU MLP of `n` intermediate units at `m` (GLM-4 stores gate and
    /// up fused, the others apart): (gate_up, down).
    fn swiglu(&self, m: &str, n: usize) -> Result<(Buf<u16>, Buf<u16>)> {
        let hid = self.cfg.hidden_size;
        let gate_up = if self.glm() {
            self.mat(&[(&format!("{m}.gate_up_proj.weight"), 2 * n, hid)])?
        } else {
            let (gate, up) = (
                format!("{m}.gate_proj.weight"),
                format!("{m}.up_proj.weight"),
            );
            self.mat(&[(&gate, n, hid), (&up, n, hid)])?
        };
        Ok((
            gate_up,
            self.mat(&[(&format!("{m}.down_proj.weight"), hid, n)])?,
        ))
    }

    /// Layer `i`'s feed-forward block under prefix `p`: dense, or the
    /// routed experts (with GLM-4.5's correction bias and shared experts).
    fn ffn(&self, p: &str, i: usize) -> Result<Ffn> {
        let m = format!("{p}.mlp");
        let hid = self.cfg.hidden_size;
        match &self.cfg.moe {
            Some(moe) if moe.is_sparse(i) => {
                let (e, mi) = (moe.num_experts, moe.moe_intermediate_size);
                let grouped = matches!(moe.router, RouterKind::GroupedSigmoid { .. });
                let bias = format!("{m}.gate.e_score_correction_bias");
                Ok(Ffn::Sparse(Box::new(SparseFfn::new(
                    self.gpu,
                    self.mat(&[(&format!("{m}.gate.weight"), e, hid)])?,
                    (0..e)
                        .map(|x| self.swiglu(&format!("{m}.experts.{x}"), mi))
                        .collect::<Result<_>>()?,
                    grouped.then(|| self.host(&bias, &[e])).transpose()?,
                    (moe.n_shared_experts > 0)
                        .then(|| {
                            self.swiglu(&format!("{m}.shared_experts"), moe.n_shared_experts * mi)
                        })
                        .transpose()?,
                )?)))
            }
            _ => self
                .swiglu(&m, self.cfg.intermediate_size)
                .map(|(gate_up, down)| Ffn::Dense { gate_up, down }),
        }
    }

    /// Decoder layer `i`.
    pub(crate) fn layer(&self, i: usize) -> Result<Layer> {
        let cfg = self.cfg;
        let (h, kv, d) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        let hid = cfg.hidden_size;
        let p = format!("model.layers.{i}");
        let a = format!("{p}.self_attn");
        let proj = |x: &str, part: &str| format!("{a}.{x}_proj.{part}");
        let ffn = self.ffn(&p, i)?;
        let qkv_bias = if cfg.attention_bias {
            let mut b = self.host(&proj("q", "bias"), &[h * d])?;
            b.extend(self.host(&proj("k", "bias"), &[kv * d])?);
            b.extend(self.host(&proj("v", "bias"), &[kv * d])?);
            Some(self.gpu.upload(&b)?)
        } else {
            None
        };
        let norm = |n: &str| self.vec(&format!("{p}.{n}.weight"), hid);
        let qk = |n: &str| -> Result<Option<Buf<f32>>> {
            cfg.qk_norm
                .then(|| self.vec(&format!("{a}.{n}.weight"), d))
                .transpose()
        };
        let (q, k, v, o) = (
            proj("q", "weight"),
            proj("k", "weight"),
            proj("v", "weight"),
            proj("o", "weight"),
        );
        let glm = self.glm();
        Ok(Layer {
            qkv: self.mat(&[(&q, h * d, hid), (&k, kv * d, hid), (&v, kv * d, hid)])?,
            o: self.mat(&[(&o, hid, h * d)])?,
            ffn,
            input_norm: norm("input_layernorm")?,
            post_norm: norm("post_attention_layernorm")?,
            q_norm: qk("q_norm")?,
            k_norm: qk("k_norm")?,
            qkv_bias,
            attn_out_norm: glm.then(|| norm("post_self_attn_layernorm")).transpose()?,
            mlp_out_norm: glm.then(|| norm("post_mlp_layernorm")).transpose()?,
        })
    }
}
