//! `htfaas crash-test --long`: one job of minutes on the stack as processes
//! ([`crate::procs::ProcStack`]) through every interruption a long job meets, in one run, and
//! then the checks that it was never run again from scratch and that its output is the one an
//! uninterrupted run of the same job writes.
//!
//! The job is the `hostile` guest's `count N` (one step a second, its count kept atomically in
//! `/checkpoint/n`), with a checkpoint policy, on an EP of one core whose attach token lives
//! [`LongOptions::attach_ttl_s`] (shorter than the job) and whose link to the scheduler runs
//! through a [`crate::relay::Relay`]. In order, each once the one before has settled:
//!
//! 1. the scheduler is killed (SIGKILL) and started again: the new process requeues the job
//!    (its attempt `interrupted`) and gives it back to the same EP, which is still running it
//!    and goes on (an assignment of a job it holds is ignored);
//! 2. a second EP (two cores) attaches directly, and the *reference* starts on it: a function
//!    with the same module, arguments and resources, on its own input and output directory,
//!    which nothing interrupts;
//! 3. right after an attach-token renewal, the first EP's link is cut for
//!    [`LongOptions::cut`] (a partition: the connection stays open, nothing crosses), well
//!    inside the scheduler's lease ([`LEASE_S`]: how long a silent EP keeps its session and
//!    its running jobs) and the token's last third; then the harness waits for one more
//!    renewal over the same session;
//! 4. the first EP is stopped as its host would be (SIGTERM: it drains for 5 s, then stops the
//!    job, which stores its checkpoint, reports it and leaves): the scheduler resumes the job
//!    at once (its attempt `vacated`, no retry used) on the second EP from the count it
//!    stored.
//!
//! Then: both jobs completed, their outputs are the same bytes (`N\n`); the job resumed (its
//! log's `starting at K`) from at least the last count the first EP reached and never ran on
//! both EPs at once; the cut cost no attempt nor the EP's session; exactly one attempt was
//! ended by the scheduler's restart, and only the last ran on the second EP; the attach token
//! was renewed during the run (the first EP's log says so: no metric or audit record counts
//! renewals). The guest's count is read from its `/checkpoint/n` in each EP's job directory
//! every [`POLL`] (the harness owns the stack's directories, as the crash harness reads the
//! scheduler's database): the last count on the first EP and whether the second had one early
//! come from it, and so does what each interruption cost: the time from the job's last step
//! before it to its first after it, less the steps made in between (one a second).
//!
//! Must not know: the CLI (`clap`), how the report is printed beyond its `Display`.

use crate::procs::{Component, EP_NAME, ProcOptions, ProcStack};
use anyhow::{Context as _, bail};
use htfaas_functions::checkpoint::CheckpointPolicy;
use htfaas_functions::manifest::Trigger;
use htfaas_functions::proto::{Attempt, JobRecord, JobState};
use htfaas_functions::store::Durability;
use htfaas_functions::{FunctionManifest, Resources};
use sha2::{Digest as _, Sha256};
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The scheduler's lease in this run, seconds: an EP silent this long loses its session and
/// its running jobs (its default, set here so the cut is checked against it).
pub const LEASE_S: u64 = 60;
/// How often the guest's count and the EP's log are read.
pub const POLL: Duration = Duration::from_millis(50);
/// The longest wait for one step of the scenario (an EP attaching, a job starting).
const LIMIT: Duration = Duration::from_secs(120);
/// How long the job runs undisturbed before the first interruption.
const STEADY: Duration = Duration::from_secs(5);
const LONG_FN: &str = "long-count";
const REF_FN: &str = "long-count-ref";
const LONG_INPUT: &str = "/data/long/in.dat";
const REF_INPUT: &str = "/data/long-ref/in.dat";
const LONG_OUT: &str = "/data/long-out/";
const REF_OUT: &str = "/data/long-ref-out/";
/// What the first EP logs when its attach token was renewed.
const RENEWED: &str = "attach token renewed";

/// What to run.
#[derive(Debug, Clone)]
pub struct LongOptions {
    /// The `htfaas` binary whose subcommands run the components.
    pub htfaas: PathBuf,
    /// nats-server; default [`crate::nats::find_binary`].
    pub nats_binary: Option<PathBuf>,
    /// Where `hostile.wasm` is (`examples/target/wasm32-wasip1/release`).
    pub wasm_dir: PathBuf,
    /// Steps of the job, one a second.
    pub steps: u64,
    /// The life of the first EP's attach token, seconds; it is renewed once a third is left.
    pub attach_ttl_s: u64,
    /// How long the first EP's link is cut: under a quarter of [`LEASE_S`], and under the
    /// token's last third (a renewal the cut holds back still arrives before the expiry).
    pub cut: Duration,
    /// How long the scheduler stays down.
    pub scheduler_down: Duration,
    /// The stack's durability.
    pub durability: Durability,
    /// Keep the state here (default: a temporary directory, kept only on failure).
    pub dir: Option<PathBuf>,
}

impl LongOptions {
    /// 150 steps, a 30 s attach token, an 8 s cut, the scheduler down for 2 s.
    pub fn new(htfaas: PathBuf, wasm_dir: PathBuf) -> LongOptions {
        LongOptions {
            htfaas,
            nats_binary: None,
            wasm_dir,
            steps: 150,
            attach_ttl_s: 30,
            cut: Duration::from_secs(8),
            scheduler_down: Duration::from_secs(2),
            durability: Durability::Log,
            dir: None,
        }
    }

    fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.cut < Duration::from_secs(LEASE_S / 4), "the cut must be under a quarter of the lease");
        let last_third = Duration::from_secs(self.attach_ttl_s) / 3;
        anyhow::ensure!(
            self.cut + Duration::from_secs(1) < last_third,
            "the cut ({:?}) must be shorter than the attach token's last third ({last_third:?})",
            self.cut
        );
        // The first EP sees the restart (with the undisturbed start, about 20 s), two renewals
        // (each at most two thirds of the token's life away) and the cut, then drains for 5 s;
        // the second EP needs a few steps of its own.
        let first_ep = 20 + 2 * (2 * self.attach_ttl_s / 3) + self.cut.as_secs() + 5;
        let least = first_ep + 20;
        anyhow::ensure!(self.steps >= least, "{} steps are too few for the scenario: at least {least}", self.steps);
        Ok(())
    }
}

/// What interrupted the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The scheduler killed (SIGKILL) and started again.
    SchedulerRestart,
    /// The first EP's attach token renewed over its session.
    TokenRenewal,
    /// The first EP's link to the scheduler cut, then mended.
    LinkCut,
    /// The first EP stopped (SIGTERM): the job stored its checkpoint and resumed on the second.
    Resume,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::SchedulerRestart => "scheduler restart",
            Kind::TokenRenewal => "attach-token renewal",
            Kind::LinkCut => "EP link cut",
            Kind::Resume => "checkpoint and resume",
        }
    }
}

/// One interruption.
#[derive(Debug, Clone)]
pub struct Interruption {
    /// What.
    pub kind: Kind,
    /// When, from the job's start.
    pub at: Duration,
    /// How long it lasted (the scheduler: from the kill to answering again; the cut: cut to
    /// mended; the move: from the SIGTERM to the job's first step on the second EP).
    pub lasted: Duration,
    /// How far the job fell behind over it: the time from the last step before it to the
    /// first after it, less the steps in between; `None` without steps on both sides.
    pub lost: Option<Duration>,
    /// What happened, in a few words.
    pub note: String,
    /// The window the loss is measured over (harness clock).
    window: (Instant, Instant),
}

/// What the run found.
#[derive(Debug, Clone, Default)]
pub struct LongReport {
    /// Steps of the job.
    pub steps: u64,
    /// The interruptions, in order.
    pub interruptions: Vec<Interruption>,
    /// The job's run attempts.
    pub attempts: Vec<Attempt>,
    /// The reference's run attempts.
    pub reference_attempts: Vec<Attempt>,
    /// The job's and the reference's final state.
    pub states: (Option<JobState>, Option<JobState>),
    /// The job's and the reference's output (`counted`).
    pub outputs: (Option<Vec<u8>>, Option<Vec<u8>>),
    /// The count the resumed run started at (its log's `starting at K`).
    pub resumed_from: Option<u64>,
    /// The last count the first EP's run reached.
    pub last_on_first: Option<u64>,
    /// Whether the job had a count on the second EP before the first one left.
    pub ran_on_both: bool,
    /// Attempts the job started between the cut and the renewal after it (0: the lease kept it).
    pub cut_attempts: u32,
    /// Whether the first EP's session before the cut was still its session after it.
    pub session_kept: bool,
    /// Attach renewals the first EP logged while it ran the job.
    pub renewals: usize,
    /// The job from its first attempt's start to its last's end, and the reference's.
    pub walls: (Duration, Duration),
    /// The whole run, from the stack's start to its stop.
    pub elapsed: Duration,
}

impl LongReport {
    /// Whether every check held (see the module docs).
    pub fn passed(&self) -> bool {
        let want = format!("{}\n", self.steps).into_bytes();
        let on_first = |a: &Attempt| a.ep == EP_NAME;
        let interrupted = self.attempts.iter().filter(|a| a.outcome == "interrupted").count();
        // The move is a vacate: the first EP reported the job with its checkpoint stored, so
        // the scheduler resumed it at once, no retry used.
        let moved = match self.attempts.split_last() {
            Some((last, before)) => {
                last.outcome == "completed"
                    && !on_first(last)
                    && before.iter().all(on_first)
                    && before.last().is_some_and(|a| a.outcome == "vacated")
            }
            None => false,
        };
        self.states == (Some(JobState::Completed), Some(JobState::Completed))
            && self.outputs.0.as_ref() == Some(&want)
            && self.outputs.1.as_ref() == Some(&want)
            && self.resumed_from.is_some_and(|k| k > 0 && self.last_on_first.is_some_and(|c| k >= c))
            && !self.ran_on_both
            && self.cut_attempts == 0
            && self.session_kept
            && interrupted == 1
            && self.attempts.len() == 3
            && moved
            && self.reference_attempts.len() == 1
            && self.renewals > 0
    }
}

impl fmt::Display for LongReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = |d: Duration| d.as_secs_f64();
        writeln!(f, "a job of {} steps (one a second), interrupted:", self.steps)?;
        for i in &self.interruptions {
            let lost = i.lost.map_or("?".to_owned(), |l| format!("{:.1} s", s(l)));
            writeln!(
                f,
                "  {:>6.1} s  {:<22} lasted {:>5.1} s, the job lost {lost}: {}",
                s(i.at),
                i.kind.name(),
                s(i.lasted),
                i.note
            )?;
        }
        for a in &self.attempts {
            let reason = if a.reason.is_empty() { String::new() } else { format!(" ({})", a.reason) };
            writeln!(f, "  attempt {} on {}: {}{reason}", a.n, a.ep, a.outcome)?;
        }
        let show = |o: &Option<Vec<u8>>| {
            o.as_deref().map_or("none".to_owned(), |b| format!("{:?}", String::from_utf8_lossy(b)))
        };
        let state = |s: Option<JobState>| s.map_or("none", |s| s.as_str());
        writeln!(f, "states: job {}, reference {}", state(self.states.0), state(self.states.1))?;
        writeln!(f, "outputs: job {}, reference {}", show(&self.outputs.0), show(&self.outputs.1))?;
        writeln!(
            f,
            "resumed from count {:?} (the first EP reached {:?}); on both EPs at once: {}; attempts started by the cut: \
             {}, its session kept: {}; attach renewals during the job: {}; reference attempts: {}",
            self.resumed_from,
            self.last_on_first,
            self.ran_on_both,
            self.cut_attempts,
            self.session_kept,
            self.renewals,
            self.reference_attempts.len()
        )?;
        let (job, reference) = self.walls;
        writeln!(
            f,
            "wall: interrupted {:.1} s, uninterrupted {:.1} s ({:+.1} s); whole run {:.1} s",
            s(job),
            s(reference),
            s(job) - s(reference),
            s(self.elapsed)
        )?;
        write!(f, "{}", if self.passed() { "PASSED" } else { "FAILED" })
    }
}

/// The counter function `name`: the `hostile` guest counting `steps`, firing on `<dir>/` and
/// writing into `out`, keeping a checkpoint when stopped.
fn counter(name: &str, module: htfaas_functions::Digest, input: &str, out: &str, steps: u64) -> FunctionManifest {
    let mut m = super::manifest(name, module, out);
    let dir = input.rsplit_once('/').map_or(input, |(d, _)| d);
    m.trigger = Trigger::on_path(format!("{dir}/**"));
    m.args = vec!["count".into(), steps.to_string()];
    m.resources = Resources::new(1, 64, steps + 600);
    m.checkpoint = Some(CheckpointPolicy { exit_code: None, max_mb: 1 });
    m
}

/// What the poller saw.
#[derive(Debug, Default)]
struct Seen {
    /// Each change of the job's count: when, on which EP (0: the first), the count.
    steps: Vec<(Instant, usize, u64)>,
    /// When each attach renewal appeared in the first EP's log.
    renewals: Vec<Instant>,
    /// The count files to read, by EP.
    files: Vec<(usize, Vec<PathBuf>)>,
}

/// Reads the job's count on each EP and the first EP's log every [`POLL`] until dropped.
struct Poller {
    seen: Arc<Mutex<Seen>>,
    stop: CancellationToken,
}

impl Poller {
    fn start(ep_log: PathBuf) -> Poller {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = CancellationToken::new();
        let (s, token) = (seen.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut offset, mut last) = (0u64, std::collections::HashMap::new());
            while !token.is_cancelled() {
                let renewed = read_new_lines(&ep_log, &mut offset).iter().filter(|l| l.contains(RENEWED)).count();
                if let Ok(mut seen) = s.lock() {
                    let now = Instant::now();
                    seen.renewals.extend(std::iter::repeat_n(now, renewed));
                    let counts: Vec<(usize, u64)> = seen
                        .files
                        .iter()
                        .filter_map(|(ep, files)| Some((*ep, files.iter().find_map(|f| read_count(f))?)))
                        .collect();
                    for (ep, count) in counts {
                        if last.insert(ep, count) != Some(count) {
                            seen.steps.push((now, ep, count));
                        }
                    }
                }
                tokio::time::sleep(POLL).await;
            }
        });
        Poller { seen, stop }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Seen) -> T) -> T {
        let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut seen)
    }

    /// Reads `job`'s count on EP `ep` from its work directory from now on.
    fn watch(&self, ep: usize, work_dir: &Path, job: &str) {
        let jobs = work_dir.join("jobs");
        let files = [job.to_owned(), format!("job-{}", hex::encode(Sha256::digest(job.as_bytes())))]
            .map(|d| jobs.join(d).join("checkpoint/n"))
            .to_vec();
        self.with(|s| s.files.push((ep, files)));
    }

    fn renewals(&self) -> Vec<Instant> {
        self.with(|s| s.renewals.clone())
    }

    fn steps(&self) -> Vec<(Instant, usize, u64)> {
        self.with(|s| s.steps.clone())
    }

    /// The counts seen on EP `ep`, with when, oldest first.
    fn on(&self, ep: usize) -> Vec<(Instant, u64)> {
        self.steps().into_iter().filter(|s| s.1 == ep).map(|s| (s.0, s.2)).collect()
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The whole lines appended to `path` since `offset` (moved past them).
fn read_new_lines(path: &Path, offset: &mut u64) -> Vec<String> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let Ok(mut file) = std::fs::File::open(path) else { return Vec::new() };
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(*offset)).and_then(|_| file.read_to_end(&mut bytes)).is_err() {
        return Vec::new();
    }
    let Some(end) = bytes.iter().rposition(|&b| b == b'\n') else { return Vec::new() };
    *offset += end as u64 + 1;
    String::from_utf8_lossy(&bytes[..end]).lines().map(str::to_owned).collect()
}

/// The count a guest keeps in `path`, if it is there and whole.
fn read_count(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// How far a job counting one step a second fell behind over `[from, to]`: from its last step
/// at or before `from` to its first at or after `to`, that time less the steps made.
fn lost(steps: &[(Instant, usize, u64)], from: Instant, to: Instant) -> Option<Duration> {
    let (t0, _, c0) = steps.iter().rev().find(|s| s.0 <= from)?;
    let (t1, _, c1) = steps.iter().find(|s| s.0 >= to)?;
    let made = Duration::from_secs(c1.checked_sub(*c0)?);
    Some(t1.duration_since(*t0).saturating_sub(made))
}

/// Polls `check` every 100 ms until it gives a value, at most `limit`.
async fn until<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("waited {limit:?} for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn job_at(client: &crate::client::Client, path: &str) -> Option<JobRecord> {
    client.jobs().await.ok()?.into_iter().find(|j| j.event.path == path)
}

/// `path`'s job while it runs on EP `ep`.
async fn running_on(client: &crate::client::Client, path: &str, ep: &str) -> Option<JobRecord> {
    job_at(client, path).await.filter(|j| j.state == JobState::Running && j.ep.as_deref() == Some(ep))
}

async fn attached(client: &crate::client::Client, name: &str) -> Option<()> {
    session(client, name).await.map(|_| ())
}

/// The session id of EP `name`, while it is attached.
async fn session(client: &crate::client::Client, name: &str) -> Option<String> {
    client.eps().await.ok()?.into_iter().find(|e| e.name == name)?.session
}

/// Runs the scenario and its checks.
pub async fn run(opts: LongOptions) -> anyhow::Result<LongReport> {
    opts.check()?;
    let temp = match &opts.dir {
        Some(_) => None,
        None => Some(tempfile::Builder::new().prefix("htfaas-long-").tempdir().context("make a temporary dir")?),
    };
    let dir = match (&opts.dir, &temp) {
        (Some(d), _) => d.clone(),
        (None, Some(t)) => t.path().to_owned(),
        (None, None) => bail!("no directory"),
    };
    let mut overrides = serde_json::Map::new();
    overrides.insert("lease_s".into(), LEASE_S.into());
    // No prefetch: the reference never waits queued behind the job on the one-core EP.
    overrides.insert("max_prefetch".into(), 0.into());
    let started = Instant::now();
    let mut procs = ProcStack::start(&ProcOptions {
        htfaas: opts.htfaas.clone(),
        nats_binary: opts.nats_binary.clone(),
        dir: dir.clone(),
        durability: opts.durability,
        workers: 1,
        scheduler_overrides: overrides,
        ep_relay: true,
        ep_attach_ttl_s: Some(opts.attach_ttl_s),
        async_threads: None,
    })
    .await?;
    println!(
        "long-job harness: {} steps, attach token {} s, cut {:?}, lease {LEASE_S} s, state in {}",
        opts.steps,
        opts.attach_ttl_s,
        opts.cut,
        dir.display()
    );
    let result = scenario(&opts, &mut procs, &dir).await;
    procs.stop_all().await;
    let kept = match &result {
        Ok(report) => !report.passed(),
        Err(_) => true,
    };
    if kept {
        println!("state kept in {}", dir.display());
        if let Some(t) = temp {
            let _ = t.keep();
        }
    }
    let mut report = result?;
    report.elapsed = started.elapsed();
    Ok(report)
}

async fn scenario(opts: &LongOptions, procs: &mut ProcStack, dir: &Path) -> anyhow::Result<LongReport> {
    let client = procs.client()?;
    let wasm = opts.wasm_dir.join("hostile.wasm");
    let bytes = std::fs::read(&wasm).with_context(|| format!("read {} (build the examples first)", wasm.display()))?;
    let hostile = client.upload_module(bytes).await?;
    client.register(&counter(LONG_FN, hostile.clone(), LONG_INPUT, LONG_OUT, opts.steps)).await?;
    client.register(&counter(REF_FN, hostile, REF_INPUT, REF_OUT, opts.steps)).await?;
    until("the first EP to attach", LIMIT, || attached(&client, EP_NAME)).await?;
    let poller = Poller::start(dir.join("logs/ep.log"));

    client.put_bytes(b"long".to_vec(), LONG_INPUT).await?;
    let job = until("the job running on the first EP", LIMIT, || running_on(&client, LONG_INPUT, EP_NAME)).await?;
    let t0 = Instant::now();
    poller.watch(0, &procs.ep_work_dir(), &job.id);
    until("the job's first step", LIMIT, || async { poller.on(0).first().copied() }).await?;
    println!("job {} running on {EP_NAME}", job.id);
    tokio::time::sleep(STEADY).await;
    let mut interruptions = Vec::new();
    // The job, still running on the first EP before the next interruption (a few tries: the
    // API may be busy); if it ended there already, the job is too short for the scenario.
    let still = |what: &'static str| {
        let client = &client;
        let waited = format!("the job still running on {EP_NAME} before {what} (with more steps it would be)");
        async move { until(&waited, Duration::from_secs(15), || running_on(client, LONG_INPUT, EP_NAME)).await }
    };

    // 1. The scheduler, killed mid-run and started again.
    still("the scheduler's restart").await?;
    let at = Instant::now();
    procs.kill(Component::Scheduler).await?;
    tokio::time::sleep(opts.scheduler_down).await;
    procs.start_one(Component::Scheduler).await.context("start the scheduler again")?;
    let down = at.elapsed();
    let again = until("the job running on the first EP again", LIMIT, || async {
        running_on(&client, LONG_INPUT, EP_NAME).await.filter(|j| j.attempts >= 2)
    })
    .await?;
    let back = at.elapsed().as_secs_f64();
    let note = format!("down {:.1} s; attempt {} on {EP_NAME} after {back:.1} s", down.as_secs_f64(), again.attempts);
    interruptions.push(interruption(Kind::SchedulerRestart, t0, at, down, Instant::now(), note));
    println!("scheduler restarted; the job runs on as attempt {}", again.attempts);

    // 2. The second EP, and the uninterrupted reference on it.
    let second = procs.start_extra_ep(2).await?;
    until("the second EP to attach", LIMIT, || attached(&client, &second.name)).await?;
    poller.watch(1, &second.work_dir, &job.id);
    client.put_bytes(b"reference".to_vec(), REF_INPUT).await?;
    until("the reference running on the second EP", LIMIT, || running_on(&client, REF_INPUT, &second.name)).await?;
    println!("reference running on {}", second.name);

    // 3. A renewal, then the cut right after it, then a renewal over the same session.
    let ttl = Duration::from_secs(opts.attach_ttl_s);
    let seen = poller.renewals().len();
    until("an attach-token renewal", 2 * ttl, || async { (poller.renewals().len() > seen).then_some(()) }).await?;
    let before = still("the cut").await?;
    let session_before = session(&client, EP_NAME).await;
    let link = procs.ep_link().context("the first EP has no relay")?;
    let at = Instant::now();
    link.cut();
    tokio::time::sleep(opts.cut).await;
    link.mend();
    let mended = Instant::now();
    let seen = poller.renewals().len();
    until("a renewal after the cut", 2 * ttl, || async { (poller.renewals().len() > seen).then_some(()) }).await?;
    let after = still("the drain").await?;
    let session_kept = session_before.is_some() && session(&client, EP_NAME).await == session_before;
    let cut_attempts = after.attempts.saturating_sub(before.attempts);
    let (was, is) = (before.attempts, after.attempts);
    let note = format!("nothing crossed; lease {LEASE_S} s; the job's attempt {was} before, {is} after");
    interruptions.push(interruption(Kind::LinkCut, t0, at, mended - at, mended, note));
    println!("link cut for {:?} and mended; renewed after it", opts.cut);

    // 4. The first EP leaves as its host stops it: the job moves with its checkpoint.
    let ran_on_both = !poller.on(1).is_empty();
    let at = Instant::now();
    procs.stop_one(Component::Ep).await.context("stop the first EP")?;
    let left = at.elapsed();
    let last_on_first = poller.on(0).last().map(|(_, c)| *c);
    let (resumed_at, _) =
        until("the job's first step on the second EP", LIMIT, || async { poller.on(1).first().copied() }).await?;
    let note = format!("{EP_NAME} drained and left after {:.1} s; resumed on {}", left.as_secs_f64(), second.name);
    interruptions.push(interruption(Kind::Resume, t0, at, resumed_at - at, resumed_at, note));
    println!("first EP gone; the job resumed on {}", second.name);

    // Both end.
    let ended = |path: &'static str| {
        let client = &client;
        async move {
            job_at(client, path).await.filter(|j| {
                matches!(j.state, JobState::Completed | JobState::Failed | JobState::Removed | JobState::Held)
            })
        }
    };
    let limit = Duration::from_secs(opts.steps) + LIMIT;
    let done = until("the job to end", limit, || ended(LONG_INPUT)).await?;
    let reference = until("the reference to end", limit, || ended(REF_INPUT)).await?;

    let attempts = client.job_history(&done.id).await?;
    let reference_attempts = client.job_history(&reference.id).await?;
    let log = client.job_log(&done.id).await.map(|l| l.log).unwrap_or_default();
    let resumed_from = log.lines().filter_map(|l| l.trim().strip_prefix("starting at ")?.parse().ok()).next_back();
    let steps = poller.steps();
    let renewals = poller.renewals().into_iter().filter(|r| *r >= t0 && *r <= at).collect::<Vec<_>>();
    for r in &renewals {
        interruptions.push(interruption(Kind::TokenRenewal, t0, *r, Duration::ZERO, *r, "over the session".into()));
    }
    for i in &mut interruptions {
        i.lost = lost(&steps, i.window.0, i.window.1);
    }
    interruptions.sort_by_key(|i| i.at);
    Ok(LongReport {
        steps: opts.steps,
        interruptions,
        walls: (wall(&attempts), wall(&reference_attempts)),
        attempts,
        reference_attempts,
        states: (Some(done.state), Some(reference.state)),
        outputs: (
            client.get_bytes(&format!("{LONG_OUT}counted")).await?,
            client.get_bytes(&format!("{REF_OUT}counted")).await?,
        ),
        resumed_from,
        last_on_first,
        ran_on_both,
        cut_attempts,
        session_kept,
        renewals: renewals.len(),
        elapsed: Duration::ZERO,
    })
}

fn interruption(kind: Kind, t0: Instant, at: Instant, lasted: Duration, to: Instant, note: String) -> Interruption {
    Interruption { kind, at: at.saturating_duration_since(t0), lasted, lost: None, note, window: (at, to) }
}

/// From the first attempt's start to the last one's end.
fn wall(attempts: &[Attempt]) -> Duration {
    let start = attempts.first().map(|a| a.started_at_ms);
    let end = attempts.last().and_then(|a| a.ended_at_ms);
    match (start, end) {
        (Some(s), Some(e)) => Duration::from_millis(e.saturating_sub(s)),
        _ => Duration::ZERO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_time_lost_is_the_window_less_the_steps_made_in_it() {
        let t = Instant::now();
        let at = |ms: u64| t + Duration::from_millis(ms);
        // One step a second, then a gap of 4 s where 1 step was due.
        let steps = vec![(at(0), 0, 1), (at(1000), 0, 2), (at(2000), 0, 3), (at(6000), 1, 4), (at(7000), 1, 5)];
        assert_eq!(lost(&steps, at(2500), at(5000)), Some(Duration::from_secs(3)));
        assert_eq!(lost(&steps, at(500), at(1500)), Some(Duration::ZERO), "a steady window loses nothing");
        assert_eq!(lost(&steps, at(6500), at(9000)), None, "no step after it");
        let reset = vec![(at(0), 0, 5), (at(1000), 0, 1)];
        assert_eq!(lost(&reset, at(0), at(1000)), None, "a count that went back is no measure");
    }

    #[test]
    fn new_lines_are_read_once_and_only_whole() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("ep.log");
        std::fs::write(&path, "a attach token renewed\nb\npart").expect("write");
        let mut offset = 0;
        assert_eq!(read_new_lines(&path, &mut offset), ["a attach token renewed", "b"]);
        assert!(read_new_lines(&path, &mut offset).is_empty(), "the partial line waits");
        std::fs::write(&path, "a attach token renewed\nb\npartial\n").expect("write");
        assert_eq!(read_new_lines(&path, &mut offset), ["partial"]);
    }

    #[test]
    fn the_options_keep_the_cut_inside_the_lease_and_the_tokens_last_third() {
        let opts = LongOptions::new("htfaas".into(), "wasm".into());
        assert!(opts.check().is_ok());
        assert!(LongOptions { cut: Duration::from_secs(10), ..opts.clone() }.check().is_err());
        assert!(LongOptions { attach_ttl_s: 20, ..opts.clone() }.check().is_err());
        assert!(LongOptions { steps: 60, ..opts }.check().is_err());
    }

    #[test]
    fn a_report_passes_only_when_the_job_moved_once_and_matches_the_reference() {
        let attempt = |n, ep: &str, outcome: &str| Attempt {
            n,
            ep: ep.into(),
            started_at_ms: 0,
            ended_at_ms: Some(1),
            outcome: outcome.into(),
            reason: String::new(),
            usage: None,
        };
        let good = LongReport {
            steps: 3,
            attempts: vec![
                attempt(1, EP_NAME, "interrupted"),
                attempt(2, EP_NAME, "vacated"),
                attempt(3, "ep-proc-2", "completed"),
            ],
            reference_attempts: vec![attempt(1, "ep-proc-2", "completed")],
            states: (Some(JobState::Completed), Some(JobState::Completed)),
            outputs: (Some(b"3\n".to_vec()), Some(b"3\n".to_vec())),
            resumed_from: Some(2),
            last_on_first: Some(2),
            session_kept: true,
            renewals: 1,
            ..Default::default()
        };
        assert!(good.passed(), "{good}");
        assert!(!LongReport { resumed_from: Some(0), ..good.clone() }.passed(), "started over");
        assert!(!LongReport { resumed_from: Some(1), ..good.clone() }.passed(), "behind the first EP");
        assert!(!LongReport { ran_on_both: true, ..good.clone() }.passed());
        assert!(!LongReport { cut_attempts: 1, ..good.clone() }.passed());
        assert!(!LongReport { session_kept: false, ..good.clone() }.passed());
        assert!(!LongReport { renewals: 0, ..good.clone() }.passed());
        assert!(!LongReport { outputs: (Some(b"3\n".to_vec()), None), ..good.clone() }.passed());
        let mut again = good.clone();
        again.attempts.insert(2, attempt(3, "ep-proc-2", "lost"));
        assert!(!again.passed(), "ran on the second EP twice");
        let mut lost = good.clone();
        lost.attempts[1].outcome = "lost".into();
        assert!(!lost.passed(), "the move cost a retry");
    }
}
