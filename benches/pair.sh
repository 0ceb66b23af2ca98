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
# the change. Pinned and simultaneous, the same cell read 0.98x and 1.03x
# (benches/results/pair-default/). The cost: each arm has half the cores, a
# different regime from one server on all of them, so absolute rates are
# about half; only the ratios compare.
#
#   A_FLAGS="--scheduler program" B_FLAGS="--scheduler request" \
#     CONC=48,96,192 RESULT_NAME=pair-default benches/pair.sh
#
# Writes $OUT/$RESULT_NAME/{README.md,c<N>.svg,c<N>-pass<P>-<arm>.json}.
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
ncpu=$(nproc)
CORES_A=${CORES_A:-0-$((ncpu / 2 - 1))}
CORES_B=${CORES_B:-$((ncpu / 2))-$((ncpu - 1))}
. benches/lib/common.sh
export RUST_LOG=${RUST_LOG:-warn,agentd::cmd::cpu=info}

command -v taskset >/dev/null || { echo "pair.sh needs taskset (util-linux)" >&2; exit 1; }
[ "$ncpu" -ge 2 ] || { echo "pair.sh needs at least 2 cores" >&2; exit 1; }
need_agentd
engine_shape
mkdir -p "$WORK"
ensure_model
kv_geometry
workload_flags
DIR=$OUT/$RESULT_NAME
mkdir -p "$DIR"
trap stop_all EXIT

# One level: both arms at once. Writes c<N>-pass<P>-<arm>.json.
measure() { # CONC PASS CORES_OF_A CORES_OF_B
  local c=$1 pass=$2 ca=$3 cb=$4 ja jb pa pb
  ja=$DIR/c$c-pass$pass-a.json
  jb=$DIR/c$c-pass$pass-b.json
  echo "c=$c pass $pass: $A_NAME on cores $ca, $B_NAME on cores $cb" >&2
  "$AGENTD" bench --target "$A_NAME=http://127.0.0.1:$PORT_A" "${WORKLOAD_FLAGS[@]}" \
    --concurrency "$c" --duration-s "$DURATION" --warmup-s "$WARMUP" --max-errors 1000000 \
    $BENCH_FLAGS --json "$ja" >"$WORK/bench-a.txt" 2>&1 &
  pa=$!
  "$AGENTD" bench --target "$B_NAME=http://127.0.0.1:$PORT_B" "${WORKLOAD_FLAGS[@]}" \
    --concurrency "$c" --duration-s "$DURATION" --warmup-s "$WARMUP" --max-errors 1000000 \
    $BENCH_FLAGS --json "$jb" >"$WORK/bench-b.txt" 2>&1 &
  pb=$!
  wait "$pa" || { cat "$WORK/bench-a.txt" >&2; return 1; }
  wait "$pb" || { cat "$WORK/bench-b.txt" >&2; return 1; }
}

pass() { # PASS CORES_OF_A CORES_OF_B
  local p=$1 ca=$2 cb=$3 c
  spawn_pinned "$PORT_A" "$ca" "$WORK/a-pass$p.log" "$A_FLAGS"
  local sa=$SPAWNED
  spawn_pinned "$PORT_B" "$cb" "$WORK/b-pass$p.log" "$B_FLAGS"
  local sb=$SPAWNED
  IFS=, read -r -a levels <<<"$CONC"
  for c in "${levels[@]}"; do measure "$c" "$p" "$ca" "$cb"; done
  stop_tree "$sa"
  stop_tree "$sb"
}

# serve_agentd with taskset in front (common.sh's spawn runs the command).
spawn_pinned() { # PORT CORES LOG FLAGS
  local port=$1 cores=$2 log=$3 extra=()
  read -r -a extra <<<"$4"
  spawn "$log" env RUST_LOG="$RUST_LOG" NO_COLOR=1 taskset -c "$cores" "$AGENTD" serve \
    --model "$MODEL_DIR" ${DTYPE:+--dtype "$DTYPE"} --num-kv-blocks "$KV_BLOCKS" \
    --block-size "$BLOCK" --max-num-seqs "$MAX_NUM_SEQS" \
    --max-num-batched-tokens "$BATCH_TOKENS" --max-model-len "$MAX_MODEL_LEN" \
    --max-waiting "$MAX_WAITING" --host 127.0.0.1 --port "$port" "${extra[@]}"
  wait_http "http://127.0.0.1:$port/health" "$SPAWNED" "$log"
}

started=$(date -u +%FT%TZ)
pass 1 "$CORES_A" "$CORES_B"
pass 2 "$CORES_B" "$CORES_A"
kernels=$(kernel_path "$WORK/a-pass1.log" || true)

python3 benches/lib/pair_report.py "$DIR" "$A_NAME" "$B_NAME" "$CONC" >"$DIR/table.md"
{
  echo "# $A_NAME vs $B_NAME, both at once on pinned cores"
  echo
  echo "\`benches/pair.sh\`, $started to $(date -u +%FT%TZ). CPU: $(cpu_model) ($ncpu cores);"
  echo "agentd's CPU kernel path ${kernels:-unknown} (its start log). Binary: $AGENTD."
  echo
  echo "- $A_NAME: \`agentd serve ${A_FLAGS:-(defaults)}\`; $B_NAME: \`agentd serve ${B_FLAGS:-(defaults)}\`."
  echo "- Pass 1: $A_NAME on cores $CORES_A, $B_NAME on $CORES_B; pass 2 swapped, fresh servers."
  echo "- Model $CARD; KV $((KV_BLOCKS * BLOCK)) tokens ($KV_BLOCKS blocks of $BLOCK) for each server."
  echo "- Workload: $(workload_line). ${WARMUP} s warm-up, ${DURATION} s measured per level.${BENCH_FLAGS:+ Bench flags: $BENCH_FLAGS.}"
  echo
  cat "$DIR/table.md"
} >"$DIR/README.md"
rm -f "$DIR/table.md"
cat "$DIR/README.md"
