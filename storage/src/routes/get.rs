//! `GET /<path>`: stream a file. Needs a DOWNLOAD macaroon or a Basic user within their paths.

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use axum::response::Response;
use tokio_util::io::ReaderStream;

use super::AppState;
use crate::auth;
use crate::error::HttpError;
use crate::macaroons::Activity;
use crate::paths::NsPath;

#[tracing::instrument(name = "storage.get", skip_all, fields(path = req.uri().path(), principal = tracing::field::Empty))]
pub(super) async fn handle(
    state: &AppState,
    client: std::net::SocketAddr,
    req: Request<Body>,
) -> Result<Response, HttpError> {
    let path = NsPath::from_uri_path(req.uri().path())?;
    let cred = auth::credential(req.headers(), req.uri().query())?;
    let who = auth::authorize(&state.users, &state.key, cred.as_ref(), &path, &[Activity::Download], client.ip())?;
    tracing::Span::current().record("principal", who.principal.billing_subject());
    if path.is_dir() {
        return Err(HttpError::NotFound(format!("{} is a directory; listing is not supported", path.as_str())));
    }
    let (file, len) = crate::fs::open_read(&state.data_dir, &path).await?;
    let body = if req.method() == axum::http::Method::HEAD {
        Body::empty()
    } else {
        Body::from_stream(ReaderStream::new(file))
    };
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, len)
        .body(body)
        .map_err(|e| HttpError::Internal(format!("build response: {e}")))
}
