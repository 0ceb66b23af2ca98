#!/usr/bin/env bash
# The agentic benchmark over a matrix (issue 12): model shapes x workloads x
# concurrency from below the knee to past it, agentd --scheduler program vs
# request (and vLLM when installed, unless NO_VLLM=1). One benches/agentic.sh
# run per cell, into $OUT/<card>-<workload>/agentic.{json,md,svg}; then
# $OUT/matrix.md: per cell and concurrency, steps/min of each target, the
# program policy's fraction of its own peak in the cell, hit/ideal, p50, p99.
#
#   benches/matrix.sh
#   CARDS="models/qwen3-bench.json" WORKLOADS=long CONC=8,48 benches/matrix.sh
#
# Shapes: qwen3-bench (GQA 2, head dim 64), qwen3-bench-gqa1 (8 KV heads, GQA
# 1), qwen3-bench-gqa4-hd128 (GQA 4, head dim 128). Workloads: swe (the
# preset scaled as in agentic.sh) and long (1-2k-token tasks, 512-token tool
# outputs, 32-64 output tokens a turn). Never run in CI.
#
# PAIRED=1: each cell is a benches/pair.sh run instead (program with
# default flags against `--scheduler request`, both at once on their own
# core, swapped in a second pass), into $OUT/<card>-<workload>/, and
# $OUT/matrix.md is benches/lib/matrix_pairs.py's table. Twice the time
# per level, but each ratio is taken at one moment: one after the other on
# these VMs the second arm ran 5-12% slower whichever it was.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benches/results/matrix}
CARDS=${CARDS:-models/qwen3-bench.json models/qwen3-bench-gqa1.json models/qwen3-bench-gqa4-hd128.json}
WORKLOADS=${WORKLOADS:-swe long}
CONC=${CONC:-8,16,48,96}
DURATION=${DURATION:-60}
WARMUP=${WARMUP:-30}
# LONG_WORKLOAD (and the swe defaults agentic.sh reads): benches/lib/common.sh.
. benches/lib/common.sh
extra=()
[ "${NO_VLLM:-0}" = 1 ] && extra+=(--no-vllm)
mkdir -p "$OUT"
for card in $CARDS; do
  shape=$(basename "$card" .json)
  for w in $WORKLOADS; do
    cell="$OUT/$shape-$w"
    mkdir -p "$cell"
    case "$w" in
      swe) env_w=() ;;
      long) env_w=("${LONG_WORKLOAD[@]}") ;;
      *) echo "unknown workload $w" >&2; exit 2 ;;
    esac
    echo "== $shape x $w (concurrency $CONC)"
    if [ "${PAIRED:-0}" = 1 ]; then
      env "${env_w[@]}" CARD="$card" MODEL_DIR="/var/tmp/agentd-matrix/$shape" WORK=/var/tmp/agentd-matrix \
        OUT="$OUT" RESULT_NAME="$shape-$w" CONC="$CONC" DURATION="$DURATION" WARMUP="$WARMUP" \
        A_NAME=program B_NAME=request B_FLAGS="--scheduler request" benches/pair.sh
      continue
    fi
    env "${env_w[@]}" CARD="$card" MODEL_DIR="/var/tmp/agentd-matrix/$shape" WORK=/var/tmp/agentd-matrix \
      OUT="$cell" CONC="$CONC" DURATION="$DURATION" WARMUP="$WARMUP" \
      benches/agentic.sh "${extra[@]}"
  done
done
# ratio.svg: program / request of every cell and level.
ratio_plot() { # HOW
  python3 benches/lib/matrix_ratio.py "$OUT" "program / request, default flags, $1 ($(cpu_model))" \
    >"$OUT/ratio.svg"
}
if [ "${PAIRED:-0}" = 1 ]; then
  python3 benches/lib/matrix_pairs.py "$OUT" | tee "$OUT/matrix.md"
  ratio_plot "both at once"
  exit 0
fi
python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
lines = ["# Agentic benchmark matrix", "",
         "| cell | conc | target | steps/min | x request | of own peak | hit/ideal | p50 s | p99 s | p99/p50 |",
         "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
for f in sorted(out.glob("*/agentic.json")):
    rows = json.loads(f.read_text())["rows"]
    by = {}
    for r in rows:
        by.setdefault(r["target"], []).append(r)
    peak = {t: max(x["steps_per_min"] for x in v) for t, v in by.items()}
    req = {r["concurrency"]: r["steps_per_min"] for r in by.get("agentd-request", [])}
    for r in sorted(rows, key=lambda r: (r["concurrency"], r["target"])):
        t, c = r["target"], r["concurrency"]
        hit, ideal = r.get("prefix_hit_rate") or 0, r.get("ideal_hit_rate") or 0
        p50, p99 = r.get("p50_step_s") or 0, r.get("p99_step_s") or 0
        lines.append("| {} | {} | {} | {:.1f} | {} | {:.2f} | {} | {:.2f} | {:.2f} | {} |".format(
            f.parent.name, c, t, r["steps_per_min"],
            "{:.2f}".format(r["steps_per_min"] / req[c]) if req.get(c) else "-",
            r["steps_per_min"] / peak[t] if peak[t] else 0,
            "{:.2f}".format(hit / ideal) if ideal else "-", p50, p99,
            "{:.1f}".format(p99 / p50) if p50 else "-"))
(out / "matrix.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
ratio_plot "one after the other"
