#!/usr/bin/env bash
# On the GPU machine: `agentd serve --device cuda` end to end against
# `agentd serve --device cpu` on the same model (the embedded tiny Qwen3 unless
# MODEL is set). Greedy completions of both servers must agree; a structured
# output (a JSON schema) must be valid on both; SGLang's release and resume of
# the GPU server's memory must leave its greedy output unchanged; a seeded draw
# at a temperature must repeat on the GPU server; then concurrent multi-turn programs run on the
# GPU server with no errors, and releasing them returns its KV usage to zero.
# GPU_FLAGS are added to the GPU server's command line: the paths not yet
# validated (--device-sampling, --fused-prologue, --cuda-graphs,
# --kv-offloading-size GiB) are checked by running this again with them.
#
#   AGENTD_BIN=.gpu/agentd scripts/gpu-serve-check.sh
#   GPU_FLAGS="--device-sampling --fused-prologue --cuda-graphs" AGENTD_BIN=.gpu/agentd scripts/gpu-serve-check.sh
#   FIRST_DEVICE=cpu GPU_FLAGS= AGENTD_BIN=target/release/agentd scripts/gpu-serve-check.sh  # the script itself, without a GPU
set -uo pipefail
BIN=${AGENTD_BIN:-.gpu/agentd}
[ -x "$BIN" ] || { echo "no $BIN (cargo build --release --features cuda; strip into .gpu/)" >&2; exit 2; }
dirs=""
for f in $(find / -xdev -name 'libcublas.so.13' -not -path '*/proc/*' 2>/dev/null | head -3); do
  dirs="$dirs:$(dirname "$f")"
done
export LD_LIBRARY_PATH="${dirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
logs=${OUT:-/tmp}
model_args=()
[ -n "${MODEL:-}" ] && model_args=(--model "$MODEL")
# shellcheck disable=SC2086 # GPU_FLAGS is a list of flags
"$BIN" serve "${model_args[@]}" --device "${FIRST_DEVICE:-cuda}" ${GPU_FLAGS:-} --port 8301 --num-kv-blocks 4096 >"$logs/serve-cuda.log" 2>&1 &
gpu_pid=$!
"$BIN" serve "${model_args[@]}" --device cpu --port 8302 --num-kv-blocks 4096 >"$logs/serve-cpu.log" 2>&1 &
cpu_pid=$!
trap 'kill $gpu_pid $cpu_pid 2>/dev/null' EXIT
for port in 8301 8302; do
  for _ in $(seq 120); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    sleep 0.5
  done
done
PYTHONUNBUFFERED=1 python3 - <<'PY'
import json, random, sys, time, concurrent.futures as cf
import requests
GPU, CPU = "http://127.0.0.1:8301", "http://127.0.0.1:8302"
model = requests.get(GPU + "/v1/models", timeout=10).json()["data"][0]["id"]
def complete(url, prompt, n, program=None):
    body = {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}
    if program: body["program_id"] = program
    r = requests.post(url + "/v1/completions", json=body, timeout=120)
    r.raise_for_status()
    return r.json()
rng = random.Random(7)
same = 0
prompts = [[rng.randrange(1000, 20000) for _ in range(rng.choice([5, 40, 200]))] for _ in range(12)]
for p in prompts:
    g, c = complete(GPU, p, 24)["choices"][0]["text"], complete(CPU, p, 24)["choices"][0]["text"]
    same += g == c
print(f"greedy completions equal on cuda and cpu: {same}/{len(prompts)}")
# SGLang's release / resume of both regions on the GPU server (the weights
# reload from disk through the engine's loader), then greedy again.
def gpu_mem_mib():
    import subprocess
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout.split()
        return int(out[0]) if out else -1
    except Exception:
        return -1
mem_before = gpu_mem_mib()
r1 = requests.post(GPU + "/release_memory_occupation", json={}, timeout=120)
mem_released = gpu_mem_mib()
r2 = requests.post(GPU + "/resume_memory_occupation", json={}, timeout=300)
same_after = complete(GPU, prompts[0], 24)["choices"][0]["text"] == complete(CPU, prompts[0], 24)["choices"][0]["text"]
mem_ok = r1.status_code == 200 and r2.status_code == 200 and same_after
print(f"release/resume on the GPU server: {r1.status_code}/{r2.status_code}, device memory used "
      f"{mem_before} -> {mem_released} MiB (-1: no nvidia-smi), greedy equal after: {same_after}")
# Structured output on both servers: the grammar's mask applies wherever the
# sampler runs (on the device with --device-sampling).
schema = {"type": "object", "properties": {"ok": {"type": "boolean"},
          "pick": {"enum": ["a", "b", "c"]}}, "required": ["ok", "pick"],
          "additionalProperties": False}
def structured(url):
    body = {"model": model, "messages": [{"role": "user", "content": "Answer in JSON."}],
            "max_tokens": 64, "temperature": 0.8, "seed": 3,
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}}
    r = requests.post(url + "/v1/chat/completions", json=body, timeout=120)
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]
valid = 0
for url in (GPU, CPU):
    try:
        v = json.loads(structured(url))
        valid += isinstance(v.get("ok"), bool) and v.get("pick") in ("a", "b", "c")
    except Exception as e:
        print("structured output failed on", url, e)
print(f"structured outputs valid: {valid}/2")
# A seeded draw at a temperature repeats (per backend: the device's Philox
# stream is not the host's ChaCha8 one).
def seeded():
    body = {"model": model, "prompt": prompts[0], "max_tokens": 16, "temperature": 0.8,
            "top_p": 0.9, "seed": 11, "ignore_eos": True}
    r = requests.post(GPU + "/v1/completions", json=body, timeout=120)
    r.raise_for_status()
    return r.json()["choices"][0]["text"]
repeats = seeded() == seeded()
print(f"seeded draw repeats on the GPU server: {repeats}")
# Concurrent programs, three turns each, on the GPU server.
def program(i):
    ids = [rng.randrange(1000, 20000) for _ in range(300)]
    errors, cached = 0, 0
    for turn in range(3):
        try:
            out = complete(GPU, ids, 32, program=f"p{i}")
            cached += out["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0) or 0
            ids = ids + [rng.randrange(1000, 20000) for _ in range(50)]
        except Exception as e:
            print("error", e); errors += 1
    requests.post(GPU + "/programs/release", json={"program_id": f"p{i}"}, timeout=10)
    return errors, cached
t0 = time.time()
with cf.ThreadPoolExecutor(32) as ex:
    res = list(ex.map(program, range(64)))
dt = time.time() - t0
errs = sum(e for e, _ in res)
print(f"64 programs x 3 turns on cuda: {dt:.1f} s, {errs} errors, cached prompt tokens {sum(c for _, c in res)}")
time.sleep(1)
m = requests.get(GPU + "/metrics", timeout=10).text
usage = [l for l in m.splitlines() if l.startswith("vllm:kv_cache_usage_perc")]
print("after release:", usage)
ok = (same == len(prompts) and valid == 2 and repeats and mem_ok and errs == 0 and usage
      and float(usage[0].split()[-1]) == 0.0)
print("serve check", "ok" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
rc=$?
tail -5 "$logs/serve-cuda.log"
exit $rc
