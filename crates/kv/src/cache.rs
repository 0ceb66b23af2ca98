//! One replica's KV cache: the block pool plus every program's block table.
//!
//! Unlike a request-level engine, a program's block table survives between its
//! requests: when the next turn arrives its prompt usually extends the previous
//! context, so the program's own blocks — including the partially filled last
//! block, which a hash-only cache cannot reuse — are matched first, then the
//! shared prefix cache.

use std::collections::HashMap;

use tracing::trace;

use crate::hash::{hash_block, hash_blocks};
use crate::pool::Exclusivity;
use crate::program::ProgramKv;
use crate::{BlockHash, BlockId, BlockPool, KvError, KvEvent, ProgramId};

mod probe;

pub use probe::{ProbeResult, Whereabouts};

/// Result of aligning a program's KV with the context it is about to extend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixMatch {
    /// Tokens already computed (no prefill needed): `own_tokens + shared_tokens`.
    pub cached_tokens: usize,
    /// Of those, tokens that came from the program's own, still-resident table.
    pub own_tokens: usize,
    /// Of those, tokens revived or shared from the replica's prefix cache.
    pub shared_tokens: usize,
}

/// Prefix-cache counters in tokens, with vLLM's meaning: a query is a prompt
/// token looked up when a computation (re)starts, a hit one found computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheStats {
    pub query_tokens: u64,
    pub hit_tokens: u64,
}

/// Per-replica KV bookkeeping.
#[derive(Debug)]
pub struct KvCache {
    pool: BlockPool,
    block_size: usize,
    salt: u64,
    programs: HashMap<ProgramId, ProgramKv>,
    stats: CacheStats,
}

impl KvCache {
    pub fn new(num_blocks: usize, block_size: usize, salt: u64) -> Self {
        assert!(block_size > 0, "block size must be positive");
        Self {
            pool: BlockPool::new(num_blocks),
            block_size,
            salt,
            programs: HashMap::new(),
            stats: CacheStats::default(),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }
    /// Records this replica's prefix-cache transitions from now on (see
    /// [`crate::events`]); call on a fresh cache.
    pub fn enable_events(&mut self) {
        self.pool.enable_events();
    }
    /// The transitions since the last drain, oldest first (empty when off).
    pub fn drain_events(&mut self) -> Vec<KvEvent> {
        self.pool.drain_events()
    }
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }
    pub fn stats(&self) -> CacheStats {
        self.stats
    }
    /// Fraction of blocks referenced by some program (vLLM's `kv_cache_usage_perc`).
    pub fn usage(&self) -> f64 {
        self.pool.num_referenced() as f64 / self.pool.num_blocks().max(1) as f64
    }
    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    pub fn contains(&self, p: ProgramId) -> bool {
        self.programs.contains_key(&p)
    }
    pub fn is_resident(&self, p: ProgramId) -> bool {
        self.programs.get(&p).is_some_and(ProgramKv::is_resident)
    }
    pub fn num_computed(&self, p: ProgramId) -> usize {
        self.programs.get(&p).map_or(0, |k| k.num_computed)
    }
    pub fn blocks_held(&self, p: ProgramId) -> usize {
        self.programs.get(&p).map_or(0, |k| k.blocks.len())
    }
    /// Blocks of `p` that no other program references.
    pub fn exclusive_blocks(&self, p: ProgramId) -> usize {
        self.programs.get(&p).map_or(0, |k| k.exclusive)
    }
    pub fn block_table(&self, p: ProgramId) -> &[BlockId] {
        self.programs.get(&p).map_or(&[], |k| &k.blocks)
    }
    /// Content hashes of `p`'s full computed blocks (kept while paused).
    pub fn program_hashes(&self, p: ProgramId) -> &[BlockHash] {
        self.programs.get(&p).map_or(&[], |k| &k.hashes)
    }

    /// Aligns `p`'s KV with `tokens`, the full context its next computation
    /// extends (a new turn's prompt, or the context of a program being restored).
    ///
    /// Keeps the longest prefix of `p`'s own table that still matches (its partial
    /// last block too), releases the rest, then extends the match through the
    /// replica's prefix cache. The last token is never reported as cached: its
    /// logits must be computed.
    pub fn match_prefix(&mut self, p: ProgramId, tokens: &[u32]) -> PrefixMatch {
        self.match_prefix_salted(p, tokens, 0)
    }

    /// [`KvCache::match_prefix`] for a request whose prefix must only be shared
    /// with requests of the same `salt` (a tenant's, or a request's
    /// `cache_salt`; 0 shares with every unsalted request). The salt is mixed
    /// into the first block's hash, so two salts share no block of the chain.
    /// A program whose salt changes keeps none of its own blocks either.
    pub fn match_prefix_salted(&mut self, p: ProgramId, tokens: &[u32], salt: u64) -> PrefixMatch {
        let bs = self.block_size;
        let mut kv = self.take(p);
        let salt = self.salt ^ salt;
        if kv.salt != salt {
            // Nothing of the old chain may be reused, not even the unhashed tail.
            self.truncate(p, &mut kv, 0, false);
            kv.hashes.clear();
            kv.tail.clear();
            kv.salt = salt;
        }
        let limit = tokens.len().saturating_sub(1);
        let want = hash_blocks(None, &tokens[..limit / bs * bs], bs, salt);

        // 1. The program's own resident blocks.
        let full_own = (kv.num_computed / bs).min(kv.blocks.len());
        let mut keep = 0;
        while keep < full_own && keep < want.len() && kv.hashes[keep] == want[keep] {
            keep += 1;
        }
        let mut own_tokens = keep * bs;
        let tail_ok = keep == kv.hashes.len()
            && keep == full_own
            && kv.blocks.len() > keep
            && !kv.tail.is_empty()
            && keep * bs + kv.tail.len() <= limit
            && tokens[keep * bs..keep * bs + kv.tail.len()] == kv.tail[..];
        let keep_blocks = if tail_ok {
            own_tokens += kv.tail.len();
            keep + 1
        } else {
            kv.tail.clear();
            keep
        };
        self.truncate(p, &mut kv, keep_blocks, false);
        kv.hashes.truncate(keep);

        // 2. The shared prefix cache (only when the own table ended block-aligned).
        let mut shared_blocks = 0;
        if !tail_ok {
            for &h in &want[keep..] {
                if !self.take_cached(p, &mut kv, h) {
                    break;
                }
                shared_blocks += 1;
            }
        }
        let shared_tokens = shared_blocks * bs;
        kv.num_computed = own_tokens + shared_tokens;
        kv.num_slots = kv.num_computed;
        self.stats.query_tokens += tokens.len() as u64;
        self.stats.hit_tokens += kv.num_computed as u64;
        trace!(program = %p, own_tokens, shared_tokens, prompt = tokens.len(), "prefix match");
        self.programs.insert(p, kv);
        PrefixMatch {
            cached_tokens: own_tokens + shared_tokens,
            own_tokens,
            shared_tokens,
        }
    }

    /// Starts `p`'s context from its first token: drops whatever of it
    /// `p` holds (full blocks stay cached for others) and matches nothing,
    /// neither its own blocks nor the prefix cache, counting no query.
    /// vLLM skips reading the prefix cache for a request that wants
    /// `prompt_logprobs`: each prompt position's logits must be computed.
    pub fn match_nothing(&mut self, p: ProgramId, salt: u64) -> PrefixMatch {
        self.release(p);
        let mut kv = self.take(p);
        kv.salt = self.salt ^ salt;
        trace!(program = %p, "prefix match skipped: full prefill");
        self.programs.insert(p, kv);
        PrefixMatch::default()
    }

    /// In-batch prefix sharing: extends `p`'s computed prefix with blocks of
    /// its context cached since it was matched. Programs admitted in one
    /// step with the same prompt (a rollout group, `n` choices, a burst on
    /// one system prompt) all matched nothing of it then; the one planned
    /// first computes it and the others, deferred a step
    /// ([`KvCache::next_block_hash`]), find it here instead of computing it
    /// again. Only when `p` holds exactly its computed whole blocks (no
    /// partial tail, no slots beyond them); at most the context's length
    /// minus one, as a match. Returns the tokens gained.
    pub fn extend_match(&mut self, p: ProgramId, tokens: &[u32]) -> usize {
        let bs = self.block_size;
        let limit = tokens.len().saturating_sub(1);
        let Some(kv) = self.programs.get(&p) else {
            return 0;
        };
        let Some(from) = self.next_block_start(kv, tokens) else {
            return 0;
        };
        if kv.blocks.len() != from || kv.num_slots != kv.num_computed {
            return 0;
        }
        let mut kv = self.take(p);
        let mut gained = 0;
        // Block by block, stopping at the first miss: one hash per step for
        // a program that finds nothing (a long prompt mid-prefill).
        for block in tokens[from * bs..limit / bs * bs].chunks_exact(bs) {
            let h = hash_block(kv.hashes.last().copied(), block, kv.salt);
            if !self.take_cached(p, &mut kv, h) {
                break;
            }
            gained += bs;
        }
        kv.num_computed += gained;
        kv.num_slots = kv.num_computed;
        self.stats.hit_tokens += gained as u64;
        if gained > 0 {
            trace!(program = %p, gained, "in-batch prefix match");
        }
        self.programs.insert(p, kv);
        gained
    }

    /// The hash of `p`'s next block to compute, when `p` is at a block
    /// boundary and that block is whole within its context (minus the last
    /// token, as a match): what [`KvCache::extend_match`] could find once
    /// another program computed it.
    pub fn next_block_hash(&self, p: ProgramId, tokens: &[u32]) -> Option<BlockHash> {
        let bs = self.block_size;
        let kv = self.programs.get(&p)?;
        let from = self.next_block_start(kv, tokens)?;
        let block = tokens.get(from * bs..(from + 1) * bs)?;
        Some(hash_block(kv.hashes.last().copied(), block, kv.salt))
    }

    /// The index of `kv`'s next block when it has computed exactly its
    /// hashed blocks (no partial tail) and `tokens`, its context, holds that
    /// block whole short of the last token (which a match never covers).
    fn next_block_start(&self, kv: &ProgramKv, tokens: &[u32]) -> Option<usize> {
        let bs = self.block_size;
        let from = kv.hashes.len();
        let aligned = kv.tail.is_empty() && kv.num_computed == from * bs;
        (aligned && (from + 1) * bs <= tokens.len().saturating_sub(1)).then_some(from)
    }

    /// Hashes of the blocks that computing the next `n` tokens of `p`'s
    /// context (`tokens`) fills: what this step puts in the prefix cache.
    pub fn blocks_filled_by(&self, p: ProgramId, tokens: &[u32], n: usize) -> Vec<BlockHash> {
        let bs = self.block_size;
        let Some(kv) = self.programs.get(&p) else {
            return Vec::new();
        };
        let from = kv.hashes.len();
        let end = (kv.num_computed + n).min(tokens.len()) / bs;
        if end <= from {
            return Vec::new();
        }
        hash_blocks(
            kv.hashes.last().copied(),
            &tokens[from * bs..end * bs],
            bs,
            kv.salt,
        )
    }

    /// Blocks `p` needs beyond what it holds to compute `n` more tokens.
    pub fn blocks_needed(&self, p: ProgramId, n: usize) -> usize {
        let kv = self.programs.get(&p);
        let (computed, held) = kv.map_or((0, 0), |k| (k.num_computed, k.blocks.len()));
        self.blocks_for(computed + n).saturating_sub(held)
    }

    /// Ensures slots for the next `n` tokens of `p`. All or nothing: on
    /// `OutOfBlocks` nothing was taken.
    pub fn allocate_slots(&mut self, p: ProgramId, n: usize) -> Result<(), KvError> {
        let needed = self.blocks_needed(p, n);
        let available = self.pool.num_available();
        if needed > available {
            return Err(KvError::OutOfBlocks { needed, available });
        }
        let mut kv = self.take(p);
        for _ in 0..needed {
            // Cannot fail: availability was checked above and nothing else runs.
            let Some(b) = self.pool.allocate(p) else {
                break;
            };
            kv.exclusive += 1;
            kv.blocks.push(b);
        }
        kv.num_slots = kv.num_slots.max(kv.num_computed + n);
        self.programs.insert(p, kv);
        Ok(())
    }

    /// Slot ids (`block * block_size + offset`) of `p`'s next `n` tokens, which
    /// must have been allocated.
    pub fn slot_mapping(&self, p: ProgramId, n: usize) -> Result<Vec<u32>, KvError> {
        let kv = self.programs.get(&p).ok_or(KvError::UnknownProgram(p))?;
        let bs = self.block_size;
        let capacity = kv.blocks.len() * bs;
        if kv.num_computed + n > capacity {
            return Err(KvError::CommitBeyondSlots {
                program: p,
                committing: n,
                allocated: capacity - kv.num_computed,
            });
        }
        Ok((kv.num_computed..kv.num_computed + n)
            .map(|pos| kv.blocks[pos / bs].0 * bs as u32 + (pos % bs) as u32)
            .collect())
    }

    /// Marks `tokens` (the next tokens of `p`'s context) as computed: their K/V
    /// are now in the blocks. Blocks that become full get their chained hash and
    /// join the prefix cache.
    pub fn commit(&mut self, p: ProgramId, tokens: &[u32]) -> Result<(), KvError> {
        let bs = self.block_size;
        let kv = self
            .programs
            .get_mut(&p)
            .ok_or(KvError::UnknownProgram(p))?;
        let allocated = kv.blocks.len() * bs - kv.num_computed;
        if tokens.len() > allocated {
            return Err(KvError::CommitBeyondSlots {
                program: p,
                committing: tokens.len(),
                allocated,
            });
        }
        for &t in tokens {
            kv.tail.push(t);
            if kv.tail.len() == bs {
                let parent = kv.hashes.last().copied();
                let h = hash_block(parent, &kv.tail, kv.salt);
                let b = kv.blocks[kv.hashes.len()];
                self.pool.register_hash(b, h, parent, &kv.tail);
                kv.hashes.push(h);
                kv.tail.clear();
            }
        }
        kv.num_computed += tokens.len();
        kv.num_slots = kv.num_slots.max(kv.num_computed);
        Ok(())
    }

    /// Drops all of `p`'s block references: full blocks become evictable cached
    /// blocks (a quick restore re-hits them), the partial tail block is freed.
    /// The chain of hashes is kept so the scheduler can probe what survives.
    pub fn pause(&mut self, p: ProgramId) {
        self.pause_marked(p, false);
    }

    /// [`KvCache::pause`] for a program the scheduler chose to recompute
    /// rather than swap: its blocks stay cached on the device for prefix
    /// hits, but an eviction drops them instead of copying them to the host
    /// tier, so they never push out contexts parked there to be swapped
    /// back (the scheduler's `park.rs`).
    pub fn pause_for_recompute(&mut self, p: ProgramId) {
        self.pause_marked(p, true);
    }

    fn pause_marked(&mut self, p: ProgramId, drop_on_evict: bool) {
        if let Some(mut kv) = self.programs.remove(&p) {
            self.truncate(p, &mut kv, 0, drop_on_evict);
            kv.tail.clear();
            kv.num_computed = 0;
            kv.num_slots = 0;
            self.programs.insert(p, kv);
        }
    }

    /// Forgets `p` entirely (the program ended). Its blocks stay cached
    /// for prefix hits, but an eviction drops them instead of copying them
    /// to the host tier (`pool.rs`, `Block::ended`).
    pub fn release(&mut self, p: ProgramId) {
        if let Some(mut kv) = self.programs.remove(&p) {
            self.truncate(p, &mut kv, 0, true);
        }
    }

    /// Forgets every cached block except those the programs `keep` hold
    /// (a weight update or `/flush_cache`, so no later request reuses KV
    /// computed before): each other program's blocks are dropped as a
    /// pause would and its hash chain forgotten, then every unreferenced
    /// cached block and the host tier's slots are emptied. Returns the
    /// device blocks freed.
    pub fn flush(&mut self, keep: impl Fn(ProgramId) -> bool) -> usize {
        let others: Vec<ProgramId> = self
            .programs
            .keys()
            .copied()
            .filter(|&p| !keep(p))
            .collect();
        for p in others {
            self.pause(p);
            if let Some(kv) = self.programs.get_mut(&p) {
                kv.hashes.clear();
            }
        }
        self.pool.drop_unreferenced()
    }

    /// Puts a host tier of `slots` blocks behind this cache's pool (0: none);
    /// call on a fresh cache.
    pub fn enable_host_tier(&mut self, slots: usize) {
        self.pool.enable_host(slots);
    }

    /// The copies between the tiers decided since the last call, for the
    /// runner to carry out, in order, before the next forward.
    pub fn drain_copies(&mut self) -> Vec<crate::BlockCopy> {
        self.pool.drain_copies()
    }

    /// Blocks copied to the host tier and back so far.
    pub fn host_copies(&self) -> (u64, u64) {
        (self.pool.offloaded, self.pool.onloaded)
    }

    /// `p`'s state, taken out of the map (a fresh one with the cache's salt).
    fn take(&mut self, p: ProgramId) -> ProgramKv {
        self.programs.remove(&p).unwrap_or_else(|| ProgramKv {
            salt: self.salt,
            ..ProgramKv::default()
        })
    }

    /// Releases `kv.blocks[keep..]`, last block first so the LRU evicts the end
    /// of a chain before its beginning (a prefix is only useful whole).
    fn truncate(&mut self, p: ProgramId, kv: &mut ProgramKv, keep: usize, ended: bool) {
        while kv.blocks.len() > keep {
            let Some(b) = kv.blocks.pop() else { break };
            match self.pool.release(b, p, ended) {
                Exclusivity::Caller => kv.exclusive -= 1,
                Exclusivity::Gained(q) => self.adjust_exclusive(q, 1),
                Exclusivity::Lost(_) | Exclusivity::Unchanged => {}
            }
        }
        kv.num_computed = kv.num_computed.min(keep * self.block_size);
        kv.num_slots = kv.num_slots.min(keep * self.block_size);
    }

    /// Appends the cached block of hash `h` to `p`'s table (`kv`), with a
    /// reference of `p`; false when nothing holds `h`.
    /// A block only the host tier holds is copied back into a new device
    /// block (exclusive to `p`).
    fn take_cached(&mut self, p: ProgramId, kv: &mut ProgramKv, h: BlockHash) -> bool {
        let b = match self.pool.lookup(h) {
            Some(b) => {
                let ex = self.pool.acquire(b, p);
                self.note_acquire(p, kv, ex);
                b
            }
            None => match self.pool.onload(p, h) {
                Some(b) => {
                    kv.exclusive += 1;
                    b
                }
                None => return false,
            },
        };
        kv.blocks.push(b);
        kv.hashes.push(h);
        true
    }

    fn note_acquire(&mut self, _p: ProgramId, kv: &mut ProgramKv, ex: Exclusivity) {
        match ex {
            Exclusivity::Caller => kv.exclusive += 1,
            Exclusivity::Lost(q) => self.adjust_exclusive(q, -1),
            Exclusivity::Gained(_) | Exclusivity::Unchanged => {}
        }
    }

    fn adjust_exclusive(&mut self, q: ProgramId, delta: isize) {
        if let Some(k) = self.programs.get_mut(&q) {
            k.exclusive = k.exclusive.saturating_add_signed(delta);
        } else {
            debug_assert!(false, "block owned by unknown program {q}");
        }
    }

    /// Checks every invariant in the crate docs. O(blocks); the engine calls it
    /// after each step in debug builds.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.pool.check_invariants()?;
        let n = self.pool.num_blocks();
        let mut refs = vec![0u32; n];
        let mut xor = vec![0u64; n];
        let mut salt_of: Vec<Option<u64>> = vec![None; n];
        for (p, kv) in &self.programs {
            let mut exclusive = 0;
            for b in &kv.blocks {
                refs[b.0 as usize] += 1;
                xor[b.0 as usize] ^= p.0;
                if *salt_of[b.0 as usize].get_or_insert(kv.salt) != kv.salt {
                    return Err(format!("block {}: shared across salts", b.0));
                }
            }
            for b in &kv.blocks {
                if self.pool.ref_count(*b) == 1 {
                    exclusive += 1;
                }
            }
            if exclusive != kv.exclusive {
                return Err(format!(
                    "{p}: exclusive count {} but {exclusive} blocks with ref 1",
                    kv.exclusive
                ));
            }
            if kv.num_computed > kv.blocks.len() * self.block_size || kv.num_slots < kv.num_computed
            {
                return Err(format!(
                    "{p}: computed {} slots {} blocks {}",
                    kv.num_computed,
                    kv.num_slots,
                    kv.blocks.len()
                ));
            }
            if kv.is_resident() && kv.hashes.len() != kv.num_computed / self.block_size {
                return Err(format!(
                    "{p}: {} hashes for {} computed tokens",
                    kv.hashes.len(),
                    kv.num_computed
                ));
            }
            for (i, h) in kv.hashes.iter().enumerate().take(kv.blocks.len()) {
                // A full block either carries its content hash or stayed unhashed
                // because another block already held that hash.
                let b = kv.blocks[i];
                if let Some(bh) = self.pool.hash_of(b) {
                    if bh != *h {
                        return Err(format!("{p}: block {i} hash mismatch"));
                    }
                }
            }
        }
        for i in 0..n {
            let b = BlockId(i as u32);
            if refs[i] != self.pool.ref_count(b) {
                return Err(format!(
                    "block {i}: refcount {} but {} table references",
                    self.pool.ref_count(b),
                    refs[i]
                ));
            }
            if refs[i] > 0 && xor[i] != self.pool.owner_xor(b) {
                return Err(format!("block {i}: owner set out of date"));
            }
        }
        Ok(())
    }
}
