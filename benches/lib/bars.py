#!/usr/bin/env python3
"""Bar panels as SVG, for results files (no plotting library needed).

stdin: {"title": str, "panels": [{"title": str, "bars": [{"label": str,
"value": float, "color": str?}]}], "note": str?}; stdout: the SVG.
"""
import json
import sys
from html import escape

spec = json.load(sys.stdin)
panels = spec["panels"]
BAR, GAP, PAD, H = 40, 14, 30, 240
widths = [max(260, PAD * 2 + len(p["bars"]) * (BAR + GAP)) for p in panels]
top_y = 50
out = [
    f'<svg xmlns="http://www.w3.org/2000/svg" width="{sum(widths)}" height="{top_y + H + 60}" '
    'font-family="sans-serif" font-size="12">',
    '<rect width="100%" height="100%" fill="white"/>',
    f'<text x="{sum(widths) / 2}" y="18" text-anchor="middle" font-size="15" '
    f'font-weight="bold">{escape(spec.get("title", ""))}</text>',
]
x0 = 0
for w, p in zip(widths, panels):
    top = max((b["value"] for b in p["bars"]), default=1.0) * 1.15 or 1.0
    out.append(f'<text x="{x0 + w / 2}" y="38" text-anchor="middle" font-size="13">{escape(p["title"])}</text>')
    base = top_y + H
    out.append(f'<line x1="{x0 + PAD / 2}" y1="{base}" x2="{x0 + w - PAD / 2}" y2="{base}" stroke="#888"/>')
    for j, b in enumerate(p["bars"]):
        h = H * b["value"] / top
        x = x0 + PAD + j * (BAR + GAP)
        out.append(f'<rect x="{x}" y="{base - h}" width="{BAR}" height="{h}" fill="{b.get("color", "#1f77b4")}"/>')
        out.append(f'<text x="{x + BAR / 2}" y="{base - h - 4}" text-anchor="middle">{b["value"]:.3g}</text>')
        out.append(f'<text x="{x + BAR / 2}" y="{base + 16}" text-anchor="middle">{escape(b["label"])}</text>')
    x0 += w
if spec.get("note"):
    out.append(f'<text x="10" y="{top_y + H + 44}">{escape(spec["note"])}</text>')
out.append("</svg>")
print("\n".join(out))
