#!/usr/bin/env bash
# One-off experiment (2026-11-30 22:06 UTC, after the first sweep): the program
# scheduler alone at concurrency 48, same model/KV/workload as benches/agentic.sh,
# default flags vs --decay-base 1 vs --lambda-min 0.8. Results: program-c48-*.json.
B=/var/tmp/agentd-bench-target/release/agentd
i=0
for flags in "" "--decay-base 1" "--lambda-min 0.8"; do
  i=$((i+1)); port=$((18150+i))
  RUST_LOG=warn $B serve --model /var/tmp/agentd-bench-model --dtype float32 --scheduler program --num-kv-blocks 1024 --block-size 32 --max-num-batched-tokens 2048 --max-model-len 8192 --max-waiting 100000 --port $port $flags > serve$i.log 2>&1 &
  pid=$!
  for _ in $(seq 1 60); do curl -sf localhost:$port/health >/dev/null && break; sleep 0.5; done
  $B bench --target "prog$i=http://127.0.0.1:$port" --workload swe --concurrency 48 --duration-s 60 --warmup-s 20 --seed 1 --system-tokens 1024 --task-tokens 128:256 --turns 8:16 --tool-tokens 256 --output-tokens 8:24 --tool-time lognormal:3:0.5 --max-context 8128 --no-progress --json exp$i.json 2>/dev/null | sed -n 4p | sed "s|^|[$flags] |"
  kill $pid; wait $pid
done
