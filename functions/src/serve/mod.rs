//! The one HTTP/1 server loop every htfaas listener runs (storage, gateway, scheduler with or
//! without TLS, the EP's metrics): an axum [`Router`] served over any
//! [`axum::serve::Listener`] with the [`Limits`] that keep slow and greedy clients from holding
//! the process:
//!
//! - **headers**: a client has [`Limits::header_read_timeout_s`] to send a request's head, from
//!   the moment the server waits for it (a new connection, or a kept-alive one after its last
//!   answer); then the connection is closed (hyper's own `header_read_timeout`, which needs a
//!   timer that `axum::serve` does not give it);
//! - **bodies**: a request body that sends nothing for [`Limits::body_idle_timeout_s`] fails
//!   the read with [`BodyIdle`] (a slow but moving upload goes on; size limits stay with each
//!   route: `DefaultBodyLimit`, or the storage's `max-upload`);
//! - **connections**: at most [`Limits::max_connections`] HTTP connections at once; past that,
//!   the listener stops accepting and new connections wait in the kernel's backlog until one
//!   ends. A connection upgraded to a WebSocket leaves the count (its session is authenticated
//!   and bounded by its own protocol).
//!
//! Each request carries its peer's [`ConnectInfo`] (the listener's address type), as
//! `into_make_service_with_connect_info` gives it. Shutdown: stop accepting, let each
//! connection finish its request in flight (hyper's graceful shutdown), return when all are
//! closed.
//!
//! [`serve_tcp`] is the usual entry: a `TcpListener`, plain or with TLS ([`tls`]), with
//! `TCP_NODELAY` on every connection.
//!
//! This module knows nothing of routes, credentials or what a component serves.

pub mod tls;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::{Deserialize, Serialize};
use std::fmt::Debug;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Serves `app` on `listener` with `limits` until `shutdown`, with TLS when `tls` is given
/// (handshakes bounded as [`tls::TlsListener`] says). Every connection gets `TCP_NODELAY`:
/// without it a response split in two writes waits for the peer's delayed ACK (40 ms on Linux).
pub async fn serve_tcp(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    app: Router,
    limits: Limits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt as _;
    match tls {
        None => {
            let listener = listener.tap_io(|tcp| {
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::debug!("failed to set TCP_NODELAY: {e}");
                }
            });
            serve(listener, app, limits, shutdown).await
        }
        // The TLS listener sets TCP_NODELAY itself, before the handshake.
        Some(config) => serve(tls::TlsListener::new(listener, config), app, limits, shutdown).await,
    }
}

/// How long a client may take and how many may be connected; the `http` section of each
/// component's config. Every field has a default, so `{}` (or no section) is the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Seconds a client has to send a request's headers (also how long a kept-alive
    /// connection may stay idle). Default: 30.
    pub header_read_timeout_s: u64,
    /// Seconds a request body may send nothing before its read fails. Default: 60.
    pub body_idle_timeout_s: u64,
    /// Most HTTP connections open at once (WebSockets once upgraded not counted). Default: 1024.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { header_read_timeout_s: 30, body_idle_timeout_s: 60, max_connections: 1024 }
    }
}

/// A [`Limits`] that cannot be served.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LimitsError {
    /// A zero that would refuse or cut every client.
    #[error("http.{0} must be at least 1")]
    Zero(&'static str),
}

impl Limits {
    /// Checks that every limit lets a client through; configs call this at resolve.
    pub fn check(&self) -> Result<(), LimitsError> {
        if self.header_read_timeout_s == 0 {
            return Err(LimitsError::Zero("header_read_timeout_s"));
        }
        if self.body_idle_timeout_s == 0 {
            return Err(LimitsError::Zero("body_idle_timeout_s"));
        }
        if self.max_connections == 0 {
            return Err(LimitsError::Zero("max_connections"));
        }
        Ok(())
    }
}

/// Serves `app` on `listener` under `limits` until `shutdown`, then stops accepting and
/// returns once every connection has finished (module docs). Never fails today; the
/// `io::Result` keeps the shape of `axum::serve`.
pub async fn serve<L>(mut listener: L, app: Router, limits: Limits, shutdown: CancellationToken) -> std::io::Result<()>
where
    L: axum::serve::Listener,
    L::Addr: Clone + Debug + Send + Sync + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let connections = TaskTracker::new();
    let header_timeout = Duration::from_secs(limits.header_read_timeout_s.max(1));
    let body_idle = Duration::from_secs(limits.body_idle_timeout_s.max(1));
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break, // the semaphore is never closed
            },
            () = shutdown.cancelled() => break,
        };
        let (io, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => break,
        };
        let app = app.clone();
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                let mut req = req.map(|b| Body::new(IdleBody::new(b, body_idle)));
                req.extensions_mut().insert(ConnectInfo(peer.clone()));
                let mut app = app.clone();
                // `Router` is always ready (its `poll_ready` is `Ready(Ok)`).
                tower_service::Service::call(&mut app, req)
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(header_timeout);
            let conn = builder.serve_connection(TokioIo::new(io), service).with_upgrades();
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                done = conn.as_mut() => log_end(done),
                () = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    log_end(conn.await);
                }
            }
        });
    }
    drop(listener);
    connections.close();
    connections.wait().await;
    Ok(())
}

fn log_end(done: Result<(), hyper::Error>) {
    if let Err(e) = done {
        tracing::debug!("connection ended: {e}");
    }
}

/// The error of a request body that sent nothing for the body idle timeout.
#[derive(Debug, thiserror::Error)]
#[error("request body sent nothing for {0:?}")]
pub struct BodyIdle(pub Duration);

/// A request body whose every frame must arrive within `idle` of the previous one.
struct IdleBody {
    inner: Incoming,
    idle: Duration,
    /// Armed when a read waits; reset by every frame.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl IdleBody {
    fn new(inner: Incoming, idle: Duration) -> IdleBody {
        IdleBody { inner, idle, timer: None }
    }
}

impl HttpBody for IdleBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.timer = None;
                Poll::Ready(frame.map(|f| f.map_err(axum::BoxError::from)))
            }
            Poll::Pending => {
                let idle = this.idle;
                let timer = this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        this.timer = None;
                        Poll::Ready(Some(Err(Box::new(BodyIdle(idle)))))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::{get, put};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::{TcpListener, TcpStream};

    async fn start(limits: Limits) -> (std::net::SocketAddr, CancellationToken, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let app = Router::new()
            .route("/peer", get(|ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>| async move { peer.to_string() }))
            .route(
                "/upload",
                put(|body: Body| async move {
                    match axum::body::to_bytes(body, 1 << 20).await {
                        Ok(b) => format!("got {}", b.len()),
                        Err(e) => format!(
                            "failed: {}",
                            std::error::Error::source(&e).map_or(e.to_string(), |s| s.to_string())
                        ),
                    }
                }),
            );
        let stop = CancellationToken::new();
        let s = stop.clone();
        let task = tokio::spawn(async move { serve(listener, app, limits, s).await.expect("serve") });
        (addr, stop, task)
    }

    /// Sends `head` and returns everything the server says until it closes.
    async fn exchange(conn: &mut TcpStream, head: &[u8]) -> String {
        conn.write_all(head).await.expect("write");
        let mut out = Vec::new();
        let _ = conn.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn a_partial_header_is_cut_off_and_a_whole_request_is_answered_with_its_peer() {
        let limits = Limits { header_read_timeout_s: 1, ..Limits::default() };
        let (addr, stop, task) = start(limits).await;
        let mut slow = TcpStream::connect(addr).await.expect("connect");
        // Without a header timeout this read never ends.
        let said = exchange(&mut slow, b"GET /peer HTTP/1.1\r\nHost: x\r\n").await;
        assert!(!said.contains("200 OK"), "{said}");
        let mut ok = TcpStream::connect(addr).await.expect("connect");
        let local = ok.local_addr().expect("local");
        let said = exchange(&mut ok, b"GET /peer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
        assert!(said.starts_with("HTTP/1.1 200 OK") && said.ends_with(&local.to_string()), "{said}");
        stop.cancel();
        task.await.expect("join");
    }

    #[tokio::test]
    async fn a_body_that_stalls_fails_its_read() {
        let limits = Limits { body_idle_timeout_s: 1, ..Limits::default() };
        let (addr, stop, task) = start(limits).await;
        let mut conn = TcpStream::connect(addr).await.expect("connect");
        let said = exchange(
            &mut conn,
            b"PUT /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nConnection: close\r\n\r\nabc",
        )
        .await;
        assert!(said.contains("failed: request body sent nothing for 1s"), "{said}");
        stop.cancel();
        task.await.expect("join");
    }

    #[tokio::test]
    async fn past_the_connection_cap_a_client_waits_until_a_connection_ends() {
        let limits = Limits { max_connections: 2, ..Limits::default() };
        let (addr, stop, task) = start(limits).await;
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut c = TcpStream::connect(addr).await.expect("connect");
            c.write_all(b"GET /peer HTTP/1.1\r\n").await.expect("write");
            held.push(c);
        }
        let mut third = TcpStream::connect(addr).await.expect("connect (the kernel's backlog)");
        third.write_all(b"GET /peer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.expect("write");
        // Not served while two connections hold both slots: nothing to read yet.
        let mut byte = [0u8; 1];
        let early = tokio::time::timeout(Duration::from_millis(300), third.read(&mut byte)).await;
        assert!(early.is_err(), "answered past the cap: {early:?}");
        drop(held.pop());
        let mut out = Vec::new();
        third.read_to_end(&mut out).await.expect("read");
        let said = String::from_utf8_lossy(&out);
        assert!(said.starts_with("HTTP/1.1 200 OK"), "{said}");
        drop(held);
        stop.cancel();
        task.await.expect("join");
    }

    #[test]
    fn a_zero_limit_is_refused() {
        let l = Limits { max_connections: 0, ..Limits::default() };
        assert_eq!(l.check().map_err(|e| e.to_string()), Err("http.max_connections must be at least 1".into()));
        let l: Limits = serde_json::from_str("{}").expect("defaults");
        assert_eq!(l, Limits::default());
    }
}
