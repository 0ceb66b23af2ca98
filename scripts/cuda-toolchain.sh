#!/usr/bin/env bash
# Prints a directory holding a CUDA 13 `nvcc`, installing one from PyPI into
# /var/tmp/cuda-venv when none is on PATH (no GPU needed to compile). Pinned to
# CUDA 13.0, the H200 machine's driver version, so embedded PTX is never newer
# than the driver. Exits non-zero (and prints nothing) when none can be had.
set -euo pipefail
if command -v nvcc >/dev/null; then
  dirname "$(command -v nvcc)"
  exit 0
fi
venv=${AGENTD_CUDA_VENV:-/var/tmp/cuda-venv}
find_nvcc() { ls "$venv"/lib/python3*/site-packages/nvidia/cu13/bin/nvcc 2>/dev/null | head -1; }
if [ -z "$(find_nvcc)" ]; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-runtime==13.0.*" \
    "nvidia-cuda-crt==13.0.*" "nvidia-cuda-cccl==13.0.*" "nvidia-nvvm==13.0.*" >&2
fi
nvcc=$(find_nvcc)
[ -n "$nvcc" ] || exit 1
dirname "$nvcc"
