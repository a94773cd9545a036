//! `POST /v1/embeddings`: OpenAI's request and response, over the decoder
//! model's own hidden states (`runner/embed.rs`: mean or last-token
//! pooling, L2-normalized, as llama-server does for a generative model).
//!
//! Body: `{"model", "input": str | [str] | [id] | [[id]],
//! "encoding_format": "float" | "base64" = "float", "user"?, "pooling":
//! "mean" | "last" = "mean" (an extension)}`. `dimensions` is refused
//! (no truncation of a decoder's hidden state is meaningful), as is any
//! other unknown field. Strings are tokenized with the model's special
//! prefix (BOS), as for a prompt. The engine runs the job between two
//! steps with blocks of its KV cache.

use super::error::ApiError;
use super::AppState;
use crate::runner::Pooling;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// Most inputs in one request (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EmbeddingsRequest {
    model: String,
    input: Input,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    user: Option<String>,
    #[serde(default)]
    pooling: Option<String>,
}

/// `input`: one string, strings, one token-id list, or token-id lists.
#[derive(Deserialize)]
#[serde(untagged)]
enum Input {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

fn parse(body: &[u8]) -> Result<EmbeddingsRequest, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON: {e}"), None))?;
    if let Some(obj) = v.as_object() {
        if obj.contains_key("dimensions") {
            return Err(ApiError::bad_request(
                "dimensions is not supported: the embedding is the model's hidden state, of its \
                 own width",
                Some("dimensions"),
            ));
        }
    }
    serde_json::from_value(v)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}"), Some("input")))
}

/// Little-endian f32 bytes in standard base64 (OpenAI's `base64` format).
fn base64_f32(v: &[f32]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let b = [c[0], *c.get(1).unwrap_or(&0), *c.get(2).unwrap_or(&0)];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= c.len() {
                out.push(A[(n >> shift) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

pub async fn embeddings(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    match run(state, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn run(state: Arc<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let req = parse(&body)?;
    if req.model != state.model_id {
        return Err(ApiError::model_not_found(&req.model));
    }
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(o) => {
            return Err(ApiError::bad_request(
                format!("encoding_format must be float or base64, got '{o}'"),
                Some("encoding_format"),
            ))
        }
    };
    let pooling: Pooling = req
        .pooling
        .as_deref()
        .unwrap_or("mean")
        .parse()
        .map_err(|e: String| ApiError::bad_request(e, Some("pooling")))?;
    let n_inputs = match &req.input {
        Input::Text(_) | Input::Ids(_) => 1,
        Input::Texts(t) => t.len(),
        Input::IdLists(l) => l.len(),
    };
    if n_inputs == 0 || n_inputs > MAX_INPUTS {
        return Err(ApiError::bad_request(
            format!("input must hold 1 to {MAX_INPUTS} items, got {n_inputs}"),
            Some("input"),
        ));
    }
    let st = state.clone();
    let inputs = tokio::task::spawn_blocking(move || -> Result<Vec<Vec<u32>>, ApiError> {
        let enc = |t: &str| {
            st.tok
                .encode(t, true, false)
                .map_err(|e| ApiError::bad_request(format!("tokenizing: {e:#}"), Some("input")))
        };
        match req.input {
            Input::Text(t) => Ok(vec![enc(&t)?]),
            Input::Texts(ts) => ts.iter().map(|t| enc(t)).collect(),
            Input::Ids(ids) => Ok(vec![ids]),
            Input::IdLists(l) => Ok(l),
        }
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizer task: {e}")))??;
    let limits = &state.engine.limits;
    let mut total = 0usize;
    for (i, inp) in inputs.iter().enumerate() {
        if inp.is_empty() {
            return Err(ApiError::bad_request(
                format!("input {i} is empty"),
                Some("input"),
            ));
        }
        if inp.len() > limits.context_length {
            return Err(ApiError::bad_request(
                format!(
                    "input {i} has {} tokens, past the model's context length {}",
                    inp.len(),
                    limits.context_length
                ),
                Some("input"),
            ));
        }
        total += inp.len();
    }
    if total > limits.kv_tokens {
        return Err(ApiError::bad_request(
            format!(
                "the inputs hold {total} tokens, more than the KV cache's {}",
                limits.kv_tokens
            ),
            Some("input"),
        ));
    }
    let rx = state
        .engine
        .embed(inputs, pooling)
        .map_err(|e| ApiError::bad_request(format!("{e}"), Some("input")))?;
    let vectors = rx
        .await
        .map_err(|_| ApiError::unavailable("the engine has stopped"))?
        .map_err(|e| ApiError::unavailable(format!("embedding: {e}")))?;
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let e = if base64 {
                Value::String(base64_f32(v))
            } else {
                json!(v)
            };
            json!({ "object": "embedding", "index": i, "embedding": e })
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": state.model_id,
        "usage": { "prompt_tokens": total, "total_tokens": total },
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::base64_f32;

    #[test]
    fn base64_matches_the_standard_alphabet_and_padding() {
        // 1.0f32 = 00 00 80 3f; 2.0 = 00 00 00 40.
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
        assert_eq!(base64_f32(&[1.0, 2.0]), "AACAPwAAAEA=");
        assert_eq!(base64_f32(&[]), "");
    }
}
