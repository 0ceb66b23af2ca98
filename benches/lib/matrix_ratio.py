#!/usr/bin/env python3
"""The program / request ratio of every cell and level of a benches/matrix.sh
run as one SVG (benches/lib/bars.py), a panel per cell.

usage: matrix_ratio.py OUT TITLE > ratio.svg
Reads OUT/<cell>/agentic.json (one arm after the other) or, for PAIRED=1,
OUT/<cell>/c<N>-pass<P>-{a,b}.json (the mean of the passes' ratios,
benches/lib/matrix_pairs.py). Stdlib only.
"""
import glob
import json
import os
import subprocess
import sys

import matrix_pairs


def sequential(path):
    with open(path) as f:
        rows = json.load(f)["rows"]
    by = {(r["target"], r["concurrency"]): r["steps_per_min"] for r in rows}
    levels = sorted({c for _, c in by})
    return [(c, by[("agentd-program", c)] / by[("agentd-request", c)]) for c in levels
            if by.get(("agentd-request", c)) and ("agentd-program", c) in by]


def main():
    out, title = sys.argv[1], sys.argv[2]
    panels = []
    for d in sorted(glob.glob(f"{out}/*/")):
        d = d.rstrip("/")
        if os.path.exists(f"{d}/agentic.json"):
            ratios = sequential(f"{d}/agentic.json")
        else:
            ratios = [(r["c"], r["ratio"]) for r in matrix_pairs.cell_rows(d)]
        if not ratios:
            continue
        bars = [{"label": f"{c}", "value": round(x, 3),
                 "color": "#2a7" if x >= 1.0 else "#c44"} for c, x in ratios]
        panels.append({"title": os.path.basename(d).replace("qwen3-bench", "qb"), "bars": bars})
    spec = {"title": title, "panels": panels,
            "note": "program / request steps/min per concurrency (green at or above 1.00)"}
    here = os.path.dirname(os.path.abspath(__file__))
    subprocess.run([sys.executable, os.path.join(here, "bars.py")], input=json.dumps(spec),
                   text=True, check=True)


if __name__ == "__main__":
    main()
