//! Attention over a caller-owned paged KV cache.
//!
//! - [`cache`]: the cache storage ([`PagedKvCache`]) and the slot-mapped write.
//! - [`cpu`]: the CPU paged attention kernel (causal, GQA, any block size),
//!   with an AVX-512 form (`avx512.rs`) for head dims that are multiples of
//!   16 and an AVX2+FMA form (`avx2.rs`) for multiples of 8, chosen by the
//!   [`crate::cpu_kernels`] path.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod cache;
pub mod cpu;

pub use cache::{KvCacheConfig, PagedKvCache};
pub use cpu::{paged_attention, paged_attention_on, AttentionShape};
