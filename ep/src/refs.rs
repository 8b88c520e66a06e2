//! A job's reference files: each downloaded with its own read macaroon into the job's
//! `/input/ref/<path>`, read-only to the guest like the input, and hashed as it arrives, so the
//! report names every file the run read ([`ReferenceRead`]).
//!
//! Nothing of the assignment is trusted beyond what the scheduler checked: each URL must be at
//! one of the EP's origins and each path a clean relative path (no `..`, no absolute path, no
//! NUL), so a file lands below `ref/` and nowhere else. The directories are made by the EP in
//! a job directory no guest has run in yet, so no link planted by a guest can redirect them.
//! Together with the input, the files are held to the job's scratch bound.
//!
//! With the EP's cache ([`RefCache`]) on, each file's sha256 is asked of the storage first
//! (`HEAD`, `Want-Digest`, with the job's own macaroon for that file, so a job is served only
//! bytes its macaroon reaches); bytes the cache holds are linked in and not downloaded. A
//! downloaded file is kept under the sha256 the EP computed over what it received, never
//! under the storage's word. A reference pinned to a sha256 (a re-run) is served from the
//! cache only when the storage names those very bytes; otherwise it is downloaded and other
//! bytes are refused, as without the cache. A name already at a file's place is unlinked
//! first, never written through: it may be a cached file's other name.
//!
//! Must not know: the link's WebSocket (`tokio_tungstenite`), slots (`slots`).

use crate::counters::Metrics;
use crate::origins::Origins;
use crate::refcache::{RefCache, unlink};
use crate::transfer::{Transfer, download, off_thread, storage_sha256};
use htfaas_functions::proto::{Outcome, ReferenceInput, ReferenceRead};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a job's reference files come from, and what counts them.
pub(crate) struct Sources<'a> {
    pub(crate) http: &'a reqwest::Client,
    pub(crate) origins: &'a Origins,
    /// The EP's cache of reference files by content, when on.
    pub(crate) cache: Option<&'a Arc<RefCache>>,
    pub(crate) metrics: &'a Metrics,
    /// The job's `traceparent`, sent with each request.
    pub(crate) traceparent: Option<&'a str>,
}

/// Fetches each of `refs` below `input_dir/ref/`, in order (from the cache, or downloaded),
/// each within what is left of `limit` (bytes, the job's scratch bound) once `bytes_in` were
/// read; adds each file's size to `bytes_in` (from the cache too: the guest reads it all the
/// same) and its retries to `retries`. A reference that cannot be read fails the job as its
/// input would ([`Outcome::InputFailed`], or [`Outcome::StorageUnavailable`] when the storage
/// stayed away through every retry).
pub(crate) async fn fetch(
    from: &Sources<'_>,
    refs: &[ReferenceInput],
    input_dir: &Path,
    limit: Option<u64>,
    bytes_in: &mut u64,
    retries: &mut u32,
) -> Result<Vec<ReferenceRead>, Outcome> {
    let failed = |reason: String| Outcome::InputFailed { reason };
    let mut read = Vec::with_capacity(refs.len());
    for r in refs {
        if !ReferenceInput::is_clean_path(&r.path) {
            return Err(failed(format!("reference path {:?} is not a clean relative path", r.path)));
        }
        from.origins.check("reference url", &r.url).map_err(|e| failed(e.to_string()))?;
        let dest = input_dir.join("ref").join(&r.path);
        let at = dest.clone();
        let made = off_thread(move || {
            if let Some(parent) = at.parent() {
                std::fs::create_dir_all(parent)?;
            }
            unlink(&at)
        });
        made.await.map_err(|e| failed(format!("make the place of reference {}: {e}", r.path)))?;
        let t = Transfer { http: from.http, url: &r.url, macaroon: &r.macaroon, traceparent: from.traceparent };
        let left = limit.map(|l| l.saturating_sub(*bytes_in));
        if let Some(cache) = from.cache
            && let Some((size, sha256)) = cached(cache, &t, r.sha256.as_deref(), &dest).await
        {
            *bytes_in = bytes_in.saturating_add(size);
            if let Some(left) = left
                && size > left
            {
                let reason = format!("input of {size} bytes exceeds the scratch limit of {left} bytes");
                return Err(failed(format!("reference {}: {reason}", r.path)));
            }
            from.metrics.reference_read(true);
            read.push(ReferenceRead { path: r.path.clone(), size, sha256 });
            continue;
        }
        let mut n = 0;
        let sha256 = download(&t, &dest, left, &mut n, retries, None).await;
        *bytes_in = bytes_in.saturating_add(n);
        let sha256 = sha256.map_err(|e| e.outcome(|reason| failed(format!("reference {}: {reason}", r.path))))?;
        from.metrics.reference_read(false);
        if let Some(cache) = from.cache {
            keep(cache, &sha256, &dest).await;
        }
        // A re-run reads the constants of the run it re-derives, or runs nothing.
        if let Some(expected) = &r.sha256
            && !expected.eq_ignore_ascii_case(&sha256)
        {
            return Err(htfaas_functions::proto::rerun::reference_changed(&r.path, &sha256, expected));
        }
        read.push(ReferenceRead { path: r.path.clone(), size: n, sha256 });
    }
    Ok(read)
}

/// The cache's copy of the file at `t`, linked at `dest`: its size and sha256. Only when the
/// storage names the file's sha256 to the job's macaroon, `pinned` (if any) is that same
/// sha256, and the cache holds those bytes; `None` otherwise (a failure here is only logged:
/// the file is downloaded instead).
async fn cached(cache: &Arc<RefCache>, t: &Transfer<'_>, pinned: Option<&str>, dest: &Path) -> Option<(u64, String)> {
    let sha256 = storage_sha256(t).await?;
    if pinned.is_some_and(|p| !p.eq_ignore_ascii_case(&sha256)) {
        return None;
    }
    let (cache, key, at) = (cache.clone(), sha256.clone(), dest.to_owned());
    match off_thread(move || cache.link(&key, &at)).await {
        Ok(Some(size)) => Some((size, sha256)),
        Ok(None) => None,
        Err(e) => {
            tracing::warn!("failed to link a cached reference file: {e}; downloading it");
            None
        }
    }
}

/// Keeps the downloaded `file` in the cache under `sha256`, the EP's own hash of its bytes; a
/// failure is only logged.
async fn keep(cache: &Arc<RefCache>, sha256: &str, file: &Path) {
    let (cache, key, at): (_, _, PathBuf) = (cache.clone(), sha256.to_owned(), file.to_owned());
    if let Err(e) = off_thread(move || cache.keep(&key, &at)).await {
        tracing::warn!("failed to keep a reference file in the cache: {e}");
    }
}
