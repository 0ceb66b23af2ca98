"""Watches agentd workers behind Dynamo (benches/dynamo.sh): where programs ran, and whether
each worker's KV-event stream stays consistent.

    python benches/dynamo_watch.py --worker w0=http://127.0.0.1:18201,tcp://127.0.0.1:20080 \
        --worker w1=... --out watch.json --stop-file STOP [--max-s 900]
      (worker: NAME=URL,ZMQ[,REPLAY])

- Placement, server side: polls every worker's GET /programs (live programs, their steps)
  every --poll-s; a program id seen on two workers is a broken session affinity.
- KV events: subscribes to every worker's vLLM-format ZMQ stream (multipart topic, 8-byte
  sequence number, msgpack [ts, [events], rank]), first fetching the history from its replay
  socket (vLLM's protocol: [identity, "", start_seq]), and replays it: sequence gaps, a block
  stored twice, a removal of an unknown block, a block stored on a parent that is not cached
  (a chain no prefix tree can hold: Dynamo's indexer logs "Failed to find parent block")
  are inconsistencies.
- At the end (the stop file appears, SIGTERM, or --max-s): each worker's /metrics counters,
  or "down"; writes --out as JSON and prints a summary line per worker.
Needs pyzmq and msgspec (the vLLM venv has both).
"""

import argparse
import json
import os
import re
import signal
import time
import urllib.request

import msgspec
import zmq


class Worker:
    def __init__(self, name, url, endpoint, replay, ctx, dump=None):
        self.dump = None
        if dump:
            self.dump = os.path.join(dump, name)
            os.makedirs(self.dump, exist_ok=True)
        self.name, self.url, self.endpoint, self.replay = name, url.rstrip("/"), endpoint, replay
        self.programs = {}  # id -> max steps seen
        # Programs already there at the first poll (an earlier run's, idle until their lease
        # ends) count only once they take a step.
        self.baseline = None
        self.polls_ok = self.polls_failed = 0
        self.kv = {"batches": 0, "events": 0, "stored": 0, "removed": 0, "cleared": 0,
                   "gaps": 0, "stored_twice": 0, "removed_unknown": 0, "orphan_parent": 0, "removed_with_children": 0,
                   "first_seq": None, "last_seq": None, "replayed": 0, "max_cached": 0}
        self.cached = set()
        self.parent = {}  # cached hash -> its parent hash
        self.children = {}  # hash -> number of cached children
        self.sub = None
        if endpoint:
            self.sub = ctx.socket(zmq.SUB)
            self.sub.setsockopt(zmq.SUBSCRIBE, b"")
            self.sub.connect(endpoint)
        if replay:
            self.fetch_history(ctx)

    def fetch_history(self, ctx):
        """Every batch the worker still buffers, before the live stream (which the SUB
        socket queues meanwhile; batches seen twice are skipped by sequence number)."""
        d = ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.connect(self.replay)
        d.send_multipart([b"", (0).to_bytes(8, "big")])
        deadline = time.time() + 10
        while time.time() < deadline:
            if not d.poll(1000):
                continue
            frames = d.recv_multipart()  # ["", topic, seq, payload]
            if int.from_bytes(frames[2], "big", signed=True) == -1:
                break
            self.on_batch(frames[1:])
            self.kv["replayed"] += 1
        d.close()

    def poll_programs(self):
        try:
            with urllib.request.urlopen(self.url + "/programs", timeout=2) as r:
                live = json.loads(r.read())
            if self.baseline is None:
                self.baseline = {p["id"]: p.get("steps", 0) for p in live}
            for p in live:
                pid, steps = p["id"], p.get("steps", 0)
                if pid in self.baseline and steps <= self.baseline[pid]:
                    continue
                self.programs[pid] = max(self.programs.get(pid, 0), steps)
            self.polls_ok += 1
        except OSError:
            self.polls_failed += 1

    def on_batch(self, frames):
        if len(frames) != 3:
            self.kv["gaps"] += 1
            return
        seq = int.from_bytes(frames[1], "big")
        k = self.kv
        if k["last_seq"] is not None and seq <= k["last_seq"]:
            return  # already replayed
        if k["last_seq"] is not None and seq != k["last_seq"] + 1:
            k["gaps"] += 1
        k["first_seq"] = seq if k["first_seq"] is None else k["first_seq"]
        k["last_seq"] = seq
        k["batches"] += 1
        if self.dump:
            with open(os.path.join(self.dump, f"{seq:06d}.msgpack"), "wb") as f:
                f.write(frames[2])
        _ts, events, _rank = msgspec.msgpack.decode(frames[2])
        for e in events:
            k["events"] += 1
            kind = e.get("type") if isinstance(e, dict) else e[0]
            hashes = (e.get("block_hashes") if isinstance(e, dict) else e[1]) or []
            if kind == "BlockStored":
                parent = e.get("parent_block_hash") if isinstance(e, dict) else e[2]
                if parent is not None and parent not in self.cached:
                    k["orphan_parent"] += 1
                for h in hashes:
                    k["stored"] += 1
                    if h in self.cached:
                        k["stored_twice"] += 1
                    else:
                        self.cached.add(h)
                        self.parent[h] = parent
                        if parent is not None:
                            self.children[parent] = self.children.get(parent, 0) + 1
                    parent = h
            elif kind == "BlockRemoved":
                for h in hashes:
                    k["removed"] += 1
                    if h not in self.cached:
                        k["removed_unknown"] += 1
                        continue
                    if self.children.get(h, 0) > 0:
                        k["removed_with_children"] += 1
                    self.cached.discard(h)
                    p = self.parent.pop(h, None)
                    if p is not None and p in self.children:
                        self.children[p] -= 1
            else:
                k["cleared"] += 1
                self.cached.clear()
                self.parent.clear()
                self.children.clear()
        k["max_cached"] = max(k["max_cached"], len(self.cached))

    def final_metrics(self):
        names = ("agentd:requests_finished_total", "vllm:prefix_cache_hits_total",
                 "vllm:prefix_cache_queries_total", "vllm:num_requests_running",
                 "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total")
        try:
            with urllib.request.urlopen(self.url + "/metrics", timeout=2) as r:
                text = r.read().decode()
        except OSError as e:
            return f"down ({e.__class__.__name__})"
        out = {}
        for n in names:
            m = re.search(rf"^{re.escape(n)}\{{[^}}]*\}} (\S+)$", text, re.M)
            if m:
                out[n] = float(m.group(1))
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="append", required=True, help="NAME=URL[,ZMQ]")
    ap.add_argument("--out", required=True)
    ap.add_argument("--stop-file", required=True)
    ap.add_argument("--poll-s", type=float, default=0.5)
    ap.add_argument("--max-s", type=float, default=1800)
    ap.add_argument("--dump", default=None, help="write every batch as DIR/NAME/SEQ.msgpack")
    a = ap.parse_args()
    ctx = zmq.Context()
    workers = []
    for w in a.worker:
        name, rest = w.split("=", 1)
        url, ep, replay = (rest.split(",") + [None, None])[:3]
        workers.append(Worker(name, url, ep or None, replay or None, ctx, a.dump))
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("now", True))
    poller = zmq.Poller()
    by_sock = {}
    for w in workers:
        if w.sub is not None:
            poller.register(w.sub, zmq.POLLIN)
            by_sock[w.sub] = w
    start = time.time()
    next_poll = 0.0
    while not stop["now"] and not os.path.exists(a.stop_file) and time.time() - start < a.max_s:
        for sock, _ in poller.poll(50):
            while True:
                try:
                    by_sock[sock].on_batch(sock.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    break
        if time.time() >= next_poll:
            next_poll = time.time() + a.poll_s
            for w in workers:
                w.poll_programs()
    # Drain what is still queued, then summarise.
    for sock, w in by_sock.items():
        while True:
            try:
                w.on_batch(sock.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
    seen = {}
    for w in workers:
        for p in w.programs:
            seen.setdefault(p, []).append(w.name)
    split = sorted(p for p, ws in seen.items() if len(ws) > 1)
    doc = {"seconds": round(time.time() - start, 1), "programs_seen": len(seen),
           "programs_on_several_workers": split, "workers": {}}
    for w in workers:
        w.kv["cached_at_end"] = len(w.cached)
        doc["workers"][w.name] = {
            "url": w.url, "kv_events_endpoint": w.endpoint, "programs_seen": len(w.programs),
            "program_steps_seen": sum(w.programs.values()), "polls_ok": w.polls_ok,
            "polls_failed": w.polls_failed, "kv_events": w.kv, "metrics_at_end": w.final_metrics(),
        }
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    for name, d in doc["workers"].items():
        k = d["kv_events"]
        print(f"watch {name}: {d['programs_seen']} programs seen ({d['program_steps_seen']} steps), "
              f"/programs polls ok {d['polls_ok']} failed {d['polls_failed']}; KV events: "
              f"{k['batches']} batches seq {k['first_seq']}..{k['last_seq']} ({k['replayed']} replayed), "
              f"{k['gaps']} gaps, {k['stored']} stored, {k['removed']} removed, "
              f"{k['stored_twice']} stored twice, {k['removed_unknown']} unknown removals, "
              f"{k['orphan_parent']} stored on an uncached parent, {k['removed_with_children']} removed "
              f"while a child stayed cached, {k['cached_at_end']} cached at end; "
              f"metrics at end: {d['metrics_at_end']}")
    print(f"watch: {len(seen)} programs, {len(split)} seen on more than one worker")


if __name__ == "__main__":
    main()
