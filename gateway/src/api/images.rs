//! Native functions' images: `POST /v1/images` streams an upload into the registry (never
//! whole in memory; bounded by `registry::images::MAX_IMAGE_BYTES` and the owner's quota),
//! `GET /v1/images/{digest}` serves its bytes to EPs (content-addressed like modules; every EP
//! verifies the digest and each tar entry), and a developer lists, shows and deletes its own.
//!
//! Must not know: the JetStream consumer, the firing table, how an image is unpacked or run.

use super::audit::audit_digest;
use super::blocking;
use crate::http_error::HttpError;
use crate::state::Shared;
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use htfaas_functions::proto::{ImageInfo, ImageQuery, ModuleUploaded};
use htfaas_functions::registry::images::ImageUpload;
use htfaas_functions::{Digest, RegistryError};
use std::sync::Arc;

/// Chunks of the body in flight between the request and the file's writer.
const CHUNKS_IN_FLIGHT: usize = 8;

/// `POST /v1/images[?tag=NAME]`: the body is a tar (plain or gzip'd); answers its digest.
pub(super) async fn put_image(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(query): Query<ImageQuery>,
    body: axum::body::Body,
) -> Result<impl IntoResponse, HttpError> {
    use futures_util::StreamExt as _;
    let caller = shared.require_caller(&headers)?;
    let s = shared.clone();
    let upload = blocking(move || s.registry.image_upload()).await?;
    // The file is written on a blocking thread, fed through a bounded channel: a slow disk
    // slows the upload instead of filling memory.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(CHUNKS_IN_FLIGHT);
    let writer = tokio::task::spawn_blocking(move || -> Result<ImageUpload, RegistryError> {
        let mut upload = upload;
        while let Some(chunk) = rx.blocking_recv() {
            upload.write(&chunk)?;
        }
        Ok(upload)
    });
    let mut stream = body.into_data_stream();
    let mut failed = None;
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(c) => {
                if tx.send(c).await.is_err() {
                    break; // the writer stopped: its error is below
                }
            }
            Err(e) => {
                failed = Some(HttpError(StatusCode::BAD_REQUEST, format!("image upload: {e}")));
                break;
            }
        }
    }
    drop(tx);
    let upload = writer
        .await
        .map_err(|e| HttpError(StatusCode::INTERNAL_SERVER_ERROR, format!("image writer: {e}")))?
        .map_err(HttpError::from)?;
    if let Some(e) = failed {
        return Err(e);
    }
    // A developer's upload counts against its owner's quota; an admin's against none.
    let (owner, quota) = ((!caller.is_admin()).then(|| caller.name.clone()), shared.module_quota);
    let size = upload.size();
    let s = shared.clone();
    let tag = query.tag.clone();
    let digest = blocking(move || s.registry.put_image(owner.as_deref(), upload, quota, tag.as_deref())).await?;
    tracing::info!(digest = %digest.short(), size, owner = %caller.name, "image stored");
    super::audit::record_admin(
        &shared,
        &headers,
        "image.upload",
        audit_digest(&digest),
        serde_json::json!({ "size": size, "tag": query.tag }),
    )
    .await;
    Ok((StatusCode::CREATED, Json(ModuleUploaded { digest })))
}

/// `GET /v1/images/{digest}`: the image's bytes.
pub(super) async fn get_image(
    State(shared): State<Arc<Shared>>,
    Path(digest): Path<String>,
) -> Result<Response, HttpError> {
    let digest = parse_digest(&digest)?;
    let s = shared.clone();
    let d = digest.clone();
    let path = blocking(move || s.registry.image_path(&d))
        .await?
        .ok_or_else(|| HttpError(StatusCode::NOT_FOUND, format!("image {digest} not found")))?;
    let file = tokio::fs::File::open(&path)
        .await
        .map_err(|e| HttpError(StatusCode::INTERNAL_SERVER_ERROR, format!("open image: {e}")))?;
    let len = file.metadata().await.map(|m| m.len()).ok();
    let body = axum::body::Body::from_stream(tokio_util::io::ReaderStream::with_capacity(file, 256 * 1024));
    let mut response = ([(axum::http::header::CONTENT_TYPE, "application/x-tar")], body).into_response();
    if let Some(len) = len {
        response.headers_mut().insert(axum::http::header::CONTENT_LENGTH, len.into());
    }
    Ok(response)
}

/// `GET /v1/images`: the caller's images (an admin's: every image), newest first.
pub(super) async fn list_images(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Json<Vec<ImageInfo>>, HttpError> {
    let caller = shared.require_caller(&headers)?;
    let owner = (!caller.is_admin()).then(|| caller.name.clone());
    let s = shared.clone();
    Ok(Json(blocking(move || s.registry.images(owner.as_deref())).await?))
}

/// `GET /v1/images/{digest}/info`: one of the caller's images (an admin: any), with the
/// function versions that name it; `{digest}` may also be one of the caller's tags.
pub(super) async fn show_image(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(digest): Path<String>,
) -> Result<Json<ImageInfo>, HttpError> {
    let caller = shared.require_caller(&headers)?;
    let owner = (!caller.is_admin()).then(|| caller.name.clone());
    let s = shared.clone();
    let shown = digest.clone();
    let info = blocking(move || {
        let digest = match digest.parse::<Digest>() {
            Ok(d) => Some(d),
            Err(_) => s.registry.image_by_tag(owner.as_deref().unwrap_or(""), &digest)?,
        };
        let Some(digest) = digest else { return Ok(None) };
        // A developer sees only an image it uploaded itself (the registry's rule).
        s.registry.image(owner.as_deref(), &digest)
    })
    .await?;
    info.map(Json).ok_or_else(|| HttpError(StatusCode::NOT_FOUND, format!("no image {shown} of yours")))
}

/// `DELETE /v1/images/{digest}`: the caller's upload of it (an admin: everyone's); 409 while
/// a function version names it.
pub(super) async fn delete_image(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(digest): Path<String>,
) -> Result<StatusCode, HttpError> {
    let caller = shared.require_caller(&headers)?;
    let digest = parse_digest(&digest)?;
    let owner = (!caller.is_admin()).then(|| caller.name.clone());
    let s = shared.clone();
    let d = digest.clone();
    if !blocking(move || s.registry.delete_image(owner.as_deref(), &d)).await? {
        return Err(HttpError(StatusCode::NOT_FOUND, format!("no image {digest} of yours")));
    }
    super::audit::record_admin(&shared, &headers, "image.delete", audit_digest(&digest), serde_json::json!({})).await;
    Ok(StatusCode::NO_CONTENT)
}

fn parse_digest(s: &str) -> Result<Digest, HttpError> {
    s.parse().map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("{e}")))
}
