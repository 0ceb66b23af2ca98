//! Property test: random interleavings of the allocator's operations keep every
//! pool invariant (each block exactly one of free/evictable/referenced, refcounts
//! equal table references, hash map consistent, exclusive counts exact), and the
//! KV events replayed by a subscriber rebuild exactly the set of cached hashes.

use std::collections::HashSet;

use agentd_kv::hash::hash_block;
use agentd_kv::{BlockHash, KvCache, KvEvent, ProgramId};
use proptest::prelude::*;

const BS: usize = 4;
/// Request salts the random turns use (0: unsalted).
const SALTS: [u64; 3] = [0, 1, 0xdead_beef];

#[derive(Debug, Clone)]
enum Op {
    /// Start a turn: the context grows by `extra` tokens from a small alphabet of
    /// stems so programs share prefixes often.
    Turn {
        p: u8,
        stem: u8,
        extra: u8,
        salt: u8,
    },
    /// Decode some tokens.
    Decode {
        p: u8,
        n: u8,
    },
    Pause {
        p: u8,
    },
    Release {
        p: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..6, 0u8..3, 0u8..24, 0u8..3)
            .prop_map(|(p, stem, extra, salt)| Op::Turn { p, stem, extra, salt }),
        4 => (0u8..6, 1u8..10).prop_map(|(p, n)| Op::Decode { p, n }),
        2 => (0u8..6).prop_map(|p| Op::Pause { p }),
        1 => (0u8..6).prop_map(|p| Op::Release { p }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn random_operations_keep_invariants(ops in proptest::collection::vec(op(), 1..80)) {
        let mut kv = KvCache::new(24, BS, 0);
        kv.enable_events();
        // What a subscriber of the events knows is cached.
        let mut seen: HashSet<BlockHash> = HashSet::new();
        // The engine-side context of each program.
        let mut ctx: Vec<Vec<u32>> = vec![Vec::new(); 6];
        for op in ops {
            match op {
                Op::Turn { p, stem, extra, salt } => {
                    let c = &mut ctx[p as usize];
                    if c.is_empty() {
                        c.extend((0..8).map(|i| stem as u32 * 1000 + i));
                    }
                    c.extend((0..extra as u32).map(|i| p as u32 * 7 + i % 3));
                    let m = kv.match_prefix_salted(ProgramId(p as u64), c, SALTS[salt as usize]);
                    prop_assert!(m.cached_tokens < c.len().max(1));
                    let rest = c[m.cached_tokens..].to_vec();
                    if kv.allocate_slots(ProgramId(p as u64), rest.len()).is_ok() {
                        kv.commit(ProgramId(p as u64), &rest).unwrap();
                    } else {
                        kv.pause(ProgramId(p as u64));
                    }
                }
                Op::Decode { p, n } => {
                    let id = ProgramId(p as u64);
                    if kv.is_resident(id) && kv.num_computed(id) == ctx[p as usize].len() {
                        let new: Vec<u32> = (0..n as u32).map(|i| 50 + i).collect();
                        if kv.allocate_slots(id, new.len()).is_ok() {
                            kv.commit(id, &new).unwrap();
                            ctx[p as usize].extend(new);
                        }
                    }
                }
                Op::Pause { p } => kv.pause(ProgramId(p as u64)),
                Op::Release { p } => {
                    kv.release(ProgramId(p as u64));
                    ctx[p as usize].clear();
                }
            }
            if let Err(e) = kv.check_invariants() {
                return Err(TestCaseError::fail(e));
            }
            for e in kv.drain_events() {
                apply(&mut seen, e)?;
            }
            let pool = kv.pool();
            prop_assert_eq!(pool.num_free() + pool.num_evictable() + pool.num_referenced(), pool.num_blocks());
            prop_assert_eq!(&seen, &pool.cached_hashes().collect::<HashSet<_>>());
        }
    }
}

/// A subscriber's view: each event must be a real transition (no double store,
/// no removal of an unknown hash) and a stored hash must be its tokens' hash.
fn apply(seen: &mut HashSet<BlockHash>, e: KvEvent) -> Result<(), TestCaseError> {
    match e {
        KvEvent::Stored {
            hash,
            parent,
            tokens,
        } => {
            prop_assert_eq!(tokens.len(), BS);
            // A child's hash is its parent's and tokens' alone; a root's
            // carries one of the salts in use.
            prop_assert!(
                SALTS
                    .iter()
                    .any(|&s| hash == hash_block(parent, &tokens, s)),
                "stored hash is not its tokens' hash"
            );
            prop_assert!(seen.insert(hash), "stored twice");
        }
        KvEvent::Removed { hash } => prop_assert!(seen.remove(&hash), "removed unknown"),
        KvEvent::Cleared => seen.clear(),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// The same prompt under two salts shares no block; under one salt the
    /// second program reuses every full block the first computed.
    #[test]
    fn salts_separate_and_equal_salts_share(
        len in 5usize..40, a in 0u64..4, b in 0u64..4, pause in any::<bool>(),
    ) {
        let mut kv = KvCache::new(32, BS, 0);
        let prompt: Vec<u32> = (0..len as u32).collect();
        let (p, q) = (ProgramId(1), ProgramId(2));
        kv.match_prefix_salted(p, &prompt, a);
        kv.allocate_slots(p, len).unwrap();
        kv.commit(p, &prompt).unwrap();
        if pause {
            kv.pause(p);
        }
        let m = kv.match_prefix_salted(q, &prompt, b);
        let full = (len - 1) / BS * BS;
        prop_assert_eq!(m.shared_tokens, if a == b { full } else { 0 });
        let held: HashSet<_> = kv.block_table(p).iter().collect();
        prop_assert!(a == b || kv.block_table(q).iter().all(|x| !held.contains(x)));
        prop_assert!(kv.check_invariants().is_ok());
    }
}
