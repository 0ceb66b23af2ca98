use agentd_scheduler::SchedulerConfig;

use crate::KvEventSink;

/// How the engine runs.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Data-parallel replicas, each with its own KV pool and worker thread.
    pub replicas: usize,
    /// KV blocks per replica.
    pub num_blocks: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Token budget of one step (decode tokens + prefill chunks).
    pub max_num_batched_tokens: usize,
    /// Requests that may wait (queued or paused) before new ones get
    /// `Overloaded` — back-pressure instead of unbounded memory.
    pub max_waiting: usize,
    pub scheduler: SchedulerConfig,
    /// Salt of the prefix-cache hashes.
    pub cache_salt: u64,
    /// CPU threads for each replica's model forward; `None` splits the
    /// machine's cores evenly between the replicas.
    pub threads_per_replica: Option<usize>,
    /// Cap on prompt + output tokens, below the model's own window
    /// (`max_position_embeddings`); `None` uses the model's.
    pub max_model_len: Option<usize>,
    /// Where each step's KV cache events go (`--kv-events-config`); `None`
    /// records nothing.
    pub kv_events: Option<KvEventSink>,
    /// Blocks of each replica's host tier (`--kv-offloading-size`): evicted
    /// cached blocks are copied there and back instead of recomputed. 0:
    /// none.
    pub host_blocks: usize,
}

impl EngineConfig {
    /// CPU threads of each replica: `threads_per_replica`, or the machine's
    /// cores split evenly between the replicas.
    pub fn threads_each(&self) -> usize {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        self.threads_per_replica
            .unwrap_or(cores / self.replicas.max(1))
            .max(1)
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            replicas: 1,
            num_blocks: 1024,
            block_size: 16,
            max_num_batched_tokens: 2048,
            max_waiting: 1024,
            scheduler: SchedulerConfig::default(),
            cache_salt: 0,
            max_model_len: None,
            threads_per_replica: None,
            kv_events: None,
            host_blocks: 0,
        }
    }
}
