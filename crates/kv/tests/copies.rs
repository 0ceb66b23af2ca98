//! Two blocks with the same content (overlapping computations): the event
//! stream must stay a tree. Found behind NVIDIA Dynamo (benches/dynamo.sh): a
//! second run with the first run's programs (same seed, same prompts) still on
//! the workers made copies; when the hashed holders were evicted, agentd said
//! `BlockRemoved` for content that a program still held and kept chaining on,
//! and Dynamo's KV router logged "Failed to find parent block; skipping store"
//! for every later block of those chains.

use std::collections::{HashMap, HashSet};

use agentd_kv::{BlockHash, KvCache, KvEvent, ProgramId};

const BS: usize = 16;

fn toks(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| seed.wrapping_mul(100_003).wrapping_add(i))
        .collect()
}

/// What a KV-aware router rebuilds from the events: a prefix tree. Panics on
/// a store whose parent is not cached or a removal of a block with cached
/// children (Dynamo's indexer drops such a subtree's later stores).
#[derive(Default)]
struct Tree {
    parent: HashMap<BlockHash, Option<BlockHash>>,
    children: HashMap<BlockHash, usize>,
}

impl Tree {
    fn apply(&mut self, events: Vec<KvEvent>) {
        for e in events {
            match e {
                KvEvent::Stored { hash, parent, .. } => {
                    if let Some(p) = parent {
                        assert!(self.parent.contains_key(&p), "stored on an uncached parent");
                        *self.children.entry(p).or_default() += 1;
                    }
                    assert!(self.parent.insert(hash, parent).is_none(), "stored twice");
                }
                KvEvent::Removed { hash } => {
                    assert_eq!(
                        self.children.get(&hash).copied().unwrap_or(0),
                        0,
                        "removed while a child is cached"
                    );
                    let p = self.parent.remove(&hash).expect("removed unknown");
                    if let Some(p) = p {
                        *self.children.get_mut(&p).expect("parent counted") -= 1;
                    }
                }
                KvEvent::Cleared => *self = Tree::default(),
            }
        }
    }
}

#[test]
fn a_copy_takes_the_hash_over_so_no_child_outlives_its_parent() {
    let mut kv = KvCache::new(12, BS, 0);
    kv.enable_events();
    let mut tree = Tree::default();
    let (p1, p2, p3) = (ProgramId(1), ProgramId(2), ProgramId(3));
    let ctx = toks(5, 3 * BS + 4); // 3 full blocks + a tail
                                   // Both match before either commits (one engine step): nothing cached yet.
    for p in [p1, p2] {
        assert_eq!(kv.match_prefix(p, &ctx).cached_tokens, 0);
        kv.allocate_slots(p, ctx.len()).expect("room");
    }
    kv.commit(p1, &ctx).expect("commit");
    kv.commit(p2, &ctx).expect("commit"); // p2's full blocks are copies
    kv.check_invariants().expect("invariants");
    let shared: Vec<BlockHash> = kv.program_hashes(p2).to_vec();
    assert_eq!(shared.len(), 3);
    // p2 goes on: its 4th block is chained on the shared content.
    let mut ctx2 = ctx.clone();
    ctx2.extend(toks(6, BS));
    let m = kv.match_prefix(p2, &ctx2);
    assert_eq!(m.own_tokens, ctx.len(), "its own table, tail included");
    kv.allocate_slots(p2, ctx2.len() - m.cached_tokens)
        .expect("room");
    kv.commit(p2, &ctx2[m.cached_tokens..]).expect("commit");
    tree.apply(kv.drain_events());

    // p1 ends: its hashed blocks hand their hashes to p2's copies.
    kv.release(p1);
    kv.check_invariants().expect("invariants");
    for (i, h) in shared.iter().enumerate() {
        let b = kv.pool().lookup(*h).expect("still cached");
        assert_eq!(
            b,
            kv.block_table(p2)[i],
            "block {i}: p2's copy holds it now"
        );
    }
    // A third program takes every block that is not p2's.
    let free = kv.pool().num_available();
    let ctx3 = toks(9, free * BS);
    assert_eq!(kv.match_prefix(p3, &ctx3).cached_tokens, 0);
    kv.allocate_slots(p3, ctx3.len()).expect("room");
    kv.commit(p3, &ctx3).expect("commit");
    kv.check_invariants().expect("invariants");
    let events = kv.drain_events();
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, KvEvent::Removed { hash } if shared.contains(hash))),
        "content p2 holds was announced removed"
    );
    tree.apply(events);

    // p2 ends, then its blocks are evicted: children go before parents.
    kv.release(p3);
    kv.release(p2);
    let ctx4 = toks(11, kv.pool().num_available() * BS);
    kv.match_prefix(ProgramId(4), &ctx4);
    kv.allocate_slots(ProgramId(4), ctx4.len()).expect("room");
    kv.commit(ProgramId(4), &ctx4).expect("commit");
    kv.check_invariants().expect("invariants");
    tree.apply(kv.drain_events());
    let cached: HashSet<BlockHash> = kv.pool().cached_hashes().collect();
    let rebuilt: HashSet<BlockHash> = tree.parent.keys().copied().collect();
    assert_eq!(rebuilt, cached, "the events rebuild exactly the cached set");
}

#[test]
fn recomputing_over_an_evictable_copy_frees_the_old_block() {
    // A program recomputes content that is still cached but only evictable
    // (its match stopped at an evicted block before it): the new, referenced
    // block takes the hash, the old copy is freed, nothing is announced.
    let mut kv = KvCache::new(8, BS, 0);
    kv.enable_events();
    let (p1, p2) = (ProgramId(1), ProgramId(2));
    let ctx = toks(3, 2 * BS + 1);
    for p in [p1, p2] {
        kv.match_prefix(p, &ctx);
        kv.allocate_slots(p, ctx.len()).expect("room");
    }
    kv.commit(p1, &ctx).expect("commit");
    kv.release(p1); // its 2 hashed blocks are evictable, p2 has not committed
    let before = kv.pool().num_evictable();
    assert_eq!(before, 2);
    kv.drain_events();
    kv.commit(p2, &ctx).expect("commit");
    kv.check_invariants().expect("invariants");
    assert!(
        kv.drain_events().is_empty(),
        "the content was already announced"
    );
    assert_eq!(kv.pool().num_evictable(), 0, "the old copies were freed");
    for (i, h) in kv.program_hashes(p2).iter().enumerate() {
        assert_eq!(kv.pool().lookup(*h), Some(kv.block_table(p2)[i]));
    }
}
