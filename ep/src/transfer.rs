//! A job's transfers with the storage: the module, the input and each output, each tried up to
//! [`ATTEMPTS`] times with backoff (see [`crate::job`]'s docs for the policy).
//!
//! Below the job: it moves bytes between URLs and files with a macaroon; it must not know about
//! guests, slots or the scheduler link.

use crate::report_log::LogText;
use crate::runtime::millis;
use crate::scratch::{JobDir, Measured, ScratchLimits};
use futures_util::StreamExt;
use htfaas_functions::proto::{Outcome, OutputFile};
use reqwest::header::{AUTHORIZATION, CONTENT_LENGTH};
use sha2::{Digest as _, Sha256};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// Largest module the EP downloads.
pub(crate) const MAX_MODULE_BYTES: usize = 256 << 20;
/// Longest body snippet quoted in a failure reason.
const SNIPPET_BYTES: usize = 256;
/// Tries per transfer (module, input, each output): the first and up to three retries.
pub(crate) const ATTEMPTS: u32 = 4;
/// Wait before the first retry; doubled for each next one, with jitter.
pub(crate) const BACKOFF_FIRST: Duration = Duration::from_millis(200);
/// Longest backoff between two tries.
pub(crate) const BACKOFF_CAP: Duration = Duration::from_secs(5);
/// Longest `Retry-After` honoured; a server asking for more is retried after this.
pub(crate) const RETRY_AFTER_CAP: Duration = Duration::from_secs(10);
/// Buffer between the network and the scratch files, each way.
const IO_BUFFER: usize = 1 << 20;
/// Inputs of at most this many bytes (by their `Content-Length`) are read into memory and
/// written to the scratch in one call.
const SMALL_INPUT: u64 = 64 * 1024;

/// One storage endpoint as a job uses it: client, URL and macaroon.
pub(crate) struct Transfer<'a> {
    pub(crate) http: &'a reqwest::Client,
    pub(crate) url: &'a str,
    pub(crate) macaroon: &'a str,
    /// The job's `traceparent`, sent with each request so the storage's log lines join the
    /// event's trace.
    pub(crate) traceparent: Option<&'a str>,
}

/// `req` with the job's `traceparent` header, when it has one.
pub(crate) fn traced(req: reqwest::RequestBuilder, traceparent: Option<&str>) -> reqwest::RequestBuilder {
    match traceparent {
        Some(t) => req.header(htfaas_functions::trace::HEADER, t),
        None => req,
    }
}

/// Why one try of a transfer failed.
#[derive(Debug)]
pub(crate) struct Failed {
    /// For the job's failure reason: method, URL without its query, what went wrong.
    reason: String,
    /// Worth another try: connection trouble, a timeout, HTTP 5xx or 429.
    transient: bool,
    /// The server's `Retry-After`, capped at [`RETRY_AFTER_CAP`].
    retry_after: Option<Duration>,
}

impl Failed {
    pub(crate) fn permanent(reason: String) -> Failed {
        Failed { reason, transient: false, retry_after: None }
    }

    pub(crate) fn transient(reason: String) -> Failed {
        Failed { reason, transient: true, retry_after: None }
    }

    /// A request that got no usable answer: transient, unless the request itself is malformed.
    pub(crate) fn request(what: &str, e: reqwest::Error) -> Failed {
        let permanent = e.is_builder() || e.is_redirect();
        let reason = format!("{what}: {}", describe(e));
        if permanent { Failed::permanent(reason) } else { Failed::transient(reason) }
    }

    /// An answer that is not a success: 5xx and 429 are transient, other statuses final.
    pub(crate) async fn status(what: &str, resp: reqwest::Response) -> Failed {
        let status = resp.status();
        let transient = status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS;
        let retry_after = if transient { retry_after(resp.headers()) } else { None };
        let reason = format!("{what}: HTTP {status}: {}", snippet(resp).await);
        Failed { reason, transient, retry_after }
    }
}

/// `Retry-After` in seconds (the HTTP-date form is not honoured), capped.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let secs: u64 = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(secs).min(RETRY_AFTER_CAP))
}

/// A reqwest error and its causes on one line, without the URL (which may carry a query).
fn describe(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        let c = cause.to_string();
        if !text.ends_with(&c) {
            text.push_str(": ");
            text.push_str(&c);
        }
        source = cause.source();
    }
    text
}

/// `url` as shown in reasons and logs: scheme, host, port and path; no user, query or fragment.
pub(crate) fn shown(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => {
            u.set_query(None);
            u.set_fragment(None);
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.to_string()
        }
        Err(_) => url.split(['?', '#']).next().unwrap_or_default().to_owned(),
    }
}

/// Why a transfer failed for good.
#[derive(Debug)]
pub(crate) struct GaveUp {
    /// The last try's reason (with the number of tries when there were several).
    reason: String,
    /// Every try failed transiently: the far side was unavailable rather than refusing.
    unavailable: bool,
}

impl GaveUp {
    /// The job's outcome: [`Outcome::StorageUnavailable`] when the far side stayed unavailable,
    /// else `refused(reason)`.
    pub(crate) fn outcome(self, refused: impl FnOnce(String) -> Outcome) -> Outcome {
        if self.unavailable { Outcome::StorageUnavailable { reason: self.reason } } else { refused(self.reason) }
    }
}

/// Counts the tries of one transfer and waits between them.
pub(crate) struct Retry<'a> {
    tries: u32,
    retries: &'a mut u32,
}

impl<'a> Retry<'a> {
    pub(crate) fn new(retries: &'a mut u32) -> Retry<'a> {
        Retry { tries: 0, retries }
    }

    /// After a failed try: waits and returns `Ok` when another try is due, or returns why the
    /// transfer failed for good. The wait is cancel-safe (a dropped future just stops waiting).
    pub(crate) async fn after(&mut self, failed: Failed) -> Result<(), GaveUp> {
        self.tries += 1;
        if !failed.transient {
            return Err(GaveUp { reason: failed.reason, unavailable: false });
        }
        if self.tries >= ATTEMPTS {
            let reason = format!("{} (gave up after {ATTEMPTS} attempts)", failed.reason);
            return Err(GaveUp { reason, unavailable: true });
        }
        let wait = failed.retry_after.unwrap_or_else(|| backoff(self.tries - 1));
        *self.retries += 1;
        tracing::info!(attempt = self.tries, wait_ms = millis(wait), "{}; trying again", failed.reason);
        tokio::time::sleep(wait).await;
        Ok(())
    }
}

/// The wait before retry `n` (0-based): [`BACKOFF_FIRST`] × 2^n capped at [`BACKOFF_CAP`], of
/// which a random half is taken off, so tries of jobs failing together spread out.
fn backoff(n: u32) -> Duration {
    use std::hash::{BuildHasher as _, Hasher as _};
    let full = BACKOFF_FIRST.saturating_mul(1u32.checked_shl(n).unwrap_or(u32::MAX)).min(BACKOFF_CAP);
    // A fresh `RandomState` is randomly keyed: enough randomness for jitter, no extra crate.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(n);
    let half = full / 2;
    let jitter_ms = h.finish() % (u64::try_from(half.as_millis()).unwrap_or(u64::MAX).saturating_add(1));
    half + Duration::from_millis(jitter_ms)
}

async fn snippet(resp: reqwest::Response) -> String {
    let body = resp.bytes().await.unwrap_or_default();
    let cut = &body[..body.len().min(SNIPPET_BYTES)];
    String::from_utf8_lossy(cut).trim().to_owned()
}

/// `GET module_url` into memory, bounded, with retries.
pub(crate) async fn fetch_module(http: &reqwest::Client, url: &str, retries: &mut u32) -> Result<Vec<u8>, GaveUp> {
    let mut retry = Retry::new(retries);
    loop {
        match fetch_module_once(http, url).await {
            Ok(bytes) => return Ok(bytes),
            Err(failed) => retry.after(failed).await?,
        }
    }
}

async fn fetch_module_once(http: &reqwest::Client, url: &str) -> Result<Vec<u8>, Failed> {
    let what = format!("fetch {}", shown(url));
    let resp = http.get(url).send().await.map_err(|e| Failed::request(&what, e))?;
    if !resp.status().is_success() {
        return Err(Failed::status(&what, resp).await);
    }
    if resp.content_length().is_some_and(|n| n > MAX_MODULE_BYTES as u64) {
        return Err(Failed::permanent(format!("{what}: module larger than {MAX_MODULE_BYTES} bytes")));
    }
    let mut bytes = Vec::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| Failed::request(&what, e))?;
        if bytes.len() + chunk.len() > MAX_MODULE_BYTES {
            return Err(Failed::permanent(format!("{what}: module larger than {MAX_MODULE_BYTES} bytes")));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// Longest wait for the storage's answer to a digest lookup ([`storage_sha256`]); a storage
/// slower than that is downloaded from instead.
const DIGEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The storage's sha256 of the file at `from`, as hex: a `HEAD` with the macaroon and
/// `Want-Digest: sha-256` (RFC 3230), answered with `Digest: sha-256=<base64>` (the built-in
/// storage and dCache's WebDAV door do). `None` when the storage names no sha-256 (XRootD
/// answers `adler32` only) or the `HEAD` fails: the caller downloads instead, so a failure here
/// is never the job's. One try, no retries.
pub(crate) async fn storage_sha256(from: &Transfer<'_>) -> Option<String> {
    let what = format!("HEAD {}", shown(from.url));
    let mut req = traced(from.http.head(from.url), from.traceparent).header("Want-Digest", "sha-256");
    if !from.macaroon.is_empty() {
        req = req.header(AUTHORIZATION, format!("Bearer {}", from.macaroon));
    }
    match req.timeout(DIGEST_TIMEOUT).send().await {
        Ok(resp) if resp.status().is_success() => sha256_of(resp.headers()),
        Ok(resp) => {
            tracing::debug!("{what}: HTTP {}; downloading instead", resp.status());
            None
        }
        Err(e) => {
            tracing::debug!("{what}: {}; downloading instead", describe(e));
            None
        }
    }
}

/// The sha256, as hex, that `Digest` headers name (RFC 3230: a list of `algorithm=value`,
/// names without case, `sha-256`'s value the base64 of its 32 bytes); `None` if none does.
fn sha256_of(headers: &reqwest::header::HeaderMap) -> Option<String> {
    use base64::Engine as _;
    headers.get_all("digest").iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).find_map(|item| {
        let (algorithm, value) = item.trim().split_once('=')?;
        if !algorithm.trim().eq_ignore_ascii_case("sha-256") {
            return None;
        }
        let bytes = base64::engine::general_purpose::STANDARD.decode(value.trim()).ok()?;
        (bytes.len() == 32).then(|| hex::encode(bytes))
    })
}

/// `GET` the input with the bearer macaroon, streamed to `dest` and hashed, with retries (each
/// one starts again from an empty file). `n` counts the bytes written by the current try as
/// they arrive, so a cancelled download still reports what it read. With `limit`, an input
/// larger than it fails at once, checked against `Content-Length` first, then as it arrives.
/// `dir`, the job directory `dest` is in, is made before the first byte is written, in the
/// same call off the async threads as a small input's write. Returns the sha256 hex of the
/// bytes written.
pub(crate) async fn download(
    from: &Transfer<'_>,
    dest: &Path,
    limit: Option<u64>,
    n: &mut u64,
    retries: &mut u32,
    mut dir: Option<JobDir>,
) -> Result<String, GaveUp> {
    let mut retry = Retry::new(retries);
    loop {
        *n = 0;
        match download_once(from, dest, limit, n, &mut dir).await {
            Ok(sha256) => return Ok(sha256),
            Err(failed) => retry.after(failed).await?,
        }
    }
}

async fn download_once(
    from: &Transfer<'_>,
    dest: &Path,
    limit: Option<u64>,
    n: &mut u64,
    dir: &mut Option<JobDir>,
) -> Result<String, Failed> {
    let what = format!("GET {}", shown(from.url));
    let too_big = |size: String, limit: u64| {
        Failed::permanent(format!("input of {size} bytes exceeds the scratch limit of {limit} bytes"))
    };
    let mut req = traced(from.http.get(from.url), from.traceparent);
    // An empty macaroon: a public, content-addressed download (an image), no credential.
    if !from.macaroon.is_empty() {
        req = req.header(AUTHORIZATION, format!("Bearer {}", from.macaroon));
    }
    let resp = req.send().await.map_err(|e| Failed::request(&what, e))?;
    if !resp.status().is_success() {
        return Err(Failed::status(&what, resp).await);
    }
    if let (Some(limit), Some(len)) = (limit, resp.content_length())
        && len > limit
    {
        return Err(too_big(len.to_string(), limit));
    }
    let local = |e: std::io::Error| Failed::permanent(format!("write {}: {e}", dest.display()));
    // A small input of known length is read whole, then written in one call off the async
    // threads, its job directory made in the same call: creating, writing and closing through
    // `tokio::fs` is a hand-off each.
    if let Some(len) = resp.content_length().filter(|l| *l <= SMALL_INPUT) {
        let body = resp.bytes().await.map_err(|e| Failed::request(&what, e))?;
        if body.len() as u64 != len {
            return Err(Failed::transient(format!("{what}: {} bytes of a body of {len}", body.len())));
        }
        let sha256 = hex::encode(Sha256::digest(&body));
        let to = dest.to_owned();
        in_job_dir(dir.take(), dest, move || crate::scratch::write_input(&to, &body)).await?.map_err(local)?;
        *n += len;
        return Ok(sha256);
    }
    // A larger one streams into a file opened with its directory, in one call, and is cut to
    // its length once whole (a kept inode may hold a longer input before it).
    let to = dest.to_owned();
    let file = in_job_dir(dir.take(), dest, move || crate::scratch::open_input(&to)).await?.map_err(local)?;
    let file = tokio::fs::File::from_std(file);
    let mut file = tokio::io::BufWriter::with_capacity(IO_BUFFER, file);
    let mut body = resp.bytes_stream();
    let mut hash = Sha256::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| Failed::request(&what, e))?;
        let after = *n + chunk.len() as u64;
        if let Some(limit) = limit
            && after > limit
        {
            return Err(too_big(format!("at least {after}"), limit));
        }
        file.write_all(&chunk).await.map_err(local)?;
        hash.update(&chunk);
        *n = after;
    }
    file.flush().await.map_err(local)?;
    file.get_ref().set_len(*n).await.map_err(local)?;
    Ok(hex::encode(hash.finalize()))
}

/// Runs `first` (a job's first write into its directory: it creates the input file `input`)
/// off the async threads, making `dir` first in the same call when it is given
/// ([`JobDir::make_then`]). The outer error is the making's (or the call's), the inner one
/// `first`'s.
async fn in_job_dir<T: Send + 'static>(
    dir: Option<JobDir>,
    input: &Path,
    first: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<std::io::Result<T>, Failed> {
    let input = input.to_owned();
    let made = off_thread(move || match dir {
        Some(dir) => dir.make_then(Some(&input), first),
        None => Ok(first()),
    });
    made.await.map_err(|e| Failed::permanent(format!("create job dir: {e}")))
}

/// Runs `f` (file system calls) off the async threads, in one hand-off.
pub(crate) async fn off_thread<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(std::io::Error::other)?
}

/// What `upload_outputs` did.
pub(crate) struct Stored {
    pub(crate) files: Vec<OutputFile>,
    pub(crate) bytes_out: u64,
    /// The job's outcome when storing failed or the outputs are past a limit.
    pub(crate) failure: Option<Outcome>,
}

/// The outputs of a job whose guest ended, as one walk of its `/output` found them
/// ([`collect_outputs`]): what its limits measure, its regular top-level files (the small ones
/// read), and a note for each entry skipped.
pub(crate) struct Outputs {
    measured: std::io::Result<Measured>,
    listed: std::io::Result<(Vec<OutputEntry>, Vec<String>)>,
}

/// One regular top-level file of `/output`; `body`: its bytes, read when it was listed, for a
/// file of at most [`SMALL_OUTPUT`] bytes (within [`SMALL_OUTPUTS_TOTAL`] for the job).
struct OutputEntry {
    name: String,
    path: PathBuf,
    size: u64,
    body: Option<bytes::Bytes>,
}

/// Output files of at most this many bytes are read when listed and sent from memory.
const SMALL_OUTPUT: u64 = 64 * 1024;
/// Most bytes of a job's small outputs held in memory; the rest are streamed from their files.
const SMALL_OUTPUTS_TOTAL: u64 = 1 << 20;

/// Walks `dir` (a job's `/output`, its guest ended) in one call off the async threads: measures
/// it for its limits (at most `max_entries` entries), lists its regular top-level files and
/// reads the small ones, which are then sent without opening their files again. A measuring,
/// listing and reading each as their own call would be a hand-off each, and one more per
/// read of a `tokio::fs` file.
pub(crate) async fn collect_outputs(dir: &Path, max_entries: usize) -> Outputs {
    let at = dir.to_owned();
    let walked = tokio::task::spawn_blocking(move || walk_outputs(&at, max_entries)).await;
    walked.unwrap_or_else(|e| Outputs {
        measured: Err(std::io::Error::other(e.to_string())),
        listed: Err(std::io::Error::other(format!("output listing task failed: {e}"))),
    })
}

/// [`collect_outputs`] on this thread: for a caller already off the async threads (a wasm
/// guest's own thread, right after its run). Blocking.
pub(crate) fn walk_outputs(dir: &Path, max_entries: usize) -> Outputs {
    let measured = crate::scratch::measure(dir, max_entries);
    // An empty `/output` (a run that stored nothing) has nothing to list: one walk, not two.
    let listed = match &measured {
        Ok(m) if m.is_empty() => Ok((Vec::new(), Vec::new())),
        _ => list_top_files(dir).map(|(files, skipped)| (read_small(files), skipped)),
    };
    Outputs { measured, listed }
}

/// `files` with the bytes of each small one read (opened without following a link; one that
/// cannot be read so is left to be streamed, which says why it fails). Blocking.
fn read_small(files: Vec<(String, PathBuf, u64)>) -> Vec<OutputEntry> {
    use std::io::Read as _;
    let mut budget = SMALL_OUTPUTS_TOTAL;
    let mut out = Vec::with_capacity(files.len());
    for (name, path, size) in files {
        let mut body = None;
        if size <= SMALL_OUTPUT && size <= budget {
            let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
            let read = open_output(&path).and_then(|f| f.take(SMALL_OUTPUT + 1).read_to_end(&mut bytes));
            // A file that grew past the bound since it was listed (a guest thread left behind
            // still writing) is streamed instead.
            if read.is_ok() && bytes.len() as u64 <= SMALL_OUTPUT {
                budget -= bytes.len() as u64;
                body = Some(bytes::Bytes::from(bytes));
            }
        }
        let size = body.as_ref().map_or(size, |b| b.len() as u64);
        out.push(OutputEntry { name, path, size, body });
    }
    out
}

/// Opens an output for reading: never through a link (one swapped in after the listing fails
/// to open), and only a regular file. Blocking.
fn open_output(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(file)
}

impl Outputs {
    /// Why they are past `limits`, if they are ([`ScratchLimits::judge`]).
    pub(crate) fn exceeded(&self, limits: &ScratchLimits) -> Option<String> {
        limits.judge(&self.measured)
    }
}

/// PUTs every regular top-level file of `outputs` to `{base}{name}` (a small one from memory,
/// the others streamed from their files), hashed, recording each file into `stored` once the
/// storage accepted it (so an upload dropped midway, by a cancel, leaves in `stored` exactly
/// the files that are in the storage).
pub(crate) async fn upload_outputs(
    limits: &ScratchLimits,
    to: &Transfer<'_>,
    outputs: Outputs,
    stored: &mut Stored,
    log: &mut LogText,
    retries: &mut u32,
) {
    let mut files = match outputs.listed {
        Ok((files, skipped)) => {
            for note in skipped {
                log.note(&note);
            }
            files
        }
        Err(e) => {
            stored.failure = Some(Outcome::OutputFailed { reason: format!("list outputs: {e}") });
            return;
        }
    };
    files.sort_by(|a, b| a.name.cmp(&b.name));
    if files.len() > limits.max_files {
        let reason = format!("{} output files, more than the output file limit of {}", files.len(), limits.max_files);
        stored.failure = Some(Outcome::OutputExceeded { reason });
        return;
    }
    let total: u64 = files.iter().map(|f| f.size).sum();
    if total > limits.max_output_bytes {
        let reason = format!("{total} output bytes, more than the output byte limit of {}", limits.max_output_bytes);
        stored.failure = Some(Outcome::OutputExceeded { reason });
        return;
    }
    for OutputEntry { name, path, size, body } in files {
        let url = format!("{}{}", to.url, htfaas_functions::percent::segment(&name));
        let one = Transfer { http: to.http, url: &url, macaroon: to.macaroon, traceparent: to.traceparent };
        let put = match body {
            Some(body) => put_bytes(&one, body, retries).await,
            None => put_file(&one, &path, size, retries).await,
        };
        match put {
            Ok(sha256) => {
                stored.bytes_out += size;
                stored.files.push(OutputFile { path: storage_path(&url), size, sha256 });
            }
            Err(e) => {
                stored.failure = Some(e.outcome(|reason| Outcome::OutputFailed { reason }));
                return;
            }
        }
    }
}

/// The regular top-level files of `dir` (name, path, size) and a note for each entry skipped.
/// Blocking.
#[allow(clippy::type_complexity)]
fn list_top_files(dir: &Path) -> std::io::Result<(Vec<(String, PathBuf, u64)>, Vec<String>)> {
    let (mut out, mut skipped) = (Vec::new(), Vec::new());
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let raw = entry.file_name();
        let Some(name) = raw.to_str().map(str::to_owned) else {
            skipped.push(format!("skipped output {raw:?}: name is not UTF-8"));
            continue;
        };
        // symlink_metadata: a symlink is reported as such, never followed.
        let meta = std::fs::symlink_metadata(entry.path())?;
        if meta.file_type().is_symlink() {
            skipped.push(format!("skipped output {name:?}: symlink"));
        } else if meta.is_dir() {
            skipped.push(format!("skipped output {name:?}: directory (only top-level files are stored)"));
        } else if !meta.is_file() {
            skipped.push(format!("skipped output {name:?}: not a regular file"));
        } else {
            out.push((name, entry.path(), meta.len()));
        }
    }
    Ok((out, skipped))
}

/// PUTs `body`, hashed once, with retries (each sends it again). Returns the sha256 hex of what
/// the storage accepted.
async fn put_bytes(to: &Transfer<'_>, body: bytes::Bytes, retries: &mut u32) -> Result<String, GaveUp> {
    let sha256 = hex::encode(Sha256::digest(&body));
    let what = format!("PUT {}", shown(to.url));
    let mut retry = Retry::new(retries);
    loop {
        let sent = traced(to.http.put(to.url), to.traceparent)
            .header(AUTHORIZATION, format!("Bearer {}", to.macaroon))
            .header(CONTENT_LENGTH, body.len())
            .body(body.clone())
            .send()
            .await
            .map_err(|e| Failed::request(&what, e));
        let failed = match sent {
            Ok(resp) if resp.status().is_success() => return Ok(sha256.clone()),
            Ok(resp) => Failed::status(&what, resp).await,
            Err(failed) => failed,
        };
        retry.after(failed).await?;
    }
}

/// PUTs `size` bytes of `path`, streamed and hashed, with retries (each sends the file again
/// from its start). Returns the sha256 hex of what the storage accepted.
pub(crate) async fn put_file(to: &Transfer<'_>, path: &Path, size: u64, retries: &mut u32) -> Result<String, GaveUp> {
    let mut retry = Retry::new(retries);
    loop {
        match put_file_once(to, path, size).await {
            Ok(sha256) => return Ok(sha256),
            Err(failed) => retry.after(failed).await?,
        }
    }
}

async fn put_file_once(to: &Transfer<'_>, path: &Path, size: u64) -> Result<String, Failed> {
    use tokio::io::AsyncReadExt;
    let what = format!("PUT {}", shown(to.url));
    let at = path.to_owned();
    let file = off_thread(move || open_output(&at))
        .await
        .map_err(|e| Failed::permanent(format!("open {}: {e}", path.display())))?;
    let file = tokio::fs::File::from_std(file);
    let hasher = Arc::new(Mutex::new(Sha256::new()));
    let h = hasher.clone();
    let stream = tokio_util::io::ReaderStream::with_capacity(file.take(size), IO_BUFFER).map(move |chunk| {
        if let Ok(c) = &chunk {
            h.lock().unwrap_or_else(|p| p.into_inner()).update(c);
        }
        chunk
    });
    let resp = traced(to.http.put(to.url), to.traceparent)
        .header(AUTHORIZATION, format!("Bearer {}", to.macaroon))
        .header(CONTENT_LENGTH, size)
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .map_err(|e| Failed::request(&what, e))?;
    if !resp.status().is_success() {
        return Err(Failed::status(&what, resp).await);
    }
    let digest = std::mem::take(&mut *hasher.lock().unwrap_or_else(|p| p.into_inner())).finalize();
    Ok(hex::encode(digest))
}

/// The storage path of a URL: its path part, percent-decoded.
fn storage_path(url: &str) -> String {
    let path = reqwest::Url::parse(url).map(|u| u.path().to_owned()).unwrap_or_else(|_| url.to_owned());
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && bytes[i + 1].is_ascii_hexdigit()
            && bytes[i + 2].is_ascii_hexdigit()
            && let Ok(v) = u8::from_str_radix(&path[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_walk_lists_the_outputs_reads_the_small_ones_and_follows_no_link() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path();
        std::fs::write(out.join("small"), b"abc").expect("write");
        let big = usize::try_from(SMALL_OUTPUT).expect("fits") + 1;
        std::fs::write(out.join("big"), vec![7u8; big]).expect("write");
        std::fs::create_dir(out.join("sub")).expect("mkdir");
        std::fs::write(out.join("sub/inner"), b"xy").expect("write");
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("secret"), b"not the job's").expect("write");
        std::os::unix::fs::symlink(outside.path().join("secret"), out.join("link")).expect("symlink");

        let outputs = collect_outputs(out, 100).await;
        let m = outputs.measured.as_ref().expect("measured");
        let limits = ScratchLimits { max_files: 4, max_output_bytes: 1 << 30, max_scratch_bytes: None, input_bytes: 0 };
        assert!(limits.exceeded(*m).expect("5 entries").contains("more than 4 files"), "measured as the watcher does");
        let (files, skipped) = outputs.listed.as_ref().expect("listed");
        let mut seen: Vec<_> = files.iter().map(|f| (f.name.as_str(), f.size, f.body.as_deref())).collect();
        seen.sort_by_key(|f| f.0);
        assert_eq!(seen, [("big", big as u64, None), ("small", 3, Some(&b"abc"[..]))], "top-level regular files only");
        assert_eq!(skipped.len(), 2, "the link and the directory: {skipped:?}");
        assert!(skipped.iter().any(|n| n.contains("\"link\": symlink")));
        // A link swapped in for a listed file after the listing is never opened through.
        std::fs::remove_file(out.join("small")).expect("rm");
        std::os::unix::fs::symlink(outside.path().join("secret"), out.join("small")).expect("swap");
        assert!(open_output(&out.join("small")).is_err(), "O_NOFOLLOW refuses the link");
        let reread = read_small(vec![("small".into(), out.join("small"), 3)]);
        assert_eq!(reread[0].body, None, "left to the streamed upload, whose open fails the same way");
        assert!(open_output(&out.join("sub")).is_err(), "a directory is no output file");
    }

    #[test]
    fn small_outputs_held_in_memory_stay_within_the_jobs_budget() {
        let dir = tempfile::tempdir().expect("tempdir");
        let each = usize::try_from(SMALL_OUTPUT).expect("fits");
        let n = usize::try_from(SMALL_OUTPUTS_TOTAL / SMALL_OUTPUT).expect("fits") + 2;
        let files: Vec<_> = (0..n)
            .map(|i| {
                let path = dir.path().join(format!("f{i}"));
                std::fs::write(&path, vec![1u8; each]).expect("write");
                (format!("f{i}"), path, each as u64)
            })
            .collect();
        let read = read_small(files);
        let held: u64 = read.iter().filter_map(|f| f.body.as_ref()).map(|b| b.len() as u64).sum();
        assert_eq!(held, SMALL_OUTPUTS_TOTAL, "read up to the budget");
        assert_eq!(read.iter().filter(|f| f.body.is_none()).count(), 2, "the rest streamed");
    }

    #[test]
    fn output_names_are_encoded_and_paths_decoded() {
        assert_eq!(htfaas_functions::percent::segment("a b#?.txt"), "a%20b%23%3F.txt");
        assert_eq!(storage_path("http://h:1/data/out/a%20b%23%3F.txt"), "/data/out/a b#?.txt");
        assert_eq!(storage_path("http://h/d/x%2"), "/d/x%2");
    }

    #[test]
    fn backoff_doubles_with_jitter_and_is_capped() {
        for n in 0..3 {
            let full = BACKOFF_FIRST * (1 << n);
            for _ in 0..50 {
                let b = backoff(n);
                assert!(b >= full / 2 && b <= full, "retry {n}: {b:?}");
            }
        }
        for n in [5, 31, 32, 1000] {
            assert!(backoff(n) <= BACKOFF_CAP && backoff(n) >= BACKOFF_CAP / 2, "{n}");
        }
    }

    #[test]
    fn shown_urls_carry_no_query_or_user() {
        assert_eq!(shown("http://u:p@h:1/a/b?authz=SECRET#f"), "http://h:1/a/b");
        assert_eq!(shown("not a url?authz=SECRET"), "not a url");
    }

    #[test]
    fn a_digest_header_names_the_sha256_as_hex_or_nothing() {
        let header = |values: &[&str]| {
            let mut h = reqwest::header::HeaderMap::new();
            for v in values {
                h.append("digest", v.parse().expect("header"));
            }
            sha256_of(&h)
        };
        let sha = Sha256::digest(b"constants");
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(sha);
        let hex = hex::encode(sha);
        assert_eq!(header(&[&format!("sha-256={b64}")]).as_deref(), Some(hex.as_str()));
        assert_eq!(header(&[&format!("adler32=0a1b2c3d, SHA-256={b64}")]).as_deref(), Some(hex.as_str()));
        assert_eq!(header(&["adler32=0a1b2c3d", &format!("sha-256={b64}")]).as_deref(), Some(hex.as_str()));
        assert_eq!(header(&[]), None);
        assert_eq!(header(&["adler32=0a1b2c3d"]), None, "XRootD's: downloaded");
        assert_eq!(header(&["sha-256=not base64!"]), None);
        assert_eq!(header(&["sha-256=AAAA"]), None, "not 32 bytes");
        assert_eq!(header(&[&format!("sha-512={b64}")]), None);
    }

    #[test]
    fn retry_after_is_seconds_capped() {
        let mut h = reqwest::header::HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert(reqwest::header::RETRY_AFTER, "2".parse().expect("header"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert(reqwest::header::RETRY_AFTER, "86400".parse().expect("header"));
        assert_eq!(retry_after(&h), Some(RETRY_AFTER_CAP));
        h.insert(reqwest::header::RETRY_AFTER, "Wed, 21 Oct 2015 07:28:00 GMT".parse().expect("header"));
        assert_eq!(retry_after(&h), None);
    }
}
