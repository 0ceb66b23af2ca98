//! KV events from the real engine (tiny Qwen3 fixture): what a subscriber
//! rebuilds from the events the engine hands its sink, step by step, is
//! exactly the set of full blocks the engine computed (large pool: nothing
//! evicted); under memory pressure (pauses, evictions, two replicas) every
//! event is a real transition and the rebuilt sets stay within what was
//! computed.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentd_engine::{Engine, EngineConfig, Event, GenerateRequest, KvEventSink};
use agentd_kv::hash::hash_blocks;
use agentd_kv::{BlockHash, KvEvent};
use agentd_models::Model;
use agentd_runtime::SamplingParams;

const BS: usize = 4;

type Log = Arc<Mutex<Vec<(usize, Vec<KvEvent>)>>>;

fn engine(replicas: usize, num_blocks: usize) -> (Engine, Log) {
    let log: Log = Arc::default();
    let sink_log = log.clone();
    let cfg = EngineConfig {
        replicas,
        num_blocks,
        block_size: BS,
        max_num_batched_tokens: 32,
        threads_per_replica: Some(1),
        kv_events: Some(KvEventSink::new(move |r, ev| {
            sink_log.lock().expect("log").push((r, ev));
        })),
        ..EngineConfig::default()
    };
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/golden/gqa2-untied");
    (
        Engine::with_model(Arc::new(Model::load(&dir).expect("model")), cfg)
            .expect("engine starts"),
        log,
    )
}

fn generate(e: &Engine, program: &str, prompt: Vec<u32>, final_request: bool) -> Vec<u32> {
    let mut s = e
        .submit(GenerateRequest {
            program: Some(program.to_string()),
            prompt,
            sampling: SamplingParams {
                max_tokens: 5,
                ignore_eos: true,
                ..SamplingParams::greedy()
            },
            final_request,
            parent_program: None,
            cache_salt: 0,
            group: None,
            tool: None,
        })
        .expect("accepted");
    let mut out = Vec::new();
    loop {
        match s.blocking_next() {
            Some(Event::Token(t)) => out.push(t.token_id),
            Some(Event::Finished { .. }) => return out,
            None => panic!("stream ended without Finished"),
        }
    }
}

/// Three turns of `n` programs at once (threads), each turn extending the
/// program's context; returns the hashes of every full block computed.
fn churn(e: &Engine, n: usize) -> HashSet<BlockHash> {
    let handles: Vec<_> = (0..n)
        .map(|p| {
            let e = e.clone();
            std::thread::spawn(move || {
                // Programs 0/1, 2/3, ... share a 12-token system prefix.
                let mut ctx: Vec<u32> = (0..12).map(|i| (p as u32 / 2) * 50 + i).collect();
                let mut computed = HashSet::new();
                for turn in 0..3u32 {
                    ctx.extend((0..6).map(|i| 300 + p as u32 * 10 + turn + i));
                    let out = generate(&e, &format!("p{p}"), ctx.clone(), turn == 2);
                    // The last sampled token is never computed.
                    let mut done = ctx.clone();
                    done.extend(&out[..out.len() - 1]);
                    computed.extend(hash_blocks(None, &done, BS, 0));
                    ctx.extend(out);
                }
                computed
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().expect("program thread"))
        .collect()
}

/// Replays the log per replica, checking each event is a real transition.
fn rebuild(log: &Log) -> (HashMap<usize, HashSet<BlockHash>>, usize) {
    let mut sets: HashMap<usize, HashSet<BlockHash>> = HashMap::new();
    let mut removed = 0;
    for (r, events) in log.lock().expect("log").iter() {
        let set = sets.entry(*r).or_default();
        for e in events {
            match e {
                KvEvent::Stored { hash, .. } => assert!(set.insert(*hash), "stored twice"),
                KvEvent::Removed { hash } => {
                    assert!(set.remove(hash), "removed an unknown hash");
                    removed += 1;
                }
                KvEvent::Cleared => set.clear(),
            }
        }
    }
    (sets, removed)
}

#[test]
fn events_rebuild_exactly_the_computed_blocks() {
    let (e, log) = engine(1, 256);
    let computed = churn(&e, 4);
    assert!(computed.len() > 20);
    // The last step's events are handed over right after its tokens went out.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (sets, removed) = rebuild(&log);
        let got = sets.get(&0).cloned().unwrap_or_default();
        if got == computed || Instant::now() > deadline {
            assert_eq!(removed, 0, "nothing evicted from a large pool");
            assert_eq!(got, computed, "rebuilt set == every full block computed");
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn events_stay_consistent_under_pauses_and_evictions() {
    // 2 replicas x 20 blocks of 4 tokens for 8 programs of ~45 tokens.
    let (e, log) = engine(2, 20);
    let computed = churn(&e, 8);
    let (sets, removed) = rebuild(&log);
    assert!(removed > 0, "the small pool evicted");
    assert_eq!(sets.len(), 2, "both replicas published");
    for (r, set) in &sets {
        assert!(set.len() <= 20, "replica {r}: {} cached > pool", set.len());
        assert!(
            set.is_subset(&computed),
            "replica {r}: cached a block nobody computed"
        );
    }
}
