#!/usr/bin/env bash
# Builds the device-side checker (crates/cuda, feature `gpu-check`: the CUDA
# backend plus the CPU backend it checks against) on a machine without a GPU
# and puts a stripped copy in .gpu/ for scripts/gpu-check.sh.
# Needs a CUDA 13 nvcc: $NVCC, nvcc on PATH, or the PyPI wheels that
# scripts/cuda-toolchain.sh installs. Also builds `agentd` itself with the
# feature `cuda` (for scripts/gpu-serve-check.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${NVCC:-}" ]; then
  PATH="$(scripts/cuda-toolchain.sh):$PATH"
  export PATH
fi
nvcc --version | tail -1
cargo build --release -p agentd-cuda --features gpu-check --bin agentd-gpu-check
cargo build --release --features cuda --bin agentd
mkdir -p .gpu
strip -o .gpu/agentd-gpu-check "${CARGO_TARGET_DIR:-target}/release/agentd-gpu-check"
strip -o .gpu/agentd "${CARGO_TARGET_DIR:-target}/release/agentd"
ls -la .gpu/
