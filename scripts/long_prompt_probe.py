"""Submits a ~100k-token chat prompt again and again while a sweep runs
(issue 18: template rendering and tokenization run off the async runtime,
so a huge prompt must not slow the other programs' steps). Stdlib only.

Usage: python3 scripts/long_prompt_probe.py http://127.0.0.1:8000 SECONDS [TOKENS [INTERVAL_S]]

Each request (one every INTERVAL_S, default 0.5, after the last answer)
is `TOKENS` repetitions of " hello world" halves (one Qwen3
token each), max_tokens 1; it prints how many were sent, their statuses
and latencies. On a server whose window is shorter than the prompt every
request is tokenized in full and then refused (400, context length): the
probe then costs rendering + tokenization only, which is what it measures.
"""

import json
import sys
import time
import urllib.error
import urllib.request

base = sys.argv[1].rstrip("/")
seconds = float(sys.argv[2])
tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 100_000
interval = float(sys.argv[4]) if len(sys.argv) > 4 else 0.5
model = json.load(urllib.request.urlopen(base + "/v1/models"))["data"][0]["id"]
text = " hello world" * (tokens // 2)
body = json.dumps({"model": model, "max_tokens": 1,
                   "messages": [{"role": "user", "content": text}]}).encode()
statuses, lat = {}, []
end = time.time() + seconds
while time.time() < end:
    t = time.time()
    req = urllib.request.Request(base + "/v1/chat/completions", body,
                                 {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()
            code = r.status
    except urllib.error.HTTPError as e:
        e.read()
        code = e.code
    lat.append(time.time() - t)
    statuses[code] = statuses.get(code, 0) + 1
    time.sleep(interval)
lat.sort()
print(f"long prompts: {len(lat)} sent ({tokens} tokens each), statuses {statuses}, "
      f"latency p50 {lat[len(lat) // 2]:.3f} s, max {lat[-1]:.3f} s")
