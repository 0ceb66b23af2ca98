//! Qwen3 dense decoder (`Qwen3ForCausalLM`) over a caller-owned paged KV cache.
//!
//! Structure follows candle-transformers' `qwen3.rs` and transformers'
//! `modeling_qwen3.py`: pre-norm decoder layers of grouped-query attention
//! (with RMSNorm on each query and key head before RoPE) and a SwiGLU MLP,
//! a final RMSNorm, and an output projection tied to the embeddings or not.
//! Unlike those, the model keeps no state between calls: every step gets the
//! flattened batch and the cache to read and write.

use std::path::Path;

use candle_core::{Device, Tensor};

use crate::attention::{paged_attention, AttentionShape, KvCacheConfig, PagedKvCache};
use crate::batch::BatchInput;
use crate::config::Qwen3Config;
use crate::error::Result;
use crate::layers::{
    add_in_place, head_norm_rope, inv_freq, rms_norm, silu_mul_in_place, to_f32_vec, with_f32,
    Linear, RopeBatch,
};
use crate::loader::Weights;

struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

struct DecoderLayer {
    input_layernorm: Vec<f32>,
    self_attn: Attention,
    post_attention_layernorm: Vec<f32>,
    mlp: Mlp,
}

/// A loaded Qwen3 model. Immutable after loading; share it across threads.
pub struct Qwen3Model {
    cfg: Qwen3Config,
    embed_tokens: Tensor,
    layers: Vec<DecoderLayer>,
    norm: Vec<f32>,
    lm_head: Linear,
    inv_freq: Vec<f32>,
    device: Device,
}

fn linear(w: &Weights, name: &str, out: usize, inp: usize, bias: bool) -> Result<Linear> {
    let weight = w.get(&format!("{name}.weight"), &[out, inp])?;
    let bias = if bias {
        Some(w.get(&format!("{name}.bias"), &[out])?)
    } else {
        None
    };
    Linear::new(weight, bias)
}

impl Attention {
    fn load(w: &Weights, p: &str, cfg: &Qwen3Config) -> Result<Self> {
        let (h, kv, d, hid) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.hidden_size,
        );
        let b = cfg.attention_bias;
        Ok(Attention {
            q_proj: linear(w, &format!("{p}.q_proj"), h * d, hid, b)?,
            k_proj: linear(w, &format!("{p}.k_proj"), kv * d, hid, b)?,
            v_proj: linear(w, &format!("{p}.v_proj"), kv * d, hid, b)?,
            o_proj: linear(w, &format!("{p}.o_proj"), hid, h * d, false)?,
            q_norm: to_f32_vec(&w.get(&format!("{p}.q_norm.weight"), &[d])?)?,
            k_norm: to_f32_vec(&w.get(&format!("{p}.k_norm.weight"), &[d])?)?,
            num_heads: h,
            num_kv_heads: kv,
            head_dim: d,
        })
    }

    /// `x`: normed hidden states `[T, hidden]` → attention output `[T, hidden]`.
    fn forward(
        &self,
        x: &[f32],
        layer: usize,
        batch: &BatchInput,
        rope: &RopeBatch,
        eps: f32,
        cache: &mut PagedKvCache,
    ) -> Result<Vec<f32>> {
        let t = batch.num_tokens();
        let (h, kv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let mut q = self.q_proj.forward(x)?;
        let mut k = self.k_proj.forward(x)?;
        let v = self.v_proj.forward(x)?;
        head_norm_rope(&mut q, h, d, &self.q_norm, eps, rope);
        head_norm_rope(&mut k, kv, d, &self.k_norm, eps, rope);
        // New K/V go into the cache first, so the kernel reads a sequence's
        // whole context (cached prefix and new tokens) from one place.
        cache.write(layer, &batch.slot_mapping, &k, &v);
        let shape = AttentionShape {
            num_heads: h,
            num_kv_heads: kv,
            head_dim: d,
            block_size: cache.block_size(),
        };
        let mut out = vec![0f32; t * h * d];
        let scale = 1.0 / (d as f32).sqrt();
        paged_attention(&q, cache.layer(layer), batch, shape, scale, &mut out);
        self.o_proj.forward(&out)
    }
}

impl Mlp {
    fn load(w: &Weights, p: &str, cfg: &Qwen3Config) -> Result<Self> {
        let (hid, inter) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(Mlp {
            gate_proj: linear(w, &format!("{p}.gate_proj"), inter, hid, false)?,
            up_proj: linear(w, &format!("{p}.up_proj"), inter, hid, false)?,
            down_proj: linear(w, &format!("{p}.down_proj"), hid, inter, false)?,
        })
    }

    fn forward(&self, x: &[f32]) -> Result<Vec<f32>> {
        let mut gate = self.gate_proj.forward(x)?;
        let up = self.up_proj.forward(x)?;
        silu_mul_in_place(&mut gate, &up);
        self.down_proj.forward(&gate)
    }
}

impl Qwen3Model {
    /// Loads a Hugging Face directory (`config.json` + safetensors).
    pub fn load(dir: &Path) -> Result<Self> {
        let cfg = Qwen3Config::from_dir(dir)?;
        let device = Device::Cpu;
        let weights = Weights::from_dir(dir, &device)?;
        Self::from_weights(cfg, &weights)
    }

    pub fn from_weights(cfg: Qwen3Config, w: &Weights) -> Result<Self> {
        let (hid, vocab) = (cfg.hidden_size, cfg.vocab_size);
        let embed_tokens = w.get("model.embed_tokens.weight", &[vocab, hid])?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            tracing::debug!(layer = i, "loading decoder layer");
            layers.push(DecoderLayer {
                input_layernorm: to_f32_vec(
                    &w.get(&format!("{p}.input_layernorm.weight"), &[hid])?,
                )?,
                self_attn: Attention::load(w, &format!("{p}.self_attn"), &cfg)?,
                post_attention_layernorm: to_f32_vec(
                    &w.get(&format!("{p}.post_attention_layernorm.weight"), &[hid])?,
                )?,
                mlp: Mlp::load(w, &format!("{p}.mlp"), &cfg)?,
            });
        }
        let norm = to_f32_vec(&w.get("model.norm.weight", &[hid])?)?;
        // Tied checkpoints may or may not also store lm_head.weight;
        // transformers uses the embeddings either way.
        let lm_head = if cfg.tie_word_embeddings {
            Linear::new(embed_tokens.clone(), None)?
        } else {
            Linear::new(w.get("lm_head.weight", &[vocab, hid])?, None)?
        };
        Ok(Qwen3Model {
            inv_freq: inv_freq(&cfg),
            device: embed_tokens.device().clone(),
            cfg,
            embed_tokens,
            layers,
            norm,
            lm_head,
        })
    }

    pub fn config(&self) -> &Qwen3Config {
        &self.cfg
    }

    /// A cache with this model's geometry and `num_blocks` blocks.
    pub fn new_cache(&self, num_blocks: usize, block_size: usize) -> Result<PagedKvCache> {
        PagedKvCache::new(KvCacheConfig::for_model(&self.cfg, num_blocks, block_size))
    }

    /// Runs one step: writes the new tokens' K/V into `cache` through the slot
    /// mapping and returns f32 logits `[batch.logits_indices.len(), vocab]`.
    pub fn forward(&self, batch: &BatchInput, cache: &mut PagedKvCache) -> Result<Tensor> {
        cache.check_model(&self.cfg)?;
        batch.validate(
            cache.block_size(),
            cache.num_blocks(),
            self.cfg.max_position_embeddings,
            self.cfg.vocab_size,
        )?;
        let eps = self.cfg.rms_norm_eps as f32;
        let hid = self.cfg.hidden_size;
        // Hidden states `[T, hidden]`, starting from the embedding rows.
        let mut x = with_f32(&self.embed_tokens, |e| {
            let mut x = Vec::with_capacity(batch.num_tokens() * hid);
            for &id in &batch.token_ids {
                let id = id as usize;
                x.extend_from_slice(&e[id * hid..(id + 1) * hid]);
            }
            x
        })?;
        let rope = RopeBatch::new(&self.inv_freq, &batch.positions);
        for (i, layer) in self.layers.iter().enumerate() {
            let h = rms_norm(&x, &layer.input_layernorm, eps);
            let a = layer.self_attn.forward(&h, i, batch, &rope, eps, cache)?;
            add_in_place(&mut x, &a);
            let h = rms_norm(&x, &layer.post_attention_layernorm, eps);
            add_in_place(&mut x, &layer.mlp.forward(&h)?);
        }
        // Only the rows that need logits go through the norm and the (large)
        // output projection.
        let mut last = Vec::with_capacity(batch.logits_indices.len() * hid);
        for &i in &batch.logits_indices {
            last.extend_from_slice(&x[i * hid..(i + 1) * hid]);
        }
        let n = batch.logits_indices.len();
        let logits = if n == 0 {
            Vec::new()
        } else {
            self.lm_head.forward(&rms_norm(&last, &self.norm, eps))?
        };
        Ok(Tensor::from_vec(
            logits,
            (n, self.cfg.vocab_size),
            &self.device,
        )?)
    }
}
