//! `GET /<path>`: stream a file. Needs a DOWNLOAD macaroon or a Basic user within their paths.

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use axum::response::Response;
use tokio_util::io::ReaderStream;

use super::AppState;
use crate::error::HttpError;
use crate::macaroons::Activity;

/// Files of at most this many bytes are read whole in the call that opens them and sent from
/// memory; larger ones are streamed.
const SMALL_READ: u64 = 64 * 1024;

#[tracing::instrument(name = "storage.get", skip_all, fields(path = req.uri().path(), principal = tracing::field::Empty))]
pub(super) async fn handle(
    state: &AppState,
    client: std::net::SocketAddr,
    req: Request<Body>,
) -> Result<Response, HttpError> {
    let (path, _) = super::authorized(state, client, &req, Activity::Download)?;
    if path.is_dir() {
        return Err(HttpError::NotFound(format!("{} is a directory; list it with PROPFIND", path.as_str())));
    }
    let (body, len) = match crate::fs::read(&state.data_dir, &path, SMALL_READ).await? {
        crate::fs::Opened::Whole(bytes) => {
            let len = bytes.len() as u64;
            (Body::from(bytes), len)
        }
        crate::fs::Opened::File(file, len) => (Body::from_stream(ReaderStream::new(file)), len),
    };
    let body = if req.method() == axum::http::Method::HEAD { Body::empty() } else { body };
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, len)
        .body(body)
        .map_err(|e| HttpError::Internal(format!("build response: {e}")))
}
