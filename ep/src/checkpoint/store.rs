//! A checkpoint's two requests of its own with the storage: the `GET` that may find nothing
//! (404: the job starts afresh) and the `DELETE` once the job no longer needs it. Both retry
//! and give up by [`crate::transfer`]'s rules; the `PUT` is its [`crate::transfer::put_file`].
//!
//! Must not know: guests, the archive's format, the job's outcome.

use crate::transfer::{Failed, GaveUp, Retry, Transfer, shown, traced};
use futures_util::StreamExt as _;
use reqwest::header::AUTHORIZATION;
use sha2::{Digest as _, Sha256};
use std::path::Path;
use tokio::io::AsyncWriteExt as _;

/// `GET`s the checkpoint at `from` into the file `dest` (created or truncated), hashed, bounded
/// by `max` bytes (by its `Content-Length`, then as it arrives; over it is a refusal), with
/// retries, each starting the file again. `Ok(None)`: there is none (404). `n` counts the bytes
/// of the current try as they arrive. Returns the sha256 hex of the bytes written.
pub(crate) async fn fetch(
    from: &Transfer<'_>,
    dest: &Path,
    max: u64,
    n: &mut u64,
    retries: &mut u32,
) -> Result<Option<String>, GaveUp> {
    let mut retry = Retry::new(retries);
    loop {
        *n = 0;
        match fetch_once(from, dest, max, n).await {
            Ok(found) => return Ok(found),
            Err(failed) => retry.after(failed).await?,
        }
    }
}

async fn fetch_once(from: &Transfer<'_>, dest: &Path, max: u64, n: &mut u64) -> Result<Option<String>, Failed> {
    let what = format!("GET {}", shown(from.url));
    let too_big = |size: String| {
        Failed::permanent(format!("{what}: a checkpoint of {size} bytes, over its bound of {max} bytes"))
    };
    let resp = traced(from.http.get(from.url), from.traceparent)
        .header(AUTHORIZATION, format!("Bearer {}", from.macaroon))
        .send()
        .await
        .map_err(|e| Failed::request(&what, e))?;
    if resp.status() == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if !resp.status().is_success() {
        return Err(Failed::status(&what, resp).await);
    }
    if let Some(len) = resp.content_length()
        && len > max
    {
        return Err(too_big(len.to_string()));
    }
    let local = |e: std::io::Error| Failed::permanent(format!("write {}: {e}", dest.display()));
    let file = tokio::fs::File::create(dest).await.map_err(local)?;
    let mut file = tokio::io::BufWriter::with_capacity(1 << 20, file);
    let mut body = resp.bytes_stream();
    let mut hash = Sha256::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| Failed::request(&what, e))?;
        let after = *n + chunk.len() as u64;
        if after > max {
            return Err(too_big(format!("at least {after}")));
        }
        file.write_all(&chunk).await.map_err(local)?;
        hash.update(&chunk);
        *n = after;
    }
    file.flush().await.map_err(local)?;
    Ok(Some(hex::encode(hash.finalize())))
}

/// `DELETE`s the checkpoint at `at`, with retries; a 404 (none there) is a success.
pub(crate) async fn delete(at: &Transfer<'_>, retries: &mut u32) -> Result<(), GaveUp> {
    let what = format!("DELETE {}", shown(at.url));
    let mut retry = Retry::new(retries);
    loop {
        let sent = traced(at.http.delete(at.url), at.traceparent)
            .header(AUTHORIZATION, format!("Bearer {}", at.macaroon))
            .send()
            .await;
        let failed = match sent {
            Ok(resp) if resp.status().is_success() || resp.status() == reqwest::StatusCode::NOT_FOUND => return Ok(()),
            Ok(resp) => Failed::status(&what, resp).await,
            Err(e) => Failed::request(&what, e),
        };
        retry.after(failed).await?;
    }
}
