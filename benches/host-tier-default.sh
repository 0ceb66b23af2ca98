#!/usr/bin/env bash
# The host tier's default on the real engine (issue 32): agentd serve with its
# defaults (the tier sized from memory) against --kv-offloading-size 0, the
# long workload at 16 and 48 programs on a 32,768-token pool. Run on a quiet
# machine; writes $W/tier.{json,svg,md}.
set -euo pipefail
B=${B:-target/release/agentd}
W=/var/tmp/agentd-tierbench; mkdir -p $W
cd "$(dirname "$0")/.."
[ -d $W/model ] || $B make-model --config models/qwen3-bench-gqa1.json --out $W/model --seed 1
grep -m1 'model name' /proc/cpuinfo > $W/cpu.txt; uptime >> $W/cpu.txt
common=(serve $W/model --num-kv-blocks 2048 --block-size 16 --max-waiting 100000 --dtype float32)
$B "${common[@]}" --port 18701 > $W/default.log 2>&1 & P1=$!
$B "${common[@]}" --port 18702 --kv-offloading-size 0 > $W/notier.log 2>&1 & P2=$!
trap 'kill $P1 $P2 2>/dev/null' EXIT
for p in 18701 18702; do for i in $(seq 1 120); do curl -sf http://127.0.0.1:$p/health >/dev/null && break; sleep 1; done; done
grep -h "host KV tier\|cpu kernels\|kernel" $W/default.log $W/notier.log | head -6
$B bench --target default=http://127.0.0.1:18701 --target no-tier=http://127.0.0.1:18702 \
  --workload long --concurrency ${CONC:-16,48} --duration-s ${DUR:-100} --warmup-s ${WARM:-40} --seed 1 \
  --no-progress --json $W/tier.json --plot $W/tier.svg --markdown $W/tier.md
uptime >> $W/cpu.txt
