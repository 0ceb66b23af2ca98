//! The runtime contract of agentd (docs/design.md §8): what every backend
//! implements and what the engine and the server drive, with no kernels in
//! it. `agentd-models` (the CPU families) and `agentd-cuda` implement it;
//! the engine and the server depend on this crate only, and the binary
//! wires a concrete backend in.
//!
//! - [`runner`]: [`StepRunner`] (one replica's model and cache, run step by
//!   step), [`LoadedModel`] (a backend's weights) and [`WeightLoader`].
//! - [`batch`]: the flattened batch one step runs on; [`logits`]: the
//!   step's logits rows, lent to the sampler without a copy.
//! - [`config`]: the model's `config.json` and `generation_config.json`.
//! - [`sampling`]: one sequence's sampler ([`SequenceSampler`]: token
//!   controls, penalties, top-k/p, min-p, seeded draws, stop conditions,
//!   logprobs) and the structured-output grammars (JSON schema, Lark, tool
//!   calls in the chat formats `agentd-chat` parses) it enforces.
//! - [`tokenizer`]: tokenizer and streaming detokenizer.
//! - [`memory`]: the memory regions a runner releases and resumes.
//! - [`kv_cache`]: the paged KV cache's geometry ([`KvCacheConfig`]), which
//!   each backend's cache storage is laid out from.
//! - [`router`]: MoE routing (one token's experts and weights from its
//!   router logits), shared by the CPU and CUDA backends.
//! - [`rope`]: RoPE's inverse frequencies, per-batch cos/sin rows and pair
//!   styles, the same on every backend.
//! - `loader` (feature `candle`): the memory-mapped safetensors checkpoint
//!   (`Weights`) both backends load from.
//! - [`error`]: the one error type of every backend.
//!
//! [`BlockCopy`] (a copy between the KV tiers a runner carries out) is
//! `agentd_kv`'s, re-exported here.

pub mod batch;
pub mod config;
pub mod cpu;
pub mod error;
pub mod kv_cache;
#[cfg(feature = "candle")]
pub mod loader;
pub mod logits;
pub mod memory;
pub mod rope;
pub mod router;
pub mod runner;
pub mod sampling;
pub mod tokenizer;

pub use agentd_kv::{BlockCopy, BlockId};
pub use batch::{BatchBuilder, BatchInput, LogitsFor};
pub use config::{Family, GenerationConfig, ModelConfig, Qwen3Config, WeightDtype};
pub use error::{ModelError, Result};
pub use kv_cache::KvCacheConfig;
#[cfg(feature = "candle")]
pub use loader::LoadDtype;
pub use logits::Logits;
pub use memory::MemoryTags;
pub use runner::{LoadedModel, StepRunner, WeightLoader};
pub use sampling::{
    FinishReason, InvalidSampling, PromptLogprob, SampleOutput, SamplingParams, SequenceSampler,
    TokenControls,
};
pub use tokenizer::{IncrementalDecoder, Tokenizer};
