#!/usr/bin/env python3
"""Table and SVG plot of `agentd simulate` runs across host-tier sizes.

usage: sim_tier_report.py OUT_PREFIX POOL_TOKENS RUN.json...
Prints the markdown table; writes OUT_PREFIX.svg.
Each RUN.json is `agentd simulate --json` output; rows are keyed by the
run's host_kv_tokens (in pools), policy and concurrency. Stdlib only.
"""
import json
import sys


def rows(paths, pool):
    out = []
    for p in paths:
        for r in json.load(open(p))["runs"]:
            r["pools"] = r["host_kv_tokens"] / pool
            out.append(r)
    return sorted(out, key=lambda r: (r["workload"], r["concurrency"], r["policy"], r["pools"]))


def table(rs):
    head = "| workload | programs | policy | tier (pools) | steps/min | p50 s | p99 s | p99/p50 | hit (ideal) | recomputed tokens |"
    lines = [head, "|" + "---|" * 10]
    for r in rs:
        ratio = r["p99_step_s"] / r["p50_step_s"] if r["p50_step_s"] > 0 else float("nan")
        lines.append(
            f"| {r['workload']} | {r['concurrency']} | {r['policy']} | {r['pools']:g} | "
            f"{r['steps_per_min']:.1f} | {r['p50_step_s']:.2f} | {r['p99_step_s']:.2f} | {ratio:.1f} | "
            f"{r['prefix_hit_rate']:.3f} ({r['ideal_hit_rate']:.3f}) | {r['recomputed_tokens']:,} |"
        )
    return "\n".join(lines) + "\n"


def plot(rs, title):
    series = {}
    for r in rs:
        series.setdefault(f"{r['policy']} {r['concurrency']} programs", []).append(
            (r["pools"], r["steps_per_min"]))
    w, h, m = 640, 360, 60
    xs = [x for s in series.values() for x, _ in s]
    ys = [y for s in series.values() for _, y in s]
    x1, y1 = max(xs) or 1, max(ys) * 1.1 or 1
    sx = lambda x: m + (w - 2 * m) * x / x1
    sy = lambda y: h - m - (h - 2 * m) * y / y1
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<text x="{w/2}" y="20" text-anchor="middle">{title}</text>',
           f'<line x1="{m}" y1="{h-m}" x2="{w-m}" y2="{h-m}" stroke="black"/>',
           f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h-m}" stroke="black"/>',
           f'<text x="{w/2}" y="{h-20}" text-anchor="middle">host tier (pools)</text>',
           f'<text x="15" y="{h/2}" transform="rotate(-90 15 {h/2})" text-anchor="middle">steps/min</text>']
    for i in range(5):
        y = y1 * i / 4
        out.append(f'<text x="{m-5}" y="{sy(y)+4:.0f}" text-anchor="end">{y:.0f}</text>')
    for x in sorted(set(xs)):
        out.append(f'<text x="{sx(x):.0f}" y="{h-m+15}" text-anchor="middle">{x:g}</text>')
    for i, (name, pts) in enumerate(sorted(series.items())):
        c = colors[i % len(colors)]
        pts.sort()
        d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        out.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="2"/>')
        out.append(f'<text x="{w-m-150}" y="{m+15*i}" fill="{c}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    prefix, pool, paths = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
    rs = rows(paths, pool)
    sys.stdout.write(table(rs))
    title = f"agentd simulate: {rs[0]['workload']}, steps/min by host-tier size"
    open(prefix + ".svg", "w").write(plot(rs, title))


if __name__ == "__main__":
    main()
