"""Goldens for parsing GLM-4.5 output with vLLM's own `glm45` parsers.

Runs vLLM's parser (in vLLM 0.32 `--tool-call-parser glm45` and
`--reasoning-parser glm45` both map to `vllm.parser.glm47_moe.Glm47MoeParser`)
on seeded random and hand-written generations and records what it returns,
so the Rust parser in `crates/chat/src/glm45.rs` is checked against vLLM
itself. With tools, `Glm47MoeParser.parse` (reasoning + tool calls, names
checked against the request's tools, argument strings coerced with their
JSON Schema types); without tools, the reasoning adapter's
`extract_reasoning` (tool tags are then text).

Usage: /var/tmp/vllm-venv/bin/python scripts/glm45_output_golden.py \
           > tests/fixtures/chat/glm45_output_golden.json
"""

import json
import random
import sys

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.engine.registered_adapters import Glm47MoeParserReasoningAdapter
from vllm.parser.glm47_moe import Glm47MoeParser


class NoVocabTokenizer:
    """The parser only asks the tokenizer for special-token ids (used on
    token-id input, which these text-only cases never have)."""

    chat_template = None

    def get_vocab(self):
        return {}

    def decode(self, ids):
        return ""


def _fn(name, props):
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": props}}}


TOOLS = [
    _fn("get_weather", {"city": {"type": "string"}, "days": {"type": "integer"},
                        "metric": {"type": "boolean"}, "lat": {"type": "number"}}),
    _fn("write_file", {"path": {"type": "string"}, "content": {"type": "string"},
                       "mode": {"type": ["integer", "null"]}, "tags": {"type": "array"},
                       "opts": {"type": "object"}}),
    _fn("search", {"q": {"type": "string"}, "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                   "kind": {"enum": ["web", "code"]}, "n": {"enum": [1, 2, 3]},
                   "anything": {}, "ratio": {"type": ["number", "string"]}}),
    _fn("ping", {}),
    _fn("写文件", {"路径": {"type": "string"}}),
]

VALUES = ["Paris", "São Paulo", "東京 🌍", "3", "-12", "+5", " 7 ", "007", "2.5", "3.0", "1e3", ".5",
          "true", "False", "1", "0", "null", "None", "[1, 2, \"x\"]", "{\"a\": {\"b\": null}}",
          "[1,", "abc", "", "  spaced  ", "line1\nline2", "say \"hi\"", "a\\b", "tab\there",
          "nan", "inf", "-0", "12345678901234", "1.25e-3", "<b>bold</b>", "web", "code", "2"]
KEYS = ["city", "days", "metric", "lat", "path", "content", "mode", "tags", "opts", "q", "limit",
        "kind", "n", "anything", "ratio", "路径", "extra", " city "]
NAMES = ["get_weather", "write_file", "search", "ping", "写文件", "unknown_fn", ""]


def _call(rng):
    name = rng.choice(NAMES)
    sep = rng.choice(["\n", "", "\n", " "])
    body = f"<tool_call>{name}{sep}"
    for _ in range(rng.randint(0, 4)):
        gap = rng.choice(["", "\n", "\n", " \n"])
        body += f"<arg_key>{rng.choice(KEYS)}</arg_key>{gap}<arg_value>{rng.choice(VALUES)}</arg_value>{rng.choice(['', chr(10)])}"
    if rng.random() < 0.05:
        body += "<arg_key>dangling</arg_key>"
    closed = rng.random() < 0.9
    return body + ("</tool_call>" if closed else ""), closed


def _output(rng):
    parts = []
    kind = rng.random()
    if kind < 0.7:
        opener = "<think>" if rng.random() < 0.3 else ""
        parts.append(opener + rng.choice(["Plan the call.", "\nHmm, 東京?\n", "", "think  \n", "a <arg_key>b"]))
        if rng.random() < 0.85:
            parts.append("</think>")
    parts.append(rng.choice(["", "", "\n", "\nLet me check.", "Sure — checking.\n", "ok ", " x </think> y"]))
    for _ in range(rng.randint(0, 3)):
        text, closed = _call(rng)
        parts.append(text)
        if not closed:
            break
        parts.append(rng.choice(["", "\n", "\n\n", " trailing text", "<think>again</think>", "</tool_call>"]))
    return "".join(parts)


HAND = [
    "<think>hmm </think>\nHello <tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
    "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call> after",
    "reasoning, prompt opened it</think>\n\nThe answer is 4.",
    "cut off while thinking",
    "\n<tool_call>ping</tool_call>",
    "<tool_call>ping\n</tool_call>\n<tool_call>search\n<arg_key>q</arg_key>\n<arg_value>rust</arg_value>\n"
    "<arg_key>limit</arg_key>\n<arg_value>null</arg_value>\n</tool_call>",
    "</think><tool_call>unknown_fn<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>  x ",
    "</think>text <tool_call>write_file\n<arg_key>path</arg_key>\n<arg_value>/tmp/a b.txt</arg_value>\n"
    "<arg_key>content</arg_key>\n<arg_value>line 1\nline 2\n</arg_value>\n<arg_key>mode</arg_key><arg_value>420</arg_value>",
    "</think><tool_call>get_weather<arg_key>city</arg_key>x<arg_key>days</arg_key><arg_value>2</arg_value></tool_call>",
    "thinking <tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value></tool_call>",
]


def _request(with_tools):
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}],
                                 tools=TOOLS if with_tools else None)


def parse(output, thinking, with_tools):
    kwargs = {"chat_template_kwargs": {"enable_thinking": thinking}}
    request = _request(with_tools)
    if with_tools:
        parser = Glm47MoeParser(NoVocabTokenizer(), request.tools, **kwargs)
        reasoning, content, calls = parser.parse(output, request)
        calls = [{"name": c.name, "arguments": c.arguments} for c in calls or []]
    else:
        parser = Glm47MoeParserReasoningAdapter(NoVocabTokenizer(), **kwargs)
        reasoning, content = parser.extract_reasoning(output, request)
        calls = []
    return reasoning, content, calls


def main():
    rng = random.Random(45)
    cases = []
    outputs = [(t, True, True) for t in HAND]
    outputs += [(t, False, True) for t in HAND[:4]] + [(t, True, False) for t in HAND]
    for _ in range(400):
        outputs.append((_output(rng), rng.random() < 0.8, rng.random() < 0.85))
    for i, (text, thinking, with_tools) in enumerate(outputs):
        reasoning, content, calls = parse(text, thinking, with_tools)
        cases.append({"name": f"glm45_{i:03d}", "output": text, "enable_thinking": thinking,
                      "tools": with_tools, "reasoning_content": reasoning, "content": content,
                      "tool_calls": calls})
    json.dump({"generator": "scripts/glm45_output_golden.py (vLLM glm45 = Glm47MoeParser)",
               "tools": TOOLS, "cases": cases}, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
