#!/usr/bin/env bash
# Runs scripts/openai_sdk_check.py (the official `openai` SDK, unchanged) and
# scripts/openai_responses_check.py (`client.responses` and the OpenAI Agents
# SDK) and scripts/openai_structured_check.py (structured outputs: 50 seeded
# samples each must parse) against a freshly started `agentd serve` on the
# embedded model. The SDK is
# installed into a venv outside the repo on first use. Exits 0 with a loud
# warning when the SDK cannot be installed (no registry); non-zero when the
# check fails.
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
log=$(mktemp)
cache=$(mktemp -d)
XDG_CACHE_HOME=$cache NO_COLOR=1 "$bin" serve --port 0 --num-kv-blocks 512 >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; rm -rf "$log" "$cache"' EXIT
addr=""
for _ in $(seq 240); do
  addr=$(grep -o 'listening on http://[0-9.:]*' "$log" | head -1 | sed 's|listening on http://||')
  [ -n "$addr" ] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.5
done
if [ -z "$addr" ]; then
  echo "agentd serve did not start:"; cat "$log"; exit 1
fi
"$venv/bin/python" scripts/openai_sdk_check.py "http://$addr/v1" &&
  "$venv/bin/python" scripts/openai_responses_check.py "http://$addr/v1" &&
  "$venv/bin/python" scripts/openai_structured_check.py "http://$addr/v1"
