//! A compute-bound guest against the same code compiled natively (the target: within
//! 1.5×).
//!
//! `calibrate`: the kernel of `examples/calibrate` (`src/kernel.rs`, included here by path, so
//! both sides compile the very same source) on 64 MiB of synthetic waveforms, (a) natively in
//! this process and (b) as `examples/target/wasm32-wasip1/release/calibrate.wasm` in the EP's
//! [`Runtime`], a job with the file under `/input`. Only the kernel is compared: the guest
//! reads the file first, then times the kernel with its monotonic clock (WASI
//! `clock_time_get`) and prints `compute_ms=` on stderr; the native side times the same call
//! with `Instant`. Both take the median of the runs. The guest's output must equal the
//! native result byte for byte, or the bench fails. The whole job's wall time is printed too,
//! so the I/O and instantiation overhead shows. The kernel's hot loops are built with wasm
//! SIMD (`simd128`) in the guest, as they are with SSE2 natively (see the kernel's docs).
//!
//! `convert` (C, when `cc` is installed): `examples/c/convert/convert.c` compiled with
//! `cc -O2` against `convert.wasm` (clang, wasi-libc) on a 16 MiB CSV, whole run against whole
//! run (parsing dominates; the native side includes process start), outputs compared.
//!
//! `cargo bench -p htfaas-ep --bench compute` prints one JSON line per figure:
//! `{"bench":..,"native_ms":..,"wasm_ms":..,"ratio":..,"target":1.5,..}` (`target` only for
//! `calibrate`). Native and wasm runs alternate. Without `--bench` (as `cargo test --benches`
//! runs it) a 1 MiB input, one run each, same checks, nothing timed.
//! The guests are built first (`cargo build --release --target wasm32-wasip1` in `examples/`,
//! `examples/c/build.sh`); the bench stops with a message if that fails.

#[path = "../../examples/calibrate/src/kernel.rs"]
#[allow(dead_code)]
mod kernel;

use htfaas_ep::Runtime;
use htfaas_ep::runtime::{GuestJob, GuestRun};
use htfaas_functions::proto::Outcome;
use htfaas_functions::{Digest, Resources};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

/// Channels of the synthetic input.
const CHANNELS: usize = 16;
/// Pedestal passes (the example's default).
const PASSES: u32 = 4;

fn main() -> ExitCode {
    let timed = std::env::args().any(|a| a == "--bench");
    match run(timed) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("compute bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(timed: bool) -> Result<(), String> {
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    build_guests(&examples)?;
    let runs = if timed { 5 } else { 1 };
    let rt = Runtime::new().map_err(|e| format!("start the runtime: {e:#}"))?;
    let mib = if timed { 64 } else { 1 };
    bench_calibrate(&rt, &examples, mib, runs, timed)?;
    if cc_available() {
        bench_convert(&rt, &examples, if timed { 16 } else { 1 }, runs, timed)?;
    } else {
        println!("{{\"bench\":\"compute.convert\",\"skipped\":\"no cc (gcc) installed\"}}");
    }
    Ok(())
}

/// Builds the Rust guests and the C guest; a no-op when they are up to date.
fn build_guests(examples: &Path) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["build", "--release", "--target", "wasm32-wasip1", "--manifest-path"])
        .arg(examples.join("Cargo.toml"))
        .output()
        .map_err(|e| format!("run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "building the Rust guests failed (wasm32-wasip1 target installed? scripts/install-deps.sh):\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let out =
        Command::new(examples.join("c/build.sh")).output().map_err(|e| format!("run examples/c/build.sh: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "building the C guest failed (clang, lld, wasi-libc: scripts/install-deps.sh):\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

fn bench_calibrate(rt: &Runtime, examples: &Path, mib: usize, runs: usize, timed: bool) -> Result<(), String> {
    let waveforms = mib * (1 << 20) / (4 * kernel::WINDOW);
    let samples = kernel::synthesize(waveforms, CHANNELS, 42);
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let input = "waves.f32";
    write_input(dir.path(), input, &kernel::to_le_bytes(&samples))?;

    let wasm = examples.join("target/wasm32-wasip1/release/calibrate.wasm");
    let argv = vec!["calibrate".into(), format!("/input/{input}")];
    let (mut native, mut guest_ms, mut wall_ms) = (Vec::new(), Vec::new(), Vec::new());
    // Native and wasm runs alternate, so a busy neighbour on the machine hits both sides alike.
    for _ in 0..runs {
        let t = Instant::now();
        let summary = kernel::calibrate(std::hint::black_box(&samples), CHANNELS, PASSES)?;
        native.push(t.elapsed().as_secs_f64() * 1000.0);
        let expected = kernel::to_json(input, &summary);
        let run = run_guest(rt, &wasm, dir.path(), argv.clone())?;
        let stderr = String::from_utf8_lossy(&run.stderr);
        let ms = stderr
            .split("compute_ms=")
            .nth(1)
            .and_then(|s| s.trim().parse::<f64>().ok())
            .ok_or_else(|| format!("no compute_ms= in the guest's stderr: {stderr}"))?;
        guest_ms.push(ms);
        wall_ms.push(run.wall_ms as f64);
        let got = std::fs::read_to_string(dir.path().join(format!("output/{input}.calib.json")))
            .map_err(|e| format!("read the guest's output: {e}"))?;
        if got != expected {
            return Err(format!("the guest's output differs from the native result:\n{got}\nvs\n{expected}"));
        }
    }
    let method = "kernel only (guest clock)";
    report("compute.calibrate", mib, runs, timed, &native, &guest_ms, Some(&wall_ms), Some(1.5), method);
    Ok(())
}

fn bench_convert(rt: &Runtime, examples: &Path, mib: usize, runs: usize, timed: bool) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let native_bin = dir.path().join("convert-native");
    let src = examples.join("c/convert/convert.c");
    let out = Command::new("cc")
        .args(["-O2", "-std=c11", "-o"])
        .arg(&native_bin)
        .arg(&src)
        .arg("-lm")
        .output()
        .map_err(|e| format!("run cc: {e}"))?;
    if !out.status.success() {
        return Err(format!("cc {}: {}", src.display(), String::from_utf8_lossy(&out.stderr)));
    }
    let input = "samples.csv";
    write_input(dir.path(), input, &synthetic_csv(mib << 20))?;
    // The native binary takes the output directory as its second argument (the guest's is /output).
    let native_out = dir.path().join("native-out");
    std::fs::create_dir_all(&native_out).map_err(|e| format!("mkdir: {e}"))?;

    let wasm = examples.join("target/wasm32-wasip1/release/convert.wasm");
    let argv = vec!["convert".into(), format!("/input/{input}")];
    let (mut native, mut wall) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let t = Instant::now();
        let out = Command::new(&native_bin)
            .arg(dir.path().join("input").join(input))
            .arg(&native_out)
            .output()
            .map_err(|e| format!("run the native convert: {e}"))?;
        native.push(t.elapsed().as_secs_f64() * 1000.0);
        if !out.status.success() {
            return Err(format!("native convert failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        let run = run_guest(rt, &wasm, dir.path(), argv.clone())?;
        wall.push(run.wall_ms as f64);
    }
    for ext in ["summary.json", "f32"] {
        let name = format!("{input}.{ext}");
        let a = std::fs::read(native_out.join(&name)).map_err(|e| format!("read native {name}: {e}"))?;
        let b = std::fs::read(dir.path().join("output").join(&name)).map_err(|e| format!("read guest {name}: {e}"))?;
        if a != b {
            return Err(format!("convert: the guest's {name} differs from the native one"));
        }
    }
    let method = "whole run (cc -O2 process vs wasm job; glibc vs wasi-libc strtod)";
    report("compute.convert", mib, runs, timed, &native, &wall, None, None, method);
    Ok(())
}

/// Writes `bytes` to `<dir>/input/<name>` and makes an empty `<dir>/output`.
fn write_input(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), String> {
    std::fs::create_dir_all(dir.join("input")).map_err(|e| format!("mkdir: {e}"))?;
    std::fs::create_dir_all(dir.join("output")).map_err(|e| format!("mkdir: {e}"))?;
    std::fs::write(dir.join("input").join(name), bytes).map_err(|e| format!("write the input: {e}"))
}

/// Loads `wasm` and runs it once as a job over `<dir>/input` and `<dir>/output`; an exit other
/// than 0 is an error.
fn run_guest(rt: &Runtime, wasm: &Path, dir: &Path, argv: Vec<String>) -> Result<GuestRun, String> {
    let bytes = std::fs::read(wasm).map_err(|e| format!("read {}: {e}", wasm.display()))?;
    let guest = rt.load(&Digest::of(&bytes), &bytes).map_err(|e| format!("load {}: {e}", wasm.display()))?;
    let job = GuestJob {
        argv,
        env: vec![],
        input_dir: dir.join("input"),
        output_dir: dir.join("output"),
        checkpoint_dir: None,
        resources: Resources::new(1, 1024, 600),
        log_limit_bytes: 64 * 1024,
    };
    let run = rt.run_job(&guest, &job);
    if run.outcome != (Outcome::Exited { exit_code: 0 }) {
        return Err(format!("guest ended with {:?}: {}", run.outcome, String::from_utf8_lossy(&run.stderr)));
    }
    Ok(run)
}

/// A CSV of detector samples: a header and rows of 8 columns, about `bytes` long.
fn synthetic_csv(bytes: usize) -> Vec<u8> {
    let mut s = String::from("event,adc0,adc1,adc2,adc3,temp,hv,time\n");
    let mut i = 0u64;
    while s.len() < bytes {
        let x = (i.wrapping_mul(2_654_435_761) % 10_007) as f64;
        s.push_str(&format!(
            "{i},{},{},{},{},{:.3},{:.1},{:.6}\n",
            100 + (i % 97),
            x as u64,
            (x * 0.37) as u64,
            4095 - (i % 4096),
            21.5 + x / 1e4,
            1500.0 - x / 100.0,
            i as f64 * 2.5e-5
        ));
        i += 1;
    }
    s.into_bytes()
}

fn cc_available() -> bool {
    Command::new("cc").arg("--version").output().is_ok_and(|o| o.status.success())
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One JSON line (timed), or one smoke line.
#[allow(clippy::too_many_arguments)]
fn report(
    bench: &str,
    mib: usize,
    runs: usize,
    timed: bool,
    native: &[f64],
    wasm: &[f64],
    wall: Option<&[f64]>,
    target: Option<f64>,
    method: &str,
) {
    if !timed {
        println!("{bench}: ok (smoke; run `cargo bench -p htfaas-ep --bench compute` to time)");
        return;
    }
    let (n, w) = (median(native), median(wasm));
    let wall = wall.map(|w| format!(",\"wasm_job_wall_ms\":{:.1}", median(w))).unwrap_or_default();
    let target = target.map(|t| format!(",\"target\":{t}")).unwrap_or_default();
    println!(
        "{{\"bench\":\"{bench}\",\"input_mib\":{mib},\"runs\":{runs},\"native_ms\":{n:.1},\"wasm_ms\":{w:.1},\
         \"ratio\":{:.3}{target}{wall},\"method\":\"{method}\"}}",
        w / n
    );
}
