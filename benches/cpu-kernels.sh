#!/usr/bin/env bash
# CPU kernel paths compared on one machine (issue 27): `agentd bench-model`
# prefill and decode throughput per model shape x context x batch, once per
# kernel path the CPU supports (AGENTD_CPU_KERNELS=avx512|avx2|neon|portable),
# then one table with the CPU model, the path, tok/s and the avx2/avx512
# ratio per shape. Builds release once; makes the checkpoints with
# `agentd make-model`. Never run in CI (minutes to hours; see below).
#
#   benches/cpu-kernels.sh                       # the full sweep
#   CONTEXTS="64 128" BATCHES="1 2" CARDS=models/qwen3-tiny.json \
#     DECODE_STEPS=2 benches/cpu-kernels.sh      # a smoke run (~1 min)
#
# Knobs (environment): CARDS (model cards; default the GQA-1 head-dim-64 and
# GQA-4 head-dim-128 bench shapes), CONTEXTS (prompt lengths, default
# "512 4096 8192"), BATCHES (default "1 32"), PATHS (default: every path the
# CPU has), DECODE_STEPS (default 16), PORTABLE_MAX_TOKENS (skip portable
# cells whose prefill exceeds this many tokens, default 32768: the portable
# attention runs at a few GFLOP/s, a 32x8192 prefill would take hours),
# BASELINE=1 (also stock candle-transformers, slow at long contexts),
# OUT (default benches/results), WORK (checkpoints, default
# /var/tmp/agentd-cpu-kernels), BIN (a built agentd: skips the build).
#
# Writes $OUT/cpu-kernels-<cpu>-<paths>.{jsonl,md}: one bench-model JSON
# report per line (each names its CPU and path), the table and its plot (.svg)
# from benches/lib/cpu_kernels_report.py (re-runnable on a saved .jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."
CARDS=${CARDS:-models/qwen3-bench-gqa1.json models/qwen3-bench-gqa4-hd128.json}
CONTEXTS=${CONTEXTS:-512 4096 8192}
BATCHES=${BATCHES:-1 32}
DECODE_STEPS=${DECODE_STEPS:-16}
PORTABLE_MAX_TOKENS=${PORTABLE_MAX_TOKENS:-32768}
OUT=${OUT:-benches/results}
WORK=${WORK:-/var/tmp/agentd-cpu-kernels}

if [ -z "${BIN:-}" ]; then
  cargo build --release --locked --bin agentd
  BIN="${CARGO_TARGET_DIR:-target}/release/agentd"
fi

cpu=$(grep -m1 -E '^(model name|Model|CPU part)' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' || true)
cpu=${cpu:-unknown}
if [ -z "${PATHS:-}" ]; then
  flags=$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo | cut -d: -f2- || true)
  has() { [[ " $flags " == *" $1 "* ]]; }
  PATHS=""
  if has avx512f && has avx2 && has fma && has f16c; then PATHS="$PATHS avx512"; fi
  if has avx2 && has fma && has f16c; then PATHS="$PATHS avx2"; fi
  if [ "$(uname -m)" = aarch64 ]; then PATHS="$PATHS neon"; fi
  PATHS="$PATHS portable"
fi
slug=$(echo "$cpu" | tr -cs 'A-Za-z0-9' '-' | sed 's/^-//; s/-$//' | cut -c1-48)
name="cpu-kernels-$slug-$(echo $PATHS | tr ' ' '-')"
mkdir -p "$OUT" "$WORK"
jsonl="$OUT/$name.jsonl"
: > "$jsonl"
echo "CPU: $cpu; paths: $PATHS; cards: $CARDS; contexts: $CONTEXTS; batches: $BATCHES"

extra=(--no-baseline)
[ "${BASELINE:-0}" = 1 ] && extra=()
for card in $CARDS; do
  shape=$(basename "$card" .json)
  model="$WORK/$shape"
  [ -f "$model/config.json" ] || "$BIN" make-model --config "$card" --out "$model"
  for ctx in $CONTEXTS; do
    for batch in $BATCHES; do
      for path in $PATHS; do
        if [ "$path" = portable ] && [ $((ctx * batch)) -gt "$PORTABLE_MAX_TOKENS" ]; then
          echo "-- $shape ctx=$ctx batch=$batch $path: skipped (PORTABLE_MAX_TOKENS)"
          continue
        fi
        echo "-- $shape ctx=$ctx batch=$batch $path"
        # Blocks of 16 (the serve default); one prefill of batch x ctx tokens.
        AGENTD_CPU_KERNELS=$path RUST_LOG=warn "$BIN" bench-model --model "$model" \
          --batch "$batch" --prompt-len "$ctx" --decode-steps "$DECODE_STEPS" \
          --json "${extra[@]}" | tail -n 1 |
          python3 -c 'import json,sys; r=json.load(sys.stdin); r["shape"]=sys.argv[1]; print(json.dumps(r))' "$shape" \
          >> "$jsonl"
      done
    done
  done
done

python3 benches/lib/cpu_kernels_report.py "$jsonl" "$OUT/$name"
echo "wrote $jsonl, $OUT/$name.md and $OUT/$name.svg"
