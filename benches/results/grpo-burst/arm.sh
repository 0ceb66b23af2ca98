#!/usr/bin/env bash
# arm.sh NAME PORT [serve flags...]: one GRPO 16x8 burst iteration against a
# fresh agentd (benches/lib/common.sh serving shape; MODEL_DIR from
# benches/rollout.sh, make-model seed 1), its JSON and pause causes in $OUT.
set -u
name=$1 port=$2; shift 2
A=${AGENTD:-${CARGO_TARGET_DIR:-target}/release/agentd}
OUT=${OUT:-.}
MODEL_DIR=${MODEL_DIR:-/var/tmp/agentd-rollout/model}
RUST_LOG=warn NO_COLOR=1 $A serve --model $MODEL_DIR --dtype float32 --num-kv-blocks 2048 --block-size 32 --max-num-seqs 256 --max-num-batched-tokens 2048 --max-model-len 8192 --max-waiting 100000 --host 127.0.0.1 --port $port "$@" > $OUT/$name.log 2>&1 &
pid=$!
for i in $(seq 60); do curl -sf localhost:$port/health >/dev/null && break; sleep 1; done
$A bench --workload rollout --seed 1 --system-tokens 1024 --task-tokens 128:256 --turns 8:16 --tool-tokens 256 --output-tokens 8:24 --tool-time lognormal:1:0.5 --max-context 8128 --request-timeout-s 300 --target $name=http://127.0.0.1:$port --iterations 1 --groups 16 --group-size 8 --no-progress --json $OUT/$name.json > $OUT/$name.txt 2>&1
curl -s localhost:$port/metrics | grep -E "pauses_by_cause" | grep -v "^#" | grep -v " 0$" | sed 's/.*cause=/cause=/' | tr '\n' ' ' > $OUT/$name.causes
kill $pid; wait $pid 2>/dev/null
jq -r --arg n "$name" '.rows[0] | "\($n): wall \(.wall_s|.*10|round/10) tok/s \(.gen_tok_s|.*10|round/10) first p50 \(.first_response_p50_s|.*100|round/100) max \(.first_response_max_s|.*100|round/100) step p50 \(.step_p50_s|.*100|round/100) p99 \(.step_p99_s|.*100|round/100) makespan max \(.group_makespan_max_s|.*10|round/10)"' $OUT/$name.json
cat $OUT/$name.causes; echo
