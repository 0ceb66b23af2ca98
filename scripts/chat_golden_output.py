"""Goldens for parsing Qwen3 output (reasoning + Hermes tool calls).

`reference_parse` restates, in a few lines, what vLLM's `qwen3` reasoning
parser and `hermes` tool parser return for a finished generation (written
from reading their source; vLLM itself is not installed here). The point is
to have *Python* produce the expected strings — above all `json.dumps` of the
arguments, whose float and unicode spelling the Rust side reimplements.

Outputs are restricted to the shapes where the Rust parser is specified to
agree with vLLM: `<think>` only at the start, only whitespace after tool
calls, and either all calls well-formed or the whole output treated as
content. The deliberate differences (text after calls is kept, a malformed
call only affects itself) are covered by the Rust unit tests.
"""

import json
import random
import re

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def reference_parse(output, thinking):
    """(reasoning, content, [(name, arguments)]) with empty strings as None."""
    reasoning, content = None, output
    if thinking:
        head, tag, tail = output.partition("<think>")
        body = tail if tag else head
        if "</think>" in body:
            reasoning, _, content = body.partition("</think>")
        else:
            reasoning, content = body, ""
    calls = []
    if "<tool_call>" in content:
        try:
            parsed = [json.loads(a or b) for a, b in _CALL.findall(content)]
            for call in parsed:
                if isinstance(call["arguments"], str):
                    call["arguments"] = json.loads(call["arguments"])
                if not isinstance(call["name"], str):
                    raise TypeError("name")
            calls = [(c["name"], json.dumps(c["arguments"], ensure_ascii=False)) for c in parsed]
            content = content[: content.find("<tool_call>")]
        except Exception:
            calls = []
    return (reasoning or None), (content or None), calls


def _float(rng):
    kind = rng.random()
    if kind < 0.3:
        return rng.uniform(-1000, 1000)
    if kind < 0.6:
        return rng.uniform(0, 1) * 10 ** rng.randint(-12, 25)
    if kind < 0.8:
        return float(rng.randint(-10**6, 10**6))
    return rng.choice([0.1, 0.2, 1e16, 1e-5, 1e-4, 123456789.123, 5e-324, 1.7976931348623157e308])


def _value(rng, depth=0):
    kind = rng.randint(0, 9 if depth < 2 else 6)
    if kind == 0:
        return rng.randint(-10**12, 10**12)
    if kind in (1, 2):
        return _float(rng)
    if kind == 3:
        return rng.choice([True, False, None])
    if kind in (4, 5, 6):
        return rng.choice(["Paris", "São Paulo", "東京 🌍", 'say "hi"', "a\\b", "tab\tnl\n", "\u0007bell", ""])
    if kind in (7, 8):
        return {f"k{i}": _value(rng, depth + 1) for i in range(rng.randint(0, 3))}
    return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]


def _call_text(rng, name, args):
    style = rng.random()
    if style < 0.5:
        body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
    elif style < 0.7:
        body = json.dumps({"name": name, "arguments": args}, separators=(",", ":"), ensure_ascii=True)
    elif style < 0.85:
        body = json.dumps({"arguments": args, "name": name}, indent=2)
    else:
        # Double-encoded arguments, which vLLM decodes.
        body = json.dumps({"name": name, "arguments": json.dumps(args)})
    closed = rng.random() < 0.9
    return f"<tool_call>\n{body}\n" + ("</tool_call>" if closed else ""), closed


def _output(rng):
    thinking = rng.random() < 0.6
    parts = []
    if thinking:
        opener = "<think>" if rng.random() < 0.8 else ""
        parts.append(f"{opener}\n{rng.choice(['Plan the call.', 'Hmm, 東京?', ''])}\n</think>\n\n")
    if rng.random() < 0.3:
        parts.append(rng.choice(["Let me check.", "Sure — checking.\n", "ok "]))
    calls = rng.randint(0, 3)
    for _ in range(calls):
        args = {f"a{i}": _value(rng) for i in range(rng.randint(0, 4))}
        text, closed = _call_text(rng, rng.choice(["get_weather", "run", "写文件"]), args)
        parts.append(text)
        if not closed:
            break
        parts.append(rng.choice(["", "\n", "\n\n", " \n"]))
    if calls == 0 and rng.random() < 0.2:
        # A malformed call: vLLM keeps the whole output as content. (After
        # good calls vLLM would drop those too; the Rust parser deliberately
        # keeps them, so that shape is not generated.)
        parts.append('<tool_call>\n{"name": "broken", "arguments": {"a": }\n</tool_call>')
    if len(parts) == (1 if thinking else 0):
        parts.append(rng.choice(["The answer is 42.", "Bonjour 🌍", ""]))
    return "".join(parts), thinking


HAND = [
    ("<think>\nLet me think.\n</think>\n\nThe answer is 4.", True),
    ("reasoning only, prompt opened it</think>answer", True),
    ("<think>\ncut off while thinking", True),
    ("plain answer, thinking off", False),
    ("<tool_call>\n{\"name\": 5, \"arguments\": {}}\n</tool_call>", False),
    ("<tool_call>\n{\"arguments\": {}}\n</tool_call>", False),
]


def output_cases(seed, count):
    rng = random.Random(seed)
    cases = []
    for i, (text, thinking) in enumerate(HAND + [_output(rng) for _ in range(count)]):
        reasoning, content, calls = reference_parse(text, thinking)
        cases.append({
            "name": f"output_{i:03d}",
            "output": text,
            "enable_thinking": thinking,
            "reasoning_content": reasoning,
            "content": content,
            "tool_calls": [{"name": n, "arguments": a} for n, a in calls],
        })
    return cases
