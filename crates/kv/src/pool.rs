//! The block pool: every block of one replica's KV cache, and where it is.
//!
//! A block is in exactly one of three places:
//! * **free** — no references, no valid hash (a stack: any order will do);
//! * **evictable** — no references, but its content hash is still valid and
//!   registered, so a later prefix match can revive it (an LRU; eviction takes
//!   the least recently released);
//! * **referenced** — held by one or more program block tables.
//!
//! Allocation prefers truly free blocks and only then evicts the LRU head, so
//! cached content lives as long as possible.
//!
//! Two blocks can hold the same content when two computations of it overlapped
//! (two programs, or a program recomputing past a block evicted in the middle of
//! its cached chain). The map points at one of them; the other is a referenced,
//! unhashed *copy* of that hash. When the hashed one loses its last reference
//! while a copy is still referenced, the copy takes the hash over: the content
//! stays cached (no `Removed` event while a block still holds it, so a child
//! chained on it never outlives its parent in the event stream; Dynamo's KV
//! router drops stores whose parent it was told is gone).
//!
//! Each block also carries the XOR of the ids of the programs that reference it.
//! When the refcount is 1 that XOR *is* the sole owner, which lets the cache keep
//! per-program exclusive-block counts exact in O(1) (the scheduler weighs only the
//! exclusive blocks of acting programs).

use std::collections::HashMap;

use crate::events::{EventLog, KvEvent};
use crate::host::{BlockCopy, HostTier};
use crate::lru::Lru;
use crate::{BlockHash, ProgramId};

/// Index of a block in its replica's pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

#[derive(Debug, Clone, Copy, Default)]
struct Block {
    ref_count: u32,
    hash: Option<BlockHash>,
    owner_xor: u64,
    /// A referenced, unhashed copy of the cached content `dup_of`.
    dup_of: Option<BlockHash>,
    /// Evictable because the program that last referenced it ended: it is
    /// dropped when evicted rather than copied to the host tier. The tier
    /// keeps parked contexts that will come back; finished programs'
    /// blocks pushed them out: `agentd simulate` swe, 192 programs, a tier
    /// of twice the pool, ran 249 steps/min with them offloaded (below
    /// 297.4 with no tier) and 316.6 with them dropped.
    ended: bool,
}

/// How a reference change altered who exclusively owns a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exclusivity {
    /// No program gained or lost sole ownership besides the caller's own +-1.
    Unchanged,
    /// The caller is now the sole owner (refcount went 0 → 1) or stopped being
    /// one (1 → 0).
    Caller,
    /// Another program stopped being the sole owner (1 → 2).
    Lost(ProgramId),
    /// Another program became the sole owner (2 → 1).
    Gained(ProgramId),
}

/// All blocks of one replica.
#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<Block>,
    free: Vec<u32>,
    evictable: Lru,
    by_hash: HashMap<BlockHash, u32>,
    /// The copies of each hash (see the module docs); never empty lists.
    dups: HashMap<BlockHash, Vec<u32>>,
    num_referenced: usize,
    /// Hash transitions for KV-event subscribers; `None` (no cost) unless enabled.
    events: Option<EventLog>,
    /// The host tier behind this pool, if any ([`crate::host`]).
    host: Option<HostTier>,
    /// Copies between the tiers decided since the last drain, in order.
    copies: Vec<BlockCopy>,
    /// Blocks copied to and from the host tier so far.
    pub(crate) offloaded: u64,
    pub(crate) onloaded: u64,
}

impl BlockPool {
    pub fn new(num_blocks: usize) -> Self {
        assert!(num_blocks < u32::MAX as usize, "block ids are u32");
        Self {
            blocks: vec![Block::default(); num_blocks],
            // Reversed so block 0 is handed out first (readable traces).
            free: (0..num_blocks as u32).rev().collect(),
            evictable: Lru::new(num_blocks),
            by_hash: HashMap::with_capacity(num_blocks),
            dups: HashMap::new(),
            num_referenced: 0,
            events: None,
            host: None,
            copies: Vec::new(),
            offloaded: 0,
            onloaded: 0,
        }
    }

    /// Puts a host tier of `slots` blocks behind this pool (0: none).
    pub(crate) fn enable_host(&mut self, slots: usize) {
        self.host = (slots > 0).then(|| HostTier::new(slots));
    }

    pub fn host(&self) -> Option<&HostTier> {
        self.host.as_ref()
    }

    /// The copies decided since the last drain, in the order the runner
    /// must carry them out (before the next forward).
    pub(crate) fn drain_copies(&mut self) -> Vec<BlockCopy> {
        std::mem::take(&mut self.copies)
    }

    /// Whether the host tier holds `h`.
    fn host_holds(&self, h: BlockHash) -> bool {
        self.host.as_ref().is_some_and(|t| t.contains(h))
    }

    /// Device block `i`, cached as `hash`, is being evicted: copy it to the
    /// host tier (unless the tier holds it already), and announce `hash`
    /// removed when no tier holds it any more.
    fn evict(&mut self, i: u32, hash: BlockHash, ended: bool) {
        self.by_hash.remove(&hash);
        let host = self.host.as_mut().filter(|_| !ended);
        if let Some((slot, dropped)) = host.and_then(|t| t.store(hash)) {
            self.copies.push(BlockCopy::Offload {
                device: BlockId(i),
                host: slot,
            });
            self.offloaded += 1;
            if let Some(d) = dropped.filter(|d| !self.by_hash.contains_key(d)) {
                self.note(KvEvent::Removed { hash: d });
            }
        }
        if !self.host_holds(hash) {
            self.note(KvEvent::Removed { hash });
        }
    }

    fn note(&mut self, e: KvEvent) {
        if let Some(log) = &mut self.events {
            log.push(e);
        }
    }

    /// A device block for `owner` holding `h`'s content, copied from the
    /// host tier (refcount 1, hashed); `None` when the tier does not hold
    /// `h` or no device block is available. The device pool must not hold
    /// `h` (the caller looked it up first). No event: `h` was announced
    /// while it sat in the host tier.
    pub(crate) fn onload(&mut self, owner: ProgramId, h: BlockHash) -> Option<BlockId> {
        if !self.host_holds(h) {
            return None;
        }
        debug_assert!(
            !self.by_hash.contains_key(&h),
            "onload of a device-cached hash"
        );
        let b = self.allocate(owner)?;
        // Looked up after allocating: the allocation's own offload may
        // have taken `h`'s slot (a tier of one slot), and then its content
        // is gone.
        let Some(slot) = self.host.as_mut().and_then(|t| t.onload_slot(h)) else {
            self.release(b, owner, false);
            return None;
        };
        self.copies.push(BlockCopy::Onload {
            host: slot,
            device: b,
        });
        self.onloaded += 1;
        self.blocks[b.0 as usize].hash = Some(h);
        self.by_hash.insert(h, b.0);
        Some(b)
    }

    /// Starts recording hash transitions ([`KvEvent`]), beginning with
    /// `Cleared`: subscribers drop whatever they knew of this replica.
    pub(crate) fn enable_events(&mut self) {
        let mut log = EventLog::default();
        log.push(KvEvent::Cleared);
        // Blocks hashed before recording began (none in a fresh pool) would
        // otherwise be unknown to subscribers forever.
        debug_assert!(self.by_hash.is_empty(), "enable events on a fresh pool");
        self.events = Some(log);
    }

    /// The transitions recorded since the last drain, oldest first.
    pub(crate) fn drain_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map_or_else(Vec::new, EventLog::drain)
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }
    /// Blocks an allocation can take: free plus evictable.
    pub fn num_available(&self) -> usize {
        self.free.len() + self.evictable.len()
    }
    pub fn num_free(&self) -> usize {
        self.free.len()
    }
    pub fn num_evictable(&self) -> usize {
        self.evictable.len()
    }
    pub fn num_referenced(&self) -> usize {
        self.num_referenced
    }
    pub fn ref_count(&self, b: BlockId) -> u32 {
        self.blocks[b.0 as usize].ref_count
    }
    pub fn hash_of(&self, b: BlockId) -> Option<BlockHash> {
        self.blocks[b.0 as usize].hash
    }

    /// The block carrying this content hash, if it is still cached (referenced or evictable).
    pub fn lookup(&self, h: BlockHash) -> Option<BlockId> {
        self.by_hash.get(&h).map(|&i| BlockId(i))
    }

    /// Takes a fresh block for `owner` (refcount 1). Evicts the least recently
    /// used cached block when no free block is left.
    pub(crate) fn allocate(&mut self, owner: ProgramId) -> Option<BlockId> {
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = self.evictable.pop_front()?;
                let ended = self.blocks[i as usize].ended;
                if let Some(hash) = self.blocks[i as usize].hash.take() {
                    // An evictable holder has no copies: they take the hash
                    // over when it is released, or are freed when it is not.
                    debug_assert!(!self.dups.contains_key(&hash), "evicting a copied hash");
                    self.evict(i, hash, ended);
                }
                i
            }
        };
        self.blocks[i as usize] = Block {
            ref_count: 1,
            hash: None,
            owner_xor: owner.0,
            dup_of: None,
            ended: false,
        };
        self.num_referenced += 1;
        Some(BlockId(i))
    }

    /// Adds a reference from `owner` to a cached block (a prefix hit).
    pub(crate) fn acquire(&mut self, b: BlockId, owner: ProgramId) -> Exclusivity {
        let blk = &mut self.blocks[b.0 as usize];
        let before = blk.ref_count;
        let prev_owner = blk.owner_xor;
        blk.ref_count += 1;
        blk.owner_xor ^= owner.0;
        match before {
            0 => {
                blk.ended = false;
                self.evictable.remove(b.0);
                self.num_referenced += 1;
                Exclusivity::Caller
            }
            1 => Exclusivity::Lost(ProgramId(prev_owner)),
            _ => Exclusivity::Unchanged,
        }
    }

    /// Drops a reference of `owner` (`ended`: the program ended). At
    /// refcount 0 a hashed block becomes evictable (most recently used end;
    /// marked [`Block::ended`] when `ended`), or hands its hash to a
    /// referenced copy and is freed; an unhashed one is freed.
    pub(crate) fn release(&mut self, b: BlockId, owner: ProgramId, ended: bool) -> Exclusivity {
        let blk = &mut self.blocks[b.0 as usize];
        debug_assert!(blk.ref_count > 0, "release of unreferenced block {b:?}");
        blk.ref_count -= 1;
        blk.owner_xor ^= owner.0;
        match blk.ref_count {
            0 => {
                blk.owner_xor = 0;
                let (hash, dup_of) = (blk.hash, blk.dup_of.take());
                self.num_referenced -= 1;
                match (hash, dup_of) {
                    (_, Some(h)) => {
                        self.forget_copy(h, b.0);
                        self.free.push(b.0);
                    }
                    (Some(h), None) => {
                        if let Some(copy) = self.take_copy(h) {
                            self.blocks[b.0 as usize].hash = None;
                            self.free.push(b.0);
                            self.blocks[copy as usize].hash = Some(h);
                            self.by_hash.insert(h, copy);
                        } else {
                            self.blocks[b.0 as usize].ended = ended;
                            self.evictable.push_back(b.0);
                        }
                    }
                    (None, None) => self.free.push(b.0),
                }
                Exclusivity::Caller
            }
            1 => Exclusivity::Gained(ProgramId(blk.owner_xor)),
            _ => Exclusivity::Unchanged,
        }
    }

    /// A referenced copy of `h`, no longer recorded as one.
    fn take_copy(&mut self, h: BlockHash) -> Option<u32> {
        let list = self.dups.get_mut(&h)?;
        let copy = list.pop();
        if list.is_empty() {
            self.dups.remove(&h);
        }
        if let Some(c) = copy {
            self.blocks[c as usize].dup_of = None;
        }
        copy
    }

    fn forget_copy(&mut self, h: BlockHash, b: u32) {
        if let Some(list) = self.dups.get_mut(&h) {
            list.retain(|&c| c != b);
            if list.is_empty() {
                self.dups.remove(&h);
            }
        }
    }

    /// Registers the content hash of a block that just became full (`tokens`,
    /// chained on `parent`); true when it was announced (a `Stored` event).
    /// If another block already carries this hash, the content is already
    /// cached and announced: a referenced holder keeps the hash and this block
    /// becomes its copy; a merely evictable holder is freed and this block
    /// takes the hash (the map points at exactly one block per hash).
    pub(crate) fn register_hash(
        &mut self,
        b: BlockId,
        h: BlockHash,
        parent: Option<BlockHash>,
        tokens: &[u32],
    ) -> bool {
        if let Some(&holder) = self.by_hash.get(&h) {
            if self.blocks[holder as usize].ref_count == 0 {
                self.evictable.remove(holder);
                self.blocks[holder as usize].hash = None;
                self.free.push(holder);
                self.by_hash.insert(h, b.0);
                self.blocks[b.0 as usize].hash = Some(h);
            } else {
                self.blocks[b.0 as usize].dup_of = Some(h);
                self.dups.entry(h).or_default().push(b.0);
            }
            return false;
        }
        self.by_hash.insert(h, b.0);
        self.blocks[b.0 as usize].hash = Some(h);
        if self.host_holds(h) {
            // Announced when it was first stored; it never left the replica.
            return false;
        }
        if let Some(log) = &mut self.events {
            log.push(KvEvent::Stored {
                hash: h,
                parent,
                tokens: tokens.to_vec(),
            });
        }
        true
    }

    /// Forgets every unreferenced cached block, on the device and in the
    /// host tier (a weight update, `/flush_cache`): evictable blocks become
    /// free and lose their hashes, the tier's slots are emptied, and each
    /// hash that leaves both tiers is announced `Removed`. Referenced blocks
    /// keep their hashes. Returns the device blocks freed.
    pub(crate) fn drop_unreferenced(&mut self) -> usize {
        let mut gone = std::collections::HashSet::new();
        let mut freed = 0;
        while let Some(i) = self.evictable.pop_front() {
            if let Some(h) = self.blocks[i as usize].hash.take() {
                self.by_hash.remove(&h);
                gone.insert(h);
            }
            self.free.push(i);
            freed += 1;
        }
        if let Some(tier) = self.host.as_mut() {
            gone.extend(tier.hashes());
            *tier = HostTier::new(tier.num_slots());
        }
        let mut gone: Vec<BlockHash> = gone
            .into_iter()
            .filter(|h| !self.by_hash.contains_key(h))
            .collect();
        // Deterministic event order (the set's is not).
        gone.sort_unstable();
        for hash in gone {
            self.note(KvEvent::Removed { hash });
        }
        freed
    }

    /// Every hash currently cached (referenced or evictable), for checks
    /// against what subscribers rebuilt from the events.
    pub fn cached_hashes(&self) -> impl Iterator<Item = BlockHash> + '_ {
        let host_only = self
            .host
            .iter()
            .flat_map(HostTier::hashes)
            .filter(|h| !self.by_hash.contains_key(h));
        self.by_hash.keys().copied().chain(host_only)
    }

    /// Checks invariants 1 and 3 (see the crate docs); refcounts against the
    /// block tables are checked by the cache, which owns the tables.
    pub fn check_invariants(&self) -> Result<(), String> {
        let n = self.blocks.len();
        let mut place = vec![0u8; n];
        for &i in &self.free {
            place[i as usize] += 1;
            let b = &self.blocks[i as usize];
            if b.ref_count != 0 || b.hash.is_some() {
                return Err(format!(
                    "free block {i} has ref {} hash {:?}",
                    b.ref_count, b.hash
                ));
            }
        }
        for i in self.evictable.iter() {
            place[i as usize] += 1;
            let b = &self.blocks[i as usize];
            if b.ref_count != 0 || b.hash.is_none() {
                return Err(format!(
                    "evictable block {i} has ref {} hash {:?}",
                    b.ref_count, b.hash
                ));
            }
        }
        let mut referenced = 0;
        for (i, b) in self.blocks.iter().enumerate() {
            if b.ref_count > 0 {
                place[i] += 1;
                referenced += 1;
            }
            if place[i] != 1 {
                return Err(format!(
                    "block {i} is in {} places (ref {})",
                    place[i], b.ref_count
                ));
            }
            if let Some(h) = b.hash {
                if self.by_hash.get(&h) != Some(&(i as u32)) {
                    return Err(format!(
                        "block {i} carries a hash the map does not point at it"
                    ));
                }
            }
        }
        if referenced != self.num_referenced {
            return Err(format!(
                "num_referenced {} but {referenced} blocks referenced",
                self.num_referenced
            ));
        }
        if self.evictable.len() + self.free.len() + referenced != n {
            return Err("free + evictable + referenced != total".into());
        }
        for (h, &i) in &self.by_hash {
            if self.blocks[i as usize].hash != Some(*h) {
                return Err(format!(
                    "hash map points at block {i} which does not carry that hash"
                ));
            }
        }
        // Copies: referenced, unhashed, of a hash whose holder is referenced.
        let mut copies = 0;
        for (h, list) in &self.dups {
            let holder = self.by_hash.get(h).map(|&i| &self.blocks[i as usize]);
            if list.is_empty() || holder.is_none_or(|b| b.ref_count == 0) {
                return Err(format!("copies of {h:?} without a referenced holder"));
            }
            for &i in list {
                let b = &self.blocks[i as usize];
                if b.dup_of != Some(*h) || b.hash.is_some() || b.ref_count == 0 {
                    return Err(format!("block {i} listed as a copy of {h:?}: {b:?}"));
                }
                copies += 1;
            }
        }
        if self.blocks.iter().filter(|b| b.dup_of.is_some()).count() != copies {
            return Err("a block is marked as a copy but not listed".into());
        }
        self.check_host()
    }

    /// The host tier's own invariants, and pending copies within both tiers.
    fn check_host(&self) -> Result<(), String> {
        let Some(host) = &self.host else {
            return match self.copies.is_empty() {
                true => Ok(()),
                false => Err("copies pending without a host tier".into()),
            };
        };
        host.check_invariants()?;
        for c in &self.copies {
            let (BlockCopy::Offload { device, host: s } | BlockCopy::Onload { host: s, device }) =
                *c;
            if device.0 as usize >= self.blocks.len() || s as usize >= host.num_slots() {
                return Err(format!("copy {c:?} out of range"));
            }
        }
        Ok(())
    }

    /// XOR of the owners of `b`, for the cache's refcount checks.
    pub(crate) fn owner_xor(&self, b: BlockId) -> u64 {
        self.blocks[b.0 as usize].owner_xor
    }
}
