"""`POST /v1/responses` of `quire serve` through the official `openai` client.

Usage: openai_responses.py BASE_URL API_KEY MODEL [TEST ...]
Prints SKIPPED and exits 0 when `openai` cannot be imported. Exits non-zero
on the first failed check. Each test prints `ok <name>` when it passes.
"""

import sys
import time

try:
    import openai
except ImportError as e:  # pragma: no cover
    print(f"SKIPPED: cannot import openai ({e})")
    sys.exit(0)

BASE, KEY, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=BASE, api_key=KEY, max_retries=0, timeout=600)


def create(input, **kw):
    return client.responses.create(model=MODEL, input=input, **kw)


def param_of(e):
    """The `param` of an API error (the SDK keeps the body's `error`)."""
    return e.body.get("param") if isinstance(e.body, dict) else None


def check_usage(r, max_out):
    u = r.usage
    assert u is not None, r
    assert u.input_tokens > 5, u
    assert 1 <= u.output_tokens <= max_out, u
    assert u.total_tokens == u.input_tokens + u.output_tokens, u
    assert 0 <= u.input_tokens_details.cached_tokens <= u.input_tokens, u
    assert u.output_tokens_details.reasoning_tokens == 0, u


def test_create():
    r = create("What is the capital of France?", max_output_tokens=12, temperature=0,
               instructions="Answer briefly.", metadata={"suite": "py"})
    assert r.object == "response", r
    assert r.id.startswith("resp_"), r.id
    assert r.status in ("completed", "incomplete"), r.status
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens", r.incomplete_details
    assert r.output_text, r
    assert r.output[0].type == "message" and r.output[0].role == "assistant", r.output
    assert r.output[0].content[0].type == "output_text", r.output[0]
    assert r.instructions == "Answer briefly.", r.instructions
    assert r.metadata == {"suite": "py"}, r.metadata
    assert r.model == MODEL, r.model
    check_usage(r, 12)
    # Greedy: the same text again, and the same as chat with the same turns.
    again = create("What is the capital of France?", max_output_tokens=12, temperature=0,
                   instructions="Answer briefly.")
    assert again.output_text == r.output_text, (again.output_text, r.output_text)
    c = client.chat.completions.create(
        model=MODEL, max_tokens=12, temperature=0,
        messages=[{"role": "system", "content": "Answer briefly."},
                  {"role": "user", "content": "What is the capital of France?"}])
    assert c.choices[0].message.content == r.output_text, (c.choices[0].message.content, r.output_text)
    assert c.usage.prompt_tokens == r.usage.input_tokens
    # Retrieved from the store: the same response.
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text, got


def test_stream():
    deltas, types, seqs, final = [], [], [], None
    stream = create("Name three colors.", max_output_tokens=16, temperature=0, stream=True)
    for ev in stream:
        types.append(ev.type)
        seqs.append(ev.sequence_number)
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
        elif ev.type in ("response.completed", "response.incomplete"):
            final = ev.response
    assert types[:2] == ["response.created", "response.in_progress"], types
    assert types[-1] in ("response.completed", "response.incomplete"), types
    assert seqs == list(range(len(seqs))), seqs
    assert "response.output_text.done" in types and "response.output_item.done" in types, types
    assert final is not None
    text = "".join(deltas)
    assert text, types
    assert final.output_text == text, (final.output_text, text)
    check_usage(final, 16)
    # The same text as the non-streamed response.
    plain = create("Name three colors.", max_output_tokens=16, temperature=0)
    assert plain.output_text == text, (plain.output_text, text)
    # The SDK's stream helper agrees too.
    with client.responses.stream(model=MODEL, input="Name three colors.",
                                 max_output_tokens=16, temperature=0) as s:
        done = s.get_final_response()
    assert done.output_text == text, (done.output_text, text)


def test_previous_response():
    first = create("My name is Alice. Say hi.", max_output_tokens=10, temperature=0)
    second = create("What is my name?", previous_response_id=first.id,
                    max_output_tokens=10, temperature=0)
    assert second.previous_response_id == first.id
    alone = create("What is my name?", max_output_tokens=10, temperature=0)
    # The follow-up's prompt holds the first exchange.
    grown = second.usage.input_tokens - alone.usage.input_tokens
    assert grown >= first.usage.output_tokens + 5, (second.usage, alone.usage, first.usage)
    c = client.chat.completions.create(
        model=MODEL, max_tokens=10, temperature=0,
        messages=[{"role": "user", "content": "My name is Alice. Say hi."},
                  {"role": "assistant", "content": first.output_text},
                  {"role": "user", "content": "What is my name?"}])
    assert c.usage.prompt_tokens == second.usage.input_tokens, (c.usage, second.usage)
    assert c.choices[0].message.content == second.output_text
    # Not stored: no follow-up.
    gone = create("hi", max_output_tokens=2, store=False)
    try:
        create("again", previous_response_id=gone.id, max_output_tokens=2)
        raise AssertionError("previous_response_id of a store=False response accepted")
    except openai.NotFoundError as e:
        assert param_of(e) == "previous_response_id", e.body
        assert gone.id in str(e), e


def test_errors():
    try:
        create("x", previous_response_id="resp_nope")
        raise AssertionError("unknown previous_response_id accepted")
    except openai.NotFoundError as e:
        assert "resp_nope" in str(e), e
        assert param_of(e) == "previous_response_id", e.body
    try:
        create("x", text={"format": {"type": "json_schema", "name": "x",
                                     "schema": {"type": "strin"}}})
        raise AssertionError("an invalid schema accepted")
    except openai.BadRequestError as e:
        assert param_of(e) == "text.format", e.body
    try:
        create("x", tools=[{"type": "web_search"}])
        raise AssertionError("a built-in tool accepted")
    except openai.BadRequestError as e:
        assert param_of(e) == "tools", e.body
    try:
        client.responses.retrieve("resp_nope")
        raise AssertionError("unknown id retrieved")
    except openai.NotFoundError:
        pass


def test_structured():
    """text.format json_schema: the output text parses and fits the
    schema, streamed and not."""
    import json
    schema = {"type": "object",
              "properties": {"city": {"type": "string", "maxLength": 20},
                             "population": {"type": "integer", "minimum": 0},
                             "capital": {"type": "boolean"}},
              "required": ["city", "population", "capital"], "additionalProperties": False}
    fmt = {"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}}
    r = create("Describe Paris as JSON.", text=fmt, max_output_tokens=200, temperature=0)
    assert r.status == "completed", r
    v = json.loads(r.output_text)
    assert set(v) == {"city", "population", "capital"}, v
    assert isinstance(v["population"], int) and isinstance(v["capital"], bool), v
    assert len(v["city"]) <= 20, v
    text, done = "", None
    for ev in client.responses.create(model=MODEL, input="Describe Paris as JSON.", text=fmt,
                                      max_output_tokens=200, temperature=0, stream=True):
        if ev.type == "response.output_text.delta":
            text += ev.delta
        if ev.type == "response.completed":
            done = ev.response
    assert done is not None and done.output_text == text == r.output_text, (text, r.output_text)


def test_tool_required():
    """tool_choice "required": the output is function_call items with
    arguments that fit the tool, streamed and not."""
    import json
    tools = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
              "parameters": {"type": "object",
                             "properties": {"city": {"type": "string", "maxLength": 30}},
                             "required": ["city"]}}]
    for stream in (False, True):
        if stream:
            r = None
            for ev in client.responses.create(model=MODEL, input="Weather in Oslo?", tools=tools,
                                              tool_choice="required", max_output_tokens=200,
                                              temperature=0, stream=True):
                if ev.type == "response.completed":
                    r = ev.response
            assert r is not None
        else:
            r = create("Weather in Oslo?", tools=tools, tool_choice="required",
                       max_output_tokens=200, temperature=0)
        calls = [o for o in r.output if o.type == "function_call"]
        assert calls, r.output
        for c in calls:
            assert c.name == "get_weather" and c.call_id, c
            args = json.loads(c.arguments)
            assert set(args) == {"city"} and isinstance(args["city"], str), args


TESTS = {n[5:]: f for n, f in globals().items() if n.startswith("test_")}

if __name__ == "__main__":
    names = sys.argv[4:] or list(TESTS)
    for n in names:
        t0 = time.time()
        TESTS[n]()
        print(f"ok {n} ({time.time() - t0:.1f} s)", flush=True)
