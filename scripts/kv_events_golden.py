"""KV-event wire goldens from vLLM's own encoder, and a check that vLLM's own
decoder reads what agentd publishes.

  make:  python scripts/kv_events_golden.py make crates/kvevents/tests/fixtures
         reads cases.json there, writes NAME.msgpack for each case with
         msgspec's encoder over vllm.distributed.kv_events.KVEventBatch
         (the Rust test `wire_matches_vllm_goldens` compares byte for byte).
  check: python scripts/kv_events_golden.py check DIR
         DIR holds payloads captured from agentd's ZMQ socket (NNNNNN.msgpack,
         written by the test `subscriber_rebuilds_the_allocators_hashes` when
         AGENTD_KV_EVENTS_DUMP=DIR) and expected.json (the allocator's cached
         hashes at the end); decodes every payload with vLLM's KVEventBatch
         decoder, replays it, and compares.

Needs a vLLM venv (benches/install_vllm.sh): /var/tmp/vllm-venv/bin/python.
"""

import json
import pathlib
import sys

import msgspec
from vllm.distributed.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    MEDIUM_GPU,
)


def event(e, block_size):
    t = e["type"]
    if t == "BlockStored":
        return BlockStored(
            block_hashes=e["block_hashes"],
            parent_block_hash=e["parent_block_hash"],
            token_ids=e["token_ids"],
            block_size=block_size,
            lora_id=None,
            medium=MEDIUM_GPU,
            lora_name=None,
        )
    if t == "BlockRemoved":
        return BlockRemoved(block_hashes=e["block_hashes"], medium=MEDIUM_GPU)
    if t == "AllBlocksCleared":
        return AllBlocksCleared()
    raise ValueError(t)


def make(d):
    enc = msgspec.msgpack.Encoder()
    cases = json.loads((d / "cases.json").read_text())
    for c in cases:
        batch = KVEventBatch(
            ts=c["ts"],
            events=[event(e, c["block_size"]) for e in c["events"]],
            data_parallel_rank=c["rank"],
        )
        (d / f"{c['name']}.msgpack").write_bytes(enc.encode(batch))
        print(f"wrote {c['name']}.msgpack")


def check(d):
    dec = msgspec.msgpack.Decoder(type=KVEventBatch)
    cached = set()
    files = sorted(d.glob("*.msgpack"))
    ranks = set()
    n_events = 0
    for f in files:
        batch = dec.decode(f.read_bytes())
        ranks.add(batch.data_parallel_rank)
        for e in batch.events:
            n_events += 1
            if isinstance(e, BlockStored):
                assert e.medium == MEDIUM_GPU and e.lora_id is None
                assert len(e.token_ids) == len(e.block_hashes) * e.block_size
                for h in e.block_hashes:
                    assert h not in cached, f"{f.name}: stored twice {h}"
                    cached.add(h)
            elif isinstance(e, BlockRemoved):
                for h in e.block_hashes:
                    assert h in cached, f"{f.name}: removed unknown {h}"
                    cached.remove(h)
            else:
                cached.clear()
    expected = set(json.loads((d / "expected.json").read_text())["cached"])
    assert cached == expected, f"{len(cached)} rebuilt vs {len(expected)} cached"
    print(
        f"vLLM KVEventBatch decoded {len(files)} agentd batches, {n_events} events, "
        f"ranks {sorted(ranks)}; rebuilt {len(cached)} cached hashes == allocator's"
    )


if __name__ == "__main__":
    mode, path = sys.argv[1], pathlib.Path(sys.argv[2])
    {"make": make, "check": check}[mode](path)
