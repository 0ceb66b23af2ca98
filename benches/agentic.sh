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
# an environment variable below. Never run in CI (minutes of CPU).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-benches/results}
WORK=${WORK:-/var/tmp/agentd-agentic}
CARD=${CARD:-models/qwen3-bench.json}
MODEL_DIR=${MODEL_DIR:-$WORK/model}
VLLM_VENV=${VLLM_VENV:-/var/tmp/vllm-venv}
# vLLM's CPU attention wants blocks that are a multiple of 32 tokens.
BLOCK=${BLOCK:-32}
# 65,536 KV tokens: the 8 programs of the low end fit (~4k tokens each, the
# 1k system prompt shared), the 96 of the high end need ~6x that (thrashing).
KV_TOKENS=${KV_TOKENS:-65536}
MAX_MODEL_LEN=${MAX_MODEL_LEN:-8192}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-256}
# Prefill chunk budget per engine step (vLLM's max_num_batched_tokens).
BATCH_TOKENS=${BATCH_TOKENS:-2048}
CONC=${CONC:-8,16,32,64,96}
DURATION=${DURATION:-60}
WARMUP=${WARMUP:-40}
SEED=${SEED:-1}
# The swe preset scaled to 2 CPU cores. A program's model call takes about
# a second here when it is not queued, so tools take about as long (median
# 1 s), as with real models on GPUs, where calls and tools both take seconds.
WORKLOAD=${WORKLOAD:-swe}
SYSTEM_TOKENS=${SYSTEM_TOKENS:-1024}
TASK_TOKENS=${TASK_TOKENS:-128:256}
TURNS=${TURNS:-8:16}
TOOL_TOKENS=${TOOL_TOKENS:-256}
OUTPUT_TOKENS=${OUTPUT_TOKENS:-8:24}
TOOL_TIME=${TOOL_TIME:-lognormal:1:0.5}
REQUEST_TIMEOUT=${REQUEST_TIMEOUT:-300}
# Extra flags of the program scheduler. With a pool that holds only a dozen
# programs, the default hysteresis (lambda_min 0.95) restores as soon as 5%
# frees and pauses again: a wider band (0.8) keeps restored programs' blocks
# (measured at concurrency 48: hit/ideal 0.91 -> 0.98; see
# benches/results/kv32k-tool3s/).
PROGRAM_FLAGS=${PROGRAM_FLAGS:---lambda-min 0.8}
# A third agentd target when set: the program scheduler with these flags as
# well, e.g. a host KV tier, which also turns on the measured waiting bound
# (HOST_FLAGS="--num-host-kv-blocks 16384").
HOST_FLAGS=${HOST_FLAGS:-}
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
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
AGENTD=${AGENTD:-$CARGO_TARGET_DIR/release/agentd}

use_vllm=auto
for a in "$@"; do
  case "$a" in
    --install-vllm) benches/install_vllm.sh "$VLLM_VENV" ;;
    --no-vllm) use_vllm=no ;;
    -h|--help) sed -n 2,12p "$0"; exit 0 ;;
    *) echo "unknown argument $a" >&2; exit 2 ;;
  esac
done

mkdir -p "$OUT" "$WORK"
if [ ! -x "$AGENTD" ]; then
  cargo build --release
fi

# The benchmark model: random weights, real Qwen3 tokenizer.
if [ ! -f "$MODEL_DIR/.complete" ]; then
  "$AGENTD" make-model --config "$CARD" --out "$MODEL_DIR" --seed 1
  touch "$MODEL_DIR/.complete"
fi

# KV bytes per token in float32: 2 (K and V) * layers * kv_heads * head_dim * 4.
field() { grep -o "\"$1\": *[0-9]*" "$MODEL_DIR/config.json" | grep -o '[0-9]*$'; }
LAYERS=$(field num_hidden_layers)
KV_HEADS=$(field num_key_value_heads)
HEAD_DIM=$(field head_dim)
BYTES_PER_TOKEN=$((2 * LAYERS * KV_HEADS * HEAD_DIM * 4))
KV_BLOCKS=$((KV_TOKENS / BLOCK))
KV_BYTES=$((KV_BLOCKS * BLOCK * BYTES_PER_TOKEN))
echo "model $CARD: $LAYERS layers, $KV_HEADS kv heads x $HEAD_DIM: $BYTES_PER_TOKEN bytes/token;" \
     "KV $KV_BLOCKS blocks x $BLOCK = $((KV_BLOCKS * BLOCK)) tokens = $KV_BYTES bytes" >&2

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

wait_up() { # URL LOGFILE PID
  for _ in $(seq 1 400); do
    if curl -sf "$1/health" >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$3" 2>/dev/null; then echo "server died; see $2" >&2; tail -20 "$2" >&2; return 1; fi
    sleep 1
  done
  echo "server at $1 not up after 400 s; see $2" >&2
  return 1
}

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
  # --kv-cache-memory-bytes gives the same token count exactly
  # (VLLM_CPU_KVCACHE_SPACE only takes whole GiB and would override it).
  env -u VLLM_CPU_KVCACHE_SPACE VLLM_TARGET_DEVICE=cpu \
    "$VLLM_VENV/bin/python" -m vllm.entrypoints.openai.api_server \
    --model "$MODEL_DIR" --dtype float32 --max-model-len "$MAX_MODEL_LEN" \
    --block-size "$BLOCK" --kv-cache-memory-bytes "$KV_BYTES" \
    --max-num-seqs "$MAX_NUM_SEQS" --max-num-batched-tokens "$BATCH_TOKENS" \
    --enable-prompt-tokens-details --disable-uvicorn-access-log \
    --host 127.0.0.1 --port "$PORT_VLLM" >"$WORK/vllm.log" 2>&1 &
  pids+=($!)
  wait_up "http://127.0.0.1:$PORT_VLLM" "$WORK/vllm.log" "${pids[-1]}"
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
  RUST_LOG=${RUST_LOG:-warn} "$AGENTD" serve --model "$MODEL_DIR" --dtype float32 \
    --scheduler "$sched" --num-kv-blocks "$KV_BLOCKS" --block-size "$BLOCK" \
    --max-num-seqs "$MAX_NUM_SEQS" --max-num-batched-tokens "$BATCH_TOKENS" \
    --max-model-len "$MAX_MODEL_LEN" --max-waiting 100000 \
    --host 127.0.0.1 --port "$port" "${extra[@]}" >"$WORK/agentd-$policy.log" 2>&1 &
  pids+=($!)
  wait_up "http://127.0.0.1:$port" "$WORK/agentd-$policy.log" "${pids[-1]}"
  targets+=(--target "agentd-$policy=http://127.0.0.1:$port")
done

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date -u +%FT%TZ)
cmd=("$AGENTD" bench "${targets[@]}" --workload "$WORKLOAD" --concurrency "$CONC"
     --duration-s "$DURATION" --warmup-s "$WARMUP" --seed "$SEED"
     --system-tokens "$SYSTEM_TOKENS" --task-tokens "$TASK_TOKENS" --turns "$TURNS"
     --tool-tokens "$TOOL_TOKENS" --output-tokens "$OUTPUT_TOKENS" --tool-time "$TOOL_TIME"
     --max-context "$((MAX_MODEL_LEN - 64))" --request-timeout-s "$REQUEST_TIMEOUT"
     --max-errors 1000000 $BENCH_FLAGS
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
  echo "- Workload: $WORKLOAD preset scaled: system $SYSTEM_TOKENS, task $TASK_TOKENS, turns $TURNS, tool output $TOOL_TOKENS, output $OUTPUT_TOKENS tokens, tool time $TOOL_TIME; seed $SEED."
  echo "- agentd program scheduler flags: ${PROGRAM_FLAGS:-none}; agentd-host (when run): the same plus ${HOST_FLAGS:-(not run)}; every agentd server: --max-num-batched-tokens $BATCH_TOKENS (vLLM the same)."
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
