#!/usr/bin/env bash
# On a GPU machine: `agentd serve --device cuda` with the program scheduler and
# with the request (vLLM-like) scheduler, same Qwen3-0.6B-shaped random model
# and KV capacity, one `agentd bench` sweep over both. The binary comes built
# (cargo build --release --features cuda; stripped into .gpu/agentd).
#   benches/gpu-agentic.sh          # writes $OUT/gpu-agentic.{json,svg,md}
# Every knob is an environment variable, below or in benches/lib/common.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
AGENTD=${AGENTD_BIN:-${AGENTD:-.gpu/agentd}}
OUT=${OUT:-benches/results}
WORK=${WORK:-/tmp/agentd-gpu-agentic}
CARD=${CARD:-models/qwen3-0.6b.json}
MODEL_DIR=${MODEL_DIR:-$WORK/model}
# What differs from the CPU benchmarks, and why: no vLLM here, so agentd's own
# block size (16) and dtype; 131,072 KV tokens (8192 blocks of 16) is about a
# quarter of the working set at 64 programs; a GPU runs a model call in tens of
# milliseconds, so the workload is closer to the swe preset's own (its 2k system
# prompt, 300-800-token tasks and 2 s tools; 512-token tool outputs, 16-48
# output tokens) and the batch budget is 8,192 tokens a step.
BLOCK=${BLOCK:-16}
DTYPE=${DTYPE-}
KV_TOKENS=${KV_TOKENS:-131072}
BATCH_TOKENS=${BATCH_TOKENS:-8192}
MAX_MODEL_LEN=${MAX_MODEL_LEN:-16064}
CONC=${CONC:-16,64}
DURATION=${DURATION:-40}
WARMUP=${WARMUP:-10}
SYSTEM_TOKENS=${SYSTEM_TOKENS:-2048}
TASK_TOKENS=${TASK_TOKENS:-300:800}
TOOL_TOKENS=${TOOL_TOKENS:-512}
OUTPUT_TOKENS=${OUTPUT_TOKENS:-16:48}
TOOL_TIME=${TOOL_TIME:-lognormal:2:0.5}
REQUEST_TIMEOUT=${REQUEST_TIMEOUT:-120}
. benches/lib/common.sh
need_agentd || exit 1
engine_shape || exit 1
dirs=""
for f in $(find / -xdev -name 'libcublas.so.13' -not -path '*/proc/*' 2>/dev/null | head -3); do
  dirs="$dirs:$(dirname "$f")"
done
export LD_LIBRARY_PATH="${dirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$WORK" "$OUT"
ensure_model || exit 1
KV_BLOCKS=$((KV_TOKENS / BLOCK))
trap stop_all EXIT
serve_agentd 18201 "$WORK/program.log" --device cuda --scheduler program || exit 1
serve_agentd 18202 "$WORK/request.log" --device cuda --scheduler request || exit 1
workload_flags
"$AGENTD" bench --target agentd-request=http://127.0.0.1:18202 --target agentd-program=http://127.0.0.1:18201 \
  "${WORKLOAD_FLAGS[@]}" --concurrency "$CONC" --duration-s "$DURATION" --warmup-s "$WARMUP" \
  --max-errors 100000 \
  --json "$OUT/gpu-agentic.json" --plot "$OUT/gpu-agentic.svg" --markdown "$OUT/gpu-agentic.md"
rc=$?
tail -n 3 "$WORK/program.log" "$WORK/request.log"
exit $rc
