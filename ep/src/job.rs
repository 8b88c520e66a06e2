// Long because it holds one job's data path: fetch, stream in, watch the guest's output, stream out, with retries; kept whole until issue 19 splits it along its layers.
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
//!
//! Transfers: the module fetch, the input download (read macaroon) and each output upload
//! (write macaroon) stream between the network and the job's scratch directory, never holding
//! a file in memory. Each is tried up to [`ATTEMPTS`] times: a transient failure (connect error,
//! timeout, connection reset mid-body, HTTP 5xx or 429) is retried after a backoff of
//! [`BACKOFF_FIRST`] × 2^n with jitter, capped at [`BACKOFF_CAP`] (or the server's
//! `Retry-After` seconds, capped at [`RETRY_AFTER_CAP`]); any other 4xx fails the job at once
//! ([`Outcome::InputFailed`], [`Outcome::OutputFailed`], [`Outcome::ModuleFailed`]). A transfer
//! whose every try failed transiently ends the job as [`Outcome::StorageUnavailable`] instead:
//! the storage was away, not the job at fault, and the scheduler runs it again later. A
//! retried download starts again from scratch (the file is truncated) and a retried upload sends
//! the file again from its start. Failure reasons name the method, the URL without its query
//! and the status, never a macaroon. The backoff waits are inside the transfer futures, so a
//! cancel drops them like the transfers themselves. The retry count goes into the `job finished`
//! log line, not into the report.
//!
//! Origins: before anything else, the module, input and output URLs must be at one of the EP's
//! [`Settings::origins`]; a URL elsewhere fails the job with nothing fetched
//! ([`Outcome::ModuleFailed`], [`Outcome::InputFailed`], [`Outcome::OutputFailed`], naming the
//! URL's origin), and the HTTP client follows a redirect only to an allowed origin.
//!
//! Scratch bounds: each job is held to the EP's settings narrowed by what the job asks for (its
//! assignment's `limits`, its `disk_mb`). With a scratch bound ([`Settings::max_scratch_bytes`]
//! or `disk_mb`, the lower), an input larger than it fails the
//! job ([`Outcome::InputFailed`]) before its first byte is written when `Content-Length` says so,
//! else as soon as the download passes it. While the guest runs, a watcher walks its `/output`
//! every [`WATCH_EVERY`] and stops the guest (through a signal of the run's own, which the job's
//! cancel also feeds) once outputs pass the output file limit (files and directories count),
//! the output byte limit, or input plus outputs pass the scratch bound; such a
//! job, like one found past a limit after it exits, ends as [`Outcome::OutputExceeded`] and
//! uploads nothing. A guest outruns the watcher by at most one period of writes. A job's
//! instruction budget (`limits.instructions`) lowers the EP's fuel for its run.
//!
//! Pool slots: a guest that finds the instance pool full never started; the job tries again
//! every [`SLOT_RETRY`] for [`SLOT_WAIT`], then is returned to the scheduler (see
//! [`crate::slots`]), never failed.

use crate::Settings;
use crate::runtime::{CancelSignal, Guest, GuestJob, GuestRun, ModuleError, RunLimits, Runtime};
use crate::slots::{Abandoned, SLOT_RETRY, SLOT_WAIT, ThreadMark};
use futures_util::StreamExt;
use htfaas_functions::Digest;
use htfaas_functions::proto::{FunctionRef, JobAssignment, JobReport, Outcome, OutputFile, Usage};
use reqwest::header::{AUTHORIZATION, CONTENT_LENGTH};
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tracing::Instrument;

/// Largest module the EP downloads.
pub(crate) const MAX_MODULE_BYTES: usize = 256 << 20;
/// Longest body snippet quoted in a failure reason.
const SNIPPET_BYTES: usize = 256;
/// How long past its wall-time cap, or after a cancel, a job waits for its guest's thread before
/// leaving it behind (only a guest stuck in a blocking host call takes that long; others stop
/// within one epoch tick).
const ABANDON_GRACE: Duration = Duration::from_secs(2);
/// Tries per transfer (module, input, each output): the first and up to three retries.
pub(crate) const ATTEMPTS: u32 = 4;
/// Wait before the first retry; doubled for each next one, with jitter.
pub(crate) const BACKOFF_FIRST: Duration = Duration::from_millis(200);
/// Longest backoff between two tries.
pub(crate) const BACKOFF_CAP: Duration = Duration::from_secs(5);
/// Longest `Retry-After` honoured; a server asking for more is retried after this.
pub(crate) const RETRY_AFTER_CAP: Duration = Duration::from_secs(10);
/// How often the scratch watcher walks a running job's `/output`.
pub(crate) const WATCH_EVERY: Duration = Duration::from_millis(100);
/// Buffer between the network and the scratch files, each way.
const IO_BUFFER: usize = 1 << 20;

/// Shared state the job tasks use.
pub(crate) struct Jobs {
    pub(crate) settings: Arc<Settings>,
    /// One lock per digest, so a module is fetched and compiled once even when several jobs
    /// need it at the same moment.
    loading: Mutex<HashMap<Digest, Arc<tokio::sync::Mutex<()>>>>,
    /// Guest threads left behind (see [`run_on_thread`]), each holding a pool slot.
    abandoned: Abandoned,
}

impl Jobs {
    pub(crate) fn new(settings: Arc<Settings>) -> Jobs {
        Jobs { settings, loading: Mutex::new(HashMap::new()), abandoned: Abandoned::default() }
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
            let (mut report, tally) = self.execute_inner(&job, &cancel).await;
            let took = started.elapsed();
            report.usage.wall_ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
            self.settings.metrics.job_finished(&report.outcome, took);
            tracing::Span::current().record("outcome", outcome_kind(&report.outcome));
            tracing::info!(
                wall_ms = report.usage.wall_ms,
                cpu_ms = report.usage.cpu_ms,
                retries = tally.retries,
                bytes_in = report.usage.bytes_in,
                bytes_out = report.usage.bytes_out,
                input_ms = tally.input_ms,
                output_ms = tally.output_ms,
                "job finished: {}",
                {
                    let r = report.outcome.reason();
                    if r.is_empty() { "ok".to_owned() } else { r }
                }
            );
            report
        }
        .instrument(span)
        .await
    }

    async fn execute_inner(&self, job: &JobAssignment, cancel: &CancelSignal) -> (JobReport, Tally) {
        let mut report = JobReport {
            job_id: job.job_id.clone(),
            outcome: Outcome::Exited { exit_code: 0 },
            usage: Usage::default(),
            outputs: Vec::new(),
            log: String::new(),
        };
        let mut tally = Tally::default();
        let s = &self.settings;
        let dir = s.jobs_dir.join(job_dir_name(&job.job_id));
        let result = self.steps(job, &dir, &mut report, &mut tally, cancel).await;
        if let Err(outcome) = result {
            report.outcome = outcome;
        }
        if let Err(e) = tokio::fs::remove_dir_all(&dir).await
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("failed to remove job dir {}: {e}", dir.display());
        }
        (report, tally)
    }

    /// The steps; an `Err` is the job's final outcome.
    async fn steps(
        &self,
        job: &JobAssignment,
        dir: &Path,
        report: &mut JobReport,
        tally: &mut Tally,
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
        // Nothing is fetched from, or stored to, an origin the EP was not told to trust.
        s.origins.check("module_url", &job.function.module_url).map_err(|reason| Outcome::ModuleFailed { reason })?;
        s.origins.check("input url", &job.input.url).map_err(|reason| Outcome::InputFailed { reason })?;
        s.origins.check("output url", &job.output.url).map_err(|reason| Outcome::OutputFailed { reason })?;
        let mut limits = ScratchLimits::for_job(s, job);
        let guest = unless_cancelled(cancel, self.module(&job.function, &mut tally.retries)).await??;

        let input_dir = dir.join("input");
        let output_dir = dir.join("output");
        let _ = tokio::fs::remove_dir_all(dir).await;
        for d in [&input_dir, &output_dir] {
            tokio::fs::create_dir_all(d)
                .await
                .map_err(|e| Outcome::InputFailed { reason: format!("create job dir: {e}") })?;
        }
        let input_path = input_dir.join(&job.input.name);
        let started = Instant::now();
        let input = Transfer { http: &s.http, url: &job.input.url, macaroon: &job.input.macaroon };
        let fetched =
            download(&input, &input_path, limits.max_scratch_bytes, &mut report.usage.bytes_in, &mut tally.retries);
        let fetched = unless_cancelled(cancel, fetched).await;
        tally.input_ms = millis(started.elapsed());
        fetched?.map_err(|e| e.outcome(|reason| Outcome::InputFailed { reason }))?;
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
        limits.input_bytes = report.usage.bytes_in;
        let run_limits = RunLimits { instructions: job.limits.instructions };
        let waiting_since = Instant::now();
        s.metrics.instantiating();
        let (run, exceeded) = loop {
            // The guest's own stop signal: the job's cancel feeds it, and so does the watcher.
            let stop = CancelSignal::new();
            let mark = self.abandoned.mark();
            let run = run_on_thread(
                s.runtime.clone(),
                guest.clone(),
                gj.clone(),
                &job.job_id,
                stop.clone(),
                run_limits,
                mark,
            );
            let watch = watch_scratch(limits, output_dir.clone(), cancel, &stop);
            let mut run = std::pin::pin!(run);
            let mut watch = std::pin::pin!(watch);
            let mut exceeded = None;
            let mut watching = true;
            let ran = loop {
                tokio::select! {
                    ran = &mut run => break ran,
                    fired = &mut watch, if watching => {
                        watching = false;
                        exceeded = fired;
                    }
                }
            };
            if !ran.no_free_slot || cancel.is_cancelled() {
                break (ran, exceeded);
            }
            // A full pool is the EP's state, not the job's: wait a little for a slot, then
            // hand the job back (see `slots`).
            if waiting_since.elapsed() >= SLOT_WAIT {
                let why = match &ran.outcome {
                    Outcome::ModuleFailed { reason } => reason.clone(),
                    other => other.reason(),
                };
                tracing::warn!(abandoned = self.abandoned.count(), "{why}; returning the job to the scheduler");
                return Err(Outcome::Cancelled { reason: crate::slots::returned_reason(&why) });
            }
            unless_cancelled(cancel, tokio::time::sleep(SLOT_RETRY)).await?;
        };
        report.usage.cpu_ms = run.cpu_ms;
        report.usage.peak_memory_bytes = run.peak_memory_bytes;
        report.usage.instructions = run.instructions;
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
        if let Some(reason) = exceeded {
            log.note(&format!("guest stopped: {reason}; outputs not stored"));
            report.log = log.finish(s.log_limit_bytes);
            return Err(Outcome::OutputExceeded { reason });
        }
        if matches!(outcome, Outcome::Exited { .. }) {
            // The guest may have passed a limit after the watcher's last look.
            if let Some(reason) = limits.check_now(&output_dir).await {
                log.note(&format!("{reason}; outputs not stored"));
                report.log = log.finish(s.log_limit_bytes);
                return Err(Outcome::OutputExceeded { reason });
            }
            let mut stored = Stored { files: Vec::new(), bytes_out: 0, failure: None };
            let started = Instant::now();
            let output = Transfer { http: &s.http, url: &job.output.url, macaroon: &job.output.macaroon };
            let upload = upload_outputs(&limits, &output, &output_dir, &mut stored, &mut log, &mut tally.retries);
            let finished = unless_cancelled(cancel, upload).await;
            tally.output_ms = millis(started.elapsed());
            report.usage.bytes_out = stored.bytes_out;
            report.outputs = stored.files;
            if let Err(cancelled) = finished {
                log.note(&format!("cancelled while storing outputs; {} stored before", report.outputs.len()));
                report.log = log.finish(s.log_limit_bytes);
                return Err(cancelled);
            }
            report.log = log.finish(s.log_limit_bytes);
            if let Some(failed) = stored.failure {
                return Err(failed);
            }
        } else {
            report.log = log.finish(s.log_limit_bytes);
        }
        report.outcome = outcome;
        Ok(())
    }

    /// The compiled module for `f`: memory, then `work_dir/modules/<hex>.wasm`, then `module_url`.
    /// Fails with [`Outcome::ModuleFailed`], or [`Outcome::StorageUnavailable`] when its server
    /// stayed unavailable through every try.
    async fn module(&self, f: &FunctionRef, retries: &mut u32) -> Result<Guest, Outcome> {
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
                let bytes = fetch_module(&self.settings.http, &f.module_url, retries)
                    .await
                    .map_err(|e| e.outcome(|reason| Outcome::ModuleFailed { reason }))?;
                let actual = Digest::of(&bytes);
                if actual != f.digest {
                    let reason = ModuleError::DigestMismatch { expected: f.digest.clone(), actual }.to_string();
                    return Err(Outcome::ModuleFailed { reason });
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
            .map_err(|e| Outcome::ModuleFailed { reason: format!("compile task failed: {e}") })?
            .map_err(|e| Outcome::ModuleFailed { reason: e.to_string() })?;
        tracing::info!(compile_ms = millis(started.elapsed()), "module compiled");
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
/// A backstop for a guest stuck in a host call that ignores the deadline (no sleep does since
/// `crate::sleep`; a file operation on a hung filesystem could): past the wall-time cap plus
/// [`ABANDON_GRACE`], or [`ABANDON_GRACE`] after a cancel, the job stops waiting and reports
/// without that thread's usage. The thread, counted by `mark` while left behind (it holds a
/// pool slot), ends by itself when its call returns (the epoch callback then stops the guest at
/// once); its job directory is gone by then and its result is dropped.
async fn run_on_thread(
    rt: Arc<Runtime>,
    guest: Guest,
    job: GuestJob,
    job_id: &str,
    cancel: CancelSignal,
    limits: RunLimits,
    mark: ThreadMark,
) -> GuestRun {
    let limit_s = job.resources.runtime_s;
    let started = Instant::now();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let name: String = format!("ep-job-{}", job_id.chars().take(16).collect::<String>());
    let stop = cancel.clone();
    let on_thread = mark.clone();
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        let ran = rt.run_job_limited(&guest, &job, &stop, limits);
        on_thread.done();
        let _ = tx.send(ran);
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
        instructions: None,
        no_free_slot: false,
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
            mark.leave();
            tracing::warn!("guest blocked in a host call did not stop; leaving its thread behind");
            let note = "the guest was blocked in a host call and did not stop; its output and usage are lost";
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
        Outcome::StorageUnavailable { .. } => "storage_unavailable",
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

/// What one job's transfers did, for its `job finished` log line (not for the report).
#[derive(Debug, Default)]
struct Tally {
    /// Retries over all transfers (module, input, outputs).
    retries: u32,
    /// Time spent downloading the input, retries and backoff included.
    input_ms: u64,
    /// Time spent uploading outputs, retries and backoff included.
    output_ms: u64,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------------------------------------
// Transfers with retries.

/// One storage endpoint as a job uses it: client, URL and macaroon.
struct Transfer<'a> {
    http: &'a reqwest::Client,
    url: &'a str,
    macaroon: &'a str,
}

/// Why one try of a transfer failed.
#[derive(Debug)]
struct Failed {
    /// For the job's failure reason: method, URL without its query, what went wrong.
    reason: String,
    /// Worth another try: connection trouble, a timeout, HTTP 5xx or 429.
    transient: bool,
    /// The server's `Retry-After`, capped at [`RETRY_AFTER_CAP`].
    retry_after: Option<Duration>,
}

impl Failed {
    fn permanent(reason: String) -> Failed {
        Failed { reason, transient: false, retry_after: None }
    }

    fn transient(reason: String) -> Failed {
        Failed { reason, transient: true, retry_after: None }
    }

    /// A request that got no usable answer: transient, unless the request itself is malformed.
    fn request(what: &str, e: reqwest::Error) -> Failed {
        let permanent = e.is_builder() || e.is_redirect();
        let reason = format!("{what}: {}", describe(e));
        if permanent { Failed::permanent(reason) } else { Failed::transient(reason) }
    }

    /// An answer that is not a success: 5xx and 429 are transient, other statuses final.
    async fn status(what: &str, resp: reqwest::Response) -> Failed {
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
fn shown(url: &str) -> String {
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
struct GaveUp {
    /// The last try's reason (with the number of tries when there were several).
    reason: String,
    /// Every try failed transiently: the far side was unavailable rather than refusing.
    unavailable: bool,
}

impl GaveUp {
    /// The job's outcome: [`Outcome::StorageUnavailable`] when the far side stayed unavailable,
    /// else `refused(reason)`.
    fn outcome(self, refused: impl FnOnce(String) -> Outcome) -> Outcome {
        if self.unavailable { Outcome::StorageUnavailable { reason: self.reason } } else { refused(self.reason) }
    }
}

/// Counts the tries of one transfer and waits between them.
struct Retry<'a> {
    tries: u32,
    retries: &'a mut u32,
}

impl<'a> Retry<'a> {
    fn new(retries: &'a mut u32) -> Retry<'a> {
        Retry { tries: 0, retries }
    }

    /// After a failed try: waits and returns `Ok` when another try is due, or returns why the
    /// transfer failed for good. The wait is cancel-safe (a dropped future just stops waiting).
    async fn after(&mut self, failed: Failed) -> Result<(), GaveUp> {
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
async fn fetch_module(http: &reqwest::Client, url: &str, retries: &mut u32) -> Result<Vec<u8>, GaveUp> {
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

/// `GET` the input with the bearer macaroon, streamed to `dest`, with retries (each one starts
/// again from an empty file). `n` counts the bytes written by the current try as they arrive,
/// so a cancelled download still reports what it read. With `limit`, an input larger than it
/// fails at once, checked against `Content-Length` first, then as it arrives.
async fn download(
    from: &Transfer<'_>,
    dest: &Path,
    limit: Option<u64>,
    n: &mut u64,
    retries: &mut u32,
) -> Result<(), GaveUp> {
    let mut retry = Retry::new(retries);
    loop {
        *n = 0;
        match download_once(from, dest, limit, n).await {
            Ok(()) => return Ok(()),
            Err(failed) => retry.after(failed).await?,
        }
    }
}

async fn download_once(from: &Transfer<'_>, dest: &Path, limit: Option<u64>, n: &mut u64) -> Result<(), Failed> {
    let what = format!("GET {}", shown(from.url));
    let too_big = |size: String, limit: u64| {
        Failed::permanent(format!("input of {size} bytes exceeds the scratch limit of {limit} bytes"))
    };
    let resp = from
        .http
        .get(from.url)
        .header(AUTHORIZATION, format!("Bearer {}", from.macaroon))
        .send()
        .await
        .map_err(|e| Failed::request(&what, e))?;
    if !resp.status().is_success() {
        return Err(Failed::status(&what, resp).await);
    }
    if let (Some(limit), Some(len)) = (limit, resp.content_length())
        && len > limit
    {
        return Err(too_big(len.to_string(), limit));
    }
    let local = |e: std::io::Error| Failed::permanent(format!("write {}: {e}", dest.display()));
    let file = tokio::fs::File::create(dest).await.map_err(local)?;
    let mut file = tokio::io::BufWriter::with_capacity(IO_BUFFER, file);
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| Failed::request(&what, e))?;
        let after = *n + chunk.len() as u64;
        if let Some(limit) = limit
            && after > limit
        {
            return Err(too_big(format!("at least {after}"), limit));
        }
        file.write_all(&chunk).await.map_err(local)?;
        *n = after;
    }
    file.flush().await.map_err(local)
}

/// What `upload_outputs` did.
struct Stored {
    files: Vec<OutputFile>,
    bytes_out: u64,
    /// The job's outcome when storing failed or the outputs are past a limit.
    failure: Option<Outcome>,
}

/// PUTs every regular top-level file of `dir` to `{base}{name}`, streamed and hashed, recording
/// each file into `stored` once the storage accepted it (so an upload dropped midway, by a
/// cancel, leaves in `stored` exactly the files that are in the storage).
async fn upload_outputs(
    limits: &ScratchLimits,
    to: &Transfer<'_>,
    dir: &Path,
    stored: &mut Stored,
    log: &mut LogText,
    retries: &mut u32,
) {
    let files = match list_outputs(dir, log).await {
        Ok(f) => f,
        Err(e) => {
            stored.failure = Some(Outcome::OutputFailed { reason: format!("list outputs: {e}") });
            return;
        }
    };
    if files.len() > limits.max_files {
        let reason = format!("{} output files, more than the output file limit of {}", files.len(), limits.max_files);
        stored.failure = Some(Outcome::OutputExceeded { reason });
        return;
    }
    let total: u64 = files.iter().map(|(_, _, size)| size).sum();
    if total > limits.max_output_bytes {
        let reason = format!("{total} output bytes, more than the output byte limit of {}", limits.max_output_bytes);
        stored.failure = Some(Outcome::OutputExceeded { reason });
        return;
    }
    for (name, path, size) in files {
        let url = format!("{}{}", to.url, encode_segment(&name));
        let one = Transfer { http: to.http, url: &url, macaroon: to.macaroon };
        match put_file(&one, &path, size, retries).await {
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

/// PUTs `size` bytes of `path`, streamed and hashed, with retries (each sends the file again
/// from its start). Returns the sha256 hex of what the storage accepted.
async fn put_file(to: &Transfer<'_>, path: &Path, size: u64, retries: &mut u32) -> Result<String, GaveUp> {
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
    let file =
        tokio::fs::File::open(path).await.map_err(|e| Failed::permanent(format!("open {}: {e}", path.display())))?;
    let hasher = Arc::new(Mutex::new(Sha256::new()));
    let h = hasher.clone();
    let stream = tokio_util::io::ReaderStream::with_capacity(file.take(size), IO_BUFFER).map(move |chunk| {
        if let Ok(c) = &chunk {
            h.lock().unwrap_or_else(|p| p.into_inner()).update(c);
        }
        chunk
    });
    let resp = to
        .http
        .put(to.url)
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

// ---------------------------------------------------------------------------------------------
// Scratch bounds while the guest runs.

/// The limits a job's scratch directory is held to: the EP's settings, each narrowed by what
/// the job asks for (`limits` of its assignment, `disk_mb` of its resources).
#[derive(Debug, Clone, Copy)]
struct ScratchLimits {
    /// [`Settings::max_output_files`] or the job's `max_output_files`, the lower: entries of
    /// any kind anywhere under `/output`.
    max_files: usize,
    /// [`Settings::max_output_bytes`] or the job's `max_output_bytes`, the lower: bytes of
    /// regular files under `/output`.
    max_output_bytes: u64,
    /// [`Settings::max_scratch_bytes`] or the job's `disk_mb`, the lower: input plus outputs.
    max_scratch_bytes: Option<u64>,
    /// The input's size (it is read-only to the guest).
    input_bytes: u64,
}

/// The lower of two optional bounds (`None`: unbounded).
fn lower<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// What a walk of `/output` found; it stops counting once past the file limit.
#[derive(Debug, Clone, Copy, Default)]
struct Measured {
    entries: usize,
    bytes: u64,
}

impl ScratchLimits {
    /// The bounds of `job` on this EP; `input_bytes` is set once the input is in.
    fn for_job(s: &Settings, job: &JobAssignment) -> ScratchLimits {
        let asked_files = job.limits.max_output_files.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        let asked_disk = (job.resources.disk_mb > 0).then(|| job.resources.disk_mb.saturating_mul(1 << 20));
        ScratchLimits {
            max_files: lower(Some(s.max_output_files), asked_files).unwrap_or(s.max_output_files),
            max_output_bytes: lower(Some(s.max_output_bytes), job.limits.max_output_bytes)
                .unwrap_or(s.max_output_bytes),
            max_scratch_bytes: lower(s.max_scratch_bytes, asked_disk),
            input_bytes: 0,
        }
    }

    /// Why `m` is past a limit, if it is.
    fn exceeded(&self, m: Measured) -> Option<String> {
        if m.entries > self.max_files {
            return Some(format!(
                "more than {} files and directories in /output, past the output file limit of {}",
                self.max_files, self.max_files
            ));
        }
        if m.bytes > self.max_output_bytes {
            return Some(format!(
                "at least {} output bytes, more than the output byte limit of {}",
                m.bytes, self.max_output_bytes
            ));
        }
        let total = self.input_bytes.saturating_add(m.bytes);
        match self.max_scratch_bytes {
            Some(max) if total > max => Some(format!(
                "input and outputs hold at least {total} bytes, more than the scratch limit of {max} bytes"
            )),
            _ => None,
        }
    }

    /// Walks `dir` once (off the async threads) and says why it is past a limit, if it is.
    async fn check_now(&self, dir: &Path) -> Option<String> {
        let (dir, max_files) = (dir.to_owned(), self.max_files);
        match tokio::task::spawn_blocking(move || measure(&dir, max_files)).await {
            Ok(Ok(m)) => self.exceeded(m),
            Ok(Err(e)) => {
                tracing::warn!("failed to measure the job's outputs: {e}");
                None
            }
            Err(e) => {
                tracing::warn!("output measuring task failed: {e}");
                None
            }
        }
    }
}

/// Entries (any kind, any depth; symlinks not followed) and regular-file bytes under `dir`,
/// stopping once past `max_entries`, so a guest's flood of files keeps the walk short.
/// Blocking.
fn measure(dir: &Path, max_entries: usize) -> std::io::Result<Measured> {
    let mut m = Measured::default();
    let mut pending = vec![dir.to_owned()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            m.entries += 1;
            if m.entries > max_entries {
                return Ok(m);
            }
            // DirEntry::metadata does not follow symlinks.
            let meta = match entry.metadata() {
                Ok(meta) => meta,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue, // removed meanwhile
                Err(e) => return Err(e),
            };
            if meta.is_dir() {
                pending.push(entry.path());
            } else if meta.is_file() {
                m.bytes = m.bytes.saturating_add(meta.len());
            }
        }
    }
    Ok(m)
}

/// Watches a running guest: forwards the job's cancel to `stop` (returning `None`), and stops
/// the guest through `stop` once its scratch passes a limit (returning why). Checks every
/// [`WATCH_EVERY`]; never returns otherwise. Cancel-safe.
async fn watch_scratch(
    limits: ScratchLimits,
    output_dir: PathBuf,
    cancel: &CancelSignal,
    stop: &CancelSignal,
) -> Option<String> {
    let mut tick = tokio::time::interval(WATCH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                let reason = match cancel.outcome() {
                    Outcome::Cancelled { reason } => reason,
                    _ => String::new(),
                };
                stop.cancel(&reason);
                return None;
            }
            _ = tick.tick() => {}
        }
        if let Some(reason) = limits.check_now(&output_dir).await {
            tracing::info!("stopping the guest: {reason}");
            stop.cancel(&reason);
            return Some(reason);
        }
    }
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

    #[test]
    fn measure_counts_everything_and_stops_past_the_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a"), b"12345").expect("write");
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        std::fs::write(dir.path().join("sub/b"), b"123").expect("write");
        let m = measure(dir.path(), 10).expect("walk");
        assert_eq!((m.entries, m.bytes), (3, 8));
        assert_eq!(measure(dir.path(), 1).expect("walk").entries, 2);
        let limits = ScratchLimits { max_files: 2, max_output_bytes: 7, max_scratch_bytes: Some(9), input_bytes: 3 };
        let why = limits.exceeded(m).expect("past the file limit");
        assert_eq!(why, "more than 2 files and directories in /output, past the output file limit of 2");
        let why = limits.exceeded(Measured { entries: 1, bytes: 8 }).expect("past the byte limit");
        assert_eq!(why, "at least 8 output bytes, more than the output byte limit of 7");
        let why = limits.exceeded(Measured { entries: 1, bytes: 7 }).expect("past the scratch limit");
        assert_eq!(why, "input and outputs hold at least 10 bytes, more than the scratch limit of 9 bytes");
        assert_eq!(limits.exceeded(Measured { entries: 2, bytes: 6 }), None);
    }
}
