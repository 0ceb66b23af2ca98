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
# Two workers of half the single-engine pool each: 32,768 KV tokens per worker.
KV_TOKENS=${KV_TOKENS:-32768}
# Router configurations to measure: kv (the KV-aware router alone) and kv-affinity (plus
# Dynamo's session affinity on x-dynamo-session-id, idle TTL $AFFINITY_TTL s).
ROUTERS=${ROUTERS:-kv kv-affinity}
AFFINITY_TTL=${AFFINITY_TTL:-600}
FAILURE_ROUTER=${FAILURE_ROUTER:-kv-affinity}
# One level below the knee: this measures placement and failure, not thrashing.
CONC=${CONC:-8}
DURATION=${DURATION:-60}
WARMUP=${WARMUP:-15}
# Failure run: the bench lasts FAIL_DURATION s after its warm-up; worker 1's agentd is
# killed (SIGKILL) KILL_AT s after the bench starts; then AFTER_DURATION s on the survivor.
FAIL_DURATION=${FAIL_DURATION:-50}
KILL_AT=${KILL_AT:-35}
AFTER_DURATION=${AFTER_DURATION:-20}
# Requests on the killed worker fail rather than wait; 120 s bounds the run's length.
REQUEST_TIMEOUT=${REQUEST_TIMEOUT:-120}
PORT_FRONTEND=${PORT_FRONTEND:-18200}
PORT_AGENTD=${PORT_AGENTD:-18201}      # worker w on + w
PORT_ZMQ=${PORT_ZMQ:-20180}            # worker w publishes on + 10 w, replay on + 10 w + 1
PORT_DYN=${PORT_DYN:-21200}            # Dynamo's per-process RPC/response/system ports
# The workload, the model (the same directory as benches/agentic.sh), the serving
# shape and the process helpers: benches/lib/common.sh.
. benches/lib/common.sh
PY=$DYNAMO_VENV/bin/python

case "$MODE" in route|failure|all) ;; -h|--help) sed -n 2,16p "$0"; exit 0 ;;
  *) echo "usage: $0 [route|failure|all]" >&2; exit 2 ;; esac
need_agentd
[ -x "$PY" ] && "$PY" -c "import dynamo.frontend" 2>/dev/null \
  || { echo "no Dynamo in $DYNAMO_VENV (benches/install_dynamo.sh)" >&2; exit 1; }
engine_shape
mkdir -p "$OUT" "$WORK"
ensure_model
kv_geometry
DISC=$WORK/discovery
rm -rf "$DISC" "$WORK"/*.log "$WORK"/STOP-*

trap stop_all EXIT

export DYN_DISCOVERY_BACKEND=file DYN_FILE_KV=$DISC DYN_EVENT_PLANE=zmq DYN_REQUEST_PLANE=tcp
export DYN_TCP_RPC_HOST=127.0.0.1 DYN_EVENT_PLANE_HOST=127.0.0.1
export DYN_TCP_RESPONSE_STREAM_HOST=127.0.0.1 DYN_SYSTEM_HOST=127.0.0.1
dyn_ports() { # N: per-process Dynamo ports
  echo "DYN_TCP_RPC_PORT=$((PORT_DYN + 3 * $1)) DYN_TCP_RESPONSE_STREAM_PORT=$((PORT_DYN + 3 * $1 + 1)) DYN_SYSTEM_PORT=$((PORT_DYN + 3 * $1 + 2))"
}

instances() { ls "$DISC"/v1/instances 2>/dev/null | grep -c 'backend%2Fgenerate' || true; }
have_instances() { [ "$(instances)" -ge "$1" ]; }

agentd_pid=(); adapter_pid=()
start_worker() { # W
  local w=$1 http=$((PORT_AGENTD + $1)) zmq=$((PORT_ZMQ + 10 * $1))
  serve_agentd "$http" "$WORK/agentd-$w.log" --program-lease-s 300 \
    --kv-events-config "{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"topic\":\"kv-events\",\"endpoint\":\"tcp://*:$zmq\",\"replay_endpoint\":\"tcp://*:$((zmq + 1))\"}"
  agentd_pid[$w]=$SPAWNED
  spawn "$WORK/adapter-$w.log" env $(dyn_ports "$w") PYTHONPATH=. "$PY" -m integrations.dynamo.agentd_backend \
    --agentd-url "http://127.0.0.1:$http" --model-path "$MODEL_DIR" \
    --kv-events-endpoint "tcp://127.0.0.1:$zmq" --kv-events-topic kv-events \
    --max-num-seqs "$MAX_NUM_SEQS" --max-num-batched-tokens "$BATCH_TOKENS" \
    --discovery-backend file --event-plane zmq
  adapter_pid[$w]=$SPAWNED
}

frontend_pid=
start_frontend() { # ROUTER-CONFIG
  local flags=(--router-mode kv)
  [ "$1" = kv-affinity ] && flags+=(--router-session-affinity-ttl-secs "$AFFINITY_TTL")
  spawn "$WORK/frontend-$1.log" env $(dyn_ports 9) "$PY" -m dynamo.frontend "${flags[@]}" \
    --http-host 127.0.0.1 --http-port "$PORT_FRONTEND" --discovery-backend file --event-plane zmq
  frontend_pid=$SPAWNED
  wait_until "$START_TIMEOUT" "Dynamo frontend ($1)" "$frontend_pid" "$WORK/frontend-$1.log" \
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
  spawn "$WORK/watch-$1.txt" "$PY" benches/dynamo_watch.py --out "$WORK/watch-$1.json" --stop-file "$WORK/STOP-$1" \
    --max-s $((WARMUP + DURATION + FAIL_DURATION + AFTER_DURATION + 3 * REQUEST_TIMEOUT)) \
    ${WATCH_DUMP:+--dump "$WATCH_DUMP/$1"} \
    --worker "agentd-0=http://127.0.0.1:$PORT_AGENTD,tcp://127.0.0.1:$PORT_ZMQ,tcp://127.0.0.1:$((PORT_ZMQ + 1))" \
    --worker "agentd-1=http://127.0.0.1:$((PORT_AGENTD + 1)),tcp://127.0.0.1:$((PORT_ZMQ + 10)),tcp://127.0.0.1:$((PORT_ZMQ + 11))"
  watch_pid=$SPAWNED
}
stop_watch() { # NAME
  touch "$WORK/STOP-$1"
  for _ in $(seq 1 40); do gone "$watch_pid" && break; sleep 0.5; done
  stop_tree "$watch_pid"
  cat "$WORK/watch-$1.txt"
}

workload_flags
bench() { # NAME DURATION WARMUP EXTRA...: one level through the frontend, bounded in time
  local name=$1 dur=$2 warm=$3; shift 3
  timeout $((warm + dur + 2 * REQUEST_TIMEOUT + 60)) "$AGENTD" bench \
    --dynamo-target "$name=http://127.0.0.1:$PORT_FRONTEND" --no-progress \
    "${WORKLOAD_FLAGS[@]}" --concurrency "$CONC" --duration-s "$dur" --warmup-s "$warm" \
    --block-size 1 \
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
  echo "workload $(workload_line); concurrency $CONC; agentd $(agentd_line)."
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
    stop_tree "$frontend_pid"
    { echo "## router: $r (frontend --router-mode kv$([ "$r" = kv-affinity ] && echo " --router-session-affinity-ttl-secs $AFFINITY_TTL"))"
      echo; echo "bench exit $rc"; echo; summary "$r"; cat "$WORK/relay-$r.txt"; echo; } >>"$WORK/report.md"
  done
fi

if [ "$MODE" = failure ] || [ "$MODE" = all ]; then
  r=$FAILURE_ROUTER
  start_frontend "$r"
  start_watch failure
  set +e
  spawn "$WORK/bench-failure.txt" bench failure "$FAIL_DURATION" "$WARMUP" \
    --max-errors 1000000 --max-consecutive-errors 1000000
  bench_pid=$SPAWNED
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
  stop_tree "$frontend_pid"
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
