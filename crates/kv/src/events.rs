//! KV cache events: the allocator's own transitions of the prefix cache, for
//! routers that track which blocks a replica holds (vLLM's `BlockStored` /
//! `BlockRemoved` / `AllBlocksCleared`, which Dynamo's KV router reads).
//!
//! * **stored** — a block became full and its chained hash was registered
//!   (`BlockPool::register_hash` succeeded): from now on a prefix match can hit it;
//! * **removed** — a hash stopped being cached: an evictable block was taken by
//!   an allocation, its hash dropped. Pausing or releasing a program does *not*
//!   remove anything: its full blocks stay matchable in the LRU until evicted;
//! * **cleared** — the cache (re)started empty.
//!
//! Recording is off unless [`crate::KvCache::enable_events`] was called, and
//! then costs one `Vec` push per transition; the engine drains the log once per
//! step, so it holds at most one step's transitions.

use crate::BlockHash;

/// One transition of the set of cached block hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// `hash` (chained on `parent`) is now cached; `tokens` are the block's
    /// `block_size` tokens.
    Stored {
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: Vec<u32>,
    },
    /// `hash` is no longer cached anywhere on this replica.
    Removed { hash: BlockHash },
    /// Nothing is cached (a fresh or reset cache).
    Cleared,
}

/// The per-replica buffer; `None` inside the pool when events are off.
#[derive(Debug, Default)]
pub(crate) struct EventLog {
    events: Vec<KvEvent>,
}

impl EventLog {
    pub fn push(&mut self, e: KvEvent) {
        self.events.push(e);
    }

    pub fn drain(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }
}
