//! Request-level guards in front of the handlers: the body is read here,
//! under a size limit and a time limit, and every error response leaves in
//! OpenAI's JSON shape whoever produced it (axum's 405, a rejection's
//! text/plain body...).

use super::error::ApiError;
use super::AppState;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::StreamExt;

/// Per-request limits on the body.
#[derive(Clone, Copy, Debug)]
pub struct BodyLimits {
    /// Largest body accepted, in bytes; a larger one gets 413 (before any
    /// of it is read when Content-Length says so).
    pub max_body_bytes: usize,
    /// The whole body must arrive within this long after the headers, or
    /// the request gets 408 and the connection closes.
    pub body_read_timeout: Duration,
}

impl Default for BodyLimits {
    fn default() -> Self {
        BodyLimits {
            max_body_bytes: 4 << 20,
            body_read_timeout: Duration::from_secs(60),
        }
    }
}

/// Reads the whole body under [`BodyLimits`] and hands the handlers a
/// buffered one. Errors close the connection (`Connection: close`): the
/// rest of the body is unread, the stream cannot carry another request.
pub async fn read_body(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let lim = state.body_limits;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > lim.max_body_bytes as u64) {
        return closing(ApiError::payload_too_large(lim.max_body_bytes, Some(n)));
    }
    let (parts, body) = req.into_parts();
    let mut stream = body.into_data_stream();
    let read = async {
        let mut buf: Vec<u8> = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                ApiError::bad_request(format!("cannot read the request body: {e}"), None)
            })?;
            if buf.len() + chunk.len() > lim.max_body_bytes {
                return Err(ApiError::payload_too_large(lim.max_body_bytes, None));
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(buf)
    };
    match tokio::time::timeout(lim.body_read_timeout, read).await {
        Err(_) => closing(ApiError::with_status(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "The request body did not arrive within {} s (--body-read-timeout).",
                lim.body_read_timeout.as_secs_f64()
            ),
        )),
        Ok(Err(e)) => closing(e),
        Ok(Ok(buf)) => next.run(Request::from_parts(parts, Body::from(buf))).await,
    }
}

fn closing(e: ApiError) -> Response {
    let mut r = e.into_response();
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Longest non-JSON error body quoted in the rewritten message.
const QUOTED_BODY_BYTES: usize = 1024;

/// Rewrites every 4xx/5xx response that is not JSON into OpenAI's error
/// shape, keeping its status and headers (`Allow` on a 405, ...). The
/// handlers' own errors are JSON already and pass untouched.
pub async fn json_errors(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let r = next.run(req).await;
    let status = r.status();
    let is_json = r
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return r;
    }
    let (mut parts, body) = r.into_parts();
    let text = axum::body::to_bytes(body, 64 << 10)
        .await
        .map(|b| {
            let b = &b[..b.len().min(QUOTED_BODY_BYTES)];
            String::from_utf8_lossy(b).trim().to_string()
        })
        .unwrap_or_default();
    let message = if status == StatusCode::METHOD_NOT_ALLOWED {
        format!("Method {method} is not allowed on {path}.")
    } else if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_string()
    } else {
        text
    };
    let fresh = ApiError::with_status(status, message).into_response();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let (_, body) = fresh.into_parts();
    Response::from_parts(parts, body)
}
