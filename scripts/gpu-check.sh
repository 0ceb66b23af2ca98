#!/usr/bin/env bash
# Device-side check of the CUDA backend, run on the GPU machine from the repo
# root with a binary built elsewhere (scripts/build-gpu-check.sh puts it in
# .gpu/). The GPU machine needs no Rust, nvcc or registry: only the NVIDIA
# driver and cuBLAS (found in the CUDA toolkit or in Python's nvidia-* wheels).
#
#   scripts/gpu-check.sh [--skip-kernels] [--skip-sampling] [--skip-tier] [--skip-graphs]
#                        [--skip-golden] [--skip-timing]
#                        [--batches 1,32,128] [--context 1024]
#
# Prints each kernel check, the device sampler against its reference (and its
# time against the logits download), the golden-model comparison and the decode timing
# table; exits non-zero when a check fails. With $OUT set, the log goes there.
set -uo pipefail
BIN=${AGENTD_GPU_CHECK:-.gpu/agentd-gpu-check}
[ -x "$BIN" ] || { echo "no $BIN: build it with scripts/build-gpu-check.sh" >&2; exit 2; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
# cuBLAS 13 (libcublas.so.13, libcublasLt.so.13): toolkit dirs, then pip wheels.
dirs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -e "$d/libcublas.so.13" ] && dirs="$dirs:$d"
done
for f in $(find / -xdev -name 'libcublas.so.13' -not -path '*/proc/*' 2>/dev/null | head -3); do
  dirs="$dirs:$(dirname "$f")"
done
export LD_LIBRARY_PATH="${dirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
log=${OUT:-/tmp}/gpu-check.log
"$BIN" --fixtures tests/fixtures/golden "$@" 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
