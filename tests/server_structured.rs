//! Structured outputs over HTTP on the default model: the mask changes no
//! bit of an output it allows, constrained requests are batch-invariant,
//! and bad `response_format` / `tool_choice` values are 400s naming their
//! field that leave no sequence behind. (The official client's end-to-end
//! checks are in tests/server_openai.rs.)

mod server_util;

use serde_json::{json, Value};
use server_util::Server;
use std::time::Duration;

fn complete(srv: &Server, body: &Value) -> Value {
    let r = srv.request("POST", "/v1/completions", Some(&body.to_string()));
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

fn chat(srv: &Server, body: &Value) -> server_util::Response {
    srv.request("POST", "/v1/chat/completions", Some(&body.to_string()))
}

/// The regex that matches exactly `s`.
fn literal_regex(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() || c == ' ' {
            out.push(c);
        } else {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        }
    }
    out
}

/// A greedy completion, then the same request constrained to exactly the
/// text it produced: the same text and the same logprobs, bit for bit (the
/// mask sets only refused logits to -inf; logprobs read the model's
/// logits). Then the constrained request among eight others: identical.
#[test]
fn mask_keeps_allowed_outputs_bitwise() {
    let Some(srv) = Server::start("mask_keeps_allowed_outputs_bitwise", None, &[]) else {
        return;
    };
    let model = srv.model_id.clone();
    let base = json!({"model": model, "prompt": "The three primary colors are",
                      "max_tokens": 12, "temperature": 0, "logprobs": 3});
    let free = complete(&srv, &base);
    let text = free["choices"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(free["choices"][0]["finish_reason"], "length");
    assert!(!text.is_empty());
    let mut constrained = base.clone();
    constrained["response_format"] = json!({"type": "grammar", "grammar": {
        "syntax": "regex", "definition": format!("{}.*", literal_regex(&text))}});
    let got = complete(&srv, &constrained);
    assert_eq!(got["choices"][0]["text"], free["choices"][0]["text"]);
    assert_eq!(
        got["choices"][0]["logprobs"],
        free["choices"][0]["logprobs"]
    );

    // Among strangers (some constrained differently, some not).
    let crowd: Vec<_> = (0..8)
        .map(|i| {
            let addr = srv.addr.clone();
            let mut b = json!({"model": model, "prompt": format!("Story {i}:"),
                               "max_tokens": 24, "temperature": 0.8, "seed": i});
            if i % 2 == 0 {
                b["response_format"] = json!({"type": "json_object"});
            }
            std::thread::spawn(move || {
                server_util::http(&addr, "POST", "/v1/completions", &[], Some(&b.to_string()))
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    let again = complete(&srv, &constrained);
    for h in crowd {
        assert_eq!(h.join().unwrap().status, 200);
    }
    assert_eq!(
        again["choices"][0]["logprobs"],
        free["choices"][0]["logprobs"]
    );
    assert!(srv.wait_idle(Duration::from_secs(30)));
}

/// A constrained request without logprobs (which a GPU draws on the
/// device, through the mask as words) gives the text of the same request
/// with logprobs (drawn on the host from downloaded logits), greedy and
/// sampled, alone and batched with other constrained rows.
#[test]
fn constrained_draw_paths_agree() {
    let Some(srv) = Server::start(
        "constrained_draw_paths_agree",
        None,
        &["--mode", "deterministic"],
    ) else {
        return;
    };
    let model = srv.model_id.clone();
    let schema = json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer"}, "sunny": {"type": "boolean"}},
        "required": ["city", "days", "sunny"], "additionalProperties": false});
    let body = |i: u64, logprobs: bool| {
        let mut b = json!({"model": model, "prompt": format!("Trip {i} as JSON:"),
                           "max_tokens": 40, "temperature": if i.is_multiple_of(2) { 0.0 } else { 0.9 },
                           "seed": i, "response_format": {"type": "json_schema",
                           "json_schema": {"name": "trip", "schema": schema}}});
        if logprobs {
            b["logprobs"] = json!(1);
        }
        b
    };
    let run = |logprobs: bool| -> Vec<(String, String)> {
        let hs: Vec<_> = (0..6u64)
            .map(|i| {
                let (addr, b) = (srv.addr.clone(), body(i, logprobs));
                std::thread::spawn(move || {
                    server_util::http(&addr, "POST", "/v1/completions", &[], Some(&b.to_string()))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                let r = h.join().unwrap();
                assert_eq!(r.status, 200, "{}", r.body);
                let c = &r.json()["choices"][0];
                let text = c["text"].as_str().unwrap().to_string();
                (text, c["finish_reason"].as_str().unwrap().to_string())
            })
            .collect()
    };
    let (device, host) = (run(false), run(true));
    assert_eq!(device, host);
    let done: Vec<&String> = device
        .iter()
        .filter(|(_, f)| f == "stop")
        .map(|(t, _)| t)
        .collect();
    assert!(!done.is_empty(), "no output completed: {device:?}");
    for t in done {
        let v: Value = serde_json::from_str(t).unwrap_or_else(|e| panic!("{t:?}: {e}"));
        assert!(
            v["city"].is_string() && v["days"].is_i64() && v["sunny"].is_boolean(),
            "{t}"
        );
    }
    assert!(srv.wait_idle(Duration::from_secs(30)));
}

/// Each bad value is a 400 naming its parameter, and the server is idle
/// after them (no sequence was queued).
#[test]
fn bad_structured_requests() {
    let Some(srv) = Server::start("bad_structured_requests", None, &[]) else {
        return;
    };
    let tools = json!([{"type": "function", "function": {"name": "f",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}]);
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let cases: Vec<(Value, &str, &str)> = vec![
        (
            json!({"response_format": "json"}),
            "response_format",
            "expected an object",
        ),
        (
            json!({"response_format": {"type": "yaml"}}),
            "response_format",
            "response_format.type",
        ),
        (
            json!({"response_format": {"type": "json_schema"}}),
            "response_format",
            "json_schema",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": 3}}}),
            "response_format",
            "schema",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a b",
            "schema": {"type": "object"}}}}),
            "response_format",
            "name",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {
            "schema": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}}}),
            "response_format",
            "invalid grammar",
        ),
        (
            json!({"response_format": {"type": "grammar", "grammar": {"syntax": "ebnf",
            "definition": "x"}}}),
            "response_format",
            "syntax",
        ),
        (
            json!({"response_format": {"type": "grammar", "grammar": {"syntax": "regex",
            "definition": "(("}}}),
            "response_format",
            "invalid grammar",
        ),
        (
            json!({"response_format": {"type": "grammar", "grammar": {"syntax": "lark",
            "definition": "x".repeat(300 * 1024)}}}),
            "response_format",
            "at most",
        ),
        (
            json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "g"}}}),
            "tool_choice",
            "not in `tools`",
        ),
        (
            json!({"tools": tools, "tool_choice": {"type": "function", "function": {}}}),
            "tool_choice",
            "name",
        ),
        (
            json!({"tool_choice": "required"}),
            "tool_choice",
            "needs `tools`",
        ),
        (
            json!({"tools": tools, "tool_choice": "required",
                "response_format": {"type": "json_object"}}),
            "response_format",
            "combined",
        ),
    ];
    for (extra, param, needle) in cases {
        let mut body = json!({"model": srv.model_id, "messages": msgs, "max_tokens": 4});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = chat(&srv, &body);
        assert_eq!(r.status, 400, "{extra}: {}", r.body);
        let e = r.json();
        assert_eq!(e["error"]["param"], param, "{extra}: {}", r.body);
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{extra}: {msg}");
    }
    assert!(srv.wait_idle(Duration::from_secs(10)));
    assert_eq!(srv.metric("quire_prompt_tokens_total"), 0.0);
}

/// `{"type": "text"}` and null are the default; a forced call streams as
/// tool_calls deltas ending with finish_reason "tool_calls".
#[test]
fn forced_call_streams_and_text_default() {
    let Some(srv) = Server::start("forced_call_streams_and_text_default", None, &[]) else {
        return;
    };
    let plain = json!({"model": srv.model_id, "messages": [{"role": "user", "content": "Hi"}],
                       "max_tokens": 8, "temperature": 0});
    let a = chat(&srv, &plain).json();
    for rf in [json!({"type": "text"}), Value::Null] {
        let mut b = plain.clone();
        b["response_format"] = rf;
        assert_eq!(chat(&srv, &b).json()["choices"], a["choices"]);
    }
    let tools = json!([{"type": "function", "function": {"name": "lookup",
        "parameters": {"type": "object", "properties": {"q": {"type": "string", "maxLength": 20}},
                       "required": ["q"]}}}]);
    let body = json!({"model": srv.model_id, "stream": true, "max_tokens": 80, "temperature": 0,
        "messages": [{"role": "user", "content": "Find the capital of France"}],
        "tools": tools, "tool_choice": "required", "parallel_tool_calls": false});
    let r = chat(&srv, &body);
    assert_eq!(r.status, 200);
    let chunks: Vec<Value> = r
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|l| *l != "[DONE]")
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let calls: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert_eq!(
        calls.len(),
        1,
        "one call (parallel_tool_calls false): {}",
        r.body
    );
    assert_eq!(calls[0]["function"]["name"], "lookup");
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(
        args["q"].is_string() && args.as_object().unwrap().len() == 1,
        "{args}"
    );
    let last = chunks
        .iter()
        .rev()
        .find(|c| !c["choices"][0]["finish_reason"].is_null())
        .unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");
}
