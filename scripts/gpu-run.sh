#!/usr/bin/env bash
# The one prepared device run (issue 28 item 6), from the repo root on the GPU
# machine with .gpu/ built here by scripts/build-gpu-check.sh (carry .gpu):
#   1. scripts/gpu-check.sh: every kernel against the CPU path, the device
#      sampler, the fused prologue, the host tier round trip, decode graphs
#      against eager, the golden models, and the decode timing table;
#   2. scripts/gpu-serve-check.sh on the validated path (defaults);
#   3. the same with every path not yet validated on (GPU_FLAGS below).
# Each step's log goes to $OUT; the exit status is the first failure's.
# Budget: about 6-8 minutes on an H200 (the timing table is most of it).
#
#   run: scripts/gpu-run.sh        (device tool: carry [".gpu"])
set -uo pipefail
OUT=${OUT:-/tmp}
export OUT
rc=0
step() { # NAME CMD...
  local name=$1; shift
  echo "== $name"
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  local s=$?
  tail -40 "$OUT/$name.log"
  echo "== $name: exit $s in $((SECONDS - t0)) s"
  [ "$rc" = 0 ] && rc=$s
}
step gpu-check scripts/gpu-check.sh
step serve-default scripts/gpu-serve-check.sh
export GPU_FLAGS=${GPU_FLAGS:-"--device-sampling --fused-prologue --single-pass-decode --device-moe --cuda-graphs --kv-offloading-size 2"}
step serve-unvalidated scripts/gpu-serve-check.sh
exit "$rc"
