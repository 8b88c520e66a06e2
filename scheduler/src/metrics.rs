//! Prometheus metrics of the scheduler, served at `GET /metrics` (admin token) in the
//! OpenMetrics text format.
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | `htfaas_scheduler_jobs` | gauge | `state` (`idle`, `running`, `held`, `completed`, `failed`, `removed`) | jobs in the queue by state |
//! | `htfaas_scheduler_dispatch_latency_seconds` | histogram | | from a job's submission to its Assign sent (first attempt) |
//! | `htfaas_scheduler_eps_attached` | gauge | | attached EP sessions |
//! | `htfaas_scheduler_ep_cpus`, `…_ep_busy_cpus` | gauge | | cores the attached EPs offer, and those reserved by running jobs |
//! | `htfaas_scheduler_ep_memory_bytes`, `…_ep_busy_memory_bytes` | gauge | | the same for memory |
//! | `htfaas_scheduler_ep_gpus`, `…_ep_busy_gpus` | gauge | | the same for GPUs |
//! | `htfaas_scheduler_token_refusals_total` | counter | `token` (`submit`, `attach`, `admin`), `reason` | credentials refused, by the check that failed ([`Reason`]) |
//! | `htfaas_scheduler_audit_records_total` | counter | | records appended to the audit trail (its last sequence number) |
//! | `htfaas_scheduler_store_writes_total`, `…_store_write_batches_total` | counter | | writes to the job store, and the transactions (group commits) they were run in: their ratio is the writes per commit |
//! | `htfaas_scheduler_ep_bad_frames_total` | counter | | frames from EPs that were not understood |
//! | `htfaas_scheduler_ignored_reports_total` | counter | | `Finished` reports for jobs not running on the reporting session |
//! | `htfaas_scheduler_store_retries_total` | counter | | writes the store could not take for now (a full disk), kept and tried again: reports waiting for room |
//! | `htfaas_scheduler_warm_refused_total` | counter | | warm requests refused after their token verified: a digest the token does not name, a module URL no module store has |
//!
//! Cost: counters and the latency histogram are atomics (no lock on the submit or dispatch
//! path). Jobs by state are read at scrape time on a read-only connection of its own, from
//! the store's `job_counts` (a row per state, kept by triggers in each write that changes a
//! job's state): a scrape reads a handful of rows however many jobs the store holds, and does
//! not hold up the queue. EP figures are read under the EP table's lock once per scrape.
//!
//! Dispatch latency: the submit handler sends each new job's id and instant to the dispatcher
//! over a channel (no lock); the dispatcher keeps them ([`Waiting`], at most
//! [`MAX_TRACKED`] at once, each at most [`MAX_WAIT`]) and observes the time when it sends the
//! job's first Assign. Jobs queued before the scheduler started, beyond those bounds, or sent
//! again after a lost attempt are not observed.

use crate::failure::ApiFailure;
use crate::matching::EpTable;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use htfaas_functions::metrics::{CONTENT_TYPE, Histogram};
use htfaas_functions::proto::JobState;
use htfaas_functions::token::TokenError;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;
use rusqlite::{Connection, OpenFlags};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Most submitted jobs the dispatcher remembers while they wait for their first Assign.
pub const MAX_TRACKED: usize = 100_000;
/// How long a submitted job is remembered; one waiting longer is not observed.
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);
/// Upper bounds of the dispatch latency buckets, seconds.
pub const LATENCY_BUCKETS: [f64; 17] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0];

/// The credential a refusal is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token {
    /// A submit token (`POST /v1/jobs`, `POST /v1/preflight`).
    Submit,
    /// An attach token (`GET /v1/ep/attach`, and the session it opens).
    Attach,
    /// The admin bearer token.
    Admin,
}

impl Token {
    const ALL: [Token; 3] = [Token::Submit, Token::Attach, Token::Admin];

    fn label(self) -> &'static str {
        match self {
            Token::Submit => "submit",
            Token::Attach => "attach",
            Token::Admin => "admin",
        }
    }
}

/// Why a credential was refused: the checks the API and the EP link make, in their order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// No bearer token.
    Missing,
    /// Not a JWT, or no issuer to pick a verifier by.
    Malformed,
    /// An issuer this scheduler does not trust.
    UntrustedIssuer,
    /// `kid` not in the issuer's key set.
    UnknownKey,
    /// The signature does not verify (forged, or signed by another key).
    BadSignature,
    /// Past `exp` (at attach, or during the session).
    Expired,
    /// Before `nbf`.
    NotYetValid,
    /// `aud` not ours.
    WrongAudience,
    /// `iss` not the verifier's.
    WrongIssuer,
    /// Any other failed validation.
    Invalid,
    /// Revoked (by `jti`, subject or issuer).
    Revoked,
    /// A submit token with no use left (a replay).
    UsedUp,
    /// The request asks more than the submit token allows (resources, function).
    OverLimits,
    /// An attach token for another annex than the EP's hello names.
    WrongAnnex,
    /// The admin token does not match.
    WrongToken,
}

impl Reason {
    const ALL: [Reason; 15] = [
        Reason::Missing,
        Reason::Malformed,
        Reason::UntrustedIssuer,
        Reason::UnknownKey,
        Reason::BadSignature,
        Reason::Expired,
        Reason::NotYetValid,
        Reason::WrongAudience,
        Reason::WrongIssuer,
        Reason::Invalid,
        Reason::Revoked,
        Reason::UsedUp,
        Reason::OverLimits,
        Reason::WrongAnnex,
        Reason::WrongToken,
    ];

    /// The check of `e`.
    pub fn of(e: &TokenError) -> Reason {
        match e {
            TokenError::Malformed(_) => Reason::Malformed,
            TokenError::UnknownKey(_) => Reason::UnknownKey,
            TokenError::InvalidSignature => Reason::BadSignature,
            TokenError::Expired => Reason::Expired,
            TokenError::NotYetValid => Reason::NotYetValid,
            TokenError::WrongAudience => Reason::WrongAudience,
            TokenError::WrongIssuer => Reason::WrongIssuer,
            TokenError::Invalid(_) | TokenError::Key(_) => Reason::Invalid,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Reason::Missing => "missing",
            Reason::Malformed => "malformed",
            Reason::UntrustedIssuer => "untrusted_issuer",
            Reason::UnknownKey => "unknown_key",
            Reason::BadSignature => "bad_signature",
            Reason::Expired => "expired",
            Reason::NotYetValid => "not_yet_valid",
            Reason::WrongAudience => "wrong_audience",
            Reason::WrongIssuer => "wrong_issuer",
            Reason::Invalid => "invalid",
            Reason::Revoked => "revoked",
            Reason::UsedUp => "used_up",
            Reason::OverLimits => "over_limits",
            Reason::WrongAnnex => "wrong_annex",
            Reason::WrongToken => "wrong_token",
        }
    }
}

/// The scheduler's own counters (see the module docs), shared by the API, the EP sessions and
/// the dispatcher.
#[derive(Debug)]
pub struct Metrics {
    refusals: [[AtomicU64; Reason::ALL.len()]; Token::ALL.len()],
    /// Submission to first Assign.
    pub dispatch_latency: Histogram,
    submitted: mpsc::UnboundedSender<(String, Instant)>,
    /// The receiving end, until the dispatcher takes it.
    waiting: Mutex<Option<Waiting>>,
    /// Frames from EPs that were not understood.
    bad_frames: AtomicU64,
    /// Finished reports for jobs not running on the reporting session.
    ignored_reports: AtomicU64,
    /// Warm requests refused after their token verified ([`crate::warm`]).
    warm_refused: AtomicU64,
    /// Store writes kept and tried again because the store could not take them for now.
    store_retries: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    /// All zero.
    pub fn new() -> Metrics {
        let (submitted, rx) = mpsc::unbounded_channel();
        Metrics {
            refusals: Default::default(),
            dispatch_latency: Histogram::new(&LATENCY_BUCKETS),
            submitted,
            waiting: Mutex::new(Some(Waiting { rx, since: HashMap::new() })),
            bad_frames: AtomicU64::new(0),
            ignored_reports: AtomicU64::new(0),
            warm_refused: AtomicU64::new(0),
            store_retries: AtomicU64::new(0),
        }
    }

    /// Counts a refused credential.
    pub fn refused(&self, token: Token, reason: Reason) {
        self.refusals[token as usize][reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Refusals counted for `token` and `reason`.
    pub fn refusals(&self, token: Token, reason: Reason) -> u64 {
        self.refusals[token as usize][reason as usize].load(Ordering::Relaxed)
    }

    /// A new job was queued now: the dispatcher times it to its first Assign.
    pub fn submitted(&self, job_id: &str) {
        // The dispatcher gone (shutdown) is no error: nothing is left to time.
        let _ = self.submitted.send((job_id.to_owned(), Instant::now()));
    }

    /// Counts a frame from an EP that was not understood.
    pub fn bad_frame(&self) {
        self.bad_frames.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a Finished report for a job not running on the reporting session.
    pub fn ignored_report(&self) {
        self.ignored_reports.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a warm request refused after its token verified.
    pub fn warm_refused(&self) {
        self.warm_refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a store write kept to be tried again (the store could not take it for now).
    pub fn store_retry(&self) {
        self.store_retries.fetch_add(1, Ordering::Relaxed);
    }

    /// Store writes kept to be tried again so far.
    pub fn store_retries(&self) -> u64 {
        self.store_retries.load(Ordering::Relaxed)
    }

    /// Warm requests refused so far.
    pub fn warm_refusals(&self) -> u64 {
        self.warm_refused.load(Ordering::Relaxed)
    }

    /// The dispatcher's side; `None` once taken.
    pub(crate) fn take_waiting(&self) -> Option<Waiting> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// Jobs submitted and not yet assigned, with when they were submitted; owned by the
/// dispatcher task alone.
#[derive(Debug)]
pub(crate) struct Waiting {
    rx: mpsc::UnboundedReceiver<(String, Instant)>,
    since: HashMap<String, Instant>,
}

impl Waiting {
    /// One that nothing feeds.
    pub(crate) fn detached() -> Waiting {
        Waiting { rx: mpsc::unbounded_channel().1, since: HashMap::new() }
    }

    /// Takes in what the submit handler sent, up to [`MAX_TRACKED`] jobs kept.
    pub(crate) fn absorb(&mut self) {
        while let Ok((id, at)) = self.rx.try_recv() {
            if self.since.len() < MAX_TRACKED {
                self.since.insert(id, at);
            }
        }
    }

    /// The job's Assign was sent: observes how long it waited, once.
    pub(crate) fn dispatched(&mut self, job_id: &str, latency: &Histogram) {
        if let Some(at) = self.since.remove(job_id) {
            latency.observe(at.elapsed());
        }
    }

    /// Forgets jobs waiting past [`MAX_WAIT`] (held or removed before they ran, or still idle).
    pub(crate) fn prune(&mut self) {
        self.absorb();
        self.since.retain(|_, at| at.elapsed() < MAX_WAIT);
    }
}

/// What a scrape reads from the store.
#[derive(Debug, Default)]
struct Stored {
    jobs: HashMap<String, u64>,
    audit_records: u64,
}

/// Reads the jobs by state (`job_counts`) and the audit trail's last sequence number, on a
/// read-only connection of its own.
fn read_store(path: &Path) -> rusqlite::Result<Stored> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    let mut stmt = conn.prepare(JOBS_BY_STATE)?;
    let jobs = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
        .map(|row| row.map(|(s, n)| (s, u64::try_from(n).unwrap_or(0))))
        .collect::<rusqlite::Result<HashMap<_, _>>>()?;
    let audit_records: i64 = conn.query_row("SELECT COALESCE(MAX(seq), 0) FROM audit_records", [], |r| r.get(0))?;
    Ok(Stored { jobs, audit_records: u64::try_from(audit_records).unwrap_or(0) })
}

/// The scrape's count of jobs by state.
const JOBS_BY_STATE: &str = "SELECT state, n FROM job_counts";

/// The answer of `GET /metrics`, once the caller's admin token is checked: the store at `path`
/// counted, then the EP table read (`eps`, under its lock) and `metrics`' counters.
/// `writes` and `batches` are the store writer's counts ([`crate::queue::Queue::writes`]).
pub async fn render(
    metrics: &Metrics,
    path: PathBuf,
    (writes, batches): (u64, u64),
    eps: impl FnOnce() -> EpFigures,
) -> Result<Response, ApiFailure> {
    let stored = tokio::task::spawn_blocking(move || read_store(&path))
        .await
        .map_err(|e| ApiFailure::internal("count jobs for the metrics", &e))?
        .map_err(|e| ApiFailure::internal("count jobs for the metrics", &e))?;
    let snapshot = Snapshot {
        stored,
        eps: eps(),
        refusals: Token::ALL.map(|t| Reason::ALL.map(|r| metrics.refusals(t, r))),
        latency: metrics.dispatch_latency.clone(),
        bad_frames: metrics.bad_frames.load(Ordering::Relaxed),
        ignored_reports: metrics.ignored_reports.load(Ordering::Relaxed),
        warm_refused: metrics.warm_refusals(),
        store_retries: metrics.store_retries(),
        store_writes: writes,
        store_batches: batches,
    };
    let text =
        htfaas_functions::metrics::encode(snapshot).map_err(|e| ApiFailure::internal("encode the metrics", &e))?;
    Ok((StatusCode::OK, [(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response())
}

/// Sums over the attached EPs.
#[derive(Debug, Default)]
pub struct EpFigures {
    attached: u64,
    cpus: u64,
    busy_cpus: u64,
    memory_mb: u64,
    busy_memory_mb: u64,
    gpus: u64,
    busy_gpus: u64,
    /// Each function that limits its runs at once and has some assigned: its runs, its limit.
    limited: std::collections::BTreeMap<String, (u64, u32)>,
}

impl EpFigures {
    /// The sums over `table`'s EPs.
    pub fn of(table: &EpTable) -> EpFigures {
        let mut eps = EpFigures::default();
        for ep in table.iter() {
            eps.attached += 1;
            eps.cpus += u64::from(ep.total.cpus);
            eps.busy_cpus += u64::from(ep.total.cpus.saturating_sub(ep.free_cpus));
            eps.memory_mb += ep.total.memory_mb;
            eps.busy_memory_mb += ep.total.memory_mb.saturating_sub(ep.free_memory_mb);
            eps.gpus += u64::from(ep.total.gpus);
            eps.busy_gpus += u64::from(ep.total.gpus.saturating_sub(ep.free_gpus));
        }
        eps.limited = table.limited_functions().into_iter().map(|(f, v)| (f.to_owned(), v)).collect();
        eps
    }
}

/// Everything one scrape shows, read before encoding.
#[derive(Debug)]
struct Snapshot {
    stored: Stored,
    eps: EpFigures,
    refusals: [[u64; Reason::ALL.len()]; Token::ALL.len()],
    latency: Histogram,
    bad_frames: u64,
    ignored_reports: u64,
    warm_refused: u64,
    store_retries: u64,
    store_writes: u64,
    store_batches: u64,
}

const STATES: [JobState; 6] =
    [JobState::Idle, JobState::Running, JobState::Held, JobState::Completed, JobState::Failed, JobState::Removed];

impl Collector for Snapshot {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut m =
            e.encode_descriptor("htfaas_scheduler_jobs", "Jobs in the queue by state.", None, MetricType::Gauge)?;
        for state in STATES {
            let n = self.stored.jobs.get(state.as_str()).copied().unwrap_or(0);
            m.encode_family(&[("state", state.as_str())])?.encode_gauge(&n)?;
        }
        self.latency.encode(
            &mut e,
            "htfaas_scheduler_dispatch_latency",
            "Time from a job's submission to its first Assign sent.",
        )?;
        let ep = &self.eps;
        let mib = 1 << 20;
        for (name, help, unit, v) in [
            ("htfaas_scheduler_eps_attached", "Attached EP sessions.", None, ep.attached),
            ("htfaas_scheduler_ep_cpus", "Cores the attached EPs offer.", None, ep.cpus),
            ("htfaas_scheduler_ep_busy_cpus", "Cores reserved by running jobs.", None, ep.busy_cpus),
            ("htfaas_scheduler_ep_memory", "Memory the attached EPs offer.", Some(Unit::Bytes), ep.memory_mb * mib),
            (
                "htfaas_scheduler_ep_busy_memory",
                "Memory reserved by running jobs.",
                Some(Unit::Bytes),
                ep.busy_memory_mb * mib,
            ),
            ("htfaas_scheduler_ep_gpus", "GPUs the attached EPs offer.", None, ep.gpus),
            ("htfaas_scheduler_ep_busy_gpus", "GPUs reserved by running jobs.", None, ep.busy_gpus),
        ] {
            e.encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?.encode_gauge(&v)?;
        }
        for (name, help, pick) in [
            (
                "htfaas_scheduler_function_runs",
                "Runs assigned to EPs of each function with a max_concurrent that has any.",
                (|(n, _)| *n) as fn(&(u64, u32)) -> u64,
            ),
            (
                "htfaas_scheduler_function_max_concurrent",
                "The max_concurrent of each function with runs assigned; more of its jobs wait idle.",
                |(_, max)| u64::from(*max),
            ),
        ] {
            let mut m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (function, v) in &self.eps.limited {
                m.encode_family(&[("function", function.as_str())])?.encode_gauge(&pick(v))?;
            }
        }
        let mut m = e.encode_descriptor(
            "htfaas_scheduler_token_refusals",
            "Credentials refused, by kind and the check that failed.",
            None,
            MetricType::Counter,
        )?;
        for (t, token) in Token::ALL.iter().enumerate() {
            for (r, reason) in Reason::ALL.iter().enumerate() {
                let labels = [("token", token.label()), ("reason", reason.label())];
                m.encode_family(&labels)?.encode_counter::<NoLabelSet, _, u64>(&self.refusals[t][r], None)?;
            }
        }
        for (name, help, v) in [
            ("htfaas_scheduler_audit_records", "Records appended to the audit trail.", self.stored.audit_records),
            ("htfaas_scheduler_ep_bad_frames", "Frames from EPs that were not understood.", self.bad_frames),
            (
                "htfaas_scheduler_ignored_reports",
                "Finished reports for jobs not running on the reporting session.",
                self.ignored_reports,
            ),
            (
                "htfaas_scheduler_store_retries",
                "Store writes the store could not take for now (a full disk), kept and tried again.",
                self.store_retries,
            ),
            (
                "htfaas_scheduler_warm_refused",
                "Warm requests refused after their token verified (digest or module URL).",
                self.warm_refused,
            ),
            ("htfaas_scheduler_store_writes", "Writes to the job store.", self.store_writes),
            (
                "htfaas_scheduler_store_write_batches",
                "Transactions (group commits) the job store's writes ran in.",
                self.store_batches,
            ),
        ] {
            e.encode_descriptor(name, help, None, MetricType::Counter)?
                .encode_counter::<NoLabelSet, _, u64>(&v, None)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_and_tokens_index_their_own_rows() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "{r:?}");
        }
        for (i, t) in Token::ALL.iter().enumerate() {
            assert_eq!(*t as usize, i, "{t:?}");
        }
        let m = Metrics::new();
        m.refused(Token::Attach, Reason::of(&TokenError::InvalidSignature));
        assert_eq!(m.refusals(Token::Attach, Reason::BadSignature), 1);
        assert_eq!(m.refusals(Token::Submit, Reason::BadSignature), 0);
    }

    #[test]
    fn the_histogram_buckets_by_upper_bound_and_sums_seconds() {
        let h = Histogram::new(&LATENCY_BUCKETS);
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(1));
        h.observe(Duration::from_secs(7200));
        assert_eq!(h.count(), 3);
        assert_eq!(h.bucket(0), 2, "le 0.001 holds 0.0005 and 0.001");
        assert_eq!(h.bucket(LATENCY_BUCKETS.len()), 1, "+Inf");
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(Snapshot {
            stored: Stored::default(),
            eps: EpFigures::default(),
            refusals: Default::default(),
            latency: h,
            bad_frames: 0,
            ignored_reports: 0,
            warm_refused: 0,
            store_retries: 0,
            store_writes: 0,
            store_batches: 0,
        }));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        for line in [
            "htfaas_scheduler_dispatch_latency_seconds_count 3",
            "htfaas_scheduler_dispatch_latency_seconds_sum 7200.0015",
            "htfaas_scheduler_dispatch_latency_seconds_bucket{le=\"0.001\"} 2",
            "htfaas_scheduler_dispatch_latency_seconds_bucket{le=\"3600.0\"} 2",
            "htfaas_scheduler_dispatch_latency_seconds_bucket{le=\"+Inf\"} 3",
            "htfaas_scheduler_jobs{state=\"completed\"} 0",
            "htfaas_scheduler_token_refusals_total{token=\"attach\",reason=\"revoked\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} missing from\n{text}");
        }
    }

    #[test]
    fn waiting_jobs_are_observed_once_at_their_first_assign() {
        let m = Metrics::new();
        let mut w = m.take_waiting().expect("first take");
        assert!(m.take_waiting().is_none());
        m.submitted("a");
        w.absorb();
        w.dispatched("a", &m.dispatch_latency);
        w.dispatched("a", &m.dispatch_latency);
        w.dispatched("never-submitted", &m.dispatch_latency);
        assert_eq!(m.dispatch_latency.count(), 1);
    }

    #[tokio::test]
    async fn jobs_are_counted_by_state_from_the_counts_never_the_jobs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("jobs.sqlite");
        let _queue = crate::queue::Queue::open(&path).expect("open");
        let conn = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY).expect("open read-only");
        let plan: Vec<String> = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {JOBS_BY_STATE}"))
            .expect("explain")
            .query_map([], |r| r.get::<_, String>(3))
            .expect("plan")
            .collect::<rusqlite::Result<_>>()
            .expect("rows");
        assert_eq!(plan, ["SCAN job_counts"]);
        let stored = read_store(&path).expect("reads");
        assert!(stored.jobs.is_empty());
        assert_eq!(stored.audit_records, 0);
    }
}
