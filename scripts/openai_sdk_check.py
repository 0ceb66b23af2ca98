"""Drive `agentd serve` with the official `openai` Python SDK, unchanged.

Usage: python scripts/openai_sdk_check.py http://127.0.0.1:8000/v1 [SMALL_POOL_URL]
Checks chat (whole and streamed), `extra_body={"program_id": ...}` with a
second turn that reuses the program's KV, tools in the request, completions with
token ids, `n` choices (chat and a prompt list), and the release endpoint. With
a second server whose KV pool is smaller than the model's window, requests that
omit max_tokens (the SDK's default) succeed there and stop at the served
context length or at EOS. Exits non-zero on the first failure.
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


def without_max_tokens(small_base):
    """No max_tokens on a pool smaller than the window: the window served is
    the pool's, and generation runs to it (or to EOS)."""
    small = OpenAI(base_url=small_base, api_key="unused")
    window = small.models.list().data[0].model_extra["max_model_len"]
    assert window < 4096, window  # the tiny Qwen3's own window is 4096
    user = [{"role": "user", "content": "Tell me a story."}]

    def ended(reason, prompt, output, what):
        assert output > 0, what
        if reason == "length":
            assert prompt + output == window, (what, prompt, output, window)
        else:
            assert reason == "stop" and prompt + output <= window, (what, reason)

    r = small.chat.completions.create(model=model, messages=user, temperature=0,
                                      extra_body={"ignore_eos": True, **no_think})
    assert r.choices[0].finish_reason == "length", r
    assert r.usage.prompt_tokens + r.usage.completion_tokens == window, (r.usage, window)
    for seed in range(3):
        r = small.chat.completions.create(model=model, messages=user, temperature=1.0,
                                          seed=seed, extra_body=no_think)
        ended(r.choices[0].finish_reason, r.usage.prompt_tokens, r.usage.completion_tokens,
              f"chat seed {seed}")
    chunks = list(small.chat.completions.create(
        model=model, messages=user, temperature=1.0, seed=7, stream=True,
        stream_options={"include_usage": True}, extra_body=no_think))
    reason = next(c.choices[0].finish_reason for c in chunks
                  if c.choices and c.choices[0].finish_reason)
    ended(reason, chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens,
          "streamed chat")
    c = small.completions.create(model=model, prompt="Once upon a time", temperature=0,
                                 extra_body={"ignore_eos": True})
    assert c.choices[0].finish_reason == "length", c
    assert c.usage.prompt_tokens + c.usage.completion_tokens == window, (c.usage, window)
    resp = small.responses.create(model=model, input="Tell me a story.", temperature=1.0,
                                  store=False, extra_body={"seed": 1})
    assert resp.status in ("completed", "incomplete"), resp
    ended("length" if resp.status == "incomplete" else "stop", resp.usage.input_tokens,
          resp.usage.output_tokens, "responses")
    print(f"no max_tokens on a {window}-token pool: chat, stream, completions and "
          "responses end at the window or EOS")


if len(sys.argv) > 2:
    without_max_tokens(sys.argv[2])
print("ok")
