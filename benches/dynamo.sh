#!/usr/bin/env bash
# Scale-out recipe: two agentd workers behind NVIDIA Dynamo's frontend on one machine
# (loopback), Dynamo's file discovery and ZMQ event plane (no etcd/NATS), `agentd bench`
# through the frontend.
#
#   benches/dynamo.sh            # route: each router config in $ROUTERS, one bench each
#   benches/dynamo.sh failure    # kill one agentd mid-run, then a second run on the survivor
#   benches/dynamo.sh all        # both
#
# Needs ai-dynamo 1.6.1 in $DYNAMO_VENV (benches/install_dynamo.sh). Each worker is
# `agentd serve` (own HTTP port, vLLM-format KV events on its own ZMQ port) plus the adapter
# integrations/dynamo/agentd_backend.py registering it with Dynamo and relaying its KV events
# to the KV router. benches/dynamo_watch.py polls both workers' /programs (where programs
# ran) and replays their KV-event streams (consistency). Every wait has a timeout; every
# process started here is stopped on exit. Writes $OUT/dynamo-*.json and $OUT/dynamo.md.
# Never run in CI (minutes of CPU).
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=${1:-route}
OUT=${OUT:-benches/results}
WORK=${WORK:-/var/tmp/agentd-dynamo}
CARD=${CARD:-models/qwen3-bench.json}
# The same model directory as benches/agentic.sh.
MODEL_DIR=${MODEL_DIR:-/var/tmp/agentd-agentic/model}
DYNAMO_VENV=${DYNAMO_VENV:-/var/tmp/dynamo-venv}
BLOCK=${BLOCK:-32}
KV_TOKENS=${KV_TOKENS:-32768}          # per worker
MAX_MODEL_LEN=${MAX_MODEL_LEN:-8192}
BATCH_TOKENS=${BATCH_TOKENS:-2048}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-256}
# Router configurations to measure: kv (the KV-aware router alone) and kv-affinity (plus
# Dynamo's session affinity on x-dynamo-session-id, idle TTL $AFFINITY_TTL s).
ROUTERS=${ROUTERS:-kv kv-affinity}
AFFINITY_TTL=${AFFINITY_TTL:-600}
FAILURE_ROUTER=${FAILURE_ROUTER:-kv-affinity}
CONC=${CONC:-8}
DURATION=${DURATION:-60}
WARMUP=${WARMUP:-15}
# Failure run: the bench lasts FAIL_DURATION s after its warm-up; worker 1's agentd is
# killed (SIGKILL) KILL_AT s after the bench starts; then AFTER_DURATION s on the survivor.
FAIL_DURATION=${FAIL_DURATION:-50}
KILL_AT=${KILL_AT:-35}
AFTER_DURATION=${AFTER_DURATION:-20}
SEED=${SEED:-1}
WORKLOAD=${WORKLOAD:-swe}
SYSTEM_TOKENS=${SYSTEM_TOKENS:-1024}
TASK_TOKENS=${TASK_TOKENS:-128:256}
TURNS=${TURNS:-8:16}
TOOL_TOKENS=${TOOL_TOKENS:-256}
OUTPUT_TOKENS=${OUTPUT_TOKENS:-8:24}
TOOL_TIME=${TOOL_TIME:-lognormal:1:0.5}
REQUEST_TIMEOUT=${REQUEST_TIMEOUT:-120}
START_TIMEOUT=${START_TIMEOUT:-240}
PORT_FRONTEND=${PORT_FRONTEND:-18200}
PORT_AGENTD=${PORT_AGENTD:-18201}      # worker w on + w
PORT_ZMQ=${PORT_ZMQ:-20180}            # worker w publishes on + 10 w, replay on + 10 w + 1
PORT_DYN=${PORT_DYN:-21200}            # Dynamo's per-process RPC/response/system ports
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
AGENTD=${AGENTD:-$CARGO_TARGET_DIR/release/agentd}
PY=$DYNAMO_VENV/bin/python

case "$MODE" in route|failure|all) ;; -h|--help) sed -n 2,16p "$0"; exit 0 ;;
  *) echo "usage: $0 [route|failure|all]" >&2; exit 2 ;; esac
[ -x "$AGENTD" ] || { echo "no agentd binary at $AGENTD (cargo build --release)" >&2; exit 1; }
[ -x "$PY" ] && "$PY" -c "import dynamo.frontend" 2>/dev/null \
  || { echo "no Dynamo in $DYNAMO_VENV (benches/install_dynamo.sh)" >&2; exit 1; }
mkdir -p "$OUT" "$WORK"
if [ ! -f "$MODEL_DIR/.complete" ]; then
  "$AGENTD" make-model --config "$CARD" --out "$MODEL_DIR" --seed 1
  touch "$MODEL_DIR/.complete"
fi
DISC=$WORK/discovery
rm -rf "$DISC" "$WORK"/*.log "$WORK"/STOP-*

pids=()
gone() { # PID: exited (a zombie not yet reaped counts as gone)
  local st
  st=$(ps -o stat= -p "$1" 2>/dev/null || true)
  [ -z "$st" ] || [[ $st == Z* ]]
}
stop_pid() { # PID: TERM, up to 15 s for Dynamo's graceful shutdown, then KILL
  local p=$1
  if gone "$p"; then wait "$p" 2>/dev/null || true; return 0; fi
  kill "$p" 2>/dev/null || true
  for _ in $(seq 1 30); do gone "$p" && { wait "$p" 2>/dev/null || true; return 0; }; sleep 0.5; done
  kill -9 "$p" 2>/dev/null || true
  wait "$p" 2>/dev/null || true
}
cleanup() { for p in "${pids[@]}"; do stop_pid "$p"; done; }
trap cleanup EXIT

export DYN_DISCOVERY_BACKEND=file DYN_FILE_KV=$DISC DYN_EVENT_PLANE=zmq DYN_REQUEST_PLANE=tcp
export DYN_TCP_RPC_HOST=127.0.0.1 DYN_EVENT_PLANE_HOST=127.0.0.1
export DYN_TCP_RESPONSE_STREAM_HOST=127.0.0.1 DYN_SYSTEM_HOST=127.0.0.1
dyn_ports() { # N: per-process Dynamo ports
  echo "DYN_TCP_RPC_PORT=$((PORT_DYN + 3 * $1)) DYN_TCP_RESPONSE_STREAM_PORT=$((PORT_DYN + 3 * $1 + 1)) DYN_SYSTEM_PORT=$((PORT_DYN + 3 * $1 + 2))"
}

wait_until() { # SECONDS DESCRIPTION PID COMMAND...: polls COMMAND every 0.5 s
  local secs=$1 what=$2 pid=$3; shift 3
  local end=$((SECONDS + secs))
  while ! "$@" >/dev/null 2>&1; do
    if [ -n "$pid" ] && gone "$pid"; then echo "$what: process $pid died" >&2; return 1; fi
    if [ $SECONDS -ge $end ]; then echo "$what: not ready after $secs s" >&2; return 1; fi
    sleep 0.5
  done
}
instances() { ls "$DISC"/v1/instances 2>/dev/null | grep -c 'backend%2Fgenerate' || true; }
have_instances() { [ "$(instances)" -ge "$1" ]; }

KV_BLOCKS=$((KV_TOKENS / BLOCK))
agentd_pid=(); adapter_pid=()
start_worker() { # W
  local w=$1 http=$((PORT_AGENTD + $1)) zmq=$((PORT_ZMQ + 10 * $1))
  RUST_LOG=${RUST_LOG:-warn} "$AGENTD" serve --model "$MODEL_DIR" --dtype float32 \
    --num-kv-blocks "$KV_BLOCKS" --block-size "$BLOCK" --max-model-len "$MAX_MODEL_LEN" \
    --max-num-batched-tokens "$BATCH_TOKENS" --max-num-seqs "$MAX_NUM_SEQS" --max-waiting 100000 \
    --host 127.0.0.1 --port "$http" --program-lease-s 300 \
    --kv-events-config "{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"topic\":\"kv-events\",\"endpoint\":\"tcp://*:$zmq\",\"replay_endpoint\":\"tcp://*:$((zmq + 1))\"}" \
    >"$WORK/agentd-$w.log" 2>&1 &
  agentd_pid[$w]=$!; pids+=($!)
  wait_until "$START_TIMEOUT" "agentd worker $w" "${agentd_pid[$w]}" curl -sf "http://127.0.0.1:$http/health"
  env $(dyn_ports "$w") PYTHONPATH=. "$PY" -m integrations.dynamo.agentd_backend \
    --agentd-url "http://127.0.0.1:$http" --model-path "$MODEL_DIR" \
    --kv-events-endpoint "tcp://127.0.0.1:$zmq" --kv-events-topic kv-events \
    --max-num-seqs "$MAX_NUM_SEQS" --max-num-batched-tokens "$BATCH_TOKENS" \
    --discovery-backend file --event-plane zmq >"$WORK/adapter-$w.log" 2>&1 &
  adapter_pid[$w]=$!; pids+=($!)
}

frontend_pid=
start_frontend() { # ROUTER-CONFIG
  local flags=(--router-mode kv)
  [ "$1" = kv-affinity ] && flags+=(--router-session-affinity-ttl-secs "$AFFINITY_TTL")
  env $(dyn_ports 9) "$PY" -m dynamo.frontend "${flags[@]}" --http-host 127.0.0.1 \
    --http-port "$PORT_FRONTEND" --discovery-backend file --event-plane zmq \
    >"$WORK/frontend-$1.log" 2>&1 &
  frontend_pid=$!; pids+=($!)
  wait_until "$START_TIMEOUT" "Dynamo frontend ($1)" "$frontend_pid" \
    sh -c "curl -sf http://127.0.0.1:$PORT_FRONTEND/v1/models | grep -q '\"id\"'"
  sleep 2   # the router's view of both workers (discovery watch, KV-event subscription)
}

# Dynamo worker id (as nvext.worker_id says) -> agentd worker, from the discovery records
# (instance_id, and the worker's TCP request-plane port).
worker_map() {
  for f in "$DISC"/v1/instances/*backend%2Fgenerate*; do
    [ -f "$f" ] || continue
    local id port
    id=$(grep -o '"instance_id":[0-9]*' "$f" | cut -d: -f2)
    port=$(grep -o "127.0.0.1:[0-9]*" "$f" | head -1 | cut -d: -f2)
    for w in 0 1; do
      if [ "$port" = "$((PORT_DYN + 3 * w))" ]; then echo "$id agentd-$w"; fi
    done
  done
}

relay() { # the adapters' relay of agentd's KV events into Dynamo (their system /metrics)
  for w in 0 1; do
    local m
    if m=$(curl -sf --max-time 3 "http://127.0.0.1:$((PORT_DYN + 3 * w + 2))/metrics"); then
      echo "- agentd-$w relay into Dynamo's KV router: $(echo "$m" | grep '^dynamo_component_kv_publisher_zmq_events_total' \
        | sed -E 's/.*event_type="([a-z]+)",stage="([a-z]+)".* ([0-9.e+]+)$/\1 \2 \3/' | tr '\n' ',' | sed 's/,$//'); dropped (sequence gaps): $(echo "$m" \
        | grep '^dynamo_component_kv_publisher_engines_dropped_events_total' | awk '{print $2}')"
    else
      echo "- agentd-$w adapter: down"
    fi
  done
}

watch_pid=
start_watch() { # NAME
  rm -f "$WORK/STOP-$1"
  # Each worker's whole event history comes first from its replay socket (vLLM's protocol).
  "$PY" benches/dynamo_watch.py --out "$WORK/watch-$1.json" --stop-file "$WORK/STOP-$1" \
    --max-s $((WARMUP + DURATION + FAIL_DURATION + AFTER_DURATION + 3 * REQUEST_TIMEOUT)) \
    ${WATCH_DUMP:+--dump "$WATCH_DUMP/$1"} \
    --worker "agentd-0=http://127.0.0.1:$PORT_AGENTD,tcp://127.0.0.1:$PORT_ZMQ,tcp://127.0.0.1:$((PORT_ZMQ + 1))" \
    --worker "agentd-1=http://127.0.0.1:$((PORT_AGENTD + 1)),tcp://127.0.0.1:$((PORT_ZMQ + 10)),tcp://127.0.0.1:$((PORT_ZMQ + 11))" \
    >"$WORK/watch-$1.txt" 2>&1 &
  watch_pid=$!; pids+=($!)
}
stop_watch() { # NAME
  touch "$WORK/STOP-$1"
  for _ in $(seq 1 40); do gone "$watch_pid" && break; sleep 0.5; done
  stop_pid "$watch_pid"
  cat "$WORK/watch-$1.txt"
}

bench() { # NAME DURATION WARMUP EXTRA...: one level through the frontend, bounded in time
  local name=$1 dur=$2 warm=$3; shift 3
  timeout $((warm + dur + 2 * REQUEST_TIMEOUT + 60)) "$AGENTD" bench \
    --dynamo-target "$name=http://127.0.0.1:$PORT_FRONTEND" --no-progress \
    --workload "$WORKLOAD" --concurrency "$CONC" --duration-s "$dur" --warmup-s "$warm" \
    --seed "$SEED" --system-tokens "$SYSTEM_TOKENS" --task-tokens "$TASK_TOKENS" \
    --turns "$TURNS" --tool-tokens "$TOOL_TOKENS" --output-tokens "$OUTPUT_TOKENS" \
    --tool-time "$TOOL_TIME" --max-context "$((MAX_MODEL_LEN - 64))" \
    --request-timeout-s "$REQUEST_TIMEOUT" --block-size 1 \
    --json "$OUT/dynamo-$name.json" "$@"
}

summary() { # NAME: the bench row, placement and the watch summary as markdown
  "$PY" - "$OUT/dynamo-$1.json" "$WORK/watch-$1.json" "$WORK/workers.txt" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
watch = json.load(open(sys.argv[2]))
names = dict(l.split() for l in open(sys.argv[3]) if l.strip())
for r in rows:
    p = r.get("placement") or {}
    steps = {names.get(k, k): v for k, v in (p.get("steps") or {}).items()}
    progs = {names.get(k, k): v for k, v in (p.get("programs") or {}).items()}
    print(f"- `{r['target']}` c={r['concurrency']}: {r['steps_per_min']:.1f} steps/min, "
          f"hit {r['prefix_hit_rate']:.3f} ({r['hit_rate_source']}; ideal {r['ideal_hit_rate']:.3f}), "
          f"p50 {r['p50_step_s']:.2f} s, p99 {r['p99_step_s']:.2f} s, {r['steps']} steps, "
          f"{r['errors']} errors; steps per worker {steps}, programs per worker {progs}, "
          f"{p.get('split_programs', 'n/a')} programs split across workers (client, nvext.worker_id)")
    for m in r.get("error_messages") or []:
        print(f"  - error: `{m}`")
w = watch["workers"]
print(f"- server side (/programs polls, {watch['seconds']} s): {watch['programs_seen']} programs, "
      f"{len(watch['programs_on_several_workers'])} seen on both workers; "
      + "; ".join(f"{n}: {d['programs_seen']} programs" for n, d in w.items()))
for n, d in w.items():
    k = d["kv_events"]
    print(f"- {n} KV events: {k['batches']} batches (seq {k['first_seq']}..{k['last_seq']}, "
          f"{k['gaps']} gaps), {k['stored']} blocks stored, {k['removed']} removed, "
          f"{k['stored_twice']} stored twice, {k['removed_unknown']} unknown removals, "
          f"{k['orphan_parent']} stored on an uncached parent, {k['removed_with_children']} "
          f"removed while a child stayed cached, {k['cached_at_end']} cached at end "
          f"(history from the replay socket: {k['replayed']} batches); /metrics at end: {d['metrics_at_end']}")
PY
}

{
  echo "# agentd workers behind NVIDIA Dynamo 1.6.1 (benches/dynamo.sh $MODE)"
  echo
  echo "Run $(date -u +%FT%TZ) on $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo "Model \`$CARD\` (random weights, float32); each worker \`agentd serve\` with $KV_BLOCKS blocks x $BLOCK tokens;"
  echo "workload $WORKLOAD: system $SYSTEM_TOKENS, task $TASK_TOKENS, turns $TURNS, tool $TOOL_TOKENS, output $OUTPUT_TOKENS, tool time $TOOL_TIME; concurrency $CONC."
  echo
} >"$WORK/report.md"

for w in 0 1; do start_worker "$w"; done
wait_until "$START_TIMEOUT" "two adapters registered" "" have_instances 2
worker_map >"$WORK/workers.txt"
echo "workers (Dynamo id -> agentd):"; cat "$WORK/workers.txt"

if [ "$MODE" = route ] || [ "$MODE" = all ]; then
  for r in $ROUTERS; do
    start_frontend "$r"
    start_watch "$r"
    set +e
    bench "$r" "$DURATION" "$WARMUP" --max-errors 0 2>&1 | tee "$WORK/bench-$r.txt"
    rc=${PIPESTATUS[0]}
    set -e
    stop_watch "$r"
    relay >"$WORK/relay-$r.txt"
    stop_pid "$frontend_pid"
    { echo "## router: $r (frontend --router-mode kv$([ "$r" = kv-affinity ] && echo " --router-session-affinity-ttl-secs $AFFINITY_TTL"))"
      echo; echo "bench exit $rc"; echo; summary "$r"; cat "$WORK/relay-$r.txt"; echo; } >>"$WORK/report.md"
  done
fi

if [ "$MODE" = failure ] || [ "$MODE" = all ]; then
  r=$FAILURE_ROUTER
  start_frontend "$r"
  start_watch failure
  set +e
  bench failure "$FAIL_DURATION" "$WARMUP" --max-errors 1000000 --max-consecutive-errors 1000000 \
    >"$WORK/bench-failure.txt" 2>&1 &
  bench_pid=$!; pids+=($bench_pid)
  sleep "$KILL_AT"
  killed_at=$SECONDS
  kill -9 "${agentd_pid[1]}"
  echo "killed agentd worker 1 (pid ${agentd_pid[1]}) at t=${KILL_AT}s"
  # Its adapter notices (agentd /health down for 2 s) and unregisters from Dynamo.
  if wait_until 30 "adapter 1 exit" "" gone "${adapter_pid[1]}"; then
    adapter_gone="$((SECONDS - killed_at)) s after the kill"
  else adapter_gone="NOT within 30 s of the kill"; fi
  if wait_until 30 "discovery drops worker 1" "" sh -c "[ \$(ls $DISC/v1/instances | grep -c 'backend%2Fgenerate') -le 1 ]"; then
    unregistered="$((SECONDS - killed_at)) s"
  else unregistered="NOT within 30 s"; fi
  wait "$bench_pid"; rc1=$?
  bench after-kill "$AFTER_DURATION" 5 --max-errors 0 >"$WORK/bench-after.txt" 2>&1; rc2=$?
  set -e
  stop_watch failure
  relay >"$WORK/relay-failure.txt"
  stop_pid "$frontend_pid"
  cat "$WORK/bench-failure.txt" "$WORK/bench-after.txt"
  { echo "## failure: agentd worker 1 killed (SIGKILL) ${KILL_AT} s into the run (router $r)"
    echo
    echo "Adapter 1 exited $adapter_gone; discovery had dropped it after $unregistered."
    echo "Run during the kill (bench exit $rc1):"; echo
    summary failure | grep -v '^- agentd\|^- server side' || true
    echo; echo "Then a new run on the survivor (bench exit $rc2):"; echo
    cp "$WORK/watch-failure.json" "$WORK/watch-after-kill.json"
    summary after-kill | grep -v '^- agentd\|^- server side' || true
    echo; echo "Server side over both runs:"; echo
    summary failure | grep '^- agentd\|^- server side' || true
    cat "$WORK/relay-failure.txt"
    echo; echo "Adapter 1's last lines:"; echo; echo '```'
    tail -n 6 "$WORK/adapter-1.log" | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-300
    echo '```'; echo; } >>"$WORK/report.md"
fi

cp "$WORK/report.md" "$OUT/dynamo.md"
echo "wrote $OUT/dynamo.md"
cat "$OUT/dynamo.md"
