#!/usr/bin/env bash
# On a GPU machine: `agentd serve --device cuda` with the program scheduler and
# with the request (vLLM-like) scheduler, same Qwen3-0.6B-shaped random model
# and KV capacity, one `agentd bench` sweep over both. The binary comes built
# (cargo build --release --features cuda; stripped into .gpu/agentd).
#   benches/gpu-agentic.sh          # writes $OUT/gpu-agentic.{json,svg,md}
set -uo pipefail
BIN=${AGENTD_BIN:-.gpu/agentd}
OUT=${OUT:-benches/results}
WORK=${WORK:-/tmp/agentd-gpu-agentic}
KV_BLOCKS=${KV_BLOCKS:-8192}         # x 16 tokens = 131,072 KV tokens per server
CONC=${CONC:-16,64}
DURATION=${DURATION:-40}
WARMUP=${WARMUP:-10}
dirs=""
for f in $(find / -xdev -name 'libcublas.so.13' -not -path '*/proc/*' 2>/dev/null | head -3); do
  dirs="$dirs:$(dirname "$f")"
done
export LD_LIBRARY_PATH="${dirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$WORK" "$OUT"
[ -f "$WORK/model/config.json" ] || "$BIN" make-model --config models/qwen3-0.6b.json --out "$WORK/model" --seed 1 || exit 1
common=(serve "$WORK/model" --device cuda --num-kv-blocks "$KV_BLOCKS" --max-num-seqs 256
        --max-num-batched-tokens 8192 --max-waiting 100000)
NO_COLOR=1 "$BIN" "${common[@]}" --scheduler program --port 18201 >"$WORK/program.log" 2>&1 &
p1=$!
NO_COLOR=1 "$BIN" "${common[@]}" --scheduler request --port 18202 >"$WORK/request.log" 2>&1 &
p2=$!
trap 'kill $p1 $p2 2>/dev/null' EXIT
for port in 18201 18202; do
  for _ in $(seq 240); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.5; done
done
"$BIN" bench --target agentd-request=http://127.0.0.1:18202 --target agentd-program=http://127.0.0.1:18201 \
  --workload swe --concurrency "$CONC" --duration-s "$DURATION" --warmup-s "$WARMUP" --seed 1 \
  --system-tokens 2048 --turns 8:16 --tool-tokens 512 --output-tokens 16:48 \
  --tool-time lognormal:2:0.5 --max-context 16000 --request-timeout-s 120 --max-errors 100000 \
  --json "$OUT/gpu-agentic.json" --plot "$OUT/gpu-agentic.svg" --markdown "$OUT/gpu-agentic.md"
rc=$?
tail -n 3 "$WORK/program.log" "$WORK/request.log"
exit $rc
