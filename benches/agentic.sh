#!/usr/bin/env bash
# The agentic comparison on one machine: agentd --scheduler program vs
# agentd --scheduler request vs vLLM (when installed), same model directory,
# same KV capacity in tokens, one `agentd bench` sweep over all three.
#
#   benches/agentic.sh                 # run (vLLM too if $VLLM_VENV has it)
#   benches/agentic.sh --install-vllm  # first install vLLM (CPU) into $VLLM_VENV
#   benches/agentic.sh --no-vllm       # agentd program vs request only
#
# Writes $OUT/agentic.{json,svg,md} (default benches/results/). Every knob is
# an environment variable, below or in benches/lib/common.sh (the workload,
# KV_TOKENS, BLOCK, PROGRAM_FLAGS, ...). Never run in CI (minutes of CPU).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-benches/results}
WORK=${WORK:-/var/tmp/agentd-agentic}
MODEL_DIR=${MODEL_DIR:-$WORK/model}
# A third agentd target, agentd-host, only when HOST_FLAGS is set (e.g.
# HOST_FLAGS="--num-host-kv-blocks 16384"): the program scheduler with a host
# KV tier, which also turns on the measured waiting bound.
HOST_FLAGS=${HOST_FLAGS-}
# Extra `agentd bench` flags, e.g. BENCH_FLAGS=--stationary-start (the
# first N programs join at a uniform turn, so the window sees steady-state
# program ages rather than one cohort's first turns; give the warm-up time
# to prefill their histories).
BENCH_FLAGS=${BENCH_FLAGS:-}
# The agentd targets to run (a subset of "request program host").
POLICIES=${POLICIES:-request program}
PORT_HOST=${PORT_HOST:-18104}
PORT_PROGRAM=${PORT_PROGRAM:-18101}
PORT_REQUEST=${PORT_REQUEST:-18102}
PORT_VLLM=${PORT_VLLM:-18103}
# The workload, the serving shape (KV_TOKENS, BLOCK, ...), PROGRAM_FLAGS and
# the process helpers: benches/lib/common.sh.
. benches/lib/common.sh

use_vllm=auto
for a in "$@"; do
  case "$a" in
    --install-vllm) benches/install_vllm.sh "$VLLM_VENV" ;;
    --no-vllm) use_vllm=no ;;
    -h|--help) sed -n 2,13p "$0"; exit 0 ;;
    *) echo "unknown argument $a" >&2; exit 2 ;;
  esac
done

mkdir -p "$OUT" "$WORK"
BUILD=1 need_agentd
engine_shape
ensure_model
kv_geometry
echo "model $CARD: $BYTES_PER_TOKEN bytes of KV per token;" \
     "KV $KV_BLOCKS blocks x $BLOCK = $((KV_BLOCKS * BLOCK)) tokens = $KV_BYTES bytes" >&2
trap stop_all EXIT

targets=()
vllm_kv_line="vLLM not run"
have_vllm=no
if [ "$use_vllm" != no ] && [ -x "$VLLM_VENV/bin/python" ] \
   && "$VLLM_VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
  have_vllm=yes
elif [ "$use_vllm" != no ]; then
  vllm_kv_line="vLLM not installed in $VLLM_VENV (benches/agentic.sh --install-vllm)"
  echo "$vllm_kv_line; comparing agentd program vs request only" >&2
fi

if [ "$have_vllm" = yes ]; then
  serve_vllm "$PORT_VLLM" "$WORK/vllm.log" --enable-prompt-tokens-details
  vllm_kv_line=$(grep -o "KV cache size: [0-9,]* tokens" "$WORK/vllm.log" | tail -1 || true)
  echo "vLLM reports: $vllm_kv_line (agentd: $((KV_BLOCKS * BLOCK)) tokens)" >&2
  targets+=(--target "vllm=http://127.0.0.1:$PORT_VLLM")
fi

read -r -a policies <<<"$POLICIES"
[ -n "$HOST_FLAGS" ] && [[ " $POLICIES " != *" host "* ]] && policies+=(host)
for policy in "${policies[@]}"; do
  port=$PORT_REQUEST; extra=(); sched=$policy
  if [ "$policy" = program ]; then port=$PORT_PROGRAM; read -r -a extra <<<"$PROGRAM_FLAGS"; fi
  if [ "$policy" = host ]; then
    port=$PORT_HOST; sched=program; read -r -a extra <<<"$PROGRAM_FLAGS $HOST_FLAGS"
  fi
  serve_agentd "$port" "$WORK/agentd-$policy.log" --scheduler "$sched" "${extra[@]}"
  targets+=(--target "agentd-$policy=http://127.0.0.1:$port")
done

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date -u +%FT%TZ)
workload_flags
cmd=("$AGENTD" bench "${targets[@]}" "${WORKLOAD_FLAGS[@]}" --concurrency "$CONC"
     --duration-s "$DURATION" --warmup-s "$WARMUP" --max-errors 1000000 $BENCH_FLAGS
     --json "$OUT/agentic.json" --plot "$OUT/agentic.svg" --markdown "$WORK/table.md")
echo "+ ${cmd[*]}" >&2
set +e
"${cmd[@]}" | tee "$WORK/bench.txt"
rc=${PIPESTATUS[0]}
set -e
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

{
  echo "# Agentic benchmark: agentd program vs request scheduler vs vLLM"
  echo
  echo "Run $started by \`benches/agentic.sh\` on $(nproc) CPU cores ($(uname -m))."
  echo "Load average (1/5/15 min) before: $load_before; after: $load_after."
  echo
  echo "- Model: \`$CARD\` (random weights, float32), $BYTES_PER_TOKEN bytes of KV per token."
  echo "- KV capacity: $((KV_BLOCKS * BLOCK)) tokens for every server ($KV_BLOCKS blocks of $BLOCK; vLLM --kv-cache-memory-bytes $KV_BYTES; $vllm_kv_line)."
  echo "- Workload: $(workload_line)."
  echo "- agentd program scheduler: $(agentd_line); agentd-host (when run): the same plus ${HOST_FLAGS:-(not run)}; every server: --max-num-batched-tokens $BATCH_TOKENS, --max-num-seqs $MAX_NUM_SEQS."
  echo "- Each level: $WARMUP s warm-up, then $DURATION s measured; concurrency $CONC."
  echo
  echo "\`\`\`"
  echo "${cmd[*]}"
  echo "\`\`\`"
  echo
  cat "$WORK/table.md"
  echo
  echo "\`hit\` is the server's prefix-cache hit rate over the window (\`/metrics\` deltas);"
  echo "\`ideal\` is what an unlimited cache would hit, computed by the client."
} >"$OUT/agentic.md"
echo "wrote $OUT/agentic.md" >&2
exit "$rc"
