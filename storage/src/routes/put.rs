//! `PUT /<path>`: store a file, then publish its billing `transfer` message.
//!
//! Authorization: a macaroon needs UPLOAD, and UPLOAD **and** DELETE when a file already exists
//! there (dCache's rule), unless a macaroon of the same writer and path scope wrote that file
//! (recorded in the file's [`crate::fs::WRITER_SCOPE_XATTR`]; the writer is the issuer's `id:`
//! caveat, which no holder can add): a function's job may rewrite what a run of that function
//! as the same principal wrote into its output directory (a rerun after a crash, a re-uploaded
//! input), never a file anyone else wrote, even with a macaroon of the same directory. A Basic user needs the path within their `paths` (overwrite
//! allowed).
//! `max-upload:` caveats cap the size (413).
//!
//! The body streams into `.<name>.upload-<uuid>` in the target directory (a body of at most
//! 64 KiB by its `Content-Length` is read whole first, then written, the directories made and
//! the file renamed in one call off the async threads), is fsynced and renamed into place (then the directory is fsynced; with `durability: log` neither is fsynced,
//! so the file survives a crash of this process but not of the machine); parent directories are created. Answer:
//! **201** for a new file, **200** for an overwrite. If NATS is configured, the `transfer`
//! message is published and its PubAck awaited *before* answering; if that fails the file is
//! kept and the answer is 503 (the client may retry the PUT, which then overwrites).
//!
//! Faults:
//! - **NATS down.** The PubAck is awaited at most the JetStream context's 5 s (and
//!   `billing::PUBLISH_TIMEOUT`): an outage shorter than that only delays the answer (201);
//!   past it the answer is 503, "`<path>` was stored, but its storage event could not be
//!   published (…); retry the upload". The message itself stays in the NATS client's buffer and
//!   goes out when the connection is back (JetStream dedupes it by its `Nats-Msg-Id`, the
//!   pnfsid), so the file is announced late, not lost, as long as this process lives; a retried
//!   PUT is a new upload with an event of its own.
//! - **Disk full.** `ENOSPC`, `EDQUOT` or `EFBIG` (a file size limit) while creating a
//!   directory or the temporary file, writing or fsyncing it, or renaming it into place answers
//!   **507** naming the path and the cause ([`crate::error::io_error`]); the temporary file is
//!   removed and nothing is published (the handler returns before billing).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Instant;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt as _;
use tokio::io::AsyncWriteExt as _;

use super::AppState;
use crate::auth;
use crate::billing::Upload;
use crate::error::HttpError;
use crate::macaroons::Activity;
use crate::paths::NsPath;

#[tracing::instrument(name = "storage.put", skip_all,
    fields(path = req.uri().path(), principal = tracing::field::Empty, size = tracing::field::Empty))]
pub(super) async fn handle(state: &AppState, client: SocketAddr, req: Request<Body>) -> Result<Response, HttpError> {
    let started = time::OffsetDateTime::now_utc();
    let path = NsPath::from_uri_path(req.uri().path())?;
    if path.is_dir() {
        return Err(HttpError::BadRequest(format!("PUT needs a file path, not the directory {}/", path.as_str())));
    }
    let cred = auth::credential(req.headers(), req.uri().query())?;
    // Authorize UPLOAD before touching the disk; then DELETE too if this overwrites.
    let mut who = auth::authorize(&state.users, &state.key, cred.as_ref(), &path, &[Activity::Upload], client.ip())?;
    let (existed, scope) = crate::fs::existing(&state.data_dir, &path).await?;
    let own = match &who.writer {
        Some(writer) if existed => scope.is_some_and(|s| s == *writer),
        _ => false,
    };
    if existed && !own {
        who = auth::authorize(
            &state.users,
            &state.key,
            cred.as_ref(),
            &path,
            &[Activity::Upload, Activity::Delete],
            client.ip(),
        )
        .map_err(|e| match e {
            HttpError::Forbidden(why) => HttpError::Forbidden(format!(
                "{} exists and was not written by this macaroon's writer: replacing it needs DELETE ({why})",
                path.as_str()
            )),
            e => e,
        })?;
    }
    tracing::Span::current().record("principal", who.principal.billing_subject());

    let declared =
        req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if let (Some(limit), Some(len)) = (who.max_upload, declared)
        && len > limit
    {
        return Err(too_large(limit));
    }

    let t0 = Instant::now();
    let fsync = state.durability.fsync_files();
    let size = match declared.filter(|len| *len <= SMALL_UPLOAD) {
        // A small body of known length is read whole, then stored in one call off the async
        // threads (each file system step of a streamed upload is a hand-off of its own).
        Some(len) => {
            let limit = usize::try_from(len).unwrap_or(usize::MAX);
            let body = axum::body::to_bytes(req.into_body(), limit)
                .await
                .map_err(|e| HttpError::BadRequest(format!("upload interrupted: {e}")))?;
            let size = body.len() as u64;
            crate::fs::store_whole(&state.data_dir, &path, body, who.writer.clone(), fsync).await?;
            size
        }
        None => stream_upload(state, &path, req.into_body(), who.max_upload, who.writer.clone(), fsync).await?,
    };
    let elapsed = t0.elapsed();
    tracing::Span::current().record("size", size);
    tracing::info!(size, overwrite = existed, "stored");

    if state.billing.enabled() {
        let subject = vec![who.principal.billing_subject(), format!("Origin[{}]", client.ip())];
        let started_ms = i64::try_from(started.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX);
        let upload = Upload { path: path.as_str().to_owned(), size, elapsed, subject, client, started_ms };
        let msg = state.billing.message(&upload, time::OffsetDateTime::now_utc());
        if let Err(e) = state.billing.publish(&msg).await {
            tracing::error!(path = path.as_str(), "file stored but {e}");
            return Err(HttpError::Unavailable(format!(
                "{} was stored, but its storage event could not be published ({e}); retry the upload",
                path.as_str()
            )));
        }
    }
    let status = if existed { StatusCode::OK } else { StatusCode::CREATED };
    Ok(status.into_response())
}

/// Uploads of at most this many bytes (by their `Content-Length`) are read whole and stored in
/// one call ([`crate::fs::store_whole`]).
const SMALL_UPLOAD: u64 = 64 * 1024;

/// Streams `body` into a temporary file beside `path`'s target, records `writer` on it and
/// renames it into place (fsyncing file and directory when `fsync`). Returns the bytes stored.
async fn stream_upload(
    state: &AppState,
    path: &NsPath,
    body: Body,
    limit: Option<u64>,
    writer: Option<String>,
    fsync: bool,
) -> Result<u64, HttpError> {
    let target = crate::fs::target(&state.data_dir, path, true)
        .await?
        .ok_or_else(|| HttpError::Internal("parent directory vanished".into()))?;
    let tmp = target.dir.join(crate::fs::upload_name(&target.name));
    let size = match write_body(&tmp, path.as_str(), body, limit, fsync).await {
        Ok(n) => n,
        Err(e) => {
            let discarded = tmp.clone();
            let _ = tokio::task::spawn_blocking(move || crate::fs::discard_upload(&discarded)).await;
            return Err(e);
        }
    };
    crate::fs::place(tmp, target, path, writer, fsync).await?;
    Ok(size)
}

fn too_large(limit: u64) -> HttpError {
    HttpError::TooLarge(format!("upload exceeds the macaroon's max-upload of {limit} bytes"))
}

/// Streams `body` into a new file at `tmp` (the upload of the namespace path `path`), fsyncs
/// it when `fsync`, and returns the byte count. A full disk, quota or file size limit is a 507
/// ([`crate::error::io_error`]); the caller removes `tmp`.
async fn write_body(tmp: &Path, path: &str, body: Body, limit: Option<u64>, fsync: bool) -> Result<u64, HttpError> {
    let file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(tmp)
        .await
        .map_err(|e| crate::error::io_error("create the upload file", path, &e))?;
    copy_body(file, path, body, limit, fsync).await
}

/// Streams `body` into `file` (see [`write_body`]): the seam the tests drive with a file that
/// refuses every write (`/dev/full`).
async fn copy_body(
    mut file: tokio::fs::File,
    path: &str,
    body: Body,
    limit: Option<u64>,
    fsync: bool,
) -> Result<u64, HttpError> {
    let io = |what: &'static str| move |e: std::io::Error| crate::error::io_error(what, path, &e);
    let mut stream = body.into_data_stream();
    let mut n: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| HttpError::BadRequest(format!("upload interrupted: {e}")))?;
        n += chunk.len() as u64;
        if let Some(limit) = limit
            && n > limit
        {
            return Err(too_large(limit));
        }
        file.write_all(&chunk).await.map_err(io("write the upload file"))?;
    }
    file.flush().await.map_err(io("write the upload file"))?;
    if fsync {
        file.sync_all().await.map_err(io("sync the upload file"))?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writing an upload onto a full disk answers 507 naming the path (`/dev/full`
    /// fails every write with `ENOSPC`, as a full filesystem does); the handler then removes
    /// its temporary file and publishes nothing, since it returns before either.
    #[tokio::test]
    async fn a_full_disk_while_writing_the_body_is_507() {
        let Ok(full) = tokio::fs::OpenOptions::new().write(true).open("/dev/full").await else {
            eprintln!("no /dev/full on this system: skipped");
            return;
        };
        let body = Body::from(vec![7u8; 256 * 1024]);
        let e = copy_body(full, "/data/big.dat", body, None, false).await.expect_err("the disk is full");
        assert_eq!(e.status(), StatusCode::INSUFFICIENT_STORAGE);
        let msg = e.to_string();
        assert!(
            msg.starts_with("insufficient storage: /data/big.dat was not stored (No space left on device"),
            "{msg}"
        );
    }
}
