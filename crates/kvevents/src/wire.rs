//! vLLM's KV-event wire format, byte for byte as its msgspec encoder writes it
//! (`vllm.distributed.kv_events`, goldens in `tests/fixtures/`):
//!
//! * a batch is `EventBatch(array_like=True)`: `[ts: float64, [events], data_parallel_rank]`;
//! * an event is a tagged struct (`tag=True`, not array-like): a map whose
//!   first key is `"type"` (the class name), then the fields in declaration
//!   order; fields with defaults are omitted when default (`omit_defaults`),
//!   required ones are always written, `None` as nil:
//!   `BlockStored{block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name}`,
//!   `BlockRemoved{block_hashes, medium}`, `AllBlocksCleared{}`.
//!
//! Block hashes are integers, as vLLM publishes them by default
//! (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`: the low 64 bits of its digest) and
//! as every Dynamo release decodes them (`i64 | u64`): here the low 64 bits of
//! agentd's 128-bit chained hash. Dynamo keys its radix tree on these values
//! and on its own hash of `token_ids`, so only their consistency between
//! stored and removed events matters.

use agentd_kv::{BlockHash, KvEvent};
use rmp::encode;

/// Where the blocks live; agentd's cache is device memory only.
pub const MEDIUM_GPU: &str = "GPU";

/// The integer a block hash is published as.
pub fn wire_hash(h: BlockHash) -> u64 {
    h.0 as u64
}

/// One event as published: consecutive stores of one chain (a program's
/// blocks filled in the same step) are one `BlockStored`, consecutive
/// removals one `BlockRemoved`, like vLLM's per-request `cache_full_blocks`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireEvent {
    BlockStored {
        block_hashes: Vec<u64>,
        parent_block_hash: Option<u64>,
        token_ids: Vec<u32>,
    },
    BlockRemoved {
        block_hashes: Vec<u64>,
    },
    AllBlocksCleared,
}

/// Groups the allocator's transitions into wire events, keeping their order.
pub fn coalesce(events: Vec<KvEvent>) -> Vec<WireEvent> {
    let mut out: Vec<WireEvent> = Vec::new();
    for e in events {
        match (e, out.last_mut()) {
            (
                KvEvent::Stored {
                    hash,
                    parent,
                    tokens,
                },
                Some(WireEvent::BlockStored {
                    block_hashes,
                    token_ids,
                    ..
                }),
            ) if parent.map(wire_hash) == block_hashes.last().copied() => {
                block_hashes.push(wire_hash(hash));
                token_ids.extend(tokens);
            }
            (KvEvent::Removed { hash }, Some(WireEvent::BlockRemoved { block_hashes })) => {
                block_hashes.push(wire_hash(hash));
            }
            (
                KvEvent::Stored {
                    hash,
                    parent,
                    tokens,
                },
                _,
            ) => out.push(WireEvent::BlockStored {
                block_hashes: vec![wire_hash(hash)],
                parent_block_hash: parent.map(wire_hash),
                token_ids: tokens,
            }),
            (KvEvent::Removed { hash }, _) => out.push(WireEvent::BlockRemoved {
                block_hashes: vec![wire_hash(hash)],
            }),
            (KvEvent::Cleared, _) => out.push(WireEvent::AllBlocksCleared),
        }
    }
    out
}

/// Encodes one `KVEventBatch` as vLLM's msgspec encoder does.
pub fn encode_batch(ts: f64, events: &[WireEvent], block_size: usize, dp_rank: u32) -> Vec<u8> {
    let mut buf = Vec::with_capacity(64 + events.len() * 32);
    // Writes into a Vec cannot fail, so their `Result`s carry nothing.
    let w = &mut buf;
    let _ = encode::write_array_len(w, 3);
    let _ = encode::write_f64(w, ts);
    let _ = encode::write_array_len(w, events.len() as u32);
    for e in events {
        encode_event(w, e, block_size);
    }
    let _ = encode::write_uint(w, u64::from(dp_rank));
    buf
}

fn encode_event(w: &mut Vec<u8>, e: &WireEvent, block_size: usize) {
    match e {
        WireEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
        } => {
            let _ = encode::write_map_len(w, 8);
            field_str(w, "type", "BlockStored");
            key(w, "block_hashes");
            uints(w, block_hashes.iter().copied());
            key(w, "parent_block_hash");
            match parent_block_hash {
                Some(h) => {
                    let _ = encode::write_uint(w, *h);
                }
                None => {
                    let _ = encode::write_nil(w);
                }
            }
            key(w, "token_ids");
            uints(w, token_ids.iter().map(|&t| u64::from(t)));
            key(w, "block_size");
            let _ = encode::write_uint(w, block_size as u64);
            key(w, "lora_id");
            let _ = encode::write_nil(w);
            field_str(w, "medium", MEDIUM_GPU);
            key(w, "lora_name");
            let _ = encode::write_nil(w);
        }
        WireEvent::BlockRemoved { block_hashes } => {
            let _ = encode::write_map_len(w, 3);
            field_str(w, "type", "BlockRemoved");
            key(w, "block_hashes");
            uints(w, block_hashes.iter().copied());
            field_str(w, "medium", MEDIUM_GPU);
        }
        WireEvent::AllBlocksCleared => {
            let _ = encode::write_map_len(w, 1);
            field_str(w, "type", "AllBlocksCleared");
        }
    }
}

fn key(w: &mut Vec<u8>, k: &str) {
    let _ = encode::write_str(w, k);
}

fn field_str(w: &mut Vec<u8>, k: &str, v: &str) {
    key(w, k);
    let _ = encode::write_str(w, v);
}

fn uints(w: &mut Vec<u8>, xs: impl ExactSizeIterator<Item = u64>) {
    let _ = encode::write_array_len(w, xs.len() as u32);
    for x in xs {
        let _ = encode::write_uint(w, x);
    }
}
