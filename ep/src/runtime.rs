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
//! - wall time: epoch interruption, one ticker thread per engine (every [`EPOCH_TICK`]), deadline
//!   `resources.runtime_s`, and a timer around the whole call for guests parked in a host call
//!   (e.g. a long `poll_oneoff` sleep), which the epoch cannot interrupt;
//! - log: stdout and stderr go to one in-memory buffer of `log_limit_bytes`; what does not fit
//!   is counted and dropped, never an error for the guest.
//!
//! Each run gets its own OS thread's worth of work: [`Runtime::run_job`] blocks, builds a
//! current-thread tokio runtime, and drives the async WASI host on it, so the guest's CPU time
//! is the thread's CPU time and host calls stay cancellable.

use htfaas_functions::proto::Outcome;
use htfaas_functions::{Digest, Resources};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use wasmtime::{Config, Engine, InstancePre, Linker, Module, ResourceLimiter, Store, Trap};
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
        let started = Instant::now();
        let cpu_before = thread_cpu_time();
        let log = LogBuffer::new(job.log_limit_bytes);
        let mut notes = Vec::new();
        let (outcome, peak) = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt.block_on(self.call(guest, job, &log, &mut notes)),
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
    async fn call(&self, guest: &Guest, job: &GuestJob, log: &LogBuffer, notes: &mut Vec<String>) -> (Outcome, usize) {
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
        let ticks = (limit_s.saturating_mul(1000) / EPOCH_TICK.as_millis() as u64).max(1);
        store.set_epoch_deadline(ticks);
        store.epoch_deadline_trap();

        let deadline = Duration::from_secs(limit_s).saturating_add(HOST_CALL_GRACE);
        let result = {
            let run = async {
                let instance = guest.pre.instantiate_async(&mut store).await.map_err(Failure::Instantiate)?;
                let start = instance.get_typed_func::<(), ()>(&mut store, "_start").map_err(Failure::Instantiate)?;
                start.call_async(&mut store, ()).await.map_err(Failure::Run)
            };
            tokio::time::timeout(deadline, run).await
        };
        let limits = &store.data().limits;
        let peak = limits.peak_bytes;
        if limits.exceeded {
            if let Ok(Err(e)) = &result {
                notes.push(format!("after memory growth was refused: {}", e.message()));
            }
            return (Outcome::MemoryExceeded { limit_bytes }, peak);
        }
        let outcome = match result {
            Err(_elapsed) => {
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

/// How `call` failed, before it is classified.
enum Failure {
    Instantiate(wasmtime::Error),
    Run(wasmtime::Error),
}

impl Failure {
    fn message(&self) -> String {
        match self {
            Failure::Instantiate(e) | Failure::Run(e) => format!("{e:#}"),
        }
    }
}

/// The guest's WASI context: argv, env exactly as given, two preopens, bounded stdio, no
/// network, no inherited anything.
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
