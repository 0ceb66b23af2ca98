#!/bin/bash
# Issue 32: the 64-program burst (1k-8k contexts) with default scheduling flags, p r r p.
cd "$(dirname "$0")/../../.."
A=${AGENTD:-target/release/agentd}
# The model benches/agentic.sh makes (models/qwen3-bench.json, random weights).
M=${MODEL_DIR:-/var/tmp/agentd-agentic/model}
OUT=${OUT:-benches/results/burst-default}
arm() { # NAME PORT [flags]
  local name=$1 port=$2; shift 2
  RUST_LOG=warn,agentd::cmd::cpu=info NO_COLOR=1 $A serve --model $M --port $port --num-kv-blocks 2048 --block-size 32 \
    --max-num-batched-tokens 2048 --max-waiting 100000 "$@" > $OUT/$name.log 2>&1 &
  local pid=$!
  for i in $(seq 60); do curl -sf localhost:$port/health >/dev/null && break; sleep 1; done
  python3 scripts/idle_probe.py http://127.0.0.1:$port --programs 64 --turns 3 --system 128 --task 1000 \
    --task-max 8000 --output 16 --tool-tokens 128 --tool-s 1.0 --vocab 1000 --json $OUT/$name.json > $OUT/$name.txt 2>&1
  curl -s localhost:$port/metrics | grep -E "pauses_by_cause" | grep -v "^#" | grep -v " 0$" | sed 's/.*cause=/cause=/' | tr '\n' ' ' > $OUT/$name.causes
  kill $pid; wait $pid 2>/dev/null
  echo "$name: $(tail -3 $OUT/$name.txt | tr '\n' ' ') $(cat $OUT/$name.causes)"
}
arm program1 18701
arm request1 18702 --scheduler request
arm request2 18703 --scheduler request
arm program2 18704
echo BURSTDONE
