#!/usr/bin/env bash
# Regenerate tests/fixtures/chat/qwen3_golden.json with Hugging Face transformers.
# The venv lives outside the repository (templates need no torch).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV_CHAT:-/work/venv-chat}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet transformers jinja2 tokenizers
fi
"$VENV/bin/python" scripts/make_chat_golden.py
