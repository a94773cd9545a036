//! The accept loop: HTTP/1.1 connections served by hyper with a header
//! read timeout, a cap on open connections, and graceful shutdown.
//!
//! hyper answers some malformed requests itself, before any router runs,
//! with an empty body: 400 (bad request line or header), 414 (URI longer
//! than [`MAX_HEAD_BYTES`]) and 431 (a head larger than it). Every
//! response the router produces is JSON.

use super::error::ApiError;
use super::AppState;
use anyhow::Result;
use axum::body::Body;
use axum::http::{header, HeaderValue, Request, Response};
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

/// Largest request head (line and headers) hyper reads; beyond it hyper
/// answers 431 (or 414 for a long URI).
pub const MAX_HEAD_BYTES: usize = 64 << 10;

/// Connections over the cap that may be kept to answer 503 at once; beyond
/// this many, an over-cap connection is closed without an answer.
const MAX_REFUSING: usize = 64;

/// Longest an over-cap connection is kept to read its request head.
const REFUSE_HEAD_TIMEOUT: Duration = Duration::from_secs(2);

/// Connection-level settings.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// A request's line and headers must arrive within this long; it also
    /// closes a keep-alive connection idle for this long.
    pub header_read_timeout: Duration,
    /// Most connections open at once; the next gets 503 and is closed.
    pub max_connections: usize,
    /// After shutdown starts, in-flight requests get this long to finish
    /// before they are cancelled.
    pub shutdown_grace: Duration,
}

/// Decrements a connection counter when the connection's task ends.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    /// Takes a slot if fewer than `cap` are taken.
    fn take(count: &Arc<AtomicUsize>, cap: usize) -> Option<Slot> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < cap).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(count.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serves `app` on `listener` until `shutdown` resolves; then stops
/// accepting, marks the server as shutting down (new generation requests
/// get 503), closes idle connections, gives in-flight requests
/// `shutdown_grace` and cancels what is left in the engine.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    app: Router,
    lim: ConnLimits,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(lim.header_read_timeout)
        .max_header_size(MAX_HEAD_BYTES);
    let mut refuser = http1::Builder::new();
    refuser
        .timer(TokioTimer::new())
        .header_read_timeout(lim.header_read_timeout.min(REFUSE_HEAD_TIMEOUT))
        .keep_alive(false);
    let open = Arc::new(AtomicUsize::new(0));
    let refusing = Arc::new(AtomicUsize::new(0));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let stream: TcpStream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of file descriptors and the like: wait for
                    // connections to close rather than spin.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        if let Some(slot) = Slot::take(&open, lim.max_connections) {
            let svc = TowerToHyperService::new(app.clone());
            let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), svc));
            tokio::spawn(async move {
                let _slot = slot;
                if let Err(e) = conn.await {
                    tracing::debug!("connection: {e}");
                }
            });
        } else if let Some(slot) = Slot::take(&refusing, MAX_REFUSING) {
            let cap = lim.max_connections;
            let svc = hyper::service::service_fn(move |_req: Request<Incoming>| async move {
                Ok::<_, std::convert::Infallible>(over_cap(cap))
            });
            let conn = refuser.serve_connection(TokioIo::new(stream), svc);
            tokio::spawn(async move {
                let _slot = slot;
                let _ = conn.await;
            });
        }
        // else: dropped, closed without an answer.
    }
    drop(listener);
    eprintln!(
        "quire serve: shutting down: finishing in-flight requests (at most {} s)",
        lim.shutdown_grace.as_secs()
    );
    state.shutting_down.store(true, Ordering::Release);
    let engine = state.engine.clone();
    let grace = lim.shutdown_grace;
    tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        engine.cancel_all();
    });
    // Connections end once their requests do (the engine cancels the rest
    // after the grace); the slack covers the last responses' writes.
    let slack = lim.header_read_timeout.max(Duration::from_secs(5));
    if tokio::time::timeout(grace + slack, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the shutdown grace; closing");
    }
    Ok(())
}

/// The 503 an over-cap connection gets (then it is closed).
fn over_cap(cap: usize) -> Response<Body> {
    let e = ApiError::too_many_connections(cap);
    let mut r = Response::new(Body::from(e.body().to_string()));
    *r.status_mut() = e.status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}
