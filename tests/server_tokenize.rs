//! llama-server's `/tokenize` and `/detokenize`, `GET /v1/models/{id}` and
//! CORS (`--cors-origins`) against `quire serve` on the default model.

mod server_util;

use server_util::{http, Server};

#[test]
fn tokenize_detokenize_models_and_cors() {
    let Some(srv) = Server::start(
        "tokenize_detokenize_models_and_cors",
        Some("k1"),
        &["--cors-origins", "https://app.example.com"],
    ) else {
        return;
    };
    let auth = [("Authorization", "Bearer k1")];
    let post = |path: &str, body: &str| http(&srv.addr, "POST", path, &auth, Some(body));

    // Round trip, with and without specials and pieces.
    let text = "Hello, world! Straße 42 — ok";
    let r = post(
        "/tokenize",
        &serde_json::json!({ "content": text }).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let ids: Vec<u32> = serde_json::from_value(r.json()["tokens"].clone()).unwrap();
    assert!(ids.len() > 5, "{ids:?}");
    let r = post(
        "/tokenize",
        &serde_json::json!({ "content": text, "add_special": true }).to_string(),
    );
    let with_bos: Vec<u32> = serde_json::from_value(r.json()["tokens"].clone()).unwrap();
    assert!(
        with_bos.len() >= ids.len() && with_bos.ends_with(&ids),
        "{with_bos:?} / {ids:?}"
    );
    let r = post(
        "/tokenize",
        &serde_json::json!({ "content": text, "with_pieces": true }).to_string(),
    );
    let pieces = r.json()["tokens"].as_array().unwrap().clone();
    assert_eq!(pieces.len(), ids.len());
    // A piece is a string, or its bytes where it is not UTF-8 on its own
    // (part of a multi-byte character).
    let mut joined = Vec::new();
    for (p, &id) in pieces.iter().zip(&ids) {
        assert_eq!(p["id"].as_u64(), Some(id as u64));
        match &p["piece"] {
            serde_json::Value::String(s) => joined.extend_from_slice(s.as_bytes()),
            serde_json::Value::Array(b) => {
                joined.extend(b.iter().map(|x| x.as_u64().unwrap() as u8))
            }
            other => panic!("piece {other}"),
        }
    }
    assert_eq!(joined, text.as_bytes());
    let r = post(
        "/detokenize",
        &serde_json::json!({ "tokens": ids }).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["content"], text);

    // Bad input: 400 in OpenAI's shape, naming what is wrong.
    let r = post("/detokenize", r#"{"tokens": [1, 99999999]}"#);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("tokens[1]"), "{}", r.body);
    let r = post("/tokenize", r#"{"content": "x", "bogus": 1}"#);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("bogus"), "{}", r.body);
    let r = post("/tokenize", r#"{"content": 5}"#);
    assert_eq!(r.status, 400, "{}", r.body);
    // The key is required here as everywhere.
    let r = http(
        &srv.addr,
        "POST",
        "/tokenize",
        &[],
        Some(r#"{"content": "x"}"#),
    );
    assert_eq!(r.status, 401, "{}", r.body);

    // GET /v1/models/{id}
    let r = http(
        &srv.addr,
        "GET",
        &format!("/v1/models/{}", srv.model_id),
        &auth,
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["id"], srv.model_id.as_str());
    let r = http(&srv.addr, "GET", "/v1/models/nope", &auth, None);
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "model_not_found");

    // CORS: a preflight from the allowed origin is answered without the
    // key; a request carries the header; another origin gets none.
    let origin = ("Origin", "https://app.example.com");
    let r = http(
        &srv.addr,
        "OPTIONS",
        "/v1/chat/completions",
        &[
            origin,
            ("Access-Control-Request-Method", "POST"),
            (
                "Access-Control-Request-Headers",
                "authorization,content-type",
            ),
        ],
        None,
    );
    assert!(
        r.status == 200 || r.status == 204,
        "{} {}",
        r.status,
        r.body
    );
    assert_eq!(
        r.headers
            .get("access-control-allow-origin")
            .map(String::as_str),
        Some("https://app.example.com")
    );
    let methods = r
        .headers
        .get("access-control-allow-methods")
        .cloned()
        .unwrap_or_default();
    assert!(methods.contains("POST"), "{methods}");
    let r = http(&srv.addr, "GET", "/v1/models", &[auth[0], origin], None);
    assert_eq!(r.status, 200);
    assert_eq!(
        r.headers
            .get("access-control-allow-origin")
            .map(String::as_str),
        Some("https://app.example.com")
    );
    let r = http(
        &srv.addr,
        "GET",
        "/v1/models",
        &[auth[0], ("Origin", "https://evil.example.com")],
        None,
    );
    assert_eq!(r.status, 200);
    assert!(
        !r.headers.contains_key("access-control-allow-origin"),
        "{:?}",
        r.headers
    );
}

#[test]
fn cors_origins_are_checked_at_start() {
    for bad in ["app.example.com", "https://a.example.com/path", ""] {
        let err = quire::server::parse_cors_origins(bad).unwrap_err();
        assert!(!format!("{err:#}").is_empty());
    }
    assert_eq!(
        quire::server::parse_cors_origins("https://a.example.com, http://localhost:3000").unwrap(),
        vec!["https://a.example.com", "http://localhost:3000"]
    );
    assert_eq!(quire::server::parse_cors_origins("*").unwrap(), vec!["*"]);
}

/// OpenAI's `logit_bias` end to end: a +100 bias makes greedy decoding
/// emit that token every step; a -100 bias on the unbiased run's first
/// token changes it (the penalties' arithmetic: tests/sampler_basic.rs).
#[test]
fn logit_bias_and_penalties_steer_greedy_decoding() {
    let Some(srv) = Server::start("logit_bias_and_penalties_steer_greedy_decoding", None, &[])
    else {
        return;
    };
    let post = |path: &str, body: serde_json::Value| {
        let r = http(&srv.addr, "POST", path, &[], Some(&body.to_string()));
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    let ids = |text: &str| -> Vec<u32> {
        serde_json::from_value(
            post("/tokenize", serde_json::json!({ "content": text }))["tokens"].clone(),
        )
        .unwrap()
    };
    let hello = ids(" hello")[0];
    let complete = |extra: serde_json::Value| {
        let mut body = serde_json::json!({
            "model": srv.model_id, "prompt": "The capital of France is",
            "max_tokens": 6, "temperature": 0,
        });
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        post("/v1/completions", body)["choices"][0]["text"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let plain = complete(serde_json::json!({}));
    let forced = complete(serde_json::json!({ "logit_bias": { hello.to_string(): 100 } }));
    assert_eq!(forced, " hello".repeat(6), "plain: {plain:?}");
    let first = ids(&plain)[0];
    let banned = complete(serde_json::json!({ "logit_bias": { first.to_string(): -100 } }));
    assert_ne!(ids(&banned)[0], first, "{plain:?} / {banned:?}");
    // Penalties are accepted (and change nothing at 0).
    let zero = complete(serde_json::json!({ "frequency_penalty": 0, "presence_penalty": 0.0 }));
    assert_eq!(zero, plain);
}
