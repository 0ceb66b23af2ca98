//! Qwen3 and GLM-4-0414 dense, Qwen3-MoE and GLM-4.5 (the sparse block:
//! `moe.rs`) on the GPU: the same decoders as
//! `agentd_models::qwen3` (pre-norm GQA layers with per-head q/k RMSNorm
//! before neox RoPE, SwiGLU MLP, tied or untied output head) and
//! `agentd_models::glm4` (q/k/v bias, no q/k norm, partial interleaved RoPE,
//! the attention and MLP outputs RMS-normed again before the residual add),
//! with weights in bf16/f16, cuBLAS for the products and the kernels of
//! `kernels/` for the rest. Like the CPU model it keeps no state between
//! calls: each step gets the flattened batch and the cache.
//!
//! Fusions: Q, K and V are one product (their weight rows concatenated), and
//! gate and up are one; the residual stream stays in f32 and each RMSNorm is
//! fused with the residual add before it.

use std::sync::Arc;

use agentd_runtime::loader::Weights;
use agentd_runtime::rope::inv_freq;
use agentd_runtime::{KvCacheConfig, Qwen3Config};

use crate::device::{Buf, Gpu};
use crate::error::Result;
use crate::forward::Workspace;
use crate::load::Upload;
use crate::plan::{rope_table, Dtype, Kernels};

/// A layer's feed-forward block.
pub(crate) enum Ffn {
    /// Gate and up fused `[2 * inter, hidden]`, down `[hidden, inter]`.
    Dense { gate_up: Buf<u16>, down: Buf<u16> },
    /// A sparse MoE block.
    Sparse(Box<SparseFfn>),
}

/// The router `[experts, hidden]`, each expert's fused gate/up and down,
/// GLM-4.5's `e_score_correction_bias` (on the host, where the validated
/// path routes; and on the device for `--device-moe`), shared experts (one
/// SwiGLU MLP of `n_shared × moe_inter`), and the experts' addresses for
/// the grouped GEMM.
pub(crate) struct SparseFfn {
    pub(crate) gate: Buf<u16>,
    pub(crate) experts: Vec<(Buf<u16>, Buf<u16>)>,
    pub(crate) correction_bias: Option<Vec<f32>>,
    pub(crate) shared: Option<(Buf<u16>, Buf<u16>)>,
    pub(crate) tables: ExpertTables,
}

/// What `--device-moe` reads on the device: each expert's gate/up and down
/// address (`[experts]` u64, into `SparseFfn::experts`, which outlives
/// them) and the correction bias.
pub(crate) struct ExpertTables {
    pub(crate) gate_up: Buf<u64>,
    pub(crate) down: Buf<u64>,
    pub(crate) bias: Option<Buf<f32>>,
}

impl SparseFfn {
    pub(crate) fn new(
        gpu: &Gpu,
        gate: Buf<u16>,
        experts: Vec<(Buf<u16>, Buf<u16>)>,
        correction_bias: Option<Vec<f32>>,
        shared: Option<(Buf<u16>, Buf<u16>)>,
    ) -> Result<Self> {
        let gu: Vec<u64> = experts.iter().map(|(g, _)| gpu.ptr(g, 0)).collect();
        let down: Vec<u64> = experts.iter().map(|(_, d)| gpu.ptr(d, 0)).collect();
        let tables = ExpertTables {
            gate_up: gpu.upload(&gu)?,
            down: gpu.upload(&down)?,
            bias: correction_bias
                .as_deref()
                .map(|b| gpu.upload(b))
                .transpose()?,
        };
        Ok(SparseFfn {
            gate,
            experts,
            correction_bias,
            shared,
            tables,
        })
    }
}

pub(crate) struct Layer {
    pub(crate) qkv: Buf<u16>,
    pub(crate) o: Buf<u16>,
    /// The MLP: dense, or Qwen3-MoE's routed experts.
    pub(crate) ffn: Ffn,
    pub(crate) input_norm: Buf<f32>,
    pub(crate) post_norm: Buf<f32>,
    /// Qwen3's per-head q/k norms.
    pub(crate) q_norm: Option<Buf<f32>>,
    pub(crate) k_norm: Option<Buf<f32>>,
    /// GLM-4's q/k/v bias, concatenated like the fused product's rows.
    pub(crate) qkv_bias: Option<Buf<f32>>,
    /// GLM-4's `post_self_attn_layernorm` and `post_mlp_layernorm`.
    pub(crate) attn_out_norm: Option<Buf<f32>>,
    pub(crate) mlp_out_norm: Option<Buf<f32>>,
}

/// A paged KV cache in device memory: per layer, K and V shaped
/// `[num_blocks, num_kv_heads, block_size, head_dim]` (as on the CPU).
pub struct GpuKvCache {
    pub(crate) k: Vec<Buf<u16>>,
    pub(crate) v: Vec<Buf<u16>>,
    pub(crate) cfg: KvCacheConfig,
}

impl GpuKvCache {
    pub fn new(gpu: &Gpu, cfg: KvCacheConfig) -> Result<Self> {
        let n = cfg.num_blocks * cfg.num_kv_heads * cfg.block_size * cfg.head_dim;
        let mut k = Vec::with_capacity(cfg.num_layers);
        let mut v = Vec::with_capacity(cfg.num_layers);
        for _ in 0..cfg.num_layers {
            k.push(gpu.zeros::<u16>(n)?);
            v.push(gpu.zeros::<u16>(n)?);
        }
        Ok(GpuKvCache { k, v, cfg })
    }

    pub fn config(&self) -> &KvCacheConfig {
        &self.cfg
    }

    /// Drops the K/V buffers (their memory goes back to the stream's pool;
    /// `Gpu::trim_pool` returns it to the device). No step may run until
    /// [`GpuKvCache::restore`].
    pub fn release(&mut self) {
        self.k = Vec::new();
        self.v = Vec::new();
    }

    /// Zeroed buffers of the same geometry again, if released.
    pub fn restore(&mut self, gpu: &Gpu) -> Result<()> {
        if self.k.len() != self.cfg.num_layers {
            *self = GpuKvCache::new(gpu, self.cfg)?;
        }
        Ok(())
    }

    /// Fills every block with random values (benchmarks: a cache "prefilled"
    /// without running prefill).
    pub fn fill_random(&mut self, gpu: &Gpu, dt: Dtype, seed: u64) -> Result<()> {
        for (i, buf) in self.k.iter().chain(&self.v).enumerate() {
            gpu.fill_uniform(dt, gpu.ptr(buf, 0), buf.len(), seed + i as u64, -1.0, 1.0)?;
        }
        Ok(())
    }

    /// K and V of `layer`, as host values (tests).
    pub fn download_layer(&self, gpu: &Gpu, layer: usize) -> Result<(Vec<u16>, Vec<u16>)> {
        Ok((gpu.download(&self.k[layer])?, gpu.download(&self.v[layer])?))
    }
}

/// A decoder on one GPU (Qwen3, Qwen3-MoE, GLM-4-0414 or GLM-4.5, by its
/// config's family; `plan::supported`).
pub struct GpuModel {
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) cfg: Qwen3Config,
    pub(crate) dtype: Dtype,
    pub(crate) embed: Buf<u16>,
    pub(crate) lm_head: Option<Buf<u16>>,
    pub(crate) norm: Buf<f32>,
    pub(crate) layers: Vec<Layer>,
    pub(crate) cos_sin: Buf<f32>,
    /// Activation buffers reused across steps (grown on demand): one model
    /// runs on one stream, so steps never overlap.
    pub(crate) workspace: std::sync::Mutex<Option<Workspace>>,
    /// Page-locked host buffer the logits come back through.
    pub(crate) pinned: std::sync::Mutex<Option<cudarc::driver::PinnedHostSlice<f32>>>,
}

impl GpuModel {
    /// Uploads a checkpoint mapped by the runtime's loader: matrices in `dtype`
    /// straight from the file ([`stage`]), norms in f32.
    pub fn from_weights(
        gpu: Arc<Gpu>,
        cfg: Qwen3Config,
        w: &Weights,
        dtype: Dtype,
    ) -> Result<Self> {
        crate::plan::supported(&cfg)?;
        let up = Upload {
            gpu: &gpu,
            cfg: &cfg,
            w,
            dtype,
        };
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| up.layer(i))
            .collect::<Result<Vec<_>>>()?;
        let (hid, vocab) = (cfg.hidden_size, cfg.vocab_size);
        let embed = up.mat(&[("model.embed_tokens.weight", vocab, hid)])?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(up.mat(&[("lm_head.weight", vocab, hid)])?)
        };
        let norm = up.vec("model.norm.weight", hid)?;
        Self::assemble(gpu, cfg, dtype, embed, lm_head, norm, layers)
    }

    /// A model of `cfg`'s shape with deterministic random weights made on the
    /// device (checkpoints too large to build on the host; benchmarks).
    pub fn random(gpu: Arc<Gpu>, cfg: Qwen3Config, dtype: Dtype, seed: u64) -> Result<Self> {
        crate::plan::supported(&cfg)?;
        if cfg.moe.is_some() {
            return Err(crate::error::CudaError::Unsupported(
                "random weights on the device: dense models only".into(),
            ));
        }
        let (h, kv, d) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        let (hid, inter, vocab) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
        let mut next = seed;
        let mut rand = |rows: usize, cols: usize| -> Result<Buf<u16>> {
            let buf = gpu.zeros::<u16>(rows * cols)?;
            let a = 1.0 / (cols as f32).sqrt();
            next += 1;
            gpu.fill_uniform(dtype, gpu.ptr(&buf, 0), rows * cols, next, -a, a)?;
            Ok(buf)
        };
        let ones = |n: usize| gpu.upload(&vec![1f32; n]);
        let glm = cfg.family == agentd_runtime::Family::Glm4;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for _ in 0..cfg.num_hidden_layers {
            layers.push(Layer {
                qkv: rand((h + 2 * kv) * d, hid)?,
                o: rand(hid, h * d)?,
                ffn: Ffn::Dense {
                    gate_up: rand(2 * inter, hid)?,
                    down: rand(hid, inter)?,
                },
                input_norm: ones(hid)?,
                post_norm: ones(hid)?,
                q_norm: cfg.qk_norm.then(|| ones(d)).transpose()?,
                k_norm: cfg.qk_norm.then(|| ones(d)).transpose()?,
                qkv_bias: cfg
                    .attention_bias
                    .then(|| gpu.zeros::<f32>((h + 2 * kv) * d))
                    .transpose()?,
                attn_out_norm: glm.then(|| ones(hid)).transpose()?,
                mlp_out_norm: glm.then(|| ones(hid)).transpose()?,
            });
        }
        let embed = rand(vocab, hid)?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(rand(vocab, hid)?)
        };
        let norm = ones(hid)?;
        Self::assemble(gpu, cfg, dtype, embed, lm_head, norm, layers)
    }

    /// The model from its uploaded weights; adds the RoPE table.
    fn assemble(
        gpu: Arc<Gpu>,
        cfg: Qwen3Config,
        dtype: Dtype,
        embed: Buf<u16>,
        lm_head: Option<Buf<u16>>,
        norm: Buf<f32>,
        layers: Vec<Layer>,
    ) -> Result<Self> {
        let cos_sin = gpu.upload(&rope_table(&inv_freq(&cfg), cfg.max_position_embeddings))?;
        Ok(GpuModel {
            gpu,
            cfg,
            dtype,
            embed,
            lm_head,
            norm,
            layers,
            cos_sin,
            workspace: Default::default(),
            pinned: Default::default(),
        })
    }

    /// The kernels `asked` that apply to this model: the fused prologue is
    /// Qwen3's (q/k norm, neox RoPE over whole heads); device MoE needs
    /// sparse layers.
    pub fn kernels_for(&self, asked: Kernels) -> Kernels {
        Kernels {
            fused_prologue: asked.fused_prologue
                && self.cfg.family == agentd_runtime::Family::Qwen3,
            single_pass_decode: asked.single_pass_decode,
            device_moe: asked.device_moe
                && self
                    .cfg
                    .moe
                    .as_ref()
                    .is_some_and(|m| crate::moe_plan::device_fits(m, self.cfg.hidden_size).is_ok()),
        }
    }

    pub fn config(&self) -> &Qwen3Config {
        &self.cfg
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Bytes of weights one decode step reads (all but the embedding table,
    /// of which it reads only the batch's rows; a tied head reads it whole).
    pub fn weight_bytes_per_step(&self) -> usize {
        let per_layer: usize = self
            .layers
            .iter()
            .map(|l| {
                let ffn = match &l.ffn {
                    Ffn::Dense { gate_up, down } => gate_up.len() + down.len(),
                    // A token reads the router and its k experts.
                    Ffn::Sparse(m) => {
                        let k = self.cfg.moe.as_ref().map_or(1, |m| m.num_experts_per_tok);
                        let one = m.experts.first().map_or(0, |(gu, d)| gu.len() + d.len());
                        let shared = m.shared.as_ref().map_or(0, |(gu, d)| gu.len() + d.len());
                        m.gate.len() + k * one + shared
                    }
                };
                (l.qkv.len() + l.o.len() + ffn) * 2
            })
            .sum();
        per_layer + self.cfg.vocab_size * self.cfg.hidden_size * 2
    }

    pub fn new_cache(&self, num_blocks: usize, block_size: usize) -> Result<GpuKvCache> {
        GpuKvCache::new(
            &self.gpu,
            KvCacheConfig::for_model(&self.cfg, num_blocks, block_size),
        )
    }
}
