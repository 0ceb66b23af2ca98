"""KV-event wire goldens from vLLM's own encoder, and a check that vLLM's own
decoder reads what agentd publishes.

  make:  python scripts/kv_events_golden.py make crates/kvevents/tests/fixtures
         reads cases.json there, writes NAME.msgpack for each case with
         msgspec's encoder over vllm.distributed.kv_events.KVEventBatch
         (the Rust test `wire_matches_vllm_goldens` compares byte for byte).
  check: python scripts/kv_events_golden.py check DIR
         DIR holds payloads captured from agentd's ZMQ socket (NNNNNN.msgpack,
         written by the test `subscriber_rebuilds_the_allocators_hashes` when
         AGENTD_KV_EVENTS_DUMP=DIR, or by `capture`) and expected.json (the
         allocator's cached hashes at the end) and/or sequences.json (the
         token sequences sent); decodes every payload with vLLM's KVEventBatch
         decoder, replays it, and compares: the rebuilt set with expected.json;
         every stored chain's tokens with a prefix of a sequence sent, and
         every sequence's full prompt blocks with a stored chain.
  capture: python scripts/kv_events_golden.py capture URL ENDPOINT DIR
         against a running `agentd serve URL --kv-events-config` publishing on
         ENDPOINT (tcp://127.0.0.1:PORT): subscribes, sends completions with
         token-id prompts sharing a prefix, writes every received payload as
         SEQ.msgpack (sequence numbers must be contiguous) and sequences.json.

Needs a vLLM venv (benches/install_vllm.sh): /var/tmp/vllm-venv/bin/python.
"""

import json
import pathlib
import random
import sys
import time
import urllib.request

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
    chain = {}  # hash -> (parent hash, tokens)
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
                parent = e.parent_block_hash
                for i, h in enumerate(e.block_hashes):
                    assert h not in cached, f"{f.name}: stored twice {h}"
                    cached.add(h)
                    toks = e.token_ids[i * e.block_size : (i + 1) * e.block_size]
                    chain[h] = (parent, list(toks))
                    parent = h
            elif isinstance(e, BlockRemoved):
                for h in e.block_hashes:
                    assert h in cached, f"{f.name}: removed unknown {h}"
                    cached.remove(h)
            else:
                cached.clear()
    if (d / "expected.json").exists():
        expected = set(json.loads((d / "expected.json").read_text())["cached"])
        assert cached == expected, f"{len(cached)} rebuilt vs {len(expected)} cached"
        what = f"rebuilt {len(cached)} cached hashes == allocator's"
    else:
        what = f"{len(cached)} hashes cached at the end"
    if (d / "sequences.json").exists():
        what += "; " + check_sequences(json.loads((d / "sequences.json").read_text()), chain)
    print(
        f"vLLM KVEventBatch decoded {len(files)} agentd batches, {n_events} events, "
        f"ranks {sorted(ranks)}; {what}"
    )


def path_tokens(chain, h):
    """The tokens from the chain's root to block h (None if a parent is unknown)."""
    out = []
    while h is not None:
        if h not in chain:
            return None
        parent, toks = chain[h]
        out[:0] = toks
        h = parent
    return out


def check_sequences(spec, chain):
    bs, seqs = spec["block_size"], spec["sequences"]
    # Every stored block: its path is a block-aligned prefix of a sequence sent.
    for h in chain:
        toks = path_tokens(chain, h)
        assert toks is not None, f"block {h}: its parent chain was never stored"
        assert any(s["tokens"][: len(toks)] == toks for s in seqs), f"block {h}: tokens sent by nobody"
    # Every sequence's full prompt blocks were stored (the prompt is computed).
    paths = {tuple(path_tokens(chain, h)) for h in chain}
    for s in seqs:
        full = s["prompt_len"] // bs * bs
        for k in range(bs, full + 1, bs):
            assert tuple(s["tokens"][:k]) in paths, f"sequence {s['id']}: block ending at {k} not stored"
    return f"every stored chain is a prefix of one of the {len(seqs)} sequences sent and every prompt block was stored"


def capture(url, endpoint, d):
    import zmq

    d.mkdir(parents=True, exist_ok=True)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    time.sleep(1.0)  # the slow-joiner: let the subscription reach the publisher
    metrics = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    bs = int(metrics.split('vllm:cache_config_info{block_size="')[1].split('"')[0])
    rng = random.Random(7)
    prefix = [rng.randrange(1000, 100000) for _ in range(3 * bs)]
    seqs = []
    for i in range(6):
        prompt = prefix + [rng.randrange(1000, 100000) for _ in range(rng.randrange(bs, 3 * bs))]
        body = {"prompt": prompt, "max_tokens": 2 * bs, "ignore_eos": True, "temperature": 0,
                "return_token_ids": True, "program_id": f"kv-golden-{i}"}
        req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                     {"content-type": "application/json"})
        out = json.loads(urllib.request.urlopen(req, timeout=120).read())
        gen = out["choices"][0]["token_ids"]
        seqs.append({"id": i, "prompt_len": len(prompt), "tokens": prompt + gen})
    got, last, idle = 0, None, time.time()
    while time.time() - idle < 2.0:
        if sub.poll(100):
            topic, seq, payload = sub.recv_multipart()
            seq = int.from_bytes(seq, "big")
            assert last is None or seq == last + 1, f"sequence gap: {last} -> {seq}"
            last = seq
            (d / f"{seq:06d}.msgpack").write_bytes(payload)
            got += 1
            idle = time.time()
    assert got > 0, f"no KV events from {endpoint}"
    (d / "sequences.json").write_text(json.dumps({"block_size": bs, "sequences": seqs}))
    print(f"captured {got} batches (topic {topic.decode()!r}, seq contiguous up to {last}) "
          f"for {len(seqs)} requests into {d}")


if __name__ == "__main__":
    if sys.argv[1] == "capture":
        capture(sys.argv[2].rstrip("/"), sys.argv[3], pathlib.Path(sys.argv[4]))
    else:
        mode, path = sys.argv[1], pathlib.Path(sys.argv[2])
        {"make": make, "check": check}[mode](path)
