"""Engine lock hold time under a load, from /metrics (stdlib only).

Usage:
  python3 scripts/lock_hold.py http://127.0.0.1:8000 -- COMMAND [ARGS...]
  python3 scripts/lock_hold.py http://127.0.0.1:8000 --seconds 60

Scrapes /metrics, runs COMMAND (e.g. `agentd bench ... --concurrency 96`)
or waits the given seconds, scrapes again, and prints the quantiles of the
difference of the two histograms:

  agentd:engine_lock_hold_seconds       every critical section of the engine
      lock except idle re-plans: plans with work (submissions to route, a
      batch, pauses, restores, cancellations, lease expiries), commits,
      releases, subscriptions; from acquisition to release, a snapshot
      build for /metrics or /programs included.
  agentd:engine_lock_idle_hold_seconds  idle re-plans (a worker with nothing
      to run re-checking leases every 50 ms, or woken for nothing).
  agentd:step_forward_seconds           each step's model forward.
  agentd:step_sampling_seconds          each step's sampling (steps with
      logits rows); its sum over forward + sampling is sampling's share.

p50/p99 are interpolated inside the bucket as Prometheus'
histogram_quantile does; `<= le` is the bucket's upper bound (what the
engine's own Histogram::quantile_bound reports). Buckets: 5 us .. 1 s.
"""

import argparse
import re
import subprocess
import sys
import time
import urllib.request

NAMES = ("agentd:engine_lock_hold_seconds", "agentd:engine_lock_idle_hold_seconds",
         "agentd:step_forward_seconds", "agentd:step_sampling_seconds")
LINE = re.compile(r'^(?P<name>[^{\s]+)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$')


def scrape(base):
    """{name: {"buckets": {le: cumulative}, "sum": s, "count": n}}"""
    text = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    out = {n: {"buckets": {}, "sum": 0.0, "count": 0.0} for n in NAMES}
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        name, labels, value = m["name"], m["labels"], float(m["value"])
        for n in NAMES:
            if name == n + "_bucket":
                le = re.search(r'le="([^"]+)"', labels).group(1)
                out[n]["buckets"][float("inf") if le == "+Inf" else float(le)] = value
            elif name == n + "_sum":
                out[n]["sum"] = value
            elif name == n + "_count":
                out[n]["count"] = value
    return out


def delta(before, after):
    b = {le: after["buckets"][le] - before["buckets"].get(le, 0.0) for le in after["buckets"]}
    return {"buckets": b, "sum": after["sum"] - before["sum"],
            "count": after["count"] - before["count"]}


def quantile(h, q):
    """(interpolated value, bucket upper bound) of quantile q."""
    total = h["count"]
    if total <= 0:
        return float("nan"), float("nan")
    want = q * total
    lower, prev = 0.0, 0.0
    finite = [le for le in sorted(h["buckets"]) if le != float("inf")]
    for le in sorted(h["buckets"]):
        c = h["buckets"][le]
        if c >= want:
            if le == float("inf"):
                return finite[-1], le
            inside = (want - prev) / (c - prev) if c > prev else 1.0
            return lower + (le - lower) * inside, le
        lower, prev = le, c
    return finite[-1], float("inf")


def us(v):
    return "inf" if v == float("inf") else f"{v * 1e6:.1f} us"


def main():
    argv = sys.argv[1:]
    cmd = []
    if "--" in argv:
        cut = argv.index("--")
        argv, cmd = argv[:cut], argv[cut + 1:]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 usage="%(prog)s BASE (--seconds S | -- COMMAND [ARGS...])")
    ap.add_argument("base", help="server URL, e.g. http://127.0.0.1:8000")
    ap.add_argument("--seconds", type=float, help="wait this long instead of running a command")
    a = ap.parse_args(argv)
    base = a.base.rstrip("/")
    if not cmd and a.seconds is None:
        ap.error("give -- COMMAND or --seconds")
    before = scrape(base)
    t = time.time()
    rc = 0
    if cmd:
        rc = subprocess.call(cmd)
    else:
        time.sleep(a.seconds)
    wall = time.time() - t
    after = scrape(base)
    print(f"load: {wall:.1f} s{'' if not cmd else f', command exit {rc}'}")
    for n in NAMES:
        h = delta(before[n], after[n])
        if h["count"] <= 0:
            print(f"{n}: no sections")
            continue
        (p50, b50), (p99, b99) = quantile(h, 0.5), quantile(h, 0.99)
        print(f"{n}: {h['count']:.0f} sections ({h['count'] / wall:.0f}/s), "
              f"mean {us(h['sum'] / h['count'])}, p50 {us(p50)} (<= {us(b50)}), "
              f"p99 {us(p99)} (<= {us(b99)}), held {h['sum'] / wall * 100:.2f}% of the time")
    f = delta(before[NAMES[2]], after[NAMES[2]])
    s = delta(before[NAMES[3]], after[NAMES[3]])
    if f["sum"] + s["sum"] > 0:
        print(f"sampling: {s['sum'] / (f['sum'] + s['sum']) * 100:.1f}% of forward + sampling time")
    sys.exit(rc)


if __name__ == "__main__":
    main()
