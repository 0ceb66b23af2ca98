#!/usr/bin/env bash
# Runs scripts/openai_sdk_check.py (the official `openai` SDK, unchanged) and
# scripts/openai_responses_check.py (`client.responses` and the OpenAI Agents
# SDK) and scripts/openai_structured_check.py (structured outputs: 50 seeded
# samples each must parse) against a freshly started `agentd serve` on the
# embedded model, and the SDK check's requests without max_tokens against a
# second server whose pool (16 blocks of 16 = 256 tokens) is far smaller than
# the model's 4096-token window. The SDK is installed into a venv outside the
# repo on first use. Exits 0 with a loud warning when the SDK cannot be
# installed (no registry); non-zero when the check fails.
#   scripts/openai-sdk-ci.sh PATH/TO/agentd
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:?usage: openai-sdk-ci.sh PATH/TO/agentd}
venv=${AGENTD_OPENAI_VENV:-/var/tmp/agentd-openai-venv}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import openai, agents" 2>/dev/null; then
  if ! { python3 -m venv "$venv" && "$venv/bin/pip" install -q openai openai-agents; }; then
    echo "WARNING: the openai SDK could not be installed; the SDK check was NOT run"
    exit 0
  fi
fi
cache=$(mktemp -d)
pids=()
logs=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "${logs[@]}" "$cache"' EXIT

# Starts `agentd serve --port 0 ARGS...` and sets $addr to where it listens.
serve() {
  local log
  log=$(mktemp)
  logs+=("$log")
  XDG_CACHE_HOME=$cache NO_COLOR=1 "$bin" serve --port 0 "$@" >"$log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  addr=""
  for _ in $(seq 240); do
    addr=$(grep -o 'listening on http://[0-9.:]*' "$log" | head -1 | sed 's|listening on http://||')
    [ -n "$addr" ] && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  echo "agentd serve $* did not start:"; cat "$log"; exit 1
}

serve --num-kv-blocks 512
main=$addr
serve --num-kv-blocks 16
small=$addr
"$venv/bin/python" scripts/openai_sdk_check.py "http://$main/v1" "http://$small/v1" &&
  "$venv/bin/python" scripts/openai_responses_check.py "http://$main/v1" &&
  "$venv/bin/python" scripts/openai_structured_check.py "http://$main/v1"
