#!/usr/bin/env python3
"""Render chat-template golden cases with Hugging Face transformers.

The Rust crate `agentd-chat` must render prompts byte-for-byte as
`tokenizer.apply_chat_template(..., tokenize=False)` does. This script is the
reference: it loads the real Qwen3 tokenizer from `models/qwen3/`, renders every
case below and writes `tests/fixtures/chat/qwen3_golden.json`; it also writes
`tests/fixtures/chat/qwen3_output_golden.json` (output parsing, see
chat_golden_output.py). CI never runs Python; the Rust tests compare against
the committed fixtures.

Cases are written the way an OpenAI client sends them (tool-call `arguments` as
a JSON string, `content` as a list of text parts or null). Before rendering we
apply the same normalisation vLLM applies to OpenAI requests and that the Rust
crate implements (see `normalize_like_vllm`), because transformers itself does
not accept those shapes with the Qwen3 template (it would try `str + list`).

Usage: scripts/make_chat_golden.sh (creates a venv outside the repository).
"""

import copy
import json
import os
import sys

import transformers
from transformers import AutoTokenizer

from chat_golden_output import output_cases
from chat_golden_random import random_cases

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_DIR = os.path.join(ROOT, "models", "qwen3")
OUT = os.path.join(ROOT, "tests", "fixtures", "chat", "qwen3_golden.json")
OUTPUT_OUT = os.path.join(ROOT, "tests", "fixtures", "chat", "qwen3_output_golden.json")


def normalize_like_vllm(messages, content_format="string"):
    """OpenAI request messages -> the dicts a chat template sees (vLLM's rules).

    - content, "string" format (vLLM detects it for templates that concatenate
      message.content, like Qwen3's): text parts joined with "\\n"; null -> "".
    - content, "openai" format (templates that loop over message['content']):
      always a list of {"type": "text", "text": ...} parts; null -> [].
    - tool-call arguments given as a JSON string are parsed into an object
      (vLLM does this so templates can `tojson` them); an empty string -> {}.
    - `reasoning` (preferred) or `reasoning_content` is forwarded as
      `reasoning_content` on assistant messages only.
    - role "developer" (OpenAI's newer name for system) -> "system".
    """
    out = []
    for message in messages:
        m = copy.deepcopy(message)
        content = m.get("content")
        if content is None:
            texts = []
        elif isinstance(content, list):
            texts = [part["text"] for part in content]
        else:
            texts = [content]
        if content_format == "openai":
            m["content"] = [{"type": "text", "text": t} for t in texts]
        else:
            m["content"] = "\n".join(texts)
        if m.get("role") == "developer":
            m["role"] = "system"
        for call in m.get("tool_calls") or []:
            args = call["function"].get("arguments")
            if isinstance(args, str):
                call["function"]["arguments"] = json.loads(args) if args else {}
        reasoning = m.pop("reasoning", None)
        if reasoning is None:
            reasoning = m.pop("reasoning_content", None)
        else:
            m.pop("reasoning_content", None)
        if m["role"] == "assistant" and reasoning is not None:
            m["reasoning_content"] = reasoning
        out.append(m)
    return out


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.\nReturns the top results.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "max_results": {"type": "integer", "default": 5, "minimum": 1},
                "temperature": {"type": "number", "default": 0.5},
                "safe": {"type": "boolean", "default": True},
                "region": {"type": ["string", "null"], "default": None},
            },
            "required": ["query"],
        },
    },
}

UNICODE_TOOL = {
    "type": "function",
    "function": {
        "name": "traduire",
        "description": "Traduit un texte — « guillemets », 日本語, emoji 🌍.",
        "parameters": {
            "type": "object",
            "properties": {"texte": {"type": "string", "description": "Le texte à traduire"}},
            "required": ["texte"],
        },
    },
}


def call(id_, name, arguments):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


CASES = [
    {"name": "single_user", "messages": [{"role": "user", "content": "Hello!"}],
     "add_generation_prompt": True},
    {"name": "single_user_no_generation_prompt", "messages": [{"role": "user", "content": "Hello!"}],
     "add_generation_prompt": False},
    {"name": "system_and_user",
     "messages": [{"role": "system", "content": "You are a terse assistant."},
                  {"role": "user", "content": "What is 2+2?"}],
     "add_generation_prompt": True},
    {"name": "developer_role_as_system",
     "messages": [{"role": "developer", "content": "Answer in French."},
                  {"role": "user", "content": "Hi"}],
     "add_generation_prompt": True},
    {"name": "multi_turn",
     "messages": [{"role": "system", "content": "You are helpful."},
                  {"role": "user", "content": "What is the capital of France?"},
                  {"role": "assistant", "content": "Paris."},
                  {"role": "user", "content": "And of Italy?"},
                  {"role": "assistant", "content": "Rome."},
                  {"role": "user", "content": "Thanks"}],
     "add_generation_prompt": True},
    {"name": "multi_turn_ending_with_assistant_no_generation_prompt",
     "messages": [{"role": "user", "content": "Say hi"},
                  {"role": "assistant", "content": "Hi!"}],
     "add_generation_prompt": False},
    {"name": "enable_thinking_false", "messages": [{"role": "user", "content": "Quick answer: 3*7?"}],
     "add_generation_prompt": True, "chat_template_kwargs": {"enable_thinking": False}},
    {"name": "enable_thinking_true", "messages": [{"role": "user", "content": "Think about 3*7."}],
     "add_generation_prompt": True, "chat_template_kwargs": {"enable_thinking": True}},
    {"name": "enable_thinking_false_no_generation_prompt",
     "messages": [{"role": "user", "content": "Hi"}],
     "add_generation_prompt": False, "chat_template_kwargs": {"enable_thinking": False}},
    {"name": "history_with_think_blocks_stripped",
     "messages": [{"role": "user", "content": "What is 6*7?"},
                  {"role": "assistant", "content": "<think>\n6*7 is 42.\n</think>\n\n42"},
                  {"role": "user", "content": "And 6*8?"},
                  {"role": "assistant", "content": "<think>\nAdd 6 to 42.\n</think>\n\n48"},
                  {"role": "user", "content": "Thanks!"}],
     "add_generation_prompt": True},
    {"name": "final_assistant_keeps_think",
     "messages": [{"role": "user", "content": "What is 6*7?"},
                  {"role": "assistant", "content": "<think>\nmultiply\n</think>\n\n42"}],
     "add_generation_prompt": False},
    {"name": "reasoning_content_field",
     "messages": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": None, "reasoning_content": "I should call the tool.",
                   "tool_calls": [call("call_1", "get_weather", "{\"city\": \"Paris\"}")]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}],
     "tools": [WEATHER_TOOL], "add_generation_prompt": True},
    {"name": "reasoning_alias_field",
     "messages": [{"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello!", "reasoning": "Greet back."}],
     "add_generation_prompt": False},
    {"name": "tools_with_system",
     "messages": [{"role": "system", "content": "You are a weather bot."},
                  {"role": "user", "content": "Weather in Paris?"}],
     "tools": [WEATHER_TOOL, SEARCH_TOOL], "add_generation_prompt": True},
    {"name": "tools_without_system",
     "messages": [{"role": "user", "content": "Search for rust minijinja"}],
     "tools": [SEARCH_TOOL], "add_generation_prompt": True},
    {"name": "empty_tools_list_is_no_tools",
     "messages": [{"role": "user", "content": "Hi"}],
     "tools": [], "add_generation_prompt": True},
    {"name": "assistant_single_tool_call",
     "messages": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": None,
                   "tool_calls": [call("call_1", "get_weather", "{\"city\": \"Paris\", \"unit\": \"celsius\"}")]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"clear\"}"}],
     "tools": [WEATHER_TOOL], "add_generation_prompt": True},
    {"name": "assistant_several_tool_calls_with_text",
     "messages": [{"role": "system", "content": "Be precise."},
                  {"role": "user", "content": "Weather in Paris and Rome?"},
                  {"role": "assistant", "content": "Let me check both.",
                   "tool_calls": [call("call_a", "get_weather", "{\"city\": \"Paris\"}"),
                                  call("call_b", "get_weather", "{\"city\": \"Rome\"}")]},
                  {"role": "tool", "tool_call_id": "call_a", "content": "18C"},
                  {"role": "tool", "tool_call_id": "call_b", "content": "24C"},
                  {"role": "assistant", "content": "Paris 18C, Rome 24C."},
                  {"role": "user", "content": "Thanks"}],
     "tools": [WEATHER_TOOL], "add_generation_prompt": True},
    {"name": "multi_step_tools_with_reasoning",
     "messages": [{"role": "user", "content": "Find the weather where the Louvre is."},
                  {"role": "assistant", "content": "<think>\nFirst find the city.\n</think>\n\n",
                   "tool_calls": [call("c1", "search", "{\"query\": \"Louvre city\"}")]},
                  {"role": "tool", "tool_call_id": "c1", "content": "Paris"},
                  {"role": "assistant", "content": "<think>\nNow the weather.\n</think>\n\n",
                   "tool_calls": [call("c2", "get_weather", "{\"city\": \"Paris\"}")]},
                  {"role": "tool", "tool_call_id": "c2", "content": "Sunny"}],
     "tools": [SEARCH_TOOL, WEATHER_TOOL], "add_generation_prompt": True,
     "chat_template_kwargs": {"enable_thinking": True}},
    {"name": "tool_arguments_as_object_and_nested",
     "messages": [{"role": "user", "content": "Search"},
                  {"role": "assistant", "content": "",
                   "tool_calls": [{"id": "x", "type": "function",
                                   "function": {"name": "search",
                                                "arguments": {"query": "a \"quoted\"\nline", "max_results": 3,
                                                              "temperature": 0.25, "safe": False, "region": None,
                                                              "filters": {"lang": ["en", "fr"], "year": 2024}}}}]},
                  {"role": "tool", "tool_call_id": "x", "content": "[]"}],
     "tools": [SEARCH_TOOL], "add_generation_prompt": True},
    {"name": "tool_arguments_number_formats",
     "messages": [{"role": "user", "content": "n"},
                  {"role": "assistant", "content": None,
                   "tool_calls": [call("n1", "search",
                                       "{\"a\": 1.0, \"b\": 1e20, \"c\": 1.5e-7, \"d\": -0.0, \"e\": 123456789012,"
                                       " \"f\": 0.1, \"g\": 1e16, \"h\": 1234567890123456.7, \"i\": [], \"j\": {}}")]}],
     "tools": [SEARCH_TOOL], "add_generation_prompt": False},
    {"name": "tool_response_looking_user_message",
     "messages": [{"role": "user", "content": "Start"},
                  {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nok"},
                  {"role": "user", "content": "<tool_response>\nresult\n</tool_response>"}],
     "add_generation_prompt": True},
    {"name": "content_as_text_parts",
     "messages": [{"role": "system", "content": [{"type": "text", "text": "You are helpful."}]},
                  {"role": "user", "content": [{"type": "text", "text": "First part."},
                                               {"type": "text", "text": "Second part."}]},
                  {"role": "assistant", "content": [{"type": "text", "text": "Noted."}]},
                  {"role": "user", "content": [{"type": "text", "text": "Go on"}]}],
     "add_generation_prompt": True},
    {"name": "unicode_everywhere",
     "messages": [{"role": "system", "content": "Réponds en français. 日本語も大丈夫。"},
                  {"role": "user", "content": "Traduis « bonjour » — and 🌍 👋🏽"},
                  {"role": "assistant", "content": None,
                   "tool_calls": [call("u1", "traduire", "{\"texte\": \"bonjour — ça va ? 東京 🌍\\u00e9\"}")]},
                  {"role": "tool", "tool_call_id": "u1", "content": "こんにちは"}],
     "tools": [UNICODE_TOOL], "add_generation_prompt": True},
    {"name": "second_system_message_mid_conversation",
     "messages": [{"role": "system", "content": "S1"},
                  {"role": "user", "content": "U1"},
                  {"role": "system", "content": "S2"},
                  {"role": "user", "content": "U2"}],
     "add_generation_prompt": True},
    {"name": "continue_final_message",
     "messages": [{"role": "user", "content": "Write a haiku."},
                  {"role": "assistant", "content": "Autumn moonlight —"}],
     "add_generation_prompt": False, "continue_final_message": True},
    {"name": "continue_final_message_trailing_space",
     "messages": [{"role": "user", "content": "Count"},
                  {"role": "assistant", "content": "One, two, "}],
     "add_generation_prompt": False, "continue_final_message": True},
]

# Small templates that pin down the rendering environment itself (filters,
# Python string methods, output formatting of non-strings, loop controls).
ENV_TEMPLATE = (
    "{%- set m = messages[0].content -%}\n"
    "split={{ m.split(',') }}|rsplit={{ m.rsplit(',', 1) }}|ws={{ '  a  b '.split() }}\n"
    "strip=[{{ '  x  '.strip() }}][{{ 'xxhixx'.strip('x') }}][{{ '\\n\\nhi'.lstrip('\\n') }}][{{ 'hi\\n'.rstrip() }}]\n"
    "case={{ m.upper() }}/{{ m.lower() }}/{{ 'hello world'.title() }}\n"
    "sw={{ m.startswith('a') }}/{{ m.endswith('c') }}/{{ m.replace(',', ';') }}\n"
    "values={{ none }}|{{ true }}|{{ false }}|{{ 1.5 }}|{{ 2.0 }}|{{ 10 }}|{{ [1, 'a', none, true] }}|{{ {'k': 'v'} }}\n"
    "tojson={{ tools | tojson }}\n"
    "indent={{ tools[0] | tojson(indent=2) }}\n"
    "sorted={{ {'b': 1, 'a': [1, 2]} | tojson(sort_keys=true) }}\n"
    "ascii={{ 'é🌍\"\\\\' | tojson(ensure_ascii=true) }}|{{ 'é🌍\\t' | tojson }}\n"
    "seps={{ {'a': [1, 2]} | tojson(separators=(',', ':')) }}\n"
    "{%- for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}\n"
    "loop={{ i }}\n"
    "{%- endfor %}\n"
    "{% if add_generation_prompt %}gen{% endif %}\n"
)

# Constructs common in Hub templates (Llama 3.x, Mistral, Granite, Phi, GLM):
# dict-style access, filters, tests, macros, slicing, inline if, `~`,
# integer division/modulo, loop attributes, `items()`, `format`.
HUB_IDIOMS_TEMPLATE = """{%- macro render_tool(t) -%}
{{ t.function.name }}({% for k, v in t.function.parameters.properties.items() %}{{ k }}: {{ v['type'] }}{% if not loop.last %}, {% endif %}{% endfor %})
{%- endmacro -%}
{{- bos_token | default('') -}}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = 'You are a helpful assistant.' %}
    {%- set loop_messages = messages %}
{%- endif %}
<<SYS>>{{ system_message }}<</SYS>>
{% if tools is not none and tools | length > 0 %}
Tools ({{ tools | length }}): {{ tools | map(attribute='function') | map(attribute='name') | join(', ') }}
{% for t in tools %}
- {{ render_tool(t) }}
{% endfor %}
{% endif %}
{%- for message in loop_messages %}
    {%- if loop.first and message['role'] != 'user' %}
        {{- raise_exception('Conversation must start with a user message, got ' ~ message['role']) }}
    {%- endif %}
    {%- set content = message['content'] if message['content'] is string else '' %}
[{{ loop.index }}/{{ loop.length }}|{{ loop.revindex0 }}] {{ message.role | upper }}: {{ content[:12] ~ ('...' if content | length > 12 else '') }}
    {%- if message.tool_calls is defined %}
        {%- for call in message.tool_calls %} -> {{ call.function.name }} {{ call.function.arguments | tojson }}{% endfor %}
    {%- endif %}
{% endfor %}
{%- set users = loop_messages | selectattr('role', 'equalto', 'user') | list %}
users={{ users | length }} half={{ (loop_messages | length) // 2 }} odd={{ (loop_messages | length) % 2 == 1 }} last={{ (loop_messages | last).role }} first={{ (loop_messages | first)['role'] }}
fmt={{ '{}-{}'.format('a', 3) }} count={{ 'banana'.count('a') }} find={{ 'banana'.find('n') }} title={{ 'hello world' | title }} cap={{ 'hello' | capitalize }}
dict={% for k, v in {'b': 1, 'a': 2} | dictsort %}{{ k }}={{ v }};{% endfor %} keys={{ {'x': 1, 'y': 2}.keys() | list }} get={{ {'x': 1}.get('y', 'dflt') }}
tests={{ none is none }}/{{ 1 is number }}/{{ 'a' is string }}/{{ {} is mapping }}/{{ [] is iterable }}/{{ undefined_thing is defined }}/{{ [1, 2] is sequence }}
ns={%- set ns = namespace(total=0) %}{% for i in [1, 2, 3] %}{% set ns.total = ns.total + i %}{% endfor %}{{ ns.total }} rev={{ [1, 2, 3] | reverse | list }} sum={{ [1, 2, 3] | sum }} max={{ [3, 1, 2] | max }}
round={{ 2.567 | round(2) }} int={{ '42' | int }} float={{ 3 | float }} str={{ 5 | string }} abs={{ -3 | abs }} idx={{ 'abc'[-1] }} slice={{ [1, 2, 3, 4][::2] }}
{%- if add_generation_prompt %}
ASSISTANT:
{%- endif %}
"""

# A template that loops over content parts (Qwen2-VL style): vLLM's "openai"
# content format.
PARTS_TEMPLATE = """{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system
You are a helpful assistant.<|im_end|>
{% endif %}<|im_start|>{{ message['role'] }}
{% if message['content'] is string %}{{ message['content'] }}<|im_end|>
{% else %}{% for content in message['content'] %}{% if content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

ENV_CASES = [
    {"name": "openai_content_format_parts_template",
     "chat_template": PARTS_TEMPLATE, "content_format": "openai",
     "messages": [{"role": "user", "content": "plain string"},
                  {"role": "assistant", "content": None},
                  {"role": "user", "content": [{"type": "text", "text": "part one, "},
                                               {"type": "text", "text": "part two"}]}],
     "add_generation_prompt": True},
    {"name": "openai_content_format_continue_final_message",
     "chat_template": PARTS_TEMPLATE, "content_format": "openai",
     "messages": [{"role": "user", "content": "Write"},
                  {"role": "assistant", "content": [{"type": "text", "text": "Once upon"}]}],
     "add_generation_prompt": False, "continue_final_message": True},
    {"name": "env_hub_idioms",
     "chat_template": HUB_IDIOMS_TEMPLATE,
     "messages": [{"role": "system", "content": "  Be brief.  "},
                  {"role": "user", "content": "What is the weather like today in Paris?"},
                  {"role": "assistant", "content": None,
                   "tool_calls": [call("c1", "get_weather", "{\"city\": \"Paris\"}")]},
                  {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                  {"role": "user", "content": "Thanks"}],
     "tools": [WEATHER_TOOL, SEARCH_TOOL], "add_generation_prompt": True},
    {"name": "env_hub_idioms_raise_exception",
     "chat_template": HUB_IDIOMS_TEMPLATE,
     "messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}],
     "add_generation_prompt": True},

    {"name": "env_python_compat",
     "chat_template": ENV_TEMPLATE,
     "messages": [{"role": "user", "content": "a,b,c"}],
     "tools": [SEARCH_TOOL, UNICODE_TOOL], "add_generation_prompt": True},
    {"name": "env_blocks_trim_and_lstrip",
     "chat_template": "{% for message in messages %}\n    {% if message.role == 'user' %}\n[{{ message.content }}]\n    {% endif %}\n{% endfor %}\nend\n",
     "messages": [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}],
     "add_generation_prompt": False},
    {"name": "env_special_tokens_visible",
     "chat_template": "{{ eos_token }}|{{ pad_token }}|{{ bos_token is defined }}|{{ custom_kwarg }}",
     "messages": [{"role": "user", "content": "x"}],
     "add_generation_prompt": False, "chat_template_kwargs": {"custom_kwarg": "kw"}},
]


def render_or_error(tok, case):
    """The rendered prompt, or {"error": message} when the template raises."""
    try:
        return render(tok, case)
    except Exception as e:  # jinja2 TemplateError from raise_exception
        return {"error": str(e)}


def render(tok, case):
    kwargs = dict(case.get("chat_template_kwargs") or {})
    if "chat_template" in case:
        kwargs["chat_template"] = case["chat_template"]
    return tok.apply_chat_template(
        normalize_like_vllm(case["messages"], case.get("content_format", "string")),
        tools=case.get("tools"),
        tokenize=False,
        add_generation_prompt=case.get("add_generation_prompt", False),
        continue_final_message=case.get("continue_final_message", False),
        **kwargs,
    )


RANDOM_CASES = 150


def main():
    tok = AutoTokenizer.from_pretrained(MODEL_DIR)
    out = {
        "generator": "scripts/make_chat_golden.py",
        "transformers_version": transformers.__version__,
        "special_tokens_map": tok.special_tokens_map,
        "cases": [],
    }
    # Random conversations the template refuses (e.g. continue_final_message
    # on a turn whose text the template rewrites) are skipped: the hand-written
    # cases pin error behaviour.
    randoms = []
    for case in random_cases(seed=20261130, count=RANDOM_CASES + 40):
        if len(randoms) < RANDOM_CASES and isinstance(render_or_error(tok, case), str):
            randoms.append(case)
    for case in CASES + ENV_CASES + randoms:
        expected = render_or_error(tok, case)
        entry = {
            "name": case["name"],
            "messages": case["messages"],
            "tools": case.get("tools"),
            "add_generation_prompt": case.get("add_generation_prompt", False),
            "continue_final_message": case.get("continue_final_message", False),
            "chat_template_kwargs": case.get("chat_template_kwargs") or {},
            "content_format": case.get("content_format", "string"),
            "expected": expected,
        }
        if "chat_template" in case:
            entry["chat_template"] = case["chat_template"]
        out["cases"].append(entry)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(out['cases'])} cases to {os.path.relpath(OUT, ROOT)}", file=sys.stderr)

    parsed = {
        "generator": "scripts/make_chat_golden.py (chat_golden_output.py)",
        "cases": output_cases(seed=20261130, count=200),
    }
    with open(OUTPUT_OUT, "w", encoding="utf-8") as f:
        json.dump(parsed, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(parsed['cases'])} cases to {os.path.relpath(OUTPUT_OUT, ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
