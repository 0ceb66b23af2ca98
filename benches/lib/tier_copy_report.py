#!/usr/bin/env python3
"""SVG plot of `cargo bench -p agentd-models --bench tier_copy` tables.

usage: tier_copy_report.py OUT.svg PATH=TABLE.md...
Each TABLE.md is the bench's output under one kernel path (PATH names it);
the plot shows before/beside (copies then step, over copies beside the
step) per case, one bar per path. Stdlib only.
"""
import sys


def cases(path):
    out = []
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 8 and cells[0].startswith("models/"):
            card = cells[0].removeprefix("models/").removesuffix(".json")
            out.append((f"{card} r{cells[1]} c{cells[2]}", float(cells[7])))
    return out


def main():
    svg, runs = sys.argv[1], [a.split("=", 1) for a in sys.argv[2:]]
    data = [(name, dict(cases(p))) for name, p in runs]
    labels = list(dict.fromkeys(l for _, d in data for l in d))
    w, row, m = 760, 22, 230
    h = 60 + row * len(labels) + 40
    lo, hi = 0.8, 1.2
    sx = lambda v: m + (w - m - 30) * (min(max(v, lo), hi) - lo) / (hi - lo)
    colors = ["#1f77b4", "#d62728", "#2ca02c"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<text x="{w/2}" y="18" text-anchor="middle" font-size="13">tier copies beside the forward: before/beside (&gt;1: beside faster)</text>']
    for t in (0.8, 0.9, 1.0, 1.1, 1.2):
        x = sx(t)
        out.append(f'<line x1="{x:.0f}" y1="40" x2="{x:.0f}" y2="{h-30}" stroke="{"black" if t == 1.0 else "#ccc"}"/>')
        out.append(f'<text x="{x:.0f}" y="{h-15}" text-anchor="middle">{t:.1f}</text>')
    bar = (row - 4) / max(len(data), 1)
    for i, label in enumerate(labels):
        y = 45 + i * row
        out.append(f'<text x="{m-6}" y="{y+row/2+2:.0f}" text-anchor="end">{label}</text>')
        for j, (name, d) in enumerate(data):
            if label in d:
                x0, x1 = sx(1.0), sx(d[label])
                out.append(f'<rect x="{min(x0, x1):.1f}" y="{y + j*bar:.1f}" width="{abs(x1-x0):.1f}" height="{bar-1:.1f}" fill="{colors[j % 3]}"/>')
    for j, (name, _) in enumerate(data):
        out.append(f'<text x="{w-120}" y="{45 + 14*j}" fill="{colors[j % 3]}">{name}</text>')
    out.append("</svg>")
    open(svg, "w").write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
