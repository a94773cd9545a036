//! Errors in OpenAI's JSON shape:
//! `{"error": {"message", "type", "param", "code"}}` with a matching status.
//!
//! Messages are capped at [`MAX_MESSAGE_BYTES`] when the body is built, so
//! an error that quotes hostile input (a template error, a serde message)
//! cannot grow the response without bound.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// Longest `error.message` sent, in bytes; a longer one is cut on a char
/// boundary and ends with a marker saying how much was dropped.
pub const MAX_MESSAGE_BYTES: usize = 2048;

/// `message` cut to [`MAX_MESSAGE_BYTES`] (marker included).
pub fn cap_message(message: &str) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message.to_string();
    }
    let marker = format!(" … [truncated, {} bytes in all]", message.len());
    let mut end = MAX_MESSAGE_BYTES.saturating_sub(marker.len());
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{marker}", &message[..end])
}

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (429).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
            retry_after: None,
        }
    }

    /// 400 `context_length_exceeded`; `param` is the prompt's field
    /// (`messages` on chat, `prompt` on completions).
    pub fn context_length(message: impl Into<String>, param: &str) -> Self {
        ApiError {
            code: Some("context_length_exceeded"),
            ..Self::bad_request(message, Some(param))
        }
    }

    /// 400 for a parameter this server does not implement (yet): better
    /// than a 200 that silently ignores it.
    pub fn unsupported(param: &str, detail: &str) -> Self {
        ApiError {
            code: Some("unsupported_parameter"),
            ..Self::bad_request(
                format!("`{param}` is not supported by this server{detail}"),
                Some(param),
            )
        }
    }

    /// Any status with OpenAI's shape (used to rewrite framework errors).
    pub fn with_status(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind: if status.is_server_error() {
                "server_error"
            } else {
                "invalid_request_error"
            },
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 413: the body is over `limit` bytes.
    pub fn payload_too_large(limit: usize, given: Option<u64>) -> Self {
        let what = match given {
            Some(n) => format!("{n} bytes"),
            None => "more".to_string(),
        };
        ApiError {
            code: Some("payload_too_large"),
            ..Self::with_status(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("The request body is {what}; this server accepts at most {limit} bytes (--max-body-bytes)."),
            )
        }
    }

    pub fn model_not_found(model: &str) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{model}` does not exist"),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
            retry_after: None,
        }
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_api_key"),
            retry_after: None,
        }
    }

    pub fn queue_full(waiting: usize, retry_after: u64) -> Self {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!(
                "The server is overloaded: {waiting} sequences are waiting. Retry after {retry_after} s."
            ),
            kind: "rate_limit_error",
            param: None,
            code: Some("rate_limit_exceeded"),
            retry_after: Some(retry_after),
        }
    }

    pub fn not_found(path: &str) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("Unknown endpoint {path}"),
            kind: "invalid_request_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 503 for a connection over `--max-connections` (built before any
    /// router runs, so it is raw JSON text).
    pub fn too_many_connections(cap: usize) -> Self {
        ApiError {
            code: Some("too_many_connections"),
            ..Self::unavailable(format!(
                "The server holds its maximum of {cap} open connections (--max-connections). Retry later."
            ))
        }
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
            retry_after: Some(1),
        }
    }

    /// The JSON body (also used as the payload of an in-stream error event).
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": cap_message(&self.message),
                "type": self.kind,
                "param": self.param.as_deref().map(cap_message),
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_capped_on_a_char_boundary() {
        for len in [0, 10, MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES + 1, 290_000] {
            let m: String = "é".repeat(len / 2) + &"x".repeat(len % 2);
            let c = cap_message(&m);
            assert!(c.len() <= MAX_MESSAGE_BYTES, "{len}: {}", c.len());
            if m.len() <= MAX_MESSAGE_BYTES {
                assert_eq!(c, m);
            } else {
                assert!(c.ends_with(&format!("[truncated, {} bytes in all]", m.len())));
                assert!(m.starts_with(c.split(" … [truncated").next().unwrap()));
            }
        }
    }
}
