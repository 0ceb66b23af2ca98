//! The geometry of a paged KV cache ([`KvCacheConfig`]): layers, blocks,
//! block size, KV heads and head dim. Each backend owns its storage (the CPU
//! backend's f32 `PagedKvCache`, the CUDA backend's bf16/f16 device pool)
//! and lays it out from this one geometry.

use crate::config::ModelConfig;

/// Geometry of a paged KV cache: the CPU backend's `PagedKvCache` (f32)
/// and the CUDA backend's `GpuKvCache` (bf16/f16) alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheConfig {
    pub num_layers: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl KvCacheConfig {
    /// The cache geometry a model needs, with the given pool size.
    pub fn for_model(cfg: &ModelConfig, num_blocks: usize, block_size: usize) -> Self {
        KvCacheConfig {
            num_layers: cfg.num_hidden_layers,
            num_blocks,
            block_size,
            num_kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
        }
    }

    /// Elements of K (or of V) in one layer.
    pub fn layer_len(&self) -> usize {
        self.num_blocks * self.block_len()
    }

    /// Elements of K (or of V) of one block in one layer.
    pub fn block_len(&self) -> usize {
        self.num_kv_heads * self.block_size * self.head_dim
    }

    /// Bytes of one block across all layers, K and V, at f32 (the CPU
    /// cache's element; the CUDA pool's 16-bit one is half of it).
    pub fn bytes_per_block(&self) -> usize {
        2 * self.num_layers
            * self.num_kv_heads
            * self.block_size
            * self.head_dim
            * std::mem::size_of::<f32>()
    }
}
