//! The CUDA backend of agentd (docs/design.md §8): the kernels in `kernels/`
//! (paged decode and prefill attention, cache write and block copy, fused
//! RMSNorm + residual, per-head RMSNorm + neox RoPE, SiLU·mul, GLM-4's bias,
//! row norms and interleaved RoPE, the sampler, the single-pass decode
//! attention, MoE routing and grouped GEMM), cuBLAS for the dense layers,
//! and the four families (Qwen3, Qwen3-MoE, GLM-4, GLM-4.5) on the GPU over a caller-owned paged KV cache with
//! the same [`agentd_runtime::BatchInput`] as the CPU runtime.
//!
//! - [`decode_ref`]: the single-pass decode kernel's algorithm on the host
//!   (`--single-pass-decode`), tested against a plain softmax.
//! - [`graph_plan`]: which decode steps replay a CUDA graph, their bucket
//!   and padded metadata. Pure, always built, tested in CI.
//! - [`moe_plan`]: MoE routing grouped per expert (the host-routed path),
//!   and the device path's bounds and block layout. Pure, always built,
//!   tested in CI.
//! - [`plan`]: host-side launch planning (split-K partitions, prefill tiles,
//!   RoPE tables, shape limits). Pure, always built, tested in CI.
//! - [`sampling`]: the device sampler's packed plans and output words
//!   (`kernels/sample.cu`). Pure, always built, tested in CI.
//! - [`stage`]: weight matrices read from the mapped checkpoint in the
//!   device dtype (bf16 stays bf16: no f32 stage). Always built, tested in CI.
//! - `device` (feature `cuda`): context, stream, embedded kernels, cuBLAS.
//! - `ops` (feature `cuda`): one typed wrapper per kernel.
//! - `model`, `forward` (feature `cuda`): [`GpuModel`] and [`GpuKvCache`].
//! - `runner` (feature `cuda`): [`GpuRunner`], the engine's `StepRunner`.
//! - [`tier_plan`]: the GPU host tier's copy schedule (runs, offsets,
//!   bytes). Pure, always built, tested in CI; `tier` (feature `cuda`)
//!   issues it on a copy stream.
//!
//! The library depends on `agentd-runtime` alone (its loader, KV geometry and
//! RoPE tables are the CPU backend's too); the checker binary
//! `agentd-gpu-check` (feature `gpu-check` = `cuda` + `agentd-models`) adds
//! the CPU backend as the reference it compares against.
//!
//! Without the `cuda` feature nothing here needs a CUDA toolkit or a GPU.
//! With it, the driver and cuBLAS are loaded at run time (cudarc's dynamic
//! loading), so a binary built on a machine without a GPU runs on one with it.

pub mod decode_ref;
pub mod error;
pub mod graph_plan;
pub mod moe_plan;
pub mod plan;
pub mod sampling;
pub mod stage;
pub mod tier_plan;

#[cfg(feature = "cuda")]
mod attn_ops;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod draw;
#[cfg(feature = "cuda")]
mod forward;
#[cfg(feature = "cuda")]
mod graph;
#[cfg(all(test, feature = "cuda"))]
mod launch_sig;
#[cfg(feature = "cuda")]
mod load;
#[cfg(feature = "cuda")]
mod model;
#[cfg(feature = "cuda")]
mod moe;
#[cfg(feature = "cuda")]
mod moe_device;
#[cfg(feature = "cuda")]
mod ops;
#[cfg(feature = "cuda")]
mod runner;
#[cfg(feature = "cuda")]
mod tier;
#[cfg(feature = "cuda")]
mod weights;

#[cfg(feature = "cuda")]
pub use attn_ops::{AttnIo, DecodeScratch};
#[cfg(feature = "cuda")]
pub use device::{Buf, Gpu};
#[cfg(feature = "cuda")]
pub use forward::{DeviceLogits, StepOpts};
#[cfg(feature = "cuda")]
pub use graph::{DecodeGraphs, GraphLogits};
#[cfg(feature = "cuda")]
pub use model::{GpuKvCache, GpuModel};
#[cfg(feature = "cuda")]
pub use moe_device::RoutedDownload;
#[cfg(feature = "cuda")]
pub use runner::GpuRunner;
#[cfg(feature = "cuda")]
pub use tier::GpuHostTier;
#[cfg(feature = "cuda")]
pub use weights::{GpuLoader, GpuWeights};

pub use error::{CudaError, Result};
pub use plan::{DecodeKernel, Dtype, Kernels};
