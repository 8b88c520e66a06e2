//! Real guests from `examples/` through the runtime: the sandbox holds, checksum is right.

use crate::common::{JobDir, digest, guest_bytes, names, resources, runtime};
use htfaas_functions::proto::Outcome;
use sha2::Digest as _;
use std::time::Instant;

#[test]
fn sandbox_probe_escapes_all_fail() {
    let rt = runtime();
    let bytes = guest_bytes("sandbox-probe");
    let guest = rt.load(&digest(&bytes), &bytes).expect("loads");
    let dir = JobDir::new("data.txt", b"original");
    let tmp_x_existed = std::path::Path::new("/tmp/x").exists();
    let run = rt.run_job(&guest, &dir.guest_job(&["sandbox-probe", "/input/data.txt"], &[], resources(64, 30)));
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert_eq!(run.outcome, Outcome::Exited { exit_code: 0 }, "stdout: {stdout}\nstderr: {:?}", run.stderr);

    let mut attempts = Vec::new();
    for line in stdout.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
        let attempt = v["attempt"].as_str().expect("attempt").to_owned();
        let ok = v["ok"].as_bool().expect("ok");
        eprintln!("{attempt:40} ok={ok:5} {}", v["error"]);
        attempts.push((attempt, ok));
    }
    assert!(attempts.len() >= 14, "too few attempts: {attempts:?}");
    for (attempt, ok) in &attempts {
        let expected = attempt == "create /output/ok.txt";
        assert_eq!(*ok, expected, "{attempt}: ok={ok}");
    }
    for must in ["read /etc/passwd", "create /tmp/x", "create /output/../escape", "list env", "env HOME", "env PATH"] {
        assert!(attempts.iter().any(|(a, _)| a == must), "{must} missing");
    }

    // Only output/ok.txt was written, and nothing outside the job dir.
    assert_eq!(names(dir.root.path()), ["job"]);
    assert_eq!(names(&dir.job), ["input", "output"]);
    assert_eq!(names(&dir.input), ["data.txt"]);
    assert_eq!(std::fs::read(dir.input.join("data.txt")).expect("input"), b"original");
    assert_eq!(names(&dir.output), ["ok.txt"]);
    if !tmp_x_existed {
        assert!(!std::path::Path::new("/tmp/x").exists(), "/tmp/x was created");
    }
}

#[test]
fn checksum_guest_computes_adler32_and_sha256() {
    let rt = runtime();
    let bytes = guest_bytes("checksum");
    let d = digest(&bytes);
    let started = Instant::now();
    // A fresh runtime: measure a cold compile (others may have cached it in the shared one).
    let cold = htfaas_ep::Runtime::new().expect("runtime");
    let _ = cold.load(&d, &bytes).expect("loads");
    let compile = started.elapsed();
    let guest = rt.load(&d, &bytes).expect("loads");
    let dir = JobDir::new("wiki.txt", b"Wikipedia");
    let job = dir.guest_job(&["checksum", "/input/wiki.txt"], &[], resources(64, 30));
    let started = Instant::now();
    let run = rt.run_job(&guest, &job);
    let one_run = started.elapsed();
    assert_eq!(run.outcome, Outcome::Exited { exit_code: 0 }, "{:?}", String::from_utf8_lossy(&run.stderr));
    let json = std::fs::read_to_string(dir.output.join("wiki.txt.checksums.json")).expect("output written");
    let v: serde_json::Value = serde_json::from_str(&json).expect("json");
    assert_eq!(v["file"], "wiki.txt");
    assert_eq!(v["size"], 9);
    assert_eq!(v["adler32"], "11e60398");
    assert_eq!(v["sha256"], hex::encode(sha2::Sha256::digest(b"Wikipedia")));
    assert!(String::from_utf8_lossy(&run.stdout).contains("9 bytes"));

    // Per-run overhead once compiled: median of 20 runs (fresh store, preopens, _start).
    let mut times = Vec::new();
    for _ in 0..20 {
        std::fs::remove_file(dir.output.join("wiki.txt.checksums.json")).expect("rm");
        let t = Instant::now();
        assert_eq!(rt.run_job(&guest, &job).outcome, Outcome::Exited { exit_code: 0 });
        times.push(t.elapsed());
    }
    times.sort();
    eprintln!(
        "checksum.wasm ({} B): cold compile {compile:?}; first run {one_run:?}; median run {:?}; peak memory {} B",
        bytes.len(),
        times[times.len() / 2],
        run.peak_memory_bytes
    );
}
