#!/usr/bin/env bash
# Installs NVIDIA Dynamo 1.6.1 (ai-dynamo + ai-dynamo-runtime from PyPI) into its own venv that
# sees the vLLM venv's packages through a .pth file, so `python -m dynamo.vllm` finds vLLM while
# the vLLM venv stays clean (ai-dynamo registers a vLLM plugin entry point: installed into the
# vLLM venv it would load into every vLLM process). Never run in CI.
#
#   benches/install_dynamo.sh [DYNAMO_VENV] [VLLM_VENV]
#        (defaults /var/tmp/dynamo-venv, /var/tmp/vllm-venv; run benches/install_vllm.sh first)
#
# Without a vLLM venv it installs Dynamo alone (on $PYTHON, default python3.12 or python3): enough
# for the frontend, the ThunderAgent router and the agentd adapter (benches/thunderagent.sh's
# ta-agentd-request and ta-agentd targets), not for dynamo.vllm (the ta-vllm target).
#
# Two fixes for dynamo.vllm on vLLM 0.32 (both local to the Dynamo venv):
# - torchvision==0.28.0 --no-deps (the version that matches torch 2.13; dynamo.vllm imports
#   vLLM's multimodal code, which imports torchvision; its deps would pull a second torch);
# - vLLM 0.32 renamed get_engine_zmq_addresses -> get_engine_zmq_bind_addresses; dynamo.vllm
#   imports the old name at module load but only its embedding path uses it: made lazy.
set -euo pipefail
VENV=${1:-/var/tmp/dynamo-venv}
VLLM_VENV=${2:-/var/tmp/vllm-venv}
with_vllm=yes
if [ -x "$VLLM_VENV/bin/python" ]; then
  PY=${PYTHON:-$VLLM_VENV/bin/python}
else
  with_vllm=no
  # The first that runs: pyenv puts a python3.12 shim on PATH that fails unless 3.12 is selected.
  PY=${PYTHON:-}
  for c in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 python3; do
    [ -n "$PY" ] && break
    command -v "$c" >/dev/null && "$c" -c '' 2>/dev/null && PY=$(command -v "$c")
  done
  echo "no vLLM venv at $VLLM_VENV: installing Dynamo for the agentd targets only" \
       "(benches/install_vllm.sh first for the ta-vllm target)" >&2
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
site() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
# The Dynamo venv's own site-packages come first on sys.path, the vLLM venv's after them.
[ "$with_vllm" = no ] || site "$VLLM_VENV/bin/python" > "$(site "$VENV/bin/python")/vllm-venv.pth"
"$VENV/bin/pip" install --upgrade pip wheel
# ai-dynamo's requirements, less aisimulate (the planner's simulator: a placeholder on PyPI that
# downloads from another index, so it cannot install here; nothing run here imports it).
"$VENV/bin/pip" install --no-deps ai-dynamo==1.6.1
"$VENV/bin/python" - <<'PY' > "$VENV/dynamo-reqs.txt"
import importlib.metadata as md
from packaging.requirements import Requirement
for r in md.requires("ai-dynamo") or []:
    req = Requirement(r)
    if req.name.lower() == "aisimulate":
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    print(str(req).split(";")[0])
PY
"$VENV/bin/pip" install -r "$VENV/dynamo-reqs.txt"
"$VENV/bin/python" -c "import dynamo.frontend, dynamo.common.backend, dynamo.llm; print('dynamo ok')"
[ "$with_vllm" = yes ] || exit 0
"$VENV/bin/pip" install --no-deps torchvision==0.28.0
# The lazy import (idempotent: the patched line no longer matches).
"$VENV/bin/python" - "$(site "$VENV/bin/python")" <<'PY'
import pathlib, re, sys
root = pathlib.Path(sys.argv[1]) / "dynamo" / "vllm"
for f in root.rglob("*.py"):
    src = f.read_text()
    if "get_engine_zmq_addresses" not in src:
        continue
    def lazy(m):
        mod, names = m.group(1), [n.strip() for n in m.group(2).split(",")]
        rest = [n for n in names if n != "get_engine_zmq_addresses"]
        out = f"from {mod} import {', '.join(rest)}\n" if rest else ""
        return out + (
            f"try:\n    from {mod} import get_engine_zmq_addresses\n"
            "except ImportError:  # vLLM 0.32 renamed it; only the embedding path uses it\n"
            "    get_engine_zmq_addresses = None"
        )
    new = re.sub(
        r"^from (vllm\S*) import ([\w ,]*\bget_engine_zmq_addresses\b[\w ,]*)$",
        lazy, src, flags=re.M,
    )
    if new != src:
        f.write_text(new)
        print("patched", f)
PY
"$VENV/bin/python" -c "import vllm, torch, dynamo.vllm.main; print('vllm visible, dynamo.vllm imports, torch', torch.__version__)"
