#!/usr/bin/env python3
"""Where requests' time went, from an agentd server log with
`RUST_LOG=agentd::trace=info` (markdown on stdout).

usage: trace_split.py LOG FROM_S TO_S
Takes the requests that finished between FROM_S and TO_S seconds after the
log's first request event and splits each one's time into *queue* (from
its submission, the first event of its span less the `queue_s` its
`admitted` event reports, to its first `admitted` or `restored` event)
and *run* (from there to `finished`). Then the queue wait by thirds of the
prompt length: a policy that orders its queue shortest first makes the
long third wait longer, where FCFS keeps the thirds level; a policy that
lets resident programs start at once (`started < 1 s`) makes the others
wait longer. Stdlib only.
"""
import datetime
import re
import statistics
import sys

EVENT = re.compile(r'(\S+Z)\s+INFO request\{request_id="([^"]+)"[^}]*? prompt_tokens=(\d+)[^}]*\}: '
                   r'agentd::trace: (\w+)(.*)')


def stamp(s):
    return datetime.datetime.fromisoformat(s.rstrip("Z")).replace(tzinfo=datetime.timezone.utc).timestamp()


def requests(log):
    reqs, t0 = {}, None
    with open(log) as f:
        for line in f:
            m = EVENT.match(line)
            if not m:
                continue
            t = stamp(m.group(1))
            t0 = t if t0 is None else t0
            rid, prompt, ev, rest = m.group(2), int(m.group(3)), m.group(4), m.group(5)
            r = reqs.setdefault(rid, {"prompt": prompt, "submit": t})
            if ev in ("admitted", "restored") and "start" not in r:
                r["start"] = t
                q = re.search(r"queue_s=([0-9.e-]+)", rest)
                if q:
                    r["submit"] = min(r["submit"], t - float(q.group(1)))
            elif ev == "finished":
                r["end"] = t
    return reqs, t0


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))]


def line(name, v):
    return (f"| {name} | {len(v)} | {statistics.mean(v):.1f} | {pct(v, .1):.1f} | {pct(v, .5):.1f} "
            f"| {pct(v, .9):.1f} | {pct(v, .99):.1f} |")


def main():
    log, a, b = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    reqs, t0 = requests(log)
    rows = [r for r in reqs.values() if "end" in r and "start" in r and a <= r["end"] - t0 <= b]
    if not rows:
        print("no request finished in the window")
        return
    print("| seconds | requests | mean | p10 | p50 | p90 | p99 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    print(line("queue", [r["start"] - r["submit"] for r in rows]))
    print(line("run", [r["end"] - r["start"] for r in rows]))
    print(line("end to end", [r["end"] - r["submit"] for r in rows]))
    fast = sum(1 for r in rows if r["start"] - r["submit"] < 1.0)
    print(f"\nstarted < 1 s after submission: {fast} of {len(rows)}\n")
    print("| prompt third | tokens | queue mean | queue p50 | queue p99 | end to end p99 |")
    print("|---|---|---:|---:|---:|---:|")
    rows.sort(key=lambda r: r["prompt"])
    n = len(rows)
    for i, part in enumerate((rows[: n // 3], rows[n // 3: 2 * n // 3], rows[2 * n // 3:])):
        if not part:
            continue
        q = [r["start"] - r["submit"] for r in part]
        e = [r["end"] - r["submit"] for r in part]
        print(f"| {('short', 'middle', 'long')[i]} | {part[0]['prompt']}-{part[-1]['prompt']} "
              f"| {statistics.mean(q):.1f} | {pct(q, .5):.1f} | {pct(q, .99):.1f} | {pct(e, .99):.1f} |")


if __name__ == "__main__":
    main()
