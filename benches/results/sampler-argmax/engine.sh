#!/bin/bash
# The one-pass argmax end to end: `benches/agentic.sh` (the program policy,
# default flags, greedy requests as the bench sends them) with release
# builds before (OLD_BIN, 769139b) and after (NEW_BIN), one arm at a time
# in the order old new new old. CELL picks the shape and workload.
#   OLD_BIN=... NEW_BIN=... benches/results/sampler-argmax/engine.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=benches/results/sampler-argmax
CARD=${CARD:-models/qwen3-bench.json}
CONC=${CONC:-96}
shape=$(basename "$CARD" .json)
# ORDER: the arms in order (default old new new old; a second pass can
# run "new3 old3 old4 new4").
ORDER=${ORDER:-old1 new1 new2 old2}
for name in $ORDER; do
  case $name in old*) bin=${OLD_BIN:?} ;; *) bin=${NEW_BIN:?} ;; esac
  arm="$name $bin"
  set -- $arm
  dir=$OUT/engine-$shape-c$CONC-$1
  mkdir -p "$dir"
  AGENTD=$2 CARD=$CARD MODEL_DIR=/var/tmp/agentd-matrix/$shape WORK=/var/tmp/agentd-matrix \
    OUT=$dir CONC=$CONC DURATION=${DURATION:-60} WARMUP=${WARMUP:-20} POLICIES=program \
    benches/agentic.sh --no-vllm > "$dir/run.log" 2>&1
  python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][0]; print(sys.argv[2], r['steps_per_min'], r['p50_step_s'], r['p99_step_s'])" \
    "$dir/agentic.json" "$1"
done
