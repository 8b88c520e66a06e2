//! How fast a function starts, and what the limits cost.
//!
//! `cargo bench -p htfaas-ep --bench instantiate [-- FILTER]` prints one JSON line per figure,
//! each `{"bench":"instantiate","case":..,..}`; times in microseconds (`us`) or milliseconds (`ms`):
//!
//! - `first_instruction.{pooling,on_demand}`: from the start of a run to the guest's first
//!   instruction. The guest's `_start` at once calls `bench.first`, a host function of a
//!   bench-only [`Linker`] that reads the clock; a sample is that reading minus the one taken
//!   before `Store::new`. So it covers what the EP does per run on the engine: a new store,
//!   `InstancePre::instantiate_async` (instance, memory, table, from the pool or the OS),
//!   `_start` lookup, the fiber stack and the call into wasm; not the WASI context, which the
//!   next case adds. p50/p90/p99 over up to 10 000 runs (1 s budget), on the EP's own engines
//!   (`Runtime::with_options`, pooling on and off);
//! - `run_job.{pooling,on_demand}`: a whole [`Runtime::run_job`] of an empty `_start`: WASI
//!   context with its two preopens, the per-run tokio runtime, instantiate, call, drop;
//! - `run_job.checksum.{module,component}`: a whole [`Runtime::run_job`] of the `checksum`
//!   example over a 1 KiB input, built as a WASI preview 1 module and as a preview 2 component
//!   (when `examples/` is built for both targets): what a real guest's start and run cost;
//! - `compile.{checksum,checksum_component,generated}`: `Module::new` / `Component::new` of the
//!   `checksum` example (when built) and `Module::new` of a generated module of a few MB, in ms
//!   and ms per MB of wasm (median of a few);
//! - `disk_cache`: [`Runtime::load`] on a restarted runtime whose cache dir holds the artifact
//!   (digest check, read, HMAC check, deserialize, link) against the same `load` compiling;
//! - `limits.{loop,calls}`: one compute guest (a xorshift loop with memory traffic; a recursive
//!   fib) on four engines: no limits, epoch interruption (ticker running, as the EP does), fuel,
//!   both; min of interleaved runs, and each as a ratio to no limits.
//!
//! Without `--bench` (as `cargo test --benches` runs it) each case runs once, small, as a smoke
//! test, and nothing is timed. The JSON keys follow `functions/benches/support/harness.rs`; that
//! harness times whole closures, these figures need a clock inside the guest or a restart per
//! sample, so the loops are here.

use htfaas_ep::Runtime;
use htfaas_ep::runtime::{GuestJob, RuntimeOptions};
use htfaas_functions::proto::Outcome;
use htfaas_functions::{Digest, Resources};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use wasmtime::{Caller, Config, Engine, Instance, Linker, Module, Store};

/// Measuring one case stops after this long (once `MIN_SAMPLES` are in) ...
const BUDGET: Duration = Duration::from_secs(1);
/// ... or after this many samples.
const MAX_SAMPLES: usize = 10_000;
const MIN_SAMPLES: usize = 100;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let b = Bench {
        timed: args.iter().any(|a| a == "--bench"),
        filters: args.into_iter().filter(|a| !a.starts_with('-')).collect(),
    };
    for pooling in [true, false] {
        first_instruction(&b, pooling);
    }
    for pooling in [true, false] {
        run_job(&b, pooling);
    }
    checksum_kinds(&b);
    compile(&b);
    disk_cache(&b);
    limits(&b);
}

struct Bench {
    timed: bool,
    filters: Vec<String>,
}

impl Bench {
    fn wants(&self, case: &str) -> bool {
        self.filters.is_empty() || self.filters.iter().any(|f| case.contains(f.as_str()))
    }

    /// Prints one line: `fields` is the JSON after `"case"` (starting with a comma).
    fn line(&self, case: &str, fields: &str) {
        if self.timed {
            println!(r#"{{"bench":"instantiate","case":"{case}"{fields}}}"#);
        } else {
            println!("instantiate/{case}: ok (smoke; run `cargo bench` to time)");
        }
    }

    /// Samples `f` (which returns one measurement) until the budget; prints percentiles.
    fn sample(&self, case: &str, unit: &str, mut f: impl FnMut() -> Duration) {
        if !self.wants(case) {
            return;
        }
        if !self.timed {
            f();
            return self.line(case, "");
        }
        let warm = Instant::now();
        while warm.elapsed() < Duration::from_millis(200) {
            f();
        }
        let mut samples = Vec::with_capacity(MAX_SAMPLES);
        let t0 = Instant::now();
        while samples.len() < MAX_SAMPLES && (samples.len() < MIN_SAMPLES || t0.elapsed() < BUDGET) {
            samples.push(f());
        }
        let scale = if unit == "ms" { 1e-3 } else { 1.0 };
        let s = Percentiles::of(&mut samples, scale);
        self.line(
            case,
            &format!(r#","unit":"{unit}","p50":{:.3},"p90":{:.3},"p99":{:.3},"n":{}"#, s.p50, s.p90, s.p99, s.n),
        );
    }
}

struct Percentiles {
    p50: f64,
    p90: f64,
    p99: f64,
    n: usize,
}

impl Percentiles {
    /// Nearest-rank percentiles of `samples`, in microseconds times `scale`.
    fn of(samples: &mut [Duration], scale: f64) -> Percentiles {
        samples.sort();
        let pct = |p: f64| {
            let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
            samples[rank.clamp(1, samples.len()) - 1].as_secs_f64() * 1e6 * scale
        };
        Percentiles { p50: pct(50.0), p90: pct(90.0), p99: pct(99.0), n: samples.len() }
    }
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn runtime(pooling: bool) -> Runtime {
    Runtime::with_options(RuntimeOptions { pooling, ..RuntimeOptions::default() }).expect("runtime starts")
}

fn alloc_name(pooling: bool) -> &'static str {
    if pooling { "pooling" } else { "on_demand" }
}

// ---------------------------------------------------------------------------------------------

/// Store data of the first-instruction guest: when `bench.first` ran.
struct FirstCall {
    at: Option<Instant>,
}

fn first_instruction(b: &Bench, pooling: bool) {
    let rt = runtime(pooling);
    assert_eq!(rt.is_pooling(), pooling, "the pool could not be reserved here");
    let engine = rt.engine();
    let wasm = wat::parse_str(
        r#"(module (import "bench" "first" (func $first)) (memory (export "memory") 1)
             (func (export "_start") (call $first)))"#,
    )
    .expect("valid wat");
    let module = Module::new(engine, wasm).expect("compiles");
    let mut linker = Linker::<FirstCall>::new(engine);
    linker
        .func_wrap("bench", "first", |mut caller: Caller<'_, FirstCall>| caller.data_mut().at = Some(Instant::now()))
        .expect("define bench.first");
    let pre = linker.instantiate_pre(&module).expect("links");
    let tokio = tokio::runtime::Builder::new_current_thread().build().expect("tokio runtime");
    b.sample(&format!("first_instruction.{}", alloc_name(pooling)), "us", || {
        tokio.block_on(async {
            let started = Instant::now();
            let mut store = Store::new(engine, FirstCall { at: None });
            store.set_epoch_deadline(1 << 40);
            let instance = pre.instantiate_async(&mut store).await.expect("instantiates");
            let start = instance.get_typed_func::<(), ()>(&mut store, "_start").expect("_start");
            start.call_async(&mut store, ()).await.expect("runs");
            store.data().at.expect("bench.first was called").duration_since(started)
        })
    });
}

fn run_job(b: &Bench, pooling: bool) {
    let rt = runtime(pooling);
    let wasm = wat::parse_str(r#"(module (memory (export "memory") 1) (func (export "_start")))"#).expect("valid wat");
    let guest = rt.load(&Digest::of(&wasm), &wasm).expect("loads");
    let dir = tempfile::tempdir().expect("tempdir");
    let (input, output) = (dir.path().join("input"), dir.path().join("output"));
    std::fs::create_dir_all(&input).expect("mkdir");
    std::fs::create_dir_all(&output).expect("mkdir");
    let job = GuestJob {
        argv: vec!["f".into()],
        env: Vec::new(),
        input_dir: input,
        output_dir: output,
        checkpoint_dir: None,
        resources: Resources::new(1, 64, 10),
        log_limit_bytes: 64 * 1024,
    };
    b.sample(&format!("run_job.{}", alloc_name(pooling)), "us", || {
        let started = Instant::now();
        let run = rt.run_job(&guest, &job);
        let took = started.elapsed();
        assert_eq!(run.outcome, Outcome::Exited { exit_code: 0 });
        took
    });
}

// ---------------------------------------------------------------------------------------------

/// A valid module of about `mb` MB: many functions of arithmetic, locals, loads and branches.
fn generated_module(mb: f64) -> Vec<u8> {
    let mut wat = String::from("(module (memory (export \"memory\") 1)\n");
    let mut n = 0u32;
    loop {
        let _ = write!(
            wat,
            "(func $f{n} (param i32) (result i32) (local i32 i64)\n(local.set 1 (local.get 0))\n(block (loop\n"
        );
        for k in 0..24u32 {
            let _ = write!(
                wat,
                "(local.set 1 (i32.add (i32.mul (local.get 1) (i32.const {})) (i32.load (i32.and (local.get 1) (i32.const 0xfffc)))))\n\
                 (local.set 2 (i64.xor (local.get 2) (i64.extend_i32_u (i32.rotl (local.get 1) (i32.const {})))))\n\
                 (br_if 1 (i32.eq (local.get 1) (i32.const {})))\n",
                k * 2 + 3,
                k % 31 + 1,
                n.wrapping_mul(7919).wrapping_add(k)
            );
        }
        let _ = writeln!(wat, "(br_if 0 (i32.lt_u (local.get 1) (i32.const 1000)))))\n(i32.wrap_i64 (local.get 2)))");
        n += 1;
        if n.is_multiple_of(64) && wat.len() as f64 / 9.0 > mb * 1e6 {
            break;
        }
    }
    wat.push_str("(func (export \"_start\")))");
    let wasm = wat::parse_str(&wat).expect("valid generated wat");
    assert!(wasm.len() as f64 > mb * 0.5e6, "generated {} bytes", wasm.len());
    wasm
}

/// `examples/target/<target>/release/checksum.wasm`, if built.
fn checksum_wasm(target: &str) -> Option<Vec<u8>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../examples/target/{target}/release/checksum.wasm"));
    match std::fs::read(&path) {
        Ok(wasm) => Some(wasm),
        Err(e) => {
            eprintln!("instantiate: checksum for {target} skipped, {}: {e}", path.display());
            None
        }
    }
}

fn checksum_kinds(b: &Bench) {
    let rt = runtime(true);
    for (kind, target) in [("module", "wasm32-wasip1"), ("component", "wasm32-wasip2")] {
        let case = format!("run_job.checksum.{kind}");
        if !b.wants(&case) {
            continue;
        }
        let Some(wasm) = checksum_wasm(target) else { continue };
        let guest = rt.load(&Digest::of(&wasm), &wasm).expect("loads");
        let dir = tempfile::tempdir().expect("tempdir");
        let (input, output) = (dir.path().join("input"), dir.path().join("output"));
        std::fs::create_dir_all(&input).expect("mkdir");
        std::fs::create_dir_all(&output).expect("mkdir");
        std::fs::write(input.join("in.dat"), [7u8; 1024]).expect("input");
        let job = GuestJob {
            argv: vec!["checksum".into(), "/input/in.dat".into()],
            env: Vec::new(),
            input_dir: input,
            output_dir: output,
            checkpoint_dir: None,
            resources: Resources::new(1, 64, 10),
            log_limit_bytes: 64 * 1024,
        };
        b.sample(&case, "us", || {
            let started = Instant::now();
            let run = rt.run_job(&guest, &job);
            let took = started.elapsed();
            assert_eq!(run.outcome, Outcome::Exited { exit_code: 0 }, "{}", String::from_utf8_lossy(&run.stderr));
            took
        });
    }
}

fn compile_case(b: &Bench, case: &str, wasm: &[u8], runs: usize) {
    if !b.wants(case) {
        return;
    }
    let rt = runtime(true);
    let component = wasm.get(4..8) == Some(&[0x0d, 0, 1, 0]);
    let mut samples: Vec<Duration> = (0..runs)
        .map(|_| {
            let started = Instant::now();
            if component {
                wasmtime::component::Component::new(rt.engine(), wasm).expect("compiles");
            } else {
                Module::new(rt.engine(), wasm).expect("compiles");
            }
            started.elapsed()
        })
        .collect();
    let mb = wasm.len() as f64 / 1e6;
    let m = ms(median(&mut samples));
    b.line(
        case,
        &format!(r#","unit":"ms","wasm_bytes":{},"median":{m:.1},"ms_per_mb":{:.1},"n":{runs}"#, wasm.len(), m / mb),
    );
}

fn compile(b: &Bench) {
    let runs = if b.timed { 5 } else { 1 };
    if let Some(wasm) = checksum_wasm("wasm32-wasip1") {
        compile_case(b, "compile.checksum", &wasm, runs);
    }
    if let Some(wasm) = checksum_wasm("wasm32-wasip2") {
        compile_case(b, "compile.checksum_component", &wasm, runs);
    }
    if b.wants("compile.generated") || b.wants("disk_cache") {
        let wasm = generated_module(if b.timed { 3.0 } else { 0.2 });
        compile_case(b, "compile.generated", &wasm, runs);
    }
}

fn disk_cache(b: &Bench) {
    if !b.wants("disk_cache") {
        return;
    }
    let wasm = generated_module(if b.timed { 3.0 } else { 0.2 });
    let digest = Digest::of(&wasm);
    let dir = tempfile::tempdir().expect("tempdir");
    let options = RuntimeOptions { cache_dir: Some(dir.path().to_owned()), ..RuntimeOptions::default() };
    let runs = if b.timed { 5 } else { 1 };
    let mut compiled = Vec::new();
    let mut loaded = Vec::new();
    let mut artifact_bytes = 0;
    for _ in 0..runs {
        // Compile (and store), then restart and load from disk; the artifact is removed after,
        // so each round compiles again.
        let rt = Runtime::with_options(options.clone()).expect("runtime");
        let started = Instant::now();
        rt.load(&digest, &wasm).expect("loads");
        compiled.push(started.elapsed());
        assert_eq!((rt.compiled_count(), rt.loaded_from_disk_count()), (1, 0));
        drop(rt);
        let rt = Runtime::with_options(options.clone()).expect("runtime");
        let started = Instant::now();
        rt.load(&digest, &wasm).expect("loads");
        loaded.push(started.elapsed());
        assert_eq!((rt.compiled_count(), rt.loaded_from_disk_count()), (0, 1));
        let path = rt.artifact_path(&digest).expect("a runtime with a cache dir");
        artifact_bytes = std::fs::metadata(&path).expect("artifact").len();
        std::fs::remove_file(&path).expect("rm artifact");
    }
    let (c, l) = (ms(median(&mut compiled)), ms(median(&mut loaded)));
    b.line(
        "disk_cache",
        &format!(
            r#","unit":"ms","wasm_bytes":{},"artifact_bytes":{artifact_bytes},"compile_and_store":{c:.2},"load_from_disk":{l:.3},"ratio":{:.0},"n":{runs}"#,
            wasm.len(),
            c / l
        ),
    );
}

// ---------------------------------------------------------------------------------------------

/// The compute loop: `iterations` rounds of xorshift with a store and a load.
fn loop_guest(iterations: u32) -> Vec<u8> {
    wat::parse_str(format!(
        r#"(module (memory (export "memory") 1) (global $out (export "out") (mut i64) (i64.const 0))
  (func (export "_start") (local $i i32) (local $acc i64) (local $x i64)
    (local.set $x (i64.const 0x9E3779B97F4A7C15))
    (loop $l
      (local.set $x (i64.xor (local.get $x) (i64.shl (local.get $x) (i64.const 13))))
      (local.set $x (i64.xor (local.get $x) (i64.shr_u (local.get $x) (i64.const 7))))
      (local.set $x (i64.xor (local.get $x) (i64.shl (local.get $x) (i64.const 17))))
      (i64.store (i32.and (i32.wrap_i64 (local.get $x)) (i32.const 0xfff8)) (i64.add (local.get $acc) (local.get $x)))
      (local.set $acc (i64.add (local.get $acc)
        (i64.load (i32.and (i32.shl (local.get $i) (i32.const 3)) (i32.const 0xfff8)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const {iterations}))))
    (global.set $out (local.get $acc))))"#
    ))
    .expect("valid wat")
}

/// Recursive fib(`n`): call-heavy, so the checks at function entry show.
fn calls_guest(n: u32) -> Vec<u8> {
    wat::parse_str(format!(
        r#"(module (memory (export "memory") 1) (global $out (export "out") (mut i64) (i64.const 0))
  (func $fib (param i32) (result i64)
    (if (result i64) (i32.lt_u (local.get 0) (i32.const 2))
      (then (i64.extend_i32_u (local.get 0)))
      (else (i64.add (call $fib (i32.sub (local.get 0) (i32.const 1))) (call $fib (i32.sub (local.get 0) (i32.const 2)))))))
  (func (export "_start") (global.set $out (call $fib (i32.const {n})))))"#
    ))
    .expect("valid wat")
}

/// One engine of the limits comparison, with its ticker when it uses epochs.
struct LimitEngine {
    name: &'static str,
    engine: Engine,
    epoch: bool,
    fuel: bool,
    stop: Arc<AtomicBool>,
}

impl LimitEngine {
    fn new(name: &'static str, epoch: bool, fuel: bool) -> LimitEngine {
        let mut config = Config::new();
        config.epoch_interruption(epoch).consume_fuel(fuel);
        let engine = Engine::new(&config).expect("engine");
        let stop = Arc::new(AtomicBool::new(false));
        if epoch {
            let (engine, stop) = (engine.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(htfaas_ep::runtime::EPOCH_TICK);
                    engine.increment_epoch();
                }
            });
        }
        LimitEngine { name, engine, epoch, fuel, stop }
    }

    /// Runs `_start` of `wasm` once; returns the time of the call alone and the `out` global.
    fn run(&self, module: &Module) -> (Duration, i64) {
        let mut store = Store::new(&self.engine, ());
        if self.epoch {
            store.set_epoch_deadline(1);
            store.epoch_deadline_callback(|_| Ok(wasmtime::UpdateDeadline::Continue(1)));
        }
        if self.fuel {
            store.set_fuel(u64::MAX).expect("fuel");
        }
        let instance = Instance::new(&mut store, module, &[]).expect("instantiates");
        let start = instance.get_typed_func::<(), ()>(&mut store, "_start").expect("_start");
        let started = Instant::now();
        start.call(&mut store, ()).expect("runs");
        let took = started.elapsed();
        let out = instance.get_global(&mut store, "out").and_then(|g| g.get(&mut store).i64()).expect("out");
        (took, out)
    }
}

impl Drop for LimitEngine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn limits(b: &Bench) {
    let engines = [
        LimitEngine::new("none", false, false),
        LimitEngine::new("epoch", true, false),
        LimitEngine::new("fuel", false, true),
        LimitEngine::new("epoch_fuel", true, true),
    ];
    let cases = [
        ("limits.loop", loop_guest(if b.timed { 100_000_000 } else { 1000 })),
        ("limits.calls", calls_guest(if b.timed { 32 } else { 10 })),
    ];
    let rounds = if b.timed { 7 } else { 1 };
    for (case, wasm) in cases {
        if !b.wants(case) {
            continue;
        }
        let modules: Vec<Module> = engines.iter().map(|e| Module::new(&e.engine, &wasm).expect("compiles")).collect();
        let mut best = [Duration::MAX; 4];
        let mut result = None;
        // Interleaved, so drift in the machine's speed hits every engine alike.
        for _ in 0..rounds {
            for (i, (engine, module)) in engines.iter().zip(&modules).enumerate() {
                let (took, out) = engine.run(module);
                best[i] = best[i].min(took);
                assert!(result.is_none_or(|r| r == out), "{} computed another result", engine.name);
                result = Some(out);
            }
        }
        let base = ms(best[0]);
        let mut fields = String::from(r#","unit":"ms""#);
        for (engine, t) in engines.iter().zip(best) {
            let _ = write!(fields, r#","{}_ms":{:.1}"#, engine.name, ms(t));
        }
        for (engine, t) in engines.iter().zip(best).skip(1) {
            let _ = write!(fields, r#","{}_ratio":{:.2}"#, engine.name, ms(t) / base);
        }
        let _ = write!(fields, r#","rounds":{rounds}"#);
        b.line(case, &fields);
    }
}
