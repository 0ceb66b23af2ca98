#!/usr/bin/env python3
"""Table (stdout, markdown) and one plot per level of a benches/pair.sh run.

usage: pair_report.py DIR A_NAME B_NAME CONC
DIR holds c<N>-pass<P>-{a,b}.json (`agentd bench --json`, one row each).
Both arms of a pass ran at the same moment, so A / B of one pass is the
comparison; the mean of the passes cancels the cores' difference. Stdlib
only; the plot is benches/lib/abba_report.py's.
"""
import json
import os
import subprocess
import sys


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
        for p in (1, 2):
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
        mean = sum(ratios) / len(ratios)
        summary.append(f"- {c} programs: {a_name} / {b_name} **{mean:.2f}** "
                       f"(passes {ratios[0]:.2f}, {ratios[1]:.2f}); p99 {a_name} "
                       f"{sum(p99['a']) / 2:.2f} s, {b_name} {sum(p99['b']) / 2:.2f} s (means); "
                       f"plot `c{c}.svg`.")
    print()
    print("\n".join(summary))


if __name__ == "__main__":
    main()
