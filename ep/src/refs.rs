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
//! Must not know: the link's WebSocket (`tokio_tungstenite`), slots (`slots`).

use crate::origins::Origins;
use crate::transfer::{Transfer, download};
use htfaas_functions::proto::{Outcome, ReferenceInput, ReferenceRead};
use std::path::Path;

/// Downloads each of `refs` below `input_dir/ref/`, in order, each within what is left of
/// `limit` (bytes, the job's scratch bound) once `bytes_in` were read; adds what it reads to
/// `bytes_in` and its retries to `retries`. A reference that cannot be read fails the job as
/// its input would ([`Outcome::InputFailed`], or [`Outcome::StorageUnavailable`] when the
/// storage stayed away through every retry).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn fetch(
    http: &reqwest::Client,
    origins: &Origins,
    refs: &[ReferenceInput],
    input_dir: &Path,
    limit: Option<u64>,
    bytes_in: &mut u64,
    retries: &mut u32,
    traceparent: Option<&str>,
) -> Result<Vec<ReferenceRead>, Outcome> {
    let failed = |reason: String| Outcome::InputFailed { reason };
    let mut read = Vec::with_capacity(refs.len());
    for r in refs {
        if !ReferenceInput::is_clean_path(&r.path) {
            return Err(failed(format!("reference path {:?} is not a clean relative path", r.path)));
        }
        origins.check("reference url", &r.url).map_err(|e| failed(e.to_string()))?;
        let dest = input_dir.join("ref").join(&r.path);
        if let Some(parent) = dest.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| failed(format!("make the directory of reference {}: {e}", r.path)))?;
        }
        let from = Transfer { http, url: &r.url, macaroon: &r.macaroon, traceparent };
        let left = limit.map(|l| l.saturating_sub(*bytes_in));
        let mut n = 0;
        let sha256 = download(&from, &dest, left, &mut n, retries, None).await;
        *bytes_in = bytes_in.saturating_add(n);
        let sha256 = sha256.map_err(|e| e.outcome(|reason| failed(format!("reference {}: {reason}", r.path))))?;
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
