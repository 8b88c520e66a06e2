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
//! (write macaroon) stream between the network and the job's scratch directory; only small
//! files are held in memory whole (an input of at most 64 KiB, read and then written with the
//! job directory's making in one call; outputs of at most 64 KiB each and 1 MiB in all, read by
//! the one walk that also lists and measures `/output`), so a small job's file work is three
//! calls off the async threads, not one per step. Each is tried up to [`ATTEMPTS`](crate::transfer::ATTEMPTS) times: a transient failure (connect error,
//! timeout, connection reset mid-body, HTTP 5xx or 429) is retried after a backoff of
//! [`BACKOFF_FIRST`](crate::transfer::BACKOFF_FIRST) × 2^n with jitter, capped at [`BACKOFF_CAP`](crate::transfer::BACKOFF_CAP) (or the server's
//! `Retry-After` seconds, capped at [`RETRY_AFTER_CAP`](crate::transfer::RETRY_AFTER_CAP)); any other 4xx fails the job at once
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
//! every [`WATCH_EVERY`](crate::scratch::WATCH_EVERY) and stops the guest (through a signal of the run's own, which the job's
//! cancel also feeds) once outputs pass the output file limit (files and directories count),
//! the output byte limit, or input plus outputs pass the scratch bound; such a
//! job, like one found past a limit after it exits, ends as [`Outcome::OutputExceeded`] and
//! uploads nothing. A guest outruns the watcher by at most one period of writes. A job's
//! instruction budget (`limits.instructions`) lowers the EP's fuel for its run.
//!
//! No input: a job without one (a run on no file: a schedule's tick) fetches nothing but its
//! reference files; its `/input` holds only `ref/`, and its argv has no input path (the
//! function's name, then `args`). A handler, which serves one file per run, is not run on none.
//!
//! Credentials: the input fetch and the upload take the job's macaroons from its
//! [`Credentials`], which renews them first when they are about to expire, and a keeper task
//! renews them while the job runs ([`crate::renew`]).
//!
//! Failed runs' outputs: a success's outputs are stored in the output directory; a
//! run that failed on its own (a non-zero exit, a trap, a time, memory or instruction limit)
//! stores them as its assignment's `output.on_failure` says: nowhere (`discard`, the default),
//! under `<output dir>.quarantine/<job id>/` (`quarantine`; a failure to store them is noted in
//! the log and the run's own failure stays its outcome), or in the output directory for a
//! non-zero exit (`upload`, the behaviour before).
//!
//! Checkpoints: [`crate::checkpoint`] makes `/checkpoint` before the run, and stores, keeps or
//! deletes the job's checkpoint once its steps ended.
//!
//! Pool slots: a guest that finds the instance pool full never started; the job tries again
//! every [`SLOT_RETRY`] for [`SLOT_WAIT`], then is returned to the scheduler (see
//! [`crate::slots`]), never failed.

use crate::config::Settings;
use crate::counters::outcome_label;
use crate::native::host::NativeHost;
use crate::native::image::ImageRoot;
use crate::native_job;
use crate::renew::{Credentials, Renewer};
use crate::report_log::LogText;
use crate::runtime::millis;
use crate::runtime::{CancelSignal, Guest, GuestJob, ModuleError, Prepared, RunLimits};
use crate::scratch::{JobDir, ScratchLimits, SpareDirs, watch_scratch};
use crate::slots::{Abandoned, SLOT_RETRY, SLOT_WAIT};
use crate::transfer::{Stored, Transfer, collect_outputs, download, fetch_module, upload_outputs};
use futures_util::FutureExt as _;
use htfaas_functions::Digest;
use htfaas_functions::on_failure::{FailedOutputs, quarantine_dir};
use htfaas_functions::proto::{FunctionRef, JobAssignment, JobReport, NativeCode, Outcome, Usage};
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tracing::Instrument;

mod guest_thread;
mod threads;

/// What a job runs: a compiled wasm module, or a native command in an unpacked image.
enum Code<'a> {
    Wasm(Guest),
    Native(Arc<NativeHost>, &'a NativeCode, ImageRoot),
}

/// Shared state the job tasks use.
pub(crate) struct Jobs {
    pub(crate) settings: Arc<Settings>,
    /// One lock per digest, so a module is fetched and compiled once even when several jobs
    /// need it at the same moment.
    loading: Mutex<HashMap<Digest, Arc<tokio::sync::Mutex<()>>>>,
    /// Guest threads left behind (see [`guest_thread::run_on_thread`]), each holding a pool slot.
    abandoned: Abandoned,
    /// Emptied job directories, reused.
    spares: SpareDirs,
    /// The threads guests run on, kept between jobs.
    guest_threads: threads::GuestThreads,
    /// Asks the scheduler for fresh macaroons of a job ([`crate::renew`]).
    renewer: Renewer,
}

impl Jobs {
    pub(crate) fn new(settings: Arc<Settings>, renewer: Renewer) -> Jobs {
        let spares = SpareDirs::new(settings.jobs_dir.clone());
        Jobs {
            settings,
            loading: Mutex::new(HashMap::new()),
            abandoned: Abandoned::default(),
            spares,
            guest_threads: threads::GuestThreads::default(),
            renewer,
        }
    }

    /// Runs one assignment to its report; `cancel` stops it early ([`Outcome::Cancelled`]).
    pub(crate) async fn execute(&self, job: JobAssignment, cancel: CancelSignal) -> JobReport {
        // The attempt's span in the event's trace, when the scheduler sent one that parses.
        let trace = job.traceparent.as_deref().and_then(|t| htfaas_functions::trace::TraceParent::parse(t).ok());
        let span = tracing::info_span!(
            "ep.invoke",
            trace_id = trace.map(|t| tracing::field::display(t.trace_id_hex())),
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
            report.usage.phases = htfaas_functions::proto::Phases {
                module_ms: tally.module_ms,
                compile_ms: tally.compile_ms,
                input_ms: tally.input_ms,
                run_ms: tally.run_ms,
                output_ms: tally.output_ms,
            };
            self.settings.metrics.job_finished(&report.outcome, took);
            tracing::Span::current().record("outcome", outcome_label(&report.outcome));
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
            input_sha256: None,
            job_id: job.job_id.clone(),
            outcome: Outcome::Exited { exit_code: 0 },
            usage: Usage::default(),
            outputs: Vec::new(),
            log: String::new(),
            refs: Vec::new(),
            checkpoint: None,
        };
        let mut tally = Tally::default();
        let s = &self.settings;
        let dir = s.jobs_dir.join(job_dir_name(&job.job_id));
        // Made with the input's first write ([`download`]).
        let job_dir = self.spares.claim(&dir);
        let busy = job_dir.lock();
        // The job's macaroons, renewed while it needs them by a keeper polled in this task
        // beside the steps (no task of its own to spawn, wake and abort per job); it stops
        // when the steps end.
        let credentials = Credentials::new(job, &self.renewer);
        let keeper = async {
            credentials.clone().keep().await;
            std::future::pending::<std::convert::Infallible>().await
        };
        let steps = self.steps(job, job_dir, &credentials, &mut report, &mut tally, cancel);
        let result = tokio::select! {
            result = steps => result,
            never = keeper => match never {},
        };
        if let Err(outcome) = result {
            report.outcome = outcome;
        }
        let macaroon = if job.checkpoint.is_some() { credentials.checkpoint().await } else { String::new() };
        let ends = cancel.ends();
        crate::checkpoint::settle(s, job, &macaroon, &dir, ends, &mut report, &mut tally.retries).await;
        // A native job's input may still be open in a process of its sandbox: its inode is
        // not kept for the next job.
        let keep_input = job.function.native.is_none();
        self.spares.give_back(dir, !tally.guest_left, keep_input, Some(busy)).await;
        (report, tally)
    }

    /// The steps; an `Err` is the job's final outcome.
    async fn steps(
        &self,
        job: &JobAssignment,
        job_dir: JobDir,
        credentials: &Credentials,
        report: &mut JobReport,
        tally: &mut Tally,
        cancel: &CancelSignal,
    ) -> Result<(), Outcome> {
        let s = &self.settings;
        if job.resources.memory_mb > s.slots.memory_mb || job.resources.runtime_s > s.slots.runtime_s {
            tracing::warn!("assignment exceeds the advertised slots; enforcing the job's own limits");
        }
        if let Some(input) = &job.input
            && !is_clean_segment(&input.name)
        {
            return Err(Outcome::InputFailed {
                reason: format!("input name {:?} is not one clean path segment", input.name),
            });
        }
        if job.input.is_none() && job.function.native.as_ref().is_some_and(|n| n.handler) {
            return Err(Outcome::InputFailed { reason: "a handler serves one file per run: this job has none".into() });
        }
        // Nothing is fetched from, or stored to, an origin the EP was not told to trust.
        s.origins
            .check("module_url", &job.function.module_url)
            .map_err(|e| Outcome::ModuleFailed { reason: e.to_string() })?;
        if let Some(input) = &job.input {
            s.origins.check("input url", &input.url).map_err(|e| Outcome::InputFailed { reason: e.to_string() })?;
        }
        s.origins.check("output url", &job.output.url).map_err(|e| Outcome::OutputFailed { reason: e.to_string() })?;
        let mut limits = ScratchLimits::for_job(s, job);
        let code = match &job.function.native {
            None => Code::Wasm(unless_cancelled(cancel, self.module(&job.function, tally)).await??),
            Some(native) => {
                let Some(host) = s.native.clone() else {
                    return Err(Outcome::ModuleFailed {
                        reason: "the job is native and this EP offers no native runtime".into(),
                    });
                };
                let root = unless_cancelled(cancel, self.image(&host, &job.function, tally)).await??;
                Code::Native(host, native, root)
            }
        };

        let input_dir = job_dir.path().join("input");
        let output_dir = job_dir.path().join("output");
        let scratch = job_dir.path().to_owned();
        let started = Instant::now();
        match &job.input {
            Some(spec) => {
                let read = unless_cancelled(cancel, credentials.input()).await?;
                let input = Transfer {
                    http: &s.http,
                    url: &spec.url,
                    macaroon: &read,
                    traceparent: job.traceparent.as_deref(),
                };
                let input_path = input_dir.join(&spec.name);
                let fetched = download(
                    &input,
                    &input_path,
                    limits.max_scratch_bytes,
                    &mut report.usage.bytes_in,
                    &mut tally.retries,
                    Some(job_dir),
                );
                let fetched = unless_cancelled(cancel, fetched).await;
                tally.input_ms = millis(started.elapsed());
                let sha256 = fetched?.map_err(|e| e.outcome(|reason| Outcome::InputFailed { reason }))?;
                // A re-run reads the bytes of the run it re-derives, or runs nothing.
                if let Some(expected) = &spec.sha256
                    && !expected.eq_ignore_ascii_case(&sha256)
                {
                    report.input_sha256 = Some(sha256.clone());
                    return Err(htfaas_functions::proto::rerun::input_changed(&sha256, expected));
                }
                report.input_sha256 = Some(sha256);
            }
            // No input: the job directory is made empty, for the reference files alone.
            None => {
                let made = crate::transfer::off_thread(move || job_dir.make_then(None, || Ok(()))).await;
                let made = made.and_then(|first| first);
                made.map_err(|e| Outcome::InputFailed { reason: format!("create the job directory: {e}") })?;
            }
        }
        let (bytes_in, retries) = (&mut report.usage.bytes_in, &mut tally.retries);
        let sources = crate::refs::Sources {
            http: &s.http,
            origins: &s.origins,
            cache: s.ref_cache.as_ref(),
            metrics: &s.metrics,
            traceparent: job.traceparent.as_deref(),
        };
        // The reference files with their read macaroons as they stand now (renewed when due).
        let mut current = job.refs.clone();
        if !current.is_empty() {
            for (r, m) in current.iter_mut().zip(credentials.refs().await) {
                r.macaroon = m;
            }
        }
        let refs = crate::refs::fetch(&sources, &current, &input_dir, limits.max_scratch_bytes, bytes_in, retries);
        report.refs = unless_cancelled(cancel, refs).await??;
        if cancel.is_cancelled() {
            return Err(cancel.outcome());
        }
        limits.input_bytes = report.usage.bytes_in;
        let macaroon = if job.checkpoint.is_some() { credentials.checkpoint().await } else { String::new() };
        let checkpoint_dir =
            crate::checkpoint::restore(s, job, &macaroon, &scratch, report, &mut tally.retries, cancel).await?;

        let mut argv = Vec::with_capacity(2 + job.args.len());
        argv.push(job.function.name.clone());
        argv.extend(job.input.as_ref().map(|i| format!("/input/{}", i.name)));
        argv.extend(job.args.iter().cloned());
        let gj = GuestJob {
            argv,
            // The secrets join the guest's environment here and nowhere else.
            env: job.env.iter().chain(job.secrets.0.iter()).cloned().collect(),
            input_dir,
            output_dir: output_dir.clone(),
            checkpoint_dir,
            resources: job.resources,
            log_limit_bytes: s.log_limit_bytes,
        };
        let run_limits = RunLimits { instructions: job.limits.instructions };
        let waiting_since = Instant::now();
        s.metrics.instantiating();
        // The control group of a native run: one per job on this host.
        let group = format!("job-{}", job_dir_name(&job.job_id));
        let (run, exceeded, walked) = loop {
            // The guest's own stop signal: the job's cancel feeds it, and so does the watcher.
            let stop = CancelSignal::new();
            let mark = self.abandoned.mark();
            let watched = mark.clone();
            let run = match &code {
                Code::Wasm(guest) => futures_util::future::Either::Left(guest_thread::run_on_thread(
                    &self.guest_threads,
                    s.runtime.clone(),
                    guest.clone(),
                    gj.clone(),
                    stop.clone(),
                    (run_limits, limits.max_files),
                    mark,
                )),
                Code::Native(host, native, root) if native.handler => {
                    futures_util::future::Either::Right(futures_util::future::Either::Left(
                        native_job::run_handler(host, &job.function, native, root, &gj, limits, cancel, &stop)
                            .map(|ran| (ran, None)),
                    ))
                }
                Code::Native(host, native, root) => {
                    futures_util::future::Either::Right(futures_util::future::Either::Right(
                        native_job::run(host, &group, native, root, &gj, cancel, &stop).map(|ran| (ran, None)),
                    ))
                }
            };
            // A handler watches its own `/output`, and forwards the cancel itself.
            let handler = matches!(&code, Code::Native(_, native, _) if native.handler);
            let watch = async {
                if handler {
                    std::future::pending().await
                } else {
                    watch_scratch(limits, output_dir.clone(), gj.checkpoint_dir.clone(), cancel, &stop).await
                }
            };
            let mut run = std::pin::pin!(run);
            let mut watch = std::pin::pin!(watch);
            let mut exceeded = None;
            let mut watching = true;
            let (ran, walked) = loop {
                tokio::select! {
                    ran = &mut run => break ran,
                    fired = &mut watch, if watching => {
                        watching = false;
                        exceeded = fired;
                    }
                }
            };
            tally.guest_left |= watched.is_left();
            // A handler watches its own `/output` and says so in its outcome.
            if let Outcome::OutputExceeded { reason } = &ran.outcome {
                exceeded.get_or_insert_with(|| reason.clone());
            }
            if !ran.no_free_slot || cancel.is_cancelled() {
                break (ran, exceeded, walked);
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
        tally.run_ms = millis(waiting_since.elapsed());
        report.usage.cpu_ms = run.cpu_ms;
        report.usage.peak_memory_bytes = run.peak_memory_bytes;
        report.usage.instructions = run.instructions;
        let mut log = LogText::new(&run);
        let outcome = crate::checkpoint::exit_outcome(job.checkpoint.as_ref(), run.outcome.clone());
        if cancel.is_cancelled() {
            // Whatever the guest got to: nothing is uploaded after a cancel.
            if !matches!(outcome, Outcome::Cancelled { .. }) {
                log.note(&format!("cancelled as the guest ended ({}); outputs not stored", outcome_label(&outcome)));
            }
            report.log = log.finish(s.log_limit_bytes);
            // A run's own `Cancelled` says what a native guest did with its SIGTERM.
            return Err(if matches!(outcome, Outcome::Cancelled { .. }) { outcome } else { cancel.outcome() });
        }
        if let Some(reason) = exceeded {
            log.note(&format!("guest stopped: {reason}; outputs not stored"));
            report.log = log.finish(s.log_limit_bytes);
            return Err(Outcome::OutputExceeded { reason });
        }
        let keep = stored_where(&outcome, job.output.on_failure);
        let store_to = match keep {
            Keep::Outputs => Some(job.output.url.clone()),
            Keep::Quarantine if job_dir_name(&job.job_id) == job.job_id => {
                Some(format!("{}{}", job.output.url, quarantine_dir(&job.job_id)))
            }
            Keep::Quarantine => {
                log.note("the run failed; its outputs are not quarantined: the job id is no plain path segment");
                None
            }
            Keep::Nothing => {
                // Said only when there was something to discard: a failed run that wrote
                // nothing keeps its log as the guest left it.
                if outcome.is_guest_failure() && wrote_any(&output_dir).await {
                    log.note("the run failed; its outputs are discarded (outputs.on_failure: discard)");
                }
                None
            }
        };
        let quarantine = keep == Keep::Quarantine;
        if let Some(url) = store_to {
            // The guest may have passed a limit after the watcher's last look. One walk
            // measures, lists and reads the small outputs: a wasm guest's thread made it as
            // its run ended, else it is made now.
            let outputs = match walked {
                Some(walked) => walked,
                None => collect_outputs(&output_dir, limits.max_files).await,
            };
            if let Some(reason) = outputs.exceeded(&limits) {
                log.note(&format!("{reason}; outputs not stored"));
                report.log = log.finish(s.log_limit_bytes);
                if quarantine {
                    // The run's own failure stays its outcome.
                    report.outcome = outcome;
                    return Ok(());
                }
                return Err(Outcome::OutputExceeded { reason });
            }
            let mut stored = Stored { files: Vec::new(), bytes_out: 0, failure: None };
            let started = Instant::now();
            let write = match unless_cancelled(cancel, credentials.output()).await {
                Ok(write) => write,
                Err(cancelled) => {
                    log.note("cancelled before storing outputs; none stored");
                    report.log = log.finish(s.log_limit_bytes);
                    return Err(cancelled);
                }
            };
            let output =
                Transfer { http: &s.http, url: &url, macaroon: &write, traceparent: job.traceparent.as_deref() };
            let upload = upload_outputs(&limits, &output, outputs, &mut stored, &mut log, &mut tally.retries);
            let finished = unless_cancelled(cancel, upload).await;
            tally.output_ms = millis(started.elapsed());
            report.usage.bytes_out = stored.bytes_out;
            report.outputs = stored.files;
            if let Err(cancelled) = finished {
                log.note(&format!("cancelled while storing outputs; {} stored before", report.outputs.len()));
                report.log = log.finish(s.log_limit_bytes);
                return Err(cancelled);
            }
            match (stored.failure, quarantine) {
                (Some(failed), false) => {
                    report.log = log.finish(s.log_limit_bytes);
                    return Err(failed);
                }
                (Some(failed), true) => log.note(&format!(
                    "the run failed; quarantining its outputs failed too ({}), {} stored before",
                    failed.reason(),
                    report.outputs.len()
                )),
                (None, true) => log.note(&format!(
                    "the run failed; {} outputs quarantined under {}",
                    report.outputs.len(),
                    quarantine_dir(&job.job_id)
                )),
                (None, false) => {}
            }
        }
        report.log = log.finish(s.log_limit_bytes);
        report.outcome = outcome;
        Ok(())
    }

    /// The unpacked image of native `f`: the host's cache (or a site directory), else fetched,
    /// checked and unpacked once ([`native_job::fetch_image`]) under the digest's lock, which
    /// other jobs needing it wait for. Its fetch and unpacking count as `module_ms`.
    async fn image(&self, host: &Arc<NativeHost>, f: &FunctionRef, tally: &mut Tally) -> Result<ImageRoot, Outcome> {
        if let Some(root) = host.images.get(&f.digest) {
            return Ok(root);
        }
        let started = Instant::now();
        let lock = self.lock_of(&f.digest);
        let _held = lock.lock().await;
        if let Some(root) = host.images.get(&f.digest) {
            tally.module_ms = millis(started.elapsed());
            return Ok(root);
        }
        let s = &self.settings;
        let root = native_job::fetch_image(host, &s.http, &s.work_dir, f, &mut tally.retries).await;
        tally.module_ms = millis(started.elapsed());
        root
    }

    /// The compiled module for `f`: memory, then `work_dir/modules/<hex>.wasm`, then `module_url`.
    /// Fails with [`Outcome::ModuleFailed`], or [`Outcome::StorageUnavailable`] when its server
    /// stayed unavailable through every try. Waits for a compile of the same module already
    /// under way (a job's or a warm's) instead of starting another.
    /// Its phases (`module_ms`, `compile_ms`) and retries go to `tally`; waiting for another
    /// job's compile of the same module counts as compiling.
    async fn module(&self, f: &FunctionRef, tally: &mut Tally) -> Result<Guest, Outcome> {
        let rt = &self.settings.runtime;
        if let Some(g) = rt.cached(&f.digest) {
            return Ok(g);
        }
        let waited = Instant::now();
        let lock = self.lock_of(&f.digest);
        let _held = lock.lock().await;
        if let Some(g) = rt.cached(&f.digest) {
            tally.compile_ms = millis(waited.elapsed());
            return Ok(g);
        }
        let fetching = Instant::now();
        let bytes = self.module_bytes(f, &mut tally.retries).await.map_err(ModuleMiss::outcome)?;
        tally.module_ms = millis(fetching.elapsed());
        let rt = rt.clone();
        let digest = f.digest.clone();
        let started = Instant::now();
        let guest = tokio::task::spawn_blocking(move || rt.load(&digest, &bytes))
            .await
            .map_err(|e| Outcome::ModuleFailed { reason: format!("compile task failed: {e}") })?
            .map_err(|e| Outcome::ModuleFailed { reason: e.to_string() })?;
        tally.compile_ms = millis(started.elapsed());
        tracing::info!(compile_ms = tally.compile_ms, "module ready");
        Ok(guest)
    }

    /// Compiles `digest` ahead of its first job: fetched and verified as a job's
    /// module ([`Jobs::module_bytes`]; the caller checked `module_url`'s origin), compiled and
    /// written to the disk cache ([`crate::runtime::Runtime::prepare`]), under the same per-module lock as a
    /// job, so that a job needing it meanwhile waits for this compile.
    pub(crate) async fn warm(&self, digest: &Digest, module_url: &str) -> Result<Prepared, ModuleMiss> {
        let f = FunctionRef {
            name: String::new(),
            version: 0,
            digest: digest.clone(),
            module_url: module_url.into(),
            native: None,
        };
        let rt = &self.settings.runtime;
        if rt.cached(digest).is_some() {
            return Ok(Prepared::Ready);
        }
        let lock = self.lock_of(digest);
        let _held = lock.lock().await;
        let bytes = self.module_bytes(&f, &mut 0).await?;
        let rt = rt.clone();
        let digest = digest.clone();
        tokio::task::spawn_blocking(move || rt.prepare(&digest, &bytes))
            .await
            .map_err(|e| ModuleMiss::Failed(Outcome::ModuleFailed { reason: format!("compile task failed: {e}") }))?
            .map_err(|e| match e {
                ModuleError::DigestMismatch { .. } => ModuleMiss::Digest(e.to_string()),
                other => ModuleMiss::Failed(Outcome::ModuleFailed { reason: other.to_string() }),
            })
    }

    /// The per-module lock: one fetch and compile of a module at a time.
    fn lock_of(&self, digest: &Digest) -> Arc<tokio::sync::Mutex<()>> {
        self.loading.lock().expect("loading lock poisoned").entry(digest.clone()).or_default().clone()
    }

    /// The bytes of `f`'s module, verified against its digest: `work_dir/modules/<hex>.wasm`,
    /// else fetched from `module_url` (and kept there). Call with the module's lock held.
    async fn module_bytes(&self, f: &FunctionRef, retries: &mut u32) -> Result<Vec<u8>, ModuleMiss> {
        let path = self.settings.modules_dir.join(format!("{}.wasm", f.digest.hex()));
        match tokio::fs::read(&path).await {
            Ok(bytes) if Digest::of(&bytes) == f.digest => return Ok(bytes),
            Ok(_) => tracing::warn!("cached module {} does not match its digest; fetching again", path.display()),
            Err(_) => {}
        }
        let bytes = fetch_module(&self.settings.http, &f.module_url, retries)
            .await
            .map_err(|e| ModuleMiss::Failed(e.outcome(|reason| Outcome::ModuleFailed { reason })))?;
        let actual = Digest::of(&bytes);
        if actual != f.digest {
            return Err(ModuleMiss::Digest(
                ModuleError::DigestMismatch { expected: f.digest.clone(), actual }.to_string(),
            ));
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
        Ok(bytes)
    }
}

/// Why a module could not be had.
#[derive(Debug)]
pub(crate) enum ModuleMiss {
    /// The bytes do not hash to the digest named (the message says both).
    Digest(String),
    /// Anything else, as the job's outcome.
    Failed(Outcome),
}

impl ModuleMiss {
    /// The job's outcome.
    pub(crate) fn outcome(self) -> Outcome {
        match self {
            ModuleMiss::Digest(reason) => Outcome::ModuleFailed { reason },
            ModuleMiss::Failed(o) => o,
        }
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

/// A name that is one path segment: not empty, not `.`/`..`, no `/`, `\` or NUL, ≤ 255 bytes.
pub(crate) fn is_clean_segment(name: &str) -> bool {
    !name.is_empty() && name.len() <= 255 && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

/// Where a run's outputs go ([`stored_where`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// Into the output directory.
    Outputs,
    /// Into `<output dir>.quarantine/<job id>/`.
    Quarantine,
    /// Nowhere.
    Nothing,
}

/// Where the outputs of a run that ended with `outcome` go, under the job's `on_failure`: a
/// success's into the output directory; a failed run's (a non-zero exit, a trap, a limit)
/// nowhere, into quarantine, or — `upload`, for a non-zero exit only, the old default —
/// into the output directory; any other end's nowhere.
fn stored_where(outcome: &Outcome, on_failure: FailedOutputs) -> Keep {
    match (outcome, on_failure) {
        (o, _) if o.is_success() => Keep::Outputs,
        (o, FailedOutputs::Quarantine) if o.is_guest_failure() => Keep::Quarantine,
        (Outcome::Exited { .. }, FailedOutputs::Upload) => Keep::Outputs,
        _ => Keep::Nothing,
    }
}

/// Directory name for a job: the id itself when it is plainly safe, its sha256 otherwise.
pub(crate) fn job_dir_name(job_id: &str) -> String {
    let plain = !job_id.is_empty()
        && job_id.len() <= 128
        && !job_id.starts_with('.')
        && job_id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if plain { job_id.to_owned() } else { format!("job-{}", hex::encode(Sha256::digest(job_id.as_bytes()))) }
}

/// Whether the guest left anything in its output directory.
async fn wrote_any(output_dir: &Path) -> bool {
    match tokio::fs::read_dir(output_dir).await {
        Ok(mut entries) => matches!(entries.next_entry().await, Ok(Some(_))),
        Err(_) => false,
    }
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
    /// Time spent fetching the module (gateway or disk cache), and compiling or loading it.
    module_ms: u64,
    compile_ms: u64,
    /// The guest's run, waiting for a free instance included.
    run_ms: u64,
    /// A guest thread was left behind: it may still hold the job's directory, which must
    /// then never serve another job.
    guest_left: bool,
}

#[cfg(test)]
mod tests;
