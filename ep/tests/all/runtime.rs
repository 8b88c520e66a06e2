//! The runtime alone, with WAT guests: every way a run ends.

use crate::common::{JobDir, digest, resources, runtime};
use htfaas_ep::runtime::{CancelSignal, GuestRun, ModuleError, Runtime, RuntimeOptions};
use htfaas_functions::proto::Outcome;
use std::time::{Duration, Instant};

fn run_wat(rt: &Runtime, wat: &str, memory_mb: u64, runtime_s: u64) -> GuestRun {
    let bytes = wat::parse_str(wat).expect("valid wat");
    let guest = rt.load(&digest(&bytes), &bytes).expect("loads");
    let dir = JobDir::new("in.txt", b"x");
    rt.run_job(&guest, &dir.guest_job(&["f", "/input/in.txt"], &[], resources(memory_mb, runtime_s)))
}

const TRAP: &str = r#"(module (memory (export "memory") 1) (func (export "_start") unreachable))"#;
const SPIN: &str = r#"(module (memory (export "memory") 1) (func (export "_start") (loop br 0)))"#;
const EXIT3: &str = r#"(module
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (func (export "_start") (call $exit (i32.const 3))))"#;
const RETURN: &str = r#"(module (memory (export "memory") 1) (func (export "_start")))"#;

#[test]
fn trap_is_trapped() {
    let run = run_wat(runtime(), TRAP, 16, 10);
    match &run.outcome {
        Outcome::Trapped { message } => assert!(message.contains("unreachable"), "{message}"),
        other => panic!("want Trapped, got {other:?}"),
    }
}

#[test]
fn return_from_start_is_exit_0_and_proc_exit_3_is_exit_3() {
    assert_eq!(run_wat(runtime(), RETURN, 16, 10).outcome, Outcome::Exited { exit_code: 0 });
    assert_eq!(run_wat(runtime(), EXIT3, 16, 10).outcome, Outcome::Exited { exit_code: 3 });
}

#[test]
fn infinite_loop_hits_the_wall_time_cap_and_the_runtime_goes_on() {
    // A runtime of its own, so the timing is not shared with other tests' guests.
    let rt = Runtime::new().expect("runtime");
    let started = Instant::now();
    let run = run_wat(&rt, SPIN, 16, 1);
    let took = started.elapsed();
    assert_eq!(run.outcome, Outcome::TimeExceeded { limit_s: 1, vacate: None });
    assert!(took >= Duration::from_millis(950) && took < Duration::from_secs(3), "took {took:?}");
    // CPU is measured, not wall time: some of the second (the machine is shared with other
    // tests), never more than the second itself (one thread).
    assert!(run.cpu_ms >= 50, "a spinning guest burns CPU: {} ms", run.cpu_ms);
    assert!(u128::from(run.cpu_ms) <= took.as_millis() + 50, "cpu {} ms within wall {took:?}", run.cpu_ms);
    eprintln!("spin: wall {} ms, cpu {} ms (limit 1 s)", run.wall_ms, run.cpu_ms);
    assert_eq!(run_wat(&rt, EXIT3, 16, 10).outcome, Outcome::Exited { exit_code: 3 });
}

/// Writes a marker into its memory: inside the first MiB, which the pool resets by `memset`,
/// and past it, which the pool resets by `madvise`.
const LEAVE_MARKS: &str = r#"(module
  (memory (export "memory") 40)
  (func (export "_start")
    (i32.store (i32.const 100) (i32.const 0x5ec2e7))
    (i32.store (i32.const 1048572) (i32.const 0x5ec2e7))
    (i32.store (i32.const 2097152) (i32.const 0x5ec2e7))))"#;

/// Exits 7 when any byte where [`LEAVE_MARKS`] writes is not zero.
const READ_MARKS: &str = r#"(module
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 40)
  (func (export "_start")
    (if (i32.or (i32.or (i32.load (i32.const 100)) (i32.load (i32.const 1048572))) (i32.load (i32.const 2097152)))
      (then (call $exit (i32.const 7))))))"#;

#[test]
fn a_guest_never_reads_what_the_guest_before_it_left_in_a_reused_memory_slot() {
    // One slot, so every run reuses the memory the run before it wrote.
    let rt = Runtime::with_options(RuntimeOptions { max_instances: 1, ..RuntimeOptions::default() }).expect("runtime");
    for round in 0..3 {
        assert_eq!(run_wat(&rt, LEAVE_MARKS, 16, 10).outcome, Outcome::Exited { exit_code: 0 }, "round {round}");
        assert_eq!(run_wat(&rt, READ_MARKS, 16, 10).outcome, Outcome::Exited { exit_code: 0 }, "round {round}");
    }
    // The reader is not blind: marks it left itself, it sees.
    let own_marks = READ_MARKS.replace(
        "(func (export \"_start\")",
        "(func (export \"_start\")\n    (i32.store (i32.const 2097152) (i32.const 1))",
    );
    assert_eq!(run_wat(&rt, &own_marks, 16, 10).outcome, Outcome::Exited { exit_code: 7 });
}

/// Waits in `poll_oneoff` on two relative 30 s clocks: wasmtime-wasi serves that as an async
/// host call (only a single relative clock takes the blocking fast path).
const TWO_CLOCKS_30S: &str = r#"(module
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (i32.store (i32.const 16) (i32.const 1))
    (i64.store (i32.const 24) (i64.const 30000000000))
    (i32.store (i32.const 64) (i32.const 1))
    (i64.store (i32.const 72) (i64.const 30000000000))
    (drop (call $poll (i32.const 0) (i32.const 256) (i32.const 2) (i32.const 512)))))"#;

/// Runs `wat` (cap 30 s) and cancels it `after` from another thread; returns the run and how
/// long the cancel took to end it.
fn run_and_cancel(rt: &Runtime, wat: &str, after: Duration) -> (GuestRun, Duration) {
    let bytes = wat::parse_str(wat).expect("valid wat");
    let guest = rt.load(&digest(&bytes), &bytes).expect("loads");
    let dir = JobDir::new("in.txt", b"x");
    let cancel = CancelSignal::new();
    let canceller = {
        let cancel = cancel.clone();
        std::thread::spawn(move || {
            std::thread::sleep(after);
            let at = Instant::now();
            cancel.cancel("stop now");
            cancel.cancel("a second reason is ignored");
            at
        })
    };
    let run = rt.run_job_with_cancel(&guest, &dir.guest_job(&["f"], &[], resources(16, 30)), &cancel);
    let ended = Instant::now();
    let at = canceller.join().expect("canceller thread");
    (run, ended.saturating_duration_since(at))
}

#[test]
fn cancel_interrupts_a_spinning_guest_at_the_next_epoch_tick() {
    let rt = Runtime::new().expect("runtime");
    let (run, took) = run_and_cancel(&rt, SPIN, Duration::from_millis(300));
    assert_eq!(run.outcome, Outcome::Cancelled { reason: "stop now".into() });
    assert!(took < Duration::from_millis(500), "stopped {took:?} after the cancel");
    assert!(run.cpu_ms >= 30 && run.wall_ms >= 250, "usage so far: cpu {} ms, wall {} ms", run.cpu_ms, run.wall_ms);
    assert_eq!(run.peak_memory_bytes, 65536);
    // The runtime goes on.
    assert_eq!(run_wat(&rt, EXIT3, 16, 10).outcome, Outcome::Exited { exit_code: 3 });
}

#[test]
fn cancel_interrupts_a_guest_parked_in_an_async_host_call() {
    let rt = Runtime::new().expect("runtime");
    let (run, took) = run_and_cancel(&rt, TWO_CLOCKS_30S, Duration::from_millis(200));
    assert_eq!(run.outcome, Outcome::Cancelled { reason: "stop now".into() });
    assert!(took < Duration::from_millis(500), "stopped {took:?} after the cancel");
    assert!(run.notes.iter().any(|n| n.contains("host call")), "{:?}", run.notes);
}

#[test]
fn a_guest_parked_in_an_async_host_call_hits_the_wall_time_cap() {
    let rt = Runtime::new().expect("runtime");
    let started = Instant::now();
    let run = run_wat(&rt, TWO_CLOCKS_30S, 16, 1);
    let took = started.elapsed();
    assert_eq!(run.outcome, Outcome::TimeExceeded { limit_s: 1, vacate: None });
    assert!(took >= Duration::from_millis(950) && took < Duration::from_secs(3), "took {took:?}");
}

#[test]
fn an_uncancelled_signal_changes_nothing() {
    let rt = runtime();
    let bytes = wat::parse_str(EXIT3).expect("valid wat");
    let guest = rt.load(&digest(&bytes), &bytes).expect("loads");
    let dir = JobDir::new("in.txt", b"x");
    let run = rt.run_job_with_cancel(&guest, &dir.guest_job(&["f"], &[], resources(16, 10)), &CancelSignal::new());
    assert_eq!(run.outcome, Outcome::Exited { exit_code: 3 });
}

#[test]
fn memory_growth_past_the_cap_is_memory_exceeded_even_when_the_guest_goes_on() {
    // Grows by 100 pages (6.25 MiB) against a 1 MiB cap, ignores the -1, and returns normally.
    let grow_and_return = r#"(module (memory (export "memory") 1)
      (func (export "_start") (drop (memory.grow (i32.const 100)))))"#;
    let run = run_wat(runtime(), grow_and_return, 1, 10);
    assert_eq!(run.outcome, Outcome::MemoryExceeded { limit_bytes: 1 << 20 });
    assert_eq!(run.peak_memory_bytes, 65536);

    // The same, but the guest then traps the way Rust's allocator does.
    let grow_and_trap = r#"(module (memory (export "memory") 1)
      (func (export "_start")
        (if (i32.eq (memory.grow (i32.const 100)) (i32.const -1)) (then unreachable))))"#;
    let run = run_wat(runtime(), grow_and_trap, 1, 10);
    assert_eq!(run.outcome, Outcome::MemoryExceeded { limit_bytes: 1 << 20 });

    // Within the cap: growth works and the peak is recorded.
    let grow_ok = r#"(module (memory (export "memory") 1)
      (func (export "_start")
        (if (i32.eq (memory.grow (i32.const 10)) (i32.const -1)) (then unreachable))))"#;
    let run = run_wat(runtime(), grow_ok, 1, 10);
    assert_eq!(run.outcome, Outcome::Exited { exit_code: 0 });
    assert_eq!(run.peak_memory_bytes, 11 * 65536);
}

#[test]
fn initial_memory_over_the_cap_is_memory_exceeded() {
    let big = r#"(module (memory (export "memory") 32) (func (export "_start")))"#; // 2 MiB
    assert_eq!(run_wat(runtime(), big, 1, 10).outcome, Outcome::MemoryExceeded { limit_bytes: 1 << 20 });
}

/// Writes argv then environ (each NUL-separated, as WASI lays them out) to stdout.
const ARGS_ENV: &str = r#"(module
  (import "wasi_snapshot_preview1" "args_sizes_get" (func $asg (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_get" (func $ag (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_sizes_get" (func $esg (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_get" (func $eg (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func $out (param $ptr i32) (param $len i32)
    (i32.store (i32.const 0) (local.get $ptr))
    (i32.store (i32.const 4) (local.get $len))
    (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))))
  (func (export "_start")
    (drop (call $asg (i32.const 16) (i32.const 20)))
    (drop (call $ag (i32.const 256) (i32.const 4096)))
    (call $out (i32.const 4096) (i32.load (i32.const 20)))
    (drop (call $esg (i32.const 16) (i32.const 20)))
    (drop (call $eg (i32.const 256) (i32.const 8192)))
    (call $out (i32.const 8192) (i32.load (i32.const 20)))))"#;

#[test]
fn args_and_env_are_exactly_as_given() {
    let rt = runtime();
    let bytes = wat::parse_str(ARGS_ENV).expect("valid wat");
    let guest = rt.load(&digest(&bytes), &bytes).expect("loads");
    let dir = JobDir::new("in.txt", b"x");
    let job = dir.guest_job(&["fname", "/input/in.txt", "a", "b c"], &[("A", "1"), ("B", "x y")], resources(16, 10));
    let run = rt.run_job(&guest, &job);
    assert_eq!(run.outcome, Outcome::Exited { exit_code: 0 });
    assert_eq!(String::from_utf8_lossy(&run.stdout), "fname\0/input/in.txt\0a\0b c\0A=1\0B=x y\0");

    // No env given: none seen (the host's HOME, PATH… are not inherited).
    let job = dir.guest_job(&["f"], &[], resources(16, 10));
    let run = rt.run_job(&guest, &job);
    assert_eq!(String::from_utf8_lossy(&run.stdout), "f\0");
}

#[test]
fn log_is_bounded_without_failing_the_guest() {
    let rt = runtime();
    let bytes = wat::parse_str(ARGS_ENV).expect("valid wat");
    let guest = rt.load(&digest(&bytes), &bytes).expect("loads");
    let dir = JobDir::new("in.txt", b"x");
    let long = "y".repeat(1000);
    let mut job = dir.guest_job(&["f", &long], &[], resources(16, 10));
    job.log_limit_bytes = 100;
    let run = rt.run_job(&guest, &job);
    assert_eq!(run.outcome, Outcome::Exited { exit_code: 0 });
    assert_eq!(run.stdout.len(), 100);
    assert_eq!(run.log_dropped, 1003 - 100);
}

#[test]
fn load_refuses_wrong_digest_non_wasm_and_non_commands() {
    let rt = runtime();
    let bytes = wat::parse_str(RETURN).expect("valid wat");
    let err = rt.load(&digest(b"other"), &bytes).err().expect("refused");
    assert!(matches!(err, ModuleError::DigestMismatch { .. }), "{err}");
    assert_eq!(rt.cached(&digest(b"other")).map(|g| g.digest().clone()), None);

    let junk = b"not wasm at all".to_vec();
    assert!(matches!(rt.load(&digest(&junk), &junk), Err(ModuleError::Compile(_))));

    let no_start = wat::parse_str(r#"(module (memory (export "memory") 1))"#).expect("valid wat");
    assert!(matches!(rt.load(&digest(&no_start), &no_start), Err(ModuleError::NotACommand(_))));

    let odd_import =
        wat::parse_str(r#"(module (import "env" "evil" (func)) (func (export "_start")))"#).expect("valid wat");
    assert!(matches!(rt.load(&digest(&odd_import), &odd_import), Err(ModuleError::NotACommand(_))));
}
