//! Property test of the host tier: random turns, decodes, pauses (for swap
//! or for recompute) and releases on a small device pool with a host tier behind it. Besides the
//! pool's invariants and the KV events (a hash is announced once while
//! either tier holds it), a model of the *contents* replays the copies the
//! cache asks for, in order, before each "forward" writes the tokens it
//! computed: every hashed device block, every resident program's full
//! blocks and every host slot must then hold exactly their hash's content.
//! A copy made in the wrong order, from the wrong slot, or missing, shows up
//! as a block whose content is not its hash.

use std::collections::HashSet;

use agentd_kv::{BlockCopy, BlockHash, BlockId, KvCache, KvEvent, ProgramId, Whereabouts};
use proptest::prelude::*;

const BS: usize = 4;
const DEVICE_BLOCKS: usize = 16;
const PROGRAMS: usize = 6;

#[derive(Debug, Clone)]
enum Op {
    Turn { p: u8, stem: u8, extra: u8 },
    Decode { p: u8, n: u8 },
    Pause { p: u8, recompute: bool },
    Release { p: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..PROGRAMS as u8, 0u8..3, 0u8..24).prop_map(|(p, stem, extra)| Op::Turn { p, stem, extra }),
        3 => (0u8..PROGRAMS as u8, 1u8..10).prop_map(|(p, n)| Op::Decode { p, n }),
        3 => (0u8..PROGRAMS as u8, any::<bool>()).prop_map(|(p, recompute)| Op::Pause { p, recompute }),
        1 => (0u8..PROGRAMS as u8).prop_map(|p| Op::Release { p }),
    ]
}

/// What each device block and host slot holds: the hash of the content
/// last written or copied there (`None`: nothing whole).
struct Contents {
    device: Vec<Option<BlockHash>>,
    host: Vec<Option<BlockHash>>,
}

impl Contents {
    fn apply(&mut self, copies: Vec<BlockCopy>) {
        for c in copies {
            match c {
                BlockCopy::Offload { device, host } => {
                    self.host[host as usize] = self.device[device.0 as usize]
                }
                BlockCopy::Onload { host, device } => {
                    self.device[device.0 as usize] = self.host[host as usize]
                }
            }
        }
    }

    /// The forward computed `p`'s tokens from `from` on: the blocks that
    /// are full now hold their hash's content, the partial one nothing whole.
    fn write(&mut self, kv: &KvCache, p: ProgramId, from: usize) {
        let (table, hashes) = (kv.block_table(p), kv.program_hashes(p));
        for (i, b) in table.iter().enumerate().skip(from / BS) {
            self.device[b.0 as usize] = hashes.get(i).copied();
        }
    }
}

/// Runs the plan's copies, then the forward of `n` new tokens of `p`.
fn compute(kv: &mut KvCache, m: &mut Contents, p: ProgramId, tokens: &[u32]) -> bool {
    if kv.allocate_slots(p, tokens.len()).is_err() {
        kv.pause(p);
        m.apply(kv.drain_copies());
        return false;
    }
    m.apply(kv.drain_copies());
    let from = kv.num_computed(p);
    kv.commit(p, tokens).unwrap();
    m.write(kv, p, from);
    true
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn copies_keep_every_block_holding_its_hash(
        host_slots in 1usize..12,
        ops in proptest::collection::vec(op(), 1..100),
    ) {
        let mut kv = KvCache::new(DEVICE_BLOCKS, BS, 0);
        kv.enable_events();
        kv.enable_host_tier(host_slots);
        let mut m = Contents { device: vec![None; DEVICE_BLOCKS], host: vec![None; host_slots] };
        let mut seen: HashSet<BlockHash> = HashSet::new();
        let mut ctx: Vec<Vec<u32>> = vec![Vec::new(); PROGRAMS];
        for op in ops {
            match op {
                Op::Turn { p, stem, extra } => {
                    let id = ProgramId(p as u64);
                    let c = &mut ctx[p as usize];
                    if c.is_empty() {
                        c.extend((0..8).map(|i| stem as u32 * 1000 + i));
                    }
                    c.extend((0..extra as u32).map(|i| p as u32 * 7 + i % 3));
                    let matched = kv.match_prefix(id, c).cached_tokens;
                    let rest = c[matched..].to_vec();
                    compute(&mut kv, &mut m, id, &rest);
                }
                Op::Decode { p, n } => {
                    let id = ProgramId(p as u64);
                    if kv.is_resident(id) && kv.num_computed(id) == ctx[p as usize].len() {
                        let new: Vec<u32> = (0..n as u32).map(|i| 50 + i).collect();
                        if compute(&mut kv, &mut m, id, &new) {
                            ctx[p as usize].extend(new);
                        }
                    }
                }
                // The scheduler's two pauses (`park.rs`): swap or recompute.
                Op::Pause { p, recompute: false } => kv.pause(ProgramId(p as u64)),
                Op::Pause { p, recompute: true } => kv.pause_for_recompute(ProgramId(p as u64)),
                Op::Release { p } => {
                    kv.release(ProgramId(p as u64));
                    ctx[p as usize].clear();
                }
            }
            m.apply(kv.drain_copies());
            if let Err(e) = kv.check_invariants() {
                return Err(TestCaseError::fail(e));
            }
            for e in kv.drain_events() {
                match e {
                    KvEvent::Stored { hash, .. } => prop_assert!(seen.insert(hash), "stored twice"),
                    KvEvent::Removed { hash } => prop_assert!(seen.remove(&hash), "removed unknown"),
                    KvEvent::Cleared => seen.clear(),
                }
            }
            prop_assert_eq!(&seen, &kv.pool().cached_hashes().collect::<HashSet<_>>());
            check_contents(&kv, &m)?;
        }
    }
}

fn check_contents(kv: &KvCache, m: &Contents) -> Result<(), TestCaseError> {
    for b in 0..DEVICE_BLOCKS {
        if let Some(h) = kv.pool().hash_of(BlockId(b as u32)) {
            prop_assert_eq!(
                m.device[b],
                Some(h),
                "device block {} does not hold its hash",
                b
            );
        }
    }
    for p in 0..PROGRAMS {
        let id = ProgramId(p as u64);
        for (i, h) in kv.program_hashes(id).iter().enumerate() {
            if let Some(b) = kv.block_table(id).get(i) {
                prop_assert_eq!(
                    m.device[b.0 as usize],
                    Some(*h),
                    "program {} block {}",
                    p,
                    i
                );
            }
        }
    }
    let host = kv.pool().host().expect("host tier enabled");
    for h in host.hashes() {
        let s = host.slot(h).expect("held");
        prop_assert_eq!(
            m.host[s as usize],
            Some(h),
            "host slot {} does not hold its hash",
            s
        );
    }
    Ok(())
}

/// A paused program whose blocks the device pool evicted is restored from
/// the host tier: its whole context matches again, nothing recomputed.
#[test]
fn a_paused_program_is_restored_from_the_host_tier() {
    let mut kv = KvCache::new(8, BS, 0);
    kv.enable_host_tier(16);
    let (a, b) = (ProgramId(1), ProgramId(2));
    let ctx_a: Vec<u32> = (0..25).collect();
    kv.match_prefix(a, &ctx_a);
    kv.allocate_slots(a, 25).unwrap();
    kv.commit(a, &ctx_a).unwrap();
    kv.pause(a);
    let kept = Whereabouts {
        device: 6,
        host: 0,
        lost: 0,
    };
    assert_eq!(
        kv.whereabouts(a),
        kept,
        "paused: still cached on the device"
    );
    // Another program takes the whole pool: a's six full blocks are evicted.
    let ctx_b: Vec<u32> = (100..132).collect();
    kv.match_prefix(b, &ctx_b);
    kv.allocate_slots(b, 32).unwrap();
    kv.commit(b, &ctx_b).unwrap();
    let copies = kv.drain_copies();
    assert_eq!(
        copies
            .iter()
            .filter(|c| matches!(c, BlockCopy::Offload { .. }))
            .count(),
        6
    );
    let swapped = Whereabouts {
        device: 0,
        host: 6,
        lost: 0,
    };
    assert_eq!(kv.whereabouts(a), swapped, "evicted: kept by the tier");
    kv.release(b);
    let m = kv.match_prefix(a, &ctx_a);
    assert_eq!(m.cached_tokens, 24, "every full block comes back");
    assert_eq!(kv.whereabouts(a), kept, "restored: on the device again");
    let onloads = kv
        .drain_copies()
        .into_iter()
        .filter(|c| matches!(c, BlockCopy::Onload { .. }))
        .count();
    assert_eq!(onloads, 6);
    // Making room for a's blocks evicted six of b's cached ones in turn;
    // b had ended, so they were dropped, not offloaded.
    assert_eq!(kv.host_copies(), (6, 6));
    kv.check_invariants().unwrap();
}

/// The tier keeps what will come back: a paused program's evicted blocks
/// are offloaded, an ended program's are dropped (still matched while the
/// device pool holds them), and a block an ended program left that another
/// program takes up again is offloaded like any other when evicted later.
#[test]
fn an_ended_programs_blocks_are_not_offloaded() {
    let mut kv = KvCache::new(4, BS, 0);
    kv.enable_host_tier(16);
    let (a, b, c) = (ProgramId(1), ProgramId(2), ProgramId(3));
    let ctx_a: Vec<u32> = (0..16).collect();
    kv.match_prefix(a, &ctx_a);
    kv.allocate_slots(a, 16).unwrap();
    kv.commit(a, &ctx_a).unwrap();
    kv.release(a);
    // Still cached on the device: a new program with a's context hits it.
    let m = kv.match_prefix(c, &ctx_a);
    assert_eq!(m.cached_tokens, 12, "all but the block of the last token");
    kv.pause(c);
    // b fills the pool: c's paused blocks (three taken up from a's) are
    // offloaded; a's last block, which only a ever held, is dropped.
    let ctx_b: Vec<u32> = (100..116).collect();
    kv.match_prefix(b, &ctx_b);
    kv.allocate_slots(b, 16).unwrap();
    kv.commit(b, &ctx_b).unwrap();
    let offloads = kv
        .drain_copies()
        .iter()
        .filter(|x| matches!(x, BlockCopy::Offload { .. }))
        .count();
    assert_eq!(offloads, 3);
    kv.release(b);
    let m = kv.match_prefix(c, &ctx_a);
    assert_eq!(m.cached_tokens, 12, "the paused program's blocks come back");
    kv.check_invariants().unwrap();
}

/// Without room in the tier an evicted block is lost, and so is every
/// block after it: a prefix match stops at the first one missing.
#[test]
fn whereabouts_count_a_lost_block_and_all_after_it() {
    let mut kv = KvCache::new(4, BS, 0);
    kv.enable_host_tier(1);
    let (a, b) = (ProgramId(1), ProgramId(2));
    let ctx_a: Vec<u32> = (0..16).collect();
    kv.match_prefix(a, &ctx_a);
    kv.allocate_slots(a, 16).unwrap();
    kv.commit(a, &ctx_a).unwrap();
    kv.pause(a);
    // b takes two blocks: two of a's four are evicted, the tier keeps one.
    let ctx_b: Vec<u32> = (100..108).collect();
    kv.match_prefix(b, &ctx_b);
    kv.allocate_slots(b, 8).unwrap();
    kv.commit(b, &ctx_b).unwrap();
    let w = kv.whereabouts(a);
    assert_eq!(w.device + w.host + w.lost, 4, "{w:?}");
    assert!(w.lost >= 1, "{w:?}");
    // Whatever came back is a leading run: device and host blocks before
    // the first lost one, exactly what a prefix match reuses (once b's
    // blocks make room for the onloads).
    kv.release(b);
    let m = kv.match_prefix(a, &ctx_a);
    assert_eq!(m.cached_tokens, (w.device + w.host) * BS, "{w:?}");
    kv.check_invariants().unwrap();
}

/// A program paused for recompute (the scheduler's choice when the tier
/// should keep others' contexts instead) stays cached on the device for
/// prefix hits, but its evicted blocks are dropped, not offloaded, while a
/// program paused the usual way has its evicted blocks copied to the tier.
#[test]
fn a_program_paused_for_recompute_is_not_offloaded() {
    let mut kv = KvCache::new(8, BS, 0);
    kv.enable_host_tier(16);
    let (a, b, c) = (ProgramId(1), ProgramId(2), ProgramId(3));
    let ctx_a: Vec<u32> = (0..16).collect();
    let ctx_b: Vec<u32> = (200..216).collect();
    for (p, ctx) in [(a, &ctx_a), (b, &ctx_b)] {
        kv.match_prefix(p, ctx);
        kv.allocate_slots(p, 16).unwrap();
        kv.commit(p, ctx).unwrap();
    }
    kv.pause_for_recompute(a);
    kv.pause(b);
    let on_device = Whereabouts {
        device: 4,
        host: 0,
        lost: 0,
    };
    assert_eq!(kv.whereabouts(a), on_device, "still cached on the device");
    // c takes the whole pool: both paused programs' blocks are evicted.
    let ctx_c: Vec<u32> = (100..132).collect();
    kv.match_prefix(c, &ctx_c);
    kv.allocate_slots(c, 32).unwrap();
    kv.commit(c, &ctx_c).unwrap();
    let offloads = kv
        .drain_copies()
        .iter()
        .filter(|x| matches!(x, BlockCopy::Offload { .. }))
        .count();
    assert_eq!(offloads, 4, "only b's four blocks");
    assert_eq!(kv.whereabouts(a).lost, 4);
    assert_eq!(kv.whereabouts(b).host, 4);
    kv.release(c);
    assert_eq!(kv.match_prefix(a, &ctx_a).cached_tokens, 0, "recomputed");
    assert_eq!(kv.match_prefix(b, &ctx_b).cached_tokens, 12, "swapped back");
    kv.check_invariants().unwrap();
}
