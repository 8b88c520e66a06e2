//! The wasm host: one [`Engine`] per EP, one [`Linker`] built at start, compiled modules cached
//! by digest (in memory, and optionally on disk), and [`Runtime::run_job`], which runs one guest
//! in a fresh [`Store`]. Long because one run's bounds are enforced together in its one `call`.
//!
//! No network here: callers hand in verified bytes and prepared directories, so this module is
//! testable alone. A guest failing is an [`Outcome`], never an `Err`.
//!
//! Two kinds of guest, told apart by the binary's header ([`GuestKind::of`]): a core module run
//! as a WASI preview 1 command (`_start`; Rust `wasm32-wasip1`, C with wasi-libc, Go, Zig), and
//! a component run as a WASI preview 2 command (`wasi:cli/run`; Rust `wasm32-wasip2`, and any
//! toolchain that makes components). Both get the same [`Host`] (one WASI context: the same
//! preopens, argv, environment and log pipes), the same engine, pool, limits and disk cache.
//! A preview 2 guest also has the socket interfaces linked, but its context grants no address
//! and no name lookup, so every connect, bind and lookup is refused (tested by the sandbox probe).
//!
//! How a run starts fast:
//! - instances, linear memories, tables and the fiber stacks guests run on come from wasmtime's
//!   pooling allocator: [`RuntimeOptions::max_instances`] slots (with
//!   [`RuntimeOptions::core_instances_per_slot`] core instances and
//!   [`RuntimeOptions::tables_per_slot`] tables each, as a component needs several), each memory reserved up to
//!   [`RuntimeOptions::max_memory_bytes`] (with the usual 4 GiB reservation, so bounds checks stay
//!   elided). Reserving the pool needs a lot of address space (about 4 GiB per slot); where that
//!   is refused (`ulimit -v`, as some batch systems set) the runtime warns and allocates on demand;
//! - a module is compiled once per digest and kept in memory as an [`InstancePre`]; with
//!   [`RuntimeOptions::cache_dir`] the compiled artifact is also kept on disk, so a restarted EP
//!   loads it instead of compiling it again (measured on a 4 MB module: 20 ms against 3–5 s;
//!   `cargo bench -p htfaas-ep --bench instantiate`). See "Artifacts on disk".
//!
//! How a run is bounded:
//! - memory: a [`ResourceLimiter`] caps linear memory at `resources.memory_mb` (and at most
//!   [`RuntimeOptions::max_memory_bytes`]) and records the peak; a refused growth makes the
//!   outcome [`Outcome::MemoryExceeded`] whatever the guest does next (Rust guests abort with
//!   `unreachable` when `memory.grow` fails). The limiter is asked before the pool, so the pool's
//!   own cap never decides an outcome;
//! - wall time: epoch interruption, one ticker thread per engine (every [`EPOCH_TICK`]); the
//!   store's epoch-deadline callback runs on every tick and traps the guest once
//!   `resources.runtime_s` has passed, and a timer around the whole call catches guests parked in
//!   an async host call (e.g. `poll_oneoff` on several clocks), which the epoch cannot interrupt;
//! - stack: [`MAX_WASM_STACK`] bytes of native stack for wasm frames; a guest recursing past it
//!   traps, and ends as [`Outcome::Trapped`] saying "call stack exhausted"; the runtime goes on;
//! - instructions, when asked: with [`RuntimeOptions::fuel`] every store gets that much fuel
//!   (about one unit per wasm instruction), a run that spends it ends as
//!   [`Outcome::FuelExhausted`], and [`GuestRun::instructions`] says how much each run used.
//!   Without it the engine does not meter at all (metering costs speed on tight loops);
//! - cancellation: a [`CancelSignal`] per run, checked by the same two mechanisms (the epoch
//!   callback traps a running guest at the next tick, the timer's `select!` drops a parked one),
//!   so a cancelled guest stops within one [`EPOCH_TICK`] and ends as [`Outcome::Cancelled`] with
//!   the usage so far;
//! - sleeps: a `poll_oneoff` on exactly one relative clock (a Rust guest's `sleep`), which
//!   wasmtime-wasi would serve with `std::thread::sleep` (its fast path when blocking is
//!   allowed, which file I/O needs to be fast), is served by the EP's own `poll_oneoff` on a
//!   tokio timer instead (`crate::sleep`), so a sleeping guest is parked like any other and the
//!   timer's `select!` drops it at the deadline or on a cancel, freeing its pool slot;
//! - open resources: the WASI context's table holds at most
//!   [`RuntimeOptions::max_open_resources`] entries (open files and directories, streams,
//!   pollables); a guest past it traps with a message naming the limit;
//! - compile time: [`Runtime::load`] compiles under [`RuntimeOptions::compile_timeout`]
//!   (`crate::compile`);
//! - log: stdout and stderr go to one in-memory buffer of `log_limit_bytes`; what does not fit
//!   is counted and dropped, never an error for the guest.
//!
//! Each run gets its own OS thread's worth of work: [`Runtime::run_job`] blocks, builds a
//! current-thread tokio runtime, and drives the async WASI host on it, so the guest's CPU time
//! is the thread's CPU time and async host calls stay cancellable.
//!
//! Artifacts on disk: `<cache_dir>/<digest hex>.<engine tag>.cwasm` (the tag: 16 hex digits
//! of a hash of the engine's compatibility hash, so EPs with different engine settings can share
//! a directory) holds [`ARTIFACT_MAGIC`], a 32-byte
//! HMAC-SHA256 tag, then the bytes of [`Module::serialize`](wasmtime::Module::serialize). The tag
//! covers the digest, the engine's [`Engine::precompile_compatibility_hash`] and the artifact bytes, keyed by 32 random
//! bytes in `<cache_dir>/key` (mode 0600, made on first use). Deserializing is `unsafe` (the
//! bytes become machine code), so an artifact is used only if its tag verifies: one this EP's
//! key wrote for this very engine configuration. A tampered, truncated, foreign-keyed or
//! other-engine artifact is logged, counted ([`Runtime::rejected_from_disk_count`]), and the
//! module compiled again and rewritten. The wasm bytes are checked against the digest first,
//! whatever is on disk. Files are written to a temporary name, fsynced, then renamed.

pub use crate::artifacts::ARTIFACT_MAGIC;
use crate::artifacts::{ArtifactCache, deserialize_verified};
use crate::code::Code;
pub use crate::code::{GuestKind, ModuleError};
use crate::guest_log::{LogBuffer, Stream};
pub use crate::options::{
    DEFAULT_COMPILE_TIMEOUT, DEFAULT_CORE_INSTANCES_PER_SLOT, DEFAULT_MAX_CACHED_MODULES, DEFAULT_MAX_DISK_ARTIFACTS,
    DEFAULT_MAX_OPEN_RESOURCES, DEFAULT_TABLES_PER_SLOT, EPOCH_TICK, MAX_WASM_STACK, RuntimeOptions, WASM32_MAX_MEMORY,
};
use crate::options::{HOST_CALL_GRACE, MAX_CANCEL_REASON, MAX_TABLE_ELEMENTS, MAX_TRAP_MESSAGE, build_engine};
use htfaas_functions::proto::Outcome;
use htfaas_functions::{Digest, Resources};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use wasmtime::{Engine, InstancePre, Linker, ResourceLimiter, Store, Trap, UpdateDeadline};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::bindings::CommandPre;
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder, WasiCtxView, WasiView};

thread_local! {
    /// The runtime a thread's guest runs are driven by, kept between runs on the same thread
    /// (the EP keeps its guest threads), unless a run left a task in it.
    static GUEST_RUNTIME: std::cell::RefCell<Option<tokio::runtime::Runtime>> = const { std::cell::RefCell::new(None) };
}

/// A request to stop one job, shared by whoever may cancel it (the link, on the scheduler's
/// `Cancel`) and whoever runs it (the job's transfers, the guest's epoch callback and host
/// timer). Cheap to clone; cancelling twice keeps the first reason.
#[derive(Debug, Clone, Default)]
pub struct CancelSignal {
    token: CancellationToken,
    reason: Arc<OnceLock<String>>,
    /// The scheduler said the job ends for good (removed): its checkpoint goes.
    ends: Arc<std::sync::atomic::AtomicBool>,
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

    /// [`cancel`](Self::cancel), telling too whether the job `ends` for good (the scheduler
    /// removed it) or may run again (held).
    pub fn cancel_for(&self, reason: &str, ends: bool) {
        if ends {
            self.ends.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        self.cancel(reason);
    }

    /// Whether the scheduler said the job ends for good ([`cancel_for`](Self::cancel_for)).
    pub fn ends(&self) -> bool {
        self.ends.load(std::sync::atomic::Ordering::Relaxed)
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

/// A compiled, linked module or component, ready to instantiate. Cheap to clone.
#[derive(Clone)]
pub struct Guest {
    digest: Digest,
    linked: Linked,
}

/// The instantiate-ready form of each guest kind.
#[derive(Clone)]
enum Linked {
    Module(InstancePre<Host>),
    Component(CommandPre<Host>),
}

impl Guest {
    /// The module's digest.
    pub fn digest(&self) -> &Digest {
        &self.digest
    }

    /// Whether it is a preview 1 module or a preview 2 component.
    pub fn kind(&self) -> GuestKind {
        match self.linked {
            Linked::Module(_) => GuestKind::Module,
            Linked::Component(_) => GuestKind::Component,
        }
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
    /// Host directory preopened read-write at `/checkpoint` (after `/output`), for a job that
    /// keeps checkpoints; none: the guest has no such directory.
    pub checkpoint_dir: Option<PathBuf>,
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
    /// Fuel the guest used (about one unit per wasm instruction), when the runtime meters
    /// ([`RuntimeOptions::fuel`]); `None` otherwise.
    pub instructions: Option<u64>,
    /// The pool had no free instance slot, so the guest never started (the outcome is then
    /// [`Outcome::ModuleFailed`] saying so). Not the job's fault: see `crate::slots`.
    pub no_free_slot: bool,
}

impl GuestRun {
    /// A run that ended as `outcome` before the guest did anything, after `wall_ms`: no output,
    /// no usage.
    pub fn unrun(outcome: Outcome, wall_ms: u64) -> GuestRun {
        GuestRun {
            outcome,
            stdout: Vec::new(),
            stderr: Vec::new(),
            log_dropped: 0,
            notes: Vec::new(),
            wall_ms,
            cpu_ms: 0,
            peak_memory_bytes: 0,
            instructions: None,
            no_free_slot: false,
        }
    }
}

/// What [`Runtime::prepare`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prepared {
    /// Nothing to do: the code was in memory, or its artifact on disk.
    Ready,
    /// Compiled now (and its artifact written).
    Compiled,
}

/// Limits of one run narrower than the runtime's own (a function asking for less).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunLimits {
    /// Instruction budget of this run, when lower than [`RuntimeOptions::fuel`]; ignored when
    /// the runtime does not meter.
    pub instructions: Option<u64>,
}

/// Per-store state: the WASI context and the memory limiter.
///
/// The one context serves both kinds of guest: preview 1 modules through its adapter, preview
/// 2 components through [`WasiView`] (same preopens, arguments, environment and log pipes).
pub struct Host {
    wasi: WasiP1Ctx,
    limits: MemoryLimiter,
}

impl WasiView for Host {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        self.wasi.ctx()
    }
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

/// Compiled modules in memory, least recently used dropped first past `cap`.
struct ModuleCache {
    map: HashMap<Digest, (Guest, u64)>,
    /// Bumped on every use: a module's last use orders eviction.
    clock: u64,
    cap: usize,
}

impl ModuleCache {
    fn new(cap: usize) -> ModuleCache {
        ModuleCache { map: HashMap::new(), clock: 0, cap: cap.max(1) }
    }

    fn get(&mut self, digest: &Digest) -> Option<Guest> {
        self.clock += 1;
        let clock = self.clock;
        self.map.get_mut(digest).map(|(guest, used)| {
            *used = clock;
            guest.clone()
        })
    }

    fn insert(&mut self, digest: Digest, guest: Guest) {
        self.clock += 1;
        while self.map.len() >= self.cap && !self.map.contains_key(&digest) {
            let Some(oldest) = self.map.iter().min_by_key(|(_, (_, used))| *used).map(|(d, _)| d.clone()) else {
                break;
            };
            self.map.remove(&oldest);
            tracing::debug!(digest = %oldest.short(), "dropped a compiled module from memory (cache full)");
        }
        self.map.insert(digest, (guest, self.clock));
    }
}

/// The EP's wasm engine: one per process.
pub struct Runtime {
    engine: Engine,
    linker: Linker<Host>,
    component_linker: wasmtime::component::Linker<Host>,
    modules: Mutex<ModuleCache>,
    /// Fuel per run ([`RuntimeOptions::fuel`]); `Some` exactly when the engine meters.
    fuel: Option<u64>,
    /// Cap on any run's memory ([`RuntimeOptions::max_memory_bytes`], at most 4 GiB).
    max_memory_bytes: u64,
    /// Whether the engine got its pool (false: asked for none, or the pool was refused).
    pooling: bool,
    /// Compiled artifacts on disk, when [`RuntimeOptions::cache_dir`] is set.
    disk: Option<ArtifactCache>,
    /// Modules compiled by this runtime (each costs ~0.1–1 s).
    compiled: AtomicU64,
    /// Modules deserialized from verified artifacts on disk.
    loaded_from_disk: AtomicU64,
    /// Artifacts found on disk and refused (bad tag, unreadable, refused by wasmtime).
    rejected_from_disk: AtomicU64,
    /// [`RuntimeOptions::max_open_resources`].
    max_open_resources: usize,
    /// Compilation under [`RuntimeOptions::compile_timeout`], and the modules it refused.
    compiler: crate::compile::Compiler,
}

impl Runtime {
    /// A runtime with [`RuntimeOptions::default`]: pooling allocator, no disk cache, no fuel.
    pub fn new() -> anyhow::Result<Runtime> {
        Runtime::with_options(RuntimeOptions::default())
    }

    /// Builds the engine (cranelift, epoch interruption, fuel if asked, pooling allocator unless
    /// refused), the WASI preview 1 and preview 2 linkers, opens the artifact cache, and starts the epoch ticker
    /// thread, which ends when the engine is dropped.
    pub fn with_options(options: RuntimeOptions) -> anyhow::Result<Runtime> {
        let max_memory_bytes = options.max_memory_bytes.min(WASM32_MAX_MEMORY);
        let (engine, pooling) = build_engine(&options, max_memory_bytes)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p1::add_to_linker_async(&mut linker, |h: &mut Host| &mut h.wasi).map_err(anyhow::Error::from)?;
        // A guest's sleep is a tokio timer the run can drop, never a thread sleep.
        crate::sleep::add_to_linker(&mut linker, |h: &mut Host| &mut h.wasi).map_err(anyhow::Error::from)?;
        let mut component_linker = wasmtime::component::Linker::new(&engine);
        // Includes `wasi:cli/exit.exit-with-code` (stable since WASI 0.2.12), so a preview 2
        // guest's `std::process::exit(n)` reaches the job record as exit code n.
        wasmtime_wasi::p2::add_to_linker_async(&mut component_linker).map_err(anyhow::Error::from)?;
        let disk = match &options.cache_dir {
            Some(dir) => Some(ArtifactCache::open(dir, &engine, options.max_disk_artifacts)?),
            None => None,
        };
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
        Ok(Runtime {
            engine,
            linker,
            component_linker,
            modules: Mutex::new(ModuleCache::new(options.max_cached_modules)),
            fuel: options.fuel,
            max_memory_bytes,
            pooling,
            disk,
            compiled: AtomicU64::new(0),
            loaded_from_disk: AtomicU64::new(0),
            rejected_from_disk: AtomicU64::new(0),
            max_open_resources: options.max_open_resources.max(1),
            compiler: crate::compile::Compiler::new(options.compile_timeout),
        })
    }

    /// The engine (one per EP).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Whether instances come from the pooling allocator (false when it was not asked for or
    /// could not be reserved).
    pub fn is_pooling(&self) -> bool {
        self.pooling
    }

    /// The fuel each run gets, when the runtime meters.
    pub fn fuel(&self) -> Option<u64> {
        self.fuel
    }

    /// The compiled module for `digest`, if one is cached.
    pub fn cached(&self, digest: &Digest) -> Option<Guest> {
        self.modules.lock().expect("module cache lock poisoned").get(digest)
    }

    /// Number of compiled modules held in memory.
    pub fn cached_count(&self) -> usize {
        self.modules.lock().expect("module cache lock poisoned").map.len()
    }

    /// Modules this runtime compiled with cranelift.
    pub fn compiled_count(&self) -> u64 {
        self.compiled.load(Ordering::Relaxed)
    }

    /// Modules this runtime deserialized from verified artifacts on disk.
    pub fn loaded_from_disk_count(&self) -> u64 {
        self.loaded_from_disk.load(Ordering::Relaxed)
    }

    /// Where the compiled artifact of `digest` is (or would be) kept on disk, when the runtime
    /// has a [`RuntimeOptions::cache_dir`].
    pub fn artifact_path(&self, digest: &Digest) -> Option<PathBuf> {
        self.disk.as_ref().map(|disk| disk.path(digest))
    }

    /// Artifacts on disk this runtime refused (and compiled again instead).
    pub fn rejected_from_disk_count(&self) -> u64 {
        self.rejected_from_disk.load(Ordering::Relaxed)
    }

    /// Verifies `bytes` against `digest`, then takes the compiled module from memory, from a
    /// verified artifact on disk, or compiles it (and writes the artifact); links it and caches
    /// the result. Blocking; compiling is CPU-heavy (tens to hundreds of ms per MB), so call it
    /// off the async threads.
    pub fn load(&self, digest: &Digest, bytes: &[u8]) -> Result<Guest, ModuleError> {
        if let Some(guest) = self.cached(digest) {
            return Ok(guest);
        }
        let actual = Digest::of(bytes);
        if &actual != digest {
            return Err(ModuleError::DigestMismatch { expected: digest.clone(), actual });
        }
        let kind = GuestKind::of(bytes);
        let (code, compiled) = match self.disk.as_ref().and_then(|disk| self.load_from_disk(disk, digest, kind)) {
            Some(code) => (code, false),
            None => {
                let code = self.compiler.compile(&self.engine, digest, bytes, kind)?;
                self.compiled.fetch_add(1, Ordering::Relaxed);
                (code, true)
            }
        };
        let linked = self.link(&code)?;
        if compiled {
            self.store(digest, &code);
        }
        let guest = Guest { digest: digest.clone(), linked };
        self.modules.lock().expect("module cache lock poisoned").insert(digest.clone(), guest.clone());
        Ok(guest)
    }

    /// Makes `digest`'s compiled code ready for its first run, ahead of it: compiles
    /// it unless it is in memory or its artifact is on disk, checks that it is a WASI command,
    /// and writes the artifact, without keeping the code in memory (a job loads it from disk in
    /// milliseconds; a Python component's code is ~36 MB). Without a disk cache it is kept in
    /// memory instead. Blocking, like [`load`](Self::load), under the same compile time limit.
    pub fn prepare(&self, digest: &Digest, bytes: &[u8]) -> Result<Prepared, ModuleError> {
        if self.cached(digest).is_some() {
            return Ok(Prepared::Ready);
        }
        let Some(disk) = &self.disk else {
            self.load(digest, bytes)?;
            return Ok(Prepared::Compiled);
        };
        if disk.path(digest).is_file() {
            return Ok(Prepared::Ready);
        }
        let actual = Digest::of(bytes);
        if &actual != digest {
            return Err(ModuleError::DigestMismatch { expected: digest.clone(), actual });
        }
        let code = self.compiler.compile(&self.engine, digest, bytes, GuestKind::of(bytes))?;
        self.compiled.fetch_add(1, Ordering::Relaxed);
        self.link(&code)?;
        self.store(digest, &code);
        Ok(Prepared::Compiled)
    }

    /// Links compiled code: a module must export `_start`, a component `wasi:cli/run`, and
    /// import only what the linkers offer.
    fn link(&self, code: &Code) -> Result<Linked, ModuleError> {
        Ok(match code {
            Code::Module(module) => {
                let has_start = module.exports().any(|e| e.name() == "_start" && e.ty().func().is_some());
                if !has_start {
                    return Err(ModuleError::NotACommand("no exported function `_start`".into()));
                }
                let pre =
                    self.linker.instantiate_pre(module).map_err(|e| ModuleError::NotACommand(format!("{e:#}")))?;
                Linked::Module(pre)
            }
            Code::Component(component) => {
                let pre = self
                    .component_linker
                    .instantiate_pre(component)
                    .map_err(|e| ModuleError::NotACommand(format!("{e:#}")))?;
                let pre = CommandPre::new(pre)
                    .map_err(|e| ModuleError::NotACommand(format!("no export `wasi:cli/run`: {e:#}")))?;
                Linked::Component(pre)
            }
        })
    }

    /// Writes the artifact of freshly compiled `code` to the disk cache, if there is one; a
    /// failure only costs a compile after the next restart, so it is logged.
    fn store(&self, digest: &Digest, code: &Code) {
        let Some(disk) = &self.disk else { return };
        match code.serialize() {
            Ok(artifact) => {
                if let Err(e) = disk.write(digest, &artifact) {
                    tracing::warn!(digest = %digest.short(), "failed to store the compiled artifact: {e}");
                }
            }
            Err(e) => tracing::warn!(digest = %digest.short(), "failed to serialize the compiled module: {e:#}"),
        }
    }

    /// The compiled code from `disk`, if a verified artifact for `digest` is there and wasmtime
    /// takes it as `kind`.
    fn load_from_disk(&self, disk: &ArtifactCache, digest: &Digest, kind: GuestKind) -> Option<Code> {
        let refused = |why: String| {
            self.rejected_from_disk.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(digest = %digest.short(), path = %disk.path(digest).display(),
                "ignoring the cached artifact, compiling again: {why}");
            None
        };
        match disk.read(digest) {
            Ok(None) => None,
            Err(why) => refused(why.to_string()),
            Ok(Some(artifact)) => match deserialize_verified(&self.engine, &artifact, kind) {
                Ok(code) => {
                    self.loaded_from_disk.fetch_add(1, Ordering::Relaxed);
                    Some(code)
                }
                Err(e) => refused(format!("wasmtime refused it: {e:#}")),
            },
        }
    }

    /// Runs `guest` once, blocking the calling thread until it ends. Never fails: every way a
    /// run can end is an [`Outcome`]. Call it from a thread of its own (not an async worker).
    pub fn run_job(&self, guest: &Guest, job: &GuestJob) -> GuestRun {
        self.run_job_with_cancel(guest, job, &CancelSignal::new())
    }

    /// [`run_job`](Self::run_job), stopped early when `cancel` fires: the guest is interrupted
    /// within one [`EPOCH_TICK`] (at once, when parked in an async host call or a sleep) and
    /// the run ends as [`Outcome::Cancelled`], with the CPU, wall time and memory used until
    /// then.
    pub fn run_job_with_cancel(&self, guest: &Guest, job: &GuestJob, cancel: &CancelSignal) -> GuestRun {
        self.run_job_limited(guest, job, cancel, RunLimits::default())
    }

    /// [`run_job_with_cancel`](Self::run_job_with_cancel) with this run's own `limits` where
    /// they are narrower than the runtime's.
    pub fn run_job_limited(&self, guest: &Guest, job: &GuestJob, cancel: &CancelSignal, limits: RunLimits) -> GuestRun {
        let started = Instant::now();
        let cpu_before = thread_cpu_time();
        let log = LogBuffer::new(job.log_limit_bytes);
        let mut notes = Vec::new();
        // Taken out for the run and put back after it, unless the run left a task in it: that
        // task would run in the next run's `block_on`, so the runtime is dropped with it and
        // the next run gets a fresh one.
        let rt = match GUEST_RUNTIME.with(|kept| kept.borrow_mut().take()) {
            Some(rt) => Ok(rt),
            None => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        };
        let ended = match rt {
            Ok(rt) => {
                let ended = rt.block_on(self.call(guest, job, cancel, limits, &log, &mut notes));
                if rt.metrics().num_alive_tasks() == 0 {
                    GUEST_RUNTIME.with(|kept| *kept.borrow_mut() = Some(rt));
                }
                ended
            }
            Err(e) => Ended::failed(format!("start the guest's runtime: {e}")),
        };
        let cpu = thread_cpu_time().saturating_sub(cpu_before);
        let (stdout, stderr, log_dropped) = log.take();
        GuestRun {
            outcome: ended.outcome,
            stdout,
            stderr,
            log_dropped,
            notes,
            wall_ms: millis(started.elapsed()),
            cpu_ms: millis(cpu),
            peak_memory_bytes: ended.peak_bytes as u64,
            instructions: ended.instructions,
            no_free_slot: ended.no_free_slot,
        }
    }

    /// Instantiates and calls `_start` (module) or `wasi:cli/run` (component); returns the
    /// outcome, the peak memory and the fuel used.
    async fn call(
        &self,
        guest: &Guest,
        job: &GuestJob,
        cancel: &CancelSignal,
        run_limits: RunLimits,
        log: &LogBuffer,
        notes: &mut Vec<String>,
    ) -> Ended {
        let limit_bytes = job.resources.memory_mb.saturating_mul(1 << 20).min(self.max_memory_bytes);
        let limit_s = job.resources.runtime_s;
        let mut wasi = match build_wasi(job, log) {
            Ok(w) => w,
            Err(e) => return Ended::failed(format!("prepare WASI context: {e:#}")),
        };
        // Every open file, directory, stream and pollable is an entry of this table.
        wasi.ctx().table.set_max_capacity(self.max_open_resources);
        let fuel = match (self.fuel, run_limits.instructions) {
            (Some(fuel), Some(asked)) => Some(fuel.min(asked)),
            (fuel, _) => fuel,
        };
        let limits = MemoryLimiter {
            cap_bytes: usize::try_from(limit_bytes).unwrap_or(usize::MAX),
            peak_bytes: 0,
            exceeded: false,
        };
        let mut store = Store::new(&self.engine, Host { wasi, limits });
        store.limiter(|h| &mut h.limits);
        if let Some(fuel) = fuel
            && let Err(e) = store.set_fuel(fuel)
        {
            return Ended::failed(format!("set the fuel budget: {e:#}"));
        }
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
                match &guest.linked {
                    Linked::Module(pre) => {
                        let instance = pre.instantiate_async(&mut store).await.map_err(Failure::Instantiate)?;
                        let start =
                            instance.get_typed_func::<(), ()>(&mut store, "_start").map_err(Failure::Instantiate)?;
                        start.call_async(&mut store, ()).await.map_err(Failure::Run)
                    }
                    Linked::Component(pre) => {
                        let command = pre.instantiate_async(&mut store).await.map_err(Failure::Instantiate)?;
                        match command.wasi_cli_run().call_run(&mut store).await {
                            Ok(Ok(())) => Ok(()),
                            // `run` returning `err` is the command's exit status 1.
                            Ok(Err(())) => Err(Failure::Run(wasmtime::Error::new(I32Exit(1)))),
                            Err(e) => Err(Failure::Run(e)),
                        }
                    }
                }
            };
            tokio::select! {
                biased;
                r = run => Ok(r),
                _ = cancel.cancelled() => Err(HostStop::Cancelled),
                _ = tokio::time::sleep(deadline) => Err(HostStop::Deadline),
            }
        };
        let instructions = fuel.map(|fuel| fuel.saturating_sub(store.get_fuel().unwrap_or(0)));
        let limits = &store.data().limits;
        let peak_bytes = limits.peak_bytes;
        let ended = |outcome| Ended { outcome, peak_bytes, instructions, no_free_slot: false };
        if let Ok(Err(f)) = &result
            && let Some(reason) = crate::slots::pool_full(f.error())
        {
            return Ended { no_free_slot: true, ..ended(Outcome::ModuleFailed { reason }) };
        }
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
            return ended(cancel.outcome());
        }
        if limits.exceeded {
            if let Ok(Err(e)) = &result {
                notes.push(format!("after memory growth was refused: {}", e.message()));
            }
            return ended(Outcome::MemoryExceeded { limit_bytes });
        }
        let outcome = match result {
            Err(_) => {
                notes.push("guest was still in a host call at the deadline".into());
                Outcome::TimeExceeded { limit_s, vacate: None }
            }
            Ok(Ok(())) => Outcome::Exited { exit_code: 0 },
            Ok(Err(Failure::Instantiate(e))) => Outcome::ModuleFailed { reason: format!("instantiate: {e:#}") },
            Ok(Err(Failure::Run(e))) => {
                let trap = e.downcast_ref::<Trap>().copied();
                if let Some(exit) = e.downcast_ref::<I32Exit>() {
                    Outcome::Exited { exit_code: exit.0 }
                } else if trap == Some(Trap::Interrupt) {
                    Outcome::TimeExceeded { limit_s, vacate: None }
                } else if let (Some(Trap::OutOfFuel), Some(limit)) = (trap, fuel) {
                    Outcome::FuelExhausted { limit }
                } else if let Some(message) = crate::slots::table_full(&e, self.max_open_resources) {
                    notes.push(format!("{e:?}"));
                    Outcome::Trapped { message }
                } else {
                    notes.push(format!("{e:?}"));
                    let message = match trap {
                        Some(Trap::StackOverflow) => format!(
                            "call stack exhausted: more than {} KiB of wasm stack (endless or too deep recursion)",
                            MAX_WASM_STACK >> 10
                        ),
                        Some(trap) => trap.to_string(),
                        None => format!("{e:#}"),
                    };
                    Outcome::Trapped { message: truncate(message, MAX_TRAP_MESSAGE) }
                }
            }
        };
        ended(outcome)
    }
}

/// How `call` ended: the outcome and the usage the store saw.
struct Ended {
    outcome: Outcome,
    peak_bytes: usize,
    instructions: Option<u64>,
    /// [`GuestRun::no_free_slot`].
    no_free_slot: bool,
}

impl Ended {
    /// A run that never got to the guest.
    fn failed(reason: String) -> Ended {
        Ended { outcome: Outcome::ModuleFailed { reason }, peak_bytes: 0, instructions: None, no_free_slot: false }
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

/// The guest's WASI context: argv, env exactly as given, two preopens (three with `/checkpoint`), bounded stdio, no
/// network, no inherited anything.
///
/// File operations block the run's own thread (measured: reading 256 MiB takes 1.3 s this way,
/// 2.4 s through tokio's blocking pool). wasmtime-wasi would then serve a `poll_oneoff` on
/// exactly one relative clock (a Rust guest's `sleep`) with `std::thread::sleep`, which neither
/// the epoch nor the host timer can interrupt; the EP's linker serves that call itself
/// (`crate::sleep`).
fn build_wasi(job: &GuestJob, log: &LogBuffer) -> anyhow::Result<WasiP1Ctx> {
    let mut b = WasiCtxBuilder::new();
    b.allow_blocking_current_thread(true)
        .args(&job.argv)
        .envs(&job.env)
        .stdout(log.pipe(Stream::Out))
        .stderr(log.pipe(Stream::Err));
    b.preopened_dir(&job.input_dir, "/input", FsPerms::ReadOnly).map_err(anyhow::Error::from)?;
    b.preopened_dir(&job.output_dir, "/output", FsPerms::ReadWrite).map_err(anyhow::Error::from)?;
    if let Some(dir) = &job.checkpoint_dir {
        b.preopened_dir(dir, "/checkpoint", FsPerms::ReadWrite).map_err(anyhow::Error::from)?;
    }
    Ok(b.build_p1())
}

pub(crate) fn millis(d: Duration) -> u64 {
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
