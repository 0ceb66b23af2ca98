//! `agentd serve --kv-events-config JSON`: vLLM's KV-event publishing, one
//! ZMQ publisher per replica (its data-parallel rank, port + rank).

use std::sync::Arc;

use agentd_engine::KvEventSink;
use agentd_kvevents::{KvEventsConfig, Publisher};
use anyhow::{Context, Result};

/// The engine's sink for `--kv-events-config`, or `None` when events are off.
/// The publishers live as long as the sink (the engine).
pub fn sink(json: Option<&str>, replicas: usize, block_size: usize) -> Result<Option<KvEventSink>> {
    let Some(json) = json else { return Ok(None) };
    let cfg = KvEventsConfig::from_json(json)?;
    if !cfg.enabled() {
        return Ok(None);
    }
    let publishers = (0..replicas)
        .map(|r| Publisher::start(&cfg, r, block_size).with_context(|| format!("replica {r}")))
        .collect::<Result<Vec<_>>>()?;
    for (r, p) in publishers.iter().enumerate() {
        tracing::info!(
            replica = r,
            endpoint = p.endpoint(),
            replay = p.replay_endpoint().unwrap_or("-"),
            topic = %cfg.topic,
            "publishing KV events"
        );
    }
    let publishers = Arc::new(publishers);
    Ok(Some(KvEventSink::new(move |r, events| {
        if let Some(p) = publishers.get(r) {
            p.publish(events);
        }
    })))
}
