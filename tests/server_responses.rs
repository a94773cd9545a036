//! `POST /v1/responses` end to end on the default model: the response and
//! stream shapes, the chat path equivalence (instructions, input items and
//! previous_response_id render the same prompt as the chat turns they
//! stand for, and greedy decoding then gives the same text), the store
//! (GET, DELETE, store: false, unknown ids), and 400s naming their field.
//! The official client's view is tests/py/openai_responses.py.

mod server_util;

use serde_json::{json, Value};
use server_util::Server;
use std::process::Command;

const KEY: &str = "sk-quire-test";

fn create(srv: &Server, body: &Value) -> server_util::Response {
    srv.request("POST", "/v1/responses", Some(&body.to_string()))
}

fn chat(srv: &Server, body: &Value) -> Value {
    let r = srv.request("POST", "/v1/chat/completions", Some(&body.to_string()));
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

fn ok(srv: &Server, body: &Value) -> Value {
    let r = create(srv, body);
    assert_eq!(r.status, 200, "{body}: {}", r.body);
    assert!(
        r.headers["content-type"].starts_with("application/json"),
        "{:?}",
        r.headers
    );
    r.json()
}

fn param_of(r: &server_util::Response) -> String {
    r.json()["error"]["param"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// The text of the output's messages (what clients call `output_text`).
fn output_text(resp: &Value) -> String {
    resp["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap().iter())
        .map(|p| p["text"].as_str().unwrap())
        .collect()
}

fn input_tokens(resp: &Value) -> u64 {
    resp["usage"]["input_tokens"].as_u64().unwrap()
}

/// Checks a finished response's shape; returns its text.
fn check_shape(v: &Value, max_output_tokens: u64) -> String {
    assert!(v["id"].as_str().unwrap().starts_with("resp_"), "{v}");
    assert_eq!(v["object"], "response");
    assert!(v["created_at"].as_u64().unwrap() > 1_600_000_000);
    assert!(v["error"].is_null());
    let usage = &v["usage"];
    let (inp, out) = (
        usage["input_tokens"].as_u64().unwrap(),
        usage["output_tokens"].as_u64().unwrap(),
    );
    assert!(inp > 5, "{usage}");
    assert!((1..=max_output_tokens).contains(&out), "{usage}");
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), inp + out);
    assert!(
        usage["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            <= inp
    );
    assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 0);
    assert_eq!(v["max_output_tokens"], max_output_tokens);
    assert_eq!(v["text"], json!({"format": {"type": "text"}}));
    let output = v["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "no tools, one message: {v}");
    let m = &output[0];
    assert_eq!(m["type"], "message");
    assert_eq!(m["role"], "assistant");
    assert!(m["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(m["content"][0]["type"], "output_text");
    assert_eq!(m["content"][0]["annotations"], json!([]));
    match v["status"].as_str().unwrap() {
        "completed" => {
            assert!(v["incomplete_details"].is_null());
            assert_eq!(m["status"], "completed");
        }
        "incomplete" => {
            assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
            assert_eq!(m["status"], "incomplete");
            assert_eq!(out, max_output_tokens);
        }
        s => panic!("status {s}: {v}"),
    }
    output_text(v)
}

/// The events of an SSE body: (event line, data).
fn sse_events(body: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut event = None;
    for line in body.lines() {
        if let Some(e) = line.strip_prefix("event: ") {
            event = Some(e.to_string());
        } else if let Some(d) = line.strip_prefix("data: ") {
            let v: Value = serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}"));
            let ev = event
                .take()
                .unwrap_or_else(|| panic!("data without event: {d}"));
            out.push((ev, v));
        }
    }
    out
}

#[test]
fn server_responses() {
    let Some(srv) = Server::start("server_responses", None, &[]) else {
        return;
    };
    let model = srv.model_id.clone();
    let question = "What is the capital of France?";
    let base = json!({"model": model, "input": question, "max_output_tokens": 12,
                      "temperature": 0, "metadata": {"run": "t1"}});

    // (a) Non-streamed: the shape, and the same text as chat (greedy).
    let v = ok(&srv, &base);
    let text = check_shape(&v, 12);
    assert!(!text.is_empty(), "{v}");
    assert_eq!(v["metadata"], json!({"run": "t1"}));
    assert_eq!(v["tools"], json!([]));
    assert_eq!(v["tool_choice"], "auto");
    assert_eq!(v["temperature"], 0.0);
    assert_eq!(v["parallel_tool_calls"], true);
    assert!(v["previous_response_id"].is_null());
    let c = chat(
        &srv,
        &json!({"model": model, "messages": [{"role": "user", "content": question}],
                "max_tokens": 12, "temperature": 0}),
    );
    assert_eq!(
        input_tokens(&v),
        c["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    assert_eq!(
        text,
        c["choices"][0]["message"]["content"].as_str().unwrap()
    );

    // max_output_tokens reached: incomplete.
    let mut one = base.clone();
    one["max_output_tokens"] = json!(1);
    one["input"] = json!("Count from 1 to 20, separated by commas.");
    let v1 = ok(&srv, &one);
    check_shape(&v1, 1);
    assert_eq!(v1["status"], "incomplete", "{v1}");

    // (b) Instructions: a system turn first, as on chat.
    let sys = "You are a pirate. Answer in one short sentence.";
    let mut ins = base.clone();
    ins["instructions"] = json!(sys);
    let vi = ok(&srv, &ins);
    assert_eq!(vi["instructions"], sys);
    let ci = chat(
        &srv,
        &json!({"model": model, "messages": [{"role": "system", "content": sys},
                {"role": "user", "content": question}], "max_tokens": 12, "temperature": 0}),
    );
    assert_eq!(
        input_tokens(&vi),
        ci["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    assert_eq!(
        output_text(&vi),
        ci["choices"][0]["message"]["content"].as_str().unwrap()
    );
    // The same as a developer message in the input.
    let mut dev = base.clone();
    dev["input"] = json!([
        {"role": "developer", "content": sys},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": question}]},
    ]);
    assert_eq!(input_tokens(&ok(&srv, &dev)), input_tokens(&vi));

    // (c) Streamed: event order, sequence numbers, deltas = final text =
    // the non-streamed text.
    let mut sb = base.clone();
    sb["stream"] = json!(true);
    let r = create(&srv, &sb);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.headers["content-type"].starts_with("text/event-stream"));
    let events = sse_events(&r.body);
    for (k, (ev, d)) in events.iter().enumerate() {
        assert_eq!(d["type"], ev.as_str(), "event line and type differ");
        assert_eq!(d["sequence_number"], k as u64, "{d}");
    }
    let types: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
    let n = types.len();
    assert!(n >= 9, "{types:?}");
    assert_eq!(
        types[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    assert!(types[4..n - 4]
        .iter()
        .all(|t| *t == "response.output_text.delta"));
    assert_eq!(
        types[n - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            if events[n - 1].1["response"]["status"] == "incomplete" {
                "response.incomplete"
            } else {
                "response.completed"
            }
        ]
    );
    assert_eq!(events[0].1["response"]["status"], "in_progress");
    assert_eq!(events[0].1["response"]["output"], json!([]));
    let deltas: String = events
        .iter()
        .filter(|(e, _)| e == "response.output_text.delta")
        .map(|(_, d)| {
            assert_eq!(
                (d["output_index"].as_u64(), d["content_index"].as_u64()),
                (Some(0), Some(0))
            );
            d["delta"].as_str().unwrap()
        })
        .collect();
    let item_id = events[2].1["item"]["id"].as_str().unwrap();
    assert!(events[3..n - 1]
        .iter()
        .all(|(_, d)| d["item_id"].as_str().unwrap_or(item_id) == item_id));
    let last = &events[n - 1].1["response"];
    assert_eq!(deltas, events[n - 4].1["text"].as_str().unwrap());
    assert_eq!(deltas, check_shape(last, 12));
    assert_eq!(deltas, text);
    assert_eq!(events[n - 2].1["item"], last["output"][0]);

    // (d) previous_response_id: the follow-up's prompt is the chat
    // conversation [user, assistant (the first output), user].
    let first = ok(
        &srv,
        &json!({"model": model, "input": "My name is Alice. Say hi.",
                                 "max_output_tokens": 10, "temperature": 0}),
    );
    let first_text = output_text(&first);
    let id = first["id"].as_str().unwrap();
    let follow = json!({"model": model, "input": "What is my name?", "previous_response_id": id,
                        "max_output_tokens": 10, "temperature": 0});
    let second = ok(&srv, &follow);
    assert_eq!(second["previous_response_id"], id);
    let cc = chat(
        &srv,
        &json!({"model": model, "max_tokens": 10, "temperature": 0, "messages": [
            {"role": "user", "content": "My name is Alice. Say hi."},
            {"role": "assistant", "content": first_text},
            {"role": "user", "content": "What is my name?"}]}),
    );
    assert_eq!(
        input_tokens(&second),
        cc["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    assert!(
        input_tokens(&second)
            >= input_tokens(&first) + first["usage"]["output_tokens"].as_u64().unwrap(),
        "{second}"
    );
    assert_eq!(
        output_text(&second),
        cc["choices"][0]["message"]["content"].as_str().unwrap()
    );
    // A chain: the third turn sees both exchanges.
    let third = ok(
        &srv,
        &json!({"model": model, "input": "And again?", "max_output_tokens": 4,
                                 "previous_response_id": second["id"], "temperature": 0}),
    );
    assert!(input_tokens(&third) > input_tokens(&second) + 3);
    // GET returns the stored object; DELETE forgets it.
    let g = srv.request("GET", &format!("/v1/responses/{id}"), None);
    assert_eq!(g.status, 200, "{}", g.body);
    assert_eq!(g.json(), first);
    let d = srv.request("DELETE", &format!("/v1/responses/{id}"), None);
    assert_eq!(d.status, 200, "{}", d.body);
    assert_eq!(d.json()["deleted"], true);
    for (method, path) in [
        ("GET", format!("/v1/responses/{id}")),
        ("DELETE", format!("/v1/responses/{id}")),
    ] {
        let r = srv.request(method, &path, None);
        assert_eq!(r.status, 404, "{method}: {}", r.body);
    }
    let r = create(&srv, &follow);
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(param_of(&r), "previous_response_id");
    let e = &r.json()["error"];
    assert_eq!(e["type"], "invalid_request_error");
    assert!(e["message"].as_str().unwrap().contains(id), "{e}");
    // store: false keeps nothing.
    let mut nostore = base.clone();
    nostore["store"] = json!(false);
    nostore["max_output_tokens"] = json!(2);
    let ns = ok(&srv, &nostore);
    assert_eq!(ns["store"], false);
    let nid = ns["id"].as_str().unwrap();
    assert_eq!(
        srv.request("GET", &format!("/v1/responses/{nid}"), None)
            .status,
        404
    );
    let r = create(
        &srv,
        &json!({"model": model, "input": "x", "previous_response_id": nid}),
    );
    assert_eq!(
        (r.status, param_of(&r)),
        (404, "previous_response_id".to_string()),
        "{}",
        r.body
    );

    // (e) Tools and tool items render as the chat equivalents.
    let tools = json!([{"type": "function", "name": "get_weather", "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "strict": true}]);
    let chat_tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let items = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_abc", "name": "get_weather",
         "arguments": "{\"city\": \"Paris\"}"},
        {"type": "function_call_output", "call_id": "call_abc", "output": "18 C, sunny"},
    ]);
    let vt = ok(
        &srv,
        &json!({"model": model, "input": items, "tools": tools,
                              "max_output_tokens": 2, "temperature": 0}),
    );
    assert_eq!(vt["tools"], tools);
    let ct = chat(
        &srv,
        &json!({"model": model, "tools": chat_tools, "max_tokens": 2, "temperature": 0, "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_abc", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_abc", "content": "18 C, sunny"}]}),
    );
    assert_eq!(
        input_tokens(&vt),
        ct["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    let plain = ok(
        &srv,
        &json!({"model": model, "input": items, "max_output_tokens": 2}),
    );
    assert!(
        input_tokens(&vt) > input_tokens(&plain) + 40,
        "the tools reach the prompt"
    );
    let mut none = json!({"model": model, "input": items, "tools": tools, "tool_choice": "none",
                          "max_output_tokens": 2});
    assert_eq!(input_tokens(&ok(&srv, &none)), input_tokens(&plain));
    none["tool_choice"] = json!("auto");
    assert_eq!(input_tokens(&ok(&srv, &none)), input_tokens(&vt));

    // (f) 400s name their field.
    let cases: Vec<(&str, Value)> = vec![
        ("foo", json!({"foo": 1})),
        ("n", json!({"n": 2})),
        (
            "text.format",
            json!({"text": {"format": {"type": "json_schema", "name": "x",
                                       "schema": {"type": "strin"}}}}),
        ),
        ("text.format", json!({"text": {"format": {"type": "yaml"}}})),
        ("reasoning", json!({"reasoning": {"effort": "high"}})),
        (
            "include",
            json!({"include": ["message.output_text.logprobs"]}),
        ),
        ("truncation", json!({"truncation": "auto"})),
        ("background", json!({"background": true})),
        ("tools", json!({"tools": [{"type": "web_search"}]})),
        (
            "tools",
            json!({"tools": [{"type": "function", "name": "bad name!"}]}),
        ),
        (
            "tool_choice",
            json!({"tools": tools, "tool_choice": {"type": "function", "name": "nope"}}),
        ),
        ("tool_choice", json!({"tool_choice": "required"})),
        (
            "tool_choice",
            json!({"tool_choice": {"type": "file_search"}}),
        ),
        (
            "input",
            json!({"input": [{"role": "tool", "content": "x"}]}),
        ),
        (
            "input",
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
        ),
        (
            "input",
            json!({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}),
        ),
        ("input", json!({"input": 5})),
        ("input", json!({"input": []})),
        ("max_output_tokens", json!({"max_output_tokens": 0})),
        ("temperature", json!({"temperature": 5})),
        ("top_p", json!({"top_p": 0})),
        ("metadata", json!({"metadata": {"k": 1}})),
        ("instructions", json!({"instructions": 3})),
    ];
    for (param, patch) in cases {
        let mut b = json!({"model": model, "input": "hi", "max_output_tokens": 2});
        for (k, v) in patch.as_object().unwrap() {
            b[k] = v.clone();
        }
        let r = create(&srv, &b);
        assert_eq!(r.status, 400, "{b}: {}", r.body);
        assert_eq!(param_of(&r), param, "{b}: {}", r.body);
    }
    let r = create(&srv, &json!({"model": model}));
    assert_eq!(
        (r.status, param_of(&r)),
        (400, "input".to_string()),
        "{}",
        r.body
    );
    let r = create(&srv, &json!({"model": "nope", "input": "hi"}));
    assert_eq!(
        (r.status, param_of(&r)),
        (404, "model".to_string()),
        "{}",
        r.body
    );
    assert!(
        srv.wait_idle(std::time::Duration::from_secs(30)),
        "KV blocks leaked"
    );
}

fn python() -> String {
    std::env::var("QUIRE_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// The official `openai` client against the server (with an API key):
/// `client.responses.create` non-streamed, streamed, and continued with
/// `previous_response_id`.
#[test]
fn server_responses_openai_client() {
    let test = "server_responses_openai_client";
    match Command::new(python())
        .args(["-c", "import openai"])
        .output()
    {
        Ok(o) if o.status.success() => {}
        other => {
            eprintln!("SKIPPED: {test}: `{}` cannot import openai ({other:?}); run scripts/setup-test-env.sh and set QUIRE_PYTHON", python());
            return;
        }
    }
    let Some(srv) = Server::start(test, Some(KEY), &[]) else {
        return;
    };
    let names = [
        "create",
        "stream",
        "previous_response",
        "errors",
        "structured",
        "tool_required",
    ];
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/openai_responses.py");
    let out = Command::new(python())
        .arg(script)
        .arg(srv.base_url())
        .arg(KEY)
        .arg(&srv.model_id)
        .args(names)
        .output()
        .expect("running openai_responses.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(
        out.status.success(),
        "openai_responses.py failed:\n{stdout}\n{stderr}"
    );
    for n in names {
        assert!(
            stdout.lines().any(|l| l.starts_with(&format!("ok {n} "))),
            "{n} did not report ok:\n{stdout}"
        );
    }
}
