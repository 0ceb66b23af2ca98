//! Attention over a caller-owned paged KV cache.
//!
//! - [`cache`]: the cache storage ([`PagedKvCache`]) and the slot-mapped write.
//! - [`cpu`]: the CPU paged attention kernel (causal, GQA, any block size).

pub mod cache;
pub mod cpu;

pub use cache::{KvCacheConfig, PagedKvCache};
pub use cpu::{paged_attention, AttentionShape};
