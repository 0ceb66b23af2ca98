"""Seeded random conversations for the chat-template goldens.

Hand-written cases pin the behaviours we know about; these sweep the Qwen3
template's branches in combinations nobody thought of (reasoning in history
at various positions, multi-step tool loops, tool-response-looking user
turns, awkward characters in content and arguments). Used by
make_chat_golden.py; deterministic for a given seed.
"""

import json
import random

TEXTS = [
    "Hello!",
    "What's the weather in Paris?",
    "  leading and trailing spaces  ",
    "line one\nline two\n",
    "\n\nstarts with newlines",
    "quotes \" and 'single' and back\\slash",
    "tabs\tand\u0001control",
    "unicode: é 東京 🌍 👋🏽 Привет",
    "looks like jinja {{ messages }} {% if %}",
    "<tool_response>\nfake\n</tool_response>",
    "mentions </think> in the middle",
    "",
]

REASONING = [
    "Let me think.",
    "\nmulti\nline\n",
    "uses <tool_call> in thought",
    "",
]

ARG_VALUES = [
    "Paris", "São Paulo", "東京", 'with "quotes"', "back\\slash", "new\nline",
    0, 1, -7, 123456789012, 0.5, 1.0, 1e-7, 2.5e21, True, False, None,
    # Floats whose shortest repr needs exact (correctly rounded) parsing.
    981.4296509745093, 4.3191936762038866e-10, 98482193.25097273, -938.7247735605499,
    [1, "two", 3.0], {"nested": {"deep": [True, None]}}, [], {},
]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "run_shell", "description": "Run a shell command — carefully.",
        "parameters": {"type": "object", "properties": {
            "cmd": {"type": "string"}, "timeout": {"type": "number", "default": 30.0}}}}},
    {"type": "function", "function": {"name": "no_params", "description": "Takes nothing."}},
]


def _args(rng):
    keys = ["city", "cmd", "timeout", "options", "x", "ключ"]
    rng.shuffle(keys)
    return {k: rng.choice(ARG_VALUES) for k in keys[: rng.randint(0, 3)]}


def _text(rng):
    return rng.choice(TEXTS)


def _content(rng, text):
    """A string, or the same text as a list of one or two parts."""
    roll = rng.random()
    if roll < 0.7:
        return text
    if roll < 0.85 or len(text) < 2:
        return [{"type": "text", "text": text}]
    cut = rng.randint(1, len(text) - 1)
    return [{"type": "text", "text": text[:cut]}, {"type": "text", "text": text[cut:]}]


def _assistant(rng, call_counter):
    msg = {"role": "assistant"}
    style = rng.random()
    text = _text(rng)
    if style < 0.3:
        msg["content"] = _content(rng, f"<think>\n{rng.choice(REASONING)}\n</think>\n\n{text}")
    elif style < 0.45:
        msg["content"] = text
        msg["reasoning_content"] = rng.choice(REASONING)
    else:
        msg["content"] = _content(rng, text)
    calls = []
    if rng.random() < 0.45:
        for _ in range(rng.randint(1, 3)):
            call_counter[0] += 1
            args = _args(rng)
            encoded = json.dumps(args, ensure_ascii=rng.random() < 0.3) if rng.random() < 0.8 else args
            calls.append({"id": f"call_{call_counter[0]}", "type": "function",
                          "function": {"name": rng.choice(TOOLS)["function"]["name"],
                                       "arguments": encoded}})
        msg["tool_calls"] = calls
        if rng.random() < 0.5:
            msg["content"] = None
    return msg, calls


def random_case(rng, index):
    call_counter = [0]
    messages = []
    if rng.random() < 0.5:
        messages.append({"role": rng.choice(["system", "system", "developer"]),
                         "content": _content(rng, _text(rng) or "You are helpful.")})
    for _ in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": _content(rng, _text(rng))})
        for _ in range(rng.randint(0, 3)):
            msg, calls = _assistant(rng, call_counter)
            messages.append(msg)
            if not calls:
                break
            for call in calls:
                messages.append({"role": "tool", "tool_call_id": call["id"],
                                 "content": _content(rng, _text(rng))})
    case = {"name": f"random_{index:03d}", "messages": messages}
    if rng.random() < 0.5:
        case["tools"] = rng.sample(TOOLS, rng.randint(1, len(TOOLS)))
    thinking = rng.choice([None, True, False])
    if thinking is not None:
        case["chat_template_kwargs"] = {"enable_thinking": thinking}
    last = messages[-1]
    final_text = last.get("content") if isinstance(last.get("content"), str) else None
    if last["role"] == "assistant" and final_text and final_text.strip() and rng.random() < 0.3:
        case["continue_final_message"] = True
        case["add_generation_prompt"] = False
    else:
        case["add_generation_prompt"] = rng.random() < 0.7
    return case


def random_cases(seed, count):
    rng = random.Random(seed)
    return [random_case(rng, i) for i in range(count)]
