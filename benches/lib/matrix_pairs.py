#!/usr/bin/env python3
"""The matrix summary of a `PAIRED=1 benches/matrix.sh` run (markdown on
stdout): one row per cell and concurrency, from each cell's pair.sh files.

usage: matrix_pairs.py OUT
OUT/<cell>/c<N>-pass<P>-{a,b}.json: arm a the program policy, b the
request policy, both at once on their own core, swapped every other pass
(pair.sh's PASSES). A ratio is the mean of the passes' same-moment ratios;
rates, p50 and p99 are the means of the passes. "Of own peak" is the
program policy's rate at this concurrency over its best in the cell.
Stdlib only.
"""
import glob
import os
import re
import sys

from pair_report import passes as pass_numbers, row


def hit(r):
    return r["prefix_hit_rate"] / r["ideal_hit_rate"] if r.get("ideal_hit_rate") else float("nan")


def cell_rows(d):
    levels = sorted({int(m.group(1)) for f in glob.glob(f"{d}/c*-pass1-a.json")
                     if (m := re.search(r"/c(\d+)-pass1-a\.json$", f))})
    out = []
    for c in levels:
        passes = [(row(f"{d}/c{c}-pass{p}-a.json"), row(f"{d}/c{c}-pass{p}-b.json"))
                  for p in pass_numbers(d, c) if os.path.exists(f"{d}/c{c}-pass{p}-b.json")]
        mean = lambda f: sum(f(a, b) for a, b in passes) / len(passes)
        ratios = [a["steps_per_min"] / b["steps_per_min"] if b["steps_per_min"] else float("nan")
                  for a, b in passes]
        out.append({
            "c": c,
            "ratio": sum(ratios) / len(ratios),
            "passes": ratios,
            "prog": mean(lambda a, b: a["steps_per_min"]),
            "req": mean(lambda a, b: b["steps_per_min"]),
            "hit": mean(lambda a, b: hit(a)),
            "p50": (mean(lambda a, b: a["p50_step_s"]), mean(lambda a, b: b["p50_step_s"])),
            "p99": (mean(lambda a, b: a["p99_step_s"]), mean(lambda a, b: b["p99_step_s"])),
        })
    return out


def main():
    out = sys.argv[1]
    print("| cell | programs | program / request (passes) | program steps/min | request steps/min "
          "| of own peak | hit/ideal | p50 s program / request | p99 s program / request | p99/p50 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for d in sorted(glob.glob(f"{out}/*/")):
        rows = cell_rows(d.rstrip("/"))
        if not rows:
            continue
        peak = max(r["prog"] for r in rows) or float("nan")
        for r in rows:
            ps = ", ".join(f"{x:.2f}" for x in r["passes"])
            print(f"| {os.path.basename(d.rstrip('/'))} | {r['c']} | **{r['ratio']:.2f}** ({ps}) "
                  f"| {r['prog']:.1f} | {r['req']:.1f} | {r['prog'] / peak:.2f} | {r['hit']:.2f} "
                  f"| {r['p50'][0]:.2f} / {r['p50'][1]:.2f} | {r['p99'][0]:.2f} / {r['p99'][1]:.2f} "
                  f"| {r['p99'][0] / r['p50'][0]:.1f} |")


if __name__ == "__main__":
    main()
