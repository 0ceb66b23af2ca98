#!/usr/bin/env bash
# A same-moment A/B of two agentd configurations: both servers run at once,
# each pinned to its own half of the cores, each driven by its own
# `agentd bench` started at the same moment; then a second pass with the
# halves swapped (fresh servers). Machine drift hits both arms alike.
#
# Why not one arm after the other (benches/agentic.sh): on these 2-core
# VMs the arm that runs second was 5-12% slower whichever policy it was
# (benches/results/default-96-192: 0.83x and 0.94x in the two orders at 96
# programs), so a sequential pair measures the machine's drift as much as
# the change. Pinned and simultaneous, the same cell read 0.97x and 1.00x
# in the two passes (benches/results/pair-default/). The cost: each arm has half the cores, a
# different regime from one server on all of them, so absolute rates are
# about half; only the ratios compare.
#
#   A_FLAGS="--scheduler program" B_FLAGS="--scheduler request" \
#     CONC=48,96,192 RESULT_NAME=pair-default benches/pair.sh
#
# A_AGENTD / B_AGENTD (default $AGENTD) give each arm its own binary, to
# compare two builds (before and after a change) the same way.
#
# PASSES (default 2, even): more passes alternate the halves (odd passes as
# pass 1, even as pass 2), for a ratio whose spread can be stated: passes
# of one cell differed by 2-4% (pair-default/), so two passes cannot tell
# 0.98x from 1.00x; the report gives the mean ratio with a 95% interval
# from the passes' spread (benches/lib/pair_report.py).
#
# Writes $OUT/$RESULT_NAME/{README.md,c<N>.svg,c<N>-pass<P>-<arm>.json}; the
# README ends with where each arm's time went, from both servers' /metrics
# over the window (benches/lib/pair_metrics.py; snapshots in $WORK/metrics).
# Every other knob (workload, KV_TOKENS, BLOCK, ...): benches/lib/common.sh.
# Never run in CI (minutes of CPU).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-benches/results}
WORK=${WORK:-/var/tmp/agentd-pair}
MODEL_DIR=${MODEL_DIR:-/var/tmp/agentd-agentic/model}
RESULT_NAME=${RESULT_NAME:-pair}
A_NAME=${A_NAME:-A}
B_NAME=${B_NAME:-B}
A_FLAGS=${A_FLAGS:-}
B_FLAGS=${B_FLAGS:-}
BENCH_FLAGS=${BENCH_FLAGS:-}
PORT_A=${PORT_A:-18121}
PORT_B=${PORT_B:-18122}
METRICS_EVERY=${METRICS_EVERY:-10}
PASSES=${PASSES:-2}
ncpu=$(nproc)
CORES_A=${CORES_A:-0-$((ncpu / 2 - 1))}
CORES_B=${CORES_B:-$((ncpu / 2))-$((ncpu - 1))}
. benches/lib/common.sh
export RUST_LOG=${RUST_LOG:-warn,agentd::cmd::cpu=info}

command -v taskset >/dev/null || { echo "pair.sh needs taskset (util-linux)" >&2; exit 1; }
[ "$ncpu" -ge 2 ] || { echo "pair.sh needs at least 2 cores" >&2; exit 1; }
case $PASSES in
  *[!0-9]* | '' | 0) echo "PASSES must be a positive even number, got '$PASSES'" >&2; exit 1 ;;
esac
[ $((PASSES % 2)) -eq 0 ] || { echo "PASSES must be even (each core layout equally often), got $PASSES" >&2; exit 1; }
need_agentd
A_AGENTD=${A_AGENTD:-$AGENTD}
B_AGENTD=${B_AGENTD:-$AGENTD}
for bin in "$A_AGENTD" "$B_AGENTD"; do
  [ -x "$bin" ] || { echo "no agentd binary at $bin" >&2; exit 1; }
done
engine_shape
mkdir -p "$WORK"
METRICS=$WORK/metrics
rm -rf "$METRICS"
mkdir -p "$METRICS"
ensure_model
kv_geometry
workload_flags
DIR=$OUT/$RESULT_NAME
mkdir -p "$DIR"
trap stop_all EXIT

# One arm's bench at CONC against PORT, in the background (BENCHED: its pid).
bench_arm() { # NAME PORT CONC JSON LOG
  "$AGENTD" bench --target "$1=http://127.0.0.1:$2" "${WORKLOAD_FLAGS[@]}" \
    --concurrency "$3" --duration-s "$DURATION" --warmup-s "$WARMUP" --max-errors 1000000 \
    $BENCH_FLAGS --json "$4" >"$5" 2>&1 &
  BENCHED=$!
}

# PID's CPU time (utime + stime, clock ticks): "0 process TICKS" for the
# whole process, exited threads included (the per-step KV copy threads end
# with their step), then "TID NAME TICKS" per live thread
# (benches/lib/pair_metrics.py).
thread_cpu() { # PID
  local t stat name
  awk '{ sub(/^.*\) /, ""); print 0, "process", $12 + $13 }' "/proc/$1/stat" || return 1
  for t in /proc/"$1"/task/*; do
    # A thread may end between the glob and the reads (a KV copy thread).
    stat=$(cat "$t/stat" 2>/dev/null) || continue
    name=$(cat "$t/comm" 2>/dev/null) || continue
    printf '%s %s %s\n' "${t##*/}" "${name// /_}" "$(echo "${stat##*) }" | awk '{ print $12 + $13 }')"
  done
}

# Both servers' /metrics every METRICS_EVERY s through the benches' measured
# window (the first snapshot at its start, the last at its end), into
# $METRICS/c<N>-pass<P>-<arm>-<i>.prom for benches/lib/pair_metrics.py.
scrape_window() { # CONC PASS
  local c=$1 p=$2 i=0 end left arm port pid
  sleep "$WARMUP"
  end=$((SECONDS + ${DURATION%.*}))
  while :; do
    for arm in a b; do
      port=$PORT_A
      [ "$arm" = b ] && port=$PORT_B
      curl -sf -m 5 "http://127.0.0.1:$port/metrics" >"$METRICS/c$c-pass$p-$arm-$i.prom" ||
        rm -f "$METRICS/c$c-pass$p-$arm-$i.prom"
      pid=$PID_A
      [ "$arm" = b ] && pid=$PID_B
      thread_cpu "$pid" >"$METRICS/c$c-pass$p-$arm-$i.threads" ||
        rm -f "$METRICS/c$c-pass$p-$arm-$i.threads"
    done
    i=$((i + 1))
    left=$((end - SECONDS))
    [ "$left" -gt 0 ] || break
    sleep $((left < METRICS_EVERY ? left : METRICS_EVERY))
  done
}

# One level: both arms at once. Writes c<N>-pass<P>-<arm>.json.
measure() { # CONC PASS CORES_OF_A CORES_OF_B
  local c=$1 pass=$2 pa pb ps
  echo "c=$c pass $pass: $A_NAME on cores $3, $B_NAME on cores $4" >&2
  bench_arm "$A_NAME" "$PORT_A" "$c" "$DIR/c$c-pass$pass-a.json" "$WORK/bench-a.txt"
  pa=$BENCHED
  bench_arm "$B_NAME" "$PORT_B" "$c" "$DIR/c$c-pass$pass-b.json" "$WORK/bench-b.txt"
  pb=$BENCHED
  scrape_window "$c" "$pass" &
  ps=$!
  wait "$pa" || { kill "$ps" 2>/dev/null; cat "$WORK/bench-a.txt" >&2; return 1; }
  wait "$pb" || { kill "$ps" 2>/dev/null; cat "$WORK/bench-b.txt" >&2; return 1; }
  wait "$ps" || true
}

# The common shape's server (common.sh) pinned to CORES. SERVED: its pid.
serve_pinned() { # PORT CORES LOG FLAGS BINARY
  local extra=()
  read -r -a extra <<<"$4"
  AGENTD=$5 PIN_CORES=$2 serve_agentd "$1" "$3" "${extra[@]}"
  SERVED=$SPAWNED
}

pass() { # PASS CORES_OF_A CORES_OF_B
  local p=$1 ca=$2 cb=$3 c sa sb
  serve_pinned "$PORT_A" "$ca" "$WORK/a-pass$p.log" "$A_FLAGS" "$A_AGENTD"
  sa=$SERVED
  serve_pinned "$PORT_B" "$cb" "$WORK/b-pass$p.log" "$B_FLAGS" "$B_AGENTD"
  sb=$SERVED
  PID_A=$sa PID_B=$sb
  IFS=, read -r -a levels <<<"$CONC"
  for c in "${levels[@]}"; do measure "$c" "$p" "$ca" "$cb"; done
  stop_tree "$sa"
  stop_tree "$sb"
}

started=$(date -u +%FT%TZ)
for p in $(seq 1 "$PASSES"); do
  if [ $((p % 2)) -eq 1 ]; then pass "$p" "$CORES_A" "$CORES_B"; else pass "$p" "$CORES_B" "$CORES_A"; fi
done
kernels=$(kernel_path "$WORK/a-pass1.log" || true)

python3 benches/lib/pair_report.py "$DIR" "$A_NAME" "$B_NAME" "$CONC" >"$DIR/table.md"
{
  echo "# $A_NAME vs $B_NAME, both at once on pinned cores"
  echo
  echo "\`benches/pair.sh\`, $started to $(date -u +%FT%TZ). CPU: $(cpu_model) ($ncpu cores);"
  echo "agentd's CPU kernel path ${kernels:-unknown} (its start log). Binaries: $A_NAME $A_AGENTD, $B_NAME $B_AGENTD."
  echo
  echo "- $A_NAME: \`agentd serve ${A_FLAGS:-(defaults)}\`; $B_NAME: \`agentd serve ${B_FLAGS:-(defaults)}\`."
  echo "- $PASSES passes, fresh servers each: odd passes $A_NAME on cores $CORES_A, $B_NAME on $CORES_B; even passes swapped."
  echo "- Model $CARD; KV $((KV_BLOCKS * BLOCK)) tokens ($KV_BLOCKS blocks of $BLOCK) for each server."
  echo "- Workload: $(workload_line). ${WARMUP} s warm-up, ${DURATION} s measured per level.${BENCH_FLAGS:+ Bench flags: $BENCH_FLAGS.}"
  echo
  cat "$DIR/table.md"
  echo
  echo "Where the time went (both servers' \`/metrics\` over the measured window, every ${METRICS_EVERY} s;"
  echo "\`benches/lib/pair_metrics.py\` says how to read it):"
  echo
  python3 benches/lib/pair_metrics.py "$METRICS" "$A_NAME" "$B_NAME" "$CONC"
} >"$DIR/README.md"
rm -f "$DIR/table.md"
cat "$DIR/README.md"
