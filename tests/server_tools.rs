//! Tool calling on `/v1/chat/completions`, end to end: tool definitions
//! reach the prompt, tool turns are accepted, unsupported `tool_choice`
//! values and invalid tools are 400s naming their field, streamed and
//! non-streamed answers keep their shape. The default model does not write
//! tool calls reliably: the parsers are tested in `server::tools`' unit
//! tests, the template side through the render sandbox here.

mod server_util;

use quire::tokenizer::content::{render_turns, ChatTurn};
use quire::tokenizer::sandbox::{RenderSandbox, SandboxOptions, WorkerConfig};
use quire::tokenizer::ChatMessage;
use serde_json::{json, Value};
use server_util::Server;

fn weather_tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}])
}

fn chat(srv: &Server, body: &Value) -> server_util::Response {
    srv.request("POST", "/v1/chat/completions", Some(&body.to_string()))
}

fn error_param(r: &server_util::Response) -> (String, String) {
    let v = r.json();
    (
        v["error"]["param"].as_str().unwrap_or("").to_string(),
        v["error"]["message"].as_str().unwrap_or("").to_string(),
    )
}

/// A Hermes-style template renders `tools` and assistant `tool_calls` the
/// same in the sandboxed worker as in process (the render protocol carries
/// both).
#[test]
fn sandbox_renders_tools() {
    let src = "{%- if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>{% endif %}\
               {%- for m in messages %}[{{ m.role }}]{{ m.content }}\
               {%- if m.tool_calls is defined %}{% for c in m.tool_calls %}<tool_call>{{ c.function.name }} {{ c.function.arguments | tojson }}</tool_call>{% endfor %}{% endif %}\
               {%- if m.tool_call_id is defined %}({{ m.tool_call_id }}){% endif %}{% endfor %}";
    let mut opts = SandboxOptions::new(env!("CARGO_BIN_EXE_quire").into());
    opts.max_workers = 1;
    let sb = RenderSandbox::new(
        opts,
        WorkerConfig {
            template: src.into(),
            bos_token: String::new(),
            eos_token: String::new(),
        },
    )
    .expect("starting the sandbox");
    let turns = [
        ChatTurn::from(&ChatMessage::new("user", "Weather in Paris?")),
        ChatTurn {
            tool_calls: Some(json!([{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}])),
            ..ChatTurn::from(&ChatMessage::new("assistant", ""))
        },
        ChatTurn {
            tool_call_id: Some("call_1".into()),
            ..ChatTurn::from(&ChatMessage::new("tool", "18 C"))
        },
    ];
    let tools = weather_tools();
    let inproc = render_turns(src, &turns, Some(&tools), false, "", "").unwrap();
    let worker = sb.render_turns(&turns, Some(&tools), false).unwrap();
    assert_eq!(worker, inproc);
    assert!(
        worker.starts_with("<tools>{\"function\":{\"description\":\"Current weather"),
        "{worker}"
    );
    assert!(
        worker.contains("<tool_call>get_weather {\"city\":\"Paris\"}</tool_call>"),
        "{worker}"
    );
    assert!(worker.ends_with("[tool]18 C(call_1)"), "{worker}");
    // No tools: the variable is undefined, plain turns render as before.
    let plain = sb.render(&[ChatMessage::new("user", "hi")], false).unwrap();
    assert_eq!(plain, "[user]hi");
}

#[test]
fn server_tools_requests() {
    let Some(srv) = Server::start("server_tools_requests", None, &[]) else {
        return;
    };
    let model = srv.model_id.clone();
    let user = json!({"role": "user", "content": "What is the weather in Paris?"});
    let base = json!({"model": model, "messages": [user], "max_tokens": 2, "temperature": 0});

    // (a) The tool definitions reach the prompt: SmolLM2's template
    // ignores `tools`, so they are described in the system turn.
    let r = chat(&srv, &base);
    assert_eq!(r.status, 200, "{}", r.body);
    let plain_tokens = r.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    let mut with_tools = base.clone();
    with_tools["tools"] = weather_tools();
    let r = chat(&srv, &with_tools);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let tool_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        tool_tokens > plain_tokens + 40,
        "{tool_tokens} vs {plain_tokens}"
    );
    let choice = &v["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(
        ["length", "stop", "tool_calls"].contains(&choice["finish_reason"].as_str().unwrap()),
        "{v}"
    );
    // tool_choice "none": no tools in the prompt.
    let mut none = with_tools.clone();
    none["tool_choice"] = json!("none");
    let r = chat(&srv, &none);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["prompt_tokens"], json!(plain_tokens));
    // parallel_tool_calls and an explicit "auto" are accepted.
    let mut auto = with_tools.clone();
    auto["tool_choice"] = json!("auto");
    auto["parallel_tool_calls"] = json!(false);
    let r = chat(&srv, &auto);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["prompt_tokens"], json!(tool_tokens));

    // (b) A tool round trip: the assistant's call (content null) and the
    // tool's answer are accepted and rendered.
    let mut trip = with_tools.clone();
    trip["messages"] = json!([
        user,
        {"role": "assistant", "content": null, "tool_calls": [{
            "id": "call_abc", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "18 C, sunny"},
    ]);
    trip["n"] = json!(2);
    let r = chat(&srv, &trip);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["choices"].as_array().unwrap().len(), 2, "{v}");
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > tool_tokens + 10);
    // Streamed, n = 2: every choice ends with a finish reason, then [DONE].
    trip["stream"] = json!(true);
    let r = chat(&srv, &trip);
    assert_eq!(r.status, 200, "{}", r.body);
    let events: Vec<&str> = r
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{}", r.body);
    let mut finished = [false; 2];
    for e in &events[..events.len() - 1] {
        let c: Value = serde_json::from_str(e).unwrap();
        for ch in c["choices"].as_array().unwrap() {
            if ch["finish_reason"].is_string() {
                finished[ch["index"].as_u64().unwrap() as usize] = true;
            }
        }
    }
    assert_eq!(finished, [true, true], "{}", r.body);
    // A tool turn needs the id of the call it answers.
    let mut no_id = base.clone();
    no_id["messages"] = json!([user, {"role": "tool", "content": "x"}]);
    let r = chat(&srv, &no_id);
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(error_param(&r).0, "messages");

    // (c) "required" and a named function are enforced by a grammar: the
    // output starts with the call (cut here by `max_tokens`; whole calls
    // are checked in tests/constrain.rs and tests/server_structured.rs).
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_weather"}}),
    ] {
        let mut b = with_tools.clone();
        b["tool_choice"] = choice;
        let r = chat(&srv, &b);
        assert_eq!(r.status, 200, "{}", r.body);
        let m = &r.json()["choices"][0]["message"];
        let started = m["content"]
            .as_str()
            .is_some_and(|c| c.starts_with("<tool"))
            || m["tool_calls"].is_array();
        assert!(started, "{}", r.body);
    }
    let mut b = base.clone();
    b["tool_choice"] = json!("auto");
    let r = chat(&srv, &b);
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(error_param(&r).0, "tool_choice");

    // (d) Invalid tools name `tools`.
    let many: Vec<Value> = (0..129)
        .map(|i| json!({"type": "function", "function": {"name": format!("f{i}")}}))
        .collect();
    for tools in [
        json!([{"type": "retrieval", "function": {"name": "f"}}]),
        json!([{"type": "function", "function": {"name": ""}}]),
        json!([{"type": "function", "function": {"name": "bad name!"}}]),
        json!([{"type": "function", "function": {"name": "x".repeat(65)}}]),
        json!([{"type": "function"}]),
        json!([{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
        json!("get_weather"),
        Value::Array(many),
    ] {
        let mut b = base.clone();
        b["tools"] = tools.clone();
        let r = chat(&srv, &b);
        assert_eq!(r.status, 400, "{tools}: {}", r.body);
        assert_eq!(error_param(&r).0, "tools", "{}", r.body);
    }
    // Tools on /v1/completions are still refused.
    let b = json!({"model": model, "prompt": "hi", "max_tokens": 1, "tools": weather_tools()});
    let r = srv.request("POST", "/v1/completions", Some(&b.to_string()));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(error_param(&r).0, "tools");
}
