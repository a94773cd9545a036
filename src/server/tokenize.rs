//! llama.cpp's `POST /tokenize` and `POST /detokenize` (tools built on
//! llama-server call them), and `GET /v1/models/{id}`.
//!
//! `/tokenize`: `{"content": str, "add_special": bool = false,
//! "parse_special": bool = true, "with_pieces": bool = false}` ->
//! `{"tokens": [id, ...]}`, or with pieces `{"tokens": [{"id": id,
//! "piece": str | [byte, ...]}, ...]}` (a piece that is not valid UTF-8 on
//! its own comes as its bytes, as llama-server does).
//! `/detokenize`: `{"tokens": [id, ...]}` -> `{"content": str}`; an id
//! outside the vocabulary is a 400 naming it.
//! Both run on the blocking pool (a 4 MiB body takes a while to tokenize)
//! and refuse unknown fields.

use super::error::ApiError;
use super::AppState;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizeRequest {
    content: String,
    #[serde(default)]
    add_special: bool,
    #[serde(default = "yes")]
    parse_special: bool,
    #[serde(default)]
    with_pieces: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DetokenizeRequest {
    tokens: Vec<u32>,
}

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}"), None))
}

/// Runs `f` on the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("tokenizer task: {e}")))?
}

pub async fn tokenize(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let run = async {
        let req: TokenizeRequest = parse(&body)?;
        let st = state.clone();
        blocking(move || {
            let ids = st
                .tok
                .encode(&req.content, req.add_special, req.parse_special)
                .map_err(|e| {
                    ApiError::bad_request(format!("tokenizing: {e:#}"), Some("content"))
                })?;
            if !req.with_pieces {
                return Ok(json!({ "tokens": ids }));
            }
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                let bytes = st
                    .tok
                    .piece_bytes(id, false)
                    .map_err(|e| ApiError::internal(format!("token {id}: {e:#}")))?;
                let piece = match String::from_utf8(bytes) {
                    Ok(s) => Value::from(s),
                    Err(e) => Value::from(e.into_bytes()),
                };
                out.push(json!({ "id": id, "piece": piece }));
            }
            Ok(json!({ "tokens": out }))
        })
        .await
    };
    match run.await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

pub async fn detokenize(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let run = async {
        let req: DetokenizeRequest = parse(&body)?;
        let vocab = state.tok.vocab_size();
        if let Some((i, id)) = req
            .tokens
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= vocab)
        {
            return Err(ApiError::bad_request(
                format!("tokens[{i}] = {id} is outside the vocabulary of {vocab} tokens"),
                Some("tokens"),
            ));
        }
        let st = state.clone();
        blocking(move || {
            let content = st.tok.decode(&req.tokens, false).map_err(|e| {
                ApiError::bad_request(format!("detokenizing: {e:#}"), Some("tokens"))
            })?;
            Ok(json!({ "content": content }))
        })
        .await
    };
    match run.await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /v1/models/{id}`: the served model, or OpenAI's 404.
pub async fn model(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    if id != state.model_id {
        return ApiError::model_not_found(&id).into_response();
    }
    Json(json!({
        "id": state.model_id,
        "object": "model",
        "created": state.created,
        "owned_by": "quire",
        "max_model_len": state.engine.limits.context_length,
    }))
    .into_response()
}
