//! [`RuntimeOptions`]: what the EP's wasm host is built with (pool, memory cap, fuel, caches,
//! compile time limit), their defaults, the fixed bounds of every run, and the engine built
//! from them ([`build_engine`]).
//!
//! Bottom of the EP's wasm side, read by [`crate::runtime`] and [`crate::compile`]; must not
//! know about jobs or the network.

use std::path::PathBuf;
use std::time::Duration;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// Period of the engine's epoch ticker: the resolution of wall-time kills.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);
/// Native stack that wasm frames may use in one run, bytes (wasmtime's `max_wasm_stack`).
///
/// 1 MiB, twice wasmtime's default: tens of thousands of frames of ordinary compiled code (Rust
/// guests keep their big locals on a shadow stack in linear memory, so this is only for frames).
/// A guest going deeper traps with "call stack exhausted". The guest runs on a fiber stack of
/// `ASYNC_STACK`; what the wasm frames do not use is left to the host functions it calls.
pub const MAX_WASM_STACK: usize = 1 << 20;
/// Size of each fiber stack a guest runs on (wasmtime's `async_stack_size`): [`MAX_WASM_STACK`]
/// plus 1 MiB for the WASI host calls made from it, which wasmtime does not bound.
pub(crate) const ASYNC_STACK: usize = MAX_WASM_STACK + (1 << 20);
/// Extra time past the deadline before the host timer gives up on a guest stuck in a host call.
pub(crate) const HOST_CALL_GRACE: Duration = Duration::from_millis(500);
/// Largest table a guest may grow (elements); tables are host memory too.
pub(crate) const MAX_TABLE_ELEMENTS: usize = 1 << 20;
/// Longest trap message kept in an [`Outcome::Trapped`](htfaas_functions::proto::Outcome::Trapped).
pub(crate) const MAX_TRAP_MESSAGE: usize = 1024;
/// Longest cancel reason kept in an
/// [`Outcome::Cancelled`](htfaas_functions::proto::Outcome::Cancelled) (the reason comes from the
/// scheduler).
pub(crate) const MAX_CANCEL_REASON: usize = 1024;
/// Linear memories are 32-bit: at most 4 GiB.
pub const WASM32_MAX_MEMORY: u64 = 4 << 30;

/// How to build a [`Runtime`](crate::Runtime). `RuntimeOptions::default()` is what
/// [`Runtime::new`](crate::Runtime::new) uses.
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    /// Directory for compiled artifacts (`<digest hex>.<engine tag>.cwasm`) and their key (`key`), created
    /// (mode 0700) if missing. Default: none (modules are compiled again after every restart).
    pub cache_dir: Option<PathBuf>,
    /// Fuel given to every run (about one unit per wasm instruction); a run that spends it ends
    /// as [`Outcome::FuelExhausted`](htfaas_functions::proto::Outcome::FuelExhausted). Default:
    /// none (no metering, which is faster).
    pub fuel: Option<u64>,
    /// Whether to take instances from wasmtime's pooling allocator (falls back to on-demand with
    /// a warning when the pool cannot be reserved). Default: true.
    pub pooling: bool,
    /// Pool slots: instances (so runs) alive at once; a run that finds no free slot never
    /// starts ([`GuestRun::no_free_slot`](crate::runtime::GuestRun::no_free_slot)), and its job
    /// waits for one or is handed back to the scheduler, never failed. Should cover the EP's job
    /// slots plus guests left behind in a blocking sleep. Each slot reserves about 4 GiB of
    /// address space (not memory) for its linear memory. Default: 64.
    pub max_instances: u32,
    /// Core instances in the pool per slot. A core module is one; a component is several (a
    /// Python function built by componentize-py is 14: the interpreter, libc, the WASI adapter
    /// and shims), so the pool holds `max_instances × core_instances_per_slot`, shared by all
    /// runs. Cheap (a `VMContext` each). Default: [`DEFAULT_CORE_INSTANCES_PER_SLOT`].
    pub core_instances_per_slot: u32,
    /// Tables in the pool per slot (a core module has at most one; a Python component 2).
    /// Default: [`DEFAULT_TABLES_PER_SLOT`].
    pub tables_per_slot: u32,
    /// Largest linear memory of any run, bytes: the largest job memory the EP accepts. Runs asking
    /// for more are capped here. At most 4 GiB (wasm32). Default: 4 GiB.
    pub max_memory_bytes: u64,
    /// Most compiled modules kept in memory; past it the least recently used is dropped (its
    /// artifact on disk stays). Default: [`DEFAULT_MAX_CACHED_MODULES`].
    pub max_cached_modules: usize,
    /// Most artifacts kept in `cache_dir`; past it the oldest (by modification time) are
    /// deleted after a write. Default: [`DEFAULT_MAX_DISK_ARTIFACTS`].
    pub max_disk_artifacts: usize,
    /// Most WASI resources one run holds at once: open files and directories (each one a host
    /// descriptor), streams and pollables, the preopens and stdio included. A guest past it
    /// traps ([`Outcome::Trapped`](htfaas_functions::proto::Outcome::Trapped), "too many open files…"). Default:
    /// [`DEFAULT_MAX_OPEN_RESOURCES`].
    pub max_open_resources: usize,
    /// Longest compilation of one module; a module taking longer is refused
    /// ([`ModuleError::CompileTimeout`](crate::runtime::ModuleError::CompileTimeout)) and
    /// remembered as refused. Default:
    /// [`DEFAULT_COMPILE_TIMEOUT`]; `None`: unbounded.
    pub compile_timeout: Option<Duration>,
}

/// Default of [`RuntimeOptions::core_instances_per_slot`]: a Python component (14) with room.
pub const DEFAULT_CORE_INSTANCES_PER_SLOT: u32 = 16;
/// Default of [`RuntimeOptions::tables_per_slot`]: a Python component's 2.
pub const DEFAULT_TABLES_PER_SLOT: u32 = 2;

/// Default of [`RuntimeOptions::max_open_resources`].
pub const DEFAULT_MAX_OPEN_RESOURCES: usize = 256;
/// Default of [`RuntimeOptions::compile_timeout`]: 5 minutes. Compiling takes about 1 s per MB
/// of code here (a 4 MB module: 3–5 s), so only modules near the 256 MiB download limit on a
/// slow host come close; a module crafted to make cranelift crawl does not hold the EP longer.
pub const DEFAULT_COMPILE_TIMEOUT: Duration = Duration::from_secs(300);

/// Default of [`RuntimeOptions::max_cached_modules`].
pub const DEFAULT_MAX_CACHED_MODULES: usize = 256;
/// Bytes of each pooled linear memory kept resident between runs (reset by `memset`).
const KEEP_RESIDENT_MEMORY: usize = 1 << 20;
/// Bytes of each pooled table kept resident between runs.
const KEEP_RESIDENT_TABLE: usize = 1 << 16;
/// Slots whose `madvise` reset waits for others, to be made in one go.
const DECOMMIT_BATCH: usize = 8;

/// Default of [`RuntimeOptions::max_disk_artifacts`].
pub const DEFAULT_MAX_DISK_ARTIFACTS: usize = 1024;

impl Default for RuntimeOptions {
    fn default() -> RuntimeOptions {
        RuntimeOptions {
            cache_dir: None,
            fuel: None,
            pooling: true,
            max_instances: 64,
            core_instances_per_slot: DEFAULT_CORE_INSTANCES_PER_SLOT,
            tables_per_slot: DEFAULT_TABLES_PER_SLOT,
            max_memory_bytes: WASM32_MAX_MEMORY,
            max_cached_modules: DEFAULT_MAX_CACHED_MODULES,
            max_disk_artifacts: DEFAULT_MAX_DISK_ARTIFACTS,
            max_open_resources: DEFAULT_MAX_OPEN_RESOURCES,
            compile_timeout: Some(DEFAULT_COMPILE_TIMEOUT),
        }
    }
}

/// The engine for `options`: with the pool if asked and granted, else allocating on demand.
/// Returns whether the pool is in use.
pub(crate) fn build_engine(options: &RuntimeOptions, max_memory_bytes: u64) -> anyhow::Result<(Engine, bool)> {
    let mut config = Config::new();
    config.epoch_interruption(true);
    config.consume_fuel(options.fuel.is_some());
    config.max_wasm_stack(MAX_WASM_STACK);
    config.async_stack_size(ASYNC_STACK);
    if options.pooling {
        let slots = options.max_instances.max(1);
        let mut pool = PoolingAllocationConfig::new();
        // Components hold several core instances and tables each: sized per slot, so that
        // `slots` runs of a Python component fit at once (see `core_instances_per_slot`).
        pool.total_core_instances(slots.saturating_mul(options.core_instances_per_slot.max(1)))
            .total_memories(slots)
            .total_tables(slots.saturating_mul(options.tables_per_slot.max(1)))
            .total_stacks(slots)
            .total_component_instances(slots)
            .max_memory_size(usize::try_from(max_memory_bytes).unwrap_or(usize::MAX))
            .table_elements(MAX_TABLE_ELEMENTS);
        // A slot's memory and table are reset by `memset` of the pages the last guest touched
        // (found with `PAGEMAP_SCAN` where the kernel has it, Linux 6.7 on) up to these bounds,
        // instead of `madvise` and a page fault per page at the next run; what `madvise` still
        // resets is batched. In the no-op throughput bench the faults, `madvise` calls and TLB
        // flushes were about 5 % of the EP's CPU. The reset is as complete either way.
        pool.linear_memory_keep_resident(KEEP_RESIDENT_MEMORY)
            .table_keep_resident(KEEP_RESIDENT_TABLE)
            .pagemap_scan(wasmtime::Enabled::Auto)
            .decommit_batch_size(DECOMMIT_BATCH);
        let mut pooled = config.clone();
        pooled.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        match Engine::new(&pooled) {
            Ok(engine) => return Ok((engine, true)),
            Err(e) => tracing::warn!(
                slots,
                "failed to reserve the instance pool, allocating instances on demand (slower starts): {e:#}"
            ),
        }
    }
    let engine = Engine::new(&config).map_err(anyhow::Error::from)?;
    Ok((engine, false))
}
