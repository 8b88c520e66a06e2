//! `htfaas crash-test`: the crash harness. The real stack, each component a process of its own
//! (nats-server, `htfaas storage`, `htfaas scheduler`, `htfaas gateway`, `htfaas ep`), under a
//! steady stream of dCache `transfer` events, while a killer sends SIGKILL to each component at
//! a random moment, waits a random while and starts it again. Then the stream drains, every
//! process stops, and the harness checks the ground state on disk:
//!
//! - every event fired exactly one job per function (two functions: `crash-sum`, which writes
//!   a checksum file, and `crash-noop`), each `completed`, with exactly one completed run
//!   attempt;
//! - every checksum output exists once, its bytes match the sha256 the EP reported, and the
//!   sha256 it holds is the input's;
//! - every owner's account equals the sum of its job records
//!   ([`htfaas_scheduler::queue::Queue::accounts_from_records`]);
//! - the scheduler's and the gateway's audit trails verify under their keys.
//!
//! It prints the counts and, per kill, how long the component was down (kill to answering
//! again) and the recovery time: from the kill to the end of the first job of an event that
//! landed after the kill (events land at their first publish attempt, so a NATS outage counts).
//!
//! Events are published the way a dCache pool publishes them (JetStream, with `Nats-Msg-Id`,
//! retried until acknowledged, so an outage of NATS delays them and loses none); the inputs
//! are written into the storage's data directory beforehand (1 KiB each), so writing them
//! fires nothing. Kill moments and down times come from one seed, printed for a replay.
//! Everything listens on 127.0.0.1 ports picked at start.
//!
//! [`long`] is the same for one long job (`htfaas crash-test --long`): a scheduler restart, an
//! EP link cut, attach-token renewals and a move to another EP from its checkpoint, in one run.

pub mod long;

use crate::procs::{Component, ProcOptions, ProcStack};
use crate::stack::USER;
use anyhow::{Context as _, bail};
use htfaas_functions::manifest::{Outputs, Trigger};
use htfaas_functions::proto::{OutputFile, path_subject};
use htfaas_functions::store::Durability;
use htfaas_functions::{FunctionManifest, Resources};
use rand::{Rng as _, SeedableRng as _};
use sha2::{Digest as _, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where events land and what the two functions write (also the multi-host harness's,
/// [`crate::cluster`]).
pub(crate) const INPUT_DIR: &str = "/data/crash/in/";
pub(crate) const SUM_OUT: &str = "/data/crash/sum/";
pub(crate) const NOOP_OUT: &str = "/data/crash/noop/";
pub(crate) const SUM_FN: &str = "crash-sum";
pub(crate) const NOOP_FN: &str = "crash-noop";
/// Functions every event fires.
pub(crate) const FUNCTIONS: u64 = 2;
/// Input size.
pub(crate) const INPUT_BYTES: usize = 1024;

/// What to run.
#[derive(Debug, Clone)]
pub struct CrashOptions {
    /// The `htfaas` binary whose subcommands run the components.
    pub htfaas: PathBuf,
    /// nats-server; default [`crate::nats::find_binary`].
    pub nats_binary: Option<PathBuf>,
    /// Where `checksum.wasm` and `noop.wasm` are (`examples/target/wasm32-wasip1/release`).
    pub wasm_dir: PathBuf,
    /// Events in the stream.
    pub events: u64,
    /// Events published per second.
    pub rate: u32,
    /// Rounds of kills; each round kills every component once, in a random order.
    pub rounds: u32,
    /// Seed of the kill order, moments and down times.
    pub seed: u64,
    /// The stack's durability.
    pub durability: Durability,
    /// EP cores.
    pub workers: u32,
    /// How long the stream may take to drain after the last event.
    pub drain_timeout: Duration,
    /// Keep the state here (default: a temporary directory, removed at the end).
    pub dir: Option<PathBuf>,
}

impl CrashOptions {
    /// 10,000 events at 40 per second, one round of kills, JetStream's own durability, an
    /// EP with 2 cores.
    pub fn new(htfaas: PathBuf, wasm_dir: PathBuf) -> CrashOptions {
        CrashOptions {
            htfaas,
            nats_binary: None,
            wasm_dir,
            events: 10_000,
            rate: 40,
            rounds: 1,
            seed: SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_secs()),
            durability: Durability::Log,
            workers: 2,
            drain_timeout: Duration::from_secs(600),
            dir: None,
        }
    }
}

/// One kill.
#[derive(Debug, Clone)]
pub struct Kill {
    /// What was killed.
    pub component: Component,
    /// When, from the start of the stream.
    pub at: Duration,
    /// Unix ms of the kill.
    pub at_unix_ms: u64,
    /// From the kill to the restarted component answering.
    pub down: Duration,
    /// From the kill to the end of the first job of an event that landed after it.
    pub recovery: Option<Duration>,
}

/// What the harness found.
#[derive(Debug, Clone, Default)]
pub struct CrashReport {
    /// The seed of the kills' moments; `None` where the faults follow a fixed plan (the
    /// multi-host harness).
    pub seed: Option<u64>,
    /// Events published (each acknowledged by JetStream).
    pub events: u64,
    /// Jobs expected: events × functions.
    pub expected_jobs: u64,
    /// Jobs the scheduler holds, by state.
    pub jobs_by_state: BTreeMap<String, u64>,
    /// (event, function) pairs with no job.
    pub missing: u64,
    /// Of those, the pairs in the gateway's dead-letter list: accounted for.
    pub dead_lettered: u64,
    /// (event, function) pairs with neither a job nor a dead-letter entry: left silently.
    pub left_silently: u64,
    /// (event, function) pairs with more than one job.
    pub duplicate_jobs: u64,
    /// Jobs with other than exactly one completed run attempt.
    pub not_once_completed: u64,
    /// Run attempts in all (more than jobs: runs lost to a kill ran again).
    pub attempts: u64,
    /// Checksum outputs that exist with the right bytes and the input's sha256.
    pub outputs_ok: u64,
    /// Checksum outputs missing, differing from their report, or holding a wrong sha256.
    pub outputs_bad: Vec<String>,
    /// Files in the checksum output directory that no job reported.
    pub outputs_extra: u64,
    /// Owners whose account differs from the sum of their job records.
    pub accounting_mismatches: Vec<String>,
    /// Audit records and checkpoints verified: (trail, records, checkpoints).
    pub audit: Vec<(String, u64, u64)>,
    /// Trails that did not verify, with the problem.
    pub audit_problems: Vec<String>,
    /// The kills.
    pub kills: Vec<Kill>,
    /// From an event's landing to the end of its last job: p50, p99 and the slowest, ms.
    pub event_latency_ms: (u64, u64, u64),
    /// From the first publish to the last job's end.
    pub elapsed: Duration,
    /// Whether the stream drained within the timeout.
    pub drained: bool,
}

impl CrashReport {
    /// Every check held.
    pub fn passed(&self) -> bool {
        self.drained
            && self.left_silently == 0
            && self.missing == 0
            && self.duplicate_jobs == 0
            && self.not_once_completed == 0
            && self.jobs_by_state.get("completed").copied().unwrap_or(0) == self.expected_jobs
            && self.jobs_by_state.values().sum::<u64>() == self.expected_jobs
            && self.outputs_ok == self.events
            && self.outputs_bad.is_empty()
            && self.outputs_extra == 0
            && self.accounting_mismatches.is_empty()
            && self.audit_problems.is_empty()
            && self.audit.len() == 2
    }
}

impl fmt::Display for CrashReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(seed) = self.seed {
            writeln!(f, "seed {seed}")?;
        }
        writeln!(f, "events published: {}; jobs expected: {}", self.events, self.expected_jobs)?;
        writeln!(f, "jobs by state: {:?}", self.jobs_by_state)?;
        writeln!(
            f,
            "missing: {}; duplicate jobs: {}; jobs without exactly one completed run: {}; run attempts: {}",
            self.missing, self.duplicate_jobs, self.not_once_completed, self.attempts
        )?;
        writeln!(
            f,
            "checksum outputs right: {}; wrong or missing: {}; extra files: {}",
            self.outputs_ok,
            self.outputs_bad.len(),
            self.outputs_extra
        )?;
        for bad in self.outputs_bad.iter().take(10) {
            writeln!(f, "  {bad}")?;
        }
        writeln!(
            f,
            "pairs without a job: in the dead-letter list {}, left silently {}",
            self.dead_lettered, self.left_silently
        )?;
        writeln!(f, "accounting mismatches: {:?}", self.accounting_mismatches)?;
        for (trail, records, checkpoints) in &self.audit {
            writeln!(f, "audit {trail}: {records} records, {checkpoints} checkpoints, verified")?;
        }
        for p in &self.audit_problems {
            writeln!(f, "audit problem: {p}")?;
        }
        for k in &self.kills {
            let recovery = k.recovery.map_or("none".to_owned(), |r| format!("{} ms", r.as_millis()));
            writeln!(
                f,
                "kill {:<11} at {:>6.1} s: down {:>5} ms, recovery {recovery}",
                k.component.name(),
                k.at.as_secs_f64(),
                k.down.as_millis()
            )?;
        }
        let (p50, p99, max) = self.event_latency_ms;
        writeln!(f, "event to its last job's end: p50 {p50} ms, p99 {p99} ms, slowest {max} ms")?;
        writeln!(f, "elapsed {:.1} s, drained: {}", self.elapsed.as_secs_f64(), self.drained)?;
        write!(f, "{}", if self.passed() { "PASSED" } else { "FAILED" })
    }
}

use htfaas_functions::time::now_ms as unix_ms;

pub(crate) fn manifest(name: &str, module: htfaas_functions::Digest, out: &str) -> FunctionManifest {
    FunctionManifest {
        runtime: Default::default(),
        command: Vec::new(),
        handler: false,
        retry: None,
        name: name.into(),
        owner: USER.into(),
        module,
        trigger: Trigger::on_path(format!("{INPUT_DIR}**")),
        resources: Resources::new(1, 256, 60),
        outputs: Outputs::into_dir(out),
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

/// The input name of event `n`.
pub(crate) fn input_name(run_id: &str, n: u64) -> String {
    format!("e{n:07}-{run_id}.dat")
}

/// Event index from an input name.
fn event_index(name: &str) -> Option<u64> {
    name.strip_prefix('e')?.split('-').next()?.parse().ok()
}

/// Runs the harness.
pub async fn run(opts: CrashOptions) -> anyhow::Result<CrashReport> {
    let temp = match &opts.dir {
        Some(_) => None,
        None => Some(tempfile::Builder::new().prefix("htfaas-crash-").tempdir().context("make a temporary dir")?),
    };
    let dir = match (&opts.dir, &temp) {
        (Some(d), _) => d.clone(),
        (None, Some(t)) => t.path().to_owned(),
        (None, None) => bail!("no directory"),
    };
    for sub in ["config", "logs"] {
        std::fs::create_dir_all(dir.join(sub))?;
    }
    let mut scheduler_overrides = serde_json::Map::new();
    // Every kill of the EP or the storage costs a run attempt of the jobs it had; a few
    // rounds of kills must not hold a job for it.
    scheduler_overrides.insert("max_retries".into(), 20.into());
    let mut procs = ProcStack::start(&ProcOptions {
        htfaas: opts.htfaas.clone(),
        nats_binary: opts.nats_binary.clone(),
        dir: dir.clone(),
        durability: opts.durability,
        workers: opts.workers,
        scheduler_overrides,
        ep_relay: false,
        ep_attach_ttl_s: None,
        async_threads: None,
    })
    .await?;
    let client = procs.client()?;
    let read = |name: &str| {
        let p = opts.wasm_dir.join(format!("{name}.wasm"));
        std::fs::read(&p).with_context(|| format!("read {} (build the examples first)", p.display()))
    };
    let sum = client.upload_module(read("checksum")?).await?;
    let noop = client.upload_module(read("noop")?).await?;
    client.register(&manifest(SUM_FN, sum, SUM_OUT)).await?;
    client.register(&manifest(NOOP_FN, noop, NOOP_OUT)).await?;

    // Inputs first (writing them into the data directory fires nothing).
    let run_id = format!("{:08x}", rand::random::<u32>());
    let data_dir = dir.join("storage/data");
    for n in 0..opts.events {
        let path = format!("{INPUT_DIR}{}", input_name(&run_id, n));
        crate::traffic::write_input(&data_dir, &path, INPUT_BYTES, n)?;
    }

    println!(
        "crash harness: {} events at {}/s, seed {}, state in {}",
        opts.events,
        opts.rate,
        opts.seed,
        dir.display()
    );
    let started = Instant::now();
    let landed = Arc::new(Mutex::new(vec![0u64; usize::try_from(opts.events)?]));
    let operator = procs.layout().nats_credential("operator")?;
    let publisher =
        tokio::spawn(publish(procs.nats_url(), operator, run_id.clone(), opts.events, opts.rate, landed.clone()));

    // The kills: each round every component once, in a random order, at random moments
    // within the publishing window (at least the previous kill's recovery apart).
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed);
    let window = Duration::from_secs_f64(opts.events as f64 / f64::from(opts.rate.max(1)));
    let mut plan = Vec::new();
    for _ in 0..opts.rounds {
        let mut order = Component::ALL.to_vec();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.gen_range(0..=i));
        }
        plan.extend(order);
    }
    // One kill per slot of the window, at a random moment within it, so that each recovery is
    // its own (a kill waits for the one before it to be restarted).
    let slot = window.div_f64(plan.len().max(1) as f64);
    let moments: Vec<Duration> = (0..plan.len()).map(|i| slot.mul_f64(i as f64 + rng.gen_range(0.1..0.7))).collect();
    let mut kills = Vec::new();
    for (c, at) in plan.into_iter().zip(moments) {
        let down_for = Duration::from_millis(rng.gen_range(200..3000));
        tokio::time::sleep_until(tokio::time::Instant::from_std(started + at)).await;
        if matches!(c, Component::Ep | Component::Scheduler | Component::Storage) {
            // Mid-job: while the EP runs one (if one comes within a few seconds).
            procs.wait_busy(Duration::from_secs(3)).await;
        }
        let t0 = Instant::now();
        let at_unix_ms = unix_ms();
        procs.kill(c).await?;
        tokio::time::sleep(down_for).await;
        procs.start_one(c).await.with_context(|| format!("restart {}", c.name()))?;
        let kill = Kill { component: c, at: t0 - started, at_unix_ms, down: t0.elapsed(), recovery: None };
        println!(
            "killed {} at {:.1} s, answering again after {} ms",
            c.name(),
            kill.at.as_secs_f64(),
            kill.down.as_millis()
        );
        kills.push(kill);
    }
    let published = publisher.await.context("the publisher")??;

    // Drain: every job completed.
    let expected = published * FUNCTIONS;
    let deadline = Instant::now() + opts.drain_timeout;
    let drained = loop {
        match procs.job_states().await {
            Ok(states) if states.get("completed").copied().unwrap_or(0) >= expected => break true,
            Ok(_) | Err(_) if Instant::now() > deadline => break false,
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    };
    let elapsed = started.elapsed();
    procs.stop_all().await;

    let mut report = check(&dir, opts.durability, published, &landed, &mut kills, &[]).await?;
    report.seed = Some(opts.seed);
    report.kills = kills;
    report.elapsed = elapsed;
    report.drained = drained;
    if !report.passed() {
        println!("state kept in {}", dir.display());
        if let Some(t) = temp {
            let _ = t.keep();
        }
    }
    Ok(report)
}

/// Publishes `events` transfer messages at `rate` per second, each retried until JetStream
/// acknowledges it, as the site's `operator`; records when each first tried (unix ms) in
/// `landed`. Returns the count.
pub(crate) async fn publish(
    nats_url: String,
    operator: htfaas_functions::nats::NatsCredential,
    run_id: String,
    events: u64,
    rate: u32,
    landed: Arc<Mutex<Vec<u64>>>,
) -> anyhow::Result<u64> {
    let nats = htfaas_functions::nats::connect_options("htfaas-crash-test", Some(&operator))
        .retry_on_initial_connect()
        .connect(htfaas_functions::nats::servers(&nats_url)?)
        .await
        .context("connect to NATS")?;
    let js = async_nats::jetstream::new(nats);
    let every = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let start = tokio::time::Instant::now();
    for n in 0..events {
        tokio::time::sleep_until(start + every.mul_f64(n as f64)).await;
        let path = format!("{INPUT_DIR}{}", input_name(&run_id, n));
        let payload = crate::traffic::transfer_write(&path, INPUT_BYTES, &run_id, n);
        if let Some(slot) = landed.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.get_mut(usize::try_from(n)?) {
            *slot = unix_ms();
        }
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, format!("{run_id}-{n}").as_str());
        let mut tries = 0u32;
        loop {
            let sent = js.publish_with_headers(path_subject(&path), headers.clone(), payload.clone().into()).await;
            let acked = match sent {
                Ok(ack) => ack.await.map(|_| ()).map_err(anyhow::Error::from),
                Err(e) => Err(e.into()),
            };
            match acked {
                Ok(()) => break,
                Err(e) => {
                    tries += 1;
                    if tries == 1 || tries.is_multiple_of(20) {
                        tracing::info!("publish of event {n} failed ({e:#}); trying again");
                    }
                    if tries > 600 {
                        bail!("event {n} not acknowledged after {tries} tries: {e:#}");
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
    Ok(events)
}

/// One job as the checks read it.
struct JobRow {
    function: String,
    input: String,
    state: String,
    finished_at_ms: Option<u64>,
    outputs: Vec<OutputFile>,
    completed_attempts: u64,
}

/// The checks on the stopped stack's files; fills in each kill's recovery. Jobs of the
/// functions named in `besides` are not the stream's and are left out.
pub(crate) async fn check(
    dir: &Path,
    durability: Durability,
    published: u64,
    landed: &Mutex<Vec<u64>>,
    kills: &mut [Kill],
    besides: &[&str],
) -> anyhow::Result<CrashReport> {
    let mut report = CrashReport { events: published, expected_jobs: published * FUNCTIONS, ..Default::default() };
    let db = dir.join("scheduler/jobs.sqlite");
    let mut jobs = read_jobs(&db)?;
    jobs.retain(|j| !besides.contains(&j.function.as_str()));
    report.attempts = read_attempts(&db)?;

    // Exactly one job per (event, function), each completed once.
    let mut per_pair: HashMap<(String, u64), u64> = HashMap::new();
    for j in &jobs {
        *report.jobs_by_state.entry(j.state.clone()).or_default() += 1;
        if j.completed_attempts != 1 {
            report.not_once_completed += 1;
        }
        if let Some(n) = event_index(&j.input) {
            *per_pair.entry((j.function.clone(), n)).or_default() += 1;
        }
    }
    // Nothing left silently: a pair without a job is in the gateway's dead-letter list.
    let dead = read_dead_letters(&dir.join("gateway/firings.sqlite"))?;
    for f in [SUM_FN, NOOP_FN] {
        for n in 0..published {
            match per_pair.get(&(f.to_owned(), n)).copied().unwrap_or(0) {
                0 => {
                    report.missing += 1;
                    if dead.contains(&(f.to_owned(), n)) {
                        report.dead_lettered += 1;
                    } else {
                        report.left_silently += 1;
                    }
                }
                1 => {}
                _ => report.duplicate_jobs += 1,
            }
        }
    }

    // Every checksum output once, right.
    let data = dir.join("storage/data");
    let mut reported = std::collections::HashSet::new();
    for j in jobs.iter().filter(|j| j.function == SUM_FN && j.state == "completed") {
        match check_output(&data, j) {
            Ok(path) => {
                report.outputs_ok += 1;
                reported.insert(path);
            }
            Err(e) => report.outputs_bad.push(format!("{}: {e:#}", j.input)),
        }
    }
    let out_dir = data.join(SUM_OUT.trim_start_matches('/'));
    if let Ok(entries) = std::fs::read_dir(&out_dir) {
        for e in entries.flatten() {
            let path = format!("{SUM_OUT}{}", e.file_name().to_string_lossy());
            if !reported.contains(&path) {
                report.outputs_extra += 1;
            }
        }
    }

    // Accounting equals the sum of the job records.
    let queue = htfaas_scheduler::queue::Queue::open_with(&db, durability)?;
    let accounts = queue.accounts().await?;
    let recomputed = queue.accounts_from_records().await?;
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1.0);
    for r in &recomputed {
        match accounts.iter().find(|a| a.owner == r.owner) {
            Some(a)
                if a.jobs_completed == r.jobs_completed
                    && a.jobs_failed == r.jobs_failed
                    && a.bytes_in == r.bytes_in
                    && a.bytes_out == r.bytes_out
                    && close(a.core_seconds, r.core_seconds)
                    && close(a.cpu_seconds, r.cpu_seconds)
                    && close(a.wall_seconds, r.wall_seconds) => {}
            other => report.accounting_mismatches.push(format!("{}: account {other:?}, records {r:?}", r.owner)),
        }
    }
    if accounts.len() != recomputed.len() {
        report.accounting_mismatches.push(format!(
            "{} accounts, {} owners in the records",
            accounts.len(),
            recomputed.len()
        ));
    }
    drop(queue);

    // Both audit trails.
    let trails = [
        ("scheduler", db.clone(), dir.join("scheduler/audit-key.pem"), htfaas_scheduler::config::AUDIT_KID),
        (
            "gateway",
            dir.join("gateway/firings.sqlite"),
            dir.join("gateway/gateway-audit-key.pem"),
            htfaas_gateway::audit::AUDIT_KID,
        ),
    ];
    for (name, db, key, kid) in trails {
        let pem = std::fs::read(&key).with_context(|| format!("read {}", key.display()))?;
        let keys = htfaas_functions::audit::AuditSigner::from_pem(kid, &pem)?.keys();
        match htfaas_functions::audit::verify(&db, &keys) {
            Ok(v) if v.first_problem.is_none() => report.audit.push((name.into(), v.records, v.checkpoints)),
            Ok(v) => report.audit_problems.push(format!("{name}: {:?}", v.first_problem)),
            Err(e) => report.audit_problems.push(format!("{name}: {e}")),
        }
    }

    // Each event's latency: landing to the end of its last job.
    let landed = landed.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone();
    let mut last_end: HashMap<u64, u64> = HashMap::new();
    for j in &jobs {
        if let (Some(n), Some(end)) = (event_index(&j.input), j.finished_at_ms) {
            let e = last_end.entry(n).or_default();
            *e = (*e).max(end);
        }
    }
    let mut latencies: Vec<f64> = last_end
        .iter()
        .filter_map(|(n, end)| Some(end.saturating_sub(*landed.get(usize::try_from(*n).ok()?)?) as f64))
        .collect();
    let p50 = crate::traffic::percentile(&mut latencies, 0.5);
    let p99 = crate::traffic::percentile(&mut latencies, 0.99);
    let max = crate::traffic::percentile(&mut latencies, 1.0);
    report.event_latency_ms = (p50 as u64, p99 as u64, max as u64);

    // Recovery per kill: the first job of an event that landed after the kill to end.
    for k in kills.iter_mut() {
        let first_end = jobs
            .iter()
            .filter(|j| {
                event_index(&j.input)
                    .and_then(|n| landed.get(usize::try_from(n).ok()?))
                    .is_some_and(|&t| t >= k.at_unix_ms)
            })
            .filter_map(|j| j.finished_at_ms)
            .min();
        k.recovery = first_end.map(|end| Duration::from_millis(end.saturating_sub(k.at_unix_ms)));
    }
    Ok(report)
}

/// Reads the output a checksum job reported and checks it: it exists, its sha256 is the
/// reported one, and the sha256 it holds is the input's. Returns its storage path.
fn check_output(data: &Path, j: &JobRow) -> anyhow::Result<String> {
    let [out] = j.outputs.as_slice() else { bail!("{} outputs reported", j.outputs.len()) };
    let bytes =
        std::fs::read(data.join(out.path.trim_start_matches('/'))).with_context(|| format!("read {}", out.path))?;
    let sha = hex::encode(Sha256::digest(&bytes));
    anyhow::ensure!(sha == out.sha256, "{} holds sha256 {sha}, the EP reported {}", out.path, out.sha256);
    let held: serde_json::Value = serde_json::from_slice(&bytes).with_context(|| format!("parse {}", out.path))?;
    let input = std::fs::read(data.join(INPUT_DIR.trim_start_matches('/')).join(&j.input))?;
    let want = hex::encode(Sha256::digest(&input));
    anyhow::ensure!(
        held["sha256"] == want.as_str(),
        "{} says sha256 {}, the input's is {want}",
        out.path,
        held["sha256"]
    );
    Ok(out.path.clone())
}

fn read_jobs(db: &Path) -> anyhow::Result<Vec<JobRow>> {
    let conn = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let mut stmt = conn.prepare(
        "SELECT json_extract(request, '$.function.name'), json_extract(request, '$.input.name'), state, \
         finished_at_ms, outputs, (SELECT COUNT(*) FROM attempts a WHERE a.job_id = jobs.id AND a.outcome = 'completed') \
         FROM jobs JOIN job_requests USING (seq)",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, Option<String>>(0)?,
            r.get::<_, Option<String>>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, Option<i64>>(3)?,
            r.get::<_, Option<String>>(4)?,
            r.get::<_, i64>(5)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (function, input, state, finished, outputs, completed) = row?;
        let outputs = match outputs.as_deref() {
            Some(text) => serde_json::from_str(text).context("a job's outputs")?,
            None => Vec::new(),
        };
        out.push(JobRow {
            function: function.unwrap_or_default(),
            input: input.unwrap_or_default(),
            state,
            finished_at_ms: finished.and_then(|v| u64::try_from(v).ok()),
            outputs,
            completed_attempts: u64::try_from(completed).unwrap_or(0),
        });
    }
    Ok(out)
}

/// The (function, event index) pairs of the gateway's dead-letter list (none in a store made
/// before it had one).
fn read_dead_letters(db: &Path) -> anyhow::Result<std::collections::HashSet<(String, u64)>> {
    let conn = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let exists: i64 =
        conn.query_row("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'dead_letters'", [], |r| {
            r.get(0)
        })?;
    let mut out = std::collections::HashSet::new();
    if exists == 0 {
        return Ok(out);
    }
    let mut stmt = conn.prepare(
        "SELECT function, CASE WHEN json_valid(event_ref) THEN json_extract(event_ref, '$.path') END FROM dead_letters",
    )?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?)))?;
    for row in rows {
        let (function, path) = row?;
        let name = path.as_deref().and_then(|p| p.rsplit('/').next()).unwrap_or_default();
        if let Some(n) = event_index(name) {
            out.insert((function, n));
        }
    }
    Ok(out)
}

fn read_attempts(db: &Path) -> anyhow::Result<u64> {
    let conn = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let n: i64 = conn.query_row("SELECT COUNT(*) FROM attempts", [], |r| r.get(0))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_names_give_back_their_event() {
        assert_eq!(event_index(&input_name("abcd0123", 42)), Some(42));
        assert_eq!(event_index("x0001-abc.dat"), None);
        assert_eq!(event_index("e-abc.dat"), None);
    }

    #[test]
    fn a_report_passes_only_when_every_check_holds() {
        let good = CrashReport {
            events: 2,
            expected_jobs: 4,
            jobs_by_state: BTreeMap::from([("completed".into(), 4)]),
            outputs_ok: 2,
            audit: vec![("scheduler".into(), 1, 1), ("gateway".into(), 1, 1)],
            drained: true,
            ..Default::default()
        };
        assert!(good.passed());
        let held = CrashReport {
            jobs_by_state: BTreeMap::from([("completed".into(), 3), ("held".into(), 1)]),
            ..good.clone()
        };
        assert!(!held.passed());
        assert!(!CrashReport { duplicate_jobs: 1, ..good.clone() }.passed());
        assert!(!CrashReport { left_silently: 1, ..good.clone() }.passed());
        assert!(!CrashReport { outputs_extra: 1, ..good.clone() }.passed());
        assert!(!CrashReport { audit: vec![("scheduler".into(), 1, 1)], ..good.clone() }.passed());
        assert!(!CrashReport { accounting_mismatches: vec!["alice".into()], ..good.clone() }.passed());
        assert!(!CrashReport { drained: false, ..good }.passed());
    }
}
