"""Drive `agentd serve` with the official `openai` Python SDK, unchanged.

Usage: python scripts/openai_sdk_check.py http://127.0.0.1:8000/v1
Checks chat (whole and streamed), `extra_body={"program_id": ...}` with a
second turn that reuses the program's KV, tools in the request, completions with
token ids, `n` choices (chat and a prompt list), and the release endpoint. Exits non-zero on the first failure.
"""

import json
import sys
import urllib.request

from openai import OpenAI

base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/v1"
client = OpenAI(base_url=base, api_key="unused")
model = client.models.list().data[0].id
no_think = {"chat_template_kwargs": {"enable_thinking": False}}

system = ("You are a software engineering agent. You work in a repository, run tools, "
          "read their output and fix the failing tests. Think step by step. " * 8)
msgs = [{"role": "system", "content": system},
        {"role": "user", "content": "List the files in the repo."}]
r1 = client.chat.completions.create(
    model=model, messages=msgs, max_tokens=12, temperature=0,
    extra_body={"program_id": "sdk-agent", **no_think},
)
assert r1.choices[0].finish_reason == "length", r1
assert r1.usage.completion_tokens == 12, r1.usage
print("chat:", r1.usage)

msgs += [{"role": "assistant", "content": r1.choices[0].message.content},
         {"role": "tool", "content": "README.md src/ Cargo.toml", "tool_call_id": "call_0"}]
r2 = client.chat.completions.create(
    model=model, messages=msgs, max_tokens=8, temperature=0,
    extra_body={"program_id": "sdk-agent", **no_think},
)
cached = r2.usage.prompt_tokens_details.cached_tokens
assert cached > 0, r2.usage
print("second turn cached_tokens:", cached, "of", r2.usage.prompt_tokens)

stream = client.chat.completions.create(
    model=model, messages=msgs, max_tokens=8, temperature=0, stream=True,
    stream_options={"include_usage": True},
    extra_body={"program_id": "sdk-agent", **no_think},
)
chunks = list(stream)
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
print("streamed:", len(chunks), "chunks,", len(text), "chars")

tools = [{"type": "function", "function": {
    "name": "run_tests", "description": "Run the test suite",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
r3 = client.chat.completions.create(
    model=model, messages=msgs, tools=tools, max_tokens=8, temperature=0,
    extra_body={"program_id": "sdk-agent", **no_think},
)
assert r3.choices[0].finish_reason in ("length", "stop", "tool_calls"), r3
print("tools accepted:", r3.choices[0].finish_reason)

c = client.completions.create(model=model, prompt=[1, 2, 3, 4], max_tokens=4, temperature=0)
assert c.usage.completion_tokens == 4, c
print("completions (token ids):", repr(c.choices[0].text))

rn = client.chat.completions.create(
    model=model, messages=msgs, max_tokens=4, temperature=0.8, seed=3, n=3,
    extra_body=no_think,
)
assert sorted(ch.index for ch in rn.choices) == [0, 1, 2], rn
assert rn.usage.completion_tokens <= 12, rn.usage
print("n=3:", [ch.finish_reason for ch in rn.choices])

cb = client.completions.create(model=model, prompt=["hello", "world"], n=2, max_tokens=3,
                               temperature=0)
assert sorted(ch.index for ch in cb.choices) == [0, 1, 2, 3], cb
print("completions, 2 prompts x n=2:", len(cb.choices), "choices")

req = urllib.request.Request(base.rsplit("/v1", 1)[0] + "/programs/release",
                             data=json.dumps({"program_id": "sdk-agent"}).encode(),
                             headers={"content-type": "application/json"})
print("release:", urllib.request.urlopen(req).read().decode())
print("ok")
