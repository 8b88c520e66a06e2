//! The htfaas half of `htfaas bench`: the real stack as a site runs it, one process per
//! component ([`crate::procs::ProcStack`]: nats-server, storage, scheduler, gateway, one EP or
//! several), driven through its front door, a dCache `transfer` message published to
//! JetStream, exactly as a dCache pool would publish it. Each component being its own process,
//! the CPU each spends per event is read from its own `/proc/<pid>/stat`, and what it writes
//! (to its stores, its sockets) from `/proc/<pid>/io` ([`StackCpu`]).
//!
//! - **Latency** ([`latency`]): one event at a time; each names a fresh input file (linked
//!   into the storage's data directory beforehand, so the upload itself fires nothing) under
//!   the `checksum` function's trigger. Event to output: from just before the publish to the
//!   moment the storage's own `transfer` message for the output arrives on NATS (the storage
//!   publishes it once the file is stored and acknowledged, so the output is durable then).
//!   Event to function start: from the same instant to the guest's first action, which prints
//!   the wall clock (`HTFAAS_STAMP=1`, read back from the job's log).
//! - **Throughput** ([`throughput`]): events published as fast as the stack completes them
//!   (at most about a second of work ahead, [`MIN_BACKLOG`]..[`MAX_BACKLOG`]), for a fixed
//!   window; completions counted by the scheduler (committed `completed` jobs) at the window's
//!   ends; queue depths (the gateway's unacked events over its lanes, its firings, scheduler idle and running)
//!   sampled every [`SAMPLE_EVERY`].
//!
//! Every token and macaroon is checked as in production: the gateway mints a submit token and
//! obtains two macaroons per job, the scheduler verifies the token, the storage verifies the
//! macaroons on the EP's GET and PUT.

use super::{Figure, component_async_threads};
use crate::client::Client;
use crate::procs::{Component, ProcOptions, ProcStack};
use crate::stack::USER;
use crate::traffic::{
    bytes_written, context_switches, cpu_time, link_input, parse_counter, parse_job_states, percentile, transfer_write,
    unix_ns,
};
use anyhow::{Context as _, bail};
use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use htfaas_functions::manifest::{Outputs, Trigger};
use htfaas_functions::proto::{BILLING_SUBSCRIPTION, JobLog, JobRecord, JobState, TransferMessage, path_subject};
use htfaas_functions::store::Durability;
use htfaas_functions::{Digest, FunctionManifest, Resources};
use std::collections::HashMap;
use std::future::IntoFuture as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Events published but not yet completed, at most, during a throughput run: about one
/// second of work at the rate measured so far, or over the last [`SAMPLE_EVERY`] when that is
/// higher, within these bounds. Enough to keep every stage busy (the queues show where work
/// waits), little enough that the run drains in seconds. The rate so far alone lags a stack
/// that started slowly: completions are counted once per sample, so a backlog of B lets at
/// most 2B events a second through, and a run whose first second was slow stayed at twice
/// its average with every queue empty.
pub const MIN_BACKLOG: u64 = 100;
/// See [`MIN_BACKLOG`].
pub const MAX_BACKLOG: u64 = 2_000;
/// Queue depths are sampled this often.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(500);
/// A latency sample that takes longer than this fails the bench.
const EVENT_TIMEOUT: Duration = Duration::from_secs(30);
/// The throughput run waits at most this long for the backlog to drain at its end.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);

/// Where the functions read and write.
const SUM_DIR: &str = "/data/bench/sum/";
const SUM_OUT: &str = "/data/bench/sum-out/";
const NOOP_DIR: &str = "/data/bench/noop/";
const NOOP_OUT: &str = "/data/bench/noop-out/";

/// The stack under test, with the two bench functions registered.
pub struct Bench {
    stack: ProcStack,
    client: Client,
    /// The storage's data directory (inputs are linked in here directly).
    data_dir: PathBuf,
    /// Outside the storage's tree: the file per size every input links to ([`link_input`]).
    templates: PathBuf,
    js: async_nats::jetstream::Context,
    /// Every storage `transfer` message for an output: (path, when it arrived).
    outputs: mpsc::UnboundedReceiver<(String, Instant)>,
    /// Outputs seen so far (all of them, also those taken from `outputs`).
    outputs_seen: Arc<AtomicU64>,
    /// Distinguishes this run's events (pnfsid, session) from any other.
    run_id: String,
    next: u64,
    durability: Durability,
    _dir: tempfile::TempDir,
}

/// A guest module to register.
pub struct Modules {
    /// `examples/checksum` built for wasm32-wasip1.
    pub checksum: Vec<u8>,
    /// `examples/noop` built for wasm32-wasip1.
    pub noop: Vec<u8>,
}

impl Modules {
    /// Reads both from `wasm_dir` (`examples/target/wasm32-wasip1/release`).
    pub fn load(wasm_dir: &Path) -> anyhow::Result<Modules> {
        let read = |name: &str| {
            let p = wasm_dir.join(format!("{name}.wasm"));
            std::fs::read(&p).with_context(|| {
                format!(
                    "read {} (build it: cargo build --release --target wasm32-wasip1 --manifest-path examples/Cargo.toml)",
                    p.display()
                )
            })
        };
        Ok(Modules { checksum: read("checksum")?, noop: read("noop")? })
    }
}

fn manifest(name: &str, module: Digest, dir: &str, out: &str) -> FunctionManifest {
    FunctionManifest {
        runtime: Default::default(),
        command: Vec::new(),
        handler: false,
        retry: None,
        name: name.into(),
        owner: USER.into(),
        module,
        trigger: Trigger::on_path(format!("{dir}**")),
        resources: Resources::new(1, 256, 60),
        outputs: Outputs::into_dir(out),
        args: vec![],
        env: vec![("HTFAAS_STAMP".into(), "1".into())],
        annex: None,
        class: None,
        limits: Default::default(),
        group: None,
        secrets: Default::default(),
        webhook: None,
        max_concurrent: None,
        inputs: Default::default(),
        vacate_s: None,
        checkpoint: None,
    }
}

impl Bench {
    /// Starts a stack in a fresh temporary directory, its components run by the `htfaas`
    /// binary, with one EP per entry of `eps` (its cores), and registers `bench-checksum` and
    /// `bench-noop`.
    pub async fn start(
        modules: &Modules,
        htfaas: &Path,
        eps: &[u32],
        durability: Durability,
        nats_binary: Option<PathBuf>,
    ) -> anyhow::Result<Bench> {
        Bench::start_with(modules, htfaas, eps, durability, nats_binary, Default::default()).await
    }

    /// [`Bench::start`] with `scheduler_overrides` merged into the scheduler's configuration
    /// (a field set to null takes it out: `{"nats_url": null}`).
    pub async fn start_with(
        modules: &Modules,
        htfaas: &Path,
        eps: &[u32],
        durability: Durability,
        nats_binary: Option<PathBuf>,
        scheduler_overrides: serde_json::Map<String, serde_json::Value>,
    ) -> anyhow::Result<Bench> {
        let dir = tempfile::Builder::new().prefix("htfaas-bench-").tempdir().context("make a temporary directory")?;
        let (&first, more) = eps.split_first().context("no EP to start")?;
        let opts = ProcOptions {
            htfaas: htfaas.to_owned(),
            nats_binary,
            dir: dir.path().to_owned(),
            durability,
            workers: first,
            scheduler_overrides,
            ep_relay: false,
            ep_attach_ttl_s: None,
            async_threads: component_async_threads(),
        };
        let mut stack = ProcStack::start(&opts).await.context("start the stack")?;
        for &cores in more {
            stack.start_extra_ep(cores).await.context("start another EP")?;
        }
        let client = stack.client()?;
        let checksum = client.upload_module(modules.checksum.clone()).await?;
        let noop = client.upload_module(modules.noop.clone()).await?;
        client.register(&manifest("bench-checksum", checksum, SUM_DIR, SUM_OUT)).await?;
        client.register(&manifest("bench-noop", noop, NOOP_DIR, NOOP_OUT)).await?;

        let nats = stack.nats_client().await?;
        let js = async_nats::jetstream::new(nats.clone());
        let mut sub = nats.subscribe(BILLING_SUBSCRIPTION).await.context("subscribe to the storage's events")?;
        let (tx, outputs) = mpsc::unbounded_channel();
        let outputs_seen = Arc::new(AtomicU64::new(0));
        let seen = outputs_seen.clone();
        tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                let at = Instant::now();
                let Ok(m) = serde_json::from_slice::<TransferMessage>(&msg.payload) else { continue };
                let Some(path) = m.transfer_path.or(m.billing_path) else { continue };
                if path.starts_with(SUM_OUT) || path.starts_with(NOOP_OUT) {
                    seen.fetch_add(1, Ordering::Relaxed);
                    if tx.send((path, at)).is_err() {
                        break;
                    }
                }
            }
        });
        let data_dir = dir.path().join("storage/data");
        let templates = dir.path().join("inputs");
        let run_id = format!("{:08x}", rand::random::<u32>());
        Ok(Bench {
            stack,
            client,
            data_dir,
            templates,
            js,
            outputs,
            outputs_seen,
            run_id,
            next: 0,
            durability,
            _dir: dir,
        })
    }

    /// The durability the stack runs with.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Puts a fresh input of `size` bytes under `dir` and returns its storage path: a new name
    /// linked to one file per size ([`link_input`]: why).
    fn new_input(&mut self, dir: &str, prefix: &str, size: usize) -> anyhow::Result<String> {
        self.next += 1;
        let path = format!("{dir}{prefix}-{}-{:07}.dat", self.run_id, self.next);
        link_input(&self.data_dir, &self.templates, &path, size)?;
        Ok(path)
    }

    /// The dCache `transfer` message of a pool write of `path` (a fresh pnfsid and session).
    fn event(&self, path: &str, size: usize, n: u64) -> Vec<u8> {
        transfer_write(path, size, &self.run_id, n)
    }

    /// Publishes the event of `path` on its path subject, as the storage does, and waits for
    /// JetStream's ack.
    async fn publish(&self, path: &str, payload: Vec<u8>) -> anyhow::Result<()> {
        self.js.publish(path_subject(path), payload.into()).await.context("publish")?.await.context("JetStream ack")?;
        Ok(())
    }

    /// Waits for the output of `input` (its path under the output dir, by name).
    async fn wait_output(&mut self, output: &str) -> anyhow::Result<Instant> {
        let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
        loop {
            match tokio::time::timeout_at(deadline, self.outputs.recv()).await {
                Ok(Some((path, at))) if path == output => return Ok(at),
                Ok(Some(_)) => {}
                Ok(None) => bail!("the NATS subscription ended"),
                Err(_) => bail!("no output {output} within {EVENT_TIMEOUT:?}; see the stack's jobs"),
            }
        }
    }

    /// GETs `path` of the scheduler's API as its admin.
    async fn scheduler_get<T: serde::de::DeserializeOwned>(
        &self,
        http: &reqwest::Client,
        path: &str,
    ) -> anyhow::Result<T> {
        let url = format!("{}{path}", self.stack.scheduler_url());
        let resp = http.get(&url).bearer_auth(self.stack.layout().scheduler_admin_token()).send().await?;
        let resp = resp.error_for_status().with_context(|| format!("GET {path}"))?;
        Ok(resp.json().await?)
    }

    /// Stops the stack and removes its directory.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.stack.stop_all().await;
        Ok(())
    }

    /// The CPU time and bytes written so far of each process of the stack, and of this one
    /// (the publisher).
    fn cpu(&self) -> StackCpu {
        let of = |pid: Option<u32>| {
            pid.map_or(Used::default(), |p| {
                let p = p.to_string();
                Used { cpu: cpu_time(&p), written: bytes_written(&p), switches: context_switches(&p) }
            })
        };
        let eps =
            std::iter::once(self.stack.pid(Component::Ep)).chain(self.stack.extra_ep_pids().into_iter().map(Some));
        let zero = Used { cpu: Some(Duration::ZERO), written: Some(0), switches: Some(0) };
        let eps = eps.map(of).fold(zero, |sum, u| Used {
            cpu: sum.cpu.zip(u.cpu).map(|(a, b)| a + b),
            written: sum.written.zip(u.written).map(|(a, b)| a + b),
            switches: sum.switches.zip(u.switches).map(|(a, b)| a + b),
        });
        StackCpu {
            parts: vec![
                ("gateway", of(self.stack.pid(Component::Gateway))),
                ("scheduler", of(self.stack.pid(Component::Scheduler))),
                ("ep", eps),
                ("storage", of(self.stack.pid(Component::Storage))),
                ("nats_server", of(self.stack.pid(Component::Nats))),
                (
                    "publisher",
                    Used { cpu: cpu_time("self"), written: bytes_written("self"), switches: context_switches("self") },
                ),
            ],
        }
    }
}

/// One latency sample.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// Publish to the output's `transfer` message.
    to_output: Duration,
    /// Publish to the guest's first action (from its stamp), when found.
    to_start: Option<Duration>,
}

/// What [`latency`] measured, for the ratios.
#[derive(Debug, Clone, Copy, Default)]
pub struct Latency {
    /// Event to output p50, ms.
    pub p50_ms: f64,
    /// Event to output p99, ms.
    pub p99_ms: f64,
}

/// Event to output and event to function start, one event at a time: `n` events with inputs
/// of `size` bytes (after `warmup` untimed ones). `label` names the figures
/// (`event_to_output{label}_p50`, ...).
pub async fn latency(
    bench: &mut Bench,
    n: usize,
    warmup: usize,
    size: usize,
    label: &str,
    emit: &mut dyn FnMut(Figure),
) -> anyhow::Result<Latency> {
    let mut samples = Vec::with_capacity(n);
    let mut started_ns: HashMap<String, u128> = HashMap::new();
    for i in 0..warmup + n {
        let input = bench.new_input(SUM_DIR, "lat", size)?;
        let name = input.rsplit('/').next().unwrap_or_default().to_owned();
        let output = format!("{SUM_OUT}{name}.checksums.json");
        let payload = bench.event(&input, size, bench.next);
        let t0 = Instant::now();
        let t0_ns = unix_ns();
        bench.publish(&input, payload).await?;
        let done = bench.wait_output(&output).await?;
        if i >= warmup {
            samples.push((input.clone(), done - t0));
            started_ns.insert(input, t0_ns);
        }
    }
    // The guests' stamps, from the jobs' logs.
    let http = htfaas_gateway::http_client()?;
    let limit = warmup + n + 100;
    // The output is stored before the EP reports: wait until every job's end is committed.
    let deadline = Instant::now() + EVENT_TIMEOUT;
    let jobs = loop {
        let jobs: Vec<JobRecord> = bench.scheduler_get(&http, &format!("/v1/jobs?limit={limit}")).await?;
        let ours = || jobs.iter().filter(|j| started_ns.contains_key(&j.event.path));
        if ours().count() >= started_ns.len() && ours().all(|j| !matches!(j.state, JobState::Idle | JobState::Running))
        {
            break jobs;
        }
        if Instant::now() > deadline {
            bail!("the latency run's jobs did not all end within {EVENT_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut starts: HashMap<String, Duration> = HashMap::new();
    let mut hops: [Vec<f64>; 3] = Default::default();
    for job in jobs.iter().filter(|j| started_ns.contains_key(&j.event.path)) {
        let Some(&t0_ns) = started_ns.get(&job.event.path) else { continue };
        if job.state != JobState::Completed {
            bail!("job {} for {} ended {:?}: {}", job.id, job.event.path, job.state, job.reason);
        }
        let log: JobLog = bench.scheduler_get(&http, &format!("/v1/jobs/{}/log", job.id)).await?;
        if let Some(stamp) = log.log.lines().find_map(|l| l.strip_prefix("start_unix_ns=")?.trim().parse::<u128>().ok())
        {
            starts.insert(
                job.event.path.clone(),
                Duration::from_nanos(u64::try_from(stamp.saturating_sub(t0_ns)).unwrap_or(0)),
            );
        }
        // Where the time goes, at the scheduler's millisecond stamps.
        let t0_ms = (t0_ns / 1_000_000) as f64;
        if let (Some(start), Some(end)) = (job.started_at_ms, job.finished_at_ms) {
            hops[0].push(job.submitted_at_ms as f64 - t0_ms);
            hops[1].push(start as f64 - job.submitted_at_ms as f64);
            hops[2].push(end as f64 - start as f64);
        }
    }
    let samples: Vec<Sample> = samples
        .into_iter()
        .map(|(input, to_output)| Sample { to_output, to_start: starts.get(&input).copied() })
        .collect();
    let mut to_output: Vec<f64> = samples.iter().map(|s| s.to_output.as_secs_f64() * 1e3).collect();
    let mut to_start: Vec<f64> = samples.iter().filter_map(|s| s.to_start).map(|d| d.as_secs_f64() * 1e3).collect();
    let d = bench.durability.as_str();
    let mut out = Latency::default();
    for (q, name) in [(0.5, "p50"), (0.99, "p99")] {
        let v = percentile(&mut to_output, q);
        if q == 0.5 {
            out.p50_ms = v;
        } else {
            out.p99_ms = v;
        }
        emit(
            Figure::new("htfaas", format!("event_to_output{label}_{name}"), v, "ms", to_output.len() as u64)
                .with("input_bytes", size)
                .with("durability", d),
        );
    }
    if !to_start.is_empty() {
        for (q, name) in [(0.5, "p50"), (0.99, "p99")] {
            let v = percentile(&mut to_start, q);
            emit(
                Figure::new("htfaas", format!("event_to_start{label}_{name}"), v, "ms", to_start.len() as u64)
                    .with("input_bytes", size)
                    .with("durability", d),
            );
        }
    }
    for (mut v, hop) in
        hops.into_iter().zip(["event_to_submitted", "submitted_to_dispatched", "dispatched_to_finished"])
    {
        if v.is_empty() {
            continue;
        }
        let p50 = percentile(&mut v, 0.5);
        emit(
            Figure::new("htfaas", format!("hop{label}.{hop}_p50"), p50, "ms", v.len() as u64)
                .with("resolution_ms", 1)
                .with("durability", d),
        );
    }
    Ok(out)
}

/// The htfaas processes of [`StackCpu`]: what "CPU per event across all htfaas processes"
/// sums (nats-server and the bench's own publisher are shown apart).
pub const HTFAAS_PROCESSES: [&str; 4] = ["gateway", "scheduler", "ep", "storage"];

/// What one process has used so far: CPU time (user + system), bytes written, context
/// switches of its threads.
#[derive(Debug, Clone, Copy, Default)]
struct Used {
    cpu: Option<Duration>,
    written: Option<u64>,
    switches: Option<u64>,
}

/// What each process of the stack has used so far (every EP summed as `ep`), and the bench's
/// own process (`publisher`: it writes each input file and publishes its event).
#[derive(Debug, Clone, Default)]
pub struct StackCpu {
    parts: Vec<(&'static str, Used)>,
}

impl StackCpu {
    /// Milliseconds of CPU per event between `self` (the window's start) and `end`, per
    /// process, then `htfaas`: the sum over [`HTFAAS_PROCESSES`] (only when each was read).
    pub fn per_event_ms(&self, end: &StackCpu, events: u64) -> Vec<(&'static str, f64)> {
        self.per_event(end, events, |a, b| Some(b.cpu?.saturating_sub(a.cpu?).as_secs_f64() * 1e3))
    }

    /// KiB written per event between `self` and `end` (store pages, WAL, sockets: everything
    /// through `write(2)`), per process, then `htfaas` as [`StackCpu::per_event_ms`] sums it.
    /// Steadier than CPU on a shared machine: what a change does to a store's write
    /// amplification shows here first.
    pub fn per_event_kib_written(&self, end: &StackCpu, events: u64) -> Vec<(&'static str, f64)> {
        self.per_event(end, events, |a, b| Some(b.written?.saturating_sub(a.written?) as f64 / 1024.0))
    }

    /// Context switches per event between `self` and `end` (hand-offs between threads), per
    /// process, then `htfaas` as [`StackCpu::per_event_ms`] sums it.
    pub fn per_event_switches(&self, end: &StackCpu, events: u64) -> Vec<(&'static str, f64)> {
        self.per_event(end, events, |a, b| Some(b.switches?.saturating_sub(a.switches?) as f64))
    }

    /// `delta(start, end)` over `events`, per process, then summed over [`HTFAAS_PROCESSES`].
    fn per_event(
        &self,
        end: &StackCpu,
        events: u64,
        delta: impl Fn(&Used, &Used) -> Option<f64>,
    ) -> Vec<(&'static str, f64)> {
        if events == 0 {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut htfaas = Some(0.0);
        for (name, a) in &self.parts {
            let per =
                end.parts.iter().find(|(n, _)| n == name).and_then(|(_, b)| delta(a, b)).map(|d| d / events as f64);
            if HTFAAS_PROCESSES.contains(name) {
                htfaas = htfaas.zip(per).map(|(sum, p)| sum + p);
            }
            if let Some(per) = per {
                out.push((*name, per));
            }
        }
        if let Some(sum) = htfaas {
            out.push(("htfaas", sum));
        }
        out
    }
}

/// Queue depths seen during a throughput run.
#[derive(Debug, Default)]
struct Depths {
    samples: u64,
    jetstream_pending: Vec<f64>,
    gateway_firings: Vec<f64>,
    scheduler_idle: Vec<f64>,
    scheduler_running: Vec<f64>,
}

/// The scheduler's committed jobs by state, from its `/metrics`.
async fn scheduler_states(http: &reqwest::Client, bench: &Bench) -> anyhow::Result<HashMap<String, u64>> {
    Ok(parse_job_states(&scheduler_metrics(http, bench).await?))
}

/// The scheduler's store writes and their transactions so far, from its `/metrics`.
async fn scheduler_writes(http: &reqwest::Client, bench: &Bench) -> anyhow::Result<(u64, u64)> {
    let text = scheduler_metrics(http, bench).await?;
    let count = |name| parse_counter(&text, name).with_context(|| format!("no {name} in the scheduler's metrics"));
    Ok((count("htfaas_scheduler_store_writes")?, count("htfaas_scheduler_store_write_batches")?))
}

/// The scheduler's `/metrics` text.
async fn scheduler_metrics(http: &reqwest::Client, bench: &Bench) -> anyhow::Result<String> {
    let token = bench.stack.layout().scheduler_admin_token();
    let text = http
        .get(format!("{}/metrics", bench.stack.scheduler_url()))
        .bearer_auth(token)
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    Ok(text)
}

/// Sustained throughput of `function` (`noop` or `checksum`) on inputs of `size` bytes over
/// `window` (after `warmup`), with its queue depths (figures `throughput_{function}{label}`).
/// Returns events per second.
pub async fn throughput(
    bench: &mut Bench,
    function: &str,
    size: usize,
    label: &str,
    warmup: Duration,
    window: Duration,
    emit: &mut dyn FnMut(Figure),
) -> anyhow::Result<f64> {
    let dir = match function {
        "noop" => NOOP_DIR,
        "checksum" => SUM_DIR,
        other => bail!("no bench function {other}"),
    };
    let http = htfaas_gateway::http_client()?;
    let before = scheduler_states(&http, bench).await?;
    let completed0 = before.get("completed").copied().unwrap_or(0);
    let failed0 = before.get("failed").copied().unwrap_or(0);
    let outputs0 = bench.outputs_seen.load(Ordering::Relaxed);

    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + window;
    let mut published: u64 = 0;
    let mut completed: u64 = 0;
    let mut acks = FuturesUnordered::new();
    let mut depths = Depths::default();
    let mut next_sample = Instant::now();
    // Completions at the last sample, and the rate between the two samples before.
    let (mut last_completed, mut last_sampled, mut recent_rate) = (0u64, start, 0.0f64);
    let mut at_window_start: Option<(u64, Instant)> = None;
    let mut at_window_end: Option<(u64, Instant)> = None;
    let (mut cpu_start, mut cpu_end) = (StackCpu::default(), StackCpu::default());
    let (mut writes_start, mut writes_end) = ((0, 0), (0, 0));
    while at_window_end.is_none() {
        let now = Instant::now();
        if now >= next_sample {
            next_sample = now + SAMPLE_EVERY;
            let states = scheduler_states(&http, bench).await?;
            completed = states.get("completed").copied().unwrap_or(0).saturating_sub(completed0);
            let at = Instant::now();
            recent_rate = completed.saturating_sub(last_completed) as f64
                / at.duration_since(last_sampled).as_secs_f64().max(1e-3);
            (last_completed, last_sampled) = (completed, at);
            if at >= measure_from && at_window_start.is_none() {
                // A profiler (bench/profile.sh) attaches on this line.
                eprintln!("bench: throughput_{function}{label}: window of {window:?} starts");
                at_window_start = Some((completed, at));
                cpu_start = bench.cpu();
                writes_start = scheduler_writes(&http, bench).await?;
            }
            if at >= end {
                at_window_end = Some((completed, at));
                cpu_end = bench.cpu();
                writes_end = scheduler_writes(&http, bench).await?;
            }
            if at >= measure_from {
                depths.samples += 1;
                depths.scheduler_idle.push(states.get("idle").copied().unwrap_or(0) as f64);
                depths.scheduler_running.push(states.get("running").copied().unwrap_or(0) as f64);
                if let Ok(s) = bench.client.stats().await {
                    depths.jetstream_pending.push(s.events_pending as f64);
                    depths.gateway_firings.push(s.firings_pending as f64);
                }
            }
        }
        // Publish while the backlog allows, acks pipelined (at most 256 outstanding).
        let rate_so_far = completed as f64 / start.elapsed().as_secs_f64().max(1e-3);
        let backlog = (rate_so_far.max(recent_rate) as u64).clamp(MIN_BACKLOG, MAX_BACKLOG);
        let mut burst = 0;
        while published < completed + backlog && acks.len() < 256 && burst < 64 {
            let input = bench.new_input(dir, "tp", size)?;
            let payload = bench.event(&input, size, bench.next);
            acks.push(bench.js.publish(path_subject(&input), payload.into()).await.context("publish")?.into_future());
            published += 1;
            burst += 1;
        }
        tokio::select! {
            Some(ack) = acks.next(), if !acks.is_empty() => {
                ack.context("JetStream ack")?;
            }
            () = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
        if start.elapsed() > warmup + window + DRAIN_TIMEOUT {
            bail!("the throughput run did not reach its window's end");
        }
    }
    while let Some(ack) = acks.next().await {
        ack.context("JetStream ack")?;
    }
    let (c0, t0) = at_window_start.context("no sample at the window's start")?;
    let (c1, t1) = at_window_end.context("no sample at the window's end")?;
    let rate = (c1 - c0) as f64 / (t1 - t0).as_secs_f64();

    // Drain: every published event must complete.
    let drain_start = Instant::now();
    let (done, failed) = loop {
        let states = scheduler_states(&http, bench).await?;
        let done = states.get("completed").copied().unwrap_or(0).saturating_sub(completed0);
        let failed = states.get("failed").copied().unwrap_or(0).saturating_sub(failed0);
        if done + failed >= published {
            break (done, failed);
        }
        if drain_start.elapsed() > DRAIN_TIMEOUT {
            bail!("after {DRAIN_TIMEOUT:?} only {done} of {published} events completed ({failed} failed)");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    if failed > 0 {
        bail!("{failed} of {published} jobs failed during the throughput run");
    }
    if function == "checksum" {
        // Every completed checksum job stored its output, and the storage announced it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while bench.outputs_seen.load(Ordering::Relaxed) - outputs0 < done && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let outputs = bench.outputs_seen.load(Ordering::Relaxed) - outputs0;
        if outputs != done {
            bail!("{done} checksum jobs completed but {outputs} outputs were announced");
        }
    }
    // The channel holds the outputs of this run; nobody waits for them.
    while bench.outputs.try_recv().is_ok() {}

    let d = bench.durability.as_str();
    let metric = format!("throughput_{function}{label}");
    emit(
        Figure::new("htfaas", metric.clone(), rate, "events/s", c1 - c0)
            .with("durability", d)
            .with("window_s", (t1 - t0).as_secs_f64())
            .with("input_bytes", size)
            .with("published", published)
            // Each component's tokio workers; null: as the bench's environment said.
            .with("component_async_threads", component_async_threads()),
    );
    // CPU per event, per process: steadier than a rate on a shared machine, and it shows
    // where a regression is. `htfaas` sums the htfaas processes.
    for (who, per) in cpu_start.per_event_ms(&cpu_end, c1 - c0) {
        emit(
            Figure::new("htfaas", format!("{metric}.cpu_ms_per_event.{who}"), per, "ms", c1 - c0).with("durability", d),
        );
    }
    for (who, per) in cpu_start.per_event_kib_written(&cpu_end, c1 - c0) {
        emit(
            Figure::new("htfaas", format!("{metric}.kib_written_per_event.{who}"), per, "KiB", c1 - c0)
                .with("durability", d),
        );
    }
    for (who, per) in cpu_start.per_event_switches(&cpu_end, c1 - c0) {
        emit(
            Figure::new("htfaas", format!("{metric}.switches_per_event.{who}"), per, "switches", c1 - c0)
                .with("durability", d),
        );
    }
    // The scheduler's store: writes per event, and per transaction (how much its group commit
    // groups).
    let (writes, batches) = (writes_end.0 - writes_start.0, writes_end.1 - writes_start.1);
    if c1 > c0 && batches > 0 {
        emit(
            Figure::new(
                "htfaas",
                format!("{metric}.scheduler_writes_per_event"),
                writes as f64 / (c1 - c0) as f64,
                "writes",
                c1 - c0,
            )
            .with("durability", d),
        );
        emit(
            Figure::new(
                "htfaas",
                format!("{metric}.scheduler_writes_per_commit"),
                writes as f64 / batches as f64,
                "writes",
                batches,
            )
            .with("durability", d),
        );
    }
    for (name, mut v) in [
        ("jetstream_pending", depths.jetstream_pending),
        ("gateway_firings_pending", depths.gateway_firings),
        ("scheduler_idle", depths.scheduler_idle),
        ("scheduler_running", depths.scheduler_running),
    ] {
        if v.is_empty() {
            continue;
        }
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let max = percentile(&mut v, 1.0);
        let n = v.len() as u64;
        emit(Figure::new("htfaas", format!("{metric}.queue.{name}_mean"), mean, "events", n).with("durability", d));
        emit(Figure::new("htfaas", format!("{metric}.queue.{name}_max"), max, "events", n).with("durability", d));
    }
    let _ = depths.samples;
    Ok(rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_per_event_is_per_process_and_sums_the_htfaas_ones() {
        let ms = Duration::from_millis;
        let used = |cpu: Option<Duration>| Used {
            cpu,
            written: cpu.map(|c| c.as_millis() as u64 * 1024),
            switches: cpu.map(|c| c.as_millis() as u64 * 10),
        };
        let at = |g, e| StackCpu {
            parts: vec![
                ("gateway", used(Some(ms(g)))),
                ("scheduler", used(Some(ms(100)))),
                ("ep", used(e)),
                ("storage", used(Some(ms(100)))),
                ("nats_server", used(Some(ms(g)))),
                ("publisher", used(Some(ms(0)))),
            ],
        };
        let per = at(100, Some(ms(100))).per_event_ms(&at(300, Some(ms(500))), 100);
        let get = |v: &[(&str, f64)], n: &str| v.iter().find(|(k, _)| *k == n).map(|(_, x)| *x);
        assert_eq!(get(&per, "gateway"), Some(2.0));
        assert_eq!(get(&per, "ep"), Some(4.0));
        assert_eq!(get(&per, "nats_server"), Some(2.0));
        assert_eq!(get(&per, "htfaas"), Some(6.0), "gateway + scheduler + ep + storage, not NATS or the publisher");
        let unread = at(100, None).per_event_ms(&at(300, Some(ms(500))), 100);
        assert_eq!(get(&unread, "htfaas"), None, "no sum when a process was not read");
        assert!(at(0, None).per_event_ms(&at(1, None), 0).is_empty());
        // Bytes written follow the same rule: per process, summed over the htfaas ones.
        let kib = at(100, Some(ms(100))).per_event_kib_written(&at(300, Some(ms(500))), 100);
        assert_eq!(get(&kib, "ep"), Some(4.0));
        assert_eq!(get(&kib, "htfaas"), Some(6.0));
        // And so do context switches.
        let switches = at(100, Some(ms(100))).per_event_switches(&at(300, Some(ms(500))), 100);
        assert_eq!(get(&switches, "ep"), Some(40.0));
        assert_eq!(get(&switches, "htfaas"), Some(60.0));
    }
}
