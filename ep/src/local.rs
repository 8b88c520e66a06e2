//! One run of a function on a local file, without a stack (`htfaas fn run`): the same runtime,
//! sandbox and limits as a job on an EP ([`Runtime`]: the pool, the memory and wall-time caps,
//! fuel when asked, `/input` read-only, `/output` read-write, no network, nothing inherited),
//! with the input staged as `/input/<name>` and the outputs that a job would store (the
//! top-level regular files of `/output`) listed with their size and SHA-256 and copied out.
//! A native function runs likewise in the EP's native sandbox ([`run_native_local`]: its image
//! unpacked into a cache of the caller's, its command under bubblewrap, seccomp and a control
//! group; root only).
//!
//! Knows the runtimes and the local filesystem; nothing of the scheduler, storage or network.

use crate::runtime::{CancelSignal, GuestJob, GuestRun, ModuleError, RunLimits, Runtime, RuntimeOptions};
use htfaas_functions::{Digest, Resources};
use sha2::{Digest as _, Sha256};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What a local run takes besides the module and the input.
#[derive(Debug, Clone)]
pub struct LocalRunOptions {
    /// Memory cap of the run, MiB (a job's `resources.memory_mb`).
    pub memory_mb: u64,
    /// Wall-time cap of the run, s (a job's `resources.runtime_s`).
    pub runtime_s: u64,
    /// The guest's whole environment (a manifest's `env`).
    pub env: Vec<(String, String)>,
    /// Arguments after the input's path (a manifest's `args`).
    pub args: Vec<String>,
    /// argv\[0\] (a job's function name).
    pub name: String,
    /// Instruction budget (fuel); `None`: not metered, as on an EP without `fuel`.
    pub fuel: Option<u64>,
    /// Bytes of stdout + stderr kept (an EP's `log_limit_bytes`).
    pub log_limit_bytes: usize,
    /// Where compiled artifacts are kept between runs (an EP's `cache_dir`); `None`: compile
    /// every time.
    pub cache_dir: Option<PathBuf>,
}

/// One output a job would store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalOutput {
    /// File name (the storage path's last segment).
    pub name: String,
    /// Bytes.
    pub size: u64,
    /// SHA-256, hex.
    pub sha256: String,
}

/// What a local run did.
#[derive(Debug, Clone)]
pub struct LocalRun {
    /// The run: outcome, stdout, stderr, usage.
    pub run: GuestRun,
    /// The module's digest.
    pub digest: Digest,
    /// Whether it is a preview 1 module or a preview 2 component.
    pub kind: crate::runtime::GuestKind,
    /// Time to make the module ready (compile, or load the cached artifact), ms.
    pub load_ms: u64,
    /// Whether the module was compiled (false: loaded from `cache_dir`).
    pub compiled: bool,
    /// The outputs a job would store, by name, copied to the output directory.
    pub outputs: Vec<LocalOutput>,
    /// What a job would not store (subdirectories, symbolic links, other files), one line each.
    pub skipped: Vec<String>,
}

/// Why a local run could not happen (a guest's failure is a [`LocalRun`] outcome instead).
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// The wasm or the input could not be read, or the directories made.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The input's file name cannot be one path segment under `/input`.
    #[error("input name {0:?} is not one clean path segment")]
    InputName(String),
    /// The runtime could not be built.
    #[error("start the runtime: {0}")]
    Runtime(String),
    /// The module could not be made ready (not wasm, not a WASI command, …).
    #[error(transparent)]
    Module(#[from] ModuleError),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LocalError {
    let what = what.into();
    move |source| LocalError::Io { what, source }
}

/// Runs the module at `wasm` on the file at `input` (staged as `/input/<its name>` under
/// `scratch`, an empty directory the caller owns and removes) and copies the outputs a job
/// would store into `out_dir` (created if missing; a file of the same name is replaced). Blocks
/// the calling thread for the compile and the run.
pub fn run_local(
    wasm: &Path,
    input: &Path,
    scratch: &Path,
    out_dir: &Path,
    opts: &LocalRunOptions,
) -> Result<LocalRun, LocalError> {
    let bytes = std::fs::read(wasm).map_err(io(format!("read {}", wasm.display())))?;
    let name = input.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
    if !crate::job::is_clean_segment(&name) {
        return Err(LocalError::InputName(name));
    }
    let options = RuntimeOptions {
        cache_dir: opts.cache_dir.clone(),
        fuel: opts.fuel,
        // One run: a pool of a few slots reserves little address space.
        max_instances: 2,
        ..RuntimeOptions::default()
    };
    let rt = Runtime::with_options(options).map_err(|e| LocalError::Runtime(format!("{e:#}")))?;
    let digest = Digest::of(&bytes);
    let started = Instant::now();
    let guest = rt.load(&digest, &bytes)?;
    let load_ms = crate::runtime::millis(started.elapsed());

    let (input_dir, output_dir) = stage(scratch, input, &name)?;
    let mut argv = vec![opts.name.clone(), format!("/input/{name}")];
    argv.extend(opts.args.iter().cloned());
    let job = GuestJob {
        argv,
        env: opts.env.clone(),
        input_dir,
        output_dir: output_dir.clone(),
        checkpoint_dir: None,
        resources: Resources::new(1, opts.memory_mb, opts.runtime_s),
        log_limit_bytes: opts.log_limit_bytes,
    };
    let run = rt.run_job_limited(&guest, &job, &CancelSignal::new(), RunLimits::default());

    let (outputs, skipped) = collect_outputs(&output_dir, out_dir)?;
    Ok(LocalRun { kind: guest.kind(), run, digest, load_ms, compiled: rt.compiled_count() > 0, outputs, skipped })
}

/// Makes `scratch/input` and `scratch/output` and stages the file at `input` as
/// `input/<name>`: the directories a run sees at `/input` and `/output`.
fn stage(scratch: &Path, input: &Path, name: &str) -> Result<(PathBuf, PathBuf), LocalError> {
    let (input_dir, output_dir) = (scratch.join("input"), scratch.join("output"));
    std::fs::create_dir(&input_dir).map_err(io("create the input directory"))?;
    std::fs::create_dir(&output_dir).map_err(io("create the output directory"))?;
    std::fs::copy(input, input_dir.join(name)).map_err(io(format!("copy {}", input.display())))?;
    Ok((input_dir, output_dir))
}

/// Copies the outputs a job would store (the top-level regular files of `output_dir`) into
/// `out_dir` (created if missing); those and what a job would not store.
fn collect_outputs(output_dir: &Path, out_dir: &Path) -> Result<(Vec<LocalOutput>, Vec<String>), LocalError> {
    std::fs::create_dir_all(out_dir).map_err(io(format!("create {}", out_dir.display())))?;
    let (mut outputs, mut skipped) = (Vec::new(), Vec::new());
    let mut entries: Vec<_> = std::fs::read_dir(output_dir)
        .map_err(io("list the outputs"))?
        .collect::<Result<_, _>>()
        .map_err(io("list the outputs"))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let raw = entry.file_name();
        let Some(file) = raw.to_str().map(str::to_owned) else {
            skipped.push(format!("{raw:?}: name is not UTF-8"));
            continue;
        };
        let meta = std::fs::symlink_metadata(entry.path()).map_err(io(format!("stat output {file}")))?;
        if meta.file_type().is_symlink() {
            skipped.push(format!("{file}: symlink"));
        } else if meta.is_dir() {
            skipped.push(format!("{file}/: directory (only top-level files are stored)"));
        } else if !meta.is_file() {
            skipped.push(format!("{file}: not a regular file"));
        } else {
            let to = out_dir.join(&file);
            let (size, sha256) =
                copy_hashing(&entry.path(), &to).map_err(io(format!("copy output {file} to {}", to.display())))?;
            outputs.push(LocalOutput { name: file, size, sha256 });
        }
    }
    Ok((outputs, skipped))
}

/// What a local native run takes besides the image, the command and the input.
#[derive(Debug, Clone)]
pub struct NativeLocalOptions {
    /// Memory cap, MiB.
    pub memory_mb: u64,
    /// Wall-time cap, s.
    pub runtime_s: u64,
    /// Cores (the cpu quota).
    pub cpus: u32,
    /// The guest's whole environment.
    pub env: Vec<(String, String)>,
    /// Arguments after the input's path.
    pub args: Vec<String>,
    /// Where unpacked images are kept between runs.
    pub cache_dir: PathBuf,
    /// The command is a handler: the input is served to it as one request (README, "The
    /// handler form"), as an EP's warm worker would get it.
    pub handler: bool,
}

/// What a local native run did.
#[derive(Debug, Clone)]
pub struct NativeLocalRun {
    /// The run: outcome, stdout, stderr, usage (from its control group).
    pub run: GuestRun,
    /// The image's digest.
    pub digest: Digest,
    /// Time to make the image ready (hash and unpack, or find it in the cache), ms.
    pub image_ms: u64,
    /// The outputs a job would store, copied to the output directory.
    pub outputs: Vec<LocalOutput>,
    /// What a job would not store.
    pub skipped: Vec<String>,
}

/// Runs `command` in the image tar at `image` on the file at `input`, in the EP's own native
/// sandbox (root, bubblewrap, cgroups: [`crate::native::host::NativeHost`]), and copies the
/// outputs a job would store into `out_dir`. `scratch` is an empty directory the caller owns.
pub async fn run_native_local(
    image: &Path,
    command: &[String],
    input: &Path,
    scratch: &Path,
    out_dir: &Path,
    opts: &NativeLocalOptions,
) -> Result<NativeLocalRun, LocalError> {
    use crate::native::host::{HostOptions, NativeHost};
    let name = input.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
    if !crate::job::is_clean_segment(&name) {
        return Err(LocalError::InputName(name));
    }
    let host_options = HostOptions {
        bwrap: PathBuf::from(crate::native::BWRAP),
        cache_dir: opts.cache_dir.clone(),
        cache_bytes: 16 << 30,
        site_images: Vec::new(),
        stage: PathBuf::from(crate::native::STAGE),
        uid_base: 900_000,
        uid_count: 16,
        gpus: Vec::new(),
        gpu_shared: Vec::new(),
        handlers_dir: scratch.join("handlers"),
        handlers: crate::native::handlers::HandlerOptions { idle_for: std::time::Duration::ZERO, max_idle: 0 },
    };
    let host = tokio::task::spawn_blocking(move || NativeHost::start(host_options))
        .await
        .map_err(|e| LocalError::Runtime(e.to_string()))?
        .map_err(|e| LocalError::Runtime(format!("native runtime: {e}")))?;
    let started = Instant::now();
    let (tar, host) = (image.to_owned(), std::sync::Arc::new(host));
    let h = host.clone();
    let (digest, root) = tokio::task::spawn_blocking(move || {
        let mut f = std::fs::File::open(&tar).map_err(io(format!("open {}", tar.display())))?;
        let mut hasher = Sha256::new();
        std::io::copy(&mut f, &mut hasher).map_err(io(format!("read {}", tar.display())))?;
        let digest = Digest::from_hasher(hasher);
        let root = h.images.unpack(&digest, &tar).map_err(|e| LocalError::Runtime(format!("image: {e}")))?;
        Ok::<_, LocalError>((digest, root))
    })
    .await
    .map_err(|e| LocalError::Runtime(e.to_string()))??;
    let image_ms = crate::runtime::millis(started.elapsed());
    let (input_dir, output_dir) = stage(scratch, input, &name)?;
    let mut argv = vec![String::new(), format!("/input/{name}")];
    argv.extend(opts.args.iter().cloned());
    let job = GuestJob {
        argv,
        env: opts.env.clone(),
        input_dir,
        output_dir: output_dir.clone(),
        checkpoint_dir: None,
        resources: Resources::new(opts.cpus, opts.memory_mb, opts.runtime_s),
        log_limit_bytes: 1 << 20,
    };
    let code = htfaas_functions::proto::NativeCode { command: command.to_vec(), handler: opts.handler, vacate_s: None };
    let run = if opts.handler {
        let f = htfaas_functions::proto::FunctionRef {
            name: "local".into(),
            version: 1,
            digest: digest.clone(),
            module_url: String::new(),
            native: Some(code.clone()),
        };
        // A run's usual bounds of `/output` (the EP's defaults); the host keeps no worker.
        let limits = crate::scratch::ScratchLimits {
            max_files: 64,
            max_output_bytes: 16 << 30,
            max_scratch_bytes: None,
            input_bytes: 0,
        };
        let cancel = CancelSignal::new();
        crate::native_job::run_handler(&host, &f, &code, &root, &job, limits, &cancel, &CancelSignal::new()).await
    } else {
        let group = format!("local-{}-{}", std::process::id(), rand::random::<u32>());
        let never = CancelSignal::new();
        crate::native_job::run(&host, &group, &code, &root, &job, &never, &never).await
    };
    let (outputs, skipped) = collect_outputs(&output_dir, out_dir)?;
    Ok(NativeLocalRun { run, digest, image_ms, outputs, skipped })
}

/// Copies `from` to `to` (replacing it), streaming; returns the size and SHA-256 (hex).
fn copy_hashing(from: &Path, to: &Path) -> std::io::Result<(u64, String)> {
    use std::io::{Read as _, Write as _};
    let mut src = std::fs::File::open(from)?;
    let mut dst = std::fs::File::create(to)?;
    let (mut hash, mut size, mut buf) = (Sha256::new(), 0u64, vec![0u8; 1 << 16]);
    loop {
        let n = src.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        dst.write_all(&buf[..n])?;
        size += n as u64;
    }
    dst.flush()?;
    Ok((size, hex::encode(hash.finalize())))
}
