//! HTTP handlers, one module per API area.

pub mod chat;
pub mod completions;
pub mod info;
pub mod programs;
pub mod responses;
pub mod sglang;
pub mod tokenize;
pub mod tools;
pub mod vllm_dev;
pub mod vllm_rpc;
pub mod vllm_tokens;
pub mod vllm_weights;
