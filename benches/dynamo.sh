#!/usr/bin/env bash
# Scale-out recipe: two agentd workers behind NVIDIA Dynamo's frontend and KV
# router on one machine (loopback), Dynamo's file discovery (no etcd/NATS).
#
#   benches/dynamo.sh [AGENTD_BIN]        (default target/release/agentd)
#
# Needs ai-dynamo 1.6.1 in DYNAMO_VENV (default /var/tmp/dynamo-venv; see
# shared ENVIRONMENT notes for the install). Each worker: `agentd serve` on its
# own HTTP port publishing vLLM-format KV events on its own ZMQ port, plus the
# integrations/dynamo adapter registering it with Dynamo.
# STATUS: the agentd half (workers + KV events) runs; the Dynamo half has not
# been run yet (the adapter is untested against an installed Dynamo).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/agentd}
venv=${DYNAMO_VENV:-/var/tmp/dynamo-venv}
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$work"' EXIT

for w in 0 1; do
  http=$((8101 + w)); zmq=$((20080 + 10 * w))
  "$bin" serve --port "$http" --num-kv-blocks 512 \
    --kv-events-config "{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"topic\":\"kv-events\",\"endpoint\":\"tcp://*:$zmq\",\"replay_endpoint\":\"tcp://*:$((zmq + 1))\"}" \
    >"$work/agentd-$w.log" 2>&1 &
  pids+=($!)
done
for w in 0 1; do
  until curl -sf "http://127.0.0.1:$((8101 + w))/health" >/dev/null; do sleep 0.5; done
done
echo "agentd workers up on :8101 :8102 (KV events on tcp :20080 :20090)"

if [ ! -x "$venv/bin/python" ]; then
  echo "no Dynamo venv at $venv: stopping after the agentd half"; exit 0
fi
export DYN_DISCOVERY_BACKEND=file DYN_FILE_KV=$work/discovery DYN_EVENT_PLANE=zmq DYN_REQUEST_PLANE=tcp
export DYN_TCP_RPC_HOST=127.0.0.1 DYN_EVENT_PLANE_HOST=127.0.0.1 DYN_TCP_RESPONSE_STREAM_HOST=127.0.0.1 DYN_SYSTEM_HOST=127.0.0.1
for w in 0 1; do
  AGENTD_URL=http://127.0.0.1:$((8101 + w)) DYN_TCP_RPC_PORT=$((21000 + w)) \
    DYN_TCP_RESPONSE_STREAM_PORT=$((21100 + w)) DYN_SYSTEM_PORT=$((21200 + w)) \
    PYTHONPATH=. "$venv/bin/python" -m integrations.dynamo.agentd_backend >"$work/adapter-$w.log" 2>&1 &
  pids+=($!)
done
"$venv/bin/python" -m dynamo.frontend --router-mode kv --http-host 127.0.0.1 --http-port 8100 \
  >"$work/frontend.log" 2>&1 &
pids+=($!)
until curl -sf http://127.0.0.1:8100/v1/models >/dev/null; do sleep 1; done
# The frontend refuses return_token_ids, so the chat mode (text prompts).
"$bin" bench --target dynamo=http://127.0.0.1:8100 --mode chat "${@:2}"
