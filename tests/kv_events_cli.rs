//! `agentd serve --kv-events-config` end to end: the real binary, a real
//! completion over HTTP, and vLLM-format KV events fetched over ZMQ from the
//! replay socket (vLLM's protocol): the prompt's full blocks arrive as one
//! `BlockStored` chain with its token ids, from data-parallel rank 0.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use common::{http, spawn_serve};
use rmpv::Value as Msg;
use serde_json::{json, Value};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// The replay endpoint the server logged (`tcp://*:0` resolved).
fn replay_endpoint(logs: &mpsc::Receiver<String>) -> String {
    while let Ok(line) = logs.recv_timeout(Duration::from_secs(10)) {
        if line.contains("publishing KV events") {
            let ep = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("replay="))
                .expect("replay endpoint logged");
            return ep.trim_matches('"').replace("0.0.0.0", "127.0.0.1");
        }
    }
    panic!("no KV events log line");
}

/// Every batch the publisher still buffers, as (seq, payload).
async fn replay_all(endpoint: &str) -> Vec<(i64, Bytes)> {
    let mut d = DealerSocket::new();
    d.connect(endpoint).await.expect("connect replay");
    let req = ZmqMessage::try_from(vec![
        Bytes::new(),
        Bytes::copy_from_slice(&0u64.to_be_bytes()),
    ])
    .expect("frames");
    d.send(req).await.expect("request");
    let mut out = Vec::new();
    loop {
        let f = d.recv().await.expect("answer").into_vec();
        let seq = i64::from_be_bytes(f[2].as_ref().try_into().expect("seq"));
        if seq == -1 {
            return out;
        }
        assert_eq!(f[1].as_ref(), b"kv-test", "topic");
        out.push((seq, f[3].clone()));
    }
}

fn field<'a>(m: &'a [(Msg, Msg)], k: &str) -> &'a Msg {
    &m.iter()
        .find(|(key, _)| key.as_str() == Some(k))
        .expect(k)
        .1
}

#[test]
fn serve_publishes_vllm_kv_events() {
    let cfg = r#"{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:0","replay_endpoint":"tcp://*:0","topic":"kv-test"}"#;
    let (_server, addr, logs) = spawn_serve(
        "serve-cli-cache",
        ["--num-kv-blocks", "64", "--kv-events-config", cfg],
    );
    let replay = replay_endpoint(&logs);

    // 40 prompt tokens = 2 full blocks of 16 (the third is partial).
    let prompt: Vec<u32> = (100..140).collect();
    let req = json!({"prompt": prompt, "max_tokens": 2, "temperature": 0, "ignore_eos": true, "program_id": "ev"});
    let (status, body) = http(&addr, "POST", "/v1/completions", Some(&req));
    assert_eq!(status, 200, "{body}");
    let _: Value = serde_json::from_str(&body).expect("json");

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut stored: Vec<u32> = Vec::new();
    let mut hashes = 0;
    for _ in 0..50 {
        let batches = rt.block_on(replay_all(&replay));
        stored.clear();
        hashes = 0;
        for (i, (seq, payload)) in batches.iter().enumerate() {
            assert_eq!(*seq, i as i64, "sequence numbers from 0, no gap");
            let b = rmpv::decode::read_value(&mut &payload[..]).expect("msgpack");
            let b = b.as_array().expect("[ts, events, rank]");
            assert_eq!(b[2].as_u64(), Some(0), "data_parallel_rank");
            for e in b[1].as_array().expect("events") {
                let m = e.as_map().expect("tagged map");
                if field(m, "type").as_str() == Some("BlockStored") {
                    assert_eq!(field(m, "block_size").as_u64(), Some(16));
                    assert_eq!(field(m, "medium").as_str(), Some("GPU"));
                    hashes += field(m, "block_hashes").as_array().expect("hashes").len();
                    stored.extend(
                        field(m, "token_ids")
                            .as_array()
                            .expect("ids")
                            .iter()
                            .map(|t| t.as_u64().expect("id") as u32),
                    );
                }
            }
        }
        if hashes >= 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(hashes, 2, "the prompt's two full blocks");
    assert_eq!(stored, prompt[..32], "their token ids, in order");
}
