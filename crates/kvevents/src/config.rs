//! `--kv-events-config`: vLLM's `KVEventsConfig` JSON, same fields and defaults.

use serde::Deserialize;

use crate::Error;

/// vLLM's `KVEventsConfig`. Unknown fields are refused so a typo does not
/// silently leave events off.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvEventsConfig {
    pub enable_kv_cache_events: bool,
    /// `"zmq"` or `"null"`; vLLM's default is `"zmq"` when enabled, else `"null"`.
    pub publisher: Option<String>,
    /// PUB address: wildcard (`tcp://*:5557`) binds, a host address connects
    /// (vLLM's rule). Replica *r* uses the port plus *r*.
    pub endpoint: String,
    /// ROUTER address answering replay requests (port plus *r* as well).
    pub replay_endpoint: Option<String>,
    /// Batches kept for replay, per replica.
    pub buffer_steps: usize,
    /// Accepted for compatibility; the PUB socket drops for slow subscribers on its own.
    pub hwm: usize,
    /// Batches queued between the engine and the publisher thread before new
    /// ones are dropped (counted in the logs) rather than stalling a step.
    pub max_queue_size: usize,
    pub topic: String,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        Self {
            enable_kv_cache_events: false,
            publisher: None,
            endpoint: "tcp://*:5557".into(),
            replay_endpoint: None,
            buffer_steps: 10_000,
            hwm: 100_000,
            max_queue_size: 100_000,
            topic: String::new(),
        }
    }
}

impl KvEventsConfig {
    pub fn from_json(s: &str) -> Result<Self, Error> {
        let cfg: Self = serde_json::from_str(s).map_err(|e| Error::Config(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Whether a publisher runs at all.
    pub fn enabled(&self) -> bool {
        self.enable_kv_cache_events && self.publisher.as_deref().unwrap_or("zmq") == "zmq"
    }

    fn validate(&self) -> Result<(), Error> {
        match self.publisher.as_deref() {
            None | Some("zmq") | Some("null") => {}
            Some(other) => {
                return Err(Error::Config(format!(
                    "unknown publisher {other:?} (\"zmq\" or \"null\")"
                )))
            }
        }
        if self.enabled() {
            if self.buffer_steps == 0 || self.max_queue_size == 0 {
                return Err(Error::Config(
                    "buffer_steps and max_queue_size must be positive".into(),
                ));
            }
            endpoint_for_rank(&self.endpoint, 0)?;
            if let Some(r) = &self.replay_endpoint {
                endpoint_for_rank(r, 0)?;
            }
        }
        Ok(())
    }
}

/// vLLM's `offset_endpoint_port`: replica *r* publishes on the port plus *r*
/// (port 0 stays 0: the OS picks). Only `tcp://` is supported here.
pub fn endpoint_for_rank(endpoint: &str, rank: usize) -> Result<String, Error> {
    let bad = || Error::Config(format!("endpoint {endpoint:?} is not tcp://HOST:PORT"));
    let rest = endpoint.strip_prefix("tcp://").ok_or_else(bad)?;
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    if host.is_empty() {
        return Err(bad());
    }
    let port = if port == 0 {
        0
    } else {
        u16::try_from(usize::from(port) + rank).map_err(|_| bad())?
    };
    Ok(format!("tcp://{host}:{port}"))
}

/// vLLM binds wildcard endpoints and connects to the others.
pub fn is_bind(endpoint: &str) -> bool {
    endpoint.contains('*') || endpoint.contains("::")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_fields_and_defaults() {
        let c = KvEventsConfig::from_json(
            r#"{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:6000","topic":"kv","replay_endpoint":"tcp://*:6100","buffer_steps":8}"#,
        )
        .unwrap();
        assert!(c.enabled());
        assert_eq!(c.buffer_steps, 8);
        assert_eq!(c.hwm, 100_000);
        assert!(!KvEventsConfig::from_json("{}").unwrap().enabled());
        assert!(!KvEventsConfig::from_json(
            r#"{"enable_kv_cache_events":true,"publisher":"null"}"#
        )
        .unwrap()
        .enabled());
        assert!(KvEventsConfig::from_json(r#"{"enable_kv_cache_event":true}"#).is_err());
        assert!(
            KvEventsConfig::from_json(r#"{"enable_kv_cache_events":true,"publisher":"nats"}"#)
                .is_err()
        );
        assert!(KvEventsConfig::from_json(
            r#"{"enable_kv_cache_events":true,"endpoint":"ipc:///x"}"#
        )
        .is_err());
    }

    #[test]
    fn ports_offset_by_rank_like_vllm() {
        assert_eq!(
            endpoint_for_rank("tcp://*:5557", 2).unwrap(),
            "tcp://*:5559"
        );
        assert_eq!(endpoint_for_rank("tcp://*:0", 3).unwrap(), "tcp://*:0");
        assert!(endpoint_for_rank("tcp://*:65535", 1).is_err());
        assert!(is_bind("tcp://*:1") && !is_bind("tcp://10.0.0.1:1"));
    }
}
