//! Paged KV-cache bookkeeping whose owner is the *program*, not the request.
//!
//! This crate hands out block ids and slot mappings; it never touches tensors.
//! One [`KvCache`] exists per replica (one pool of device blocks each).
//!
//! * [`BlockPool`] — the blocks themselves: refcounts, a free list, an O(1)
//!   LRU of *evictable cached* blocks (free, but still carrying a valid content
//!   hash) and the hash → block map.
//! * [`hash`] — chained content hashes of full blocks (`h_0 = H(salt, tokens_0)`,
//!   `h_i = H(h_{i-1}, tokens_i)`).
//! * [`host`] — the host-memory tier behind a device pool: evicted cached
//!   blocks are copied there and matched back ([`BlockCopy`], carried out by
//!   the runner).
//! * [`events`] — the prefix cache's transitions (stored / removed / cleared)
//!   for KV-aware routers, recorded only when enabled.
//! * [`KvCache`] — per-program block tables kept *between* requests, prefix
//!   matching, slot allocation, pause / restore / release, exact usage counts.
//!
//! Invariants (checked by [`KvCache::check_invariants`], after every engine step in
//! debug builds and in the property tests):
//! 1. every block is exactly one of free / evictable / referenced;
//! 2. a block's refcount equals the number of program block tables that hold it;
//! 3. the hash map points only at blocks carrying that hash, and every hashed
//!    unreferenced block is in the map (so the LRU only holds reachable blocks);
//! 4. each program's exclusive-block count equals the number of its blocks whose
//!    refcount is 1;
//! 5. programs of different salts (tenants, request `cache_salt`s) never hold
//!    the same block;
//! 6. the host tier's slots are each free or hold one hash, agreeing with its
//!    map (H1, H2 in [`host`]), and pending copies name real blocks and slots.

mod cache;
mod error;
pub mod events;
pub mod hash;
pub mod host;
mod lru;
mod pool;
mod program;

pub use cache::{CacheStats, KvCache, PrefixMatch, ProbeResult, Whereabouts};
pub use error::KvError;
pub use events::KvEvent;
pub use hash::BlockHash;
pub use host::{BlockCopy, HostTier};
pub use pool::{BlockId, BlockPool};
pub use program::ProgramId;
