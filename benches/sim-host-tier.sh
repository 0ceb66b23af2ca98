#!/usr/bin/env bash
# The host tier's size in the simulator (issue 32, the tier on by default):
# swe on the H100 cost model at 96 and 192 programs with a tier of 0 to 4
# pools, and the long workload on the CPU (AVX2) cost model with none and
# 8 pools, program vs request. Deterministic (simulated time): runs on a
# busy machine too. Writes $OUT/sim-host-tier-{swe,long}.{svg,table.md}
# (sim-host-tier.md quotes the tables).
set -euo pipefail
cd "$(dirname "$0")/.."
AGENTD=${AGENTD:-target/release/agentd}
OUT=${OUT:-benches/results}
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
POOL=865000
for pools in 0 0.5 1 2 4; do
  h=$(python3 -c "print(int($POOL*$pools))")
  "$AGENTD" simulate --workload swe --concurrency 96,192 --policy program \
    --host-kv-tokens "$h" --json "$TMP/swe-$pools.json" >&2
done
python3 benches/lib/sim_tier_report.py "$OUT/sim-host-tier-swe" "$POOL" "$TMP"/swe-*.json > "$OUT/sim-host-tier-swe.table.md"
for h in 0 262144; do
  "$AGENTD" simulate --workload long --cost cpu-avx2 --kv-tokens 32768 --host-kv-tokens "$h" \
    --max-batched-tokens 2048 --concurrency 16,48,96 --duration-s 1200 --policy request,program \
    --json "$TMP/long-$h.json" >&2
done
python3 benches/lib/sim_tier_report.py "$OUT/sim-host-tier-long" 32768 "$TMP"/long-*.json > "$OUT/sim-host-tier-long.table.md"
