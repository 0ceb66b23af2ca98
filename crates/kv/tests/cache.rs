//! Behaviour of the program-owned KV cache on the real allocator.

use agentd_kv::{KvCache, KvError, ProgramId};

const BS: usize = 16;

fn toks(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| seed.wrapping_mul(100_003).wrapping_add(i))
        .collect()
}

/// Prefills `ctx` for `p` (after matching), as an engine step would.
fn compute(kv: &mut KvCache, p: ProgramId, ctx: &[u32]) -> usize {
    let m = kv.match_prefix(p, ctx);
    let rest = &ctx[m.cached_tokens..];
    kv.allocate_slots(p, rest.len()).expect("room");
    kv.commit(p, rest).expect("commit");
    kv.check_invariants().expect("invariants");
    m.cached_tokens
}

#[test]
fn shared_system_prompt_is_stored_once() {
    let mut kv = KvCache::new(64, BS, 0);
    let system = toks(1, 64); // 4 full blocks
    let mut a = system.clone();
    a.extend(toks(2, 20));
    let mut b = system.clone();
    b.extend(toks(3, 20));
    compute(&mut kv, ProgramId(1), &a);
    let hit = compute(&mut kv, ProgramId(2), &b);
    assert_eq!(hit, 64, "the second program reuses the whole system prompt");
    // 84 tokens each = 6 blocks each; 4 shared → 4 + 2 + 2 distinct blocks.
    assert_eq!(kv.pool().num_referenced(), 8);
    assert_eq!(kv.blocks_held(ProgramId(1)), 6);
    assert_eq!(kv.exclusive_blocks(ProgramId(1)), 2);
    assert_eq!(kv.exclusive_blocks(ProgramId(2)), 2);
    kv.release(ProgramId(2));
    assert_eq!(kv.exclusive_blocks(ProgramId(1)), 6, "sole owner again");
    kv.check_invariants().unwrap();
}

#[test]
fn next_turn_reuses_own_partial_tail_block() {
    let mut kv = KvCache::new(64, BS, 0);
    let p = ProgramId(7);
    let mut ctx = toks(1, 40); // 2 full blocks + 8 in the tail
    compute(&mut kv, p, &ctx);
    ctx.extend(toks(9, 30));
    let m = kv.match_prefix(p, &ctx);
    assert_eq!(
        m.own_tokens, 40,
        "the partial tail block is the program's own and survives"
    );
    assert_eq!(m.shared_tokens, 0);
    kv.check_invariants().unwrap();
}

#[test]
fn restore_after_pause_rehits_surviving_blocks() {
    let mut kv = KvCache::new(16, BS, 0);
    let p = ProgramId(1);
    let ctx = toks(5, 100); // 6 full blocks + 4 tail tokens = 7 blocks
    compute(&mut kv, p, &ctx);
    kv.pause(p);
    assert_eq!(kv.pool().num_referenced(), 0);
    assert_eq!(kv.pool().num_evictable(), 6, "full blocks stay cached");
    assert!(!kv.is_resident(p));
    let probe = kv.probe(kv.program_hashes(p));
    assert_eq!(probe.cached_blocks, 6);
    assert_eq!(probe.referenced_blocks, 0);
    // Another program takes 12 of the 16 blocks: 10 free ones, then 2 evicted.
    compute(&mut kv, ProgramId(2), &toks(6, 12 * BS - 1));
    let probe = kv.probe(kv.program_hashes(p));
    // Released last block first, so the chain's end was evicted first.
    assert_eq!(probe.cached_blocks, 4);
    let m = kv.match_prefix(p, &ctx);
    assert_eq!(
        m.shared_tokens,
        4 * BS,
        "restore re-hits the surviving prefix"
    );
    assert_eq!(
        ctx.len() - m.cached_tokens,
        36,
        "recompute only what was lost"
    );
    kv.check_invariants().unwrap();
}

#[test]
fn last_prompt_token_is_always_recomputed() {
    let mut kv = KvCache::new(16, BS, 0);
    let ctx = toks(1, 32);
    compute(&mut kv, ProgramId(1), &ctx);
    let m = kv.match_prefix(ProgramId(2), &ctx);
    assert_eq!(
        m.cached_tokens, 16,
        "the block holding the last token is recomputed"
    );
}

#[test]
fn allocation_is_all_or_nothing() {
    let mut kv = KvCache::new(4, BS, 0);
    let p = ProgramId(1);
    kv.match_prefix(p, &toks(1, 10));
    let err = kv.allocate_slots(p, 5 * BS).unwrap_err();
    assert_eq!(
        err,
        KvError::OutOfBlocks {
            needed: 5,
            available: 4
        }
    );
    assert_eq!(kv.pool().num_referenced(), 0);
    kv.check_invariants().unwrap();
}

#[test]
fn slot_mapping_follows_block_table() {
    let mut kv = KvCache::new(8, 4, 0);
    let p = ProgramId(3);
    kv.match_prefix(ProgramId(9), &[1]);
    kv.allocate_slots(ProgramId(9), 4).unwrap(); // takes block 0
    kv.match_prefix(p, &[1, 2]);
    kv.allocate_slots(p, 6).unwrap();
    let table: Vec<u32> = kv.block_table(p).iter().map(|b| b.0).collect();
    assert_eq!(table, vec![1, 2]);
    assert_eq!(kv.slot_mapping(p, 6).unwrap(), vec![4, 5, 6, 7, 8, 9]);
    assert!(kv.slot_mapping(p, 9).is_err(), "beyond allocated slots");
}

#[test]
fn diverging_prompt_drops_own_suffix() {
    let mut kv = KvCache::new(32, BS, 0);
    let p = ProgramId(1);
    let ctx = toks(1, 80);
    compute(&mut kv, p, &ctx);
    // The agent framework rewrote history after token 40.
    let mut edited = ctx[..40].to_vec();
    edited.extend(toks(2, 40));
    let m = kv.match_prefix(p, &edited);
    assert_eq!(m.cached_tokens, 32, "two full blocks still match");
    assert_eq!(kv.blocks_held(p), 2);
    kv.check_invariants().unwrap();
}

#[test]
fn prefix_stats_count_queries_and_hits() {
    let mut kv = KvCache::new(32, BS, 0);
    let ctx = toks(1, 48);
    compute(&mut kv, ProgramId(1), &ctx);
    compute(&mut kv, ProgramId(2), &ctx);
    let s = kv.stats();
    assert_eq!(s.query_tokens, 96);
    assert_eq!(s.hit_tokens, 32);
}

/// A flush (weight update, `/flush_cache`) leaves nothing matchable but
/// what the kept programs hold: an idle program's resident blocks, a
/// paused program's evictable ones and the host tier's copies are gone.
#[test]
fn flush_forgets_everything_the_kept_programs_do_not_hold() {
    let mut kv = KvCache::new(32, BS, 0);
    kv.enable_host_tier(8);
    kv.enable_events();
    let system = toks(1, 64);
    let (idle, paused, running) = (ProgramId(1), ProgramId(2), ProgramId(3));
    compute(&mut kv, idle, &system);
    let mut b = toks(2, 40);
    b.extend(toks(3, 8));
    compute(&mut kv, paused, &b);
    kv.pause(paused);
    let mut c = system.clone();
    c.extend(toks(4, 20));
    assert_eq!(
        compute(&mut kv, running, &c),
        64,
        "shares the system prompt"
    );
    kv.drain_events();
    let freed = kv.flush(|p| p == running);
    kv.check_invariants().expect("invariants after a flush");
    assert!(
        freed >= 2,
        "the paused program's evictable blocks were freed"
    );
    assert_eq!(kv.blocks_held(idle), 0);
    assert!(kv.program_hashes(idle).is_empty());
    assert_eq!(kv.blocks_held(running), 6, "the kept program keeps its KV");
    // Nothing of the other programs matches any more (the running program's
    // referenced system-prompt blocks still do: they are its own).
    assert_eq!(kv.match_prefix(ProgramId(9), &b).cached_tokens, 0);
    assert!(
        kv.match_prefix(idle, &system).cached_tokens > 0,
        "blocks the kept program references are still shared"
    );
    let removed = kv
        .drain_events()
        .into_iter()
        .filter(|e| matches!(e, agentd_kv::KvEvent::Removed { .. }))
        .count();
    assert!(removed >= 2, "the freed hashes are announced removed");
    kv.release(running);
    kv.release(idle);
    kv.flush(|_| false);
    kv.check_invariants().expect("invariants");
    assert_eq!(
        kv.pool().num_free(),
        32,
        "an empty cache after a full flush"
    );
    assert_eq!(kv.match_prefix(ProgramId(10), &c).cached_tokens, 0);
}
