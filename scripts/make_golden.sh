#!/usr/bin/env bash
# Regenerates the golden fixtures under tests/fixtures/golden/ with Hugging Face
# transformers (the correctness oracle, docs/design.md §11).
#
# The venv lives OUTSIDE the repo (torch is ~1 GB plus its CUDA wheels) so it is
# never committed and survives work-tree resets. Only needed to regenerate the
# fixtures; the Rust tests read the committed files and need no Python.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${GOLDEN_VENV:-/work/venv-golden}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch, transformers, safetensors" 2>/dev/null; then
    # Plain PyPI torch (the CPU-only index is not reachable from these machines).
    "$VENV/bin/pip" install --quiet torch transformers safetensors
fi
"$VENV/bin/python" scripts/make_golden.py --out tests/fixtures/golden "$@"
