#!/bin/bash
# The engine's sampling moved out of worker.rs (0773802): the program policy's
# swe run at 48 programs, binaries before (15da232) and after (bbb00c8), o n n o.
cd /work/main
M=/var/tmp/agentd-agentic/model
OUT=${OUT:-benches/results/sample-refactor-abba}
arm() { # NAME BINARY PORT
  local name=$1 bin=$2 port=$3
  RUST_LOG=warn,agentd::cmd::cpu=info NO_COLOR=1 $bin serve --model $M --port $port --num-kv-blocks 2048 \
    --block-size 32 --max-num-batched-tokens 2048 --max-waiting 100000 --max-model-len 8192 > $OUT/$name.log 2>&1 &
  local pid=$!
  for i in $(seq 120); do curl -sf localhost:$port/health >/dev/null && break; sleep 1; done
  ${NEW:?the bbb00c8 build} bench --target $name=http://127.0.0.1:$port --no-progress --model model --workload swe \
    --seed 1 --system-tokens 1024 --task-tokens 128:256 --turns 8:16 --tool-tokens 256 --output-tokens 8:24 \
    --tool-time lognormal:1:0.5 --max-context 8128 --request-timeout-s 300 --concurrency 48 --duration-s 90 \
    --warmup-s 60 --stationary-start --json $OUT/$name.json > $OUT/$name.txt 2>&1
  kill $pid; wait $pid 2>/dev/null
  echo "$name: $(grep -E 'steps/min' $OUT/$name.txt | tail -1)"
}
arm old1 ${OLD:?the 15da232 build} 18801
arm new1 ${NEW:?the bbb00c8 build} 18802
arm new2 ${NEW:?the bbb00c8 build} 18803
arm old2 ${OLD:?the 15da232 build} 18804
echo ABBADONE
