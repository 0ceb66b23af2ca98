//! Model runtimes for agentd (docs/design.md §8) on the CPU over a paged KV cache
//! that the caller owns: Qwen3, GLM-4-0414, Qwen3-MoE and GLM-4.5 MoE.
//!
//! - [`config`]: `config.json` (the [`config::Family`]); [`loader`]:
//!   memory-mapped safetensors.
//! - [`model`]: the decoder every family shares, dispatching on the family;
//!   one file per family for its layers: [`qwen3`], [`glm4`], [`qwen3_moe`],
//!   [`glm4_moe`].
//! - Shared blocks: [`self_attn`] (attention), [`mlp`] (SwiGLU), [`moe`] and
//!   [`router`] (mixture of experts), [`layers`] (linear, norms, RoPE).
//! - [`cpu_kernels`]: which vectorised kernel family (AVX-512, AVX2, NEON,
//!   portable) runs, chosen once at start (`AGENTD_CPU_KERNELS` forces one).
//! - [`batch`]: the flattened batch metadata; [`attention`]: the paged cache
//!   and the CPU paged attention kernel.
//! - [`runner`]: [`StepRunner`], a model bound to one replica's cache (what
//!   the engine runs each step), and its CPU implementation.
//! - [`sampling`]: next-token selection and logprobs; [`tokenizer`]:
//!   tokenizer and streaming detokenizer.
//! - [`synth`]: deterministic random-weight checkpoints (`agentd make-model`).

pub mod attention;
pub mod cpu_kernels;
pub mod glm4;
pub mod glm4_moe;
pub mod layers;
pub mod loader;
mod matmul;
pub mod memory;
pub mod mlp;
pub mod model;
pub mod moe;
#[cfg(target_arch = "aarch64")]
mod neon8;
pub mod qwen3;
pub mod qwen3_moe;
pub mod router;
pub mod runner;
pub mod self_attn;
mod simd;
pub mod synth;

// The runtime contract and the model-agnostic parts, at their old paths.
pub use agentd_runtime::{batch, config, error, logits, sampling, tokenizer};

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
