//! `/v1/completions` with several prompts (strings or token-id lists) and
//! `echo`, over HTTP on the default model: choices numbered prompt by
//! prompt, each the same as its prompt alone, streamed and not; usage
//! summed; the limits are 400s naming their field.

mod server_util;

use serde_json::{json, Value};
use server_util::Server;
use std::collections::BTreeMap;
use std::time::Duration;

fn post(srv: &Server, body: &Value) -> server_util::Response {
    srv.request("POST", "/v1/completions", Some(&body.to_string()))
}

/// Choice texts by index from an SSE body.
fn streamed(body: &str) -> (BTreeMap<u64, String>, BTreeMap<u64, String>) {
    let (mut texts, mut reasons) = (BTreeMap::new(), BTreeMap::new());
    for l in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if l == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(l).unwrap();
        for c in v["choices"].as_array().unwrap() {
            let i = c["index"].as_u64().unwrap();
            texts
                .entry(i)
                .or_insert_with(String::new)
                .push_str(c["text"].as_str().unwrap());
            if let Some(r) = c["finish_reason"].as_str() {
                reasons.insert(i, r.to_string());
            }
        }
    }
    (texts, reasons)
}

#[test]
fn prompt_lists_and_echo() {
    let Some(srv) = Server::start("prompt_lists_and_echo", None, &[]) else {
        return;
    };
    let model = srv.model_id.clone();
    let prompts = ["The sky is", "Two plus two is", "My favourite fruit is"];
    let alone: Vec<Value> = prompts
        .iter()
        .map(|p| {
            let r = post(
                &srv,
                &json!({"model": model, "prompt": p, "max_tokens": 8,
                                       "temperature": 0}),
            );
            assert_eq!(r.status, 200, "{}", r.body);
            r.json()
        })
        .collect();
    // Three prompts, n = 2 (greedy, so both choices of a prompt agree).
    let r = post(
        &srv,
        &json!({"model": model, "prompt": prompts, "max_tokens": 8,
                               "temperature": 0, "n": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 6);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], alone[i / 2]["choices"][0]["text"], "choice {i}");
    }
    let prompt_sum: u64 = alone
        .iter()
        .map(|a| a["usage"]["prompt_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(v["usage"]["prompt_tokens"], prompt_sum);

    // Token-id lists, streamed: the same texts per index.
    let ids: Vec<Value> = prompts
        .iter()
        .map(|p| {
            let t = srv.request(
                "POST",
                "/tokenize",
                Some(&json!({"content": p}).to_string()),
            );
            t.json()["tokens"].clone()
        })
        .collect();
    let r = post(
        &srv,
        &json!({"model": model, "prompt": ids, "max_tokens": 8,
                               "temperature": 0, "stream": true}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let (texts, reasons) = streamed(&r.body);
    assert_eq!(texts.len(), 3);
    for (i, t) in &texts {
        assert_eq!(
            Value::from(t.as_str()),
            alone[*i as usize]["choices"][0]["text"]
        );
        assert!(reasons.contains_key(i));
    }

    // echo: the prompt, then the completion; streamed, the prompt first.
    let r = post(
        &srv,
        &json!({"model": model, "prompt": prompts[..2], "max_tokens": 8,
                               "temperature": 0, "echo": true}),
    );
    let v = r.json();
    for (i, c) in v["choices"].as_array().unwrap().iter().enumerate() {
        let want = format!(
            "{}{}",
            prompts[i],
            alone[i]["choices"][0]["text"].as_str().unwrap()
        );
        assert_eq!(c["text"], want.as_str());
    }
    let r = post(
        &srv,
        &json!({"model": model, "prompt": prompts[0], "max_tokens": 8,
                               "temperature": 0, "echo": true, "stream": true}),
    );
    let first = r
        .body
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .unwrap();
    let first: Value = serde_json::from_str(first).unwrap();
    assert_eq!(first["choices"][0]["text"], prompts[0]);
    let (texts, _) = streamed(&r.body);
    assert_eq!(
        texts[&0],
        format!(
            "{}{}",
            prompts[0],
            alone[0]["choices"][0]["text"].as_str().unwrap()
        )
    );
    assert!(srv.wait_idle(Duration::from_secs(30)));
}

#[test]
fn prompt_list_limits() {
    let Some(srv) = Server::start("prompt_list_limits", None, &["--max-queue", "8"]) else {
        return;
    };
    let model = srv.model_id.clone();
    let many: Vec<String> = (0..65).map(|i| format!("p{i}")).collect();
    let cases = [
        (json!({"prompt": [], "max_tokens": 1}), "prompt", "empty"),
        (
            json!({"prompt": many, "max_tokens": 1}),
            "prompt",
            "at most 64",
        ),
        (
            json!({"prompt": ["a", "b", "c"], "n": 3, "max_tokens": 1}),
            "prompt",
            "--max-queue",
        ),
        (
            json!({"prompt": "a", "echo": true, "logprobs": 2}),
            "echo",
            "echo",
        ),
        (
            json!({"prompt": [[1, 2], [999999999]], "max_tokens": 1}),
            "prompt",
            "vocabulary",
        ),
    ];
    for (extra, param, needle) in cases {
        let mut body = json!({"model": model});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = post(&srv, &body);
        assert_eq!(r.status, 400, "{extra}: {}", r.body);
        let e = r.json();
        assert_eq!(e["error"]["param"], param, "{extra}: {}", r.body);
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{extra}: {msg}");
    }
    assert!(srv.wait_idle(Duration::from_secs(10)));
}
