//! The EP's configuration: [`Config`] as read from its file, and [`Config::resolve`] into
//! [`Settings`] (engine, linker, HTTP client, TLS trust, directories, the slots and labels
//! advertised), built once at start.
//!
//! Above the runtime (it builds one) and below the job and the link (which read settings);
//! must not know about the attach protocol or a job's steps.

use crate::lifecycle::{Activity, Lease};
use crate::native::host::NativeHost;
use crate::runtime::{Runtime, RuntimeOptions};
use anyhow::{Context as _, anyhow, bail};
use htfaas_functions::Resources;
use htfaas_functions::manifest::check_name;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// EP configuration, as read from the EP's config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// EP name, for logs and job records. Required.
    pub name: String,
    /// Scheduler base URL, e.g. `http://127.0.0.1:8081`; the EP dials `ws(s)://…/v1/ep/attach`
    /// (`http` becomes `ws`, `https` becomes `wss`). Required.
    pub scheduler_url: String,
    /// Attach token (JWT), sent as `Authorization: Bearer` on the upgrade request. Required;
    /// `htfaas ep` takes it from the environment variable `HTFAAS_ATTACH_TOKEN` instead when
    /// that is set (so that a batch job's EP has it in no file and no argument).
    #[serde(default)]
    pub attach_token: String,
    /// Total resources advertised: `cpus`, `memory_mb`, `disk_mb` (scratch), `gpus`; and
    /// `runtime_s`, the longest job accepted (default 3600). A field left out is detected at
    /// start (see [`crate::detect`]): cores (cgroup quota included), memory (cgroup limit included)
    /// less max(512 MiB, 10 %), free disk of `work_dir` less max(1 GiB, 5 %), NVIDIA GPUs
    /// (`/dev/nvidia<N>`); `cpus` and `memory_mb` set to 0 are detected too, while `gpus: 0`
    /// and `disk_mb: 0` mean none (so detected GPUs can be kept from jobs). Leaving `slots` out
    /// detects all four. Values given are used as they are. What is advertised is logged at
    /// start. Default: all detected.
    #[serde(default = "detected_slots", deserialize_with = "slots_or_detect")]
    pub slots: Resources,
    /// Scratch directory: `modules/` (module cache), `refs/` (reference files by content, see
    /// [`Config::ref_cache_mb`]) and `jobs/<job id>/` (per-job input and output; emptied at
    /// start). Required.
    pub work_dir: PathBuf,
    /// Bytes of guest stdout + stderr kept per job. Default: 65536 (64 KiB).
    #[serde(default = "default_log_limit_bytes")]
    pub log_limit_bytes: usize,
    /// Most output files stored per job. Default: 64.
    #[serde(default = "default_max_output_files")]
    pub max_output_files: usize,
    /// Most output bytes stored per job. Default: 17179869184 (16 GiB).
    #[serde(default = "default_max_output_bytes")]
    pub max_output_bytes: u64,
    /// Leave (drain, then exit) this many seconds after start, like an annex's lease on its
    /// machine. Default: none.
    #[serde(default)]
    pub lifetime_s: Option<u64>,
    /// Leave after running no job for this many seconds. Default: none.
    #[serde(default)]
    pub idle_shutdown_s: Option<u64>,
    /// The annex this EP is meant to join (`htfaas ep --annex NAME` sets it before
    /// [`Config::resolve`]), sent in `Hello`. Only a declaration of intent: the scheduler takes
    /// the annex from the attach token and ends the session (close code 4403) when the two
    /// differ, so a mistake shows at once. Must match `[a-z0-9][a-z0-9_-]{0,62}`. Default: none.
    #[serde(default)]
    pub annex: Option<String>,
    /// Extra CA certificates (PEM, one or more) trusted besides the system's roots, for the
    /// `wss://` attach link and for HTTPS module and storage transfers, e.g. a site CA that
    /// signed the scheduler's certificate. An untrusted scheduler certificate is retried, with
    /// a warning, never final. Default: none.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// Free-form labels sent in `Hello` (site, rack, GPU model, ...) and shown by
    /// `htfaas ep list`. At most 32; keys 1-128 bytes, values at most 128 bytes, no control
    /// characters (what the scheduler accepts). Detected facts are added under keys not given
    /// here, while fewer than 32: `arch`, `os`, and `gpu.model` when `nvidia-smi` names the
    /// GPUs. Default: none (only the detected ones).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Most bytes one job may hold in its scratch directory (input plus outputs, while it
    /// runs); a job past it ends with its own reason. Default: none (the output limits apply).
    #[serde(default)]
    pub max_scratch_mb: Option<u64>,
    /// Instruction budget per job (wasmtime fuel, about one unit per wasm instruction). When
    /// set, every job is metered, its count recorded in its usage, and a job past the budget
    /// ends as `fuel_exhausted`. Default: none (not metered; metering costs some speed).
    #[serde(default)]
    pub fuel: Option<u64>,
    /// Address of the Prometheus metrics listener (`GET /metrics`, OpenMetrics text; see
    /// `metrics`). It asks for no token, so bind it to loopback or a monitoring network; it
    /// serves counts, durations and the advertised slots, never a secret, path, job id or
    /// function name. Port 0 picks a free port, read back from [`Settings::metrics_addr`].
    /// Default: none (no listener).
    #[serde(default)]
    pub metrics_listen: Option<SocketAddr>,
    /// Origins (`http(s)://host[:port]`, or `http(s)://host:*` for any port) a job's module,
    /// input and outputs may be at. A job naming a URL elsewhere fails before anything is
    /// fetched (`module_failed`, `input_failed` or `output_failed`, naming the URL's origin),
    /// and a redirect elsewhere fails its transfer. List the gateway's public URL (modules),
    /// every storage door, and the pool nodes a dCache door redirects to. An empty list allows
    /// nothing. Default: the host of `scheduler_url`, any port, http or https — where the local
    /// stack runs the gateway and the storage; a site with other hosts must list them.
    #[serde(default)]
    pub allowed_origins: Option<Vec<String>>,
    /// Most WASI resources one job holds at once: open files and directories (each a host
    /// descriptor), streams and pollables, preopens and stdio included; a guest past it traps
    /// ("too many open files"). Default: 256.
    #[serde(default = "default_max_open_files")]
    pub max_open_files: usize,
    /// Longest compilation of one module, seconds; a module taking longer is refused
    /// (`module_failed`, "compile: took longer than …"), and so is every later job of the same
    /// digest on this EP, without compiling again. Default: 300.
    #[serde(default = "default_compile_timeout_s")]
    pub compile_timeout_s: u64,
    /// Prefetch: how many assigned jobs beyond its free resources the EP asks the
    /// scheduler for, held in a local queue and started the moment resources free (so a slot
    /// does not idle for a dispatch round trip after each job); the scheduler may grant fewer,
    /// and refills the queue once half of it is free (several jobs per dispatch round and
    /// frame). 0 asks for none. Default: twice the EP's cpus, so that a report held for the
    /// next one to share its frame (`link::report_hold`) never leaves a core without a job.
    #[serde(default)]
    pub prefetch: Option<u32>,
    /// Most MiB of reference files (a manifest's `inputs.ref`) kept in `work_dir/refs` by
    /// their sha256, so a later job reading the same bytes gets them linked from there
    /// instead of downloaded (the storage asked first, with the job's own macaroon, which
    /// sha256 the file has now: `Want-Digest`); least recently used go first. 0 turns the
    /// cache off. Default: 1024.
    #[serde(default = "default_ref_cache_mb")]
    pub ref_cache_mb: u64,
    /// Native guests (functions of `runtime: native`): whether and how this EP runs them.
    #[serde(default)]
    pub native: NativeConfig,
}

/// How an EP runs native guests ([`crate::native`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NativeConfig {
    /// Offer the native runtime where this host can run it (the EP is root, bubblewrap is
    /// installed, a cgroup backend works); where it cannot, the EP says why at start and offers
    /// wasm only. Default: true.
    pub enabled: bool,
    /// The bubblewrap binary. Default: `/usr/bin/bwrap`.
    pub bwrap: PathBuf,
    /// Most MiB of unpacked images kept in `work_dir/images` (least recently used go first;
    /// one in use is never removed). Default: 16384.
    pub image_cache_mb: u64,
    /// Site directories of unpacked images, `<dir>/<hex digest>/` each (as sites publish
    /// images on a shared read-only file system): used as they are, never written, and the only
    /// place besides the gateway an image comes from. Default: none.
    pub site_images: Vec<PathBuf>,
    /// The first of the anonymous uids (and gids) native jobs run as, one per job at a time.
    /// Default: 900000.
    pub uid_base: u32,
    /// How many there are. Default: 1024.
    pub uid_count: u32,
    /// The GPUs' device nodes, one per GPU (e.g. `/dev/nvidia0`, `/dev/nvidia1`): a native job
    /// asking for `gpus` gets that many of them bound at their paths, named in
    /// `CUDA_VISIBLE_DEVICES` and `NVIDIA_VISIBLE_DEVICES`, and nothing else of `/dev` but
    /// `gpu_shared`. Advertise as many in `slots.gpus`. Default: none.
    pub gpus: Vec<PathBuf>,
    /// Device nodes every GPU job gets besides its GPUs (`/dev/nvidiactl`, `/dev/nvidia-uvm`,
    /// ...). Default: none.
    pub gpu_shared: Vec<PathBuf>,
    /// Seconds an idle handler (a native function's warm worker) is kept for the next run of
    /// its function version. Default: 120.
    pub handler_idle_s: u64,
    /// Most idle handlers kept at once (each holds its memory). 0: none, every run of a handler
    /// function starts one. Default: 8.
    pub handler_max_idle: usize,
}

impl Default for NativeConfig {
    fn default() -> NativeConfig {
        NativeConfig {
            enabled: true,
            bwrap: PathBuf::from(crate::native::BWRAP),
            image_cache_mb: 16 * 1024,
            site_images: Vec::new(),
            uid_base: 900_000,
            uid_count: 1024,
            gpus: Vec::new(),
            gpu_shared: Vec::new(),
            handler_idle_s: 120,
            handler_max_idle: 8,
        }
    }
}

/// `slots` when the config leaves it out: everything detected, the default run time.
fn detected_slots() -> Resources {
    Resources {
        cpus: 0,
        memory_mb: 0,
        runtime_s: Resources::default().runtime_s,
        gpus: crate::detect::DETECT_GPUS,
        disk_mb: crate::detect::DETECT_DISK_MB,
    }
}

/// `slots` as written: each field may be left out (detected, or for `runtime_s` its default).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SlotsConfig {
    cpus: Option<u32>,
    memory_mb: Option<u64>,
    runtime_s: Option<u64>,
    gpus: Option<u32>,
    disk_mb: Option<u64>,
}

fn slots_or_detect<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Resources, D::Error> {
    let s = SlotsConfig::deserialize(d)?;
    let detect = detected_slots();
    Ok(Resources {
        cpus: s.cpus.unwrap_or(detect.cpus),
        memory_mb: s.memory_mb.unwrap_or(detect.memory_mb),
        runtime_s: s.runtime_s.unwrap_or(detect.runtime_s),
        gpus: s.gpus.unwrap_or(detect.gpus),
        disk_mb: s.disk_mb.unwrap_or(detect.disk_mb),
    })
}

/// Checks labels as the scheduler does ([`htfaas_functions::proto::check_labels`]); the error
/// names the label.
pub fn check_labels(labels: &BTreeMap<String, String>) -> anyhow::Result<()> {
    htfaas_functions::proto::check_labels(labels).map_err(anyhow::Error::msg)
}

fn default_log_limit_bytes() -> usize {
    64 * 1024
}
fn default_max_output_files() -> usize {
    64
}
fn default_max_output_bytes() -> u64 {
    16 << 30
}
fn default_max_open_files() -> usize {
    crate::runtime::DEFAULT_MAX_OPEN_RESOURCES
}
fn default_ref_cache_mb() -> u64 {
    1024
}
fn default_compile_timeout_s() -> u64 {
    crate::runtime::DEFAULT_COMPILE_TIMEOUT.as_secs()
}

/// How long [`crate::run`] waits, after shutdown, for in-flight jobs and their reports
/// ([`Settings::drain_timeout`] as [`Config::resolve`] sets it).
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// The drain deadline `htfaas ep` uses on SIGTERM unless `--drain-timeout` says otherwise: long
/// enough for site drains (a batch system's machine drain lasts hours, not seconds).
pub const DEFAULT_SIGTERM_DRAIN_TIMEOUT: Duration = Duration::from_secs(3600);
/// After a quick stop (or a drain deadline that passed), how long the EP waits for the jobs it
/// cancelled to clean up, and for unsent reports to go out, before it leaves anyway; longer
/// while native jobs vacate (`stop_grace`).
pub const STOP_GRACE: Duration = Duration::from_secs(10);
/// What a stop waits beyond the longest vacate time of its native jobs: for their groups to be
/// killed and their reports to go out.
pub const VACATE_SLACK: Duration = Duration::from_secs(5);

/// How long a stop waits for its cancelled jobs when the longest vacate time of the native
/// jobs running is `longest_vacate` (zero: none runs): [`STOP_GRACE`], or that vacate time and
/// [`VACATE_SLACK`] when longer, so a job sent SIGTERM has its whole vacate time to leave.
pub fn stop_grace(longest_vacate: Duration) -> Duration {
    STOP_GRACE.max(longest_vacate.saturating_add(VACATE_SLACK))
}

/// A resolved [`Config`]: ready-made engine, linker, HTTP client and directories.
pub struct Settings {
    /// EP name.
    pub name: String,
    /// WebSocket URL dialled: `ws(s)://…/v1/ep/attach`.
    pub attach_url: String,
    pub(crate) attach_token: String,
    /// Resources advertised in `Hello`: [`Config::slots`] with its zeros detected.
    pub slots: Resources,
    /// Jobs asked for beyond the free resources ([`Config::prefetch`], default twice the cpus).
    pub prefetch: u32,
    /// Scratch directory.
    pub work_dir: PathBuf,
    /// `work_dir/modules`: verified module bytes, `<hex digest>.wasm`.
    pub modules_dir: PathBuf,
    /// `work_dir/jobs`: one directory per running job.
    pub jobs_dir: PathBuf,
    /// `work_dir/refs`: reference files by content ([`Config::ref_cache_mb`]); `None`: off.
    pub(crate) ref_cache: Option<Arc<crate::refcache::RefCache>>,
    /// Bytes of guest stdout + stderr kept per job.
    pub log_limit_bytes: usize,
    /// Most output files stored per job.
    pub max_output_files: usize,
    /// Most output bytes stored per job.
    pub max_output_bytes: u64,
    /// How long [`crate::run`] waits after shutdown (a drain) for in-flight jobs and their reports;
    /// past it the jobs still running are cancelled as by a quick stop. Default:
    /// [`DEFAULT_DRAIN_TIMEOUT`]; `htfaas ep` sets `--drain-timeout` (default
    /// [`DEFAULT_SIGTERM_DRAIN_TIMEOUT`]).
    pub drain_timeout: Duration,
    /// Leave this long after start.
    pub lifetime: Option<Duration>,
    /// Leave after this long without a running job.
    pub idle_shutdown: Option<Duration>,
    /// The annex declared in `Hello` ([`Config::annex`]).
    pub annex: Option<String>,
    /// Labels sent in `Hello`: [`Config::labels`] plus the detected ones it leaves room for.
    pub labels: BTreeMap<String, String>,
    /// [`Config::max_scratch_mb`] in bytes.
    pub max_scratch_bytes: Option<u64>,
    /// [`Config::fuel`].
    pub fuel: Option<u64>,
    /// [`Config::allowed_origins`], or its default.
    pub origins: Arc<crate::origins::Origins>,
    /// Running-job count and the moment the EP last became idle, kept by the link.
    pub(crate) activity: Arc<Activity>,
    /// When the EP leaves: its lifetime from start, or the scheduler's word since.
    pub(crate) lease: Arc<Lease>,
    /// Counters served on the metrics listener.
    pub(crate) metrics: crate::counters::Metrics,
    /// The metrics listener ([`Config::metrics_listen`]), bound at resolve; [`crate::run_with`]
    /// serves it.
    pub(crate) metrics_listener: Option<tokio::net::TcpListener>,
    /// TLS of the attach link: `Some` exactly when `attach_url` is `wss://`.
    pub(crate) attach_tls: Option<Arc<rustls::ClientConfig>>,
    pub(crate) http: reqwest::Client,
    pub(crate) runtime: Arc<Runtime>,
    /// The native runtime, where this host runs it ([`NativeConfig`]).
    pub(crate) native: Option<Arc<NativeHost>>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("name", &self.name)
            .field("attach_url", &self.attach_url)
            .field("attach_token", &"<redacted>")
            .field("slots", &self.slots)
            .field("work_dir", &self.work_dir)
            .field("log_limit_bytes", &self.log_limit_bytes)
            .field("max_output_files", &self.max_output_files)
            .field("max_output_bytes", &self.max_output_bytes)
            .field("drain_timeout", &self.drain_timeout)
            .field("annex", &self.annex)
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// The wasm runtime (engine and module cache) this EP runs jobs on.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// The bound address of the metrics listener, when [`Config::metrics_listen`] is set.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The EP's counters (`metrics`).
    pub fn metrics(&self) -> &crate::counters::Metrics {
        &self.metrics
    }
}

impl Config {
    /// The defaults an in-process EP starts with in tests and the local stack: the config
    /// file's defaults for every field but the four required ones given here, except `slots`,
    /// fixed at [`Resources::default`] instead of detected so that a test's EP advertises the
    /// same on every host. A test states only what it changes:
    /// `Config { slots, ..Config::for_test(name, url, token, dir) }`.
    pub fn for_test(
        name: impl Into<String>,
        scheduler_url: impl Into<String>,
        attach_token: impl Into<String>,
        work_dir: impl Into<PathBuf>,
    ) -> Config {
        Config {
            name: name.into(),
            scheduler_url: scheduler_url.into(),
            attach_token: attach_token.into(),
            slots: Resources::default(),
            work_dir: work_dir.into(),
            log_limit_bytes: default_log_limit_bytes(),
            max_output_files: default_max_output_files(),
            max_output_bytes: default_max_output_bytes(),
            lifetime_s: None,
            idle_shutdown_s: None,
            annex: None,
            tls_ca_file: None,
            labels: BTreeMap::new(),
            max_scratch_mb: None,
            fuel: None,
            metrics_listen: None,
            allowed_origins: None,
            max_open_files: default_max_open_files(),
            compile_timeout_s: default_compile_timeout_s(),
            prefetch: None,
            ref_cache_mb: default_ref_cache_mb(),
            native: NativeConfig::default(),
        }
    }

    /// Detects the host's resources ([`crate::detect::detect`], blocking work off the async threads),
    /// then [`Config::resolve_with`] them.
    pub async fn resolve(self) -> anyhow::Result<Settings> {
        let work_dir = self.work_dir.clone();
        let detected =
            tokio::task::spawn_blocking(move || crate::detect::detect(&work_dir)).await.context("detect resources")?;
        self.resolve_with(detected).await
    }

    /// Validates the config, fills the slots it leaves open (0) and adds labels from
    /// `detected`, creates `work_dir/{modules,jobs}` (emptying `jobs/`, which only holds
    /// leftovers of a previous process), and builds the engine, linker and HTTP client.
    pub async fn resolve_with(self, detected: crate::detect::Detected) -> anyhow::Result<Settings> {
        if self.name.trim().is_empty() {
            bail!("name: must not be empty");
        }
        if self.attach_token.trim().is_empty() {
            bail!("attach_token: must not be empty");
        }
        let attach_url = attach_url(&self.scheduler_url).context("scheduler_url")?;
        let origins = Arc::new(match &self.allowed_origins {
            Some(list) => crate::origins::Origins::parse(list)?,
            None => crate::origins::Origins::scheduler_host(&self.scheduler_url).context("scheduler_url")?,
        });
        tracing::info!(origins = ?origins.describe(), "jobs may reach these origins only");
        if self.max_open_files == 0 {
            bail!("max_open_files: must be positive");
        }
        if self.compile_timeout_s == 0 {
            bail!("compile_timeout_s: must be positive");
        }
        if self.slots.runtime_s == 0 {
            bail!("slots.runtime_s: must be positive");
        }
        check_labels(&self.labels)?;
        let slots = detected.fill(self.slots)?;
        let mut labels = self.labels;
        for (k, v) in detected.labels() {
            if labels.len() >= htfaas_functions::proto::MAX_LABELS {
                break;
            }
            labels.entry(k).or_insert(v);
        }
        tracing::info!(
            cpus = slots.cpus,
            memory_mb = slots.memory_mb,
            disk_mb = slots.disk_mb,
            gpus = slots.gpus,
            runtime_s = slots.runtime_s,
            ?labels,
            ?detected,
            "slots advertised (0 in the config: detected)"
        );
        if self.log_limit_bytes == 0 {
            bail!("log_limit_bytes: must be positive");
        }
        if let Some(annex) = &self.annex {
            check_name(annex).map_err(|e| anyhow!("annex: {e}"))?;
        }
        let modules_dir = self.work_dir.join("modules");
        let jobs_dir = self.work_dir.join("jobs");
        match tokio::fs::remove_dir_all(&jobs_dir).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("empty {}", jobs_dir.display())),
        }
        // 0700: jobs' inputs and outputs, and the modules, are the EP user's alone.
        for d in [&modules_dir, &jobs_dir] {
            htfaas_functions::store::create_private_dir(d).with_context(|| format!("create {}", d.display()))?;
        }
        let refs_dir = self.work_dir.join("refs");
        let ref_cache_bytes = self.ref_cache_mb.saturating_mul(1 << 20);
        let ref_cache = tokio::task::spawn_blocking(move || crate::refcache::RefCache::open(refs_dir, ref_cache_bytes))
            .await
            .context("open the reference cache")?
            .context("ref_cache_mb: open work_dir/refs")?
            .map(Arc::new);
        let extra_roots = match &self.tls_ca_file {
            Some(path) => crate::tls::read_ca_file(path).context("tls_ca_file")?,
            None => Vec::new(),
        };
        let attach_tls = if attach_url.starts_with("wss://") {
            Some(crate::tls::attach_tls_config(&extra_roots).context("TLS of the attach link")?)
        } else {
            None
        };
        // reqwest is built with `rustls-no-provider`: install ring once per process.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut http = reqwest::Client::builder()
            // XRootD 5.5's HTTP door reads header names case-sensitively: a lower-case
            // `content-length` stores an empty file (tests/e2e/xrootd.rs).
            .http1_title_case_headers()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(120))
            .redirect(crate::origins::redirect_policy(origins.clone()));
        if !extra_roots.is_empty() {
            let certs = extra_roots.iter().map(|c| reqwest::Certificate::from_der(c)).collect::<Result<Vec<_>, _>>();
            http = http.tls_certs_merge(certs.context("tls_ca_file")?);
        }
        let http = http.build().context("build HTTP client")?;
        // Jobs at once are at most the cores (each reserves one or more); the rest of the pool
        // covers guests whose thread a job had to leave behind (no sleep blocks a thread any
        // more: see `sleep`), and a job finding the pool full goes back to the scheduler.
        let options = RuntimeOptions {
            cache_dir: Some(self.work_dir.join("compiled")),
            fuel: self.fuel,
            pooling: true,
            max_instances: slots.cpus.saturating_add(16).min(1024),
            max_memory_bytes: slots.memory_mb.saturating_mul(1 << 20).min(crate::runtime::WASM32_MAX_MEMORY),
            max_open_resources: self.max_open_files,
            compile_timeout: Some(Duration::from_secs(self.compile_timeout_s)),
            ..RuntimeOptions::default()
        };
        let runtime = tokio::task::spawn_blocking(move || Runtime::with_options(options));
        let runtime = Arc::new(runtime.await.context("start wasm runtime")??);
        let native = native_host(&self.native, &self.work_dir).await;
        let metrics_listener = match self.metrics_listen {
            Some(addr) => Some(
                tokio::net::TcpListener::bind(addr).await.with_context(|| format!("metrics_listen: bind {addr}"))?,
            ),
            None => None,
        };
        Ok(Settings {
            name: self.name,
            attach_url,
            attach_token: self.attach_token,
            prefetch: self.prefetch.unwrap_or(slots.cpus.saturating_mul(2)),
            slots,
            work_dir: self.work_dir,
            modules_dir,
            jobs_dir,
            ref_cache,
            log_limit_bytes: self.log_limit_bytes,
            max_output_files: self.max_output_files,
            max_output_bytes: self.max_output_bytes,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            lifetime: self.lifetime_s.map(Duration::from_secs),
            idle_shutdown: self.idle_shutdown_s.map(Duration::from_secs),
            annex: self.annex,
            labels,
            max_scratch_bytes: self.max_scratch_mb.map(|m| m.saturating_mul(1 << 20)),
            fuel: self.fuel,
            origins,
            activity: Arc::new(Activity::new()),
            lease: Arc::new(Lease::new()),
            metrics: crate::counters::Metrics::default(),
            metrics_listener,
            attach_tls,
            http,
            runtime,
            native,
        })
    }
}

/// The native runtime `config` asks for, set up under `work_dir/images`; `None` (said in the
/// log, with the reason) where it is off or this host cannot run it.
async fn native_host(config: &NativeConfig, work_dir: &std::path::Path) -> Option<Arc<NativeHost>> {
    if !config.enabled {
        tracing::info!("native runtime off (native.enabled = false): wasm only");
        return None;
    }
    let options = crate::native::host::HostOptions {
        bwrap: config.bwrap.clone(),
        cache_dir: work_dir.join("images"),
        cache_bytes: config.image_cache_mb.saturating_mul(1 << 20),
        site_images: config.site_images.clone(),
        stage: std::path::PathBuf::from(crate::native::STAGE),
        uid_base: config.uid_base,
        uid_count: config.uid_count,
        gpus: config.gpus.clone(),
        gpu_shared: config.gpu_shared.clone(),
        handlers_dir: work_dir.join("handlers"),
        handlers: crate::native::handlers::HandlerOptions {
            idle_for: std::time::Duration::from_secs(config.handler_idle_s),
            max_idle: config.handler_max_idle,
        },
    };
    match tokio::task::spawn_blocking(move || NativeHost::start(options)).await {
        Ok(Ok(host)) => {
            tracing::info!(cgroups = %host.backend.describe(), bwrap = %host.bwrap.display(), "native runtime on");
            Some(Arc::new(host))
        }
        Ok(Err(e)) => {
            tracing::warn!("native runtime unavailable, wasm only: {e}");
            None
        }
        Err(e) => {
            tracing::warn!("native runtime unavailable, wasm only: its start task failed: {e}");
            None
        }
    }
}

/// `http://h:p/prefix` → `ws://h:p/prefix/v1/ep/attach` (`https` → `wss`; `ws`/`wss` kept).
fn attach_url(scheduler_url: &str) -> anyhow::Result<String> {
    let (scheme, rest) = scheduler_url.split_once("://").context("want http://host:port")?;
    let ws = match scheme {
        "http" | "ws" => "ws",
        "https" | "wss" => "wss",
        other => bail!("scheme {other:?}: want http or https"),
    };
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() {
        bail!("no host");
    }
    Ok(format!("{ws}://{rest}/v1/ep/attach"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stop waits for the longest vacate time of its native jobs, never less than before.
    #[test]
    fn a_stop_leaves_room_for_the_longest_vacate_time() {
        assert_eq!(stop_grace(Duration::ZERO), STOP_GRACE);
        assert_eq!(stop_grace(Duration::from_secs(2)), STOP_GRACE);
        assert_eq!(stop_grace(Duration::from_secs(300)), Duration::from_secs(300) + VACATE_SLACK);
    }

    #[test]
    fn attach_urls() {
        assert_eq!(attach_url("http://127.0.0.1:80").expect("ok"), "ws://127.0.0.1:80/v1/ep/attach");
        assert_eq!(attach_url("https://s.example/x/").expect("ok"), "wss://s.example/x/v1/ep/attach");
        assert!(attach_url("ftp://x").is_err());
        assert!(attach_url("127.0.0.1:80").is_err());
        assert!(attach_url("http://").is_err());
    }

    #[test]
    fn config_defaults_and_unknown_fields() {
        let c: Config = serde_json::from_str(
            r#"{"name":"ep1","scheduler_url":"http://127.0.0.1:1","attach_token":"t","work_dir":"/tmp/x"}"#,
        )
        .expect("parses");
        assert_eq!(c.log_limit_bytes, 65536);
        assert_eq!(c.max_output_files, 64);
        assert_eq!(c.max_output_bytes, 16 << 30);
        // Left out: all detected (0, or the markers for GPUs and disk), the default run time.
        let detect_all = Resources {
            cpus: 0,
            memory_mb: 0,
            runtime_s: 3600,
            gpus: crate::detect::DETECT_GPUS,
            disk_mb: crate::detect::DETECT_DISK_MB,
        };
        assert_eq!(c.slots, detect_all);
        assert_eq!(c.annex, None);
        let bad = serde_json::from_str::<Config>(
            r#"{"name":"ep1","scheduler_url":"u","attach_token":"t","work_dir":"/x","typo":1}"#,
        );
        assert!(bad.is_err());
    }

    #[test]
    fn for_test_has_the_file_defaults_but_fixed_slots() {
        let file: Config = serde_json::from_str(
            r#"{"name":"ep1","scheduler_url":"http://127.0.0.1:1","attach_token":"t","work_dir":"/tmp/x"}"#,
        )
        .expect("parses");
        let built = Config::for_test("ep1", "http://127.0.0.1:1", "t", "/tmp/x");
        assert_eq!(built.slots, Resources::default());
        // Everything else as the file leaves it; `Debug` covers every field.
        let same_slots = Config { slots: Resources::default(), ..file };
        assert_eq!(format!("{built:?}"), format!("{same_slots:?}"));
    }

    #[tokio::test]
    async fn annex_is_read_validated_and_kept() {
        let work = tempfile::tempdir().expect("tempdir");
        let json = |annex: &str| {
            format!(
                r#"{{"name":"ep1","scheduler_url":"http://127.0.0.1:1","attach_token":"t","work_dir":{:?},"annex":{annex}}}"#,
                work.path().display().to_string()
            )
        };
        let c: Config = serde_json::from_str(&json(r#""gpu-a""#)).expect("parses");
        assert_eq!(c.annex.as_deref(), Some("gpu-a"));
        let s = c.resolve().await.expect("resolves");
        assert_eq!(s.annex.as_deref(), Some("gpu-a"));
        for bad in [r#""""#, r#""GPU""#, r#""a/b""#, r#""-x""#] {
            let c: Config = serde_json::from_str(&json(bad)).expect("parses");
            let e = c.resolve().await.expect_err(bad);
            assert!(format!("{e:#}").starts_with("annex: "), "{bad}: {e:#}");
        }
    }
}
