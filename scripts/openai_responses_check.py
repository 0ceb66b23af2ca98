"""Drive agentd's `/v1/responses` with the official `openai` SDK and the
OpenAI Agents SDK's default model class (`OpenAIResponsesModel`), unchanged.

Usage: python scripts/openai_responses_check.py http://127.0.0.1:8000/v1
Checks responses.create / retrieve / delete, responses.stream (events and the
accumulated snapshot), a 3-turn tool loop through `previous_response_id` whose
later turns reuse the chain's KV (cached tokens >= the previous turn's prompt),
and an Agents SDK run with a function tool. Exits non-zero on the first failure.
"""

import asyncio
import sys

import openai
from openai import OpenAI

base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/v1"
client = OpenAI(base_url=base, api_key="unused")
model = client.models.list().data[0].id

# --- create / retrieve / delete
r = client.responses.create(model=model, input="Say hello.", instructions="Be brief.",
                            max_output_tokens=8, temperature=0)
assert r.object == "response" and r.status in ("completed", "incomplete"), r
assert r.usage.output_tokens <= 8 and r.usage.input_tokens > 0, r.usage
got = client.responses.retrieve(r.id)
assert got.id == r.id and got.output_text == r.output_text, (got, r)
print("create/retrieve:", r.status, r.usage)

# --- streaming through the SDK's helper: the snapshot it accumulates from
# the deltas equals the response the server stored.
with client.responses.stream(model=model, input="Count to five.", max_output_tokens=8,
                             temperature=0) as stream:
    events = list(stream)
types = [e.type for e in events]
assert types[0] == "response.created", types
assert types[-1] in ("response.completed", "response.incomplete"), types
final = events[-1].response
deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
assert deltas == final.output_text, (deltas, final.output_text)
assert client.responses.retrieve(final.id).output_text == deltas
print("stream:", len(events), "events,", types[-1])

# --- a 3-turn tool loop chained by previous_response_id: one program whose
# KV survives between turns.
tools = [{"type": "function", "name": "run_tests", "description": "Run the test suite",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                         "required": ["path"]}}]
system = ("You are a software engineering agent. You run tools, read their output and "
          "fix the failing tests. " * 6)
turn = client.responses.create(model=model, instructions=system, tools=tools,
                               input="Run the tests under src/.", max_output_tokens=8,
                               temperature=0)
for i in range(2):
    calls = [o for o in turn.output if o.type == "function_call"]
    if calls:
        items = [{"type": "function_call_output", "call_id": c.call_id, "output": "1 failed"}
                 for c in calls]
    else:
        # The random-weight model rarely calls on its own: send the call it
        # would have made, then its result (both are valid input items).
        items = [{"type": "function_call", "call_id": f"call_{i}", "name": "run_tests",
                  "arguments": '{"path": "src"}'},
                 {"type": "function_call_output", "call_id": f"call_{i}", "output": "1 failed"}]
    prev = turn
    turn = client.responses.create(model=model, instructions=system, tools=tools,
                                   previous_response_id=prev.id, input=items,
                                   max_output_tokens=8, temperature=0)
    cached = turn.usage.input_tokens_details.cached_tokens
    assert cached >= prev.usage.input_tokens, (i, cached, prev.usage)
    print(f"turn {i + 2}: cached {cached} of {turn.usage.input_tokens} "
          f"(previous prompt {prev.usage.input_tokens})")

deleted = client.responses.delete(turn.id)
try:
    client.responses.retrieve(turn.id)
    raise AssertionError("a deleted response is still served")
except openai.NotFoundError:
    pass
print("delete:", deleted)


# --- the OpenAI Agents SDK's default model class with a function tool.
async def agents_run():
    from agents import (Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool,
                        set_tracing_disabled)

    set_tracing_disabled(True)
    ran = []

    @function_tool
    def list_files(path: str) -> str:
        """List the files under a path."""
        ran.append(path)
        return "README.md src/ Cargo.toml"

    agent = Agent(
        name="agent", instructions="You are a coding agent.", tools=[list_files],
        model=OpenAIResponsesModel(model=model, openai_client=openai.AsyncOpenAI(
            base_url=base, api_key="unused")),
        # The random-weight model rarely ends a turn by itself, and the Agents
        # SDK refuses an `incomplete` (max_output_tokens) response: stop
        # strings end its turns (greedy, so the run is the same every time).
        model_settings=ModelSettings(max_tokens=16, temperature=0, extra_body={
            "stop": ["\n", " ", ".", ",", "e", "a", "t", "o", "i", "s", "n", "r"]}),
    )
    result = await Runner.run(agent, "List the files in the repository.", max_turns=4)
    assert result.raw_responses, result
    for resp in result.raw_responses:
        assert resp.usage.input_tokens > 0, resp.usage
    print("agents:", len(result.raw_responses), "model turns,", len(ran), "tool runs")


try:
    import agents  # noqa: F401
except ImportError:
    print("WARNING: openai-agents is not installed; the Agents SDK run was NOT checked")
else:
    asyncio.run(agents_run())
print("ok")
