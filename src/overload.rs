//! `htfaas overload`: one owner floods the stack, another owner's single event must not wait
//! behind the flood. The stack runs as processes ([`crate::procs`]); `alice` publishes
//! `flood` dCache `transfer` events at once (as fast as JetStream acknowledges them, up to
//! [`PUBLISH_WINDOW`] in flight), then `bob` publishes one. Reported:
//!
//! - bob's event: from its publish to its job's submission, to its start, to its end, and how
//!   many of alice's jobs started between bob's submission and bob's start (at most one
//!   dispatch round's worth: the EP's slots);
//! - the HTTP API under the flood: p50 / p99 / slowest of the gateway's `GET /v1/functions`
//!   (the registry) and `GET /v1/accounting` (proxied to the scheduler), one request every
//!   [`SAMPLE_EVERY`];
//! - each process's resident memory at the start of the flood and at its peak (`VmRSS`), and the
//!   scheduler's queue (idle jobs) at its peak: the backlog waits on disk, not in memory.
//!
//! Both functions are the no-op example on a 1 KiB file; all of alice's events name the same
//! file (each is its own transfer: its own pnfsid and session, so its own event).

use crate::procs::{Component, ProcOptions, ProcStack};
use anyhow::{Context as _, bail};
use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use htfaas_functions::manifest::{Outputs, Trigger};
use htfaas_functions::namespace::Right;
use htfaas_functions::proto::path_subject;
use htfaas_functions::store::Durability;
use htfaas_functions::{FunctionManifest, Resources};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// JetStream publishes in flight during the flood.
pub const PUBLISH_WINDOW: usize = 2_000;
/// One API request and one memory reading this often.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(100);
const ALICE_INPUT: &str = "/data/flood/in.dat";
const BOB_INPUT: &str = "/data/bob/in.dat";

/// What to run.
#[derive(Debug, Clone)]
pub struct OverloadOptions {
    /// The `htfaas` binary.
    pub htfaas: PathBuf,
    /// nats-server; default [`crate::nats::find_binary`].
    pub nats_binary: Option<PathBuf>,
    /// Where `noop.wasm` is.
    pub wasm_dir: PathBuf,
    /// alice's events.
    pub flood: u64,
    /// EP cores.
    pub workers: u32,
    /// How long to go on measuring after bob's job has ended.
    pub after: Duration,
    /// Keep the state here (default: a temporary directory).
    pub dir: Option<PathBuf>,
}

/// p50 / p99 / slowest of a set of samples, ms.
#[derive(Debug, Clone, Copy, Default)]
pub struct Spread {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Slowest.
    pub max: f64,
    /// Samples.
    pub n: usize,
}

impl Spread {
    fn of(mut v: Vec<f64>) -> Spread {
        let n = v.len();
        let p50 = crate::traffic::percentile(&mut v, 0.5);
        let p99 = crate::traffic::percentile(&mut v, 0.99);
        let max = crate::traffic::percentile(&mut v, 1.0);
        Spread { p50, p99, max, n }
    }
}

/// What the run measured.
#[derive(Debug, Clone, Default)]
pub struct OverloadReport {
    /// alice's events, all acknowledged by JetStream.
    pub flood: u64,
    /// How long publishing them took.
    pub flood_publish: Duration,
    /// bob's event: publish to its job's submission, start and end (ms).
    pub bob_submitted_ms: u64,
    /// See [`OverloadReport::bob_submitted_ms`].
    pub bob_started_ms: u64,
    /// See [`OverloadReport::bob_submitted_ms`].
    pub bob_finished_ms: u64,
    /// alice's jobs started after bob's was submitted and before it started.
    pub alice_started_ahead: u64,
    /// alice's jobs submitted before bob's.
    pub alice_submitted_before_bob: u64,
    /// The EP's slots (one dispatch round starts at most this many jobs).
    pub slots: u32,
    /// The gateway's `GET /v1/functions`.
    pub api_registry: Spread,
    /// The gateway's `GET /v1/accounting` (the scheduler behind it).
    pub api_accounting: Spread,
    /// Failed API requests.
    pub api_errors: u64,
    /// Resident memory per process, MiB: (at the flood's start, peak).
    pub rss_mib: BTreeMap<String, (f64, f64)>,
    /// The scheduler's idle jobs at their peak.
    pub idle_peak: u64,
    /// alice's jobs completed by the end.
    pub alice_completed: u64,
    /// The whole run.
    pub elapsed: Duration,
}

impl fmt::Display for OverloadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "flood: {} events from alice, published in {:.1} s", self.flood, self.flood_publish.as_secs_f64())?;
        writeln!(
            f,
            "bob's event: submitted after {} ms, started after {} ms, ended after {} ms",
            self.bob_submitted_ms, self.bob_started_ms, self.bob_finished_ms
        )?;
        writeln!(
            f,
            "alice's jobs submitted before bob's: {}; started between bob's submission and start: {} (slots: {})",
            self.alice_submitted_before_bob, self.alice_started_ahead, self.slots
        )?;
        for (name, s) in [("GET /v1/functions", self.api_registry), ("GET /v1/accounting", self.api_accounting)] {
            writeln!(
                f,
                "API {name}: p50 {:.1} ms, p99 {:.1} ms, slowest {:.1} ms ({} requests)",
                s.p50, s.p99, s.max, s.n
            )?;
        }
        writeln!(f, "API errors: {}", self.api_errors)?;
        for (name, (start, peak)) in &self.rss_mib {
            writeln!(f, "memory {name:<11}: {start:>7.1} MiB at the flood's start, {peak:>7.1} MiB at peak")?;
        }
        writeln!(
            f,
            "scheduler idle jobs at peak: {}; alice's jobs completed: {}",
            self.idle_peak, self.alice_completed
        )?;
        write!(f, "elapsed {:.1} s", self.elapsed.as_secs_f64())
    }
}

use htfaas_functions::time::now_ms as unix_ms;

/// Resident memory of `pid` in MiB (`VmRSS` of `/proc/<pid>/status`).
fn rss_mib(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 =
        text.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb / 1024.0)
}

fn noop(name: &str, owner: &str, module: htfaas_functions::Digest, dir: &str) -> FunctionManifest {
    FunctionManifest {
        runtime: Default::default(),
        command: Vec::new(),
        handler: false,
        retry: None,
        name: name.into(),
        owner: owner.into(),
        module,
        trigger: Trigger::on_path(format!("{dir}**")),
        resources: Resources::new(1, 256, 60),
        outputs: Outputs::into_dir(format!("{dir}out/")),
        args: vec![],
        env: vec![],
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

/// bob's job as the scheduler recorded it: (submitted, started, finished) unix ms.
type Times = (u64, Option<u64>, Option<u64>);

/// Reads bob's job and the counts of alice's jobs around it from the scheduler's database (a
/// read-only connection beside the running scheduler; WAL lets it read).
fn bob_and_alice(db: &std::path::Path) -> anyhow::Result<Option<(Times, u64, u64, u64)>> {
    let conn = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let bob: Option<(i64, Option<i64>, Option<i64>)> = conn
        .query_row(
            "SELECT submitted_at_ms, started_at_ms, finished_at_ms FROM jobs WHERE owner = 'bob' LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .ok();
    let Some((sub, start, end)) = bob else { return Ok(None) };
    let ms = |v: i64| u64::try_from(v).unwrap_or(0);
    let times = (ms(sub), start.map(ms), end.map(ms));
    let count = |sql: &str, params: &[&dyn rusqlite::ToSql]| -> anyhow::Result<u64> {
        Ok(ms(conn.query_row(sql, params, |r| r.get::<_, i64>(0))?))
    };
    let ahead = match start {
        Some(s) => count(
            "SELECT COUNT(*) FROM jobs WHERE owner = 'alice' AND started_at_ms >= ?1 AND started_at_ms < ?2",
            &[&sub, &s],
        )?,
        None => 0,
    };
    let before = count("SELECT COUNT(*) FROM jobs WHERE owner = 'alice' AND submitted_at_ms < ?1", &[&sub])?;
    let completed = count("SELECT COUNT(*) FROM jobs WHERE owner = 'alice' AND state = 'completed'", &[])?;
    Ok(Some((times, ahead, before, completed)))
}

/// Runs the overload.
pub async fn run(opts: OverloadOptions) -> anyhow::Result<OverloadReport> {
    let temp = tempfile::Builder::new().prefix("htfaas-overload-").tempdir().context("make a temporary dir")?;
    let dir = opts.dir.clone().unwrap_or_else(|| temp.path().to_owned());
    let started = Instant::now();
    let mut procs = ProcStack::start(&ProcOptions {
        htfaas: opts.htfaas.clone(),
        nats_binary: opts.nats_binary.clone(),
        dir: dir.clone(),
        durability: Durability::Log,
        workers: opts.workers,
        scheduler_overrides: serde_json::Map::new(),
        ep_relay: false,
        ep_attach_ttl_s: None,
        async_threads: None,
    })
    .await?;
    let result = measure(&opts, &procs, &dir).await;
    procs.stop_all().await;
    let mut report = result?;
    report.elapsed = started.elapsed();
    Ok(report)
}

async fn measure(opts: &OverloadOptions, procs: &ProcStack, dir: &std::path::Path) -> anyhow::Result<OverloadReport> {
    let client = procs.client()?;
    let wasm = opts.wasm_dir.join("noop.wasm");
    let module =
        client.upload_module(std::fs::read(&wasm).with_context(|| format!("read {}", wasm.display()))?).await?;
    client.register(&noop("flood", "alice", module.clone(), "/data/flood/")).await?;
    for right in [Right::Read, Right::Write] {
        client.grant("bob", right, "/data/bob/").await?;
    }
    client.register(&noop("bobs", "bob", module, "/data/bob/")).await?;
    let data = dir.join("storage/data");
    crate::traffic::write_input(&data, ALICE_INPUT, 1024, 1)?;
    crate::traffic::write_input(&data, BOB_INPUT, 1024, 2)?;

    let mut report = OverloadReport { flood: opts.flood, slots: opts.workers, ..Default::default() };
    let pids: Vec<(Component, u32)> = Component::ALL.iter().filter_map(|&c| procs.pid(c).map(|p| (c, p))).collect();
    for (c, pid) in &pids {
        let now = rss_mib(*pid).unwrap_or(0.0);
        report.rss_mib.insert(c.name().into(), (now, now));
    }

    // The sampler: API latency, memory, queue depth, until told to stop.
    let stop = tokio_util::sync::CancellationToken::new();
    let sampler = {
        let stop = stop.clone();
        let client = client.clone();
        let pids = pids.clone();
        let scheduler = procs.scheduler_url();
        let token = procs.layout().scheduler_admin_token().to_owned();
        tokio::spawn(async move {
            let http = htfaas_gateway::http_client()?;
            let (mut registry, mut accounting, mut errors) = (Vec::new(), Vec::new(), 0u64);
            let mut rss: BTreeMap<String, f64> = BTreeMap::new();
            let mut idle_peak = 0u64;
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            let mut n = 0u64;
            while !stop.is_cancelled() {
                tick.tick().await;
                n += 1;
                let t = Instant::now();
                let ok = if n.is_multiple_of(2) {
                    client.functions().await.map(|_| ())
                } else {
                    client.accounting().await.map(|_| ())
                };
                let ms = t.elapsed().as_secs_f64() * 1000.0;
                match (ok, n.is_multiple_of(2)) {
                    (Ok(()), true) => registry.push(ms),
                    (Ok(()), false) => accounting.push(ms),
                    (Err(_), _) => errors += 1,
                }
                for (c, pid) in &pids {
                    if let Some(m) = rss_mib(*pid) {
                        let e = rss.entry(c.name().into()).or_insert(m);
                        *e = e.max(m);
                    }
                }
                if n.is_multiple_of(10)
                    && let Ok(r) = http.get(format!("{scheduler}/metrics")).bearer_auth(&token).send().await
                    && let Ok(text) = r.text().await
                {
                    let states = crate::traffic::parse_job_states(&text);
                    idle_peak = idle_peak.max(states.get("idle").copied().unwrap_or(0));
                }
            }
            anyhow::Ok((registry, accounting, errors, rss, idle_peak))
        })
    };

    // alice's flood.
    let nats = procs.nats_client().await?;
    let js = async_nats::jetstream::new(nats);
    let run_id = format!("{:08x}", rand::random::<u32>());
    let t0 = Instant::now();
    let mut acks = FuturesUnordered::new();
    // As the built-in storage publishes them: on the file's path subject.
    let alice_subject = path_subject(ALICE_INPUT);
    for n in 0..opts.flood {
        let payload = crate::traffic::transfer_write(ALICE_INPUT, 1024, &run_id, n);
        acks.push(js.publish(alice_subject.clone(), payload.into()).await.context("publish")?.into_future());
        while acks.len() >= PUBLISH_WINDOW {
            if let Some(ack) = acks.next().await {
                ack.context("JetStream ack")?;
            }
        }
    }
    while let Some(ack) = acks.next().await {
        ack.context("JetStream ack")?;
    }
    report.flood_publish = t0.elapsed();

    // bob's one event.
    let bob_published = unix_ms();
    let bob = crate::traffic::transfer_write(BOB_INPUT, 1024, &format!("b{run_id}"), 0);
    js.publish(path_subject(BOB_INPUT), bob.into()).await?.await.context("JetStream ack of bob's event")?;
    let db = dir.join("scheduler/jobs.sqlite");
    let deadline = Instant::now() + Duration::from_secs(600);
    let found = loop {
        if let Ok(Some(found)) = bob_and_alice(&db)
            && found.0.2.is_some()
        {
            break found;
        }
        if Instant::now() > deadline {
            stop.cancel();
            bail!("bob's job did not end within 600 s of its event");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let ((sub, start, end), ahead, before, _) = found;
    report.bob_submitted_ms = sub.saturating_sub(bob_published);
    report.bob_started_ms = start.unwrap_or(0).saturating_sub(bob_published);
    report.bob_finished_ms = end.unwrap_or(0).saturating_sub(bob_published);
    report.alice_started_ahead = ahead;
    report.alice_submitted_before_bob = before;
    tokio::time::sleep(opts.after).await;
    stop.cancel();
    let (registry, accounting, errors, rss, idle_peak) = sampler.await.context("the sampler")??;
    report.api_registry = Spread::of(registry);
    report.api_accounting = Spread::of(accounting);
    report.api_errors = errors;
    for (name, peak) in rss {
        if let Some(e) = report.rss_mib.get_mut(&name) {
            e.1 = e.1.max(peak);
        }
    }
    report.idle_peak = idle_peak;
    report.alice_completed = bob_and_alice(&db)?.map_or(0, |f| f.3);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_resident_size() {
        let mib = rss_mib(std::process::id()).expect("VmRSS");
        assert!(mib > 0.1 && mib < 65_536.0, "{mib}");
        assert_eq!(rss_mib(u32::MAX), None);
    }

    #[test]
    fn spreads_are_nearest_rank() {
        let s = Spread::of((1..=100).map(f64::from).collect());
        assert_eq!((s.p50, s.p99, s.max, s.n), (50.0, 99.0, 100.0, 100));
        let empty = Spread::of(vec![]);
        assert_eq!(empty.n, 0);
    }
}
