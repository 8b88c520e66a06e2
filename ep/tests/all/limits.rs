//! Hostile guests against the runtime's limits (wall time, memory under the pooling allocator,
//! stack, fuel), each followed by a good guest on the same runtime; and the compiled-artifact
//! cache on disk: reused after a restart, never trusted when its tag does not verify.

use crate::common::{JobDir, digest, resources};
use htfaas_ep::runtime::{ARTIFACT_MAGIC, Guest, GuestRun, ModuleError, Runtime, RuntimeOptions};
use htfaas_functions::proto::Outcome;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn load(rt: &Runtime, wat: &str) -> Guest {
    let bytes = wat::parse_str(wat).expect("valid wat");
    rt.load(&digest(&bytes), &bytes).expect("loads")
}

fn run(rt: &Runtime, guest: &Guest, memory_mb: u64, runtime_s: u64) -> GuestRun {
    let dir = JobDir::new("in.txt", b"x");
    rt.run_job(guest, &dir.guest_job(&["f", "/input/in.txt"], &[], resources(memory_mb, runtime_s)))
}

/// Writes "ok\n" to stdout and returns.
const GOOD: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 64) "ok\n")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 64))
    (i32.store (i32.const 4) (i32.const 3))
    (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"#;

/// After a hostile guest: the same runtime still runs a good one.
fn assert_serves_on(rt: &Runtime) {
    let run = run(rt, &load(rt, GOOD), 16, 10);
    assert_eq!(run.outcome, Outcome::Exited { exit_code: 0 }, "notes: {:?}", run.notes);
    assert_eq!(run.stdout, b"ok\n");
}

const SPIN: &str = r#"(module (memory (export "memory") 1) (func (export "_start") (loop br 0)))"#;

/// Marks its memory, then grows it 1 MiB at a time until refused, then aborts as Rust does.
const MEMORY_BOMB: &str = r#"(module (memory (export "memory") 1)
  (func (export "_start")
    (i32.store (i32.const 1024) (i32.const 77))
    (loop $grow (br_if $grow (i32.ne (memory.grow (i32.const 16)) (i32.const -1))))
    unreachable))"#;

/// Recurses without end.
const RECURSE: &str = r#"(module (memory (export "memory") 1)
  (func $down (param i64) (result i64) (i64.add (call $down (i64.add (local.get 0) (i64.const 1))) (i64.const 1)))
  (func (export "_start") (drop (call $down (i64.const 0)))))"#;

/// Counts to 10 000 in a loop of 8 instructions, then returns.
const COUNT_10K: &str = r#"(module (memory (export "memory") 1)
  (func (export "_start") (local $i i32)
    (loop $l
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 10000))))))"#;

/// Exits with the word at address 1024, after writing 77 there: 0 unless the memory it got had
/// been used before.
const READ_THEN_MARK: &str = r#"(module
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (func (export "_start") (local $old i32)
    (local.set $old (i32.load (i32.const 1024)))
    (i32.store (i32.const 1024) (i32.const 77))
    (call $exit (local.get $old))))"#;

#[test]
fn an_endless_loop_is_time_exceeded_and_the_runtime_serves_on() {
    let rt = Runtime::new().expect("runtime");
    let started = Instant::now();
    let run = run(&rt, &load(&rt, SPIN), 16, 1);
    let took = started.elapsed();
    assert_eq!(run.outcome, Outcome::TimeExceeded { limit_s: 1, vacate: None });
    assert!(took >= Duration::from_millis(950) && took < Duration::from_secs(3), "took {took:?}");
    assert_eq!(run.instructions, None, "no fuel configured: no metering");
    assert_serves_on(&rt);
}

#[test]
fn a_memory_bomb_is_memory_exceeded_under_pooling_and_the_runtime_serves_on() {
    let rt = Runtime::new().expect("runtime");
    assert!(rt.is_pooling(), "the default runtime takes instances from the pool");
    let run = run(&rt, &load(&rt, MEMORY_BOMB), 64, 10);
    assert_eq!(run.outcome, Outcome::MemoryExceeded { limit_bytes: 64 << 20 }, "notes: {:?}", run.notes);
    // It got all it could: 1 page, then 16-page steps while they fit in 64 MiB (1024 pages).
    assert_eq!(run.peak_memory_bytes, (1 + 16 * 63) * 65536, "peak");
    assert_serves_on(&rt);
}

#[test]
fn a_job_asking_more_memory_than_the_ep_accepts_is_capped_at_the_ep_maximum() {
    let rt = Runtime::with_options(RuntimeOptions { max_memory_bytes: 32 << 20, ..RuntimeOptions::default() })
        .expect("runtime");
    assert!(rt.is_pooling());
    let run = run(&rt, &load(&rt, MEMORY_BOMB), 1024, 10);
    assert_eq!(run.outcome, Outcome::MemoryExceeded { limit_bytes: 32 << 20 }, "notes: {:?}", run.notes);
    assert!(run.peak_memory_bytes <= 32 << 20 && run.peak_memory_bytes > 30 << 20, "peak {}", run.peak_memory_bytes);
    assert_serves_on(&rt);
}

#[test]
fn a_pooled_memory_is_wiped_before_the_next_guest_gets_it() {
    let rt = Runtime::with_options(RuntimeOptions { max_instances: 2, ..RuntimeOptions::default() }).expect("runtime");
    assert!(rt.is_pooling());
    let guest = load(&rt, READ_THEN_MARK);
    for round in 0..4 {
        assert_eq!(run(&rt, &guest, 16, 10).outcome, Outcome::Exited { exit_code: 0 }, "round {round}");
    }
    // The bomb marks the same address before being stopped; its slot is wiped too.
    assert!(matches!(run(&rt, &load(&rt, MEMORY_BOMB), 4, 10).outcome, Outcome::MemoryExceeded { .. }));
    assert_eq!(run(&rt, &guest, 16, 10).outcome, Outcome::Exited { exit_code: 0 });
}

#[test]
fn endless_recursion_traps_as_call_stack_exhausted_and_the_runtime_serves_on() {
    let rt = Runtime::new().expect("runtime");
    let guest = load(&rt, RECURSE);
    for _ in 0..3 {
        match &run(&rt, &guest, 16, 10).outcome {
            Outcome::Trapped { message } => assert!(message.starts_with("call stack exhausted"), "{message}"),
            other => panic!("want Trapped, got {other:?}"),
        }
    }
    assert_serves_on(&rt);
}

#[test]
fn a_spent_fuel_budget_is_fuel_exhausted_with_the_budget_counted_and_the_runtime_serves_on() {
    let budget = 5_000_000;
    let rt =
        Runtime::with_options(RuntimeOptions { fuel: Some(budget), ..RuntimeOptions::default() }).expect("runtime");
    assert_eq!(rt.fuel(), Some(budget));
    let started = Instant::now();
    let run_ = run(&rt, &load(&rt, SPIN), 16, 30);
    assert_eq!(run_.outcome, Outcome::FuelExhausted { limit: budget });
    assert!(started.elapsed() < Duration::from_secs(5), "fuel, not the 30 s cap, ended it");
    let used = run_.instructions.expect("metered");
    assert!(used <= budget && used + 1000 >= budget, "used {used} of {budget}");

    // A guest within the budget is counted: about 8 instructions per iteration.
    let run_ = run(&rt, &load(&rt, COUNT_10K), 16, 10);
    assert_eq!(run_.outcome, Outcome::Exited { exit_code: 0 });
    let used = run_.instructions.expect("metered");
    assert!((60_000..=100_000).contains(&used), "used {used}");
    assert_serves_on(&rt);
}

#[test]
fn without_room_for_the_pool_the_runtime_allocates_on_demand() {
    // A million slots of ~4 GiB of address space each is more than any x86-64 process has.
    let rt = Runtime::with_options(RuntimeOptions { max_instances: 1_000_000, ..RuntimeOptions::default() })
        .expect("runtime");
    assert!(!rt.is_pooling());
    let run = run(&rt, &load(&rt, MEMORY_BOMB), 8, 10);
    assert_eq!(run.outcome, Outcome::MemoryExceeded { limit_bytes: 8 << 20 });
    assert_serves_on(&rt);

    let rt = Runtime::with_options(RuntimeOptions { pooling: false, ..RuntimeOptions::default() }).expect("runtime");
    assert!(!rt.is_pooling());
    assert_serves_on(&rt);
}

// ---------------------------------------------------------------------------------------------
// Compiled artifacts on disk.

fn cached_runtime(dir: &Path) -> Runtime {
    Runtime::with_options(RuntimeOptions { cache_dir: Some(dir.to_owned()), ..RuntimeOptions::default() })
        .expect("runtime")
}

fn artifact_path(dir: &Path, wat: &str) -> PathBuf {
    let bytes = wat::parse_str(wat).expect("valid wat");
    cached_runtime(dir).artifact_path(&digest(&bytes)).expect("a runtime with a cache dir")
}

fn fueled_runtime(dir: &Path) -> Runtime {
    Runtime::with_options(RuntimeOptions {
        cache_dir: Some(dir.to_owned()),
        fuel: Some(1_000_000),
        ..RuntimeOptions::default()
    })
    .expect("runtime")
}

/// (compiled, loaded from disk, rejected) so far.
fn counts(rt: &Runtime) -> (u64, u64, u64) {
    (rt.compiled_count(), rt.loaded_from_disk_count(), rt.rejected_from_disk_count())
}

/// Compiles GOOD into `dir` with a runtime of its own, and returns the artifact's path.
fn seed(dir: &Path) -> PathBuf {
    let rt = cached_runtime(dir);
    load(&rt, GOOD);
    assert_eq!(counts(&rt), (1, 0, 0));
    let path = artifact_path(dir, GOOD);
    let file = std::fs::read(&path).expect("artifact written");
    assert!(file.starts_with(ARTIFACT_MAGIC) && file.len() > 1000, "{} bytes", file.len());
    path
}

/// A restarted runtime on `dir` compiles GOOD again (the artifact was refused) and rewrites it:
/// the next restart loads it.
fn assert_refused_then_rewritten(dir: &Path) {
    let rt = cached_runtime(dir);
    assert_serves_on(&rt);
    assert_eq!(counts(&rt), (1, 0, 1), "(compiled, loaded, rejected)");
    let rt = cached_runtime(dir);
    assert_serves_on(&rt);
    assert_eq!(counts(&rt), (0, 1, 0), "the rewritten artifact is good");
}

#[test]
fn a_restarted_runtime_loads_from_disk_without_compiling() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    seed(&cache);
    let key = std::fs::metadata(cache.join("key")).expect("key made");
    assert_eq!(key.len(), 32);
    assert_eq!(key.permissions().mode() & 0o777, 0o600);

    let rt = cached_runtime(&cache);
    assert_serves_on(&rt);
    assert_eq!(counts(&rt), (0, 1, 0), "(compiled, loaded, rejected)");
    // In memory from now on: no second read.
    assert_serves_on(&rt);
    assert_eq!(counts(&rt), (0, 1, 0));
    let left: Vec<_> = std::fs::read_dir(&cache).expect("ls").flatten().map(|e| e.file_name()).collect();
    assert_eq!(left.len(), 2, "key and one artifact, no temporary files: {left:?}");
}

#[test]
fn a_flipped_byte_in_the_artifact_or_its_tag_is_refused_and_recompiled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = seed(dir.path());
    let good = std::fs::read(&path).expect("read");
    // The last byte (artifact), one in the middle (artifact), the first byte of the tag.
    for at in [good.len() - 1, good.len() / 2, ARTIFACT_MAGIC.len()] {
        let mut bad = good.clone();
        bad[at] ^= 0x01;
        std::fs::write(&path, &bad).expect("tamper");
        assert_refused_then_rewritten(dir.path());
        assert_eq!(std::fs::read(&path).expect("read"), good, "rewritten as it was (compiling is deterministic)");
    }
}

#[test]
fn a_truncated_or_headerless_artifact_is_refused_and_recompiled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = seed(dir.path());
    let good = std::fs::read(&path).expect("read");
    for bad in [&good[..good.len() / 2], &good[..10], &good[ARTIFACT_MAGIC.len() + 32..], b"".as_slice()] {
        std::fs::write(&path, bad).expect("tamper");
        assert_refused_then_rewritten(dir.path());
    }
}

#[test]
fn an_artifact_from_another_key_dir_or_for_another_module_is_refused() {
    let a = tempfile::tempdir().expect("tempdir");
    let b = tempfile::tempdir().expect("tempdir");
    let from_a = seed(a.path());
    drop(cached_runtime(b.path())); // b gets its own key, no artifact
    let in_b = b.path().join(from_a.file_name().expect("name"));
    std::fs::copy(&from_a, &in_b).expect("copy");
    assert_refused_then_rewritten(b.path());

    // Same key, but the artifact of another module under GOOD's name.
    let other = cached_runtime(a.path());
    load(&other, COUNT_10K);
    std::fs::copy(artifact_path(a.path(), COUNT_10K), &from_a).expect("copy");
    assert_refused_then_rewritten(a.path());
}

#[test]
fn a_missing_or_unfit_key_means_recompiling() {
    let dir = tempfile::tempdir().expect("tempdir");
    seed(dir.path());
    let key = dir.path().join("key");
    let first = std::fs::read(&key).expect("key");
    std::fs::remove_file(&key).expect("rm key");
    assert_refused_then_rewritten(dir.path());
    let second = std::fs::read(&key).expect("new key");
    assert_ne!(first, second, "a fresh random key");

    // A key others could read is not a secret any more: replaced.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    assert_refused_then_rewritten(dir.path());
    assert_ne!(std::fs::read(&key).expect("key"), second);
    assert_eq!(std::fs::metadata(&key).expect("key").permissions().mode() & 0o777, 0o600);
}

#[test]
fn an_artifact_for_another_engine_configuration_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plain = seed(dir.path()); // without fuel
    // Put under the fueled engine's name, the plain engine's artifact does not verify.
    let fueled = fueled_runtime(dir.path());
    let good = wat::parse_str(GOOD).expect("valid wat");
    let fueled_path = fueled.artifact_path(&digest(&good)).expect("cache dir");
    assert_ne!(plain, fueled_path, "each engine configuration has its own file name");
    std::fs::copy(&plain, &fueled_path).expect("copy");
    assert_serves_on(&fueled);
    assert_eq!(counts(&fueled), (1, 0, 1), "(compiled, loaded, rejected)");
}

#[test]
fn engines_with_different_settings_share_a_cache_dir_without_evicting_each_other() {
    let dir = tempfile::tempdir().expect("tempdir");
    seed(dir.path()); // without fuel
    let fueled = fueled_runtime(dir.path());
    assert_serves_on(&fueled);
    assert_eq!(counts(&fueled), (1, 0, 0), "no artifact of its own yet: compiled, nothing refused");
    // Restarted, each finds its own artifact.
    let plain = cached_runtime(dir.path());
    assert_serves_on(&plain);
    assert_eq!(counts(&plain), (0, 1, 0));
    let fueled = fueled_runtime(dir.path());
    assert_serves_on(&fueled);
    assert_eq!(counts(&fueled), (0, 1, 0));
}

#[test]
fn the_bytes_are_checked_against_the_digest_before_the_disk_is_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    seed(dir.path());
    let rt = cached_runtime(dir.path());
    let good = wat::parse_str(GOOD).expect("valid wat");
    let other = wat::parse_str(SPIN).expect("valid wat");
    let err = rt.load(&digest(&good), &other).err().expect("refused");
    assert!(matches!(err, ModuleError::DigestMismatch { .. }), "{err}");
    assert_eq!(counts(&rt), (0, 0, 0), "nothing compiled, nothing read");
}

/// A module printing `n` (distinct bytes, so distinct digests).
fn numbered(n: u32) -> String {
    format!(r#"(module (memory (export "memory") 1) (func (export "_start") i32.const {n} drop))"#)
}

#[test]
fn the_module_caches_are_bounded_in_memory_and_on_disk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::with_options(RuntimeOptions {
        cache_dir: Some(dir.path().to_owned()),
        max_cached_modules: 2,
        max_disk_artifacts: 2,
        ..RuntimeOptions::default()
    })
    .expect("runtime");
    let guests: Vec<Guest> = (0..3).map(|n| load(&rt, &numbered(n))).collect();
    // Memory: the least recently used (0) went when the third came.
    assert_eq!(rt.cached_count(), 2);
    assert!(rt.cached(guests[0].digest()).is_none());
    assert!(rt.cached(guests[1].digest()).is_some() && rt.cached(guests[2].digest()).is_some());
    // Using 1 makes 2 the oldest: loading 0 again drops 2.
    assert!(rt.cached(guests[1].digest()).is_some());
    load(&rt, &numbered(0));
    assert!(rt.cached(guests[2].digest()).is_none() && rt.cached(guests[1].digest()).is_some());
    // Disk: at most two artifacts stay.
    let artifacts = std::fs::read_dir(dir.path())
        .expect("read dir")
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
        .count();
    assert_eq!(artifacts, 2);
}
