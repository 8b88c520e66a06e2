//! Dispatch cost against queue size: does matching and sending jobs slow down when the queue
//! holds a million idle jobs instead of a thousand? And how much does a queued job cost in
//! the store and in the scheduler's memory?
//!
//! For each queue size N (1,000 and 1,000,000; `--quick` or `HTFAAS_BENCH_QUICK=1`: 1,000 and
//! 100,000) the bench seeds a fresh store directly with SQLite (one transaction, rows exactly
//! as `Queue::submit` writes them, spread over 4 owners). Then, in [`ROUNDS`] rounds that
//! alternate between the sizes (so that a burst of load on a shared machine hits both), it
//! starts the real scheduler in-process on 127.0.0.1:0 on that store, attaches 4 fake EPs of 8
//! cpus that answer every Assign at once with a successful report, lets 500 jobs complete
//! (warm-up), times the next M completions (5,000; quick: 2,000), and stops it. Each size gets
//! N + rounds × (warm-up + M) jobs, so at least N stay idle throughout. Seeding and each round
//! run in a child process (this same binary, with a `--child-*` argument), so that one's memory
//! does not blur the other's RSS.
//!
//! The scheduler runs with the durability `HTFAAS_BENCH_DURABILITY` names (`fsync`, the
//! default: an fsync behind every acknowledgement, writes group-committed; or `log`), and every
//! line says which (`"durability"`).
//!
//! `cargo bench -p htfaas-scheduler --bench dispatch [-- --quick]` prints one JSON line per
//! figure, `{"bench":"dispatch","durability":D,"queued":N,"metric":..,"value":..,"n":..}`:
//! - `jobs_per_s`: completions per second over the `n` timed ones (each completion is one
//!   dispatch), the median of the rounds (`rounds`);
//! - `redispatch_p50_ms`, `redispatch_p99_ms`: on one EP, from sending a report (freeing a
//!   slot) to the Assign that fills that slot again, over all rounds (`n`: samples);
//! - `store_bytes_per_job`: the store's size on disk (db + WAL) after seeding, per seeded job
//!   (`n`);
//! - `rss_bytes_per_job`: growth of the resident memory (`VmRSS`) of the process running the
//!   scheduler, from before the scheduler opens the seeded store to the end of the timed window,
//!   per seeded job (median of the rounds); `rss_growth_bytes` is that growth itself;
//! - `seed_s`: seconds to seed the store (`n`: rows);
//!
//! then, over the sizes, `{"bench":"dispatch","metric":"rate_ratio_large_vs_small","value":..}`
//! (jobs_per_s at the largest N over jobs_per_s at 1,000) and `rss_bytes_per_job_marginal`
//! (the difference in RSS growth over the difference in seeded jobs: what one more queued job
//! costs, without the scheduler's fixed memory). Narration goes to stderr. A size of a million
//! or more is skipped, with a message, when the temporary directory has less than 5 GB free.
//! Without `--bench` (as `cargo test --benches` runs it) one smoke round with N = 200 and a few
//! jobs checks the whole path, timing nothing. No criterion on purpose (build time).

use anyhow::{Context as _, bail, ensure};
use futures_util::{SinkExt as _, StreamExt as _};
use htfaas_functions::macaroon::{RootKey, mint};
use htfaas_functions::proto::{
    EpMsg, EventRef, FunctionRef, Hello, InputSpec, JobReport, Outcome, OutputFile, OutputSpec, SchedulerMsg,
    SubmitRequest, Usage,
};
use htfaas_functions::store::Durability;
use htfaas_functions::token::{SigningKey, new_jti, write_jwks};
use htfaas_functions::{Digest, Resources};
use htfaas_scheduler::queue::{Queue, now_ms};
use htfaas_scheduler::{Config, mint_attach_token};
use rusqlite::params;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_util::sync::CancellationToken;

const GW: &str = "bench-gateway";
const NAME: &str = "bench-scheduler";
const ADMIN: &str = "bench-admin-token-0123456789";
const STORAGE_SECRET: &[u8] = b"bench-storage-root";
/// Owners the seeded jobs are spread over, round-robin.
const OWNERS: u64 = 4;
/// Fake EPs attached.
const EPS: usize = 4;
/// Cores each fake EP offers; every job takes one, so each EP runs this many at once.
const EP_CPUS: u32 = 8;
/// Timed rounds per size, alternating between the sizes.
const ROUNDS: usize = 3;
/// Longest wait for any one message from the scheduler.
const MESSAGE_WAIT: Duration = Duration::from_secs(60);
/// Longest a round's warm-up plus measurement may take.
const RUN_DEADLINE: Duration = Duration::from_secs(600);
/// Longest wait for the EPs, then the scheduler, to stop.
const STOP_WAIT: Duration = Duration::from_secs(30);
/// Longest a child process may take to seed a store.
const SEED_DEADLINE: Duration = Duration::from_secs(1800);
/// Free space needed in the temporary directory to seed a million jobs or more.
const LARGE_FREE_BYTES: u64 = 5_000_000_000;
const LARGE: u64 = 1_000_000;
/// First argument of a child that seeds: `--child-seed <db> <rows>`.
const CHILD_SEED: &str = "--child-seed";
/// First argument of a child that runs one round: `--child-round <dir> <warmup> <measured>`;
/// it writes [`Round`] to `<dir>/round.json`.
const CHILD_ROUND: &str = "--child-round";

/// Names the durability the scheduler runs with: `fsync` (default) or `log`.
const DURABILITY_VAR: &str = "HTFAAS_BENCH_DURABILITY";

/// The durability [`DURABILITY_VAR`] names.
fn durability() -> anyhow::Result<Durability> {
    match std::env::var(DURABILITY_VAR) {
        Ok(v) => v.parse::<Durability>().map_err(|e| anyhow::anyhow!("{DURABILITY_VAR}: {e}")),
        Err(std::env::VarError::NotPresent) => Ok(Durability::default()),
        Err(e) => bail!("{DURABILITY_VAR}: {e}"),
    }
}

/// What to run: sizes, rounds and job counts, and whether to time at all.
struct Plan {
    timed: bool,
    sizes: Vec<u64>,
    rounds: usize,
    warmup: u64,
    measured: u64,
}

impl Plan {
    fn from_args(args: &[String]) -> Plan {
        let timed = args.iter().any(|a| a == "--bench");
        let quick = args.iter().any(|a| a == "--quick") || std::env::var("HTFAAS_BENCH_QUICK").is_ok_and(|v| v == "1");
        match (timed, quick) {
            (false, _) => Plan { timed, sizes: vec![200], rounds: 1, warmup: 20, measured: 50 },
            (true, true) => Plan { timed, sizes: vec![1_000, 100_000], rounds: ROUNDS, warmup: 500, measured: 2_000 },
            (true, false) => Plan { timed, sizes: vec![1_000, LARGE], rounds: ROUNDS, warmup: 500, measured: 5_000 },
        }
    }
}

/// One seeded store and what its rounds measured.
struct Size {
    queued: u64,
    dir: tempfile::TempDir,
    seeded: u64,
    seed_s: f64,
    store_bytes: u64,
    rounds: Vec<Round>,
}

/// What one round measured (written by the child that ran it).
#[derive(Debug, Serialize, Deserialize)]
struct Round {
    /// RSS before the scheduler opened the store, bytes.
    rss_before: u64,
    /// RSS at the end of the timed window, bytes.
    rss_after: u64,
    jobs_per_s: f64,
    redispatch_ms: Vec<f64>,
}

impl Round {
    fn rss_growth(&self) -> f64 {
        self.rss_after as f64 - self.rss_before as f64
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some(CHILD_SEED) => {
            let [db, rows] = &args[1..] else { bail!("usage: {CHILD_SEED} <db> <rows>") };
            let db = PathBuf::from(db);
            drop(Queue::open(&db).context("create the store")?);
            seed(&db, rows.parse()?).context("seed the store")
        }
        Some(CHILD_ROUND) => {
            let [dir, warmup, measured] = &args[1..] else { bail!("usage: {CHILD_ROUND} <dir> <warmup> <measured>") };
            let dir = PathBuf::from(dir);
            let runtime = tokio::runtime::Runtime::new().context("start tokio")?;
            let round = runtime.block_on(round(&dir, warmup.parse()?, measured.parse()?))?;
            std::fs::write(dir.join("round.json"), serde_json::to_vec(&round)?).context("write round.json")
        }
        _ => bench(Plan::from_args(&args)),
    }
}

/// Seeds each size, runs the rounds and prints the figures.
fn bench(plan: Plan) -> anyhow::Result<()> {
    let durability = durability()?.as_str();
    eprintln!("dispatch: durability {durability}");
    let mut sizes = Vec::new();
    for &queued in &plan.sizes {
        if queued >= LARGE {
            let tmp = std::env::temp_dir();
            match free_bytes(&tmp) {
                Ok(free) if free < LARGE_FREE_BYTES => {
                    eprintln!(
                        "dispatch: SKIPPING queued={queued}: only {:.1} GB free in {} (need 5 GB)",
                        free as f64 / 1e9,
                        tmp.display()
                    );
                    continue;
                }
                Ok(_) => {}
                Err(e) => eprintln!("dispatch: could not read free space ({e:#}); trying queued={queued} anyway"),
            }
        }
        sizes.push(prepare(queued, &plan).with_context(|| format!("seed queue size {queued}"))?);
    }
    for r in 0..plan.rounds {
        for size in &mut sizes {
            let dir = size.dir.path();
            let args =
                [CHILD_ROUND.into(), dir.display().to_string(), plan.warmup.to_string(), plan.measured.to_string()];
            child(&args, RUN_DEADLINE + 3 * STOP_WAIT + MESSAGE_WAIT)
                .with_context(|| format!("round {} of queue size {}", r + 1, size.queued))?;
            let path = dir.join("round.json");
            let round: Round = serde_json::from_slice(&std::fs::read(&path).context("read round.json")?)?;
            std::fs::remove_file(&path).context("remove round.json")?;
            eprintln!(
                "dispatch: round {}/{} queued={}: {:.1} jobs/s, RSS {} -> {} MB",
                r + 1,
                plan.rounds,
                size.queued,
                round.jobs_per_s,
                round.rss_before >> 20,
                round.rss_after >> 20
            );
            size.rounds.push(round);
        }
    }
    if !plan.timed {
        println!("dispatch: ok (smoke; run `cargo bench` to time)");
        return Ok(());
    }

    // The members every line starts with.
    let tag = format!(r#""bench":"dispatch","durability":"{durability}""#);
    let mut summary = Vec::new();
    for s in &sizes {
        let queued = s.queued;
        let line = |metric: &str, value: String, n: u64| {
            println!(r#"{{{tag},"queued":{queued},"metric":"{metric}","value":{value},"n":{n}}}"#);
        };
        let rate = median(s.rounds.iter().map(|r| r.jobs_per_s).collect());
        let growth = median(s.rounds.iter().map(Round::rss_growth).collect());
        let mut lat: Vec<f64> = s.rounds.iter().flat_map(|r| r.redispatch_ms.iter().copied()).collect();
        lat.sort_by(f64::total_cmp);
        let (samples, rounds) = (lat.len() as u64, s.rounds.len());
        println!(
            r#"{{{tag},"queued":{queued},"metric":"jobs_per_s","value":{rate:.1},"n":{},"rounds":{rounds}}}"#,
            plan.measured
        );
        line("redispatch_p50_ms", format!("{:.3}", percentile(&lat, 50.0)), samples);
        line("redispatch_p99_ms", format!("{:.3}", percentile(&lat, 99.0)), samples);
        line("store_bytes_per_job", format!("{:.1}", s.store_bytes as f64 / s.seeded as f64), s.seeded);
        line("rss_bytes_per_job", format!("{:.1}", growth / s.seeded as f64), s.seeded);
        line("rss_growth_bytes", format!("{growth:.0}"), s.seeded);
        line("seed_s", format!("{:.3}", s.seed_s), s.seeded);
        summary.push((queued, s.seeded, rate, growth));
    }
    if let (Some(&(1_000, small_n, small_rate, small_growth)), Some(&(large, large_n, large_rate, large_growth))) =
        (summary.first(), summary.last())
        && large > 1_000
    {
        println!(r#"{{{tag},"metric":"rate_ratio_large_vs_small","value":{:.3}}}"#, large_rate / small_rate);
        let marginal = (large_growth - small_growth) / (large_n - small_n) as f64;
        println!(r#"{{{tag},"metric":"rss_bytes_per_job_marginal","value":{marginal:.2}}}"#);
    }
    for s in sizes {
        s.dir.close().context("remove a temporary store")?;
    }
    Ok(())
}

/// A temporary directory with the gateway's JWKS and a store seeded (by a child process) with
/// `queued` + rounds × (warm-up + measured) idle jobs.
fn prepare(queued: u64, plan: &Plan) -> anyhow::Result<Size> {
    let dir = tempfile::tempdir().context("tempdir")?;
    let (gw, _) = SigningKey::generate("gw-1").context("gateway key")?;
    write_jwks(&dir.path().join("gw.jwks"), &gw.jwks()).context("write the gateway's JWKS")?;
    let db = dir.path().join("queue.sqlite");
    let seeded = queued + plan.rounds as u64 * (plan.warmup + plan.measured);
    eprintln!("dispatch: seeding {seeded} idle jobs (queued={queued}) in {}", dir.path().display());
    let start = Instant::now();
    child(&[CHILD_SEED.into(), db.display().to_string(), seeded.to_string()], SEED_DEADLINE)?;
    let seed_s = start.elapsed().as_secs_f64();
    let store_bytes = file_size(&db)? + file_size(&db.with_extension("sqlite-wal"))?;
    eprintln!("dispatch: seeded in {seed_s:.1} s; store {:.1} MB", store_bytes as f64 / 1e6);
    Ok(Size { queued, dir, seeded, seed_s, store_bytes, rounds: Vec::new() })
}

/// Runs this binary with `args` and waits for it to succeed, at most `deadline` (then kills it).
fn child(args: &[String], deadline: Duration) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("find this binary")?;
    let mut child = std::process::Command::new(exe)
        .args(args)
        .stdin(std::process::Stdio::null())
        .spawn()
        .context("start a child process")?;
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().context("wait for the child")? {
            ensure!(status.success(), "child {} failed: {status}", args[0]);
            return Ok(());
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("child {} still running after {deadline:?}; killed", args[0]);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One realistic request, as the gateway builds it for a dCache upload event, with real
/// storage macaroons so that dispatch can attenuate them.
fn request(dedupe_key: String) -> SubmitRequest {
    let root = RootKey::derive(STORAGE_SECRET);
    let macaroon = |caveats: &[&str]| {
        let caveats: Vec<String> = caveats.iter().map(|c| (*c).to_owned()).collect();
        mint(&root, "https://dcache.example.org:2880", "a1b2c3d4e5f6", &caveats).expect("minting a macaroon")
    };
    let input = "/data/experiment/raw/2025/06/run-004211/detector-b/frame-000123.dat";
    SubmitRequest {
        retry: None,
        function: FunctionRef {
            name: "checksum".into(),
            version: 3,
            digest: Digest::of(b"checksum.wasm"),
            module_url: format!("https://registry.example.org/v1/modules/{}", Digest::of(b"checksum.wasm")),
            native: None,
        },
        resources: Resources::new(1, 256, 60),
        input: Some(InputSpec::new(
            format!("https://dcache.example.org:2880{input}"),
            "frame-000123.dat",
            macaroon(&["activity:DOWNLOAD", &format!("path:{input}"), "before:2030-01-01T00:00:00Z"]),
        )),
        output: OutputSpec {
            url: "https://dcache.example.org:2880/data/experiment/derived/2025/06/run-004211/".into(),
            macaroon: macaroon(&[
                "activity:UPLOAD,DELETE",
                "path:/data/experiment/derived/2025/06/run-004211",
                "before:2030-01-01T00:00:00Z",
            ]),
            on_failure: Default::default(),
        },
        args: vec!["--algorithm".into(), "sha256".into()],
        env: vec![("MODE".into(), "strict".into())],
        event: EventRef::new("dcache", "0000A1B2C3D4E5F6A7B8C9D0E1F2A3B4C5D6/s1", input),
        dedupe_key,
        annex: None,
        bind_ep_address: false,
        class: None,
        limits: Default::default(),
        secrets: Default::default(),
        renewal: None,
        max_concurrent: None,
        refs: Vec::new(),
        checkpoint: None,
    }
}

/// Inserts `rows` idle jobs as `Queue::submit` would, in one transaction (rollback journal
/// and no fsync while loading; the file is left in WAL mode, as `Queue::open` made it).
fn seed(db: &Path, rows: u64) -> anyhow::Result<()> {
    let mut conn = rusqlite::Connection::open(db)?;
    conn.pragma_update(None, "journal_mode", "DELETE")?;
    conn.pragma_update(None, "synchronous", "OFF")?;
    conn.pragma_update(None, "cache_size", -256 * 1024)?; // KiB: 256 MiB
    let mut template = request(String::new());
    let r = template.resources;
    let submitted_at = i64::try_from(now_ms())?;
    let tx = conn.transaction()?;
    {
        let mut insert = tx.prepare(
            "INSERT INTO jobs (id, owner, dedupe_key, state, token_jti, cpus, memory_mb, runtime_s, \
             submitted_at_ms, token_issuer, grp, annex, function_name, function_digest, event_id, input_path, \
             trace_id) VALUES (?1, ?2, ?3, 'idle', ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
        )?;
        let mut insert_request = tx.prepare("INSERT INTO job_requests (seq, request) VALUES (?1, ?2)")?;
        for i in 0..rows {
            template.dedupe_key = format!("0000{i:032X}/s1#checksum@{}", template.function.digest);
            insert.execute(params![
                uuid::Uuid::new_v4().to_string(),
                format!("owner-{}", i % OWNERS),
                template.dedupe_key,
                new_jti(),
                r.cpus,
                i64::try_from(r.memory_mb)?,
                i64::try_from(r.runtime_s)?,
                submitted_at,
                GW,
                None::<String>,
                template.annex,
                template.function.name,
                template.function.digest.as_str(),
                template.event.id,
                template.event.path,
                template.event.trace.as_deref().map(|t| t.chars().skip(3).take(32).collect::<String>()),
            ])?;
            insert_request.execute(params![tx.last_insert_rowid(), serde_json::to_string(&template)?])?;
        }
    }
    tx.commit()?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.close().map_err(|(_, e)| e)?;
    Ok(())
}

/// Completions counted across the fake EPs, and when the window opened and closed.
struct Progress {
    done: AtomicU64,
    warmup: u64,
    end: u64,
    opened: OnceLock<Instant>,
    closed: OnceLock<Instant>,
    changed: Notify,
}

impl Progress {
    fn completed(&self) {
        let n = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        let mark = if n == self.warmup {
            &self.opened
        } else if n == self.end {
            &self.closed
        } else {
            return;
        };
        let _ = mark.set(Instant::now());
        self.changed.notify_one();
    }
}

/// Starts the scheduler on the seeded store in `dir`, attaches the fake EPs, lets `warmup` jobs
/// complete, times the next `measured`, and stops everything.
async fn round(dir: &Path, warmup: u64, measured: u64) -> anyhow::Result<Round> {
    let rss_before = rss_bytes()?;
    // From the documented file format rather than a struct literal: fields added later with
    // defaults do not break the bench.
    let config: Config = serde_json::from_value(serde_json::json!({
        "listen": "127.0.0.1:0",
        "db_path": dir.join("queue.sqlite"),
        "name": NAME,
        "attach_key_file": dir.join("attach.pem"),
        "submit_issuers": [{ "issuer": GW, "jwks_file": dir.join("gw.jwks") }],
        "admin_token": ADMIN,
        "durability": durability()?.as_str(),
        "storage_origins": ["https://dcache.example.org:2880"],
        "module_stores": ["https://registry.example.org"],
    }))
    .context("scheduler config")?;
    let settings = config.resolve().await.context("resolve the scheduler's settings")?;
    let url = format!("ws://{}/v1/ep/attach", settings.local_addr());
    let token = mint_attach_token(settings.attach_key(), settings.name(), "bench-site", None, None, 3600)
        .context("mint an attach token")?;
    let shutdown = CancellationToken::new();
    let scheduler = tokio::spawn(htfaas_scheduler::run(settings, shutdown.clone()));

    let progress = Arc::new(Progress {
        done: AtomicU64::new(0),
        warmup,
        end: warmup + measured,
        opened: OnceLock::new(),
        closed: OnceLock::new(),
        changed: Notify::new(),
    });
    let stop = CancellationToken::new();
    let mut eps = JoinSet::new();
    for i in 0..EPS {
        eps.spawn(fake_ep(url.clone(), token.clone(), format!("bench-ep-{i}"), progress.clone(), stop.clone()));
    }
    let outcome = watch(&progress, &mut eps).await;
    let rss_after = rss_bytes();

    // Stop the EPs, then the scheduler, whatever happened; report the first failure after.
    stop.cancel();
    let mut samples = Vec::new();
    let mut ep_failure = None;
    loop {
        match tokio::time::timeout(STOP_WAIT, eps.join_next()).await {
            Ok(None) => break,
            Ok(Some(Ok(Ok(s)))) => samples.extend(s),
            Ok(Some(Ok(Err(e)))) => ep_failure = ep_failure.or(Some(e.context("a fake EP failed"))),
            Ok(Some(Err(e))) => ep_failure = ep_failure.or(Some(anyhow::anyhow!("a fake EP panicked: {e}"))),
            Err(_) => {
                eps.abort_all();
                ep_failure = ep_failure.or(Some(anyhow::anyhow!("fake EPs still running after {STOP_WAIT:?}")));
                break;
            }
        }
    }
    shutdown.cancel();
    let stopped = tokio::time::timeout(STOP_WAIT, scheduler).await;
    outcome?;
    if let Some(e) = ep_failure {
        return Err(e);
    }
    stopped.context("scheduler stops in time")?.context("scheduler task")?.context("scheduler run")?;
    let rss_after = rss_after?;

    let (opened, closed) = (progress.opened.get().copied(), progress.closed.get().copied());
    let (Some(opened), Some(closed)) = (opened, closed) else { bail!("the measurement window never closed") };
    let redispatch_ms = samples
        .into_iter()
        .filter(|(at, _)| *at >= opened && *at <= closed)
        .map(|(_, d)| d.as_secs_f64() * 1000.0)
        .collect();
    let jobs_per_s = measured as f64 / (closed - opened).as_secs_f64();
    Ok(Round { rss_before, rss_after, jobs_per_s, redispatch_ms })
}

/// Waits until the window closes, an EP fails, or [`RUN_DEADLINE`] passes.
async fn watch(progress: &Progress, eps: &mut JoinSet<anyhow::Result<Vec<(Instant, Duration)>>>) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + RUN_DEADLINE;
    let mut announced = false;
    while progress.closed.get().is_none() {
        tokio::select! {
            _ = progress.changed.notified() => {}
            ended = eps.join_next() => match ended {
                Some(Ok(Err(e))) => return Err(e.context("a fake EP failed")),
                Some(Err(e)) => bail!("a fake EP panicked: {e}"),
                _ => bail!("a fake EP left before the measurement ended"),
            },
            _ = tokio::time::sleep_until(deadline) => {
                bail!("only {} of {} completions after {RUN_DEADLINE:?}", progress.done.load(Ordering::Relaxed), progress.end)
            }
        }
        if !announced && progress.opened.get().is_some() {
            announced = true;
            eprintln!("dispatch: warm-up done; timing {} completions", progress.end - progress.warmup);
        }
    }
    Ok(())
}

/// One EP: attaches, says Hello, and answers each Assign at once with a successful report.
/// Returns, for each Assign that refilled a slot, when it arrived and how long after the
/// report that freed the slot.
async fn fake_ep(
    url: String,
    token: String,
    name: String,
    progress: Arc<Progress>,
    stop: CancellationToken,
) -> anyhow::Result<Vec<(Instant, Duration)>> {
    let mut req = url.into_client_request()?;
    req.headers_mut().insert("authorization", format!("Bearer {token}").parse()?);
    let (mut ws, _) =
        tokio::time::timeout(MESSAGE_WAIT, tokio_tungstenite::connect_async(req)).await.context("attach in time")??;
    let hello = EpMsg::Hello(Hello {
        name,
        slots: Resources::new(EP_CPUS, 8192, 3600),
        protocol: 1,
        annex: None,
        labels: Default::default(),
        prefetch: None,
        runtimes: vec![htfaas_functions::manifest::RuntimeKind::Wasm],
        images: Vec::new(),
        renews_attach: false,
    });
    ws.send(Message::text(serde_json::to_string(&hello)?)).await?;

    // Reports sent whose slot has not been refilled yet, oldest first. The first EP_CPUS
    // Assigns fill empty slots; each later one fills the slot of the oldest such report.
    let mut freed: VecDeque<Instant> = VecDeque::new();
    let mut assigns = 0u64;
    let mut samples = Vec::new();
    let mut welcomed = false;
    loop {
        let frame = tokio::select! {
            _ = stop.cancelled() => break,
            f = tokio::time::timeout(MESSAGE_WAIT, ws.next()) => f.context("a message from the scheduler in time")?,
        };
        let text = match frame.context("connection open")?.context("frame")? {
            Message::Text(t) => t,
            Message::Ping(_) | Message::Pong(_) => continue,
            other => bail!("unexpected frame {other:?}"),
        };
        let arrived = Instant::now();
        match serde_json::from_str::<SchedulerMsg>(text.as_str())? {
            SchedulerMsg::Welcome { .. } => welcomed = true,
            SchedulerMsg::Assign(a) => {
                ensure!(welcomed, "assign before welcome");
                assigns += 1;
                if assigns > u64::from(EP_CPUS)
                    && let Some(sent) = freed.pop_front()
                {
                    samples.push((arrived, arrived - sent));
                }
                ws.send(Message::text(serde_json::to_string(&report(a.job_id))?)).await?;
                freed.push_back(Instant::now());
                progress.completed();
            }
            other => bail!("unexpected message {other:?}"),
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), ws.close(None)).await;
    Ok(samples)
}

/// A small successful report, as an EP sends after a short checksum run.
fn report(job_id: String) -> EpMsg {
    EpMsg::Finished(JobReport {
        input_sha256: None,
        job_id,
        outcome: Outcome::Exited { exit_code: 0 },
        usage: Usage {
            wall_ms: 12,
            cpu_ms: 9,
            peak_memory_bytes: 1 << 20,
            bytes_in: 4096,
            bytes_out: 64,
            instructions: None,
            phases: Default::default(),
        },
        outputs: vec![OutputFile {
            path: "/data/experiment/derived/2025/06/run-004211/frame-000123.sha256".into(),
            size: 64,
            sha256: "ab".repeat(32),
        }],
        log: "ok\n".into(),
        refs: Vec::new(),
        checkpoint: None,
    })
}

/// The median of `values` (the lower middle one of an even count); NaN when there are none.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    percentile(&values, 50.0)
}

/// Nearest-rank percentile of sorted values; NaN when there are none.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Size of a file, 0 when it does not exist.
fn file_size(path: &Path) -> anyhow::Result<u64> {
    match std::fs::metadata(path) {
        Ok(m) => Ok(m.len()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e).with_context(|| format!("stat {}", path.display())),
    }
}

/// This process's resident memory (`VmRSS` in /proc/self/status), bytes.
fn rss_bytes() -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status").context("read /proc/self/status")?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .context("no VmRSS line")?;
    Ok(kb.trim().parse::<u64>().context("VmRSS value")? * 1024)
}

/// Bytes available to us in the file system holding `dir`, from `df -Pk`.
fn free_bytes(dir: &Path) -> anyhow::Result<u64> {
    let out = std::process::Command::new("df").arg("-Pk").arg(dir).output().context("run df")?;
    ensure!(out.status.success(), "df failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let kb = text.lines().nth(1).and_then(|l| l.split_whitespace().nth(3)).context("df output")?;
    Ok(kb.parse::<u64>().context("df's available column")? * 1024)
}
