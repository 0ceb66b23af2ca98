#!/usr/bin/env python3
"""Work conservation on a real server (issue 12): N programs x T turns on a
small KV pool, each turn followed by a tool wait; /metrics sampled every
second. Reports the one-second samples in which nothing ran while requests
waited (the engine idling with the pool held by tool-waiting programs), the
total time, and p50/p99 of the turn latency and of each program's first
response.

    python3 scripts/idle_probe.py http://127.0.0.1:8000 --programs 64 --turns 5

A burst (issue 12: first responses under a burst of programs with contexts
spread 1k-8k tokens): `--task 1000 --task-max 8000` draws each program's
task length uniformly in that range; `first_max_over_p50` is the criterion.

Standard library only (the CI machine's python has no extras). Token-id
prompts on /v1/completions, greedy, ignore_eos: exact context sizes.
"""

import argparse
import json
import os
import random
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benches", "lib"))
from prom import families  # noqa: E402


def post(base, path, body, timeout=600):
    req = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def metrics(base):
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        return families(r.read().decode())


def pct(xs, q):
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))]


def program(args, i, lat, first, errors):
    rng = random.Random(args.seed * 1000 + i)
    # A shared system prompt, then the program's own task.
    ctx = list(range(1, args.system + 1))
    task = rng.randint(args.task, max(args.task, args.task_max or 0))
    ctx += [rng.randrange(1, args.vocab) for _ in range(task)]
    pid = f"probe-{args.seed}-{i}"
    for turn in range(args.turns):
        body = {"model": args.model, "prompt": ctx, "max_tokens": args.output,
                "temperature": 0, "ignore_eos": True, "program_id": pid,
                "return_token_ids": True, "final": turn == args.turns - 1}
        t0 = time.monotonic()
        try:
            r = post(args.url, "/v1/completions", body)
        except Exception as e:  # noqa: BLE001 - any failure counts
            errors.append(f"{pid} turn {turn}: {e}")
            return
        dt = time.monotonic() - t0
        lat.append(dt)
        if turn == 0:
            first.append(dt)
        out = r["choices"][0].get("token_ids") or [1] * args.output
        ctx += list(out)
        ctx += [rng.randrange(1, args.vocab) for _ in range(args.tool_tokens)]
        time.sleep(rng.expovariate(1.0 / args.tool_s))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--model", default=None)
    ap.add_argument("--programs", type=int, default=64)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--system", type=int, default=64)
    ap.add_argument("--task", type=int, default=96)
    ap.add_argument("--task-max", type=int, default=None,
                    help="draw each program's task length uniformly in [--task, --task-max]")
    ap.add_argument("--output", type=int, default=16)
    ap.add_argument("--tool-tokens", type=int, default=48)
    ap.add_argument("--tool-s", type=float, default=2.0, help="mean tool time (exponential)")
    ap.add_argument("--vocab", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.model is None:
        with urllib.request.urlopen(args.url + "/v1/models", timeout=30) as r:
            args.model = json.loads(r.read())["data"][0]["id"]

    lat, first, errors, samples = [], [], [], []
    stop = threading.Event()

    def sampler():
        while not stop.is_set():
            try:
                m = metrics(args.url)
                samples.append((m.get("vllm:num_requests_running", 0.0),
                                m.get("vllm:num_requests_waiting", 0.0),
                                m.get("vllm:kv_cache_usage_perc", 0.0)))
            except Exception:  # noqa: BLE001 - a missed sample is not a result
                pass
            stop.wait(1.0)

    t0 = time.monotonic()
    threading.Thread(target=sampler, daemon=True).start()
    threads = [threading.Thread(target=program, args=(args, i, lat, first, errors))
               for i in range(args.programs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = time.monotonic() - t0
    stop.set()
    idle = [s for s in samples if s[0] == 0 and s[1] > 0]
    res = {
        "programs": args.programs, "turns": args.turns, "total_s": round(total, 2),
        "samples": len(samples), "idle_with_waiting": len(idle),
        "max_waiting_when_idle": max((s[1] for s in idle), default=0),
        "turn_p50_s": round(pct(lat, 0.5), 3), "turn_p99_s": round(pct(lat, 0.99), 3),
        "first_p50_s": round(pct(first, 0.5), 3), "first_max_s": round(max(first, default=0), 3),
        "first_max_over_p50": round(max(first, default=0) / pct(first, 0.5), 2) if first else None,
        "errors": len(errors),
    }
    print(json.dumps(res))
    for e in errors[:5]:
        print("error:", e)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
