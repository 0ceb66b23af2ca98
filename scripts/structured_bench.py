"""Decode throughput with a json_schema constraint vs unconstrained, same
server, same run, at concurrency 1 and 32 (stdlib only).

Usage: python3 scripts/structured_bench.py http://127.0.0.1:8000 [requests]
Each request generates exactly max_tokens (ignore_eos; the schema's string
is long enough that the grammar never ends first), so tokens/s compares the
sampler's mask cost against the model step it hides behind.
"""

import json
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

base = sys.argv[1].rstrip("/")
reqs = int(sys.argv[2]) if len(sys.argv) > 2 else 32
MAX = 48
MODEL = json.load(urllib.request.urlopen(base + "/v1/models"))["data"][0]["id"]
schema = {"type": "object", "properties": {"note": {"type": "string", "minLength": 400}},
          "required": ["note"], "additionalProperties": False}


def one(seed, constrained):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": MAX,
            "seed": seed, "temperature": 1.0, "ignore_eos": True,
            "chat_template_kwargs": {"enable_thinking": False}}
    if constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.load(r)["usage"]["completion_tokens"]


for conc in (1, 32):
    rates = {}
    for constrained in (False, True):
        n = max(reqs, conc)
        t = time.time()
        with ThreadPoolExecutor(conc) as ex:
            toks = sum(ex.map(lambda s: one(s, constrained), range(n)))
        rates[constrained] = toks / (time.time() - t)
    print(f"batch {conc}: unconstrained {rates[False]:.0f} tok/s, json_schema {rates[True]:.0f} tok/s, "
          f"ratio {rates[True] / rates[False]:.2f}")
