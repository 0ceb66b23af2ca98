//! Attention over a caller-owned paged KV cache.
//!
//! - [`cache`]: the cache storage ([`PagedKvCache`]) and the slot-mapped write.
//! - `tier_copy`: the host tier's copies, carried out layer by layer beside
//!   the forward.
//! - [`cpu`]: the CPU paged attention kernel (causal, GQA, any block size),
//!   with an AVX-512 form (`avx512.rs`) for head dims that are multiples of
//!   16, an AVX2+FMA form (`avx2.rs`) and an aarch64 NEON form (`neon.rs`,
//!   the AVX2 one on pairs of 4-lane vectors) for multiples of 8, chosen by
//!   the [`crate::cpu_kernels`] path.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod cache;
pub mod cpu;
#[cfg(target_arch = "aarch64")]
mod neon;
pub(crate) mod tier_copy;

pub use cache::{KvCacheConfig, PagedKvCache};
pub use cpu::{paged_attention, paged_attention_on, AttentionShape};
