//! HTTP target: mutated requests through the router in process
//! (`tower::ServiceExt::oneshot`), over an engine on the default model on
//! the cpu. Bodies start as valid chat / completion requests and get
//! structure-aware JSON edits (wrong types, edge numbers, deep nesting,
//! unknown fields, long and odd strings), then byte-level damage
//! (truncation, invalid UTF-8). A request that is still valid keeps
//! `max_tokens` at most 4, so the engine answers fast.

use axum::body::Body;
use axum::http::{HeaderValue, Method, Request, StatusCode};
use axum::Router;
use proptest::prelude::*;
use proptest::sample::Index;
use quire::runner::{Runner, RunnerOptions};
use quire::serve::EngineConfig;
use quire::server::{router, AppState};
use quire::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tower::ServiceExt;

pub const KEY: &str = "fuzz-key";

/// A whole request, body included, must finish within this.
pub const MAX_REQUEST: Duration = Duration::from_secs(60);

pub struct Target {
    pub rt: tokio::runtime::Runtime,
    /// Without and with an API key, over one engine.
    pub open: Router,
    pub keyed: Router,
    pub model_id: String,
}

/// The routers, or None when the default model is unavailable.
pub fn target() -> Option<&'static Target> {
    static T: OnceLock<Option<Target>> = OnceLock::new();
    T.get_or_init(|| {
        let path = match quire::fetch::default_model_path() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("SKIPPED: fuzz http: the default model is unavailable: {e:#}");
                return None;
            }
        };
        let opts = RunnerOptions {
            threads: Some(1),
            kv_tokens: Some(4096),
            ..Default::default()
        };
        let runner = Runner::load(&path, &opts).expect("loading the default model");
        let tok = Arc::new(Tokenizer::from_gguf(&runner.gguf).expect("tokenizer"));
        // The engine thread lives as long as the test process.
        let (engine, _join) = quire::serve::spawn(runner, EngineConfig::default()).expect("engine");
        let model_id = "fuzz-model".to_string();
        let open = Arc::new(AppState::new(engine.clone(), tok.clone(), model_id.clone()));
        let mut keyed = AppState::new(engine, tok, model_id.clone());
        keyed.api_key = Some(KEY.into());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        Some(Target {
            rt,
            open: router(open),
            keyed: router(Arc::new(keyed)),
            model_id,
        })
    })
    .as_ref()
}

const PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/metrics",
    "/health",
    "/",
    "/v1",
    "/v1/chat/completions/",
    "/v1/embeddings",
    "/v1/models/fuzz-model",
    "//v1//completions",
    "/v1/chat/completions?stream=true",
    "/%2e%2e/etc/passwd",
    "/v1/%FF%FE",
];

const METHODS: &[&str] = &[
    "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "FUZZ",
];

const CONTENT_TYPES: &[&str] = &[
    "application/json",
    "application/json; charset=utf-8",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "",
    "json",
];

const AUTHS: &[&str] = &[
    "Bearer fuzz-key",
    "bearer fuzz-key",
    "BEARER fuzz-key",
    "Bearer wrong",
    "Bearer ",
    "Bearer  fuzz-key",
    "Basic ZnV6ejprZXk=",
    "fuzz-key",
    "",
];

/// A JSON value to put somewhere.
fn edge_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        Just(json!(true)),
        Just(json!(-1)),
        Just(json!(0)),
        Just(json!(1.5)),
        Just(json!(1e308)),
        Just(json!(-1e308)),
        Just(json!(i64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(u64::MAX)),
        Just(json!("NaN")),
        Just(json!("Infinity")),
        Just(json!("")),
        Just(json!("x".repeat(3000))),
        Just(json!("\u{0}<|im_end|><|endoftext|>\u{fffd}")),
        Just(json!([])),
        Just(json!({})),
        Just(json!([99999999, -1, 0])),
        Just(json!([[1, 2], [3]])),
        Just(json!({"type": "text", "text": "hi"})),
        Just(json!([{"type": "image_url", "image_url": {"url": "x"}}])),
        Just(json!(["a", "b"])),
        any::<i64>().prop_map(|x| json!(x)),
        any::<f64>().prop_map(|x| json!(x)),
        "\\PC{0,16}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 12, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec(("[a-z_]{1,8}", inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Values for a token budget: small valid ones, or invalid ones that must
/// be refused before any generation (never null or a large valid count,
/// which would generate up to the context length on the cpu).
fn max_tokens_val() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => (1u64..=4).prop_map(|x| json!(x)),
        1 => Just(json!(0)),
        1 => Just(json!(-1)),
        1 => Just(json!(2.5)),
        1 => Just(json!("2")),
        1 => Just(json!(u64::MAX)),
        1 => Just(json!(1e30)),
        1 => Just(json!(1_000_000_000u64)),
        1 => Just(json!([2])),
    ]
}

#[derive(Clone, Debug)]
pub enum JMut {
    /// Set a top-level field (an existing one or a known optional one).
    Field {
        name: Index,
        val: Value,
    },
    Remove(Index),
    Unknown(String, Value),
    MaxTokens {
        completion: bool,
        val: Value,
    },
    /// Set a field of one message / prompt element.
    Inner {
        at: Index,
        key: Index,
        val: Value,
    },
    AddMessage {
        role: Index,
        content: Value,
    },
    Nest(u16),
}

const FIELDS: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "stream",
    "stream_options",
    "stop",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "seed",
    "n",
    "logprobs",
    "top_logprobs",
    "echo",
    "suffix",
    "user",
    "tools",
    "response_format",
];

const ROLES: &[&str] = &[
    "user",
    "assistant",
    "system",
    "tool",
    "developer",
    "",
    "USER",
    "<|im_start|>",
];

fn jmut() -> impl Strategy<Value = JMut> {
    let ix = any::<Index>;
    prop_oneof![
        6 => (ix(), edge_json()).prop_map(|(name, val)| JMut::Field { name, val }),
        2 => ix().prop_map(JMut::Remove),
        1 => ("[a-z_]{1,12}", edge_json()).prop_map(|(k, v)| JMut::Unknown(k, v)),
        2 => (any::<bool>(), max_tokens_val()).prop_map(|(completion, val)| JMut::MaxTokens { completion, val }),
        3 => (ix(), ix(), edge_json()).prop_map(|(at, key, val)| JMut::Inner { at, key, val }),
        2 => (ix(), edge_json()).prop_map(|(role, content)| JMut::AddMessage { role, content }),
        1 => prop_oneof![Just(16u16), Just(127), Just(129), Just(2000)].prop_map(JMut::Nest),
    ]
}

/// Damage done to the serialized body.
#[derive(Clone, Debug)]
pub enum Raw {
    None,
    Truncate(Index),
    InvalidUtf8(Index),
    Replace(Vec<u8>),
    Huge,
}

fn raw() -> impl Strategy<Value = Raw> {
    prop_oneof![
        12 => Just(Raw::None),
        2 => any::<Index>().prop_map(Raw::Truncate),
        1 => any::<Index>().prop_map(Raw::InvalidUtf8),
        1 => prop_oneof![
            Just(b"".to_vec()),
            Just(b"null".to_vec()),
            Just(b"[]".to_vec()),
            Just(b"{\"model\":1e999}".to_vec()),
            Just(b"{\"a\":1,\"a\":2}".to_vec()),
            proptest::collection::vec(any::<u8>(), 0..64),
        ].prop_map(Raw::Replace),
        1 => Just(Raw::Huge),
    ]
}

#[derive(Clone, Debug)]
pub struct Req {
    pub method: usize,
    pub path: usize,
    pub chat: bool,
    pub stream: bool,
    pub ctype: Option<Index>,
    pub auth: Option<Index>,
    pub keyed: bool,
    pub muts: Vec<JMut>,
    pub raw: Raw,
}

pub fn case() -> impl Strategy<Value = Req> {
    (
        // Mostly POST to the two generation endpoints: that is where the
        // parsing is.
        prop_oneof![3 => Just(1usize), 1 => 0usize..METHODS.len()],
        prop_oneof![4 => 0usize..2, 1 => 0usize..PATHS.len()],
        any::<(bool, bool, bool)>(),
        proptest::option::weighted(0.8, any::<Index>()),
        proptest::option::weighted(0.3, any::<Index>()),
        proptest::collection::vec(jmut(), 0..4),
        raw(),
    )
        .prop_map(
            |(m, p, (chat, stream, keyed), ctype, auth, muts, raw)| Req {
                method: m,
                path: p,
                chat,
                stream,
                ctype,
                auth,
                keyed,
                muts,
                raw,
            },
        )
}

/// The request body (before byte-level damage).
fn body_json(r: &Req, model_id: &str) -> Value {
    let mut v = if r.chat {
        json!({
            "model": model_id,
            "messages": [{"role": "user", "content": "Say hi."}],
            "max_tokens": 2,
        })
    } else {
        json!({"model": model_id, "prompt": "Once upon a time", "max_tokens": 2})
    };
    if r.stream {
        v["stream"] = json!(true);
    }
    for m in &r.muts {
        let obj = v.as_object_mut().expect("the body is an object until Nest");
        match m {
            JMut::Field { name, val } => {
                obj.insert(FIELDS[name.index(FIELDS.len())].into(), val.clone());
            }
            JMut::Remove(i) => {
                // The token budget stays: without it the engine would
                // generate up to the context length.
                let keys: Vec<String> = obj
                    .keys()
                    .filter(|k| !k.starts_with("max_"))
                    .cloned()
                    .collect();
                if !keys.is_empty() {
                    obj.remove(&keys[i.index(keys.len())]);
                }
            }
            JMut::Unknown(k, val) => {
                if !k.starts_with("max_") {
                    obj.insert(k.clone(), val.clone());
                }
            }
            JMut::MaxTokens { completion, val } => {
                let k = if *completion {
                    "max_completion_tokens"
                } else {
                    "max_tokens"
                };
                obj.insert(k.into(), val.clone());
            }
            JMut::Inner { at, key, val } => {
                let target = obj.get_mut("messages");
                if let Some(Value::Array(items)) = target {
                    if !items.is_empty() {
                        let n = items.len();
                        let keys = ["role", "content", "name", "tool_calls"];
                        if let Value::Object(m) = &mut items[at.index(n)] {
                            m.insert(keys[key.index(keys.len())].into(), val.clone());
                        } else {
                            items[at.index(n)] = val.clone();
                        }
                    }
                } else if let Some(p) = obj.get_mut("prompt") {
                    *p = val.clone();
                }
            }
            JMut::AddMessage { role, content } => {
                if let Some(Value::Array(items)) = obj.get_mut("messages") {
                    items.push(json!({"role": ROLES[role.index(ROLES.len())], "content": content}));
                }
            }
            JMut::Nest(depth) => {
                // Deep nesting inside a field the parser has to descend.
                let mut x = json!(1);
                for _ in 0..*depth {
                    x = json!([x]);
                }
                obj.insert("stop".into(), x);
            }
        }
    }
    v
}

fn body_bytes(r: &Req, model_id: &str) -> Vec<u8> {
    let mut b = serde_json::to_vec(&body_json(r, model_id)).expect("serializing");
    match &r.raw {
        Raw::None => {}
        Raw::Truncate(i) => b.truncate(i.index(b.len().max(1))),
        Raw::InvalidUtf8(i) => {
            let p = i.index(b.len() + 1);
            b.splice(p..p, [0xff, 0xc0, 0x80]);
        }
        Raw::Replace(x) => b = x.clone(),
        Raw::Huge => b = vec![b' '; 5 << 20],
    }
    b
}

/// Statuses a request may get. 500 is not among them: an internal error
/// on client input is a bug.
const PLAUSIBLE: &[u16] = &[200, 400, 401, 404, 405, 408, 413, 415, 422, 429, 503];

/// Statuses whose bodies must be OpenAI-shaped errors. The router's own
/// answers for other statuses (405 from method routing, 413/415 from
/// extractors) come from layers that may answer in plain text.
const SHAPED: &[u16] = &[400, 401, 404, 429];

pub fn check(t: &Target, r: &Req) -> Result<(), TestCaseError> {
    let method = Method::from_bytes(METHODS[r.method].as_bytes()).expect("method");
    let path = PATHS[r.path];
    let mut b = Request::builder().method(method.clone()).uri(path);
    if let Some(i) = &r.ctype {
        let c = CONTENT_TYPES[i.index(CONTENT_TYPES.len())];
        b = b.header("content-type", HeaderValue::from_static(c));
    }
    let auth = match &r.auth {
        Some(i) => Some(AUTHS[i.index(AUTHS.len())]),
        None if r.keyed => Some("Bearer fuzz-key"),
        None => None,
    };
    if let Some(a) = auth {
        b = b.header("authorization", HeaderValue::from_static(a));
    }
    let body = body_bytes(r, &t.model_id);
    let req = b.body(Body::from(body)).expect("request");
    let app = if r.keyed {
        t.keyed.clone()
    } else {
        t.open.clone()
    };
    let out = t.rt.block_on(async move {
        tokio::time::timeout(MAX_REQUEST, async move {
            let resp = app.oneshot(req).await.expect("infallible");
            let status = resp.status();
            let ctype = resp
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let bytes = axum::body::to_bytes(resp.into_body(), 64 << 20).await;
            (status, ctype, bytes)
        })
        .await
    });
    let (status, ctype, bytes) = match out {
        Ok(x) => x,
        Err(_) => {
            return Err(TestCaseError::fail(format!(
                "no full response within {MAX_REQUEST:?}"
            )))
        }
    };
    let bytes = bytes.map_err(|e| TestCaseError::fail(format!("reading the body: {e}")))?;
    let text = String::from_utf8_lossy(&bytes);
    let code = status.as_u16();
    prop_assert!(PLAUSIBLE.contains(&code), "status {status}: {text}");
    // HEAD answers carry headers only.
    if method == Method::HEAD {
        return Ok(());
    }
    if status.is_client_error() || status.is_server_error() {
        if SHAPED.contains(&code) {
            let v: Value = serde_json::from_slice(&bytes).map_err(|e| {
                TestCaseError::fail(format!("{status} body is not JSON ({e}): {text}"))
            })?;
            let e = &v["error"];
            prop_assert!(
                e["message"].as_str().is_some_and(|m| !m.is_empty()),
                "{status}: {text}"
            );
            prop_assert!(e["type"].is_string(), "{status}: {text}");
            prop_assert!(
                e.get("param").is_some() && e.get("code").is_some(),
                "{status}: {text}"
            );
        }
    } else if status == StatusCode::OK
        && method == Method::POST
        && path.starts_with("/v1/")
        && path.ends_with("completions")
    {
        if ctype.starts_with("text/event-stream") {
            prop_assert!(
                text.trim_end().ends_with("data: [DONE]"),
                "stream without [DONE]: {text}"
            );
        } else {
            let v: Value = serde_json::from_slice(&bytes)
                .map_err(|e| TestCaseError::fail(format!("200 body is not JSON ({e}): {text}")))?;
            prop_assert!(
                v["choices"].as_array().is_some_and(|c| !c.is_empty()),
                "{text}"
            );
        }
    }
    Ok(())
}
