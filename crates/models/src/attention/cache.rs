//! The paged KV cache, owned by the caller (the engine), never by the model.
//!
//! Storage is one plain `Vec<f32>` per layer for K and one for V. V is shaped
//! `[num_blocks, num_kv_heads, block_size, head_dim]`; K is transposed inside
//! each block, `[num_blocks, num_kv_heads, head_dim, block_size]`, because the
//! kernels compute scores for 16 keys per vector: one head-dim component of
//! consecutive keys is then one contiguous load, with no per-step transpose
//! (which, done in the kernel, halved batch-1 decode at 2k context). Why plain vectors and not
//! candle tensors: candle tensors are immutable values, so writing one token's
//! K/V in place would mean rebuilding (copying) the cache or unsafe aliasing;
//! the CPU attention kernel wants raw slices anyway. Why head-major inside a
//! block: the kernel works on one (sequence, KV head) at a time, so each block
//! it visits is one contiguous `block_size * head_dim` run of keys and of
//! values, read straight through. f32 because the CPU runtime computes in f32
//! (bf16 is slower on these CPUs; ENVIRONMENT.md).
//!
//! Block ids come from the caller's allocator (`agentd-kv`); this type only
//! knows how many blocks there are. `vec![0.0; n]` maps zero pages lazily, so
//! an oversized pool costs address space, not memory, until blocks are used
//! (in 2 MiB steps: the storage asks for huge pages, `memory.rs`).

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

// The geometry is the runtime's (the CUDA backend's cache has the same
// one), at its old path here.
pub use agentd_runtime::KvCacheConfig;

/// K and V of one layer.
#[derive(Debug, Clone, Default)]
pub struct LayerKv {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// A paged KV cache: per layer, K and V blocks addressed by block id.
#[derive(Debug, Clone)]
pub struct PagedKvCache {
    cfg: KvCacheConfig,
    layers: Vec<LayerKv>,
}

impl PagedKvCache {
    pub fn new(cfg: KvCacheConfig) -> Result<Self> {
        if cfg.block_size == 0 || cfg.num_blocks == 0 || cfg.head_dim == 0 {
            return Err(ModelError::CacheMismatch(format!(
                "block_size, num_blocks and head_dim must be positive: {cfg:?}"
            )));
        }
        let n = cfg.layer_len();
        let layers = (0..cfg.num_layers)
            .map(|_| {
                let mut kv = LayerKv {
                    k: vec![0.0; n],
                    v: vec![0.0; n],
                };
                crate::memory::advise_huge_pages(&mut kv.k);
                crate::memory::advise_huge_pages(&mut kv.v);
                kv
            })
            .collect();
        Ok(PagedKvCache { cfg, layers })
    }

    pub fn config(&self) -> &KvCacheConfig {
        &self.cfg
    }

    pub fn block_size(&self) -> usize {
        self.cfg.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.cfg.num_blocks
    }

    pub fn layer(&self, layer: usize) -> &LayerKv {
        &self.layers[layer]
    }

    /// Moves every layer's storage out (each slot left empty, the count
    /// kept): [`crate::attention::tier_copy`] hands them to its copy thread
    /// and back one layer at a time with [`PagedKvCache::put_layer`].
    pub(crate) fn take_layers(&mut self) -> Vec<LayerKv> {
        self.layers.iter_mut().map(std::mem::take).collect()
    }

    /// Puts layer `layer`'s storage back (ignored past the last layer).
    pub(crate) fn put_layer(&mut self, layer: usize, kv: LayerKv) {
        if let Some(slot) = self.layers.get_mut(layer) {
            *slot = kv;
        }
    }

    pub(crate) fn layers_mut(&mut self) -> &mut [LayerKv] {
        &mut self.layers
    }

    /// Frees the K and V storage, keeping the geometry: the pool's memory
    /// goes back to the system (`memory::trim_heap` after the drop) until
    /// [`PagedKvCache::restore`]. The runner refuses steps meanwhile.
    pub fn release(&mut self) {
        self.layers = Vec::new();
    }

    /// Whether [`PagedKvCache::release`] freed the storage.
    pub fn is_released(&self) -> bool {
        self.layers.len() != self.cfg.num_layers
    }

    /// Allocates the storage of a released cache again, zeroed (mapped
    /// lazily: memory is taken as blocks are written, as at start).
    pub fn restore(&mut self) -> Result<()> {
        if self.is_released() {
            *self = Self::new(self.cfg)?;
        }
        Ok(())
    }

    /// Checks that this cache was made for `model`'s geometry.
    pub fn check_model(&self, model: &ModelConfig) -> Result<()> {
        let c = &self.cfg;
        if c.num_layers != model.num_hidden_layers
            || c.num_kv_heads != model.num_key_value_heads
            || c.head_dim != model.head_dim
        {
            return Err(ModelError::CacheMismatch(format!(
                "cache has {} layers x {} KV heads x head_dim {}, model needs {} x {} x {}",
                c.num_layers,
                c.num_kv_heads,
                c.head_dim,
                model.num_hidden_layers,
                model.num_key_value_heads,
                model.head_dim
            )));
        }
        Ok(())
    }

    /// Writes the K and V of new tokens (`[T, num_kv_heads * head_dim]` each)
    /// into their slots (`block_id * block_size + offset`). Slots must be in
    /// range (the batch is validated before the forward pass).
    pub fn write(&mut self, layer: usize, slots: &[usize], k: &[f32], v: &[f32]) {
        let c = self.cfg;
        let row = c.num_kv_heads * c.head_dim;
        let lkv = &mut self.layers[layer];
        for (t, &slot) in slots.iter().enumerate() {
            let (block, off) = (slot / c.block_size, slot % c.block_size);
            for h in 0..c.num_kv_heads {
                let head = (block * c.num_kv_heads + h) * c.block_size * c.head_dim;
                let src = t * row + h * c.head_dim;
                let dst = head + off * c.head_dim;
                lkv.v[dst..dst + c.head_dim].copy_from_slice(&v[src..src + c.head_dim]);
                for (i, x) in k[src..src + c.head_dim].iter().enumerate() {
                    lkv.k[head + i * c.block_size + off] = *x;
                }
            }
        }
    }

    /// A cache of the same geometry with `num_blocks` blocks: the host
    /// tier's slots (the engine's `--kv-offloading-size`), which the tier
    /// copies (`attention::tier_copy`) fill and read back.
    pub fn with_blocks(&self, num_blocks: usize) -> Result<Self> {
        Self::new(KvCacheConfig {
            num_blocks,
            ..self.cfg
        })
    }

    /// Where block `b` starts in each layer's K (and V) vector.
    pub(crate) fn block_start(&self, b: u32) -> Result<usize> {
        let n = self.cfg.num_blocks;
        if b as usize >= n {
            return Err(ModelError::CacheMismatch(format!(
                "block id {b} >= cache size {n}"
            )));
        }
        Ok(b as usize * self.cfg.block_len())
    }

    /// Copies block `src` onto block `dst` in every layer (copy-on-write of a
    /// shared tail block by the allocator).
    pub fn copy_block(&mut self, src: u32, dst: u32) -> Result<()> {
        let (s, d, n) = (
            self.block_start(src)?,
            self.block_start(dst)?,
            self.cfg.block_len(),
        );
        for l in &mut self.layers {
            l.k.copy_within(s..s + n, d);
            l.v.copy_within(s..s + n, d);
        }
        Ok(())
    }
}
