//! KV cache events for KV-aware routers (NVIDIA Dynamo's, or any vLLM-event
//! subscriber): the allocator's transitions ([`agentd_kv::KvEvent`]) encoded
//! in vLLM's wire format ([`wire`]) and published over ZMQ, one PUB socket per
//! replica publishing as its data-parallel rank ([`Publisher`]), configured
//! by vLLM's `--kv-events-config` JSON ([`KvEventsConfig`]).

mod config;
mod error;
mod publisher;
pub mod wire;

pub use config::{endpoint_for_rank, KvEventsConfig};
pub use error::Error;
pub use publisher::Publisher;
