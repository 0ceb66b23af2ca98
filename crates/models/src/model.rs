//! The decoder every family shares: embeddings, a stack of decoder layers
//! (each family's own, [`DecoderLayer`]), a final RMSNorm and the output
//! projection, over a caller-owned paged KV cache.
//!
//! [`Model::load`] reads `config.json`, picks the family from its
//! `model_type` / `architectures` and loads that family's layers: `qwen3`
//! ([`crate::qwen3`]), `glm4` ([`crate::glm4`]), `qwen3_moe`
//! ([`crate::qwen3_moe`]), `glm4_moe` ([`crate::glm4_moe`]). The model keeps
//! no state between calls: every step gets the flattened batch and the cache.

use std::path::Path;

use candle_core::{Device, Tensor};

use crate::attention::tier_copy::BeforeLayer;
use crate::attention::{KvCacheConfig, PagedKvCache};
use crate::batch::BatchInput;
use crate::config::{Family, ModelConfig, WeightDtype};
use crate::error::Result;
use crate::layers::{gather_rows, inv_freq, norm_weight, rms_norm, Linear, RopeBatch};
use crate::loader::{LoadDtype, LoadProgress, Weights};
use crate::self_attn::StepCtx;
use crate::{glm4, glm4_moe, qwen3, qwen3_moe};

/// One decoder layer of some family: updates the residual stream in place.
pub trait DecoderLayer: Send + Sync {
    /// `x`: the residual stream `[T, hidden]`.
    fn forward(&self, x: &mut [f32], ctx: &mut StepCtx<'_>) -> Result<()>;
}

/// A loaded model of any supported family. Immutable after loading; share it
/// across threads.
pub struct Model {
    cfg: ModelConfig,
    embed_tokens: Tensor,
    layers: Vec<Box<dyn DecoderLayer>>,
    norm: Vec<f32>,
    lm_head: Linear,
    inv_freq: Vec<f32>,
    device: Device,
    /// Bytes of weights held (matrices in their in-memory dtype).
    weight_bytes: usize,
    /// How the matrices were loaded (a weight update loads the same way).
    load_dtype: LoadDtype,
}

/// The name the model had while only Qwen3 ran; kept so code written against
/// it still builds.
pub type Qwen3Model = Model;

impl Model {
    /// Loads a Hugging Face directory (`config.json` + safetensors) with
    /// every matrix widened to f32 ([`Model::load_as`] keeps 16-bit ones).
    pub fn load(dir: &Path) -> Result<Self> {
        Self::load_as(dir, LoadDtype::Cast(WeightDtype::F32))
    }

    /// Loads a Hugging Face directory with its weight matrices in `dtype`
    /// ([`LoadDtype::Auto`]: as stored; norms and biases are f32 either way).
    /// bf16/f16 matrices stay 16-bit in memory and the products widen them
    /// exactly: the same logits as the f32 load of the same file.
    pub fn load_as(dir: &Path, dtype: LoadDtype) -> Result<Self> {
        Self::load_with_progress(dir, dtype, |_| None)
    }

    /// [`Model::load_as`], reporting loaded bytes to the hook `progress`
    /// makes from the checkpoint's total bytes.
    pub fn load_with_progress(
        dir: &Path,
        dtype: LoadDtype,
        progress: impl FnOnce(u64) -> Option<LoadProgress>,
    ) -> Result<Self> {
        // A CPU kernel path the CPU lacks is refused here, at start.
        crate::cpu_kernels::selected()?;
        let cfg = ModelConfig::from_dir(dir)?;
        let device = Device::Cpu;
        let weights = Weights::from_dir(dir, &device)?.with_dtype(dtype);
        let hook = progress(weights.file_bytes());
        let weights = weights.with_progress(hook);
        Self::from_weights(cfg, &weights)
    }

    pub fn from_weights(cfg: ModelConfig, w: &Weights) -> Result<Self> {
        let (hid, vocab) = (cfg.hidden_size, cfg.vocab_size);
        let bytes_before = w.loaded_bytes();
        let embed_tokens = w.get_matrix("model.embed_tokens.weight", &[vocab, hid])?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        // Only layers 0..num_hidden_layers: GLM-4.5's MTP layers
        // (`num_nextn_predict_layers`) follow them and are not loaded.
        let n = cfg.num_hidden_layers;
        let started = std::time::Instant::now();
        for i in 0..n {
            // A progress line on stderr (tracing) every ~10% of the layers:
            // a 46-layer checkpoint takes minutes to page in.
            if i > 0 && i % n.div_ceil(10) == 0 {
                tracing::info!(
                    layers = format!("{i}/{n}"),
                    elapsed_s = started.elapsed().as_secs(),
                    "loading weights"
                );
            }
            tracing::debug!(layer = i, family = %cfg.family, "loading decoder layer");
            let p = format!("model.layers.{i}");
            layers.push(match cfg.family {
                Family::Qwen3 => qwen3::load_layer(w, &p, &cfg)?,
                Family::Glm4 => glm4::load_layer(w, &p, &cfg)?,
                Family::Qwen3Moe => qwen3_moe::load_layer(w, &p, i, &cfg)?,
                Family::Glm4Moe => glm4_moe::load_layer(w, &p, i, &cfg)?,
            });
        }
        let norm = norm_weight(w, "model.norm.weight", hid)?;
        // Tied checkpoints may or may not also store lm_head.weight;
        // transformers uses the embeddings either way.
        let lm_head = if cfg.tie_word_embeddings {
            Linear::new(embed_tokens.clone(), None)?
        } else {
            Linear::new(w.get_matrix("lm_head.weight", &[vocab, hid])?, None)?
        };
        let unused = w.unused();
        if !unused.is_empty() {
            // GLM-4.5's MTP layers (`model.layers.{num_hidden_layers}.*`):
            // never read, so never resident.
            tracing::info!(
                tensors = unused.len(),
                first = %unused[0],
                "checkpoint tensors not used by this model, not loaded"
            );
        }
        Ok(Model {
            weight_bytes: w.loaded_bytes().saturating_sub(bytes_before),
            load_dtype: w.matrix_dtype(),
            inv_freq: inv_freq(&cfg),
            device: embed_tokens.device().clone(),
            cfg,
            embed_tokens,
            layers,
            norm,
            lm_head,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn family(&self) -> Family {
        self.cfg.family
    }

    /// Bytes of weights this model holds: matrices in their in-memory dtype
    /// (half the f32 figure for a 16-bit checkpoint loaded as stored), norms
    /// and biases in f32.
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// The dtype the matrices were loaded in (`--dtype`).
    pub fn load_dtype(&self) -> LoadDtype {
        self.load_dtype
    }

    /// A cache with this model's geometry and `num_blocks` blocks.
    pub fn new_cache(&self, num_blocks: usize, block_size: usize) -> Result<PagedKvCache> {
        PagedKvCache::new(KvCacheConfig::for_model(&self.cfg, num_blocks, block_size))
    }

    /// Runs one step: writes the new tokens' K/V into `cache` through the slot
    /// mapping and returns f32 logits `[batch.logits_indices.len(), vocab]`.
    pub fn forward(&self, batch: &BatchInput, cache: &mut PagedKvCache) -> Result<Tensor> {
        self.forward_with(batch, cache, &mut |_, _| Ok(()))
    }

    /// [`Model::forward`], calling `before_layer(l, cache)` before layer
    /// `l` touches the cache: the host tier's copies hand each layer's
    /// storage back there (`attention::tier_copy`).
    pub(crate) fn forward_with(
        &self,
        batch: &BatchInput,
        cache: &mut PagedKvCache,
        before_layer: &mut BeforeLayer<'_>,
    ) -> Result<Tensor> {
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
        let mut x = gather_rows(&self.embed_tokens, &batch.token_ids, hid)?;
        let rope = RopeBatch::new(&self.inv_freq, &batch.positions);
        for (i, layer) in self.layers.iter().enumerate() {
            before_layer(i, cache)?;
            let mut ctx = StepCtx {
                layer: i,
                batch,
                rope: &rope,
                eps,
                cache: &mut *cache,
            };
            layer.forward(&mut x, &mut ctx)?;
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
