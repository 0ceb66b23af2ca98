//! Hand-off of the allocator's KV events ([`agentd_kv::KvEvent`]) to a
//! publisher: each replica's cache records them only when a sink is
//! configured, and the worker drains them once per step, after `commit`, so a
//! sink sees one batch per step that changed the prefix cache (vLLM's unit).
//! The sink runs under the engine lock: it must only queue (the ZMQ publisher
//! does a non-blocking channel send).

use std::fmt;
use std::sync::Arc;

use agentd_kv::KvEvent;

use crate::core::Core;

type SinkFn = dyn Fn(usize, Vec<KvEvent>) + Send + Sync;

/// Receives `(replica, events of one step)`; must not block.
#[derive(Clone)]
pub struct KvEventSink(Arc<SinkFn>);

impl KvEventSink {
    pub fn new(f: impl Fn(usize, Vec<KvEvent>) + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }
}

impl fmt::Debug for KvEventSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KvEventSink")
    }
}

impl Core {
    /// Starts recording on every replica's (still empty) cache when a sink is set.
    pub(crate) fn enable_kv_events(&mut self) {
        if self.cfg.kv_events.is_some() {
            self.replicas.enable_kv_events();
        }
    }

    /// Hands replica `r`'s events since the last step to the sink.
    pub(crate) fn flush_kv_events(&mut self, r: usize) {
        let Some(sink) = &self.cfg.kv_events else {
            return;
        };
        let events = self.replicas.drain_kv_events(r);
        if !events.is_empty() {
            (sink.0)(r, events);
        }
    }
}
