//! One assignment, start to end: module, input, run, outputs, clean-up, report.
//!
//! Every path ends in a [`JobReport`]; nothing here returns an error to the caller. Macaroons
//! go into `Authorization` headers and nowhere else (never into logs, spans or reports).
//!
//! Cancellation: each job has a [`CancelSignal`]. The module fetch, the input download and the
//! output upload race it (a cancel drops the transfer, closing its connection); the guest run
//! checks it itself (see [`crate::runtime`]); and a job cancelled by the time its guest returns
//! uploads nothing. A cancelled job reports [`Outcome::Cancelled`] with the usage so far (bytes
//! read, CPU, memory, and the outputs fully stored before the cancel, if it came mid-upload).

use crate::Settings;
use crate::runtime::{CancelSignal, Guest, GuestJob, GuestRun, ModuleError, Runtime};
use futures_util::StreamExt;
use htfaas_functions::Digest;
use htfaas_functions::proto::{FunctionRef, JobAssignment, JobReport, Outcome, OutputFile, Usage};
use reqwest::header::{AUTHORIZATION, CONTENT_LENGTH};
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::io::AsyncWriteExt;
use tracing::Instrument;

/// Largest module the EP downloads.
pub(crate) const MAX_MODULE_BYTES: usize = 256 << 20;
/// Longest body snippet quoted in a failure reason.
const SNIPPET_BYTES: usize = 256;
/// How long past its wall-time cap, or after a cancel, a job waits for its guest's thread before
/// leaving it behind (only a guest blocked in a host sleep takes that long; others stop within
/// one epoch tick).
const ABANDON_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Shared state the job tasks use.
pub(crate) struct Jobs {
    pub(crate) settings: Arc<Settings>,
    /// One lock per digest, so a module is fetched and compiled once even when several jobs
    /// need it at the same moment.
    loading: Mutex<HashMap<Digest, Arc<tokio::sync::Mutex<()>>>>,
}

impl Jobs {
    pub(crate) fn new(settings: Arc<Settings>) -> Jobs {
        Jobs { settings, loading: Mutex::new(HashMap::new()) }
    }

    /// Runs one assignment to its report; `cancel` stops it early ([`Outcome::Cancelled`]).
    pub(crate) async fn execute(&self, job: JobAssignment, cancel: CancelSignal) -> JobReport {
        let span = tracing::info_span!(
            "ep.invoke",
            job.id = %job.job_id,
            function.name = %job.function.name,
            function.digest = %job.function.digest.short(),
            outcome = tracing::field::Empty,
        );
        async {
            let started = Instant::now();
            let mut report = self.execute_inner(&job, &cancel).await;
            report.usage.wall_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            tracing::Span::current().record("outcome", outcome_kind(&report.outcome));
            tracing::info!(wall_ms = report.usage.wall_ms, cpu_ms = report.usage.cpu_ms, "job finished: {}", {
                let r = report.outcome.reason();
                if r.is_empty() { "ok".to_owned() } else { r }
            });
            report
        }
        .instrument(span)
        .await
    }

    async fn execute_inner(&self, job: &JobAssignment, cancel: &CancelSignal) -> JobReport {
        let mut report = JobReport {
            job_id: job.job_id.clone(),
            outcome: Outcome::Exited { exit_code: 0 },
            usage: Usage::default(),
            outputs: Vec::new(),
            log: String::new(),
        };
        let s = &self.settings;
        let dir = s.jobs_dir.join(job_dir_name(&job.job_id));
        let result = self.steps(job, &dir, &mut report, cancel).await;
        if let Err(outcome) = result {
            report.outcome = outcome;
        }
        if let Err(e) = tokio::fs::remove_dir_all(&dir).await
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("failed to remove job dir {}: {e}", dir.display());
        }
        report
    }

    /// The steps; an `Err` is the job's final outcome.
    async fn steps(
        &self,
        job: &JobAssignment,
        dir: &Path,
        report: &mut JobReport,
        cancel: &CancelSignal,
    ) -> Result<(), Outcome> {
        let s = &self.settings;
        if job.resources.memory_mb > s.slots.memory_mb || job.resources.runtime_s > s.slots.runtime_s {
            tracing::warn!("assignment exceeds the advertised slots; enforcing the job's own limits");
        }
        if !is_clean_segment(&job.input.name) {
            return Err(Outcome::InputFailed {
                reason: format!("input name {:?} is not one clean path segment", job.input.name),
            });
        }
        let guest = unless_cancelled(cancel, self.module(&job.function))
            .await?
            .map_err(|reason| Outcome::ModuleFailed { reason })?;

        let input_dir = dir.join("input");
        let output_dir = dir.join("output");
        let _ = tokio::fs::remove_dir_all(dir).await;
        for d in [&input_dir, &output_dir] {
            tokio::fs::create_dir_all(d)
                .await
                .map_err(|e| Outcome::InputFailed { reason: format!("create job dir: {e}") })?;
        }
        let input_path = input_dir.join(&job.input.name);
        let fetched = download(&s.http, &job.input.url, &job.input.macaroon, &input_path, &mut report.usage.bytes_in);
        unless_cancelled(cancel, fetched).await?.map_err(|reason| Outcome::InputFailed { reason })?;
        if cancel.is_cancelled() {
            return Err(cancel.outcome());
        }

        let mut argv = Vec::with_capacity(2 + job.args.len());
        argv.push(job.function.name.clone());
        argv.push(format!("/input/{}", job.input.name));
        argv.extend(job.args.iter().cloned());
        let gj = GuestJob {
            argv,
            env: job.env.clone(),
            input_dir,
            output_dir: output_dir.clone(),
            resources: job.resources,
            log_limit_bytes: s.log_limit_bytes,
        };
        let run = run_on_thread(s.runtime.clone(), guest, gj, &job.job_id, cancel.clone()).await;
        report.usage.cpu_ms = run.cpu_ms;
        report.usage.peak_memory_bytes = run.peak_memory_bytes;
        let mut log = LogText::new(&run);
        let outcome = run.outcome.clone();
        if cancel.is_cancelled() {
            // Whatever the guest got to: nothing is uploaded after a cancel.
            if !matches!(outcome, Outcome::Cancelled { .. }) {
                log.note(&format!("cancelled as the guest ended ({}); outputs not stored", outcome_kind(&outcome)));
            }
            report.log = log.finish(s.log_limit_bytes);
            return Err(cancel.outcome());
        }
        if matches!(outcome, Outcome::Exited { .. }) {
            let mut stored = Stored { files: Vec::new(), bytes_out: 0, failure: None };
            let upload = upload_outputs(s, &job.output.url, &job.output.macaroon, &output_dir, &mut stored, &mut log);
            let finished = unless_cancelled(cancel, upload).await;
            report.usage.bytes_out = stored.bytes_out;
            report.outputs = stored.files;
            if let Err(cancelled) = finished {
                log.note(&format!("cancelled while storing outputs; {} stored before", report.outputs.len()));
                report.log = log.finish(s.log_limit_bytes);
                return Err(cancelled);
            }
            report.log = log.finish(s.log_limit_bytes);
            if let Some(reason) = stored.failure {
                return Err(Outcome::OutputFailed { reason });
            }
        } else {
            report.log = log.finish(s.log_limit_bytes);
        }
        report.outcome = outcome;
        Ok(())
    }

    /// The compiled module for `f`: memory, then `work_dir/modules/<hex>.wasm`, then `module_url`.
    async fn module(&self, f: &FunctionRef) -> Result<Guest, String> {
        let rt = &self.settings.runtime;
        if let Some(g) = rt.cached(&f.digest) {
            return Ok(g);
        }
        let lock = self.loading.lock().expect("loading lock poisoned").entry(f.digest.clone()).or_default().clone();
        let _held = lock.lock().await;
        if let Some(g) = rt.cached(&f.digest) {
            return Ok(g);
        }
        let path = self.settings.modules_dir.join(format!("{}.wasm", f.digest.hex()));
        let from_disk = match tokio::fs::read(&path).await {
            Ok(bytes) if Digest::of(&bytes) == f.digest => Some(bytes),
            Ok(_) => {
                tracing::warn!("cached module {} does not match its digest; fetching again", path.display());
                None
            }
            Err(_) => None,
        };
        let bytes = match from_disk {
            Some(b) => b,
            None => {
                let bytes = fetch_module(&self.settings.http, &f.module_url).await?;
                let actual = Digest::of(&bytes);
                if actual != f.digest {
                    return Err(ModuleError::DigestMismatch { expected: f.digest.clone(), actual }.to_string());
                }
                let tmp = path.with_extension(format!("wasm.tmp{}", std::process::id()));
                let stored = async {
                    tokio::fs::write(&tmp, &bytes).await?;
                    tokio::fs::rename(&tmp, &path).await
                }
                .await;
                if let Err(e) = stored {
                    tracing::warn!("failed to cache module at {}: {e}", path.display());
                    let _ = tokio::fs::remove_file(&tmp).await;
                }
                bytes
            }
        };
        let rt = rt.clone();
        let digest = f.digest.clone();
        let started = Instant::now();
        let guest = tokio::task::spawn_blocking(move || rt.load(&digest, &bytes))
            .await
            .map_err(|e| format!("compile task failed: {e}"))?
            .map_err(|e| e.to_string())?;
        tracing::info!(compile_ms = started.elapsed().as_millis() as u64, "module compiled");
        Ok(guest)
    }
}

/// `fut`, unless `cancel` fires first: then `fut` is dropped (a transfer in it is aborted, its
/// connection closed) and the job's outcome is [`Outcome::Cancelled`].
async fn unless_cancelled<T>(cancel: &CancelSignal, fut: impl Future<Output = T>) -> Result<T, Outcome> {
    tokio::select! {
        biased;
        _ = cancel.cancelled() => Err(cancel.outcome()),
        v = fut => Ok(v),
    }
}

/// Runs the guest on a thread of its own and waits for it without blocking the async runtime.
/// The wait is not cut short by a cancel: `cancel` stops the guest itself, so its usage is kept.
///
/// Except for a guest blocked in a host sleep, which nothing can interrupt (see
/// [`crate::runtime`]): past the wall-time cap plus [`ABANDON_GRACE`], or [`ABANDON_GRACE`]
/// after a cancel, the job stops waiting and reports without that thread's usage. The thread
/// ends by itself when its sleep returns (the epoch callback then stops the guest at once); its
/// job directory is gone by then and its result is dropped.
async fn run_on_thread(rt: Arc<Runtime>, guest: Guest, job: GuestJob, job_id: &str, cancel: CancelSignal) -> GuestRun {
    let limit_s = job.resources.runtime_s;
    let started = Instant::now();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let name: String = format!("ep-job-{}", job_id.chars().take(16).collect::<String>());
    let stop = cancel.clone();
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        let _ = tx.send(rt.run_job_with_cancel(&guest, &job, &stop));
    });
    let failed = |outcome: Outcome, note: Option<String>| GuestRun {
        outcome,
        stdout: Vec::new(),
        stderr: Vec::new(),
        log_dropped: 0,
        notes: note.into_iter().collect(),
        wall_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        cpu_ms: 0,
        peak_memory_bytes: 0,
    };
    if let Err(e) = spawned {
        return failed(
            Outcome::ModuleFailed { reason: format!("EP could not start a thread for the guest: {e}") },
            None,
        );
    }
    let cap = std::time::Duration::from_secs(limit_s).saturating_add(ABANDON_GRACE);
    let give_up = async {
        tokio::select! {
            _ = tokio::time::sleep(cap) => Outcome::TimeExceeded { limit_s },
            _ = async { cancel.cancelled().await; tokio::time::sleep(ABANDON_GRACE).await } => cancel.outcome(),
        }
    };
    tokio::select! {
        biased;
        ran = rx => ran.unwrap_or_else(|_| {
            failed(Outcome::ModuleFailed { reason: "EP internal error: the guest's thread panicked".into() }, None)
        }),
        outcome = give_up => {
            tracing::warn!("guest blocked in a host call did not stop; leaving its thread behind");
            let note = "the guest was blocked in a host call (a sleep) and did not stop; its output and usage are lost";
            failed(outcome, Some(note.into()))
        }
    }
}

/// The report's log: stdout, then stderr, then the EP's notes, bounded.
struct LogText {
    text: String,
}

impl LogText {
    fn new(run: &GuestRun) -> LogText {
        let mut text = String::from_utf8_lossy(&run.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&run.stderr));
        let mut log = LogText { text };
        if run.log_dropped > 0 {
            log.note(&format!("{} bytes of guest output dropped (log limit)", run.log_dropped));
        }
        for n in &run.notes {
            log.note(n);
        }
        log
    }

    fn note(&mut self, note: &str) {
        if !self.text.is_empty() && !self.text.ends_with('\n') {
            self.text.push('\n');
        }
        self.text.push_str("[htfaas-ep] ");
        self.text.push_str(note);
        self.text.push('\n');
    }

    /// The log, cut to `limit` bytes plus room for the EP's notes (at most 4 KiB more).
    fn finish(mut self, limit: usize) -> String {
        let max = limit.saturating_add(4096);
        if self.text.len() > max {
            let mut cut = max;
            while !self.text.is_char_boundary(cut) {
                cut -= 1;
            }
            self.text.truncate(cut);
            self.text.push_str("\n[htfaas-ep] log truncated\n");
        }
        self.text
    }
}

fn outcome_kind(o: &Outcome) -> &'static str {
    match o {
        Outcome::Exited { .. } => "exited",
        Outcome::Trapped { .. } => "trapped",
        Outcome::MemoryExceeded { .. } => "memory_exceeded",
        Outcome::TimeExceeded { .. } => "time_exceeded",
        Outcome::InputFailed { .. } => "input_failed",
        Outcome::OutputFailed { .. } => "output_failed",
        Outcome::ModuleFailed { .. } => "module_failed",
        Outcome::Cancelled { .. } => "cancelled",
        Outcome::FuelExhausted { .. } => "fuel_exhausted",
        Outcome::OutputExceeded { .. } => "output_exceeded",
    }
}

/// A name that is one path segment: not empty, not `.`/`..`, no `/`, `\` or NUL, ≤ 255 bytes.
pub(crate) fn is_clean_segment(name: &str) -> bool {
    !name.is_empty() && name.len() <= 255 && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

/// Directory name for a job: the id itself when it is plainly safe, its sha256 otherwise.
pub(crate) fn job_dir_name(job_id: &str) -> String {
    let plain = !job_id.is_empty()
        && job_id.len() <= 128
        && !job_id.starts_with('.')
        && job_id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if plain { job_id.to_owned() } else { format!("job-{}", hex::encode(Sha256::digest(job_id.as_bytes()))) }
}

async fn snippet(resp: reqwest::Response) -> String {
    let body = resp.bytes().await.unwrap_or_default();
    let cut = &body[..body.len().min(SNIPPET_BYTES)];
    String::from_utf8_lossy(cut).trim().to_owned()
}

/// `GET module_url` into memory, bounded.
async fn fetch_module(http: &reqwest::Client, url: &str) -> Result<Vec<u8>, String> {
    let resp = http.get(url).send().await.map_err(|e| format!("fetch {url}: {e}"))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(format!("fetch {url}: HTTP {status}: {}", snippet(resp).await));
    }
    let mut bytes = Vec::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| format!("fetch {url}: {e}"))?;
        if bytes.len() + chunk.len() > MAX_MODULE_BYTES {
            return Err(format!("fetch {url}: module larger than {MAX_MODULE_BYTES} bytes"));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// `GET url` with the bearer macaroon, streamed to `dest`, counting the bytes written into `n`
/// as they arrive (so a cancelled download still reports what it read).
async fn download(http: &reqwest::Client, url: &str, macaroon: &str, dest: &Path, n: &mut u64) -> Result<(), String> {
    let resp = http
        .get(url)
        .header(AUTHORIZATION, format!("Bearer {macaroon}"))
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(format!("GET {url}: HTTP {status}: {}", snippet(resp).await));
    }
    let mut file = tokio::fs::File::create(dest).await.map_err(|e| format!("create {}: {e}", dest.display()))?;
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| format!("GET {url}: {e}"))?;
        file.write_all(&chunk).await.map_err(|e| format!("write {}: {e}", dest.display()))?;
        *n += chunk.len() as u64;
    }
    file.flush().await.map_err(|e| format!("write {}: {e}", dest.display()))
}

/// What `upload_outputs` did.
struct Stored {
    files: Vec<OutputFile>,
    bytes_out: u64,
    failure: Option<String>,
}

/// PUTs every regular top-level file of `dir` to `{base}{name}`, streamed and hashed, recording
/// each file into `stored` once the storage accepted it (so an upload dropped midway, by a
/// cancel, leaves in `stored` exactly the files that are in the storage).
async fn upload_outputs(s: &Settings, base: &str, macaroon: &str, dir: &Path, stored: &mut Stored, log: &mut LogText) {
    let files = match list_outputs(dir, log).await {
        Ok(f) => f,
        Err(e) => {
            stored.failure = Some(format!("list outputs: {e}"));
            return;
        }
    };
    if files.len() > s.max_output_files {
        stored.failure = Some(format!("{} output files, more than the limit of {}", files.len(), s.max_output_files));
        return;
    }
    let total: u64 = files.iter().map(|(_, _, size)| size).sum();
    if total > s.max_output_bytes {
        stored.failure = Some(format!("{total} output bytes, more than the limit of {}", s.max_output_bytes));
        return;
    }
    for (name, path, size) in files {
        let url = format!("{base}{}", encode_segment(&name));
        match put_file(&s.http, &url, macaroon, &path, size).await {
            Ok(sha256) => {
                stored.bytes_out += size;
                stored.files.push(OutputFile { path: storage_path(&url), size, sha256 });
            }
            Err(e) => {
                stored.failure = Some(e);
                return;
            }
        }
    }
}

/// Regular top-level files of `dir`, sorted by name: (name, path, size). Everything else is
/// skipped with a note in the log.
async fn list_outputs(dir: &Path, log: &mut LogText) -> std::io::Result<Vec<(String, PathBuf, u64)>> {
    let mut out = Vec::new();
    let mut rd = tokio::fs::read_dir(dir).await?;
    while let Some(entry) = rd.next_entry().await? {
        let raw = entry.file_name();
        let Some(name) = raw.to_str().map(str::to_owned) else {
            log.note(&format!("skipped output {raw:?}: name is not UTF-8"));
            continue;
        };
        // symlink_metadata: a symlink is reported as such, never followed.
        let meta = tokio::fs::symlink_metadata(entry.path()).await?;
        if meta.file_type().is_symlink() {
            log.note(&format!("skipped output {name:?}: symlink"));
        } else if meta.is_dir() {
            log.note(&format!("skipped output {name:?}: directory (only top-level files are stored)"));
        } else if !meta.is_file() {
            log.note(&format!("skipped output {name:?}: not a regular file"));
        } else {
            out.push((name, entry.path(), meta.len()));
        }
    }
    out.sort();
    Ok(out)
}

/// PUTs `size` bytes of `path` to `url`, streamed, hashing on the way. Returns the sha256 hex.
async fn put_file(http: &reqwest::Client, url: &str, macaroon: &str, path: &Path, size: u64) -> Result<String, String> {
    use tokio::io::AsyncReadExt;
    let file = tokio::fs::File::open(path).await.map_err(|e| format!("open {}: {e}", path.display()))?;
    let hasher = Arc::new(Mutex::new(Sha256::new()));
    let h = hasher.clone();
    let stream = tokio_util::io::ReaderStream::with_capacity(file.take(size), 64 * 1024).map(move |chunk| {
        if let Ok(c) = &chunk {
            h.lock().expect("hasher lock poisoned").update(c);
        }
        chunk
    });
    let resp = http
        .put(url)
        .header(AUTHORIZATION, format!("Bearer {macaroon}"))
        .header(CONTENT_LENGTH, size)
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .map_err(|e| format!("PUT {url}: {e}"))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(format!("PUT {url}: HTTP {status}: {}", snippet(resp).await));
    }
    let digest = std::mem::take(&mut *hasher.lock().expect("hasher lock poisoned")).finalize();
    Ok(hex::encode(digest))
}

/// Percent-encodes a file name for use as one URL path segment.
fn encode_segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
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

    #[test]
    fn clean_segments() {
        for ok in ["a.dat", "x y", "..a", "a..b"] {
            assert!(is_clean_segment(ok), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "/a", "a\\b", "a\0b", &"x".repeat(256)] {
            assert!(!is_clean_segment(bad), "{bad:?}");
        }
    }

    #[test]
    fn job_dir_names_are_safe() {
        assert_eq!(job_dir_name("j-1_2.x"), "j-1_2.x");
        for weird in ["../x", ".hidden", "a/b", ""] {
            let d = job_dir_name(weird);
            assert!(d.starts_with("job-") && is_clean_segment(&d), "{weird:?} -> {d}");
        }
    }

    #[test]
    fn output_names_are_encoded_and_paths_decoded() {
        assert_eq!(encode_segment("a b#?.txt"), "a%20b%23%3F.txt");
        assert_eq!(storage_path("http://h:1/data/out/a%20b%23%3F.txt"), "/data/out/a b#?.txt");
        assert_eq!(storage_path("http://h/d/x%2"), "/d/x%2");
    }
}
