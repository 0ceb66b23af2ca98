"""Structured outputs through the official `openai` SDK: 50 seeded samples
each of json_schema, a required tool call and a named tool call must parse and
match their schema (100%); json_object samples must parse whenever they stop
(a random-weight model rarely closes an unbounded string within a short
budget; see crates/server/src/structured.rs).

Usage: python scripts/openai_structured_check.py http://127.0.0.1:8000/v1
"""

import json
import sys

from openai import OpenAI

base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/v1"
client = OpenAI(base_url=base, api_key="unused")
model = client.models.list().data[0].id
N = 50
msgs = [{"role": "user", "content": "Give me a record."}]

schema = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
        "color": {"enum": ["red", "green", "blue"]},
        "tag": {"type": "string", "maxLength": 6},
    },
    "required": ["ok", "n", "color", "tag"],
    "additionalProperties": False,
}


def check_record(v):
    assert set(v) == {"ok", "n", "color", "tag"}, v
    assert isinstance(v["ok"], bool), v
    assert isinstance(v["n"], int) and 0 <= v["n"] <= 9, v
    assert v["color"] in ("red", "green", "blue"), v
    assert isinstance(v["tag"], str) and len(v["tag"]) <= 6, v


weather = {"type": "object",
           "properties": {"city": {"enum": ["Paris", "Oslo"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 3}},
           "required": ["city", "days"], "additionalProperties": False}
alarm = {"type": "object", "properties": {"on": {"type": "boolean"}},
         "required": ["on"], "additionalProperties": False}
tools = [{"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": weather}},
         {"type": "function", "function": {"name": "set_alarm", "parameters": alarm}}]


def check_args(name, args):
    if name == "get_weather":
        assert set(args) == {"city", "days"} and args["city"] in ("Paris", "Oslo"), args
        assert isinstance(args["days"], int) and 1 <= args["days"] <= 3, args
    else:
        assert name == "set_alarm" and set(args) == {"on"} and isinstance(args["on"], bool), (name, args)


ok = 0
for seed in range(N):
    r = client.chat.completions.create(
        model=model, messages=msgs, max_tokens=64, temperature=1.0, seed=seed,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "record", "strict": True, "schema": schema}})
    assert r.choices[0].finish_reason == "stop", r
    check_record(json.loads(r.choices[0].message.content))
    ok += 1
print(f"json_schema: {ok}/{N} parse and match the schema")

for choice, want in (("required", None),
                     ({"type": "function", "function": {"name": "set_alarm"}}, "set_alarm")):
    ok = 0
    for seed in range(N):
        r = client.chat.completions.create(model=model, messages=msgs, max_tokens=64,
                                           temperature=1.0, seed=seed, tools=tools, tool_choice=choice)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1, r
        call = c.message.tool_calls[0].function
        assert want is None or call.name == want, call
        check_args(call.name, json.loads(call.arguments))
        ok += 1
    print(f"tool_choice {json.dumps(choice)}: {ok}/{N} calls parse and match the schema")

stopped = 0
for seed in range(N):
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=32, temperature=1.0,
                                       seed=seed, response_format={"type": "json_object"})
    text = r.choices[0].message.content
    assert text.startswith("{"), text
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict), text
        stopped += 1
print(f"json_object: {stopped}/{N} stopped and parse; the rest hit max_tokens inside a string")

try:
    client.chat.completions.create(model=model, messages=msgs, max_tokens=4, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "notatype"}}})
    raise SystemExit("an invalid schema was accepted")
except Exception as e:  # openai.BadRequestError
    assert getattr(e, "status_code", None) == 400, e
    assert "response_format.json_schema.schema" in str(e), e
print("invalid schema: 400 naming response_format.json_schema.schema")
