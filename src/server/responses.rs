//! OpenAI's Responses API, its core: `POST /v1/responses` (streamed or not),
//! `GET` and `DELETE /v1/responses/{id}`.
//!
//! A request runs the chat-completions path: its input items become chat
//! turns ([`input`]), `instructions` a system turn placed first, the turns
//! of `previous_response_id` ([`store`]) come before the new ones; then the
//! chat template (with tools), [`api::prepare`], the engine and [`drive`],
//! as on `/v1/chat/completions`. The text becomes output items
//! ([`output`]): a `message`, and a `function_call` per call parsed in the
//! template's tool format. One choice (`n` does not exist here).

mod input;
mod output;
pub mod store;

pub use store::ResponseStore;

use super::api::{self, probe, ChatRequest, Common, Endpoint, Prepared, Probe};
use super::drive::{drive, Ended, Out};
use super::error::ApiError;
use super::handlers::{admission, chat_prompt_ids, check_model, unix_now};
use super::structured;
use super::tools::{self, ToolFormat};
use super::AppState;
use crate::serve::{RequestHandle, SubmitError};
use crate::tokenizer::CHATML_TEMPLATE;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

/// OpenAI's bounds on `metadata`.
const MAX_METADATA_PAIRS: usize = 16;
const MAX_METADATA_KEY: usize = 64;
const MAX_METADATA_VALUE: usize = 512;

#[derive(Deserialize, Debug, Clone)]
struct CreateRequest {
    model: String,
    input: Value,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    max_output_tokens: Option<u64>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    /// Extension (as on chat): reproducible sampling.
    #[serde(default)]
    seed: Option<i64>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    previous_response_id: Option<String>,
    #[serde(default)]
    store: Option<bool>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    parallel_tool_calls: Option<bool>,
    #[serde(default)]
    text: Option<Value>,
}

/// Every field [`CreateRequest`] reads, with its type. Invariant: this
/// table and the struct list the same fields.
const FIELDS: &[(&str, Probe)] = &[
    ("model", probe::<String>),
    ("input", probe::<Value>),
    ("instructions", probe::<Option<String>>),
    ("tools", probe::<Option<Vec<Value>>>),
    ("tool_choice", probe::<Option<Value>>),
    ("max_output_tokens", probe::<Option<u64>>),
    ("temperature", probe::<Option<f32>>),
    ("top_p", probe::<Option<f32>>),
    ("seed", probe::<Option<i64>>),
    ("stream", probe::<Option<bool>>),
    ("previous_response_id", probe::<Option<String>>),
    ("store", probe::<Option<bool>>),
    ("metadata", probe::<Option<BTreeMap<String, String>>>),
    ("parallel_tool_calls", probe::<Option<bool>>),
    ("text", probe::<Option<Value>>),
];

/// Accepted and ignored: bookkeeping that changes no output (`user`,
/// `safety_identifier`, `service_tier`), a caching hint (the prefix cache
/// needs none), and `stream_options` (its only option asks for padding
/// against length side channels, which this server never adds).
const IGNORED: &[&str] = &[
    "user",
    "safety_identifier",
    "service_tier",
    "prompt_cache_key",
    "stream_options",
];

/// Parameters of OpenAI's that this server does not implement: a 400
/// naming the field unless the value asks for the default. Returns whether
/// `key` is one.
fn check_unsupported(key: &str, v: &Value) -> Result<bool, ApiError> {
    let ok = match key {
        "reasoning" => match v {
            Value::Null => true,
            Value::Object(o) => o.iter().all(|(k, v)| {
                matches!(k.as_str(), "effort" | "summary" | "generate_summary") && v.is_null()
            }),
            _ => false,
        },
        "include" => v.is_null() || v.as_array().is_some_and(Vec::is_empty),
        "truncation" => v.is_null() || v == "disabled",
        "background" => v.is_null() || v == false,
        "top_logprobs" => v.is_null() || v == 0,
        "max_tool_calls" | "conversation" | "prompt" | "context_management" => v.is_null(),
        _ => return Ok(false),
    };
    if ok {
        Ok(true)
    } else {
        Err(ApiError::unsupported(key, &format!(" (got {v})")))
    }
}

/// Parses a body: a type error, an unknown field or an unsupported value
/// is a 400 naming the field.
fn parse(body: &[u8]) -> Result<CreateRequest, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON: {e}"), None))?;
    let Value::Object(obj) = &v else {
        return Err(ApiError::bad_request(
            "invalid request body: expected a JSON object",
            None,
        ));
    };
    for (key, val) in obj {
        if let Some((name, check)) = FIELDS.iter().find(|(n, _)| n == key) {
            check(val).map_err(|e| {
                ApiError::bad_request(format!("invalid type for `{name}`: {e}"), Some(name))
            })?;
        } else if !(IGNORED.contains(&key.as_str()) || check_unsupported(key, val)?) {
            return Err(ApiError::bad_request(
                format!("Unrecognized request argument supplied: {key}"),
                Some(key),
            ));
        }
    }
    for required in ["model", "input"] {
        if !obj.contains_key(required) {
            return Err(ApiError::bad_request(
                format!("Missing required parameter: '{required}'."),
                Some(required),
            ));
        }
    }
    serde_json::from_value(v)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}"), None))
}

fn check_metadata(m: &BTreeMap<String, String>) -> Result<(), ApiError> {
    let bad = |msg: String| Err(ApiError::bad_request(msg, Some("metadata")));
    if m.len() > MAX_METADATA_PAIRS {
        return bad(format!(
            "at most {MAX_METADATA_PAIRS} metadata pairs, got {}",
            m.len()
        ));
    }
    for (k, v) in m {
        if k.chars().count() > MAX_METADATA_KEY {
            return bad(format!(
                "metadata keys have at most {MAX_METADATA_KEY} characters"
            ));
        }
        if v.chars().count() > MAX_METADATA_VALUE {
            return bad(format!(
                "metadata values have at most {MAX_METADATA_VALUE} characters ({k})"
            ));
        }
    }
    Ok(())
}

/// The chat path names its own fields; here they are others.
fn rename_param(mut e: ApiError) -> ApiError {
    e.param = e.param.map(|p| match p.as_str() {
        "messages" | "prompt" => "input".to_string(),
        "max_tokens" => "max_output_tokens".to_string(),
        "response_format" => "text.format".to_string(),
        _ => p,
    });
    e
}

/// 404 for an id no stored response has.
fn unknown_response(id: &str, param: Option<&str>) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        code: Some(if param.is_some() {
            "previous_response_not_found"
        } else {
            "response_not_found"
        }),
        ..ApiError::bad_request(format!("Response with id '{id}' not found."), param)
    }
}

/// A request turned into everything its response needs.
struct Job {
    id: String,
    created_at: u64,
    req: CreateRequest,
    /// The chat turns given (history, then input; instructions left out),
    /// stored with the output turn for a follow-up.
    turns: Vec<Value>,
    tools: Option<ToolFormat>,
    prompt_tokens: usize,
}

impl Job {
    /// The response object (OpenAI's field set, echoing the request).
    fn response(&self, model: &str, status: &str, output: &[Value], usage: Value) -> Value {
        let r = &self.req;
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        let mut v = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": false,
            "error": null,
            "incomplete_details": incomplete,
            "instructions": r.instructions,
            "max_output_tokens": r.max_output_tokens,
            "max_tool_calls": null,
            "model": model,
            "output": output,
            "parallel_tool_calls": r.parallel_tool_calls.unwrap_or(true),
            "previous_response_id": r.previous_response_id,
            "reasoning": {"effort": null, "summary": null},
            "store": r.store.unwrap_or(true),
            "temperature": r.temperature.unwrap_or(1.0),
            "text": {"format": {"type": "text"}},
            "tool_choice": r.tool_choice.clone().filter(|c| !c.is_null()).unwrap_or(json!("auto")),
            "tools": r.tools.clone().unwrap_or_default(),
            "top_logprobs": 0,
            "top_p": r.top_p.unwrap_or(1.0),
            "truncation": "disabled",
            "usage": usage,
            "user": null,
            "metadata": r.metadata.clone().unwrap_or_default(),
        });
        if status == "completed" {
            v["completed_at"] = json!(unix_now());
        }
        v
    }
}

pub async fn create(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    match create_inner(state, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn create_inner(state: Arc<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let req = parse(&body)?;
    check_model(&state, &req.model)?;
    if let Some(m) = &req.metadata {
        check_metadata(m)?;
    }
    let text = req.text.clone().unwrap_or(Value::Null);
    input::check_text(&text)?;
    let response_format = input::response_format(&text)?;
    let mut turns = match &req.previous_response_id {
        Some(prev) => match state.responses.get(prev) {
            Some(s) => s.conversation.clone(),
            None => return Err(unknown_response(prev, Some("previous_response_id"))),
        },
        None => Vec::new(),
    };
    turns.extend(input::input_messages(&req.input)?);
    let mut messages = Vec::with_capacity(turns.len() + 1);
    if let Some(i) = &req.instructions {
        messages.push(json!({"role": "system", "content": i}));
    }
    messages.extend(turns.iter().cloned());
    // The chat request these turns and tools make: the chat path's checks
    // and conversions (tool_choice semantics, call arguments parsed for
    // the template) apply as they are.
    let mut chat = json!({"model": req.model, "messages": messages});
    if let Some(t) = &req.tools {
        chat["tools"] = Value::Array(input::chat_tools(t)?);
    }
    if let Some(c) = &req.tool_choice {
        chat["tool_choice"] = input::chat_tool_choice(c)?;
    }
    if let Some(f) = response_format {
        chat["response_format"] = f;
    }
    let chat: ChatRequest = serde_json::from_value(chat)
        .map_err(|e| ApiError::bad_request(format!("invalid input: {e}"), Some("input")))?;
    let msgs = chat.messages().map_err(rename_param)?;
    let tool_defs = chat.tools()?;
    let tool_defs_all = tool_defs.clone();
    let bytes = msgs.iter().map(|m| m.content.len()).sum();
    api::precheck_bytes(
        bytes,
        state.bytes_per_token,
        &state.engine.limits,
        Endpoint::Chat,
    )
    .map_err(rename_param)?;
    let template = state.tok.chat_template().unwrap_or(CHATML_TEMPLATE);
    let (msgs, tool_defs, tool_format) = tools::prompt_side(template, msgs, tool_defs);
    let grammar = structured::chat_grammar(&state, &chat, tool_defs_all.as_ref(), tool_format)
        .await
        .map_err(rename_param)?;
    let st = state.clone();
    let prompt = tokio::task::spawn_blocking(move || {
        chat_prompt_ids(&st.tok, &msgs, tool_defs.as_ref(), st.specials_in_content)
    })
    .await
    .map_err(|e| ApiError::internal(format!("chat prompt task: {e}")))?
    .map_err(rename_param)?;
    let common = Common {
        model: req.model.clone(),
        stream: req.stream,
        temperature: req.temperature,
        top_p: req.top_p,
        seed: req.seed,
        ..Common::default()
    };
    let mut prep = api::prepare(
        &common,
        prompt,
        req.max_output_tokens,
        None,
        None,
        &admission(&state, Endpoint::Chat),
    )
    .map_err(rename_param)?;
    prep.gen.grammar = grammar;
    let handle = submit(&state, &prep)?;
    let n = state.next_id.fetch_add(1, Ordering::Relaxed);
    let job = Job {
        // The counter makes ids unique in this process; the random part
        // makes them unguessable.
        id: format!("resp_{n:x}{}", output::random_hex()),
        created_at: unix_now(),
        req,
        turns,
        tools: tool_format,
        prompt_tokens: prep.prompt_tokens,
    };
    if prep.stream {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(stream_task(state, job, prep, handle, tx));
        return Ok(Sse::new(UnboundedReceiverStream::new(rx))
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    let mut builder = output::Builder::new(job.tools);
    let end = generate(&state, handle, &prep, &mut builder, &mut |_| true).await?;
    let Some(sum) = end else {
        return Err(ApiError::internal("generation ended early"));
    };
    Ok(Json(finish(&state, &job, &builder, &sum)).into_response())
}

fn submit(state: &AppState, prep: &Prepared) -> Result<RequestHandle, ApiError> {
    if state.shutting_down.load(Ordering::Acquire) {
        return Err(ApiError::unavailable("the server is shutting down"));
    }
    state.engine.submit(prep.gen.clone()).map_err(|e| match e {
        SubmitError::QueueFull(q) => ApiError::queue_full(q, 1),
        SubmitError::Invalid(m) => ApiError::bad_request(m, None),
        SubmitError::Stopped => ApiError::unavailable("the engine has stopped"),
    })
}

/// Runs the request into `builder`; `emit` gets each event (false: the
/// client is gone). None when it went.
async fn generate(
    state: &AppState,
    handle: RequestHandle,
    prep: &Prepared,
    builder: &mut output::Builder,
    emit: &mut (dyn FnMut(output::Ev) -> bool + Send),
) -> Result<Option<super::drive::ChoiceSummary>, ApiError> {
    let mut sink = |o: Out| -> bool {
        let events = match o {
            Out::Delta { text, .. } => builder.push(&text),
            Out::Finish { reason, .. } => builder.finish(reason == "length"),
        };
        events.into_iter().all(&mut *emit)
    };
    match drive(&state.tok, handle, 1, &prep.stops, &mut sink).await? {
        Ended::Done(mut sums) => Ok(sums.pop()),
        Ended::Gone => Ok(None),
    }
}

/// The finished response object, stored unless `store` is false.
fn finish(
    state: &AppState,
    job: &Job,
    builder: &output::Builder,
    sum: &super::drive::ChoiceSummary,
) -> Value {
    let status = if sum.finish_reason == "length" {
        "incomplete"
    } else {
        "completed"
    };
    let usage = json!({
        "input_tokens": job.prompt_tokens,
        // No explicit cache writes: prompt_cache_options is not served.
        "input_tokens_details": {"cached_tokens": sum.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": sum.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": job.prompt_tokens + sum.completion_tokens,
    });
    let items = builder.items();
    let response = job.response(&state.model_id, status, items, usage);
    if job.req.store != Some(false) {
        let mut conversation = job.turns.clone();
        // The output items are valid input items: the same conversion
        // gives the assistant turn a follow-up continues from.
        match input::input_messages(&Value::Array(items.to_vec())) {
            Ok(out) => conversation.extend(out),
            Err(e) => tracing::warn!("response {} not stored: {}", job.id, e.message),
        }
        if !state
            .responses
            .insert(job.id.clone(), response.clone(), conversation)
        {
            tracing::warn!(
                "response {} not stored: over the store's {} bytes alone",
                job.id,
                store::MAX_BYTES
            );
        }
    }
    response
}

/// Numbers and sends the events of one stream (`event:` and `data:` lines,
/// as OpenAI sends them).
struct Emitter {
    tx: mpsc::UnboundedSender<Result<SseEvent, Infallible>>,
    seq: u64,
}

impl Emitter {
    fn send(&mut self, (ty, mut fields): output::Ev) -> bool {
        fields["type"] = json!(ty);
        fields["sequence_number"] = json!(self.seq);
        self.seq += 1;
        self.tx
            .send(Ok(SseEvent::default().event(ty).data(fields.to_string())))
            .is_ok()
    }
}

async fn stream_task(
    state: Arc<AppState>,
    job: Job,
    prep: Prepared,
    handle: RequestHandle,
    tx: mpsc::UnboundedSender<Result<SseEvent, Infallible>>,
) {
    let mut em = Emitter { tx, seq: 0 };
    let start = job.response(&state.model_id, "in_progress", &[], Value::Null);
    for ty in ["response.created", "response.in_progress"] {
        if !em.send((ty, json!({"response": start}))) {
            return;
        }
    }
    let mut builder = output::Builder::new(job.tools);
    let end = generate(&state, handle, &prep, &mut builder, &mut |e| em.send(e)).await;
    match end {
        Ok(Some(sum)) => {
            let response = finish(&state, &job, &builder, &sum);
            let ty = if response["status"] == "incomplete" {
                "response.incomplete"
            } else {
                "response.completed"
            };
            em.send((ty, json!({"response": response})));
        }
        Ok(None) => {}
        Err(e) => {
            em.send((
                "error",
                json!({"code": e.code, "message": e.message, "param": e.param}),
            ));
        }
    }
}

/// `GET /v1/responses/{id}`: a stored response.
pub async fn get(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match state.responses.get(&id) {
        Some(s) => Json(s.response.clone()).into_response(),
        None => unknown_response(&id, None).into_response(),
    }
}

/// `DELETE /v1/responses/{id}`: forgets a stored response.
pub async fn delete(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    if state.responses.remove(&id) {
        Json(json!({"id": id, "object": "response", "deleted": true})).into_response()
    } else {
        unknown_response(&id, None).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(body: Value) -> Option<String> {
        parse(body.to_string().as_bytes())
            .err()
            .and_then(|e| e.param)
    }

    #[test]
    fn fields_are_checked() {
        let ok = json!({"model": "m", "input": "hi", "store": false, "user": "u",
            "metadata": {"a": "b"}, "reasoning": {"effort": null}, "include": [],
            "truncation": "disabled", "background": false, "seed": 3,
            "text": {"format": {"type": "text"}}, "parallel_tool_calls": true});
        let r = parse(ok.to_string().as_bytes()).unwrap();
        assert_eq!((r.seed, r.store), (Some(3), Some(false)));
        for (k, v) in [
            ("foo", json!(1)),
            ("n", json!(2)),
            ("reasoning", json!({"effort": "high"})),
            ("include", json!(["reasoning.encrypted_content"])),
            ("truncation", json!("auto")),
            ("background", json!(true)),
            ("top_logprobs", json!(3)),
            ("temperature", json!("hot")),
            ("metadata", json!({"a": 1})),
            ("instructions", json!(["x"])),
        ] {
            let mut b = ok.clone();
            b[k] = v;
            assert_eq!(param(b).as_deref(), Some(k), "{k}");
        }
        assert_eq!(param(json!({"model": "m"})).as_deref(), Some("input"));
        assert_eq!(param(json!({"input": "x"})).as_deref(), Some("model"));
        let many: BTreeMap<String, String> = (0..17).map(|i| (i.to_string(), "v".into())).collect();
        assert_eq!(
            check_metadata(&many).unwrap_err().param.as_deref(),
            Some("metadata")
        );
    }
}
