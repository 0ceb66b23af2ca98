#!/usr/bin/env python3
"""SVG plot of one-row `agentd bench` runs (ABBA order, or benches/pair.sh passes).

usage: abba_report.py OUT.svg LABEL=RUN.json...
Each RUN.json is `agentd bench --json` output with one row; the plot shows
steps/min and the p50 / p99 step latency per arm, in the order given.
Stdlib only.
"""
import json
import sys


def main():
    svg, runs = sys.argv[1], [a.split("=", 1) for a in sys.argv[2:]]
    rows = [(label, json.load(open(path))["rows"][0]) for label, path in runs]
    w, h, pad, bar = 120 + 70 * len(rows), 300, 40, 22
    smax = max(r["steps_per_min"] for _, r in rows) * 1.1
    lmax = max(r["p99_step_s"] for _, r in rows) * 1.1
    top, base = 30, h - 60
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<text x="{pad}" y="16">steps/min (blue), p50 / p99 step s (orange / red)</text>']
    for i, (label, r) in enumerate(rows):
        x = pad + 70 * i
        for dx, val, top_val, color in [(0, r["steps_per_min"], smax, "#4878a8"),
                                        (bar, r["p50_step_s"], lmax, "#e8a040"),
                                        (bar, r["p99_step_s"], lmax, "#c04030")]:
            hh = (base - top) * val / top_val
            if color == "#e8a040":
                out.append(f'<rect x="{x + dx}" y="{base - hh:.1f}" width="{bar}" height="{hh:.1f}" fill="{color}"/>')
            elif color == "#c04030":
                out.append(f'<line x1="{x + dx}" x2="{x + dx + bar}" y1="{base - hh:.1f}" y2="{base - hh:.1f}" stroke="{color}" stroke-width="3"/>')
                out.append(f'<text x="{x + dx}" y="{base - hh - 3:.1f}">{val:.1f}</text>')
            else:
                out.append(f'<rect x="{x + dx}" y="{base - hh:.1f}" width="{bar}" height="{hh:.1f}" fill="{color}"/>')
                out.append(f'<text x="{x + dx - 2}" y="{base - hh - 3:.1f}">{val:.0f}</text>')
        out.append(f'<text x="{x}" y="{base + 16}">{label}</text>')
    out.append(f'<line x1="{pad - 5}" x2="{w - 10}" y1="{base}" y2="{base}" stroke="black"/>')
    out.append("</svg>")
    open(svg, "w").write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
