//! The OpenAI-compatible HTTP server (axum + tokio) in front of the engine
//! thread of [`crate::serve`].
//!
//! Endpoints: `POST /v1/chat/completions`, `POST /v1/completions`,
//! `POST /v1/responses`, `GET` / `DELETE /v1/responses/{id}`,
//! `GET /v1/models`, `GET /v1/models/{id}`, `POST /tokenize` and
//! `POST /detokenize` (llama-server's), `GET /metrics` (Prometheus text),
//! `GET /health`. With `--cors-origins`, browsers of those origins may call
//! them (preflights answered before the key is checked).
//! With an API key, every endpoint but `/health` needs
//! `Authorization: Bearer <key>`.
//!
//! Hostile clients are bounded: [`conn`] caps open connections and times
//! out slow request heads, [`body`] caps and times the body and turns every
//! error into OpenAI's JSON shape, and tokenization runs on the blocking
//! pool after a byte-length precheck, so /health stays responsive.

pub mod api;
pub mod body;
pub mod conn;
pub mod drive;
pub mod embeddings;
pub mod error;
pub mod handlers;
pub mod responses;
pub mod structured;
pub mod text;
pub mod tokenize;
pub mod tools;

pub use body::BodyLimits;
pub use conn::ConnLimits;

use crate::serve::EngineHandle;
use crate::tokenizer::{SpecialsInContent, Tokenizer};
use anyhow::{Context, Result};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use error::ApiError;
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

/// Shared by every handler.
pub struct AppState {
    pub engine: EngineHandle,
    pub tok: Arc<Tokenizer>,
    /// The id clients must pass as `model`.
    pub model_id: String,
    pub api_key: Option<String>,
    /// Reported as `system_fingerprint` (same fingerprint, same build and
    /// mode: outputs are reproducible given the seed).
    pub fingerprint: String,
    pub created: u64,
    pub next_id: AtomicU64,
    pub shutting_down: AtomicBool,
    /// Bound on UTF-8 bytes per token for the pre-tokenization length
    /// check ([`api::bytes_per_token_bound`]).
    pub bytes_per_token: usize,
    pub body_limits: BodyLimits,
    /// Whether control-token text in message contents becomes control
    /// tokens (`--trust-special-tokens`); text by default.
    pub specials_in_content: SpecialsInContent,
    /// Origins browsers may call from (`--cors-origins`; `*` any); empty:
    /// no CORS headers.
    pub cors_origins: Vec<String>,
    /// Responses kept for `previous_response_id` and
    /// `GET /v1/responses/{id}` (bounded, oldest out: [`responses::store`]).
    pub responses: responses::ResponseStore,
    /// The grammar compiler over the model's vocabulary, built by the
    /// first structured-output request (see [`structured::grammars`]).
    pub grammars: std::sync::OnceLock<Result<Arc<crate::constrain::Grammars>, String>>,
}

impl AppState {
    /// A state with no API key and the default body limits.
    pub fn new(engine: EngineHandle, tok: Arc<Tokenizer>, model_id: String) -> AppState {
        AppState {
            bytes_per_token: api::bytes_per_token_bound(&tok),
            engine,
            tok,
            model_id,
            api_key: None,
            fingerprint: format!("quire-{}", env!("CARGO_PKG_VERSION")),
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            next_id: AtomicU64::new(0),
            shutting_down: AtomicBool::new(false),
            body_limits: BodyLimits::default(),
            specials_in_content: SpecialsInContent::AsText,
            cors_origins: Vec::new(),
            responses: responses::ResponseStore::default(),
            grammars: std::sync::OnceLock::new(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ServerOptions {
    pub host: String,
    pub port: u16,
    pub conn: ConnLimits,
}

/// The router over `state` (exposed for in-process tests).
pub fn router(state: Arc<AppState>) -> Router {
    let protected = Router::new()
        .route("/v1/chat/completions", post(handlers::chat))
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::get).delete(responses::delete),
        )
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(tokenize::model))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/metrics", get(metrics))
        .fallback(not_found);
    let cors = cors_layer(&state.cors_origins);
    // A layer over the whole router (not a route_layer), so that unknown
    // paths and wrong methods need the key too; `auth` lets /health through.
    let app = Router::new()
        .route("/health", get(health))
        .merge(protected)
        // Innermost first: the body is read only for authorized clients;
        // json_errors sees every response, the rejections included.
        .layer(middleware::from_fn_with_state(
            state.clone(),
            body::read_body,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(middleware::from_fn(body::json_errors))
        // read_body enforces the limit (with 413 up front).
        .layer(DefaultBodyLimit::disable())
        .with_state(state);
    // Outermost: a preflight is answered before the key is asked for, and
    // every response (errors too) carries the CORS headers.
    match cors {
        Some(c) => app.layer(c),
        None => app,
    }
}

/// The CORS layer for `origins` (`*`: any origin, without credentials);
/// None when empty. Origins are checked by `parse_cors_origins`.
fn cors_layer(origins: &[String]) -> Option<tower_http::cors::CorsLayer> {
    use axum::http::{HeaderValue, Method};
    use tower_http::cors::{AllowOrigin, CorsLayer};
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(
            origins
                .iter()
                .filter_map(|o| HeaderValue::from_str(o).ok())
                .collect::<Vec<_>>(),
        )
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::DELETE, Method::OPTIONS])
            .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
            .max_age(std::time::Duration::from_secs(600)),
    )
}

/// `--cors-origins`: `*`, or comma-separated origins such as
/// `https://app.example.com` (scheme and host, optional port, no path).
pub fn parse_cors_origins(s: &str) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    for o in s.split(',').map(str::trim).filter(|o| !o.is_empty()) {
        if o != "*" {
            let rest = o
                .strip_prefix("https://")
                .or_else(|| o.strip_prefix("http://"))
                .ok_or_else(|| {
                    anyhow::anyhow!("CORS origin `{o}` must start with http:// or https://")
                })?;
            anyhow::ensure!(
                !rest.is_empty() && !rest.contains('/') && !rest.chars().any(char::is_whitespace),
                "CORS origin `{o}` must be a scheme and host (and port), without a path"
            );
            axum::http::HeaderValue::from_str(o)
                .map_err(|_| anyhow::anyhow!("CORS origin `{o}` is not a valid header value"))?;
        }
        out.push(o.to_string());
    }
    anyhow::ensure!(!out.is_empty(), "--cors-origins is empty");
    Ok(out)
}

/// Checks an API key before the server starts: it must not be empty,
/// whitespace-only, or hold whitespace or control characters at its ends
/// or inside (a header could not carry it intact).
pub fn check_api_key(key: &str) -> anyhow::Result<String> {
    if key.is_empty() {
        anyhow::bail!("the API key is empty: give a key, or leave it unset to serve without one");
    }
    if key.trim().is_empty() {
        anyhow::bail!("the API key is only whitespace");
    }
    if key.chars().any(|c| c.is_whitespace() || c.is_control()) {
        anyhow::bail!("the API key holds whitespace or control characters");
    }
    Ok(key.to_string())
}

/// The token of an `Authorization: Bearer <token>` header; the scheme is
/// case-insensitive (RFC 9110 section 11.1).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

async fn auth(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    req: Request,
    next: Next,
) -> Response {
    let open = req.uri().path() == "/health";
    if let (Some(key), false) = (&state.api_key, open) {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token);
        match given {
            None => {
                return ApiError::unauthorized(
                    "Missing API key: send `Authorization: Bearer <key>`.",
                )
                .into_response()
            }
            Some(g) if !constant_time_eq(g.as_bytes(), key.as_bytes()) => {
                return ApiError::unauthorized("Incorrect API key provided.").into_response()
            }
            Some(_) => {}
        }
    }
    next.run(req).await
}

/// Compares without an early exit on the first differing byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn health() -> impl IntoResponse {
    Json(json!({"status": "ok"}))
}

async fn not_found(uri: Uri) -> Response {
    ApiError::not_found(uri.path()).into_response()
}

async fn models(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    Json(json!({
        "object": "list",
        "data": [{
            "id": state.model_id,
            "object": "model",
            "created": state.created,
            "owned_by": "quire",
            "max_model_len": state.engine.limits.context_length,
        }],
    }))
}

async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.engine.metrics.render(),
    )
}

/// Serves until Ctrl-C or SIGTERM, then stops accepting, lets in-flight
/// requests finish for the shutdown grace, and cancels what is left
/// ([`conn::serve`]). `on_listen` gets the bound address (the port may
/// have been 0).
pub async fn run(
    state: Arc<AppState>,
    opts: ServerOptions,
    on_listen: impl FnOnce(std::net::SocketAddr),
) -> Result<()> {
    let addr = format!("{}:{}", opts.host, opts.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    on_listen(listener.local_addr().context("reading the bound address")?);
    let app = router(state.clone());
    conn::serve(listener, state, app, opts.conn, shutdown_signal())
        .await
        .context("serving HTTP")
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!("cannot listen for Ctrl-C: {e}");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
