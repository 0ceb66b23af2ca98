//! What of a program's or a chain's KV survives on a replica, read without
//! changing anything: the leading run cached ([`KvCache::probe`]), the run
//! other programs reference ([`KvCache::shared_prefix`]), one block
//! ([`KvCache::is_cached`]), and where each of a program's blocks is now
//! ([`KvCache::whereabouts`]: kept, swapped or lost).

use super::KvCache;
use crate::{BlockHash, ProgramId};

/// What of a chain of block hashes survives on this replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProbeResult {
    /// Leading blocks of the chain present in the cache (referenced or evictable).
    pub cached_blocks: usize,
    /// Of those, leading blocks currently referenced by some program (sharing
    /// them costs no extra memory).
    pub referenced_blocks: usize,
}

/// Where a program's full blocks are ([`KvCache::whereabouts`]), in
/// blocks: what restoring it would cost — nothing, a copy from the host
/// tier, or a recompute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Whereabouts {
    /// In the device pool (held, or cached and evictable).
    pub device: usize,
    /// Copied out to the host tier (a restore copies them back).
    pub host: usize,
    /// Gone, and every block after the first gone one (a restore
    /// recomputes them).
    pub lost: usize,
}

impl KvCache {
    /// Probes which leading blocks of a hash chain are cached here.
    pub fn probe(&self, chain: &[BlockHash]) -> ProbeResult {
        let mut r = ProbeResult::default();
        let mut referenced_run = true;
        for &h in chain {
            let Some(b) = self.pool.lookup(h) else { break };
            r.cached_blocks += 1;
            referenced_run &= self.pool.ref_count(b) > 0;
            if referenced_run {
                r.referenced_blocks += 1;
            }
        }
        r
    }

    /// Where the blocks of `p`'s recorded chain are now: held by it or
    /// cached in the device pool, kept by the host tier, or lost (to be
    /// recomputed). A prefix match reuses only a leading run, so every
    /// block after the first lost one counts as lost too. O(chain).
    pub fn whereabouts(&self, p: ProgramId) -> Whereabouts {
        let mut w = Whereabouts::default();
        for &h in self.program_hashes(p) {
            if w.lost > 0 {
                w.lost += 1;
            } else if self.pool.lookup(h).is_some() {
                w.device += 1;
            } else if self.pool.host().is_some_and(|t| t.contains(h)) {
                w.host += 1;
            } else {
                w.lost += 1;
            }
        }
        w
    }

    /// Length of the leading run of `chain` referenced by some program here:
    /// blocks a program with this chain would share at no extra memory. Stops at
    /// the first block not referenced, so it costs O(shared prefix), not O(chain).
    pub fn shared_prefix(&self, chain: &[BlockHash]) -> usize {
        chain
            .iter()
            .take_while(|&&h| {
                self.pool
                    .lookup(h)
                    .is_some_and(|b| self.pool.ref_count(b) > 0)
            })
            .count()
    }

    /// Whether the `i`-th block of `chain` is still cached here (in the
    /// device pool or its host tier).
    pub fn is_cached(&self, chain: &[BlockHash], i: usize) -> bool {
        chain.get(i).is_some_and(|&h| {
            self.pool.lookup(h).is_some() || self.pool.host().is_some_and(|t| t.contains(h))
        })
    }
}
