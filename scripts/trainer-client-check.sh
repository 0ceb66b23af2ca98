#!/usr/bin/env bash
# Drives `agentd serve` with a trainer's own HTTP client: SkyRL's
# RemoteInferenceClient from the `skyrl` wheel on PyPI (scripts/
# trainer_client_check.py says which calls). Two random-weight checkpoints of
# the tiny model (`agentd make-model --seed 0|1`) are written; one server
# (VLLM_SERVER_DEV_MODE=1) serves the first and is updated to the second
# through vLLM's /update_weights, a second server serves the second for the
# reference output.
#
# skyrl 0.4 needs Python >= 3.12 (pyenv's 3.13 on these machines); where
# only an older Python 3 is found, skyrl 0.3.0 is used, the newest release whose wheel
# declares Python >= 3.11 (its client has the same calls but
# `is_sleeping`). The wheel is installed with --no-deps (its declared
# dependencies include peft, hence torch, and transformers, none of which
# the HTTP client uses) plus what the client imports; the two import-time
# stand-ins it needs are in scripts/trainer_client_check.py's docstring.
# The venv lives outside the repo. Run by .ci/run. Exits 0 with a loud
# warning when the client cannot be installed (no registry), non-zero when
# the check fails.
#   scripts/trainer-client-check.sh PATH/TO/agentd
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:?usage: trainer-client-check.sh PATH/TO/agentd}
venv=${AGENTD_SKYRL_VENV:-/var/tmp/agentd-skyrl-venv}

# Whether Python 3.MINOR or newer runs as CMD...
at_least() { # MINOR CMD...
  local minor=$1; shift
  "$@" -c "import sys; sys.exit(sys.version_info < (3, $minor))" 2>/dev/null
}

# A Python >= 3.12 (pyenv installs are tried by version) for skyrl 0.4.0,
# else python3 for skyrl 0.3.0. Prints "PYTHON VERSION".
# AGENTD_SKYRL_PYTHON picks the interpreter (to try the 3.11 path where a
# newer one exists).
find_python() {
  local c v
  if [ -n "${AGENTD_SKYRL_PYTHON:-}" ]; then
    if at_least 12 "$AGENTD_SKYRL_PYTHON"; then echo "$AGENTD_SKYRL_PYTHON 0.4.0"; else echo "$AGENTD_SKYRL_PYTHON 0.3.0"; fi
    return 0
  fi
  for c in python3.13 python3.12 python3; do
    at_least 12 "$c" && { echo "$c 0.4.0"; return 0; }
  done
  for v in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.1[2-9]' | sort -rV); do
    at_least 12 env PYENV_VERSION="$v" python && { echo "env PYENV_VERSION=$v python 0.4.0"; return 0; }
  done
  at_least 11 python3 && echo "python3 0.3.0"
}

if ! "$venv/bin/python" -c "import skyrl, aiohttp, pydantic, typing_extensions" 2>/dev/null; then
  found=$(find_python) || { echo "WARNING: no Python >= 3.11 (skyrl requires it); the trainer client check was NOT run"; exit 0; }
  py=${found% *}
  skyrl=${SKYRL_VERSION:-${found##* }}
  # Only a venv (or nothing) is replaced: the path may come from the caller.
  if [ -e "$venv" ] && [ ! -f "$venv/pyvenv.cfg" ]; then
    echo "$venv exists and is not a venv; set AGENTD_SKYRL_VENV elsewhere"; exit 1
  fi
  rm -rf "$venv"
  $py -m venv "$venv" &&
    "$venv/bin/pip" install -q --no-deps "skyrl==$skyrl" &&
    "$venv/bin/pip" install -q aiohttp orjson numpy pybase64 rich pydantic typing_extensions \
      cloudpathlib loguru fsspec xxhash zstandard ||
    { echo "WARNING: skyrl==$skyrl could not be installed (no registry?); the trainer client check was NOT run"; exit 0; }
fi
echo "client: skyrl $("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("skyrl"))') on $("$venv/bin/python" -V), torch importable: $("$venv/bin/python" -c 'import torch' 2>/dev/null && echo yes || echo no)"

work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$work"' EXIT
for seed in 0 1; do
  "$bin" make-model --config models/qwen3-tiny.json --out "$work/seed$seed" --seed "$seed" \
    >/dev/null 2>&1 || { echo "make-model --seed $seed failed"; exit 1; }
done

# Starts `agentd serve DIR --port 0` (env from the caller) and sets $addr.
serve() {
  local log=$work/serve-$RANDOM.log
  NO_COLOR=1 "$bin" serve "$1" --served-model-name tiny --port 0 --num-kv-blocks 512 >"$log" 2>&1 &
  pids+=("$!")
  addr=""
  for _ in $(seq 240); do
    addr=$(grep -o 'listening on http://[0-9.:]*' "$log" | head -1 | sed 's|listening on http://||')
    [ -n "$addr" ] && return 0
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 0.5
  done
  echo "agentd serve $1 did not start:"; cat "$log"; exit 1
}

VLLM_SERVER_DEV_MODE=1 serve "$work/seed0"
main=$addr
serve "$work/seed1"
ref=$addr
"$venv/bin/python" scripts/trainer_client_check.py "http://$main" "http://$ref" "$work/seed1"
