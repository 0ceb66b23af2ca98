#!/usr/bin/env python3
"""Bars of wall time and p99 per turn for each arm's JSON (agentd bench
--workload rollout), as SVG on stdout: plot.py old1.json new1.json ..."""
import json
import os
import sys

arms = [(os.path.basename(p)[:-5], json.load(open(p))["rows"][0]) for p in sys.argv[1:]]
panels = [("wall time, s", "wall_s"), ("p99 per turn, s", "step_p99_s"), ("p50 per turn, s", "step_p50_s")]
W, H, PAD, BAR = 300, 260, 50, 36
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W * len(panels)}" height="{H + 40}" font-family="sans-serif" font-size="12">',
       '<rect width="100%" height="100%" fill="white"/>']
for i, (title, key) in enumerate(panels):
    x0 = i * W
    top = max(r[key] for _, r in arms) * 1.15
    out.append(f'<text x="{x0 + W / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>')
    for j, (name, r) in enumerate(arms):
        h = (H - PAD) * r[key] / top
        x = x0 + PAD / 2 + j * (BAR + 14)
        color = "#d62728" if name.startswith("old") else "#1f77b4" if name.startswith("new") else "#7f7f7f"
        out.append(f'<rect x="{x}" y="{H - h}" width="{BAR}" height="{h}" fill="{color}"/>')
        out.append(f'<text x="{x + BAR / 2}" y="{H - h - 4}" text-anchor="middle">{r[key]:.1f}</text>')
        out.append(f'<text x="{x + BAR / 2}" y="{H + 16}" text-anchor="middle">{name}</text>')
out.append(f'<text x="10" y="{H + 34}">red: before (78bf3cd), blue: restores member by member, grey: --scheduler request</text>')
out.append("</svg>")
print("\n".join(out))
