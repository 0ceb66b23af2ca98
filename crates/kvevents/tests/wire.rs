//! The encoder against vLLM's own msgspec encoder: `fixtures/NAME.msgpack` were
//! written by `scripts/kv_events_golden.py make` from `fixtures/cases.json`.

use std::path::PathBuf;

use agentd_kv::hash::hash_block;
use agentd_kv::KvEvent;
use agentd_kvevents::wire::{coalesce, encode_batch, wire_hash, WireEvent};
use serde_json::Value;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("u64"))
        .collect()
}

fn wire_event(e: &Value) -> WireEvent {
    match e["type"].as_str().expect("type") {
        "BlockStored" => WireEvent::BlockStored {
            block_hashes: u64s(&e["block_hashes"]),
            parent_block_hash: e["parent_block_hash"].as_u64(),
            token_ids: u64s(&e["token_ids"])
                .into_iter()
                .map(|t| t as u32)
                .collect(),
        },
        "BlockRemoved" => WireEvent::BlockRemoved {
            block_hashes: u64s(&e["block_hashes"]),
        },
        "AllBlocksCleared" => WireEvent::AllBlocksCleared,
        other => panic!("unknown event {other}"),
    }
}

#[test]
fn wire_matches_vllm_goldens() {
    let cases: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("cases.json")).unwrap())
            .unwrap();
    assert_eq!(cases.len(), 3);
    for c in &cases {
        let name = c["name"].as_str().unwrap();
        let events: Vec<WireEvent> = c["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(wire_event)
            .collect();
        let ours = encode_batch(
            c["ts"].as_f64().unwrap(),
            &events,
            c["block_size"].as_u64().unwrap() as usize,
            c["rank"].as_u64().unwrap() as u32,
        );
        let golden = std::fs::read(fixtures().join(format!("{name}.msgpack"))).unwrap();
        assert_eq!(
            ours, golden,
            "{name}: agentd's bytes differ from vLLM's msgspec encoder"
        );
    }
}

#[test]
fn a_chain_stored_in_one_step_is_one_block_stored() {
    let a = hash_block(None, &[1, 2], 0);
    let b = hash_block(Some(a), &[3, 4], 0);
    let other = hash_block(None, &[9, 9], 0);
    let stored = |hash, parent, tokens: &[u32]| KvEvent::Stored {
        hash,
        parent,
        tokens: tokens.to_vec(),
    };
    let got = coalesce(vec![
        KvEvent::Removed { hash: other },
        KvEvent::Removed { hash: b },
        stored(a, None, &[1, 2]),
        stored(b, Some(a), &[3, 4]),
        // Another program's block: not a continuation of the chain.
        stored(other, None, &[9, 9]),
        KvEvent::Cleared,
    ]);
    assert_eq!(
        got,
        vec![
            WireEvent::BlockRemoved {
                block_hashes: vec![wire_hash(other), wire_hash(b)]
            },
            WireEvent::BlockStored {
                block_hashes: vec![wire_hash(a), wire_hash(b)],
                parent_block_hash: None,
                token_ids: vec![1, 2, 3, 4],
            },
            WireEvent::BlockStored {
                block_hashes: vec![wire_hash(other)],
                parent_block_hash: None,
                token_ids: vec![9, 9],
            },
            WireEvent::AllBlocksCleared,
        ]
    );
}
