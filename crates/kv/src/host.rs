//! The host-memory tier (docs/design.md §4,
//! `--kv-offloading-size`): a second,
//! larger pool of block slots in host memory behind a replica's device pool.
//!
//! A cached block the device pool evicts (its LRU head, taken by a new
//! allocation) is copied to a host slot first instead of being lost; a
//! prefix match that runs out of device-cached blocks continues through the
//! host tier, copying each block it finds back into a freshly allocated
//! device block. A paused program whose blocks were evicted is then restored
//! by copies (a few MB at memory bandwidth) instead of recomputing its
//! context (a prefill ∝ c²).
//!
//! Only blocks that may come back are offloaded: a block whose last
//! reference was dropped by a program that *ended* (`KvCache::release`) is
//! dropped when evicted, so finished programs' contexts never push parked
//! ones out of the tier (`pool.rs`, `Block::ended`, has the figures).
//!
//! This crate only decides and records the copies ([`BlockCopy`]); the
//! runner moves the bytes before the step's forward, in recorded order
//! (an offload into a slot and a later onload from it stay ordered).
//!
//! The tier is inclusive: onloading keeps the host copy, so a block evicted
//! again needs no second copy — but an onloaded slot is the first to be
//! reused, before any block that lives only here. A hash counts as *cached
//! on the replica* while either tier holds it — KV events announce it once
//! and remove it only when it leaves both.
//!
//! Invariants (checked by [`HostTier::check_invariants`]):
//! H1. every slot is exactly one of free / holding one hash (in the LRU);
//! H2. the hash map and the slots agree both ways.

use std::collections::HashMap;

use crate::lru::Lru;
use crate::{BlockHash, BlockId};

/// One copy between the tiers, for the runner to carry out before the
/// step's forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockCopy {
    /// Device block → host slot: the block is about to be reused.
    Offload { device: BlockId, host: u32 },
    /// Host slot → device block: a prefix match found the block here.
    Onload { host: u32, device: BlockId },
}

/// Host slots holding evicted content, least recently used evicted first.
#[derive(Debug)]
pub struct HostTier {
    slots: Vec<Option<BlockHash>>,
    by_hash: HashMap<BlockHash, u32>,
    /// Slots holding a hash, least recently stored or used first.
    used: Lru,
    free: Vec<u32>,
}

impl HostTier {
    pub fn new(num_slots: usize) -> Self {
        assert!(num_slots < u32::MAX as usize, "host slots are u32");
        Self {
            slots: vec![None; num_slots],
            by_hash: HashMap::with_capacity(num_slots),
            used: Lru::new(num_slots),
            free: (0..num_slots as u32).rev().collect(),
        }
    }

    pub fn num_slots(&self) -> usize {
        self.slots.len()
    }

    /// Slots holding a block.
    pub fn num_used(&self) -> usize {
        self.by_hash.len()
    }

    pub fn contains(&self, h: BlockHash) -> bool {
        self.by_hash.contains_key(&h)
    }

    /// The slot holding `h` (no use recorded).
    pub fn slot(&self, h: BlockHash) -> Option<u32> {
        self.by_hash.get(&h).copied()
    }

    /// The slot holding `h`, marked most recently used.
    fn lookup(&mut self, h: BlockHash) -> Option<u32> {
        let s = *self.by_hash.get(&h)?;
        self.used.remove(s);
        self.used.push_back(s);
        Some(s)
    }

    /// The slot to copy `h` back to the device from, marked first to be
    /// dropped: once onloaded the device copy serves it, and the slot is
    /// better spent on a paused program's blocks, which exist nowhere else.
    /// Kept most recently used instead, a rotation through more contexts
    /// than the tier holds drops exactly the paused program due next (the
    /// one paused, hence offloaded, longest ago) — every restore recomputed
    /// (`agentd simulate` swe at 192 programs, 21.6 steps/min).
    pub(crate) fn onload_slot(&mut self, h: BlockHash) -> Option<u32> {
        let s = *self.by_hash.get(&h)?;
        self.used.remove(s);
        self.used.push_front(s);
        Some(s)
    }

    /// A slot to copy `h`'s content into: `None` when it is already here
    /// (then marked most recently used). Takes a free slot, else the least
    /// recently used one; the hash that slot held, if any, is returned as
    /// dropped from this tier.
    pub(crate) fn store(&mut self, h: BlockHash) -> Option<(u32, Option<BlockHash>)> {
        if self.lookup(h).is_some() {
            return None;
        }
        let (s, dropped) = match self.free.pop() {
            Some(s) => (s, None),
            None => {
                let s = self.used.pop_front()?;
                let old = self.slots[s as usize].take();
                if let Some(old) = old {
                    self.by_hash.remove(&old);
                }
                (s, old)
            }
        };
        self.slots[s as usize] = Some(h);
        self.by_hash.insert(h, s);
        self.used.push_back(s);
        Some((s, dropped))
    }

    /// Every hash held here.
    pub fn hashes(&self) -> impl Iterator<Item = BlockHash> + '_ {
        self.by_hash.keys().copied()
    }

    /// Checks H1 and H2 (module docs).
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut free = vec![false; self.slots.len()];
        for &s in &self.free {
            let seen = free
                .get_mut(s as usize)
                .ok_or_else(|| format!("host: free slot {s} out of range"))?;
            if *seen || self.slots[s as usize].is_some() {
                return Err(format!(
                    "host: free slot {s} listed twice or holding a hash"
                ));
            }
            *seen = true;
        }
        for (s, h) in self.slots.iter().enumerate() {
            match h {
                Some(h) => {
                    if self.by_hash.get(h) != Some(&(s as u32)) {
                        return Err(format!("host: slot {s} holds a hash the map does not"));
                    }
                    if !self.used.contains(s as u32) {
                        return Err(format!("host: used slot {s} not in the LRU"));
                    }
                }
                None if !free[s] => return Err(format!("host: slot {s} neither free nor used")),
                None => {}
            }
        }
        if self.used.len() != self.by_hash.len() {
            return Err(format!(
                "host: {} slots in the LRU, {} hashes",
                self.used.len(),
                self.by_hash.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_until_full_then_drops_the_least_recently_used() {
        let mut t = HostTier::new(2);
        let h = |i| BlockHash(i);
        assert_eq!(t.store(h(1)), Some((0, None)));
        assert_eq!(t.store(h(2)), Some((1, None)));
        assert_eq!(t.store(h(1)), None, "already held: no copy");
        // 1 was used last, so 2 goes.
        assert_eq!(t.store(h(3)), Some((1, Some(h(2)))));
        assert_eq!(t.lookup(h(2)), None);
        assert_eq!(t.lookup(h(1)), Some(0));
        assert_eq!(t.store(h(4)), Some((1, Some(h(3)))));
        assert_eq!(t.num_used(), 2);
        t.check_invariants().unwrap();
    }

    #[test]
    fn an_onloaded_slot_is_reused_first() {
        let mut t = HostTier::new(3);
        let h = |i| BlockHash(i);
        for i in 1..=3 {
            t.store(h(i));
        }
        // 1 is the least recently stored, but 3 went back to the device.
        assert_eq!(t.onload_slot(h(3)), Some(2));
        assert_eq!(t.store(h(4)), Some((2, Some(h(3)))));
        assert_eq!(t.store(h(5)), Some((0, Some(h(1)))));
        assert_eq!(t.onload_slot(h(3)), None);
        t.check_invariants().unwrap();
    }

    #[test]
    fn an_empty_tier_stores_nothing() {
        let mut t = HostTier::new(0);
        assert_eq!(t.store(BlockHash(1)), None);
        t.check_invariants().unwrap();
    }
}
