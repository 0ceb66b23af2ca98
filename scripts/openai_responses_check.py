"""Drive agentd's `/v1/responses` with the official `openai` SDK and the
OpenAI Agents SDK's default model class (`OpenAIResponsesModel`), unchanged.

Usage: python scripts/openai_responses_check.py http://127.0.0.1:8000/v1
Checks responses.create / retrieve / delete, responses.stream (events and the
accumulated snapshot), a 3-turn tool loop through `previous_response_id` whose
later turns reuse the chain's KV (cached tokens >= the previous turn's prompt),
and an Agents SDK run whose forced function tool runs and whose output is fed back
to the next model turn. Exits non-zero on the first failure.
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


# --- the OpenAI Agents SDK's default model class with a function tool: the
# first turn must call it (tool_choice "required", enforced by the grammar),
# the SDK runs it and feeds its output back in the next turn's input (the SDK
# resets tool_choice to auto after a tool ran), and that turn answers.
async def agents_run():
    from typing import Literal

    from agents import (Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool,
                        set_tracing_disabled)
    from agents.items import ToolCallItem, ToolCallOutputItem

    set_tracing_disabled(True)
    ran = []
    listing = "README.md src/ Cargo.toml"

    @function_tool
    def list_files(path: Literal["src", "tests"]) -> str:
        """List the files under a path."""
        ran.append(path)
        return listing

    # The random-weight model rarely ends a turn by itself, and the Agents
    # SDK refuses an `incomplete` (max_output_tokens) response: stop strings
    # end its text turns. None of them occurs in the forced call
    # (`<tool_call>\n{"name": "list_files", "arguments": {"path": "src"}}\n</tool_call>`,
    # the path an enum), so the call is never cut. Greedy: the run is the
    # same every time.
    stops = ["\n\n", "x", "z", "q", "k", "w", "y", "v", "b", "d", "j", "0", "1", "2", "3", "4", "5"]
    agent = Agent(
        name="agent", instructions="You are a coding agent.", tools=[list_files],
        model=OpenAIResponsesModel(model=model, openai_client=openai.AsyncOpenAI(
            base_url=base, api_key="unused")),
        model_settings=ModelSettings(max_tokens=32, temperature=0, tool_choice="required",
                                     extra_body={"stop": stops}),
    )
    result = await Runner.run(agent, "List the files in the repository.", max_turns=4)
    calls = [i for i in result.new_items if isinstance(i, ToolCallItem)]
    outputs = [i for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    assert ran and ran[0] in ("src", "tests"), ran
    assert calls and calls[0].raw_item.name == "list_files", result.new_items
    assert outputs and outputs[0].output == listing, result.new_items
    assert outputs[0].raw_item["call_id"] == calls[0].raw_item.call_id, (calls, outputs)
    # The next model turn saw the call and its output: its prompt is the
    # first turn's plus both items.
    first, second = result.raw_responses[0], result.raw_responses[1]
    assert any(o.type == "function_call" for o in first.output), first.output
    assert second.usage.input_tokens > first.usage.input_tokens + 8, (first.usage, second.usage)
    assert isinstance(result.final_output, str), result.final_output
    print("agents:", len(result.raw_responses), "model turns,", len(ran), "tool runs,",
          "prompt", first.usage.input_tokens, "->", second.usage.input_tokens,
          "tokens with the tool output fed back; final output", repr(result.final_output))


try:
    import agents  # noqa: F401
except ImportError:
    print("WARNING: openai-agents is not installed; the Agents SDK run was NOT checked")
else:
    asyncio.run(agents_run())
print("ok")
