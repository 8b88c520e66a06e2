//! The wasm host: one [`Engine`] per EP, one [`Linker`] built at start, compiled modules cached
//! by digest, and [`Runtime::run_job`], which runs one guest in a fresh [`Store`].
//!
//! No network here: callers hand in verified bytes and prepared directories, so this module is
//! testable alone. A guest failing is an [`Outcome`], never an `Err`.
//!
//! How a run is bounded:
//! - memory: a [`ResourceLimiter`] caps linear memory at `resources.memory_mb` and records the
//!   peak; a refused growth makes the outcome [`Outcome::MemoryExceeded`] whatever the guest does
//!   next (Rust guests abort with `unreachable` when `memory.grow` fails);
//! - wall time: epoch interruption, one ticker thread per engine (every [`EPOCH_TICK`]); the
//!   store's epoch-deadline callback runs on every tick and traps the guest once
//!   `resources.runtime_s` has passed, and a timer around the whole call catches guests parked in
//!   an async host call (e.g. `poll_oneoff` on several clocks), which the epoch cannot interrupt;
//! - cancellation: a [`CancelSignal`] per run, checked by the same two mechanisms (the epoch
//!   callback traps a running guest at the next tick, the timer's `select!` drops a parked one),
//!   so a cancelled guest stops within one [`EPOCH_TICK`] and ends as [`Outcome::Cancelled`] with
//!   the usage so far;
//! - one gap: a `poll_oneoff` on exactly one relative clock (a Rust guest's `sleep`) blocks the
//!   run's thread in `std::thread::sleep` (wasmtime-wasi's fast path when blocking is allowed,
//!   which file I/O needs to be fast), so neither mechanism reaches it and [`Runtime::run_job`]
//!   returns only when the sleep ends (then the epoch stops the guest at once). The EP's job
//!   layer does not wait for it: it reports the job at its cap or cancel plus a grace and leaves
//!   the thread behind;
//! - log: stdout and stderr go to one in-memory buffer of `log_limit_bytes`; what does not fit
//!   is counted and dropped, never an error for the guest.
//!
//! Each run gets its own OS thread's worth of work: [`Runtime::run_job`] blocks, builds a
//! current-thread tokio runtime, and drives the async WASI host on it, so the guest's CPU time
//! is the thread's CPU time and async host calls stay cancellable.

use htfaas_functions::proto::Outcome;
use htfaas_functions::{Digest, Resources};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use wasmtime::{Config, Engine, InstancePre, Linker, Module, ResourceLimiter, Store, Trap, UpdateDeadline};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder};

/// Period of the engine's epoch ticker: the resolution of wall-time kills.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);
/// Extra time past the deadline before the host timer gives up on a guest stuck in a host call.
const HOST_CALL_GRACE: Duration = Duration::from_millis(500);
/// Largest table a guest may grow (elements); tables are host memory too.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;
/// Longest trap message kept in an [`Outcome::Trapped`].
const MAX_TRAP_MESSAGE: usize = 1024;
/// Longest cancel reason kept in an [`Outcome::Cancelled`] (the reason comes from the scheduler).
const MAX_CANCEL_REASON: usize = 1024;

/// A request to stop one job, shared by whoever may cancel it (the link, on the scheduler's
/// `Cancel`) and whoever runs it (the job's transfers, the guest's epoch callback and host
/// timer). Cheap to clone; cancelling twice keeps the first reason.
#[derive(Debug, Clone, Default)]
pub struct CancelSignal {
    token: CancellationToken,
    reason: Arc<OnceLock<String>>,
}

impl CancelSignal {
    /// A signal not cancelled yet.
    pub fn new() -> CancelSignal {
        CancelSignal::default()
    }

    /// Asks the job to stop, for `reason` (kept, bounded, for the report).
    pub fn cancel(&self, reason: &str) {
        let _ = self.reason.set(truncate(reason.to_owned(), MAX_CANCEL_REASON));
        self.token.cancel();
    }

    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Completes once the signal is cancelled. Cancel-safe.
    pub async fn cancelled(&self) {
        self.token.cancelled().await
    }

    /// The outcome of a job stopped by this signal: [`Outcome::Cancelled`] with its reason.
    pub fn outcome(&self) -> Outcome {
        Outcome::Cancelled { reason: self.reason.get().cloned().unwrap_or_default() }
    }
}

/// The error the epoch callback stops a cancelled guest with, told apart from a real trap.
#[derive(Debug, thiserror::Error)]
#[error("cancelled by the host")]
struct StoppedByCancel;

/// Why a module could not be made ready to run. Becomes [`Outcome::ModuleFailed`].
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    /// The bytes are not the ones the job named.
    #[error("digest mismatch: expected {expected}, got {actual}")]
    DigestMismatch {
        /// What the job named.
        expected: Digest,
        /// What the bytes hash to.
        actual: Digest,
    },
    /// Cranelift refused the bytes (not wasm, unsupported proposal, …).
    #[error("compile: {0}")]
    Compile(String),
    /// The module is not a WASI preview 1 command: missing `_start`, or imports we do not offer.
    #[error("not a WASI preview 1 command: {0}")]
    NotACommand(String),
}

/// A compiled, linked module, ready to instantiate. Cheap to clone.
#[derive(Clone)]
pub struct Guest {
    digest: Digest,
    pre: InstancePre<Host>,
}

impl Guest {
    /// The module's digest.
    pub fn digest(&self) -> &Digest {
        &self.digest
    }
}

/// One run, as the runtime needs it: everything already on local disk.
#[derive(Debug, Clone)]
pub struct GuestJob {
    /// The whole argv, `argv[0]` included (the EP passes `[function name, "/input/<name>", args…]`).
    pub argv: Vec<String>,
    /// The guest's whole environment; nothing is inherited.
    pub env: Vec<(String, String)>,
    /// Host directory preopened read-only at `/input`.
    pub input_dir: PathBuf,
    /// Host directory preopened read-write at `/output`.
    pub output_dir: PathBuf,
    /// Limits: memory cap (`memory_mb`) and wall-time cap (`runtime_s`); `cpus` is not enforced here.
    pub resources: Resources,
    /// Bytes of stdout + stderr kept.
    pub log_limit_bytes: usize,
}

/// What one run produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestRun {
    /// How the guest ended.
    pub outcome: Outcome,
    /// Captured stdout, bounded.
    pub stdout: Vec<u8>,
    /// Captured stderr, bounded (shares the bound with stdout).
    pub stderr: Vec<u8>,
    /// Bytes of stdout/stderr dropped because the log was full.
    pub log_dropped: u64,
    /// Host-side notes on the run (e.g. the full trap backtrace).
    pub notes: Vec<String>,
    /// Wall time of the run (instantiate + `_start`), ms.
    pub wall_ms: u64,
    /// CPU time of the thread that ran the guest, ms.
    pub cpu_ms: u64,
    /// Largest linear memory granted, bytes.
    pub peak_memory_bytes: u64,
}

/// Per-store state: the WASI context and the memory limiter.
pub struct Host {
    wasi: WasiP1Ctx,
    limits: MemoryLimiter,
}

/// Caps linear memory and remembers the peak and whether a growth was refused.
struct MemoryLimiter {
    cap_bytes: usize,
    peak_bytes: usize,
    exceeded: bool,
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.cap_bytes {
            self.exceeded = true;
            return Ok(false);
        }
        self.peak_bytes = self.peak_bytes.max(desired);
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

/// The EP's wasm engine: one per process.
pub struct Runtime {
    engine: Engine,
    linker: Linker<Host>,
    modules: Mutex<HashMap<Digest, Guest>>,
}

impl Runtime {
    /// Builds the engine (cranelift, epoch interruption, on-demand allocator), the WASI p1 linker,
    /// and starts the epoch ticker thread, which ends when the engine is dropped.
    pub fn new() -> anyhow::Result<Runtime> {
        let mut config = Config::new();
        config.epoch_interruption(true);
        // wasm32 memories are at most 4 GiB; the limiter enforces each job's cap below that.
        let engine = Engine::new(&config).map_err(anyhow::Error::from)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p1::add_to_linker_async(&mut linker, |h: &mut Host| &mut h.wasi).map_err(anyhow::Error::from)?;
        let weak = engine.weak();
        std::thread::Builder::new().name("ep-epoch".into()).spawn(move || {
            loop {
                std::thread::sleep(EPOCH_TICK);
                match weak.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => break,
                }
            }
        })?;
        Ok(Runtime { engine, linker, modules: Mutex::new(HashMap::new()) })
    }

    /// The engine (one per EP).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The compiled module for `digest`, if one is cached.
    pub fn cached(&self, digest: &Digest) -> Option<Guest> {
        self.modules.lock().expect("module cache lock poisoned").get(digest).cloned()
    }

    /// Number of compiled modules held in memory.
    pub fn cached_count(&self) -> usize {
        self.modules.lock().expect("module cache lock poisoned").len()
    }

    /// Verifies `bytes` against `digest`, compiles and links them, and caches the result.
    /// Blocking and CPU-heavy (tens to hundreds of ms): call it off the async threads.
    pub fn load(&self, digest: &Digest, bytes: &[u8]) -> Result<Guest, ModuleError> {
        if let Some(guest) = self.cached(digest) {
            return Ok(guest);
        }
        let actual = Digest::of(bytes);
        if &actual != digest {
            return Err(ModuleError::DigestMismatch { expected: digest.clone(), actual });
        }
        let module = Module::new(&self.engine, bytes).map_err(|e| ModuleError::Compile(format!("{e:#}")))?;
        let has_start = module.exports().any(|e| e.name() == "_start" && e.ty().func().is_some());
        if !has_start {
            return Err(ModuleError::NotACommand("no exported function `_start`".into()));
        }
        let pre = self.linker.instantiate_pre(&module).map_err(|e| ModuleError::NotACommand(format!("{e:#}")))?;
        let guest = Guest { digest: digest.clone(), pre };
        self.modules.lock().expect("module cache lock poisoned").insert(digest.clone(), guest.clone());
        Ok(guest)
    }

    /// Runs `guest` once, blocking the calling thread until it ends. Never fails: every way a
    /// run can end is an [`Outcome`]. Call it from a thread of its own (not an async worker).
    pub fn run_job(&self, guest: &Guest, job: &GuestJob) -> GuestRun {
        self.run_job_with_cancel(guest, job, &CancelSignal::new())
    }

    /// [`run_job`](Self::run_job), stopped early when `cancel` fires: the guest is interrupted
    /// within one [`EPOCH_TICK`] (at once, when parked in an async host call; when its single
    /// sleep ends, if blocked in one) and the run ends as [`Outcome::Cancelled`], with the CPU,
    /// wall time and memory used until then.
    pub fn run_job_with_cancel(&self, guest: &Guest, job: &GuestJob, cancel: &CancelSignal) -> GuestRun {
        let started = Instant::now();
        let cpu_before = thread_cpu_time();
        let log = LogBuffer::new(job.log_limit_bytes);
        let mut notes = Vec::new();
        let (outcome, peak) = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt.block_on(self.call(guest, job, cancel, &log, &mut notes)),
            Err(e) => (Outcome::ModuleFailed { reason: format!("start the guest's runtime: {e}") }, 0),
        };
        let cpu = thread_cpu_time().saturating_sub(cpu_before);
        let (stdout, stderr, log_dropped) = log.take();
        GuestRun {
            outcome,
            stdout,
            stderr,
            log_dropped,
            notes,
            wall_ms: millis(started.elapsed()),
            cpu_ms: millis(cpu),
            peak_memory_bytes: peak as u64,
        }
    }

    /// Instantiates and calls `_start`; returns the outcome and the peak memory.
    async fn call(
        &self,
        guest: &Guest,
        job: &GuestJob,
        cancel: &CancelSignal,
        log: &LogBuffer,
        notes: &mut Vec<String>,
    ) -> (Outcome, usize) {
        let cap_bytes = job.resources.memory_mb.saturating_mul(1 << 20);
        let limit_bytes = cap_bytes;
        let limit_s = job.resources.runtime_s;
        let wasi = match build_wasi(job, log) {
            Ok(w) => w,
            Err(e) => return (Outcome::ModuleFailed { reason: format!("prepare WASI context: {e:#}") }, 0),
        };
        let limits = MemoryLimiter {
            cap_bytes: usize::try_from(cap_bytes).unwrap_or(usize::MAX),
            peak_bytes: 0,
            exceeded: false,
        };
        let mut store = Store::new(&self.engine, Host { wasi, limits });
        store.limiter(|h| &mut h.limits);
        // The callback runs at every tick: it stops a cancelled guest, traps one past its wall
        // time (a limit too large for `Instant` means no epoch deadline; the timer still holds).
        let limit = Duration::from_secs(limit_s);
        let wall_deadline = Instant::now().checked_add(limit);
        let stop = cancel.clone();
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            if stop.is_cancelled() {
                return Err(wasmtime::Error::new(StoppedByCancel));
            }
            if wall_deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(UpdateDeadline::Interrupt);
            }
            Ok(UpdateDeadline::Continue(1))
        });

        let deadline = limit.saturating_add(HOST_CALL_GRACE);
        let result = {
            let run = async {
                let instance = guest.pre.instantiate_async(&mut store).await.map_err(Failure::Instantiate)?;
                let start = instance.get_typed_func::<(), ()>(&mut store, "_start").map_err(Failure::Instantiate)?;
                start.call_async(&mut store, ()).await.map_err(Failure::Run)
            };
            tokio::select! {
                biased;
                r = run => Ok(r),
                _ = cancel.cancelled() => Err(HostStop::Cancelled),
                _ = tokio::time::sleep(deadline) => Err(HostStop::Deadline),
            }
        };
        let limits = &store.data().limits;
        let peak = limits.peak_bytes;
        let cancelled = match &result {
            Err(HostStop::Cancelled) => {
                notes.push("guest was in a host call when the job was cancelled".into());
                true
            }
            Ok(Err(f)) => f.error().downcast_ref::<StoppedByCancel>().is_some(),
            _ => false,
        };
        if cancelled {
            if limits.exceeded {
                notes.push("a memory growth past the cap had been refused before the cancel".into());
            }
            return (cancel.outcome(), peak);
        }
        if limits.exceeded {
            if let Ok(Err(e)) = &result {
                notes.push(format!("after memory growth was refused: {}", e.message()));
            }
            return (Outcome::MemoryExceeded { limit_bytes }, peak);
        }
        let outcome = match result {
            Err(_) => {
                notes.push("guest was still in a host call at the deadline".into());
                Outcome::TimeExceeded { limit_s }
            }
            Ok(Ok(())) => Outcome::Exited { exit_code: 0 },
            Ok(Err(Failure::Instantiate(e))) => Outcome::ModuleFailed { reason: format!("instantiate: {e:#}") },
            Ok(Err(Failure::Run(e))) => {
                if let Some(exit) = e.downcast_ref::<I32Exit>() {
                    Outcome::Exited { exit_code: exit.0 }
                } else if e.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
                    Outcome::TimeExceeded { limit_s }
                } else {
                    notes.push(format!("{e:?}"));
                    let message = match e.downcast_ref::<Trap>() {
                        Some(trap) => trap.to_string(),
                        None => format!("{e:#}"),
                    };
                    Outcome::Trapped { message: truncate(message, MAX_TRAP_MESSAGE) }
                }
            }
        };
        (outcome, peak)
    }
}

/// Why the host stopped waiting for the guest (the guest itself did not end).
enum HostStop {
    /// The job's [`CancelSignal`] fired while the guest was parked in a host call.
    Cancelled,
    /// The wall time plus [`HOST_CALL_GRACE`] passed while the guest was parked in a host call.
    Deadline,
}

/// How `call` failed, before it is classified.
enum Failure {
    Instantiate(wasmtime::Error),
    Run(wasmtime::Error),
}

impl Failure {
    fn error(&self) -> &wasmtime::Error {
        match self {
            Failure::Instantiate(e) | Failure::Run(e) => e,
        }
    }

    fn message(&self) -> String {
        format!("{:#}", self.error())
    }
}

/// The guest's WASI context: argv, env exactly as given, two preopens, bounded stdio, no
/// network, no inherited anything.
///
/// File operations block the run's own thread (measured: reading 256 MiB takes 1.3 s this way,
/// 2.4 s through tokio's blocking pool). The price: wasmtime-wasi then serves a `poll_oneoff`
/// on exactly one relative clock (a Rust guest's `sleep`) with `std::thread::sleep`, which
/// neither the epoch nor the host timer can interrupt; see the module docs.
fn build_wasi(job: &GuestJob, log: &LogBuffer) -> anyhow::Result<WasiP1Ctx> {
    let mut b = WasiCtxBuilder::new();
    b.allow_blocking_current_thread(true)
        .args(&job.argv)
        .envs(&job.env)
        .stdout(log.pipe(Stream::Out))
        .stderr(log.pipe(Stream::Err));
    b.preopened_dir(&job.input_dir, "/input", FsPerms::ReadOnly).map_err(anyhow::Error::from)?;
    b.preopened_dir(&job.output_dir, "/output", FsPerms::ReadWrite).map_err(anyhow::Error::from)?;
    Ok(b.build_p1())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

/// CPU time consumed by the calling thread so far.
#[allow(unsafe_code)]
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable `timespec` that outlives the call, and
    // CLOCK_THREAD_CPUTIME_ID is a clock id every Linux supports; nothing else is touched.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(u64::try_from(ts.tv_sec).unwrap_or(0), u32::try_from(ts.tv_nsec).unwrap_or(0))
}

// ---------------------------------------------------------------------------------------------
// Bounded stdout/stderr.

/// Which guest stream a pipe feeds.
#[derive(Debug, Clone, Copy)]
enum Stream {
    Out,
    Err,
}

#[derive(Default)]
struct LogState {
    out: Vec<u8>,
    err: Vec<u8>,
    dropped: u64,
}

/// stdout and stderr of one run, sharing one byte budget. Unlike wasmtime-wasi's
/// `MemoryOutputPipe`, a full buffer never traps or errors the guest: extra bytes are counted
/// and dropped.
struct LogBuffer {
    cap: usize,
    state: Arc<Mutex<LogState>>,
}

impl LogBuffer {
    fn new(cap: usize) -> LogBuffer {
        LogBuffer { cap, state: Arc::default() }
    }

    fn pipe(&self, stream: Stream) -> LogPipe {
        LogPipe { cap: self.cap, stream, state: self.state.clone() }
    }

    fn take(&self) -> (Vec<u8>, Vec<u8>, u64) {
        let mut s = self.state.lock().expect("log lock poisoned");
        (std::mem::take(&mut s.out), std::mem::take(&mut s.err), s.dropped)
    }
}

#[derive(Clone)]
struct LogPipe {
    cap: usize,
    stream: Stream,
    state: Arc<Mutex<LogState>>,
}

impl LogPipe {
    fn push(&self, bytes: &[u8]) {
        let mut s = self.state.lock().expect("log lock poisoned");
        let room = self.cap.saturating_sub(s.out.len() + s.err.len());
        let take = room.min(bytes.len());
        match self.stream {
            Stream::Out => s.out.extend_from_slice(&bytes[..take]),
            Stream::Err => s.err.extend_from_slice(&bytes[..take]),
        }
        s.dropped += (bytes.len() - take) as u64;
    }
}

impl wasmtime_wasi::cli::IsTerminal for LogPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl wasmtime_wasi::cli::StdoutStream for LogPipe {
    fn p2_stream(&self) -> Box<dyn wasmtime_wasi::p2::OutputStream> {
        Box::new(self.clone())
    }
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl wasmtime_wasi::p2::Pollable for LogPipe {
    async fn ready(&mut self) {}
}

#[wasmtime_wasi::async_trait]
impl wasmtime_wasi::p2::OutputStream for LogPipe {
    fn write(&mut self, bytes: bytes::Bytes) -> wasmtime_wasi::p2::StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> wasmtime_wasi::p2::StreamResult<()> {
        Ok(())
    }
    fn check_write(&mut self) -> wasmtime_wasi::p2::StreamResult<usize> {
        Ok(64 * 1024)
    }
}

impl tokio::io::AsyncWrite for LogPipe {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.push(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}
