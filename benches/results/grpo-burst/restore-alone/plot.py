#!/usr/bin/env python3
"""grpo-burst-restore-alone.svg from the arms' JSON (agentd bench --workload
rollout): plot.py old1.json new1.json ... | benches/lib/bars.py"""
import json
import os
import sys

arms = [(os.path.basename(p)[:-5], json.load(open(p))["rows"][0]) for p in sys.argv[1:]]
color = {"old": "#d62728", "new": "#1f77b4", "req": "#7f7f7f"}
panels = [
    {"title": title, "bars": [{"label": n, "value": r[key], "color": color[n[:3]]} for n, r in arms]}
    for title, key in [("wall time, s", "wall_s"), ("p99 per turn, s", "step_p99_s"), ("p50 per turn, s", "step_p50_s")]
]
print(json.dumps({
    "title": "GRPO burst 16 x 8, default flags (Intel Xeon, avx512)",
    "panels": panels,
    "note": "red: before (78bf3cd), blue: restores member by member, grey: --scheduler request",
}))
