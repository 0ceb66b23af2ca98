#!/usr/bin/env python3
"""Table (stdout, markdown) and one plot per level of a benches/pair.sh run.

usage: pair_report.py DIR A_NAME B_NAME CONC
DIR holds c<N>-pass<P>-{a,b}.json (`agentd bench --json`, one row each).
Both arms of a pass ran at the same moment, so A / B of one pass is the
comparison; the mean of the passes cancels the cores' difference (pair.sh
runs an even number, alternating the cores). With three passes or more the
summary adds a 95% interval of the mean ratio (Student's t over the
passes' ratios; the cores' difference counts as spread, so the interval is
a conservative one). Stdlib only; the plot is benches/lib/abba_report.py's.
"""
import glob
import json
import math
import os
import re
import subprocess
import sys

# Two-sided 95% Student's t quantiles by degrees of freedom (1-15); past 15
# the normal's 1.96 is within 8%, and 2.13 (df 15) is the safe side.
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
       2.201, 2.179, 2.160, 2.145, 2.131]


def passes(d, c):
    """The pass numbers of level `c` in `d`, ascending."""
    found = (re.search(r"-pass(\d+)-a\.json$", f) for f in glob.glob(f"{d}/c{c}-pass*-a.json"))
    return sorted(int(m.group(1)) for m in found if m)


def interval(xs):
    """(mean, half-width of its 95% interval); the half-width is nan under
    three values (one degree of freedom gives no useful bound)."""
    n = len(xs)
    mean = sum(xs) / n
    if n < 3:
        return mean, float("nan")
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return mean, T95[min(n - 1, len(T95)) - 1] * sd / math.sqrt(n)


def row(path):
    with open(path) as f:
        return json.load(f)["rows"][0]


def main():
    d, a_name, b_name, conc = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    here = os.path.dirname(os.path.abspath(__file__))
    print(f"| programs | pass | {a_name} steps/min | {b_name} steps/min | {a_name} / {b_name} "
          f"| {a_name} p50 / p99 s | {b_name} p50 / p99 s | hit/ideal {a_name} / {b_name} "
          f"| pauses {a_name} / {b_name} |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    summary = []
    for c in conc.split(","):
        ratios, p99 = [], {"a": [], "b": []}
        plot = []
        ps = passes(d, c)
        for p in ps:
            a = row(f"{d}/c{c}-pass{p}-a.json")
            b = row(f"{d}/c{c}-pass{p}-b.json")
            r = a["steps_per_min"] / b["steps_per_min"] if b["steps_per_min"] else float("nan")
            ratios.append(r)
            p99["a"].append(a["p99_step_s"])
            p99["b"].append(b["p99_step_s"])
            hit = lambda x: x["prefix_hit_rate"] / x["ideal_hit_rate"] if x["ideal_hit_rate"] else 1.0
            print(f"| {c} | {p} | {a['steps_per_min']:.0f} | {b['steps_per_min']:.0f} | {r:.2f} "
                  f"| {a['p50_step_s']:.2f} / {a['p99_step_s']:.2f} "
                  f"| {b['p50_step_s']:.2f} / {b['p99_step_s']:.2f} "
                  f"| {hit(a):.2f} / {hit(b):.2f} | {a['pauses']:.0f} / {b['pauses']:.0f} |")
            plot += [f"{a_name}{p}=c{c}-pass{p}-a.json", f"{b_name}{p}=c{c}-pass{p}-b.json"]
        subprocess.run([sys.executable, os.path.join(here, "abba_report.py"), f"c{c}.svg"] + plot,
                       cwd=d, check=True)
        mean, half = interval(ratios)
        p99_ratio, p99_half = interval([x / y if y else float("nan") for x, y in zip(p99["a"], p99["b"])])
        spread = "" if math.isnan(half) else (
            f", 95% interval {mean - half:.3f}-{mean + half:.3f}; p99 {a_name} / {b_name} "
            f"{p99_ratio:.2f} ± {p99_half:.2f}")
        n = len(ps)
        summary.append(f"- {c} programs: {a_name} / {b_name} **{mean:.3f}** "
                       f"(passes {', '.join(f'{r:.2f}' for r in ratios)}{spread}); p99 {a_name} "
                       f"{sum(p99['a']) / n:.2f} s, {b_name} {sum(p99['b']) / n:.2f} s (means); "
                       f"plot `c{c}.svg`.")
    print()
    print("\n".join(summary))


if __name__ == "__main__":
    main()
