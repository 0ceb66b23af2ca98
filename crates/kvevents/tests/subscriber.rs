//! A ZMQ subscriber decodes what agentd publishes and rebuilds the set of
//! cached block hashes: after a churn of programs (shared prefixes, decodes,
//! pauses, releases, evictions in a small pool) it equals the allocator's own
//! set exactly. Batches the live stream missed (a SUB joins late) are fetched
//! from the replay socket, vLLM's protocol.
//!
//! With `AGENTD_KV_EVENTS_DUMP=DIR` the received payloads and the expected set
//! are written there for `scripts/kv_events_golden.py check DIR` (vLLM's decoder).

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use agentd_kv::{KvCache, ProgramId};
use agentd_kvevents::wire::wire_hash;
use agentd_kvevents::{KvEventsConfig, Publisher};
use bytes::Bytes;
use rmpv::Value;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

const BS: usize = 4;
const RANK: usize = 2;
const TOPIC: &str = "kv@agentd";

/// A small deterministic generator (no dependency, same churn every run).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Runs a churn on a real KvCache, publishing each "step"'s events like the
/// engine does. Returns the allocator's cached set (as published integers)
/// and the number of batches.
fn churn(kv: &mut KvCache, publisher: &Publisher) -> (HashSet<u64>, u64, [usize; 3]) {
    let mut rng = Lcg(7);
    let mut ctx: Vec<Vec<u32>> = vec![Vec::new(); 8];
    let mut batches = 0;
    let mut counts = [0usize; 3]; // pauses, releases, evictions seen
    for _ in 0..600 {
        let p = rng.next(8) as usize;
        let id = ProgramId(p as u64 + 1);
        match rng.next(10) {
            0..=3 => {
                let c = &mut ctx[p];
                if c.is_empty() {
                    let stem = rng.next(3) as u32;
                    c.extend((0..10).map(|i| stem * 1000 + i));
                }
                let extra = rng.next(20) as u32;
                c.extend((0..extra).map(|i| p as u32 * 100 + i % 5));
                let m = kv.match_prefix(id, c);
                let rest = c[m.cached_tokens..].to_vec();
                if kv.allocate_slots(id, rest.len()).is_ok() {
                    kv.commit(id, &rest).expect("commit");
                } else {
                    kv.pause(id);
                }
            }
            4..=6 => {
                if kv.is_resident(id) && kv.num_computed(id) == ctx[p].len() {
                    let new: Vec<u32> = (0..1 + rng.next(9) as u32).map(|i| 500 + i).collect();
                    if kv.allocate_slots(id, new.len()).is_ok() {
                        kv.commit(id, &new).expect("commit");
                        ctx[p].extend(new);
                    }
                }
            }
            7 | 8 => {
                kv.pause(id);
                counts[0] += 1;
            }
            _ => {
                kv.release(id);
                ctx[p].clear();
                counts[1] += 1;
            }
        }
        let events = kv.drain_events();
        counts[2] += events
            .iter()
            .filter(|e| matches!(e, agentd_kv::KvEvent::Removed { .. }))
            .count();
        if !events.is_empty() {
            publisher.publish(events);
            batches += 1;
        }
        kv.check_invariants().expect("invariants");
    }
    let set = kv.pool().cached_hashes().map(wire_hash).collect();
    (set, batches, counts)
}

fn local(endpoint: &str) -> String {
    endpoint.replace("0.0.0.0", "127.0.0.1")
}

fn frames(m: ZmqMessage) -> Vec<Bytes> {
    m.into_vec()
}

fn seq_of(b: &Bytes) -> i64 {
    i64::from_be_bytes(b.as_ref().try_into().expect("8-byte seq"))
}

/// Receives until every batch `0..n` is in hand: live first, then whatever
/// the live stream missed from the replay socket.
async fn receive_all(sub: &mut SubSocket, replay: &str, n: u64) -> BTreeMap<u64, Bytes> {
    let mut got = BTreeMap::new();
    while (got.len() as u64) < n {
        match tokio::time::timeout(Duration::from_millis(500), sub.recv()).await {
            Ok(Ok(m)) => {
                let f = frames(m);
                assert_eq!(f.len(), 3, "[topic, seq, payload]");
                assert_eq!(f[0].as_ref(), TOPIC.as_bytes());
                got.insert(seq_of(&f[1]) as u64, f[2].clone());
            }
            _ => break, // the live stream is done; fill the gaps
        }
    }
    let missing = (0..n).find(|s| !got.contains_key(s));
    if let Some(start) = missing {
        let mut dealer = DealerSocket::new();
        dealer
            .connect(&local(replay))
            .await
            .expect("connect replay");
        let req = ZmqMessage::try_from(vec![
            Bytes::new(),
            Bytes::copy_from_slice(&start.to_be_bytes()),
        ])
        .expect("frames");
        dealer.send(req).await.expect("replay request");
        loop {
            let f = frames(dealer.recv().await.expect("replay answer"));
            assert!(f[0].is_empty(), "empty delimiter");
            if seq_of(&f[2]) == -1 {
                break;
            }
            assert_eq!(f[1].as_ref(), TOPIC.as_bytes());
            got.insert(seq_of(&f[2]) as u64, f[3].clone());
        }
    }
    got
}

fn field<'a>(ev: &'a [(Value, Value)], k: &str) -> &'a Value {
    &ev.iter()
        .find(|(key, _)| key.as_str() == Some(k))
        .unwrap_or_else(|| panic!("no {k}"))
        .1
}

fn hashes(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("hashes")
        .iter()
        .map(|h| h.as_u64().expect("int hash"))
        .collect()
}

/// Applies one decoded batch; every event must be a real transition.
fn apply(set: &mut HashSet<u64>, payload: &[u8]) {
    let batch = rmpv::decode::read_value(&mut &payload[..]).expect("msgpack");
    let b = batch.as_array().expect("batch array");
    assert_eq!(b.len(), 3, "[ts, events, data_parallel_rank]");
    assert!(b[0].as_f64().expect("ts") > 1.0e9, "unix time");
    assert_eq!(b[2].as_u64(), Some(RANK as u64));
    for e in b[1].as_array().expect("events") {
        let ev = e.as_map().expect("tagged map");
        match field(ev, "type").as_str().expect("tag") {
            "BlockStored" => {
                let hs = hashes(field(ev, "block_hashes"));
                assert_eq!(field(ev, "block_size").as_u64(), Some(BS as u64));
                let toks = field(ev, "token_ids").as_array().expect("tokens").len();
                assert_eq!(toks, hs.len() * BS);
                for h in hs {
                    assert!(set.insert(h), "stored twice");
                }
            }
            "BlockRemoved" => {
                for h in hashes(field(ev, "block_hashes")) {
                    assert!(set.remove(&h), "removed an unknown hash");
                }
            }
            "AllBlocksCleared" => set.clear(),
            other => panic!("unknown event {other}"),
        }
    }
}

#[tokio::test]
async fn subscriber_rebuilds_the_allocators_hashes() {
    let cfg = KvEventsConfig::from_json(&format!(
        r#"{{"enable_kv_cache_events":true,"endpoint":"tcp://*:0","replay_endpoint":"tcp://*:0","topic":"{TOPIC}","buffer_steps":100000}}"#
    ))
    .expect("config");
    let publisher = Publisher::start(&cfg, RANK, BS).expect("publisher");
    let mut sub = SubSocket::new();
    sub.connect(&local(publisher.endpoint()))
        .await
        .expect("connect");
    sub.subscribe(TOPIC).await.expect("subscribe");
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut kv = KvCache::new(40, BS, 0);
    kv.enable_events();
    let (expected, n, [pauses, releases, evictions]) = churn(&mut kv, &publisher);
    assert!(
        pauses > 50 && releases > 20 && evictions > 50,
        "a real churn: {pauses} {releases} {evictions}"
    );
    assert!(expected.len() > 10);

    let replay = publisher.replay_endpoint().expect("replay").to_string();
    let got = receive_all(&mut sub, &replay, n).await;
    assert_eq!(got.len() as u64, n, "every batch, live or replayed");
    assert_eq!(publisher.dropped(), 0);
    let mut rebuilt = HashSet::new();
    for payload in got.values() {
        apply(&mut rebuilt, payload);
    }
    assert_eq!(rebuilt, expected, "subscriber's set == allocator's set");

    if let Ok(dir) = std::env::var("AGENTD_KV_EVENTS_DUMP") {
        let dir = std::path::PathBuf::from(dir);
        std::fs::create_dir_all(&dir).expect("dump dir");
        for (seq, p) in &got {
            std::fs::write(dir.join(format!("{seq:06}.msgpack")), p).expect("dump");
        }
        let cached: Vec<u64> = expected.iter().copied().collect();
        std::fs::write(
            dir.join("expected.json"),
            format!("{{\"cached\":{cached:?}}}"),
        )
        .expect("dump");
    }
}

#[tokio::test]
async fn a_replay_request_answers_from_a_bounded_buffer() {
    let cfg = KvEventsConfig::from_json(
        r#"{"enable_kv_cache_events":true,"endpoint":"tcp://*:0","replay_endpoint":"tcp://*:0","buffer_steps":3}"#,
    )
    .expect("config");
    let publisher = Publisher::start(&cfg, 0, BS).expect("publisher");
    for _ in 0..5 {
        publisher.publish(vec![agentd_kv::KvEvent::Cleared]);
    }
    let mut dealer = DealerSocket::new();
    dealer
        .connect(&local(publisher.replay_endpoint().expect("replay")))
        .await
        .expect("connect");
    // The publisher thread may still be encoding: ask until all 5 went out.
    let mut seqs = Vec::new();
    for _ in 0..50 {
        let req = ZmqMessage::try_from(vec![
            Bytes::new(),
            Bytes::copy_from_slice(&0u64.to_be_bytes()),
        ])
        .expect("frames");
        dealer.send(req).await.expect("request");
        seqs.clear();
        loop {
            let f = frames(dealer.recv().await.expect("answer"));
            let s = seq_of(&f[2]);
            if s == -1 {
                assert!(f[1].is_empty() && f[3].is_empty(), "vLLM's end marker");
                break;
            }
            seqs.push(s);
        }
        if seqs.last() == Some(&4) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seqs, vec![2, 3, 4], "only the last buffer_steps batches");
}
