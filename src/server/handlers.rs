//! `POST /v1/chat/completions` and `POST /v1/completions`: validation,
//! submission, then a JSON response or an SSE stream ending `data: [DONE]`.

use super::api::{self, Admission, ChatRequest, CompletionRequest, Endpoint, Prepared};
use super::drive::{drive, Ended, Out};
use super::error::ApiError;
use super::structured;
use super::text::LpEntry;
use super::tools::{self, Piece, ToolFormat, ToolStream};
use super::AppState;
use crate::serve::SubmitError;
use crate::tokenizer::content::ChatTurn;
use crate::tokenizer::{SpecialsInContent, Tokenizer, CHATML_TEMPLATE};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

/// OpenAI's JSON cannot carry -inf: clamp as OpenAI does.
fn lp_num(x: f32) -> f32 {
    if x.is_finite() {
        x
    } else {
        -9999.0
    }
}

fn chat_logprobs_json(lps: &[LpEntry]) -> Value {
    let content: Vec<Value> = lps
        .iter()
        .map(|e| {
            json!({
                "token": e.token,
                "logprob": lp_num(e.logprob),
                "bytes": e.bytes,
                "top_logprobs": e.top.iter().map(|(t, b, l)| json!({
                    "token": t, "logprob": lp_num(*l), "bytes": b,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({ "content": content })
}

fn completion_logprobs_json(lps: &[LpEntry]) -> Value {
    let top: Vec<Value> = lps
        .iter()
        .map(|e| {
            let mut m = serde_json::Map::new();
            for (t, _, l) in &e.top {
                m.entry(t.clone()).or_insert(json!(lp_num(*l)));
            }
            Value::Object(m)
        })
        .collect();
    json!({
        "tokens": lps.iter().map(|e| e.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|e| lp_num(e.logprob)).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": lps.iter().map(|e| e.offset).collect::<Vec<_>>(),
    })
}

/// The request's prompt tokens served from the prefix cache: the first
/// choice's (the prompt is counted once; later choices of `n` reuse the
/// first's blocks).
fn cached_of(sums: &[super::drive::ChoiceSummary]) -> usize {
    sums.first().map_or(0, |s| s.cached_tokens)
}

pub(super) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn new_id(state: &AppState, kind: Kind) -> String {
    let n = state.next_id.fetch_add(1, Ordering::Relaxed);
    let prefix = match kind {
        Kind::Chat => "chatcmpl",
        Kind::Completion => "cmpl",
    };
    format!("{prefix}-{:x}{:08x}", n, rand::random::<u32>())
}

pub(super) fn check_model(state: &AppState, model: &str) -> Result<(), ApiError> {
    if model == state.model_id {
        Ok(())
    } else {
        Err(ApiError::model_not_found(model))
    }
}

pub async fn chat(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    match chat_inner(state, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn chat_inner(state: Arc<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let req: ChatRequest = api::parse_request(&body, Endpoint::Chat)?;
    check_model(&state, &req.common.model)?;
    let msgs = req.messages()?;
    let tool_defs = req.tools()?;
    let tool_defs_all = tool_defs.clone();
    let top = api::chat_logprobs(&req)?;
    // The template only adds text: the contents alone already bound the
    // rendered prompt from below.
    let bytes = msgs.iter().map(|m| m.content.len()).sum();
    api::precheck_bytes(
        bytes,
        state.bytes_per_token,
        &state.engine.limits,
        Endpoint::Chat,
    )?;
    let template = state.tok.chat_template().unwrap_or(CHATML_TEMPLATE);
    let (msgs, tool_defs, tool_format) = tools::prompt_side(template, msgs, tool_defs);
    let grammar =
        structured::chat_grammar(&state, &req, tool_defs_all.as_ref(), tool_format).await?;
    // Off the async runtime, in one blocking task: a hostile template may
    // burn its whole budget, and a long prompt tokenizes for a long time.
    let st = state.clone();
    let prompt = tokio::task::spawn_blocking(move || {
        chat_prompt_ids(&st.tok, &msgs, tool_defs.as_ref(), st.specials_in_content)
    })
    .await
    .map_err(|e| ApiError::internal(format!("chat prompt task: {e}")))??;
    let max = req.max_completion_tokens.or(req.common.max_tokens);
    let mut prep = api::prepare(
        &req.common,
        prompt,
        max,
        None,
        top,
        &admission(&state, Endpoint::Chat),
    )?;
    prep.gen.grammar = grammar;
    respond(state, vec![prep], Kind::Chat, tool_format, None).await
}

/// The chat prompt's token ids: the template rendered over `msgs` (and
/// `tools`, its `tools` variable), then tokenized; control-token text in
/// client strings stays text unless the server trusts its clients
/// (`--trust-special-tokens`). Blocking: the one step of the chat path that
/// runs on the blocking pool; whatever turns messages into ids belongs
/// here, whole.
pub(super) fn chat_prompt_ids(
    tok: &Tokenizer,
    msgs: &[ChatTurn],
    tools: Option<&Value>,
    policy: SpecialsInContent,
) -> Result<Vec<u32>, ApiError> {
    let p = tok
        .render_chat_turns(msgs, tools, true, policy)
        .map_err(|e| ApiError::bad_request(format!("chat template: {e:#}"), Some("messages")))?;
    tok.encode_chat(&p)
        .map_err(|e| ApiError::bad_request(format!("cannot tokenize: {e:#}"), Some("messages")))
}

pub(super) fn admission(state: &AppState, endpoint: Endpoint) -> Admission<'_> {
    Admission {
        tok: &state.tok,
        limits: &state.engine.limits,
        max_queue: state.engine.max_queue(),
        endpoint,
    }
}

pub async fn completions(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    match completions_inner(state, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn completions_inner(state: Arc<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let req: CompletionRequest = api::parse_request(&body, Endpoint::Completions)?;
    check_model(&state, &req.common.model)?;
    let top = api::completion_logprobs(&req)?;
    let inputs = api::completion_prompts(&req)?;
    for input in &inputs {
        api::precheck_bytes(
            input.text_bytes(),
            state.bytes_per_token,
            &state.engine.limits,
            Endpoint::Completions,
        )?;
    }
    let adm = admission(&state, Endpoint::Completions);
    let n = req.common.n.unwrap_or(1) as usize;
    // Each choice of each prompt queues as one sequence (`n` alone over
    // the queue is [`api::prepare`]'s error, naming `n`).
    if n <= adm.max_queue && inputs.len() * n > adm.max_queue {
        return Err(ApiError::bad_request(
            format!(
                "{} prompts x n = {n} can never be served: the server queues at most {} sequences (--max-queue)",
                inputs.len(),
                adm.max_queue
            ),
            Some("prompt"),
        ));
    }
    // `echo`: each prompt as the client sent it (token ids decoded).
    let echo = req.echo == Some(true);
    let st = state.clone();
    let (prompts, echoes) = tokio::task::spawn_blocking(move || {
        let mut prompts = Vec::with_capacity(inputs.len());
        let mut echoes = Vec::with_capacity(inputs.len());
        for input in inputs {
            let text = match (&input, echo) {
                (_, false) => String::new(),
                (api::PromptInput::Text(t), true) => t.clone(),
                (api::PromptInput::Tokens(ids), true) => {
                    st.tok.decode(ids, false).map_err(|e| {
                        ApiError::bad_request(
                            format!("cannot decode the prompt: {e:#}"),
                            Some("prompt"),
                        )
                    })?
                }
            };
            prompts.push(api::tokenize_completion(&st.tok, input)?);
            echoes.push(text);
        }
        Ok::<_, ApiError>((prompts, echoes))
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizer task: {e}")))??;
    let grammar = match structured::response_grammar(req.common.response_format.as_ref())? {
        Some(spec) => Some(structured::compile(&state, spec, "response_format").await?),
        None => None,
    };
    let mut preps = Vec::with_capacity(prompts.len());
    for prompt in prompts {
        // OpenAI's legacy default is 16 tokens (fewer when less room is left).
        let mut prep = api::prepare(
            &req.common,
            prompt,
            req.common.max_tokens,
            Some(16),
            top,
            &adm,
        )?;
        prep.gen.grammar = grammar.clone();
        preps.push(prep);
    }
    respond(state, preps, Kind::Completion, None, echo.then_some(echoes)).await
}

/// Submits and answers; `preps`: one request per prompt (several only on
/// /v1/completions), their choices numbered prompt by prompt; `tools`: the
/// format to parse tool calls in (chat with tools only); `echo`: the text
/// each prompt's choices start with (completions' `echo`).
async fn respond(
    state: Arc<AppState>,
    mut preps: Vec<Prepared>,
    kind: Kind,
    tools: Option<ToolFormat>,
    echo: Option<Vec<String>>,
) -> Result<Response, ApiError> {
    if state.shutting_down.load(Ordering::Acquire) {
        return Err(ApiError::unavailable("the server is shutting down"));
    }
    // Every prompt's request shares the fields read below but its own.
    let per = preps[0].gen.n;
    let mut handles = Vec::with_capacity(preps.len());
    for p in &preps {
        // A failure drops the handles so far: their choices are cancelled.
        handles.push(state.engine.submit(p.gen.clone()).map_err(|e| match e {
            SubmitError::QueueFull(q) => ApiError::queue_full(q, 1),
            SubmitError::Invalid(m) => ApiError::bad_request(m, None),
            SubmitError::Stopped => ApiError::unavailable("the engine has stopped"),
        })?);
    }
    let n = per * preps.len();
    let handle = if handles.len() == 1 {
        handles.remove(0)
    } else {
        crate::serve::RequestHandle::merge(handles, per)
    };
    let prompt_tokens = preps.iter().map(|p| p.prompt_tokens).sum();
    let mut prep = preps.swap_remove(0);
    prep.prompt_tokens = prompt_tokens;
    let echo: Vec<String> = match echo {
        Some(e) => (0..n).map(|i| e[i / per].clone()).collect(),
        None => Vec::new(),
    };
    let id = new_id(&state, kind);
    let created = unix_now();
    let logprobs_on = prep.gen.top_logprobs.is_some();
    if prep.stream {
        let (tx, rx) = mpsc::unbounded_channel::<Result<SseEvent, Infallible>>();
        let st = state.clone();
        tokio::spawn(async move {
            stream_task(
                st,
                prep,
                handle,
                n,
                kind,
                tools,
                id,
                created,
                logprobs_on,
                echo,
                tx,
            )
            .await;
        });
        let stream = UnboundedReceiverStream::new(rx);
        return Ok(Sse::new(stream)
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    let mut texts = if echo.is_empty() {
        vec![String::new(); n]
    } else {
        echo
    };
    let mut lps: Vec<Vec<LpEntry>> = vec![Vec::new(); n];
    let ended = drive(&state.tok, handle, n, &prep.stops, &mut |o| {
        if let Out::Delta {
            index,
            text,
            logprobs,
        } = o
        {
            texts[index].push_str(&text);
            lps[index].extend(logprobs);
        }
        true
    })
    .await?;
    let Ended::Done(sums) = ended else {
        return Err(ApiError::internal("generation ended early"));
    };
    let completion_tokens: usize = sums.iter().map(|s| s.completion_tokens).sum();
    let choices: Vec<Value> = (0..n)
        .map(|i| {
            let lp = if logprobs_on {
                match kind {
                    Kind::Chat => chat_logprobs_json(&lps[i]),
                    Kind::Completion => completion_logprobs_json(&lps[i]),
                }
            } else {
                Value::Null
            };
            match kind {
                Kind::Chat => {
                    let (message, reason) = chat_message(tools, &texts[i], sums[i].finish_reason);
                    json!({
                        "index": i,
                        "message": message,
                        "logprobs": lp,
                        "finish_reason": reason,
                    })
                }
                Kind::Completion => json!({
                    "index": i,
                    "text": texts[i],
                    "logprobs": lp,
                    "finish_reason": sums[i].finish_reason,
                }),
            }
        })
        .collect();
    let object = match kind {
        Kind::Chat => "chat.completion",
        Kind::Completion => "text_completion",
    };
    Ok(Json(json!({
        "id": id,
        "object": object,
        "created": created,
        "model": state.model_id,
        "system_fingerprint": state.fingerprint,
        "choices": choices,
        "usage": {
            "prompt_tokens": prep.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prep.prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_of(&sums)},
        },
    }))
    .into_response())
}

/// A chat choice's message and finish reason: with tools, the calls parsed
/// from `text` go to `tool_calls` (content null when nothing else was said)
/// and the reason becomes "tool_calls".
fn chat_message(
    tools: Option<ToolFormat>,
    text: &str,
    reason: &'static str,
) -> (Value, &'static str) {
    let Some(format) = tools else {
        return (json!({"role": "assistant", "content": text}), reason);
    };
    let p = tools::parse(format, text);
    if p.calls.is_empty() {
        return (json!({"role": "assistant", "content": p.content}), reason);
    }
    let content = if p.content.trim().is_empty() {
        Value::Null
    } else {
        json!(p.content)
    };
    let calls: Vec<Value> = p.calls.iter().map(tools::ToolCall::to_json).collect();
    (
        json!({"role": "assistant", "content": content, "tool_calls": calls}),
        tools::finish_reason(reason, p.calls.len()),
    )
}

/// A streamed chat choice's tool-call parser and the calls it sent.
struct ChoiceTools {
    stream: ToolStream,
    calls: usize,
}

#[allow(clippy::too_many_arguments)]
async fn stream_task(
    state: Arc<AppState>,
    prep: Prepared,
    handle: crate::serve::RequestHandle,
    n: usize,
    kind: Kind,
    tools: Option<ToolFormat>,
    id: String,
    created: u64,
    logprobs_on: bool,
    echo: Vec<String>,
    tx: mpsc::UnboundedSender<Result<SseEvent, Infallible>>,
) {
    let object = match kind {
        Kind::Chat => "chat.completion.chunk",
        Kind::Completion => "text_completion",
    };
    let chunk = |choices: Vec<Value>| -> SseEvent {
        SseEvent::default().data(
            json!({
                "id": id,
                "object": object,
                "created": created,
                "model": state.model_id,
                "system_fingerprint": state.fingerprint,
                "choices": choices,
            })
            .to_string(),
        )
    };
    if kind == Kind::Chat {
        for i in 0..n {
            let c = json!({
                "index": i,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": null,
                "finish_reason": null,
            });
            if tx.send(Ok(chunk(vec![c]))).is_err() {
                return;
            }
        }
    }
    // `echo`: each choice's first chunk is its prompt.
    for (i, text) in echo.into_iter().enumerate() {
        let c = json!({"index": i, "text": text, "logprobs": null, "finish_reason": null});
        if tx.send(Ok(chunk(vec![c]))).is_err() {
            return;
        }
    }
    let mut parsers: Vec<ChoiceTools> = match tools {
        Some(f) => (0..n)
            .map(|_| ChoiceTools {
                stream: ToolStream::new(f),
                calls: 0,
            })
            .collect(),
        None => Vec::new(),
    };
    let mut sink = |o: Out| -> bool {
        if let Some(t) = parsers.get_mut(o.index()) {
            return tool_chunks(t, o, logprobs_on)
                .into_iter()
                .all(|c| tx.send(Ok(chunk(vec![c]))).is_ok());
        }
        let c = match o {
            Out::Delta {
                index,
                text,
                logprobs,
            } => {
                let lp = match (logprobs_on, kind) {
                    (false, _) => Value::Null,
                    (true, Kind::Chat) => chat_logprobs_json(&logprobs),
                    (true, Kind::Completion) => completion_logprobs_json(&logprobs),
                };
                match kind {
                    Kind::Chat => json!({
                        "index": index, "delta": {"content": text},
                        "logprobs": lp, "finish_reason": null,
                    }),
                    Kind::Completion => json!({
                        "index": index, "text": text,
                        "logprobs": lp, "finish_reason": null,
                    }),
                }
            }
            Out::Finish { index, reason } => match kind {
                Kind::Chat => json!({
                    "index": index, "delta": {},
                    "logprobs": null, "finish_reason": reason,
                }),
                Kind::Completion => json!({
                    "index": index, "text": "",
                    "logprobs": null, "finish_reason": reason,
                }),
            },
        };
        tx.send(Ok(chunk(vec![c]))).is_ok()
    };
    match drive(&state.tok, handle, n, &prep.stops, &mut sink).await {
        Ok(Ended::Done(sums)) => {
            if prep.include_usage {
                let ct: usize = sums.iter().map(|s| s.completion_tokens).sum();
                let ev = SseEvent::default().data(
                    json!({
                        "id": id, "object": object, "created": created,
                        "model": state.model_id, "system_fingerprint": state.fingerprint,
                        "choices": [],
                        "usage": {
                            "prompt_tokens": prep.prompt_tokens,
                            "completion_tokens": ct,
                            "total_tokens": prep.prompt_tokens + ct,
                            "prompt_tokens_details": {"cached_tokens": cached_of(&sums)},
                        },
                    })
                    .to_string(),
                );
                let _ = tx.send(Ok(ev));
            }
        }
        Ok(Ended::Gone) => return,
        Err(e) => {
            let _ = tx.send(Ok(SseEvent::default().data(e.body().to_string())));
        }
    }
    let _ = tx.send(Ok(SseEvent::default().data("[DONE]")));
}

/// The chunks' choices for one output of a streamed chat choice with
/// tools: content the parser let through (with the output's log-probs),
/// each finished call as a `tool_calls` delta, and at the end whatever the
/// parser held, then the finish reason ("tool_calls" after a call).
fn tool_chunks(t: &mut ChoiceTools, o: Out, logprobs_on: bool) -> Vec<Value> {
    let (index, pieces, mut lps, reason) = match o {
        Out::Delta {
            index,
            text,
            logprobs,
        } => (index, t.stream.push(&text), Some(logprobs), None),
        Out::Finish { index, reason } => (index, t.stream.finish(), None, Some(reason)),
    };
    let lp_json = |lps: Option<Vec<LpEntry>>| match lps {
        Some(l) if logprobs_on && !l.is_empty() => chat_logprobs_json(&l),
        _ => Value::Null,
    };
    let mut out = Vec::new();
    for p in pieces {
        match p {
            Piece::Text(s) => out.push(json!({
                "index": index, "delta": {"content": s},
                "logprobs": lp_json(lps.take()), "finish_reason": null,
            })),
            Piece::Call(c) => {
                out.push(json!({
                    "index": index, "delta": c.delta(t.calls),
                    "logprobs": lp_json(lps.take()), "finish_reason": null,
                }));
                t.calls += 1;
            }
        }
    }
    // Log-probs of tokens whose text is held back still go out now, with
    // an empty content delta.
    if lps.as_ref().is_some_and(|l| logprobs_on && !l.is_empty()) {
        out.push(json!({
            "index": index, "delta": {"content": ""},
            "logprobs": lp_json(lps.take()), "finish_reason": null,
        }));
    }
    if let Some(r) = reason {
        out.push(json!({
            "index": index, "delta": {},
            "logprobs": null, "finish_reason": tools::finish_reason(r, t.calls),
        }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(text: &str) -> Out {
        Out::Delta {
            index: 1,
            text: text.to_string(),
            logprobs: Vec::new(),
        }
    }

    /// A streamed choice with tools: content up to the call, the call as
    /// one `tool_calls` delta with index 0, the reason "tool_calls".
    #[test]
    fn streamed_tool_chunks() {
        let mut t = ChoiceTools {
            stream: ToolStream::new(ToolFormat::Hermes),
            calls: 0,
        };
        let mut chunks = Vec::new();
        for d in [
            "Sure. <to",
            "ol_call>\n{\"name\": \"f\", ",
            "\"arguments\": {\"a\": 1}}\n</tool_call>",
        ] {
            chunks.extend(tool_chunks(&mut t, delta(d), false));
        }
        chunks.extend(tool_chunks(
            &mut t,
            Out::Finish {
                index: 1,
                reason: "stop",
            },
            false,
        ));
        assert_eq!(chunks.len(), 3, "{chunks:?}");
        assert_eq!(chunks[0]["delta"]["content"], "Sure. ");
        let call = &chunks[1]["delta"]["tool_calls"][0];
        assert_eq!(call["index"], 0);
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "f");
        assert_eq!(call["function"]["arguments"], "{\"a\":1}");
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(chunks[2]["finish_reason"], "tool_calls");
        assert!(chunks.iter().all(|c| c["index"] == 1));
        // Non-streamed: the same call, content kept, null when only calls.
        let (m, r) = chat_message(
            Some(ToolFormat::Hermes),
            "<tool_call>{\"name\": \"f\"}</tool_call>",
            "stop",
        );
        assert_eq!(r, "tool_calls");
        assert!(m["content"].is_null());
        assert_eq!(m["tool_calls"][0]["function"]["arguments"], "{}");
        let (m, r) = chat_message(None, "<tool_call>{\"name\": \"f\"}</tool_call>", "stop");
        assert_eq!(
            (m["content"].as_str(), r),
            (Some("<tool_call>{\"name\": \"f\"}</tool_call>"), "stop")
        );
    }
}
