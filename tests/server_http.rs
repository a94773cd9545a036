//! End-to-end tests of `quire serve` over raw HTTP: error shapes and
//! statuses, authentication, client disconnects (blocks freed), the full
//! queue (429 + Retry-After). The OpenAI-client tests are in server_openai.rs.

mod server_util;

use server_util::{http, open_stream, Server};
use std::time::Duration;

const KEY: &str = "test-key-123";

fn assert_error_shape(r: &server_util::Response, status: u16, needle: &str) {
    assert_eq!(r.status, status, "body: {}", r.body);
    let v = r.json();
    let e = &v["error"];
    let msg = e["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no error.message: {v}"));
    assert!(e["type"].is_string(), "no error.type: {v}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
    assert!(msg.contains(needle), "message {msg:?} lacks {needle:?}");
}

#[test]
fn server_errors_and_auth() {
    let Some(srv) = Server::start("server_errors_and_auth", Some(KEY), &[]) else {
        return;
    };
    let model = srv.model_id.clone();
    // /health needs no key.
    let r = http(&srv.addr, "GET", "/health", &[], None);
    assert_eq!(r.status, 200, "{}", r.body);
    // Everything else does.
    let r = http(&srv.addr, "GET", "/v1/models", &[], None);
    assert_error_shape(&r, 401, "API key");
    let r = http(
        &srv.addr,
        "GET",
        "/metrics",
        &[("Authorization", "Bearer wrong")],
        None,
    );
    assert_error_shape(&r, 401, "API key");
    let body = format!(r#"{{"model":"{model}","prompt":"hi","max_tokens":1}}"#);
    let r = http(&srv.addr, "POST", "/v1/completions", &[], Some(&body));
    assert_error_shape(&r, 401, "API key");

    let r = srv.request("GET", "/v1/models", None);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["data"][0]["id"].as_str(), Some(model.as_str()));

    // Malformed JSON.
    let r = srv.request("POST", "/v1/chat/completions", Some("{\"model\": "));
    assert_error_shape(&r, 400, "malformed JSON");
    // Wrong types.
    let body = format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}],"temperature":"hot"}}"#
    );
    let r = srv.request("POST", "/v1/chat/completions", Some(&body));
    assert_error_shape(&r, 400, "invalid");
    let body = format!(r#"{{"model":"{model}","messages":"hi"}}"#);
    let r = srv.request("POST", "/v1/chat/completions", Some(&body));
    assert_error_shape(&r, 400, "invalid");
    // Out-of-range values name the parameter.
    let body = format!(r#"{{"model":"{model}","prompt":"hi","temperature":5}}"#);
    let r = srv.request("POST", "/v1/completions", Some(&body));
    assert_error_shape(&r, 400, "temperature");
    assert_eq!(r.json()["error"]["param"].as_str(), Some("temperature"));
    // Unknown model.
    let r = srv.request(
        "POST",
        "/v1/completions",
        Some(r#"{"model":"no-such-model","prompt":"hi"}"#),
    );
    assert_error_shape(&r, 404, "no-such-model");
    // A prompt over the context names the limits.
    let ctx = r_ctx(&srv);
    let ids: Vec<String> = (0..ctx + 8).map(|i| (100 + i % 1000).to_string()).collect();
    let body = format!(
        r#"{{"model":"{model}","prompt":[{}],"max_tokens":4}}"#,
        ids.join(",")
    );
    let r = srv.request("POST", "/v1/completions", Some(&body));
    assert_error_shape(&r, 400, &format!("maximum context length is {ctx} tokens"));
    assert!(r.body.contains(&format!("{}", ctx + 8)), "{}", r.body);
    // max_tokens past the context, with a short prompt.
    let body = format!(
        r#"{{"model":"{model}","prompt":"hi","max_tokens":{}}}"#,
        ctx
    );
    let r = srv.request("POST", "/v1/completions", Some(&body));
    assert_error_shape(&r, 400, "maximum context length");
    // Unknown endpoint.
    let r = srv.request("GET", "/v1/nothing", None);
    assert_error_shape(&r, 404, "/v1/nothing");
    // Nothing was left running by the rejected requests.
    assert!(srv.wait_idle(Duration::from_secs(10)));
}

fn r_ctx(srv: &Server) -> usize {
    let r = srv.request("GET", "/v1/models", None);
    r.json()["data"][0]["max_model_len"]
        .as_u64()
        .expect("max_model_len") as usize
}

#[test]
fn server_client_disconnect_frees_blocks() {
    let Some(srv) = Server::start("server_client_disconnect_frees_blocks", None, &[]) else {
        return;
    };
    let body = format!(
        r#"{{"model":"{}","prompt":"Once upon a time","max_tokens":400,"temperature":0,"stream":true}}"#,
        srv.model_id
    );
    let s = open_stream(&srv.addr, None, "/v1/completions", &body, 3);
    // Mid-generation: the sequence holds blocks.
    assert!(srv.metric("quire_kv_blocks_used") > 0.0);
    drop(s);
    assert!(
        srv.wait_idle(Duration::from_secs(30)),
        "blocks not freed after the client disconnected: used {}",
        srv.metric("quire_kv_blocks_used")
    );
    let r = srv.request("GET", "/metrics", None);
    assert!(
        r.body
            .contains("quire_sequences_finished_total{reason=\"cancelled\"} 1"),
        "{}",
        r.body
    );
    // The server still serves.
    let body = format!(
        r#"{{"model":"{}","prompt":"Hello","max_tokens":2,"temperature":0}}"#,
        srv.model_id
    );
    let r = srv.request("POST", "/v1/completions", Some(&body));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["completion_tokens"].as_u64(), Some(2));
}

#[test]
fn server_full_queue_answers_429() {
    // One running sequence at most, one waiting at most.
    let Some(srv) = Server::start(
        "server_full_queue_answers_429",
        None,
        &["--max-queue", "1", "--max-running", "1"],
    ) else {
        return;
    };
    let body = format!(
        r#"{{"model":"{}","prompt":"Once upon a time","max_tokens":400,"temperature":0,"stream":true}}"#,
        srv.model_id
    );
    let a = open_stream(&srv.addr, None, "/v1/completions", &body, 2);
    // A is running; B waits in the queue (its stream opens with no events).
    let mut b = std::net::TcpStream::connect(&srv.addr).unwrap();
    {
        use std::io::Write;
        let req = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
            srv.addr,
            body.len(),
            body
        );
        b.write_all(req.as_bytes()).unwrap();
    }
    let t0 = std::time::Instant::now();
    while srv.metric("quire_queue_depth") < 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(20), "B never queued");
        std::thread::sleep(Duration::from_millis(50));
    }
    let r = srv.request("POST", "/v1/completions", Some(&body));
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(r.headers.contains_key("retry-after"), "{:?}", r.headers);
    assert_eq!(r.json()["error"]["type"].as_str(), Some("rate_limit_error"));
    assert!(srv.metric("quire_requests_rejected_total") >= 1.0);
    drop(a);
    drop(b);
    assert!(srv.wait_idle(Duration::from_secs(30)));
}

fn completion(srv: &Server, prompt: &str, max_tokens: usize) -> serde_json::Value {
    let body = serde_json::json!({
        "model": srv.model_id, "prompt": prompt, "max_tokens": max_tokens,
        "temperature": 0, "logprobs": 1,
    })
    .to_string();
    let r = srv.request("POST", "/v1/completions", Some(&body));
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

#[test]
fn server_preemption_recomputes_exactly() {
    // 16 blocks of 16 tokens: 6 sequences of ~70 tokens cannot all fit, so
    // the scheduler preempts and recomputes; outputs must not change.
    let Some(srv) = Server::start(
        "server_preemption_recomputes_exactly",
        None,
        &[
            "--kv-tokens",
            "256",
            "--max-batch-tokens",
            "64",
            "--min-prefill-tokens",
            "16",
        ],
    ) else {
        return;
    };
    let prompts: Vec<String> = (0..6)
        .map(|i| format!("Story {i}: once upon a time, a dragon named Ember"))
        .collect();
    let alone: Vec<serde_json::Value> = prompts.iter().map(|p| completion(&srv, p, 60)).collect();
    assert_eq!(srv.metric("quire_preemptions_total"), 0.0);
    let crowd: Vec<serde_json::Value> = std::thread::scope(|sc| {
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| sc.spawn(|| completion(&srv, p, 60)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        srv.metric("quire_preemptions_total") > 0.0,
        "the workload was meant to force preemption"
    );
    for (a, c) in alone.iter().zip(&crowd) {
        assert_eq!(a["choices"][0]["text"], c["choices"][0]["text"]);
        assert_eq!(
            a["choices"][0]["logprobs"]["token_logprobs"],
            c["choices"][0]["logprobs"]["token_logprobs"]
        );
        assert_eq!(c["usage"]["completion_tokens"].as_u64(), Some(60));
    }
    assert!(srv.wait_idle(Duration::from_secs(10)));
}

#[test]
fn server_prefix_cache_hits_repeat_prompts() {
    let Some(srv) = Server::start("server_prefix_cache_hits_repeat_prompts", None, &[]) else {
        return;
    };
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(8);
    let a = completion(&srv, &prompt, 4);
    let hits0 = srv.metric("quire_prefix_cache_hit_tokens_total");
    let b = completion(&srv, &prompt, 4);
    let hits1 = srv.metric("quire_prefix_cache_hit_tokens_total");
    let prompt_tokens = a["usage"]["prompt_tokens"].as_u64().unwrap() as f64;
    // All full blocks but the one holding the last prompt token are reused.
    assert!(
        hits1 - hits0 >= (prompt_tokens - 16.0).floor() - 15.0 && hits1 > hits0,
        "hits {hits0} -> {hits1} for a {prompt_tokens}-token prompt"
    );
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    assert_eq!(
        a["choices"][0]["logprobs"]["token_logprobs"],
        b["choices"][0]["logprobs"]["token_logprobs"]
    );
    assert!(srv.metric("quire_prefix_cache_hit_rate") > 0.0);
    // usage reports the hit: none the first time, the reused blocks after.
    let cached =
        |v: &serde_json::Value| v["usage"]["prompt_tokens_details"]["cached_tokens"].as_f64();
    assert_eq!(cached(&a), Some(0.0), "{a}");
    assert_eq!(cached(&b), Some(hits1 - hits0), "{b}");
}

#[test]
fn server_graceful_shutdown_finishes_streams() {
    let Some(mut srv) = Server::start("server_graceful_shutdown_finishes_streams", None, &[])
    else {
        return;
    };
    let body = format!(
        r#"{{"model":"{}","prompt":"Once upon a time","max_tokens":24,"temperature":0,"stream":true}}"#,
        srv.model_id
    );
    let mut s = open_stream(&srv.addr, None, "/v1/completions", &body, 2);
    let status = srv.terminate(Duration::from_secs(60));
    // The in-flight stream ran to its end.
    let mut rest = String::new();
    use std::io::Read;
    let _ = s.read_to_string(&mut rest);
    assert!(rest.contains("\"finish_reason\":\"length\""), "{rest}");
    assert!(rest.contains("data: [DONE]"), "{rest}");
    let status = status.expect("the server did not exit after SIGTERM");
    assert!(status.success(), "exit status {status}");
}
