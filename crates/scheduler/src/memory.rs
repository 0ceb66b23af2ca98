use agentd_kv::{KvCache, ProgramId};

use crate::StepRates;

/// What the scheduler may know about the replicas: exact block counts of
/// their KV caches (no tensors), and what their steps cost as measured.
pub trait Memory {
    fn num_replicas(&self) -> usize;
    /// Blocks in replica `r`'s pool.
    fn capacity(&self, r: usize) -> usize;
    /// Distinct blocks referenced by some program on `r` (shared blocks once).
    fn referenced(&self, r: usize) -> usize;
    /// Blocks an allocation on `r` can take (free + evictable).
    fn available(&self, r: usize) -> usize;
    fn blocks_held(&self, r: usize, p: ProgramId) -> usize;
    /// Blocks of `p` on `r` that no other program references.
    fn exclusive(&self, r: usize, p: ProgramId) -> usize;
    /// Tokens per block.
    fn block_size(&self) -> usize;
    /// Blocks needed for `tokens` tokens.
    fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size().max(1))
    }
    /// Leading blocks of `p`'s hash chain (recorded on replica `home`) that are
    /// referenced by some program on `home`: sharing them costs no memory.
    fn shared_prefix(&self, home: usize, p: ProgramId) -> usize;
    /// Whether block `i` of `p`'s chain is still cached on `home`.
    fn chain_block_cached(&self, home: usize, p: ProgramId, i: usize) -> bool;
    /// Block slots of the host tier behind replica `r`'s pool (0: none).
    fn host_capacity(&self, _r: usize) -> usize {
        0
    }
    /// Seconds of step time replica `r` spends prefilling `n` tokens after
    /// `cached` ones, from its measured steps (`rates.rs`); `None` until it
    /// has measured enough.
    fn prefill_s(&self, _r: usize, _cached: usize, _n: usize) -> Option<f64> {
        None
    }
    /// Seconds of step time replica `r` spends copying `tokens` tokens' KV
    /// between its tiers, measured as [`Memory::prefill_s`] is.
    fn copy_s(&self, _r: usize, _tokens: usize) -> Option<f64> {
        None
    }
}

/// [`Memory`] over the engine's per-replica caches and step-time fits.
pub struct Replicas<'a>(pub &'a [KvCache], pub &'a [StepRates]);

impl Memory for Replicas<'_> {
    fn num_replicas(&self) -> usize {
        self.0.len()
    }
    fn capacity(&self, r: usize) -> usize {
        self.0[r].pool().num_blocks()
    }
    fn referenced(&self, r: usize) -> usize {
        self.0[r].pool().num_referenced()
    }
    fn available(&self, r: usize) -> usize {
        self.0[r].pool().num_available()
    }
    fn blocks_held(&self, r: usize, p: ProgramId) -> usize {
        self.0[r].blocks_held(p)
    }
    fn exclusive(&self, r: usize, p: ProgramId) -> usize {
        self.0[r].exclusive_blocks(p)
    }
    fn block_size(&self) -> usize {
        self.0.first().map_or(1, KvCache::block_size)
    }
    fn shared_prefix(&self, home: usize, p: ProgramId) -> usize {
        self.0[home].shared_prefix(self.0[home].program_hashes(p))
    }
    fn chain_block_cached(&self, home: usize, p: ProgramId, i: usize) -> bool {
        self.0[home].is_cached(self.0[home].program_hashes(p), i)
    }
    fn host_capacity(&self, r: usize) -> usize {
        self.0[r].pool().host().map_or(0, |t| t.num_slots())
    }
    fn prefill_s(&self, r: usize, cached: usize, n: usize) -> Option<f64> {
        self.1.get(r)?.prefill_s(cached, n)
    }
    fn copy_s(&self, r: usize, tokens: usize) -> Option<f64> {
        self.1.get(r)?.copy_s(tokens)
    }
}
