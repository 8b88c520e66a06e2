//! The HTTP surface: `GET /healthz`, and `GET`/`HEAD`, `PUT`, `DELETE`, `POST` (macaroon
//! request) and `PROPFIND` (a directory's listing) on any other path. One file per operation.

mod delete;
mod get;
mod macaroon_request;
mod propfind;
mod put;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderValue, Method, Request, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::auth::Users;
use crate::billing::Billing;
use crate::error::HttpError;
use crate::macaroons::RootKey;

/// What every handler shares; immutable after start.
#[derive(Debug)]
pub struct AppState {
    /// Canonical data directory.
    pub data_dir: PathBuf,
    /// Macaroon root key.
    pub key: RootKey,
    /// Basic-auth users.
    pub users: Users,
    /// Billing messages (and NATS).
    pub billing: Billing,
    /// Base URL for macaroon responses, without trailing slash.
    pub public_url: String,
    /// Macaroon location and billing cell name.
    pub cell_name: String,
    /// Whether uploads are fsynced before they are answered.
    pub durability: htfaas_functions::store::Durability,
}

/// The router; serve it with each request's `ConnectInfo<SocketAddr>` (as
/// `htfaas_functions::serve::serve` does).
pub fn router(state: Arc<AppState>) -> Router {
    Router::new().route("/healthz", get(|| async { "ok\n" })).fallback(dispatch).with_state(state)
}

async fn dispatch(
    State(state): State<Arc<AppState>>,
    ConnectInfo(client): ConnectInfo<SocketAddr>,
    req: Request<Body>,
) -> Response {
    use tracing::Instrument as _;
    // A job's requests carry its `traceparent`: the trace id joins every log line
    // of the request. A value that does not parse is ignored.
    let trace_id = req
        .headers()
        .get(htfaas_functions::trace::HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| htfaas_functions::trace::TraceParent::parse(v).ok())
        .map(|t| tracing::field::display(t.trace_id_hex()));
    let span = tracing::info_span!("storage.request", trace_id, method = %req.method(), path = %req.uri().path());
    handle(state, client, req).instrument(span).await
}

/// The request's path and who asks, allowed `activity` there; the principal is recorded on the
/// operation's span (its `principal` field).
fn authorized(
    state: &AppState,
    client: SocketAddr,
    req: &Request<Body>,
    activity: crate::macaroons::Activity,
) -> Result<(crate::paths::NsPath, crate::auth::Authorized), HttpError> {
    let path = crate::paths::NsPath::from_uri_path(req.uri().path())?;
    let cred = crate::auth::credential(req.headers(), req.uri().query())?;
    let who = crate::auth::authorize(&state.users, &state.key, cred.as_ref(), &path, &[activity], client.ip())?;
    tracing::Span::current().record("principal", who.principal.billing_subject());
    Ok((path, who))
}

async fn handle(state: Arc<AppState>, client: SocketAddr, req: Request<Body>) -> Response {
    let result = match *req.method() {
        Method::GET | Method::HEAD => get::handle(&state, client, req).await,
        Method::PUT => put::handle(&state, client, req).await,
        Method::DELETE => delete::handle(&state, client, req).await,
        Method::POST => macaroon_request::handle(&state, req).await,
        ref m if m.as_str() == "PROPFIND" => propfind::handle(&state, client, req).await,
        _ => Err(HttpError::MethodNotAllowed(format!("method {} is not supported", req.method()))),
    };
    match result {
        Ok(r) => r,
        Err(e @ HttpError::MethodNotAllowed(_)) => {
            let mut r = e.into_response();
            r.headers_mut().insert(header::ALLOW, HeaderValue::from_static("GET, HEAD, PUT, DELETE, POST, PROPFIND"));
            r
        }
        Err(e) => e.into_response(),
    }
}
