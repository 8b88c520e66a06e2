//! Shared helpers: the example guests, built once per test binary.

use htfaas_ep::runtime::{GuestJob, Runtime};
use htfaas_functions::{Digest, Resources};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Builds `examples/` for wasm32-wasip1 and wasm32-wasip2 (once) and returns `examples/target`.
fn examples_target() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/Cargo.toml");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let started = std::time::Instant::now();
        let status = std::process::Command::new(cargo)
            .args(["build", "--release", "--target", "wasm32-wasip1", "--target", "wasm32-wasip2", "--manifest-path"])
            .arg(&manifest)
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .status()
            .expect("run cargo build for examples/");
        assert!(status.success(), "building examples/ failed: {status}");
        eprintln!("built examples/ in {:?}", started.elapsed());
        manifest.parent().expect("examples dir").join("target")
    })
}

/// The release directory of the preview 1 guests (core modules).
pub fn guests_dir() -> PathBuf {
    examples_target().join("wasm32-wasip1/release")
}

/// Bytes of an example guest built as a preview 1 module, e.g. `checksum`.
pub fn guest_bytes(name: &str) -> Vec<u8> {
    let path = guests_dir().join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Bytes of an example guest built as a preview 2 component (same source).
pub fn component_bytes(name: &str) -> Vec<u8> {
    let path = examples_target().join(format!("wasm32-wasip2/release/{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// One runtime per test binary is what an EP has; tests also make their own where they must.
pub fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| Runtime::new().expect("runtime starts"))
}

/// A job dir with `input/` holding `name` = `content`, and an empty `output/`.
pub struct JobDir {
    pub root: tempfile::TempDir,
    pub job: PathBuf,
    pub input: PathBuf,
    pub output: PathBuf,
}

impl JobDir {
    pub fn new(name: &str, content: &[u8]) -> JobDir {
        let root = tempfile::tempdir().expect("tempdir");
        let job = root.path().join("job");
        let input = job.join("input");
        let output = job.join("output");
        std::fs::create_dir_all(&input).expect("mkdir input");
        std::fs::create_dir_all(&output).expect("mkdir output");
        std::fs::write(input.join(name), content).expect("write input");
        JobDir { root, job, input, output }
    }

    pub fn guest_job(&self, argv: &[&str], env: &[(&str, &str)], resources: Resources) -> GuestJob {
        GuestJob {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            input_dir: self.input.clone(),
            output_dir: self.output.clone(),
            checkpoint_dir: None,
            resources,
            log_limit_bytes: 64 * 1024,
        }
    }
}

pub fn resources(memory_mb: u64, runtime_s: u64) -> Resources {
    Resources::new(1, memory_mb, runtime_s)
}

pub fn digest(bytes: &[u8]) -> Digest {
    Digest::of(bytes)
}

/// Sorted names in `dir`.
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}
