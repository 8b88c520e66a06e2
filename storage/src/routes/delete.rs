//! `DELETE /<path>`: remove a file, or an empty directory (WebDAV, as dCache's door answers
//! it: a directory with entries is refused with 409, so one request never removes a tree).
//!
//! Authorization: a macaroon with `DELETE` whose path scope holds the path (a job's checkpoint
//! area, a write macaroon that may replace), or a Basic user within their paths. A symlink is
//! removed itself, never followed ([`crate::fs::remove`]); the root is never removed. Answer:
//! **204**; **404** when nothing is there. A removal publishes no billing message: the
//! built-in storage announces new files only, and no trigger fires on a removal.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::error::HttpError;
use crate::macaroons::Activity;

#[tracing::instrument(name = "storage.delete", skip_all, fields(path = req.uri().path(), principal = tracing::field::Empty))]
pub(super) async fn handle(
    state: &AppState,
    client: std::net::SocketAddr,
    req: Request<Body>,
) -> Result<Response, HttpError> {
    let (path, _) = super::authorized(state, client, &req, Activity::Delete)?;
    let removed = crate::fs::remove(&state.data_dir, &path, state.durability.fsync_files()).await?;
    tracing::info!(?removed, "removed");
    Ok(StatusCode::NO_CONTENT.into_response())
}
