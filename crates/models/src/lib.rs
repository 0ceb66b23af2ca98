//! The CPU backend of agentd (docs/design.md §8): model runtimes over a
//! paged KV cache that the caller owns, for Qwen3, GLM-4-0414, Qwen3-MoE
//! and GLM-4.5 MoE, implementing `agentd_runtime`'s contract.
//!
//! - [`model`]: the decoder every family shares, dispatching on the family;
//!   one file per family for its layers: [`qwen3`], [`glm4`], [`qwen3_moe`],
//!   [`glm4_moe`].
//! - Shared blocks: [`self_attn`] (attention), [`mlp`] (SwiGLU), [`moe`] and
//!   [`router`] (mixture of experts), [`layers`] (linear, norms, RoPE).
//! - [`cpu_kernels`]: which vectorised kernel family (AVX-512, AVX2, NEON,
//!   portable) runs, chosen once at start (`AGENTD_CPU_KERNELS` forces one).
//! - [`attention`]: the paged cache and the CPU paged attention kernel.
//! - [`runner`]: [`CpuRunner`], the [`StepRunner`] of one replica, and
//!   [`Model`] as the runtime's [`LoadedModel`].
//! - [`synth`]: deterministic random-weight checkpoints (`agentd make-model`).
//!
//! [`config`], [`batch`], [`logits`], [`error`], [`sampling`],
//! [`tokenizer`] and [`loader`] (memory-mapped safetensors, shared with the
//! CUDA backend) are `agentd_runtime`'s, re-exported here at their old
//! paths; so are [`KvCacheConfig`] and the RoPE tables in [`layers`].

pub mod attention;
pub mod cpu_kernels;
pub mod glm4;
pub mod glm4_moe;
pub mod layers;
mod matmul;
pub mod memory;
pub mod mlp;
pub mod model;
pub mod moe;
#[cfg(target_arch = "aarch64")]
mod neon8;
pub mod qwen3;
pub mod qwen3_moe;
pub mod runner;
pub mod self_attn;
mod simd;
pub mod synth;

// The runtime contract and the model-agnostic parts, at their old paths.
pub use agentd_runtime::{batch, config, error, loader, logits, router, sampling, tokenizer};

pub use attention::{KvCacheConfig, PagedKvCache};
pub use batch::{BatchBuilder, BatchInput, LogitsFor};
pub use config::{Family, GenerationConfig, ModelConfig, Qwen3Config, WeightDtype};
pub use cpu_kernels::KernelPath;
pub use error::{ModelError, Result};
pub use loader::LoadDtype;
pub use logits::Logits;
pub use memory::MemoryTags;
pub use model::{Model, Qwen3Model};
pub use runner::{CpuLoader, CpuRunner, LoadedModel, StepRunner, WeightLoader};
pub use sampling::{
    FinishReason, InvalidSampling, PromptLogprob, SampleOutput, SamplingParams, SequenceSampler,
    TokenControls,
};
pub use tokenizer::{IncrementalDecoder, Tokenizer};
