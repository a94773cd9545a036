"""Structured outputs and forced tool calls, end to end with the official
`openai` client against `quire serve` (json_schema, json_object, the grammar
extension, tool_choice "required" and a named function, streamed and not).

Usage: openai_structured.py BASE_URL API_KEY MODEL [TEST ...]
Prints SKIPPED and exits 0 when `openai` or `jsonschema` cannot be
imported. Exits non-zero on the first failed check. Each test prints
`ok <name>` when it passes.
"""

import concurrent.futures as cf
import json
import random
import re
import sys
import time

try:
    import jsonschema
    import openai
except ImportError as e:  # pragma: no cover
    print(f"SKIPPED: cannot import openai and jsonschema ({e})")
    sys.exit(0)

BASE, KEY, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=BASE, api_key=KEY, max_retries=0, timeout=600)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Adds two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
TOOLS = [WEATHER, ADD]


def random_schema(rng, depth):
    """A random JSON schema with bounded strings, numbers and arrays."""
    k = rng.randrange(5 if depth == 0 else 7)
    if k == 0:
        return {"type": "string", "maxLength": rng.randrange(3, 24)}
    if k == 1:
        lo = rng.randrange(-100, 100)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randrange(1, 1000)}
    if k == 2:
        return {"type": "boolean"}
    if k == 3:
        return {"enum": rng.sample(["red", "green", "blue", "cyan", 1, 2, None], 3)}
    if k == 4:
        return {"type": "number", "minimum": -1000, "maximum": 1000}
    if k == 5:
        return {"type": "array", "items": random_schema(rng, depth - 1),
                "maxItems": rng.randrange(1, 4)}
    props = {f"field_{i}_{rng.randrange(100)}": random_schema(rng, depth - 1)
             for i in range(rng.randrange(1, 5))}
    return {"type": "object", "properties": props,
            "required": [p for p in props if rng.random() < 0.8],
            "additionalProperties": False}


def object_schema(rng):
    s = random_schema(rng, 2)
    if s.get("type") != "object":
        s = {"type": "object", "properties": {"value": s}, "required": ["value"],
             "additionalProperties": False}
    return s


def ask_json(schema, i, **kw):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"Describe item {i} as JSON."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": f"item_{i}", "schema": schema, "strict": True}},
        max_tokens=400,
        temperature=0.7,
        seed=i,
        **kw,
    )
    return r


def test_json_schema_random():
    """20 random schemas, concurrently (they batch): each answer parses and
    validates against its schema, and ends with "stop"."""
    rng = random.Random(2026)
    schemas = [object_schema(rng) for _ in range(20)]
    with cf.ThreadPoolExecutor(20) as ex:
        rs = list(ex.map(lambda a: ask_json(*a), [(s, i) for i, s in enumerate(schemas)]))
    for i, (s, r) in enumerate(zip(schemas, rs)):
        c = r.choices[0]
        assert c.finish_reason == "stop", (i, c.finish_reason, c.message.content)
        v = json.loads(c.message.content)
        jsonschema.validate(v, s)


def test_json_schema_stream_n():
    """Streamed, n = 2: both choices' concatenated deltas validate."""
    schema = {"type": "object",
              "properties": {"name": {"type": "string", "maxLength": 16},
                             "age": {"type": "integer", "minimum": 0, "maximum": 120},
                             "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]},
                                      "maxItems": 3}},
              "required": ["name", "age", "tags"], "additionalProperties": False}
    texts, finish = ["", ""], [None, None]
    for ch in client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "A person, as JSON."}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "person", "schema": schema}},
            max_tokens=200, n=2, seed=5, temperature=1.0, stream=True):
        for c in ch.choices:
            if c.delta and c.delta.content:
                texts[c.index] += c.delta.content
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert finish == ["stop", "stop"], finish
    for t in texts:
        jsonschema.validate(json.loads(t), schema)


def test_json_object():
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "List three fruits in JSON."}],
        response_format={"type": "json_object"}, max_tokens=300, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "stop", c
    assert isinstance(json.loads(c.message.content), dict)


def test_grammar_extension():
    """The `grammar` response format (regex and Lark) through extra fields."""
    r = client.completions.create(
        model=MODEL, prompt="Today's date:", max_tokens=30, temperature=0,
        extra_body={"response_format": {"type": "grammar", "grammar": {
            "syntax": "regex", "definition": " [0-9]{4}-[0-9]{2}-[0-9]{2}"}}})
    assert re.fullmatch(r" [0-9]{4}-[0-9]{2}-[0-9]{2}", r.choices[0].text), r.choices[0].text
    assert r.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Is the sky blue?"}],
        max_tokens=30, temperature=0,
        extra_body={"response_format": {"type": "grammar", "grammar": {
            "syntax": "lark", "definition": 'start: ("yes" | "no") ", because " /[a-z ]{1,20}/ "."'}}})
    t = r.choices[0].message.content
    assert re.fullmatch(r"(yes|no), because [a-z ]{1,20}\.", t), t


def check_calls(calls, names):
    assert calls, "no tool_calls"
    by = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for c in calls:
        assert c["name"] in names, c
        jsonschema.validate(json.loads(c["arguments"]), by[c["name"]])
        assert c["id"], c


def test_tool_required():
    """tool_choice "required": the answer is tool calls with valid
    arguments, streamed and not."""
    msgs = [{"role": "user", "content": "What's the weather like in Paris today?"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS,
                                       tool_choice="required", max_tokens=300, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    calls = [{"id": t.id, "name": t.function.name, "arguments": t.function.arguments}
             for t in c.message.tool_calls]
    check_calls(calls, {"get_weather", "add"})
    streamed, finish = {}, None
    for ch in client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS,
                                             tool_choice="required", max_tokens=300,
                                             temperature=0, stream=True):
        for ch_c in ch.choices:
            for d in (ch_c.delta.tool_calls or []):
                e = streamed.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                e["id"] += d.id or ""
                e["name"] += (d.function.name or "") if d.function else ""
                e["arguments"] += (d.function.arguments or "") if d.function else ""
            if ch_c.finish_reason:
                finish = ch_c.finish_reason
    assert finish == "tool_calls", finish
    check_calls(list(streamed.values()), {"get_weather", "add"})
    # Same greedy output streamed and not (the ids are fresh each time).
    assert [(x["name"], x["arguments"]) for x in streamed.values()] == \
        [(x["name"], x["arguments"]) for x in calls]


def test_tool_named():
    """A named function: exactly that function, once."""
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is 2 plus 3?"}],
        tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}},
        max_tokens=200, temperature=0)
    c = r.choices[0]
    calls = [{"id": t.id, "name": t.function.name, "arguments": t.function.arguments}
             for t in c.message.tool_calls]
    assert len(calls) == 1, calls
    check_calls(calls, {"add"})


def test_structured_errors():
    """Bad grammars and schemas are 400s naming their parameter."""
    cases = [
        ({"response_format": {"type": "json_schema",
                              "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
         "response_format"),
        ({"response_format": {"type": "grammar", "grammar": {"syntax": "lark",
                                                             "definition": "start: ("}}},
         "response_format"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
         "response_format"),
    ]
    for extra, param in cases:
        try:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                extra_body=extra)
        except openai.BadRequestError as e:
            assert e.body and e.body.get("param") == param, (extra, e.body)
            continue
        raise AssertionError(f"{extra} was accepted")


TESTS = {n[5:]: f for n, f in globals().items() if n.startswith("test_")}

if __name__ == "__main__":
    names = sys.argv[4:] or list(TESTS)
    for n in names:
        t0 = time.time()
        TESTS[n]()
        print(f"ok {n} ({time.time() - t0:.1f} s)", flush=True)
