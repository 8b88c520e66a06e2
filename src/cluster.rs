//! `htfaas cluster-test`: the multi-host harness. A small site built out of network
//! namespaces ([`crate::netns`]), each component on a host of its own as a site runs it:
//!
//! | host | address | runs |
//! |---|---|---|
//! | `n1`, `n2`, `n3` | 10.213.7.11–13 | a 3-node NATS cluster; the events stream at 3 replicas |
//! | `storage` | 10.213.7.20 | `htfaas storage` (HTTPS) |
//! | `svc` | 10.213.7.30 | `htfaas scheduler` (HTTPS and WSS) and `htfaas gateway` (HTTPS), a certificate of the harness's CA |
//! | `ep1`, `ep2` | 10.213.7.41–42 | `htfaas ep`, attached over TLS, reaching the storage at its address |
//! | `ep3` | 10.213.7.43 (and .143 toward the storage) | `htfaas ep` behind a "NAT" (below) |
//! | `client` | 10.213.7.5 | the harness: publisher, API calls, checks |
//!
//! Each process runs from its file of the example site (`examples/site/`, [`SITE_FILES`]) as
//! it is, in the state directory; the harness writes what those files name: the secrets, the
//! NATS nodes' authorization, the CA and certificate, the state directories.
//!
//! Under a steady stream of dCache `transfer` events (the crash harness's two functions and
//! publisher, [`crate::crash`]), it kills one NATS node (the stream keeps accepting, nothing is
//! lost; the node comes back and catches up), cuts `ep1`'s link (its jobs run on `ep2` once the
//! scheduler's lease on them ends; the link is mended later), and restarts the processes of the
//! `svc` host. Then it checks exactly what the crash harness checks: every event fired exactly one
//! job per function, each completed once; every checksum output right; accounting equals the
//! job records; both audit trails verify.
//!
//! Every job's macaroons are bound to its EP's address (`ip:`, the scheduler adds the address it
//! sees the EP at): they work from `ep1` and `ep2`, which reach the storage from that address.
//! Last, with `ep1` and `ep2` disabled, `ep3` attaches; it reaches the storage from a second
//! address (as a NAT between it and the storage would show it), so its job's input is refused
//! (403) and the job fails: the documented failure of `bind_macaroons_to_ep` behind NAT.
//!
//! Needs root (namespaces) and `ip`. Traffic stays inside the namespaces it made; it deletes
//! them at the end, whatever happened.
//!
//! Must not know: the CLI (it returns a report; the command prints it).

use crate::crash::{Kill, NOOP_FN, NOOP_OUT, SUM_FN, SUM_OUT};
use crate::netns::Site;
use crate::procs::Component;
use crate::stack::Layout;
use anyhow::{Context as _, bail};
use htfaas_functions::proto::{JobState, path_subject};
use htfaas_functions::store::Durability;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::process::Child;

/// The harness's options.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// The `htfaas` binary the hosts run.
    pub htfaas: PathBuf,
    /// nats-server; default [`crate::nats::find_binary`].
    pub nats_binary: Option<PathBuf>,
    /// Where `checksum.wasm` and `noop.wasm` are.
    pub wasm_dir: PathBuf,
    /// Events to publish.
    pub events: u64,
    /// Events per second.
    pub rate: u32,
    /// The state directory (default: a temporary one, kept if a check fails).
    pub dir: Option<PathBuf>,
    /// How long the stream may take to drain.
    pub drain_timeout: Duration,
}

/// A fault the harness caused, and what came of it.
#[derive(Debug, Clone)]
pub struct Fault {
    /// What was done.
    pub what: String,
    /// When, from the first publish.
    pub at: Duration,
    /// How long until it was undone (the node restarted, the link mended, the processes up).
    pub lasted: Duration,
}

/// What the harness found.
#[derive(Debug, Clone, Default)]
pub struct ClusterReport {
    /// The crash harness's checks on the site's state.
    pub checks: crate::crash::CrashReport,
    /// The faults.
    pub faults: Vec<Fault>,
    /// Replicas of the events stream, and the servers that held it current at the end.
    pub stream_replicas: usize,
    /// Run attempts completed on each EP.
    pub completed_per_ep: BTreeMap<String, u64>,
    /// Whether `ep1` was running jobs when its link was cut.
    pub ep1_busy_at_cut: bool,
    /// Jobs whose attempt on `ep1` was lost and which then completed elsewhere.
    pub moved_from_ep1: u64,
    /// Why the stream did not drain, if it did not.
    pub drain_error: Option<String>,
    /// The NAT probe: the job's state and reason (expected: failed, input refused with 403).
    pub nat_probe: Option<(JobState, String)>,
}

impl ClusterReport {
    /// Every check held, the stream had 3 replicas, both EPs ran jobs, the jobs `ep1` had when
    /// its link was cut ran elsewhere, and the NAT probe failed on its input as documented.
    pub fn passed(&self) -> bool {
        self.checks.passed()
            && self.stream_replicas == 3
            && ["ep1", "ep2"].iter().all(|e| self.completed_per_ep.get(*e).copied().unwrap_or(0) > 0)
            && (!self.ep1_busy_at_cut || self.moved_from_ep1 > 0)
            && self.nat_probe.as_ref().is_some_and(|(s, why)| *s == JobState::Failed && why.contains("403"))
    }
}

impl fmt::Display for ClusterReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "events stream replicas: {}", self.stream_replicas)?;
        for fault in &self.faults {
            writeln!(f, "{} at {:.1} s, for {:.1} s", fault.what, fault.at.as_secs_f64(), fault.lasted.as_secs_f64())?;
        }
        writeln!(f, "run attempts completed per EP: {:?}", self.completed_per_ep)?;
        writeln!(
            f,
            "ep1 busy when its link was cut: {}; its jobs that then completed elsewhere: {}",
            self.ep1_busy_at_cut, self.moved_from_ep1
        )?;
        if let Some(e) = &self.drain_error {
            writeln!(f, "drain: {e}")?;
        }
        match &self.nat_probe {
            Some((state, why)) => {
                writeln!(f, "NAT probe (ep3 reaches the storage from another address): {state:?}: {why}")?
            }
            None => writeln!(f, "NAT probe: no answer")?,
        }
        write!(f, "{}", self.checks)?;
        if !self.passed() && self.checks.passed() {
            write!(f, "\nFAILED (the site's own checks)")?;
        }
        Ok(())
    }
}

/// The hosts and the last byte of their addresses.
const HOSTS: [(&str, u8); 9] = [
    ("client", 5),
    ("n1", 11),
    ("n2", 12),
    ("n3", 13),
    ("storage", 20),
    ("svc", 30),
    ("ep1", 41),
    ("ep2", 42),
    ("ep3", 43),
];
const NATS_PORT: u16 = 4222;
/// The NATS nodes' route port, as the example configs have it.
#[cfg(test)]
const ROUTE_PORT: u16 = 6222;
const STORAGE_PORT: u16 = 9000;
const SCHEDULER_PORT: u16 = 7443;
const GATEWAY_PORT: u16 = 8000;
/// The scheduler's lease on a silent EP's jobs here: a cut link's jobs run elsewhere after it.
const LEASE_S: u64 = 6;
/// The NAT probe's function and its trigger directory.
const NAT_FN: &str = "cluster-nat-probe";
const NAT_DIR: &str = "/data/cluster/nat/";
/// A job that sleeps: `ep1` is surely running it when its link is cut.
const SLOW_FN: &str = "cluster-slow";
const SLOW_DIR: &str = "/data/cluster/slow/";

/// Runs the harness (blocking: the site's work runs on a thread in the `client` host).
pub fn run(opts: ClusterOptions) -> anyhow::Result<ClusterReport> {
    if let Some(why) = Site::unavailable() {
        bail!("the multi-host harness cannot run here: {why}");
    }
    let temp = match &opts.dir {
        Some(_) => None,
        None => Some(tempfile::Builder::new().prefix("htfaas-cluster-").tempdir().context("make a temporary dir")?),
    };
    let dir = match (&opts.dir, &temp) {
        (Some(d), _) => d.clone(),
        (None, Some(t)) => t.path().to_owned(),
        (None, None) => bail!("no directory"),
    };
    // Short and unique: namespace names and veth ends are bounded.
    let prefix = format!("hc{}", std::process::id() % 1_000_000);
    let site = Arc::new(Site::create(&prefix, &HOSTS)?);
    let report = site.run_on("client", harness(site.clone(), opts, dir.clone()));
    // The namespaces go with the site, whatever happened (every process was stopped in it).
    drop(site);
    match &report {
        Ok(r) if r.passed() => {}
        _ => {
            if let Some(t) = temp {
                let kept = t.keep();
                eprintln!("cluster-test: state kept in {}", kept.display());
            }
        }
    }
    report
}

/// An address's URL.
fn url(scheme: &str, site: &Site, host: &str, port: u16) -> anyhow::Result<String> {
    Ok(format!("{scheme}://{}:{port}", site.host(host)?.addr))
}

/// The processes the harness started, by name (`n1`, `storage`, `scheduler`, `ep1`, …).
struct Procs {
    site: Arc<Site>,
    htfaas: PathBuf,
    nats: PathBuf,
    dir: PathBuf,
    children: HashMap<String, Child>,
}

impl Procs {
    /// Starts `name` on `host`: nats-server with `conf`, or `htfaas <component> --config`.
    fn start(&mut self, name: &str, host: &str) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("logs/{name}.log")))
            .with_context(|| format!("open the log of {name}"))?;
        let conf = self.dir.join(format!("config/{name}.conf"));
        let mut cmd = if name.starts_with('n') && name.len() == 2 {
            let mut c = self.site.command(host, &self.nats)?;
            c.arg("-c").arg(&conf);
            c
        } else {
            let component = match name {
                n if n.starts_with("ep") => "ep",
                n => n,
            };
            let mut c = self.site.command(host, &self.htfaas)?;
            c.arg(component).arg("--config").arg(self.dir.join(format!("config/{name}.json")));
            c.env("RUST_LOG", "info");
            c
        };
        // Every path in the site's configs is relative to the state directory.
        let child = cmd
            .current_dir(&self.dir)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {name} on {host}"))?;
        self.children.insert(name.to_owned(), child);
        Ok(())
    }

    /// SIGKILL, reaped.
    async fn kill(&mut self, name: &str) -> anyhow::Result<()> {
        let mut child = self.children.remove(name).with_context(|| format!("{name} is not running"))?;
        child.kill().await.with_context(|| format!("kill {name}"))?;
        Ok(())
    }

    /// SIGTERM to each, then SIGKILL after 10 s.
    async fn stop_all(&mut self) {
        for child in self.children.values() {
            if let Some(pid) = child.id() {
                let _ = tokio::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().await;
            }
        }
        for (name, mut child) in self.children.drain() {
            if tokio::time::timeout(Duration::from_secs(10), child.wait()).await.is_err() {
                tracing::warn!("{name} did not stop in 10 s; killing it");
                let _ = child.kill().await;
            }
        }
    }
}

/// The example site's configuration files (`examples/site/`), which the harness runs as they
/// are: each host's processes run in the state directory, where the relative paths the files
/// name (state, `pki/`, `secrets/`) are made.
pub const SITE_FILES: [(&str, &str); 9] = [
    ("n1.conf", include_str!("../examples/site/n1.conf")),
    ("n2.conf", include_str!("../examples/site/n2.conf")),
    ("n3.conf", include_str!("../examples/site/n3.conf")),
    ("storage.json", include_str!("../examples/site/storage.json")),
    ("scheduler.json", include_str!("../examples/site/scheduler.json")),
    ("gateway.json", include_str!("../examples/site/gateway.json")),
    ("ep1.json", include_str!("../examples/site/ep1.json")),
    ("ep2.json", include_str!("../examples/site/ep2.json")),
    ("ep3.json", include_str!("../examples/site/ep3.json")),
];

/// The site's files in `dir`: the example configs under `config/`, the NATS nodes' shared
/// authorization (`config/nats-auth.conf`, public keys only), the secrets the configs name
/// (`secrets/`), the CA and the one server certificate for the storage and service hosts
/// (`pki/`), and the state directories.
fn write_configs(site: &Site, layout: &Layout, dir: &Path) -> anyhow::Result<()> {
    for (name, text) in SITE_FILES {
        std::fs::write(dir.join("config").join(name), text).with_context(|| format!("write config/{name}"))?;
    }
    let users = layout.nats_users()?;
    std::fs::write(dir.join("config/nats-auth.conf"), htfaas_functions::nats_server::authorization(&users))
        .context("write config/nats-auth.conf")?;
    layout.write_secret_files(&["ep1", "ep2", "ep3"])?;
    let servers: Vec<String> =
        ["storage", "svc"].iter().map(|h| Ok(site.host(h)?.addr.to_string())).collect::<anyhow::Result<_>>()?;
    crate::pki::make(dir, "htfaas cluster-test CA", &servers)?;
    for sub in ["nats/n1", "nats/n2", "nats/n3", "ep/ep1", "ep/ep2", "ep/ep3"] {
        htfaas_functions::store::create_private_dir(&dir.join(sub)).with_context(|| format!("create {sub}"))?;
    }
    Ok(())
}

/// The NATS cluster's client URLs, comma-separated.
fn nats_urls(site: &Site) -> anyhow::Result<String> {
    Ok(["n1", "n2", "n3"]
        .iter()
        .map(|n| url("nats", site, n, NATS_PORT))
        .collect::<anyhow::Result<Vec<_>>>()?
        .join(","))
}

/// Until `check` holds (tried every 200 ms), or `what` failed after `limit`.
async fn until<F, Fut>(what: &str, limit: Duration, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let deadline = Instant::now() + limit;
    let mut last = None;
    loop {
        match check().await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last = Some(e),
        }
        if Instant::now() > deadline {
            return Err(match last {
                Some(e) => e.context(format!("{what} within {limit:?}")),
                None => anyhow::anyhow!("{what} within {limit:?}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether `url` answers HTTP at all (`http` trusts the harness's CA).
async fn answers(http: &reqwest::Client, url: String) -> anyhow::Result<bool> {
    Ok(http.get(url).timeout(Duration::from_secs(2)).send().await.is_ok())
}

/// The harness, on the `client` host.
async fn harness(site: Arc<Site>, opts: ClusterOptions, dir: PathBuf) -> anyhow::Result<ClusterReport> {
    for sub in ["config", "logs"] {
        std::fs::create_dir_all(dir.join(sub))?;
    }
    let layout = Layout::prepare(&dir, Durability::Fsync)?;
    write_configs(&site, &layout, &dir)?;
    let nats = match &opts.nats_binary {
        Some(p) => p.clone(),
        None => crate::nats::find_binary().context("no nats-server (scripts/install-deps.sh)")?,
    };
    let mut procs =
        Procs { site: site.clone(), htfaas: opts.htfaas.clone(), nats, dir: dir.clone(), children: HashMap::new() };
    let result = drive(&site, &opts, &dir, &layout, &mut procs).await;
    procs.stop_all().await;
    let (mut report, published, landed, mut kills) = result?;
    let mut checks =
        crate::crash::check(&dir, Durability::Fsync, published, &landed, &mut kills, &[NAT_FN, SLOW_FN]).await?;
    checks.kills = kills;
    checks.drained = report.drain_error.is_none();
    checks.elapsed = report.checks.elapsed;
    report.checks = checks;
    (report.completed_per_ep, report.moved_from_ep1) = attempts_per_ep(&dir.join("scheduler/jobs.sqlite"))?;
    Ok(report)
}

/// From the stopped scheduler's store: completed run attempts per EP, and the jobs with a lost
/// attempt on `ep1` that completed on another EP.
fn attempts_per_ep(db: &Path) -> anyhow::Result<(BTreeMap<String, u64>, u64)> {
    let conn = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let mut per_ep = BTreeMap::new();
    let mut stmt = conn.prepare("SELECT ep, COUNT(*) FROM attempts WHERE outcome = 'completed' GROUP BY ep")?;
    for row in stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))? {
        let (ep, n) = row?;
        per_ep.insert(ep, u64::try_from(n).unwrap_or(0));
    }
    let moved: i64 = conn.query_row(
        "SELECT COUNT(DISTINCT a.job_id) FROM attempts a JOIN attempts b ON a.job_id = b.job_id \
         WHERE a.ep = 'ep1' AND a.outcome != 'completed' AND b.ep != 'ep1' AND b.outcome = 'completed'",
        [],
        |r| r.get(0),
    )?;
    Ok((per_ep, u64::try_from(moved).unwrap_or(0)))
}

/// What the drive leaves for the checks: the report so far, events published, when each
/// landed, the faults as kills (for their recovery times).
type Driven = (ClusterReport, u64, Mutex<Vec<u64>>, Vec<Kill>);

/// Starts the site, streams the events through the faults, drains, probes the NAT case.
async fn drive(
    site: &Site,
    opts: &ClusterOptions,
    dir: &Path,
    layout: &Layout,
    procs: &mut Procs,
) -> anyhow::Result<Driven> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ca_file = crate::pki::paths(dir).ca_file;
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&ca_file)?)?;
    let http = reqwest::Client::builder().tls_certs_only([ca]).build()?;
    let nats_urls = nats_urls(site)?;
    let operator = layout.nats_credential("operator")?;

    for n in ["n1", "n2", "n3"] {
        procs.start(n, n)?;
    }
    // JetStream answers once the cluster has elected its meta leader.
    let nc = htfaas_functions::nats::connect_options("htfaas-cluster-test", Some(&operator))
        .retry_on_initial_connect()
        .connect(htfaas_functions::nats::servers(&nats_urls)?)
        .await?;
    let js = async_nats::jetstream::new(nc);
    until("the NATS cluster's JetStream answers", Duration::from_secs(60), || {
        let js = js.clone();
        async move { Ok(js.query_account().await.is_ok()) }
    })
    .await?;

    let storage_url = url("https", site, "storage", STORAGE_PORT)?;
    let scheduler_url = url("https", site, "svc", SCHEDULER_PORT)?;
    let gateway_url = url("https", site, "svc", GATEWAY_PORT)?;
    procs.start("storage", "storage")?;
    until("the storage answers", Duration::from_secs(60), || answers(&http, format!("{storage_url}/healthz"))).await?;
    procs.start("scheduler", "svc")?;
    until("the scheduler answers", Duration::from_secs(60), || answers(&http, format!("{scheduler_url}/healthz")))
        .await?;
    procs.start("gateway", "svc")?;
    until("the gateway answers", Duration::from_secs(60), || answers(&http, format!("{gateway_url}/healthz"))).await?;
    let stream = js.get_stream(htfaas_functions::proto::EVENTS_STREAM).await?;
    let stream_replicas = stream.cached_info().config.num_replicas;

    let client = crate::client::Client::new(crate::client::StackInfo {
        ca_file: Some(ca_file.clone()),
        ..layout.info(gateway_url.clone(), scheduler_url.clone(), storage_url.clone(), nats_urls.clone())
    })?;
    for ep in ["ep1", "ep2"] {
        procs.start(ep, ep)?;
    }
    until("both EPs attach over TLS", Duration::from_secs(60), || {
        let client = &client;
        async move {
            let eps = client.eps().await?;
            Ok(["ep1", "ep2"].iter().all(|n| eps.iter().any(|e| e.name == *n && e.session.is_some())))
        }
    })
    .await?;

    let read = |name: &str| {
        let p = opts.wasm_dir.join(format!("{name}.wasm"));
        std::fs::read(&p).with_context(|| format!("read {} (build the examples first)", p.display()))
    };
    let sum = client.upload_module(read("checksum")?).await?;
    let noop = client.upload_module(read("noop")?).await?;
    client.register(&crate::crash::manifest(SUM_FN, sum.clone(), SUM_OUT)).await?;
    client.register(&crate::crash::manifest(NOOP_FN, noop, NOOP_OUT)).await?;
    let mut nat = crate::crash::manifest(NAT_FN, sum, "/data/cluster/nat-out/");
    nat.trigger = htfaas_functions::manifest::Trigger::on_path(format!("{NAT_DIR}*"));
    client.register(&nat).await?;
    let mut slow =
        crate::crash::manifest(SLOW_FN, client.upload_module(read("hostile")?).await?, "/data/cluster/slow-out/");
    slow.trigger = htfaas_functions::manifest::Trigger::on_path(format!("{SLOW_DIR}*"));
    slow.args = vec!["sleep".into(), "3".into()];
    client.register(&slow).await?;

    // The stream, with its faults.
    let run_id = format!("{:08x}", rand::random::<u32>());
    let data_dir = dir.join("storage/data");
    for n in 0..opts.events {
        let path = format!("{}{}", crate::crash::INPUT_DIR, crate::crash::input_name(&run_id, n));
        crate::traffic::write_input(&data_dir, &path, crate::crash::INPUT_BYTES, n)?;
    }
    let landed = Arc::new(Mutex::new(vec![0u64; usize::try_from(opts.events)?]));
    let started = Instant::now();
    let publisher = tokio::spawn(crate::crash::publish(
        nats_urls.clone(),
        operator.clone(),
        run_id.clone(),
        opts.events,
        opts.rate,
        landed.clone(),
    ));
    let window = Duration::from_secs_f64(opts.events as f64 / f64::from(opts.rate.max(1)));
    let mut faults = Vec::new();
    let mut kills = Vec::new();
    let at = |share: f64| tokio::time::Instant::from_std(started + window.mul_f64(share));

    // One NATS node dies: the stream keeps accepting (2 of 3 replicas), then it comes back.
    tokio::time::sleep_until(at(0.1)).await;
    let t0 = Instant::now();
    kills.push(fault_kill(Component::Nats, t0 - started));
    procs.kill("n2").await?;
    tokio::time::sleep_until(at(0.3)).await;
    procs.start("n2", "n2")?;
    faults.push(Fault { what: "killed NATS node n2 (SIGKILL)".into(), at: t0 - started, lasted: t0.elapsed() });

    // ep1's link is cut while it runs jobs: they run elsewhere after the lease; then it is
    // mended (its session is gone by then; the EP attaches again). The stream's jobs take
    // milliseconds, so with ep2 disabled for a moment ep1 takes a job that sleeps, and the link
    // is cut while it runs.
    tokio::time::sleep_until(at(0.35)).await;
    let hold = htfaas_functions::proto::EpAction {
        reason: "cluster-test: ep1 takes the slow job".into(),
        deadline_s: None,
        group: None,
    };
    client.ep_action("ep2", "disable", &hold).await?;
    let slow_path = format!("{SLOW_DIR}slow-{run_id}.dat");
    land_one(&js, dir, &slow_path, &run_id).await?;
    // Asked of ep1's own running jobs: the newest jobs' page moves on under the stream.
    let busy = until("ep1 runs the slow job", Duration::from_secs(60), || async {
        let running = client.eps().await?.into_iter().find(|e| e.name == "ep1").map(|e| e.running).unwrap_or_default();
        for id in running {
            if client.job(&id).await?.function == SLOW_FN {
                return Ok(true);
            }
        }
        Ok(false)
    })
    .await
    .is_ok();
    let t0 = Instant::now();
    site.cut("ep1")?;
    kills.push(fault_kill(Component::Ep, t0 - started));
    client.ep_action("ep2", "enable", &hold).await?;
    tokio::time::sleep(window.mul_f64(0.2).max(Duration::from_secs(3 * LEASE_S))).await;
    site.mend("ep1")?;
    faults.push(Fault { what: "cut the link of host ep1".into(), at: t0 - started, lasted: t0.elapsed() });

    // The service host's processes restart (while events still come, if the stream is long
    // enough for the faults before).
    tokio::time::sleep_until(at(0.8)).await;
    let t0 = Instant::now();
    kills.push(fault_kill(Component::Scheduler, t0 - started));
    procs.kill("gateway").await?;
    procs.kill("scheduler").await?;
    procs.start("scheduler", "svc")?;
    procs.start("gateway", "svc")?;
    until("the svc host's processes answer again", Duration::from_secs(60), || {
        let http = &http;
        let (s, g) = (format!("{scheduler_url}/healthz"), format!("{gateway_url}/healthz"));
        async move { Ok(answers(http, s).await? && answers(http, g).await?) }
    })
    .await?;
    faults.push(Fault {
        what: "restarted the svc host's scheduler and gateway (SIGKILL)".into(),
        at: t0 - started,
        lasted: t0.elapsed(),
    });
    if let Some(k) = kills.last_mut() {
        k.down = t0.elapsed();
    }

    let published = publisher.await.context("the publisher")??;
    let expected = published * crate::crash::FUNCTIONS;
    let metrics = format!("{scheduler_url}/metrics");
    let token = layout.scheduler_admin_token().to_owned();
    let drained = until("every job completes", opts.drain_timeout, || {
        let (http, metrics, token) = (&http, &metrics, &token);
        async move {
            let text = http.get(metrics).bearer_auth(token).send().await?.error_for_status()?.text().await?;
            let states = crate::traffic::parse_job_states(&text);
            Ok(states.get("completed").copied().unwrap_or(0) >= expected)
        }
    })
    .await;
    let elapsed = started.elapsed();

    // The NAT probe: ep1 and ep2 take nothing new; ep3 reaches the storage from a second address.
    let nat_probe = nat_probe(site, procs, &client, &js, dir, &run_id).await?;

    let landed = Mutex::new(landed.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone());
    let mut report = ClusterReport {
        stream_replicas,
        nat_probe,
        faults,
        ep1_busy_at_cut: busy,
        drain_error: drained.err().map(|e| format!("{e:#}")),
        ..Default::default()
    };
    report.checks.elapsed = elapsed;
    Ok((report, published, landed, kills))
}

/// A fault at `at` from the first publish, as the crash harness's checks take it (for the
/// recovery: the first job of an event that landed after it to end).
fn fault_kill(component: Component, at: Duration) -> Kill {
    Kill { component, at, at_unix_ms: htfaas_functions::time::now_ms(), down: Duration::ZERO, recovery: None }
}

/// Writes one input file at `path` in the storage's data and publishes its billing message,
/// outside the stream (the slow job, the NAT probe).
async fn land_one(js: &async_nats::jetstream::Context, dir: &Path, path: &str, run_id: &str) -> anyhow::Result<()> {
    crate::traffic::write_input(&dir.join("storage/data"), path, crate::crash::INPUT_BYTES, 0)?;
    let payload = crate::traffic::transfer_write(path, crate::crash::INPUT_BYTES, run_id, 0);
    // Right after a NATS node came back the stream may have no leader for a moment ("no stream
    // found"): publish again (a repeat is the same event, dropped by its firing key).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let sent = async { js.publish(path_subject(path), payload.clone().into()).await?.await }.await;
        match sent {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() < deadline => {
                tracing::debug!("publish {path} again: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Disables `ep1` and `ep2`, starts `ep3` behind its "NAT", fires the probe function on one
/// file, and returns how its job ended.
async fn nat_probe(
    site: &Site,
    procs: &mut Procs,
    client: &crate::client::Client,
    js: &async_nats::jetstream::Context,
    dir: &Path,
    run_id: &str,
) -> anyhow::Result<Option<(JobState, String)>> {
    let action = htfaas_functions::proto::EpAction {
        reason: "cluster-test: the NAT probe".into(),
        deadline_s: None,
        group: None,
    };
    for ep in ["ep1", "ep2"] {
        client.ep_action(ep, "disable", &action).await?;
    }
    let nat_addr = site.source_toward("ep3", 143, "storage")?;
    tracing::info!(%nat_addr, "ep3 reaches the storage from a second address");
    procs.start("ep3", "ep3")?;
    until("ep3 attaches", Duration::from_secs(60), || async move {
        Ok(client.eps().await?.iter().any(|e| e.name == "ep3" && e.session.is_some()))
    })
    .await?;
    let path = format!("{NAT_DIR}probe-{run_id}.dat");
    land_one(js, dir, &path, run_id).await?;
    let outcome = Arc::new(Mutex::new(None));
    until("the NAT probe's job ends", Duration::from_secs(60), || {
        let outcome = outcome.clone();
        async move {
            for j in client.jobs().await? {
                if j.function == NAT_FN && matches!(j.state, JobState::Completed | JobState::Failed | JobState::Held) {
                    *outcome.lock().map_err(|_| anyhow::anyhow!("poisoned"))? = Some((j.state, j.reason));
                    return Ok(true);
                }
            }
            Ok(false)
        }
    })
    .await?;
    let got = outcome.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.take();
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `value` with each `{"secret_file": …}` replaced by `secret`; the files named, in order.
    fn without_secrets(value: &mut serde_json::Value, secret: &str, named: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) if map.len() == 1 && map.contains_key("secret_file") => {
                named.push(map["secret_file"].as_str().unwrap_or_default().to_owned());
                *value = secret.into();
            }
            serde_json::Value::Object(map) => map.values_mut().for_each(|v| without_secrets(v, secret, named)),
            serde_json::Value::Array(items) => items.iter_mut().for_each(|v| without_secrets(v, secret, named)),
            _ => {}
        }
    }

    /// Each example config is its component's config (secrets aside), listens at its host's
    /// address in the harness's plan, and names only secrets the harness writes.
    #[test]
    fn the_example_site_is_the_harness_site() {
        let seed = htfaas_functions::nats::NatsCredential::generate().seed().to_owned();
        let addr = |host: &str| {
            let last = HOSTS.iter().find(|(h, _)| *h == host).map(|(_, a)| *a).expect("a host of the plan");
            format!("10.213.7.{last}")
        };
        let mut named = Vec::new();
        let mut parse = |file: &str| {
            let text = SITE_FILES.iter().find(|(f, _)| *f == file).map(|(_, t)| *t).expect("an example file");
            let mut v: serde_json::Value = serde_json::from_str(text).expect("JSON");
            without_secrets(&mut v, &seed, &mut named);
            v
        };
        let storage: htfaas_storage::Config = serde_json::from_value(parse("storage.json")).expect("storage");
        assert_eq!(storage.listen.to_string(), format!("{}:{STORAGE_PORT}", addr("storage")));
        let scheduler: htfaas_scheduler::Config = serde_json::from_value(parse("scheduler.json")).expect("scheduler");
        assert_eq!(scheduler.listen.to_string(), format!("{}:{SCHEDULER_PORT}", addr("svc")));
        assert_eq!(scheduler.lease_s, LEASE_S);
        let gateway: htfaas_gateway::Config = serde_json::from_value(parse("gateway.json")).expect("gateway");
        assert_eq!(gateway.listen.to_string(), format!("{}:{GATEWAY_PORT}", addr("svc")));
        for ep in ["ep1", "ep2", "ep3"] {
            let config: htfaas_ep::Config = serde_json::from_value(parse(&format!("{ep}.json"))).expect("EP");
            assert_eq!(config.name, ep);
            assert_eq!(config.scheduler_url, format!("https://{}:{SCHEDULER_PORT}", addr("svc")));
        }
        for n in ["n1", "n2", "n3"] {
            let text = SITE_FILES.iter().find(|(f, _)| *f == format!("{n}.conf")).map(|(_, t)| *t).expect("conf");
            assert!(text.contains(&format!("listen: \"{}:{NATS_PORT}\"", addr(n))), "{n}");
            assert!(text.contains(&format!("listen: \"{}:{ROUTE_PORT}\"", addr(n))), "{n}");
            assert!(text.contains("include \"nats-auth.conf\""), "{n}");
        }

        // The secrets they name are the ones `Layout::write_secret_files` writes.
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = Layout::prepare(dir.path(), Durability::Fsync).expect("layout");
        layout.write_secret_files(&["ep1", "ep2", "ep3"]).expect("secrets");
        assert!(!named.is_empty());
        for file in named {
            assert!(dir.path().join(&file).is_file(), "{file} is named but not written");
        }
    }
}
