//! Model runtimes for agentd (DESIGN.md §5): Qwen3 dense on candle CPU over a
//! paged KV cache that the caller owns.
//!
//! - [`config`]: `config.json`; [`loader`]: memory-mapped safetensors.
//! - [`qwen3`]: the model; [`layers`]: its dense building blocks.
//! - [`batch`]: the flattened batch metadata; [`attention`]: the paged cache
//!   and the CPU paged attention kernel.
//! - [`runner`]: [`StepRunner`], a model bound to one replica's cache (what
//!   the engine runs each step), and its CPU implementation.
//! - [`sampling`]: next-token selection and logprobs; [`tokenizer`]:
//!   tokenizer and streaming detokenizer.
//! - [`synth`]: deterministic random-weight checkpoints (`agentd make-model`).

pub mod attention;
pub mod batch;
pub mod config;
pub mod error;
#[cfg(feature = "hub")]
pub mod hub;
pub mod layers;
pub mod loader;
mod matmul;
pub mod qwen3;
pub mod runner;
pub mod sampling;
mod simd;
pub mod synth;
pub mod tokenizer;

pub use attention::{KvCacheConfig, PagedKvCache};
pub use batch::{BatchBuilder, BatchInput, LogitsFor};
pub use config::Qwen3Config;
pub use error::{ModelError, Result};
pub use qwen3::Qwen3Model;
pub use runner::{CpuRunner, StepRunner};
pub use sampling::{SampleOutput, SamplingParams, SequenceSampler};
pub use tokenizer::{IncrementalDecoder, Tokenizer};
