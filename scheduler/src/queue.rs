// Long because it holds schema, writer thread, job state machine, accounts, revocations, EP admin and audit of one store; kept whole until issue 19 splits it along its layers.
//! The durable job queue: jobs, submit-token uses, owner accounts and revocations in one
//! SQLite file, plus the in-memory set of revoked targets loaded from it at start.
//!
//! WAL, with `synchronous=FULL` ([`Durability::Fsync`], the default) or `NORMAL`
//! ([`Durability::Log`]): once a call that writes returns `Ok`, its transaction is committed (and,
//! with `Fsync`, on disk). Every write goes through one writer thread ([`MAX_BATCH`] at most per
//! batch), group commit as SQLite-based queues do it: the writer takes every write waiting in
//! its channel, runs them one after the other in one transaction, each in a savepoint of its
//! own (a write that fails is rolled back alone and answered with its error; the others go on),
//! commits once — one fsync for the batch — and only then answers each caller with its own
//! result. A write that arrives alone is committed at once (no timer). Running the writes in
//! turn keeps the checks inside each one (revocation, dedupe key, token uses, the idle limit,
//! "still running on this EP") from racing: each sees every write before it, in its batch or
//! an earlier one. Reads take the one connection (a mutex) between batches, in `spawn_blocking`.
//!
//! Stored format: `PRAGMA user_version` = [`SCHEMA_VERSION`]; [`MIGRATIONS`] bring an older
//! file (or an empty one) up to it in one transaction (version 3 added the nullable
//! `hold_code` column; older rows read it as `NULL`). A job keeps the full [`SubmitRequest`]
//! as JSON (it holds the original macaroons, which never leave through the API; EPs get
//! attenuated copies) and its submit token's `jti`, issuer and accounting group.
//!
//! Job states (`state` column): `idle` → `running` (dispatch) → `completed` | `failed` (the EP's
//! report); `running` → `idle` (its session ended, its EP reported the storage unavailable,
//! turned the job away unrun, or sent a report [`crate::doubt`] refused: a loss, counted in
//! `lost`, with the retry backoff in `not_before_ms`) or → `held` (past the
//! retry limit, with [`HOLD_CODE_RETRIES`] or [`HOLD_CODE_STORAGE`]); `idle` | `running` → `held` (an admin's
//! hold: `reason` and `hold_code` say why; a running job keeps its session until its stop is
//! reported) → `idle` (release: the earlier attempt is forgotten); `idle` | `running` | `held`
//! → `removed` (an admin's remove, or a revocation). Only `idle` jobs are ever matched. A
//! stopped job (held or removed while running) has its late report charged once, without
//! changing its state or reason ([`Queue::finish`]); a report that arrives after the release
//! of a held job is not charged.
//!
//! The audit trail ([`htfaas_functions::audit`], writer [`AUDIT_WRITER`]) lives in the same
//! file, in its own `audit_*` tables ([`htfaas_functions::audit::install`]ed at open, with
//! their own version), and each decision's record is appended in the decision's own write (its
//! savepoint: committed with the decision or rolled back with it): accepted (and held by
//! policy), dispatched, the EP's report (one `job.finished` with the input read, the outputs
//! written, the outcome and usage), attempts lost, held, released and removed (an admin, a
//! revocation, the run time), revocations, EP admin settings and priority factors. A refused
//! submission, which changes nothing, is recorded in a write of its own
//! ([`Queue::record_refusal`]). Every job's record names the job, its token's `jti`, owner,
//! function, digest and event, and its input path.

use crate::actions::Action;
use crate::dispatch::BATCH;
use crate::doubt::{Observed, Violation, doubt};
use crate::error::QueueError;
use crate::matching::{IdleJob, PoolRoom};
use crate::revocation::{Credential, Revoked, target_from_parts, target_parts};
use htfaas_functions::Resources;
use htfaas_functions::audit::{self, AuditDraft, AuditSigner, Checkpoint, CheckpointPolicy, Subject};
use htfaas_functions::proto::{
    Account, Attempt, EpAdminState, HOLD_CODE_BY_ADMIN, HOLD_CODE_RETRIES, HOLD_CODE_STORAGE, JobAssignment, JobRecord,
    JobReport, JobState, Outcome, OutputFile, Revocation, RevocationTarget, SubmitRequest, Usage,
};
use htfaas_functions::store::Durability;
use rusqlite::{Connection, OptionalExtension as _, Transaction, TransactionBehavior, params};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

/// Version of the stored format written by this build.
pub const SCHEMA_VERSION: i64 = 5;

/// Most owners whose idle jobs are read per pool and round (the best by priority).
pub const MAX_OWNERS_PER_POOL: usize = 512;
/// Most distinct owners the skip-scan reads per pool and round.
pub const MAX_OWNERS_SCANNED: u64 = 100_000;

/// The writer of the audit trail kept in the store.
pub const AUDIT_WRITER: &str = "scheduler";

/// Longest EP log kept per job, bytes.
pub const MAX_LOG_BYTES: usize = 64 * 1024;

/// `MIGRATIONS[v]` takes a file from version `v` to `v + 1`; a new file runs them all.
pub const MIGRATIONS: [&str; 5] = [SCHEMA_1, MIGRATE_1_TO_2, MIGRATE_2_TO_3, MIGRATE_3_TO_4, MIGRATE_4_TO_5];

/// Version 1: jobs, token uses, accounts.
const SCHEMA_1: &str = "
CREATE TABLE IF NOT EXISTS jobs (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    id              TEXT NOT NULL UNIQUE,
    owner           TEXT NOT NULL,
    dedupe_key      TEXT NOT NULL,
    state           TEXT NOT NULL,
    reason          TEXT NOT NULL DEFAULT '',
    token_jti       TEXT NOT NULL,
    request         TEXT NOT NULL,
    cpus            INTEGER NOT NULL,
    memory_mb       INTEGER NOT NULL,
    runtime_s       INTEGER NOT NULL,
    ep              TEXT,
    ep_session      TEXT,
    submitted_at_ms INTEGER NOT NULL,
    started_at_ms   INTEGER,
    finished_at_ms  INTEGER,
    exit_code       INTEGER,
    usage           TEXT,
    outputs         TEXT,
    log             TEXT,
    UNIQUE (owner, dedupe_key)
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, seq);
CREATE INDEX IF NOT EXISTS jobs_by_owner_state ON jobs (owner, state, seq);
CREATE INDEX IF NOT EXISTS jobs_by_session ON jobs (ep_session) WHERE ep_session IS NOT NULL;
CREATE TABLE IF NOT EXISTS token_uses (
    jti  TEXT PRIMARY KEY,
    uses INTEGER NOT NULL,
    exp  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS accounts (
    owner          TEXT PRIMARY KEY,
    jobs_completed INTEGER NOT NULL,
    jobs_failed    INTEGER NOT NULL,
    core_seconds   REAL NOT NULL,
    cpu_seconds    REAL NOT NULL,
    wall_seconds   REAL NOT NULL,
    bytes_in       INTEGER NOT NULL,
    bytes_out      INTEGER NOT NULL
);
";

/// Version 2: each job's submit-token issuer, accounting group (`grp`) and annex; revocations.
const MIGRATE_1_TO_2: &str = "
ALTER TABLE jobs ADD COLUMN token_issuer TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN grp TEXT;
ALTER TABLE jobs ADD COLUMN annex TEXT;
CREATE INDEX IF NOT EXISTS jobs_idle_by_annex ON jobs (annex, owner, seq) WHERE state = 'idle';
CREATE TABLE IF NOT EXISTS revocations (
    seq    INTEGER PRIMARY KEY,
    kind   TEXT NOT NULL,
    value  TEXT NOT NULL,
    reason TEXT NOT NULL,
    \"by\"   TEXT NOT NULL,
    at_ms  INTEGER NOT NULL,
    result TEXT NOT NULL
);
";

/// Version 3: why a held job is held (HTCondor's `HoldReasonCode`); `NULL` unless held.
const MIGRATE_2_TO_3: &str = "
ALTER TABLE jobs ADD COLUMN hold_code INTEGER;
";

/// Version 4: job class, GPUs and disk, run attempts (one row each in `attempts`), EP losses
/// and retry backoff; decayed usage and priority factor per owner; usage per accounting
/// group; admin settings per EP name.
const MIGRATE_3_TO_4: &str = "
ALTER TABLE jobs ADD COLUMN class TEXT;
ALTER TABLE jobs ADD COLUMN gpus INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN disk_mb INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN lost INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN not_before_ms INTEGER NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS jobs_running_by_start ON jobs (started_at_ms) WHERE state = 'running';
ALTER TABLE accounts ADD COLUMN usage_decayed REAL NOT NULL DEFAULT 0;
ALTER TABLE accounts ADD COLUMN usage_at_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE accounts ADD COLUMN factor REAL NOT NULL DEFAULT 1;
CREATE TABLE IF NOT EXISTS group_usage (
    grp           TEXT PRIMARY KEY,
    core_seconds  REAL NOT NULL,
    usage_decayed REAL NOT NULL,
    usage_at_ms   INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS attempts (
    job_id        TEXT NOT NULL,
    n             INTEGER NOT NULL,
    ep            TEXT NOT NULL,
    ep_session    TEXT NOT NULL,
    started_at_ms INTEGER NOT NULL,
    ended_at_ms   INTEGER,
    outcome       TEXT NOT NULL,
    reason        TEXT NOT NULL DEFAULT '',
    usage         TEXT,
    PRIMARY KEY (job_id, n)
);
CREATE TABLE IF NOT EXISTS ep_admin (
    name        TEXT PRIMARY KEY,
    state       TEXT NOT NULL,
    deadline_ms INTEGER,
    paused      TEXT NOT NULL,
    reason      TEXT NOT NULL,
    at_ms       INTEGER NOT NULL
);
";

/// Version 5: for accounting reports ([`crate::report`]), one index over the jobs in a final
/// state, by the time they reached it, that holds everything a report reads, the function's
/// name (from the stored request; `NULL` if that does not parse) included.
const MIGRATE_4_TO_5: &str = "
CREATE INDEX IF NOT EXISTS jobs_final_by_time ON jobs (finished_at_ms, owner, grp,
    (CASE WHEN json_valid(request) THEN json_extract(request, '$.function.name') END), state, cpus, usage)
    WHERE state IN ('completed', 'failed', 'removed');
";

const RECORD_COLUMNS: &str = "id, owner, state, reason, token_jti, request, cpus, memory_mb, runtime_s, ep, \
     submitted_at_ms, started_at_ms, finished_at_ms, exit_code, usage, outputs, token_issuer, grp, annex, hold_code, \
     class, attempts, gpus, disk_mb";

/// A job to insert: the verified request and what the token says about it.
#[derive(Debug, Clone)]
pub struct NewJob {
    /// The validated request.
    pub request: SubmitRequest,
    /// The token's subject: who is accounted.
    pub owner: String,
    /// The token's id, whose uses are counted.
    pub jti: String,
    /// The token's issuer, kept for revocation.
    pub issuer: String,
    /// The token's accounting group, if any.
    pub group: Option<String>,
    /// How many jobs the token allows.
    pub jobs: u32,
    /// The token's expiry, so that its use count can be pruned after it.
    pub exp: u64,
    /// Most idle (or held) jobs the owner may have; a new job past it is refused
    /// ([`QueueError::TooManyIdle`]). `None`: unlimited.
    pub max_idle: Option<u64>,
    /// The job class the scheduler resolved for it, if classes are configured.
    pub class: Option<String>,
    /// When set, the job is accepted held with this code and reason (a hold requirement).
    pub hold: Option<(u32, String)>,
}

/// How the loss of an EP session treats its running jobs ([`Queue::lose_session`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// The EP went away or fell silent past its lease: each job counts a loss, and runs again
    /// after a backoff (`backoff_ms` × 2^(losses − 1), at most [`MAX_BACKOFF_MS`]) or, past
    /// `max_retries` losses, is held with [`HOLD_CODE_RETRIES`].
    Ep {
        /// Losses a job may have and still run again.
        max_retries: u32,
        /// Backoff before the first retry, ms.
        backoff_ms: u64,
    },
    /// The scheduler is shutting down: the jobs go back to idle, no loss counted.
    Shutdown,
}

/// Longest retry backoff, ms (one hour).
pub const MAX_BACKOFF_MS: u64 = 3_600_000;

/// What [`Queue::lose_session`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lost {
    /// Jobs idle again.
    pub requeued: Vec<String>,
    /// Jobs held for losing their EP too often.
    pub held: Vec<String>,
}

/// An owner's (or group's) usage as fair share reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageRow {
    /// Owner or group name.
    pub name: String,
    /// Decayed core-seconds as of `at_ms`.
    pub decayed: f64,
    /// When `decayed` was last brought up to date, Unix ms.
    pub at_ms: u64,
    /// Priority factor (owners; 1 for groups).
    pub factor: f64,
    /// All core-seconds ever charged.
    pub core_seconds: f64,
}

/// An EP's admin settings as stored, by name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EpAdminRow {
    /// The EP's name.
    pub name: String,
    /// Enabled, draining or disabled.
    pub state: EpAdminState,
    /// Drain deadline, Unix ms.
    pub deadline_ms: Option<u64>,
    /// Paused accounting groups.
    pub paused: Vec<String>,
    /// Why it was last changed.
    pub reason: String,
    /// When, Unix ms.
    pub at_ms: u64,
}

/// `u` core-seconds as of `at_ms`, decayed to `now_ms` with a half-life of `half_life_s`.
pub fn decay(u: f64, at_ms: u64, now_ms: u64, half_life_s: f64) -> f64 {
    if half_life_s <= 0.0 {
        return 0.0;
    }
    let dt_s = now_ms.saturating_sub(at_ms) as f64 / 1000.0;
    u * 0.5f64.powf(dt_s / half_life_s)
}

/// Answer to [`Queue::submit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// The new job's id, or the one that already had the dedupe key.
    pub job_id: String,
    /// False when the dedupe key already named a job.
    pub created: bool,
}

/// Result of [`Queue::mark_running`].
#[derive(Debug, Default)]
pub struct Marked {
    /// Jobs now running on the EP, with what to send it.
    pub assigned: Vec<JobAssignment>,
    /// Jobs that were no longer idle, or that failed at once (their stored request did not
    /// decode, or `prepare` refused it).
    pub skipped: Vec<String>,
}

/// What [`Queue::finish`] recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// The job's owner, now charged.
    pub owner: String,
    /// Its final state.
    pub state: JobState,
}

/// What [`Queue::record_revocation`] did to jobs, and the record it wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The revocation as stored and answered.
    pub revocation: Revocation,
    /// Running jobs now removed, with the EP session each runs on: they are to be stopped.
    pub stopped: Vec<(String, String)>,
}

/// What [`Queue::act`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acted {
    /// The job as it is now.
    pub record: JobRecord,
    /// The EP session it was running on, when it is to be stopped there.
    pub stop: Option<String>,
}

/// The `result` column of `revocations` (a stored format, not a wire type).
#[derive(Serialize, Deserialize)]
struct RevocationResult {
    removed_jobs: Vec<String>,
    stopped_jobs: Vec<String>,
    closed_eps: Vec<String>,
}

/// Handle on the job store; cheap to clone.
#[derive(Clone)]
pub struct Queue {
    /// The writing connection: the writer thread holds it for a whole batch; the rare writes
    /// outside the writer ([`Queue::audit_checkpoint`]) take it in between.
    conn: Arc<Mutex<Connection>>,
    /// The reading connection (WAL: reads see the last commit and never wait for a batch or its
    /// fsync, so the API and the dispatcher's reads stay fast while the writer is busy).
    read: Arc<Mutex<Connection>>,
    /// Runs every write, batched: one transaction and one commit per batch ([`Writer`]).
    writer: Arc<Writer>,
    /// What a commit waits for (the `synchronous` pragma set at open).
    durability: Durability,
    /// The file, for read-only audit queries and verification on connections of their own.
    path: PathBuf,
    /// Half-life of decayed usage, seconds ([`Queue::set_half_life`]).
    half_life_s: f64,
    /// Revoked targets, loaded at open; checked inside submit transactions and by the API.
    revoked: Arc<RwLock<Revoked>>,
    /// Bounds the records of refusals whose token did not verify ([`Queue::record_refusal`]).
    unverified_refusals: Arc<Mutex<RefusalBudget>>,
    /// Seals the macaroons of every stored request ([`crate::seal`]).
    sealer: Arc<crate::seal::Sealer>,
}

/// Most records of refusals with an unverified token per second, on average.
pub const UNVERIFIED_REFUSALS_PER_S: f64 = 20.0;
/// Most such records in a burst.
pub const UNVERIFIED_REFUSALS_BURST: f64 = 200.0;

/// A token bucket for the records of refusals whose token did not verify: anyone can send
/// those, so without a bound a flood of forged tokens would grow the trail (and its fsyncs)
/// without limit. What the bucket turns away is counted, and the next record says how many.
#[derive(Debug)]
struct RefusalBudget {
    tokens: f64,
    last: std::time::Instant,
    suppressed: u64,
}

impl RefusalBudget {
    fn new() -> RefusalBudget {
        RefusalBudget { tokens: UNVERIFIED_REFUSALS_BURST, last: std::time::Instant::now(), suppressed: 0 }
    }

    /// `Some(n)`: record this refusal, noting the `n` left unrecorded since the last one;
    /// `None`: do not (counted).
    fn take(&mut self, now: std::time::Instant) -> Option<u64> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * UNVERIFIED_REFUSALS_PER_S).min(UNVERIFIED_REFUSALS_BURST);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed = self.suppressed.saturating_add(1);
            None
        }
    }
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").finish_non_exhaustive()
    }
}

pub use htfaas_functions::store::now_ms;
use htfaas_functions::store::{db_int, exec, from_db, row};

impl Queue {
    /// [`Queue::open_with`] the default durability, [`Durability::Fsync`].
    pub fn open(path: &Path) -> Result<Queue, QueueError> {
        Queue::open_with(path, Durability::Fsync)
    }

    /// Opens (or creates) the store at `path`: WAL, `synchronous` as `durability` says (`FULL`
    /// for [`Durability::Fsync`], `NORMAL` for [`Durability::Log`]), schema migrated to
    /// [`SCHEMA_VERSION`], revocations loaded into memory, and the writer thread started. Jobs
    /// left `running` by a previous process go back to `idle` (their attempt `interrupted`, no
    /// loss counted): their EP sessions are gone. Usage decays with a half-life of one day
    /// until [`Queue::set_half_life`].
    pub fn open_with(path: &Path, durability: Durability) -> Result<Queue, QueueError> {
        Queue::open_sealed(path, durability, &crate::seal::default_key_file(path))
    }

    /// [`Queue::open_with`], with the stored macaroons sealed under the key in `seal_key_file`
    /// (created if missing); the file itself is made 0600 (with its `-wal` and `-shm`).
    pub fn open_sealed(path: &Path, durability: Durability, seal_key_file: &Path) -> Result<Queue, QueueError> {
        htfaas_functions::store::prepare_private_db(path)
            .map_err(|e| QueueError::Private(format!("make {} private: {e}", path.display())))?;
        let sealer = Arc::new(crate::seal::Sealer::load_or_create(seal_key_file)?);
        let mut conn = Connection::open(path)?;
        let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(journal_mode = %mode, "SQLite refused WAL; continuing with {mode}");
        }
        conn.pragma_update(None, "synchronous", durability.sqlite_synchronous())?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        // Every hot statement stays parsed ([`exec`]), and its plan does not depend on the
        // values bound to it: without the query planner stability guarantee the bundled
        // SQLite (built with STAT4) prepares a cached statement again whenever a bound value
        // could change its plan, which was most of the scheduler's SQL parsing.
        conn.set_prepared_statement_cache_capacity(128);
        conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
        migrate(&mut conn)?;
        audit::install(&conn, AUDIT_WRITER)?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let open: Vec<(String, u32, String, String)> = {
            let mut stmt = tx.prepare_cached(
                "SELECT a.job_id, a.n, a.ep, a.ep_session FROM attempts a WHERE a.ended_at_ms IS NULL ORDER BY a.job_id",
            )?;
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?.collect::<Result<_, _>>()?
        };
        exec(
            &tx,
            "UPDATE attempts SET outcome = 'interrupted', reason = 'the scheduler restarted', ended_at_ms = ?1 \
             WHERE ended_at_ms IS NULL",
            params![db_int(now_ms())],
        )?;
        let requeued = exec(
            &tx,
            "UPDATE jobs SET state = 'idle', ep = NULL, ep_session = NULL, started_at_ms = NULL \
             WHERE state = 'running'",
            [],
        )?;
        for (id, n, ep, session) in open {
            if let Some(subject) = job_subject(&tx, &id)? {
                let then = if subject_state(&tx, &id)?.as_deref() == Some("idle") { "requeued" } else { "kept" };
                audit::append_in(
                    &tx,
                    AuditDraft::attempt_lost(subject, &ep, &session, n, "the scheduler restarted", then),
                )?;
            }
        }
        let sealed = seal_stored(&tx, &sealer)?;
        tx.commit()?;
        if requeued > 0 {
            tracing::info!(jobs = requeued, "jobs left running by the previous process are idle again");
        }
        if sealed > 0 {
            tracing::info!(jobs = sealed, "sealed the macaroons an older build stored in plain");
        }
        let mut revoked = Revoked::default();
        for r in read_revocations(&conn)? {
            revoked.insert(r.target, r.reason);
        }
        let read = Connection::open_with_flags(
            path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        read.busy_timeout(std::time::Duration::from_secs(5))?;
        read.set_prepared_statement_cache_capacity(128);
        read.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
        let conn = Arc::new(Mutex::new(conn));
        let writer = Writer::start(conn.clone())?;
        Ok(Queue {
            conn,
            read: Arc::new(Mutex::new(read)),
            writer: Arc::new(writer),
            durability,
            path: path.to_owned(),
            half_life_s: 86_400.0,
            revoked: Arc::new(RwLock::new(revoked)),
            unverified_refusals: Arc::new(Mutex::new(RefusalBudget::new())),
            sealer,
        })
    }

    /// Sets the half-life with which usage decays (charged from now on).
    pub fn set_half_life(&mut self, half_life_s: u64) {
        self.half_life_s = half_life_s as f64;
    }

    /// The half-life of decayed usage, seconds.
    pub fn half_life_s(&self) -> f64 {
        self.half_life_s
    }

    /// Why `c` is revoked, if it is (O(1), in memory).
    pub fn revoked_reason(&self, c: &Credential) -> Option<String> {
        self.revoked.read().unwrap_or_else(|p| p.into_inner()).reason_for(c).map(str::to_owned)
    }

    /// From now on, credentials named by `target` are refused (in memory only:
    /// [`Queue::record_revocation`] makes it durable).
    pub fn block(&self, target: RevocationTarget, reason: String) {
        self.revoked.write().unwrap_or_else(|p| p.into_inner()).insert(target, reason);
    }

    /// The durability the store was opened with.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Test hook, not configuration: caps the store's file at `pages` pages of the connection
    /// (SQLite's `PRAGMA max_page_count`, never below the pages in use; `None`: SQLite's
    /// default, about 2^32 pages) so that a test can fill the "disk" for real and free it
    /// again. Returns the cap now in force.
    #[doc(hidden)]
    pub async fn set_max_page_count(&self, pages: Option<u64>) -> Result<u64, QueueError> {
        let pages = i64::try_from(pages.unwrap_or(u64::from(u32::MAX) - 1)).unwrap_or(i64::MAX);
        self.call_writing(move |conn| {
            let cap: i64 = conn.pragma_update_and_check(None, "max_page_count", pages, |r| r.get(0))?;
            Ok(from_db(cap))
        })
        .await
    }

    /// Test hook, not configuration: moves the dispatch time of running job `id` back by
    /// `ms`, as if it had run that long, so that a test may report hours of usage without
    /// waiting for them ([`crate::doubt`] clamps a report to the time the scheduler saw).
    #[doc(hidden)]
    pub async fn backdate_start(&self, id: String, ms: u64) -> Result<(), QueueError> {
        self.write(move |tx| {
            exec(
                tx,
                "UPDATE jobs SET started_at_ms = started_at_ms - ?2 WHERE id = ?1 AND state = 'running'",
                params![id, db_int(ms)],
            )?;
            Ok(())
        })
        .await
    }

    /// Pages the store's file holds now (`PRAGMA page_count`).
    #[doc(hidden)]
    pub async fn page_count(&self) -> Result<u64, QueueError> {
        self.call_writing(|conn| Ok(from_db(conn.query_row("PRAGMA page_count", [], |r| r.get(0))?))).await
    }

    /// How many batches of writes the writer has run (committed or not) since the queue was opened.
    pub fn write_batches(&self) -> u64 {
        self.writer.batches.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Runs the write `f` on the writer thread, inside the transaction of a batch and a
    /// savepoint of its own, and answers once that batch is committed: `f`'s own error (its
    /// savepoint rolled back, the rest of the batch unaffected), or [`QueueError::Batch`] when
    /// the batch as a whole could not be committed. Cancelling the returned future does not
    /// cancel the write.
    async fn write<T, F>(&self, f: F) -> Result<T, QueueError>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> Result<T, QueueError> + Send + 'static,
    {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let request: Box<dyn PendingWrite> = Box::new(WriteRequest { f: Some(f), result: None, reply });
        let sender = self.writer.sender.as_ref().ok_or_else(|| QueueError::Task(WRITER_GONE.into()))?;
        sender.send(request).map_err(|_| QueueError::Task(WRITER_GONE.into()))?;
        answer.await.map_err(|_| QueueError::Task(WRITER_GONE.into()))?.map_err(QueueError::classified)
    }

    /// Runs `f` on the connection in a blocking task.
    /// Runs `f` on the reading connection, off the async threads. Reads only: SQLite refuses a
    /// write there.
    async fn call<T, F>(&self, f: F) -> Result<T, QueueError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, QueueError> + Send + 'static,
    {
        Self::on(self.read.clone(), f).await
    }

    /// Runs `f` on the writing connection, between the writer's batches.
    async fn call_writing<T, F>(&self, f: F) -> Result<T, QueueError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, QueueError> + Send + 'static,
    {
        Self::on(self.conn.clone(), f).await
    }

    async fn on<T, F>(conn: Arc<Mutex<Connection>>, f: F) -> Result<T, QueueError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, QueueError> + Send + 'static,
    {
        tokio::task::spawn_blocking(move || {
            let mut guard = conn.lock().map_err(|_| QueueError::Poisoned)?;
            f(&mut guard)
        })
        .await
        .map_err(|e| QueueError::Task(e.to_string()))?
    }

    /// In one transaction: refuses a revoked token, returns the job that already has
    /// `(owner, dedupe_key)`, or refuses a used-up token, or refuses when the owner already has
    /// `max_idle` idle or held jobs (counting no use), or counts a use of the token and inserts
    /// the job as idle. Every refusal rolls the whole transaction back.
    pub async fn submit(&self, job: NewJob) -> Result<Submitted, QueueError> {
        let revoked = self.revoked.clone();
        // What the file keeps: the request with its macaroons sealed.
        let stored = serde_json::to_string(&self.sealer.seal_request(&job.request)?)?;
        self.write(move |tx| {
            // Checked on the writer, which runs every write in turn: a revocation made meanwhile
            // either is seen here or is written after this job, and removes it.
            let credential =
                Credential { jti: job.jti.clone(), owner: Some(job.owner.clone()), issuer: job.issuer.clone() };
            let reason = revoked.read().unwrap_or_else(|p| p.into_inner()).reason_for(&credential).map(str::to_owned);
            if let Some(reason) = reason {
                return Err(QueueError::Revoked { reason });
            }
            let existing: Option<String> = tx
                .query_row(
                    "SELECT id FROM jobs WHERE owner = ?1 AND dedupe_key = ?2",
                    params![job.owner, job.request.dedupe_key],
                    |r| r.get(0),
                )
                .optional()?;
            if let Some(job_id) = existing {
                return Ok(Submitted { job_id, created: false });
            }
            let uses = token_uses(tx, &job.jti)?;
            if uses >= u64::from(job.jobs) {
                return Err(QueueError::TokenUsed { uses, jobs: job.jobs });
            }
            if let Some(max) = job.max_idle {
                // Under the connection lock, like the use count: concurrent submits see each
                // other's inserts, so the owner never exceeds the limit.
                let idle: i64 = row(
                    tx,
                    "SELECT COUNT(*) FROM jobs WHERE owner = ?1 AND state IN ('idle', 'held')",
                    params![job.owner],
                    |r| r.get(0),
                )?;
                let idle = from_db(idle);
                if idle >= max {
                    return Err(QueueError::TooManyIdle { owner: job.owner, idle, max });
                }
            }
            exec(
                tx,
                "INSERT INTO token_uses (jti, uses, exp) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (jti) DO UPDATE SET uses = excluded.uses",
                params![job.jti, db_int(uses + 1), db_int(job.exp)],
            )?;
            let job_id = uuid::Uuid::new_v4().to_string();
            let r = job.request.resources;
            let (state, hold_code, reason) = match &job.hold {
                Some((code, reason)) => ("held", Some(*code), reason.as_str()),
                None => ("idle", None, ""),
            };
            exec(
                tx,
                "INSERT INTO jobs (id, owner, dedupe_key, state, token_jti, request, cpus, memory_mb, \
                 runtime_s, submitted_at_ms, token_issuer, grp, annex, class, gpus, disk_mb, hold_code, reason) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)",
                params![
                    job_id,
                    job.owner,
                    job.request.dedupe_key,
                    state,
                    job.jti,
                    stored,
                    r.cpus,
                    db_int(r.memory_mb),
                    db_int(r.runtime_s),
                    db_int(now_ms()),
                    job.issuer,
                    job.group,
                    job.request.annex,
                    job.class,
                    r.gpus,
                    db_int(r.disk_mb),
                    hold_code,
                    reason,
                ],
            )?;
            let req = &job.request;
            let subject = Subject {
                job: Some(job_id.clone()),
                token_jti: Some(job.jti.clone()),
                owner: Some(job.owner.clone()),
                function: Some(req.function.name.clone()),
                digest: Some(req.function.digest.as_str().to_owned()),
                event_id: Some(req.event.id.clone()),
                paths: vec![req.event.path.clone()],
            };
            let accepted = AuditDraft::job_accepted(subject.clone(), &r, job.group.as_deref())
                .with_detail("token_issuer", job.issuer.clone().into())
                .with_detail("function_version", req.function.version.into())
                .with_detail(
                    "event",
                    serde_json::json!({
                        "source": req.event.source, "id": req.event.id, "path": req.event.path,
                        "caused_by": req.event.caused_by,
                    }),
                )
                .with_detail("input", serde_json::json!({ "path": req.event.path, "url": req.input.url }))
                .with_detail("output", serde_json::json!({ "dir": url_path(&req.output.url), "url": req.output.url }))
                .with_detail("class", serde_json::json!(job.class))
                .with_detail("annex", serde_json::json!(req.annex))
                .with_detail("dedupe_key", req.dedupe_key.clone().into());
            audit::append_in(tx, accepted)?;
            if let Some((code, reason)) = &job.hold {
                audit::append_in(tx, AuditDraft::job_held(subject, reason, Some(i64::from(*code))))?;
            }
            Ok(Submitted { job_id, created: true })
        })
        .await
    }

    /// Records a refused submission (`job.refused`, with the HTTP `status` answered and the
    /// `reason`) in a transaction of its own: a refusal changes nothing else in the store.
    /// `subject` holds what is known (the verified token's `jti` and owner, the request's
    /// function and event); `detail` adds facts (an object). A refusal whose token did not
    /// verify (`subject.owner` unset) is recorded within a budget of
    /// [`UNVERIFIED_REFUSALS_PER_S`] (burst [`UNVERIFIED_REFUSALS_BURST`]); beyond it, it is
    /// counted instead, and the next such record carries `"unrecorded_before": n`. Returns
    /// whether a record was written.
    pub async fn record_refusal(
        &self,
        subject: Subject,
        status: u16,
        reason: String,
        detail: serde_json::Map<String, serde_json::Value>,
    ) -> Result<bool, QueueError> {
        let unrecorded_before = if subject.owner.is_none() {
            let mut budget = self.unverified_refusals.lock().map_err(|_| QueueError::Poisoned)?;
            match budget.take(std::time::Instant::now()) {
                Some(n) => n,
                None => return Ok(false),
            }
        } else {
            0
        };
        self.write(move |tx| {
            let mut draft = AuditDraft::job_refused(subject, status, &reason);
            for (k, v) in detail {
                draft = draft.with_detail(&k, v);
            }
            if unrecorded_before > 0 {
                draft = draft.with_detail("unrecorded_before", unrecorded_before.into());
            }
            audit::append_in(tx, draft)?;
            Ok(true)
        })
        .await
    }

    /// Signs a checkpoint of the audit trail's head with `signer` when `policy` says one is
    /// due, or (`force`, at shutdown) whenever the head has none.
    pub async fn audit_checkpoint(
        &self,
        signer: Arc<AuditSigner>,
        policy: CheckpointPolicy,
        force: bool,
    ) -> Result<Option<Checkpoint>, QueueError> {
        self.call_writing(move |conn| Ok(audit::checkpoint_in(conn, &signer, policy, force)?)).await
    }

    /// The store's file (the audit trail is in it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many jobs the token `jti` has submitted (for preflight; changes nothing).
    pub async fn uses(&self, jti: String) -> Result<u64, QueueError> {
        self.call(move |conn| Ok(token_uses(conn, &jti)?)).await
    }

    /// For each pool of attached EPs with room (an annex, or none, and an owner restriction, or
    /// none), each owner's oldest idle jobs that pool may take and that fit within its room
    /// (at most `min(BATCH, the pool's free cores)` per owner, as no more could start), oldest
    /// first, without duplicates. Reading per owner is what lets fair share work: one owner's
    /// flood of a million jobs fills only that owner's share of the batch, and every other
    /// owner's oldest jobs are read in the same round. The owners with idle jobs are found by
    /// skip-scanning the `(annex, owner, seq)` index (one seek per owner, whatever the queue's
    /// length); at most [`MAX_OWNERS_PER_POOL`] of them per pool, best `priority` first (lower
    /// is better; an owner without an entry counts as 0). Jobs of `skip_owners` (at their running
    /// limit) and jobs in retry backoff (until `not_before_ms`) are not read.
    /// [`crate::matching::select`] makes the final decision.
    pub async fn idle_candidates(
        &self,
        pools: Vec<PoolRoom>,
        skip_owners: Vec<String>,
        priority: HashMap<String, f64>,
        now_ms: u64,
    ) -> Result<Vec<IdleJob>, QueueError> {
        self.call(move |conn| {
            let skip: HashSet<String> = skip_owners.into_iter().collect();
            let mut seen = std::collections::BTreeMap::new();
            let mut owners_stmt = conn.prepare_cached(
                "WITH RECURSIVE o(owner) AS ( \
                   SELECT (SELECT owner FROM jobs WHERE state = 'idle' AND annex IS ?1 ORDER BY owner LIMIT 1) \
                   UNION ALL \
                   SELECT (SELECT owner FROM jobs WHERE state = 'idle' AND annex IS ?1 AND owner > o.owner \
                           ORDER BY owner LIMIT 1) FROM o WHERE o.owner IS NOT NULL) \
                 SELECT owner FROM o WHERE owner IS NOT NULL LIMIT ?2",
            )?;
            let mut jobs_stmt = conn.prepare_cached(
                "SELECT seq, id, owner, annex, cpus, memory_mb, runtime_s, grp, gpus, disk_mb FROM jobs \
                 WHERE state = 'idle' AND annex IS ?1 AND owner = ?2 \
                 AND cpus <= ?3 AND memory_mb <= ?4 AND runtime_s <= ?5 AND gpus <= ?6 AND disk_mb <= ?7 \
                 AND not_before_ms <= ?8 ORDER BY seq LIMIT ?9",
            )?;
            for PoolRoom { pool, room, free_cpus } in &pools {
                let mut owners: Vec<String> = match &pool.owner {
                    Some(o) => vec![o.clone()],
                    None => owners_stmt
                        .query_map(params![pool.annex, db_int(MAX_OWNERS_SCANNED)], |r| r.get(0))?
                        .collect::<Result<_, _>>()?,
                };
                owners.retain(|o| !skip.contains(o));
                let key = |o: &String| priority.get(o).copied().unwrap_or(0.0);
                owners.sort_by(|a, b| key(a).total_cmp(&key(b)).then_with(|| a.cmp(b)));
                owners.truncate(MAX_OWNERS_PER_POOL);
                let per_owner = i64::from((*free_cpus).min(u32::try_from(BATCH).unwrap_or(u32::MAX)));
                for owner in &owners {
                    let rows = jobs_stmt.query_map(
                        params![
                            pool.annex,
                            owner,
                            room.cpus,
                            db_int(room.memory_mb),
                            db_int(room.runtime_s),
                            room.gpus,
                            db_int(room.disk_mb),
                            db_int(now_ms),
                            per_owner
                        ],
                        |r| {
                            Ok((
                                r.get::<_, i64>(0)?,
                                IdleJob {
                                    id: r.get(1)?,
                                    owner: r.get(2)?,
                                    annex: r.get(3)?,
                                    group: r.get(7)?,
                                    resources: Resources {
                                        cpus: r.get(4)?,
                                        memory_mb: from_db(r.get(5)?),
                                        runtime_s: from_db(r.get(6)?),
                                        gpus: r.get(8)?,
                                        disk_mb: from_db(r.get(9)?),
                                    },
                                },
                            ))
                        },
                    )?;
                    for row in rows {
                        let (seq, job) = row?;
                        seen.insert(seq, job);
                    }
                }
            }
            Ok(seen.into_values().collect())
        })
        .await
    }

    /// In one transaction: marks each job that is still idle as running on EP session
    /// `ep_session` (named `ep_name`), and returns what to send for it, as `prepare` made it
    /// from the stored assignment and the request's `bind_ep_address`. A job whose stored
    /// request does not decode, or that `prepare` refuses (with the reason to record), fails
    /// at once: it is neither sent nor retried.
    pub async fn mark_running<F>(
        &self,
        job_ids: Vec<String>,
        ep_name: String,
        ep_session: String,
        prepare: F,
    ) -> Result<Marked, QueueError>
    where
        F: Fn(JobAssignment, bool) -> Result<JobAssignment, String> + Send + 'static,
    {
        let sealer = self.sealer.clone();
        self.write(move |tx| {
            let mut marked = Marked::default();
            let started = db_int(now_ms());
            for id in job_ids {
                let row: Option<(String, String, String, u32)> = tx
                    .prepare_cached(
                        "SELECT request, owner, token_jti, attempts FROM jobs WHERE id = ?1 AND state = 'idle'",
                    )?
                    .query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                    .optional()?;
                let Some((request, owner, jti, attempts)) = row else {
                    marked.skipped.push(id);
                    continue;
                };
                let mut subject =
                    Subject { job: Some(id.clone()), token_jti: Some(jti), owner: Some(owner), ..Subject::default() };
                let parsed = serde_json::from_str::<SubmitRequest>(&request)
                    .map_err(|e| format!("stored request is corrupt: {e}"))
                    .and_then(|r| sealer.open_request(r).map_err(|e| e.to_string()));
                if let Ok(r) = &parsed {
                    subject.function = Some(r.function.name.clone());
                    subject.digest = Some(r.function.digest.as_str().to_owned());
                    subject.event_id = Some(r.event.id.clone());
                    subject.paths = vec![r.event.path.clone()];
                }
                let prepared = parsed.and_then(|r| {
                    let bind = r.bind_ep_address;
                    prepare(assignment(id.clone(), r), bind)
                });
                match prepared {
                    Ok(a) => {
                        exec(
                            tx,
                            "UPDATE jobs SET state = 'running', ep = ?2, ep_session = ?3, started_at_ms = ?4, \
                             attempts = attempts + 1, not_before_ms = 0 WHERE id = ?1 AND state = 'idle'",
                            params![id, ep_name, ep_session, started],
                        )?;
                        exec(
                            tx,
                            "INSERT OR REPLACE INTO attempts (job_id, n, ep, ep_session, started_at_ms, outcome) \
                             SELECT id, attempts, ?2, ?3, ?4, 'running' FROM jobs WHERE id = ?1",
                            params![id, ep_name, ep_session, started],
                        )?;
                        let attempt = attempts.saturating_add(1);
                        audit::append_in(tx, AuditDraft::job_dispatched(subject, &ep_name, &ep_session, attempt))?;
                        marked.assigned.push(a);
                    }
                    Err(reason) => {
                        tracing::error!(job.id = %id, "failing the job: {reason}");
                        exec(
                            tx,
                            "UPDATE jobs SET state = 'failed', reason = ?2, finished_at_ms = ?3 WHERE id = ?1",
                            params![id, reason, started],
                        )?;
                        let detail = serde_json::json!({ "state": "failed", "reason": reason, "outcome": null });
                        audit::append_in(tx, AuditDraft::new(audit::AuditKind::JobFinished, subject, detail))?;
                        marked.skipped.push(id);
                    }
                }
            }
            Ok(marked)
        })
        .await
    }

    /// Puts jobs that are running on `ep_session` back to idle (an Assign that could not be
    /// sent). Returns how many changed.
    pub async fn revert_to_idle(&self, job_ids: Vec<String>, ep_session: String) -> Result<usize, QueueError> {
        self.write(move |tx| {
            let mut n = 0;
            for id in job_ids {
                let attempt: Option<(u32, String)> = tx
                    .query_row(
                        "SELECT attempts, COALESCE(ep, '') FROM jobs WHERE id = ?1 AND state = 'running' \
                         AND ep_session = ?2",
                        params![id, ep_session],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()?;
                // Never sent: the attempt did not happen.
                exec(
                    tx,
                    "DELETE FROM attempts WHERE job_id = ?1 AND ep_session = ?2 AND ended_at_ms IS NULL",
                    params![id, ep_session],
                )?;
                let changed = exec(
                    tx,
                    "UPDATE jobs SET state = 'idle', ep = NULL, ep_session = NULL, started_at_ms = NULL, \
                     attempts = MAX(attempts - 1, 0) WHERE id = ?1 AND state = 'running' AND ep_session = ?2",
                    params![id, ep_session],
                )?;
                if let (1, Some((n, ep)), Some(subject)) = (changed, attempt, job_subject(tx, &id)?) {
                    let why = "the Assign could not be sent: the EP left";
                    audit::append_in(tx, AuditDraft::attempt_lost(subject, &ep, &ep_session, n, why, "requeued"))?;
                }
                n += changed;
            }
            Ok(n)
        })
        .await
    }

    /// In one transaction: every job running on `ep_session` loses it, as `loss` says (see
    /// [`Loss`]); its attempt ends `lost` (or `interrupted` at shutdown) with `why`. Jobs held or
    /// removed while running there keep their state; their attempt ends the same way.
    pub async fn lose_session(&self, ep_session: String, loss: Loss, why: String) -> Result<Lost, QueueError> {
        self.write(move |tx| {
            let now = now_ms();
            let outcome = match loss {
                Loss::Ep { .. } => "lost",
                Loss::Shutdown => "interrupted",
            };
            let ended: Vec<(String, u32, String)> = {
                let mut stmt = tx.prepare_cached(
                    "SELECT job_id, n, ep FROM attempts WHERE ep_session = ?1 AND ended_at_ms IS NULL ORDER BY job_id",
                )?;
                stmt.query_map(params![ep_session], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                    .collect::<Result<_, _>>()?
            };
            exec(
                tx,
                "UPDATE attempts SET outcome = ?2, reason = ?3, ended_at_ms = ?4 \
                 WHERE ep_session = ?1 AND ended_at_ms IS NULL",
                params![ep_session, outcome, why, db_int(now)],
            )?;
            let running: Vec<(String, u32, Option<String>)> = {
                let mut stmt =
                    tx.prepare_cached("SELECT id, lost, ep FROM jobs WHERE state = 'running' AND ep_session = ?1")?;
                stmt.query_map(params![ep_session], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                    .collect::<Result<_, _>>()?
            };
            let mut out = Lost::default();
            let mut held_reasons = HashMap::new();
            for (id, lost, ep) in running {
                let ep = ep.as_deref().unwrap_or("?");
                let hold = |times: u32, max: u32| {
                    let reason = format!("lost its EP {times} times (last: {ep}: {why}); the retry limit is {max}");
                    (HOLD_CODE_RETRIES, reason)
                };
                match requeue_or_hold(tx, &id, lost, loss, now, hold)? {
                    AfterLoss::Requeued => out.requeued.push(id),
                    AfterLoss::Held { reason, .. } => {
                        held_reasons.insert(id.clone(), reason);
                        out.held.push(id);
                    }
                }
            }
            for (id, n, ep) in ended {
                let Some(subject) = job_subject(tx, &id)? else { continue };
                let then = match (held_reasons.get(&id), out.requeued.contains(&id), loss) {
                    (Some(_), _, _) => "held",
                    (None, true, Loss::Shutdown) => "interrupted",
                    (None, true, _) => "requeued",
                    (None, false, _) => "kept",
                };
                audit::append_in(tx, AuditDraft::attempt_lost(subject.clone(), &ep, &ep_session, n, &why, then))?;
                if let Some(reason) = held_reasons.get(&id) {
                    let code = Some(i64::from(HOLD_CODE_RETRIES));
                    audit::append_in(tx, AuditDraft::job_held(subject, reason, code))?;
                }
            }
            Ok(out)
        })
        .await
    }

    /// In one transaction: if the report's job is running on `ep_session`, records its end and
    /// charges its owner. If it was removed or held while running there (a revocation, an
    /// admin's remove or hold) and is reported for the first time, records and charges its
    /// usage but keeps its state and reason.
    /// `None` otherwise (unknown, finished, requeued meanwhile, reported twice).
    ///
    /// A running job reported [`Outcome::StorageUnavailable`] lost its attempt through no fault
    /// of its own: its attempt ends `storage-unavailable`, its usage is charged (it held the
    /// slot) without counting it completed or failed, and `loss` decides what follows, exactly
    /// as for a job whose EP went away ([`Queue::lose_session`]): idle again after the backoff,
    /// or held past the retry limit, with [`HOLD_CODE_STORAGE`] and a reason naming the
    /// storage failure.
    pub async fn finish(
        &self,
        ep_session: String,
        mut report: JobReport,
        loss: Loss,
    ) -> Result<Option<Finished>, QueueError> {
        let self_half_life = self.half_life_s;
        self.write(move |tx| {
            // owner, cpus, state, group, EP name, losses so far, attempts, started, memory, request.
            type Row = (String, u32, String, Option<String>, Option<String>, u32, u32, Option<i64>, i64, String);
            let row: Option<Row> = tx
                .query_row(
                    "SELECT owner, cpus, state, grp, ep, lost, attempts, started_at_ms, memory_mb, request \
                     FROM jobs WHERE id = ?1 AND ep_session = ?2 \
                     AND (state = 'running' OR (state IN ('removed', 'held') AND usage IS NULL))",
                    params![report.job_id, ep_session],
                    |r| {
                        Ok((
                            r.get(0)?,
                            r.get(1)?,
                            r.get(2)?,
                            r.get(3)?,
                            r.get(4)?,
                            r.get(5)?,
                            r.get(6)?,
                            r.get(7)?,
                            r.get(8)?,
                            r.get(9)?,
                        ))
                    },
                )
                .optional()?;
            let Some((owner, cpus, stored, group, ep, lost, attempt, started, memory_mb, request)) = row else {
                return Ok(None);
            };
            let ep = ep.unwrap_or_else(|| ep_session.clone());
            let subject = job_subject(tx, &report.job_id)?.unwrap_or_default();
            let job = Reported { owner: &owner, group: group.as_deref(), cpus, lost, ep: &ep, ep_session: &ep_session };
            // The EP's word is doubted before anything of it is recorded (crate::doubt).
            let output_dir = serde_json::from_str::<SubmitRequest>(&request)
                .map(|r| url_path(&r.output.url))
                .unwrap_or_else(|_| "/nonexistent/".into());
            let seen = Observed {
                started_at_ms: started.map(from_db),
                now_ms: now_ms(),
                cpus,
                memory_mb: from_db(memory_mb),
                output_dir,
            };
            let clamped = match doubt(&mut report, &seen) {
                Ok(clamped) => clamped,
                Err(violation) => {
                    let state = refuse_report(tx, &job, &stored, attempt, &report, subject, &violation, loss)?;
                    return Ok(Some(Finished { owner, state }));
                }
            };
            if let (true, Outcome::Cancelled { .. }) = (stored == "running", &report.outcome) {
                let state = returned(tx, &job, attempt, &report, subject, loss)?;
                return Ok(Some(Finished { owner, state }));
            }
            if stored == "running" && report.outcome.is_transient() {
                let state = storage_unavailable(tx, &job, report, subject, loss, self_half_life)?;
                return Ok(Some(Finished { owner, state }));
            }
            let state = match (stored.as_str(), report.outcome.is_success()) {
                ("removed", _) => JobState::Removed,
                ("held", _) => JobState::Held,
                (_, true) => JobState::Completed,
                (_, false) => JobState::Failed,
            };
            let exit_code = match report.outcome {
                Outcome::Exited { exit_code } => Some(exit_code),
                _ => None,
            };
            // A removed or held job keeps the reason and end time its removal or hold gave it.
            let (reason, finished_at) = match state {
                JobState::Removed | JobState::Held => (None, None),
                _ => (Some(report.outcome.reason()), Some(db_int(now_ms()))),
            };
            let u = report.usage;
            exec(
                tx,
                "UPDATE jobs SET state = ?2, reason = COALESCE(?3, reason), exit_code = ?4, usage = ?5, \
                 outputs = ?6, log = ?7, finished_at_ms = COALESCE(?8, finished_at_ms) WHERE id = ?1",
                params![
                    report.job_id,
                    state.as_str(),
                    reason,
                    exit_code,
                    serde_json::to_string(&u)?,
                    serde_json::to_string(&report.outputs)?,
                    bounded_log(report.log),
                    finished_at,
                ],
            )?;
            let now = now_ms();
            let outcome = match state {
                JobState::Completed => "completed",
                JobState::Failed => "failed",
                _ => "stopped",
            };
            let attempt_reason = if state == JobState::Completed { String::new() } else { report.outcome.reason() };
            exec(
                tx,
                "UPDATE attempts SET outcome = ?3, reason = ?4, usage = ?5, ended_at_ms = ?6 \
                 WHERE job_id = ?1 AND ep_session = ?2 AND ended_at_ms IS NULL",
                params![report.job_id, ep_session, outcome, attempt_reason, serde_json::to_string(&u)?, db_int(now)],
            )?;
            let core_s = charge_owner(tx, &owner, group.as_deref(), cpus, state, &u, now, self_half_life)?;
            // What the EP did, in one record: the input it read, the outputs it stored, how it ended.
            let ran = matches!(
                report.outcome,
                Outcome::Exited { .. }
                    | Outcome::Trapped { .. }
                    | Outcome::MemoryExceeded { .. }
                    | Outcome::TimeExceeded { .. }
                    | Outcome::OutputFailed { .. }
            );
            let input = subject.paths.first().filter(|_| ran || u.bytes_in > 0).cloned();
            let input = input.as_deref().map(|path| (path, u.bytes_in));
            let mut finished = AuditDraft::job_finished(subject, &ep, input, &report.outputs, &report.outcome, &u)
                .with_detail("state", state.as_str().into())
                .with_detail("exit_code", serde_json::json!(exit_code))
                .with_detail("core_ms", serde_json::json!((core_s * 1000.0).round().max(0.0) as u64));
            if !clamped.is_empty() {
                // What the EP claimed, beside what was charged.
                finished = finished.with_detail("clamped", clamped.to_json());
            }
            audit::append_in(tx, finished)?;
            Ok(Some(Finished { owner, state }))
        })
        .await
    }

    /// In one transaction: every idle, running or held job whose submit token `target` names
    /// becomes `removed` with the reason `token revoked: <reason>` (running ones keep their
    /// session, so that their late report is still charged), and the revocation is recorded with what it
    /// did (`closed_eps` is the caller's part).
    pub async fn record_revocation(
        &self,
        target: RevocationTarget,
        reason: String,
        by: String,
        closed_eps: Vec<String>,
    ) -> Result<Recorded, QueueError> {
        self.write(move |tx| {
            let at_ms = now_ms();
            let job_reason = QueueError::Revoked { reason: reason.clone() }.to_string();
            let mut result = RevocationResult { removed_jobs: vec![], stopped_jobs: vec![], closed_eps };
            let mut stopped = Vec::new();
            let mut removals = Vec::new();
            for (id, state, session) in active_jobs_named_by(tx, &target)? {
                exec(
                    tx,
                    "UPDATE jobs SET state = 'removed', reason = ?2, hold_code = NULL, finished_at_ms = ?3 \
                     WHERE id = ?1",
                    params![id, job_reason, db_int(at_ms)],
                )?;
                if let Some(subject) = job_subject(tx, &id)? {
                    removals.push(AuditDraft::job_removed(subject, &job_reason, &state).with_actor(by.clone()));
                }
                match (state.as_str(), session) {
                    ("running", Some(session)) => {
                        result.stopped_jobs.push(id.clone());
                        stopped.push((id, session));
                    }
                    _ => result.removed_jobs.push(id),
                }
            }
            let (kind, value) = target_parts(&target);
            exec(
                tx,
                "INSERT INTO revocations (kind, value, reason, \"by\", at_ms, result) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![kind, value, reason, by, db_int(at_ms), serde_json::to_string(&result)?],
            )?;
            let RevocationResult { removed_jobs, stopped_jobs, closed_eps } = result;
            let revocation = Revocation { target, reason, by, at_ms, removed_jobs, stopped_jobs, closed_eps };
            audit::append_in(tx, AuditDraft::token_revoked(&revocation))?;
            for draft in removals {
                audit::append_in(tx, draft)?;
            }
            Ok(Recorded { revocation, stopped })
        })
        .await
    }

    /// In one transaction: applies an admin's `action` to job `id` (see [`Action`] for what each
    /// does to which state) and returns the updated record, with the EP session to stop it on
    /// when it was running. [`QueueError::JobNotFound`] for an unknown id,
    /// [`QueueError::Conflict`] when the job's state does not allow the action.
    #[cfg(test)]
    pub(crate) async fn act(&self, id: String, action: Action, reason: String) -> Result<Acted, QueueError> {
        self.act_by(id, action, reason, "admin".into()).await
    }

    /// [`Queue::act`] by `actor` (recorded in the audit trail).
    pub async fn act_by(&self, id: String, action: Action, reason: String, actor: String) -> Result<Acted, QueueError> {
        self.write(move |tx| {
            let row: Option<(String, Option<String>)> = tx
                .query_row("SELECT state, ep_session FROM jobs WHERE id = ?1", params![id], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()?;
            let Some((stored, session)) = row else {
                return Err(QueueError::JobNotFound { id });
            };
            let state = JobState::parse(&stored)
                .ok_or_else(|| QueueError::Corrupt { id: id.clone(), reason: format!("state: {stored:?}") })?;
            let conflict = |only: &str| {
                QueueError::Conflict(format!(
                    "job {id} is {}; only {only} jobs can be {}",
                    state.as_str(),
                    action.done()
                ))
            };
            match (action, state) {
                (Action::Hold, JobState::Idle | JobState::Running) => {
                    exec(
                        tx,
                        "UPDATE jobs SET state = 'held', reason = ?2, hold_code = ?3 WHERE id = ?1",
                        params![id, reason, HOLD_CODE_BY_ADMIN],
                    )?;
                }
                (Action::Hold, JobState::Held) => {
                    return Err(QueueError::Conflict(format!("job {id} is already held")));
                }
                (Action::Hold, _) => return Err(conflict("idle or running")),
                (Action::Release, JobState::Held) => {
                    // A fresh start: what the stopped attempt left is forgotten (it was charged
                    // if it reported while held).
                    exec(
                        tx,
                        "UPDATE jobs SET state = 'idle', reason = '', hold_code = NULL, ep = NULL, \
                         ep_session = NULL, started_at_ms = NULL, finished_at_ms = NULL, exit_code = NULL, \
                         usage = NULL, outputs = NULL, log = NULL, lost = 0, not_before_ms = 0 WHERE id = ?1",
                        params![id],
                    )?;
                }
                (Action::Release, _) => return Err(conflict("held")),
                (Action::Remove, JobState::Idle | JobState::Running | JobState::Held) => {
                    exec(
                        tx,
                        "UPDATE jobs SET state = 'removed', reason = ?2, hold_code = NULL, finished_at_ms = ?3 \
                         WHERE id = ?1",
                        params![id, format!("removed by admin: {reason}"), db_int(now_ms())],
                    )?;
                }
                (Action::Remove, _) => return Err(conflict("idle, running or held")),
            }
            let record = tx
                .query_row(&format!("SELECT {RECORD_COLUMNS} FROM jobs WHERE id = ?1"), params![id], raw_record)?
                .decode()?;
            let subject = job_subject(tx, &id)?.unwrap_or_default();
            let draft = match action {
                Action::Hold => AuditDraft::job_held(subject, &reason, Some(i64::from(HOLD_CODE_BY_ADMIN)))
                    .with_detail("state", state.as_str().into()),
                Action::Release => AuditDraft::job_released(subject, &reason),
                Action::Remove => AuditDraft::job_removed(subject, &record.reason, state.as_str()),
            };
            audit::append_in(tx, draft.with_actor(actor))?;
            let stop = if state == JobState::Running && action != Action::Release { session } else { None };
            Ok(Acted { record, stop })
        })
        .await
    }

    /// Every recorded revocation, oldest first.
    pub async fn revocations(&self) -> Result<Vec<Revocation>, QueueError> {
        self.call(|conn| read_revocations(conn)).await
    }

    /// The newest `limit` jobs, newest first.
    pub async fn list(&self, limit: usize) -> Result<Vec<JobRecord>, QueueError> {
        self.call(move |conn| {
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let mut stmt =
                conn.prepare_cached(&format!("SELECT {RECORD_COLUMNS} FROM jobs ORDER BY seq DESC LIMIT ?1"))?;
            let rows = stmt.query_map(params![limit], raw_record)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(row?.decode()?);
            }
            Ok(out)
        })
        .await
    }

    /// One job.
    pub async fn get(&self, id: String) -> Result<Option<JobRecord>, QueueError> {
        self.call(move |conn| {
            let raw = conn
                .query_row(&format!("SELECT {RECORD_COLUMNS} FROM jobs WHERE id = ?1"), params![id], raw_record)
                .optional()?;
            raw.map(RawRecord::decode).transpose()
        })
        .await
    }

    /// Every owner's account, by owner.
    pub async fn accounts(&self) -> Result<Vec<Account>, QueueError> {
        self.call(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT owner, jobs_completed, jobs_failed, core_seconds, cpu_seconds, wall_seconds, bytes_in, \
                 bytes_out FROM accounts ORDER BY owner",
            )?;
            let rows = stmt.query_map([], account_row)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Every owner's account as the job records say it should be: each run attempt's recorded
    /// usage charged with [`charge`] (the function `finish` charges with), and each job in a
    /// final state counted once. Equal to [`Queue::accounts`] (up to float rounding) unless an
    /// account was charged twice or not at all; the crash harness checks exactly that.
    pub async fn accounts_from_records(&self) -> Result<Vec<Account>, QueueError> {
        self.call(|conn| {
            let mut by_owner: std::collections::BTreeMap<String, Account> = std::collections::BTreeMap::new();
            let mut stmt = conn.prepare(
                "SELECT j.owner, j.cpus, a.usage, j.id, a.n FROM attempts a JOIN jobs j ON j.id = a.job_id \
                 WHERE a.usage IS NOT NULL",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, u32>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, u32>(4)?,
                ))
            })?;
            for row in rows {
                let (owner, cpus, usage, id, n) = row?;
                let u: Usage = serde_json::from_str(&usage)
                    .map_err(|e| QueueError::Corrupt { id, reason: format!("attempt {n} usage: {e}") })?;
                let acc = by_owner.entry(owner.clone()).or_insert_with(|| Account { owner, ..Account::default() });
                charge(acc, JobState::Idle, cpus, &u);
            }
            let mut stmt = conn.prepare(
                "SELECT owner, state, COUNT(*) FROM jobs WHERE state IN ('completed', 'failed') GROUP BY owner, state",
            )?;
            let rows =
                stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, i64>(2)?)))?;
            for row in rows {
                let (owner, state, count) = row?;
                let acc = by_owner.entry(owner.clone()).or_insert_with(|| Account { owner, ..Account::default() });
                match state.as_str() {
                    "completed" => acc.jobs_completed = from_db(count),
                    _ => acc.jobs_failed = from_db(count),
                }
            }
            Ok(by_owner.into_values().collect())
        })
        .await
    }

    /// Every run attempt of job `id`, first first; [`QueueError::JobNotFound`] for an unknown job.
    pub async fn history(&self, id: String) -> Result<Vec<Attempt>, QueueError> {
        self.call(move |conn| {
            let known: Option<i64> =
                row(conn, "SELECT seq FROM jobs WHERE id = ?1", params![id], |r| r.get(0)).optional()?;
            if known.is_none() {
                return Err(QueueError::JobNotFound { id });
            }
            let mut stmt = conn.prepare_cached(
                "SELECT n, ep, started_at_ms, ended_at_ms, outcome, reason, usage FROM attempts \
                 WHERE job_id = ?1 ORDER BY n",
            )?;
            let rows = stmt.query_map(params![id], |r| {
                Ok((
                    r.get::<_, u32>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, Option<i64>>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, String>(5)?,
                    r.get::<_, Option<String>>(6)?,
                ))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (n, ep, started, ended, outcome, reason, usage) = row?;
                let usage = usage
                    .as_deref()
                    .map(serde_json::from_str)
                    .transpose()
                    .map_err(|e| QueueError::Corrupt { id: id.clone(), reason: format!("attempt {n} usage: {e}") })?;
                out.push(Attempt {
                    n,
                    ep,
                    started_at_ms: from_db(started),
                    ended_at_ms: ended.map(from_db),
                    outcome,
                    reason,
                    usage,
                });
            }
            Ok(out)
        })
        .await
    }

    /// In one transaction: every running job started more than its run time plus `grace_ms`
    /// before `now_ms` becomes `removed` with a reason naming its run time (and class); returns
    /// `(job id, EP session)` of each, to be stopped there.
    pub async fn remove_overdue(&self, now_ms: u64, grace_ms: u64) -> Result<Vec<(String, String)>, QueueError> {
        self.write(move |tx| {
            let overdue: Vec<(String, String, u64, Option<String>)> = {
                let mut stmt = tx.prepare_cached(
                    "SELECT id, ep_session, runtime_s, class FROM jobs WHERE state = 'running' \
                     AND ep_session IS NOT NULL AND started_at_ms + runtime_s * 1000 + ?2 < ?1",
                )?;
                stmt.query_map(params![db_int(now_ms), db_int(grace_ms)], |r| {
                    Ok((r.get(0)?, r.get(1)?, from_db(r.get(2)?), r.get(3)?))
                })?
                .collect::<Result<_, _>>()?
            };
            let mut out = Vec::new();
            for (id, session, runtime_s, class) in overdue {
                let class = class.map(|c| format!(" (job class {c})")).unwrap_or_default();
                let reason = format!("job exceeded its run time of {runtime_s} s{class}");
                exec(
                    tx,
                    "UPDATE jobs SET state = 'removed', reason = ?2, finished_at_ms = ?3 WHERE id = ?1",
                    params![id, reason, db_int(now_ms)],
                )?;
                if let Some(subject) = job_subject(tx, &id)? {
                    audit::append_in(tx, AuditDraft::job_removed(subject, &reason, "running"))?;
                }
                out.push((id, session));
            }
            Ok(out)
        })
        .await
    }

    /// The log of job `id`'s last reported run (empty before one); `None` for an unknown job.
    pub async fn log(&self, id: String) -> Result<Option<String>, QueueError> {
        self.call(move |conn| {
            let log: Option<Option<String>> =
                row(conn, "SELECT log FROM jobs WHERE id = ?1", params![id], |r| r.get(0)).optional()?;
            Ok(log.map(Option::unwrap_or_default))
        })
        .await
    }

    /// How many attempts job `id` lost (its EP gone, or the storage unavailable), and until
    /// when it waits before running again (Unix ms; 0 when it does not wait).
    pub async fn retry_state(&self, id: String) -> Result<(u32, u64), QueueError> {
        self.call(move |conn| {
            let row: Option<(u32, i64)> = conn
                .query_row("SELECT lost, not_before_ms FROM jobs WHERE id = ?1", params![id], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()?;
            let (lost, at) = row.ok_or(QueueError::JobNotFound { id })?;
            Ok((lost, from_db(at)))
        })
        .await
    }

    /// Every owner's usage row (decayed usage, factor, total), by owner.
    pub async fn owner_usage(&self) -> Result<Vec<UsageRow>, QueueError> {
        self.call(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT owner, usage_decayed, usage_at_ms, factor, core_seconds FROM accounts ORDER BY owner",
            )?;
            let rows = stmt.query_map([], usage_row)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Every accounting group's usage row, by group.
    pub async fn group_usage(&self) -> Result<Vec<UsageRow>, QueueError> {
        self.call(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT grp, usage_decayed, usage_at_ms, 1.0, core_seconds FROM group_usage ORDER BY grp",
            )?;
            let rows = stmt.query_map([], usage_row)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Sets an owner's priority factor (creating their account if they have none yet), as
    /// `actor` (recorded in the audit trail).
    pub async fn set_factor(&self, owner: String, factor: f64, actor: String) -> Result<(), QueueError> {
        self.write(move |tx| {
            exec(
                tx,
                "INSERT INTO accounts (owner, jobs_completed, jobs_failed, core_seconds, cpu_seconds, wall_seconds, \
                 bytes_in, bytes_out, factor) VALUES (?1, 0, 0, 0, 0, 0, 0, 0, ?2) \
                 ON CONFLICT (owner) DO UPDATE SET factor = excluded.factor",
                params![owner, factor],
            )?;
            let subject = Subject { owner: Some(owner.clone()), ..Subject::default() };
            // The factor as a string: records hold integers and strings, never floats.
            let args = serde_json::json!({ "factor": factor.to_string() });
            audit::append_in(tx, AuditDraft::admin_action(&actor, "set_factor", subject, args))?;
            Ok(())
        })
        .await
    }

    /// Every EP name's admin settings.
    pub async fn ep_admin(&self) -> Result<Vec<EpAdminRow>, QueueError> {
        self.call(|conn| {
            let mut stmt = conn
                .prepare_cached("SELECT name, state, deadline_ms, paused, reason, at_ms FROM ep_admin ORDER BY name")?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<i64>>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, i64>(5)?,
                ))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (name, state, deadline, paused, reason, at) = row?;
                let corrupt = |what: String| QueueError::Corrupt { id: format!("ep_admin {name}"), reason: what };
                let state = match state.as_str() {
                    "enabled" => EpAdminState::Enabled,
                    "draining" => EpAdminState::Draining,
                    "disabled" => EpAdminState::Disabled,
                    other => return Err(corrupt(format!("state {other:?}"))),
                };
                let paused: Vec<String> = serde_json::from_str(&paused).map_err(|e| corrupt(format!("paused: {e}")))?;
                out.push(EpAdminRow {
                    name,
                    state,
                    deadline_ms: deadline.map(from_db),
                    paused,
                    reason,
                    at_ms: from_db(at),
                });
            }
            Ok(out)
        })
        .await
    }

    /// Stores an EP name's admin settings (replacing what it had), with `audit`, the record of
    /// the admin action that set them, in the same transaction.
    pub async fn set_ep_admin(&self, row: EpAdminRow, audit: AuditDraft) -> Result<(), QueueError> {
        self.write(move |tx| {
            let state = match row.state {
                EpAdminState::Enabled => "enabled",
                EpAdminState::Draining => "draining",
                EpAdminState::Disabled => "disabled",
            };
            exec(
                tx,
                "INSERT OR REPLACE INTO ep_admin (name, state, deadline_ms, paused, reason, at_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    row.name,
                    state,
                    row.deadline_ms.map(db_int),
                    serde_json::to_string(&row.paused)?,
                    row.reason,
                    db_int(row.at_ms)
                ],
            )?;
            audit::append_in(tx, audit)?;
            Ok(())
        })
        .await
    }

    /// Forgets use counts of tokens that expired before `before_s` (they no longer verify).
    pub async fn prune_token_uses(&self, before_s: u64) -> Result<usize, QueueError> {
        self.write(move |tx| Ok(exec(tx, "DELETE FROM token_uses WHERE exp < ?1", params![db_int(before_s)])?)).await
    }
}

/// Most writes committed in one transaction: a batch's latency stays bounded under any load.
pub const MAX_BATCH: usize = 256;

/// Why a write got no answer: the writer thread is gone (the queue is being dropped).
const WRITER_GONE: &str = "the store's writer stopped";

/// The savepoint each write of a batch runs in: opened, then released or rolled back to.
const SAVEPOINT_OPEN: &str = "SAVEPOINT htfaas_write";
const SAVEPOINT_RELEASE: &str = "RELEASE htfaas_write";
const SAVEPOINT_ROLLBACK: &str = "ROLLBACK TO htfaas_write";

/// The one writer of the store: a thread that takes every write waiting in its channel (at
/// most [`MAX_BATCH`]), runs them in one transaction, each in a savepoint of its own, commits
/// once (one fsync with [`Durability::Fsync`]), and then answers each caller. A write that
/// arrives alone is run at once: the thread waits only when nothing is waiting for it, never
/// on a timer. Dropping the last handle closes the channel; the thread answers what it has
/// and ends, and the drop waits for it.
struct Writer {
    /// Where writes wait; `None` only while dropping.
    sender: Option<std::sync::mpsc::Sender<Box<dyn PendingWrite>>>,
    /// The thread, joined on drop.
    thread: Option<std::thread::JoinHandle<()>>,
    /// Batches run so far, shared with the thread.
    batches: Arc<std::sync::atomic::AtomicU64>,
}

impl Writer {
    fn start(conn: Arc<Mutex<Connection>>) -> Result<Writer, QueueError> {
        let (sender, receiver) = std::sync::mpsc::channel();
        let batches = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = batches.clone();
        let thread = std::thread::Builder::new()
            .name("queue-writer".into())
            .spawn(move || write_loop(&conn, &receiver, &counted))
            .map_err(|e| QueueError::Task(format!("start the store's writer: {e}")))?;
        Ok(Writer { sender: Some(sender), thread: Some(thread), batches })
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.sender.take());
        if let Some(thread) = self.thread.take()
            && thread.thread().id() != std::thread::current().id()
        {
            // The thread ends once it has answered what it took; a panic there was answered
            // already (each write's panic is caught), so there is nothing left to report.
            let _ = thread.join();
        }
    }
}

/// How one write of a batch went ([`PendingWrite::run`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ran {
    /// It succeeded; its savepoint is released.
    Ok,
    /// It failed (its savepoint is rolled back); `full`: with `SQLITE_FULL`.
    Failed {
        /// The disk was full.
        full: bool,
    },
}

/// Why a batch was not committed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BatchFailed {
    /// What failed.
    why: String,
    /// Because the disk was full: every write of the batch is answered
    /// [`QueueError::DiskFull`].
    full: bool,
}

impl BatchFailed {
    /// `what` failed with `e`.
    fn sqlite(what: &str, e: &rusqlite::Error) -> BatchFailed {
        BatchFailed { why: format!("{what}: {e}"), full: crate::error::is_disk_full(e) }
    }
}

/// A write waiting for the writer (see [`WriteRequest`]).
trait PendingWrite: Send {
    /// Runs the write on `tx` (inside its savepoint); how it went.
    fn run(&mut self, tx: &Transaction<'_>) -> Ran;
    /// Answers the caller: with the write's own result when its batch committed (`Ok`), else
    /// with why the batch did not.
    fn answer(self: Box<Self>, batch: Result<(), &BatchFailed>);
}

/// A write and the caller waiting for its answer.
struct WriteRequest<T, F> {
    /// The write; taken when it runs.
    f: Option<F>,
    /// What it returned, held until the batch is committed.
    result: Option<Result<T, QueueError>>,
    reply: tokio::sync::oneshot::Sender<Result<T, QueueError>>,
}

impl<T, F> PendingWrite for WriteRequest<T, F>
where
    T: Send,
    F: FnOnce(&Transaction<'_>) -> Result<T, QueueError> + Send,
{
    fn run(&mut self, tx: &Transaction<'_>) -> Ran {
        let Some(f) = self.f.take() else { return Ran::Failed { full: false } };
        // A panicking write fails alone, as it did when each write had a blocking task.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(tx)))
            .unwrap_or_else(|_| Err(QueueError::Task("a write to the store panicked".into())));
        let ran = match &result {
            Ok(_) => Ran::Ok,
            Err(e) => Ran::Failed { full: e.is_disk_full() },
        };
        self.result = Some(result);
        ran
    }

    fn answer(self: Box<Self>, batch: Result<(), &BatchFailed>) {
        let result = match (self.result, batch) {
            // Its own error stands: it was rolled back, whatever became of the batch.
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(v)), Ok(())) => Ok(v),
            (Some(Ok(_)) | None, Err(b)) if b.full => Err(QueueError::DiskFull(b.why.clone())),
            (Some(Ok(_)) | None, Err(b)) => Err(QueueError::Batch(b.why.clone())),
            (None, Ok(())) => Err(QueueError::Task("a write was answered without being run".into())),
        };
        // The caller may have gone (its future dropped); the write stands all the same.
        let _ = self.reply.send(result);
    }
}

/// The writer thread's loop: waits for a write only when none is pending, then commits
/// batches until the channel is closed and empty.
fn write_loop(
    conn: &Mutex<Connection>,
    receiver: &std::sync::mpsc::Receiver<Box<dyn PendingWrite>>,
    batches: &std::sync::atomic::AtomicU64,
) {
    let mut pending: std::collections::VecDeque<Box<dyn PendingWrite>> = std::collections::VecDeque::new();
    loop {
        if pending.is_empty() {
            match receiver.recv() {
                Ok(w) => pending.push_back(w),
                Err(_) => return,
            }
        }
        while pending.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(w) => pending.push_back(w),
                Err(_) => break,
            }
        }
        // Counted before its answers, so that whoever has an answer sees its batch counted.
        batches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        commit_batch(conn, &mut pending);
    }
}

/// Runs up to [`MAX_BATCH`] writes from the front of `pending` in one transaction, each in a
/// savepoint (released when it succeeds, rolled back to when it fails), commits, and answers
/// each one. If SQLite ends the transaction itself (an I/O error, a full disk), every write
/// run so far in it is answered with that failure ([`QueueError::DiskFull`] when the disk is
/// full), nothing of the batch is stored, and the rest stay pending for the next batch. The
/// thread goes on either way: a full disk refuses writes until there is room, it never stops
/// the writer.
fn commit_batch(conn: &Mutex<Connection>, pending: &mut std::collections::VecDeque<Box<dyn PendingWrite>>) {
    let Ok(mut guard) = conn.lock() else {
        let failed = BatchFailed { why: QueueError::Poisoned.to_string(), full: false };
        for w in pending.drain(..) {
            w.answer(Err(&failed));
        }
        return;
    };
    let tx = match guard.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => {
            // Only the first write is failed: the rest may succeed in the next batch, and a
            // store that keeps refusing still answers everyone, one batch at a time.
            if let Some(w) = pending.pop_front() {
                w.answer(Err(&BatchFailed::sqlite("begin a transaction", &e)));
            }
            return;
        }
    };
    let mut ran: Vec<Box<dyn PendingWrite>> = Vec::with_capacity(pending.len().min(MAX_BATCH));
    let mut lost = None;
    while ran.len() < MAX_BATCH
        && let Some(mut w) = pending.pop_front()
    {
        if let Err(e) = exec(&tx, SAVEPOINT_OPEN, []) {
            pending.push_front(w);
            lost = Some(BatchFailed::sqlite("open a savepoint", &e));
            break;
        }
        let outcome = w.run(&tx);
        ran.push(w);
        let end = if outcome == Ran::Ok {
            exec(&tx, SAVEPOINT_RELEASE, [])
        } else {
            exec(&tx, SAVEPOINT_ROLLBACK, []).and_then(|_| exec(&tx, SAVEPOINT_RELEASE, []))
        };
        if tx.is_autocommit() {
            // SQLite rolled the whole transaction back after an error of the last write (as it
            // does on SQLITE_FULL): its savepoint is gone too, so `end` failed; say why.
            let full = outcome == Ran::Failed { full: true } || end.as_ref().is_err_and(crate::error::is_disk_full);
            let why = if full { "the disk is full" } else { "an error" };
            lost =
                Some(BatchFailed { why: format!("the transaction was rolled back by {why} in the same batch"), full });
            break;
        }
        if let Err(e) = end {
            lost = Some(BatchFailed::sqlite("end a savepoint", &e));
            break;
        }
    }
    let committed = match lost {
        Some(failed) => {
            drop(tx);
            Err(failed)
        }
        None => tx.commit().map_err(|e| BatchFailed::sqlite("commit", &e)),
    };
    drop(guard);
    if let Err(failed) = &committed {
        tracing::error!(
            writes = ran.len(),
            disk_full = failed.full,
            "failed to commit a batch of writes: {}",
            failed.why
        );
    }
    for w in ran {
        w.answer(committed.as_ref().map(|_| ()));
    }
}

/// A running job whose EP reported, as [`Queue::finish`] read it.
struct Reported<'a> {
    owner: &'a str,
    group: Option<&'a str>,
    cpus: u32,
    /// Losses before this attempt.
    lost: u32,
    /// The EP's name.
    ep: &'a str,
    ep_session: &'a str,
}

/// [`Queue::finish`] for a running job whose EP reported [`Outcome::StorageUnavailable`]: the
/// attempt ends `storage-unavailable` with its usage, which is charged (no job counted), and
/// [`requeue_or_hold`] decides what follows; the EP's report (`job.finished`, with the state
/// that follows) and a hold (`job.held`) are recorded. Returns the job's new state.
fn storage_unavailable(
    tx: &Transaction<'_>,
    job: &Reported<'_>,
    report: JobReport,
    subject: Subject,
    loss: Loss,
    half_life_s: f64,
) -> Result<JobState, QueueError> {
    let now = now_ms();
    let reason = report.outcome.reason();
    let u = report.usage;
    exec(
        tx,
        "UPDATE attempts SET outcome = 'storage-unavailable', reason = ?3, usage = ?4, ended_at_ms = ?5 \
         WHERE job_id = ?1 AND ep_session = ?2 AND ended_at_ms IS NULL",
        params![report.job_id, job.ep_session, reason, serde_json::to_string(&u)?, db_int(now)],
    )?;
    let hold = |times: u32, max: u32| {
        let why = format!("{reason} (on {}; lost {times} attempts, the retry limit is {max})", job.ep);
        (HOLD_CODE_STORAGE, why)
    };
    let after = requeue_or_hold(tx, &report.job_id, job.lost, loss, now, hold)?;
    exec(tx, "UPDATE jobs SET log = ?2 WHERE id = ?1", params![report.job_id, bounded_log(report.log)])?;
    let core_s = charge_owner(tx, job.owner, job.group, job.cpus, JobState::Idle, &u, now, half_life_s)?;
    let (state, then) = match &after {
        AfterLoss::Requeued => (JobState::Idle, "requeued"),
        AfterLoss::Held { .. } => (JobState::Held, "held"),
    };
    let input = subject.paths.first().filter(|_| u.bytes_in > 0).cloned();
    let input = input.as_deref().map(|path| (path, u.bytes_in));
    let finished = AuditDraft::job_finished(subject.clone(), job.ep, input, &report.outputs, &report.outcome, &u)
        .with_detail("state", state.as_str().into())
        .with_detail("then", then.into())
        .with_detail("core_ms", serde_json::json!((core_s * 1000.0).round().max(0.0) as u64));
    audit::append_in(tx, finished)?;
    if let AfterLoss::Held { code, reason } = after {
        audit::append_in(tx, AuditDraft::job_held(subject, &reason, Some(i64::from(code))))?;
    }
    Ok(state)
}

/// Longest reason of an EP's own (a return's) kept with an attempt, characters.
const MAX_EP_REASON_CHARS: usize = 1024;

/// [`Queue::finish`] for a running job its EP turned away unrun ([`Outcome::Cancelled`] the
/// scheduler did not ask for: e.g. an Assign that crossed the EP's `Draining`). Not the job's
/// fault, but not free either, or an EP could bounce a job for ever: the attempt ends
/// `returned`, nothing is charged, and it counts as lost ([`requeue_or_hold`]: idle again after
/// the backoff, held past the retry limit). Returns the job's new state.
fn returned(
    tx: &Transaction<'_>,
    job: &Reported<'_>,
    attempt: u32,
    report: &JobReport,
    subject: Subject,
    loss: Loss,
) -> Result<JobState, QueueError> {
    let now = now_ms();
    let said = match &report.outcome {
        Outcome::Cancelled { reason } => reason.chars().take(MAX_EP_REASON_CHARS).collect(),
        other => other.reason(),
    };
    let why = format!("the EP returned it: {said}");
    exec(
        tx,
        "UPDATE attempts SET outcome = 'returned', reason = ?3, ended_at_ms = ?4 \
         WHERE job_id = ?1 AND ep_session = ?2 AND ended_at_ms IS NULL",
        params![report.job_id, job.ep_session, why, db_int(now)],
    )?;
    let hold = |times: u32, max: u32| {
        let reason =
            format!("lost or returned by its EP {times} times (last: {}: {why}); the retry limit is {max}", job.ep);
        (HOLD_CODE_RETRIES, reason)
    };
    let after = requeue_or_hold(tx, &report.job_id, job.lost, loss, now, hold)?;
    let (state, then) = match &after {
        AfterLoss::Requeued => (JobState::Idle, "requeued"),
        AfterLoss::Held { .. } => (JobState::Held, "held"),
    };
    let record = AuditDraft::job_finished(subject.clone(), job.ep, None, &[], &report.outcome, &report.usage)
        .with_detail("state", state.as_str().into())
        .with_detail("returned", true.into())
        .with_detail("then", then.into())
        .with_detail("attempt", attempt.into());
    audit::append_in(tx, record)?;
    if let AfterLoss::Held { code, reason } = after {
        audit::append_in(tx, AuditDraft::job_held(subject, &reason, Some(i64::from(code))))?;
    }
    Ok(state)
}

/// [`Queue::finish`] for a report that breaks the protocol ([`Violation`]): nothing of it is
/// believed — no outcome, no output (so nothing enters the lineage), no usage (nothing is
/// charged). The attempt ends `refused` with the violation as its reason and is recorded as
/// `attempt.lost` (detail `violation`); a running job counts the loss ([`requeue_or_hold`]); a
/// job stopped meanwhile keeps its state, and no later report of the attempt counts. Returns
/// the job's state.
#[allow(clippy::too_many_arguments)]
fn refuse_report(
    tx: &Transaction<'_>,
    job: &Reported<'_>,
    stored: &str,
    attempt: u32,
    report: &JobReport,
    subject: Subject,
    violation: &Violation,
    loss: Loss,
) -> Result<JobState, QueueError> {
    let now = now_ms();
    let why = format!("protocol violation: {violation}");
    tracing::warn!(job.id = %report.job_id, ep = %job.ep, "refusing the EP's report: {why}");
    exec(
        tx,
        "UPDATE attempts SET outcome = 'refused', reason = ?3, ended_at_ms = ?4 \
         WHERE job_id = ?1 AND ep_session = ?2 AND ended_at_ms IS NULL",
        params![report.job_id, job.ep_session, why, db_int(now)],
    )?;
    let (state, then, held) = if stored == "running" {
        let hold = |times: u32, max: u32| {
            let reason = format!(
                "lost its EP or had its report refused {times} times (last: {}: {why}); the retry limit is {max}",
                job.ep
            );
            (HOLD_CODE_RETRIES, reason)
        };
        match requeue_or_hold(tx, &report.job_id, job.lost, loss, now, hold)? {
            AfterLoss::Requeued => (JobState::Idle, "requeued", None),
            AfterLoss::Held { code, reason } => (JobState::Held, "held", Some((code, reason))),
        }
    } else {
        // Stopped while running (held or removed): it keeps its state; a usage of nothing marks
        // the attempt as reported, so no later report of it is charged.
        let nothing = serde_json::to_string(&Usage::default())?;
        exec(tx, "UPDATE jobs SET usage = ?2 WHERE id = ?1", params![report.job_id, nothing])?;
        (JobState::parse(stored).unwrap_or(JobState::Removed), "kept", None)
    };
    let record = AuditDraft::attempt_lost(subject.clone(), job.ep, job.ep_session, attempt, &why, then)
        .with_detail("violation", true.into())
        .with_detail("outputs_reported", report.outputs.len().into());
    audit::append_in(tx, record)?;
    if let Some((code, reason)) = held {
        audit::append_in(tx, AuditDraft::job_held(subject, &reason, Some(i64::from(code))))?;
    }
    Ok(state)
}

/// What became of a running job that lost its attempt ([`requeue_or_hold`]).
#[derive(Debug, Clone, PartialEq, Eq)]
enum AfterLoss {
    /// Idle again (after its backoff, with [`Loss::Ep`]).
    Requeued,
    /// Held, past the retry limit.
    Held {
        /// The hold code.
        code: u32,
        /// The hold reason.
        reason: String,
    },
}

/// The one rule for a running job `id` whose attempt was lost, whatever lost it (its EP went
/// away or fell silent, or the storage was unavailable to it): with [`Loss::Shutdown`] it goes
/// back to idle, no loss counted; with [`Loss::Ep`] it counts a loss (it had `lost` before) and
/// goes back to idle after `backoff_ms` × 2^lost (at most [`MAX_BACKOFF_MS`]), or, when it
/// already had `max_retries` losses, is held with what `hold(losses, max_retries)` says (code,
/// reason). Its session is cleared either way, so no later report of the attempt counts.
fn requeue_or_hold(
    tx: &Transaction<'_>,
    id: &str,
    lost: u32,
    loss: Loss,
    now: u64,
    hold: impl FnOnce(u32, u32) -> (u32, String),
) -> rusqlite::Result<AfterLoss> {
    match loss {
        Loss::Shutdown => {
            exec(
                tx,
                "UPDATE jobs SET state = 'idle', ep = NULL, ep_session = NULL, started_at_ms = NULL WHERE id = ?1",
                params![id],
            )?;
            Ok(AfterLoss::Requeued)
        }
        Loss::Ep { max_retries, .. } if lost >= max_retries => {
            let (code, reason) = hold(lost.saturating_add(1), max_retries);
            exec(
                tx,
                "UPDATE jobs SET state = 'held', reason = ?2, hold_code = ?3, lost = lost + 1, \
                 ep_session = NULL WHERE id = ?1",
                params![id, reason, code],
            )?;
            Ok(AfterLoss::Held { code, reason })
        }
        Loss::Ep { backoff_ms, .. } => {
            let delay = backoff_ms.saturating_mul(1u64 << lost.min(32)).min(MAX_BACKOFF_MS);
            exec(
                tx,
                "UPDATE jobs SET state = 'idle', ep = NULL, ep_session = NULL, started_at_ms = NULL, \
                 lost = lost + 1, not_before_ms = ?2 WHERE id = ?1",
                params![id, db_int(now.saturating_add(delay))],
            )?;
            Ok(AfterLoss::Requeued)
        }
    }
}

/// Adds one finished job to an account: its usage always, and one to the count of its final
/// state (a removed job counts as neither completed nor failed).
fn charge(acc: &mut Account, state: JobState, cpus: u32, u: &Usage) {
    match state {
        JobState::Completed => acc.jobs_completed = acc.jobs_completed.saturating_add(1),
        JobState::Failed => acc.jobs_failed = acc.jobs_failed.saturating_add(1),
        JobState::Idle | JobState::Running | JobState::Removed | JobState::Held => {}
    }
    let wall_s = u.wall_ms as f64 / 1000.0;
    acc.core_seconds += f64::from(cpus) * wall_s;
    acc.cpu_seconds += u.cpu_ms as f64 / 1000.0;
    acc.wall_seconds += wall_s;
    acc.bytes_in = acc.bytes_in.saturating_add(u.bytes_in);
    acc.bytes_out = acc.bytes_out.saturating_add(u.bytes_out);
}

/// Charges one reported attempt to `owner`'s account (and `group`'s usage) with [`charge`]:
/// its usage, and one to the count of its final `state`, if that is one. Returns the
/// core-seconds charged.
#[allow(clippy::too_many_arguments)]
fn charge_owner(
    tx: &Transaction<'_>,
    owner: &str,
    group: Option<&str>,
    cpus: u32,
    state: JobState,
    u: &Usage,
    now: u64,
    half_life_s: f64,
) -> rusqlite::Result<f64> {
    let mut acc = read_account(tx, owner)?.unwrap_or_else(|| Account { owner: owner.to_owned(), ..Account::default() });
    let before = acc.core_seconds;
    charge(&mut acc, state, cpus, u);
    let core_s = acc.core_seconds - before;
    if let Some(g) = group {
        exec(
            tx,
            "INSERT INTO group_usage (grp, core_seconds, usage_decayed, usage_at_ms) VALUES (?1, 0, 0, ?2) \
             ON CONFLICT (grp) DO NOTHING",
            params![g, db_int(now)],
        )?;
        exec(tx, "UPDATE group_usage SET core_seconds = core_seconds + ?2 WHERE grp = ?1", params![g, core_s])?;
        charge_decayed(tx, "group_usage", "grp", g, core_s, now, half_life_s)?;
    }
    exec(
        tx,
        "INSERT INTO accounts (owner, jobs_completed, jobs_failed, core_seconds, cpu_seconds, \
         wall_seconds, bytes_in, bytes_out) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
         ON CONFLICT (owner) DO UPDATE SET jobs_completed = excluded.jobs_completed, \
         jobs_failed = excluded.jobs_failed, core_seconds = excluded.core_seconds, \
         cpu_seconds = excluded.cpu_seconds, wall_seconds = excluded.wall_seconds, \
         bytes_in = excluded.bytes_in, bytes_out = excluded.bytes_out",
        params![
            acc.owner,
            db_int(acc.jobs_completed),
            db_int(acc.jobs_failed),
            acc.core_seconds,
            acc.cpu_seconds,
            acc.wall_seconds,
            db_int(acc.bytes_in),
            db_int(acc.bytes_out),
        ],
    )?;
    charge_decayed(tx, "accounts", "owner", owner, core_s, now, half_life_s)?;
    Ok(core_s)
}

/// Adds `core_s` to the decayed usage of row `name` of `table` (keyed by `key`), first decaying
/// what it had to `now`. The row must exist. Table and key are our constants, never input.
fn charge_decayed(
    tx: &rusqlite::Transaction<'_>,
    table: &str,
    key: &str,
    name: &str,
    core_s: f64,
    now: u64,
    half_life_s: f64,
) -> rusqlite::Result<()> {
    let row: Option<(f64, i64)> = tx
        .query_row(&format!("SELECT usage_decayed, usage_at_ms FROM {table} WHERE {key} = ?1"), params![name], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()?;
    let (u, at) = row.unwrap_or((0.0, 0));
    let u = decay(u, from_db(at), now, half_life_s) + core_s;
    exec(
        tx,
        &format!("UPDATE {table} SET usage_decayed = ?2, usage_at_ms = ?3 WHERE {key} = ?1"),
        params![name, u, db_int(now)],
    )?;
    Ok(())
}

/// The log cut to [`MAX_LOG_BYTES`] at a character boundary.
fn bounded_log(mut log: String) -> String {
    if log.len() > MAX_LOG_BYTES {
        let mut cut = MAX_LOG_BYTES;
        while !log.is_char_boundary(cut) {
            cut -= 1;
        }
        log.truncate(cut);
    }
    log
}

/// Brings the file up to [`SCHEMA_VERSION`] in one transaction; refuses a newer one.
fn migrate(conn: &mut Connection) -> Result<(), QueueError> {
    const _: () = assert!(SCHEMA_VERSION as usize == MIGRATIONS.len());
    htfaas_functions::store::migrate(conn, &MIGRATIONS, "job store")?
        .map_err(|found| QueueError::SchemaTooNew { found, supported: SCHEMA_VERSION })
}

/// What the audit trail names for job `id`: the job, its token's `jti`, owner, function,
/// digest and event, and its input path (read from the stored request); `None` for an unknown
/// job.
fn job_subject(conn: &Connection, id: &str) -> rusqlite::Result<Option<Subject>> {
    let row: Option<(String, String, String)> = conn
        .prepare_cached("SELECT owner, token_jti, request FROM jobs WHERE id = ?1")?
        .query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    Ok(row.map(|(owner, jti, request)| {
        let mut subject =
            Subject { job: Some(id.to_owned()), owner: Some(owner), token_jti: Some(jti), ..Subject::default() };
        // One parse of the stored request, of only the members a record names (a corrupt one
        // names none of them, and the record says so by their absence).
        if let Ok(r) = serde_json::from_str::<RequestNames>(&request) {
            subject.function = Some(r.function.name);
            subject.digest = Some(r.function.digest);
            subject.event_id = Some(r.event.id);
            subject.paths = vec![r.event.path];
        }
        subject
    }))
}

/// The members of a stored [`SubmitRequest`] an audit record's subject names.
#[derive(serde::Deserialize)]
struct RequestNames {
    function: FunctionNames,
    event: EventNames,
}

/// See [`RequestNames`].
#[derive(serde::Deserialize)]
struct FunctionNames {
    name: String,
    digest: String,
}

/// See [`RequestNames`].
#[derive(serde::Deserialize)]
struct EventNames {
    id: String,
    path: String,
}

/// The stored state of job `id`.
fn subject_state(conn: &Connection, id: &str) -> rusqlite::Result<Option<String>> {
    row(conn, "SELECT state FROM jobs WHERE id = ?1", params![id], |r| r.get(0)).optional()
}

/// The path of an `http(s)` URL, percent-decoded (a storage URL's namespace path); the URL
/// itself when it has no path or does not decode to UTF-8.
pub fn url_path(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let Some(i) = rest.find('/') else { return url.to_owned() };
    let raw = rest[i..].split(['?', '#']).next().unwrap_or("");
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut k = 0;
    while k < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[k], bytes.get(k + 1).and_then(|b| hex(*b)), bytes.get(k + 2).and_then(|b| hex(*b))) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                k += 3;
            }
            (b, _, _) => {
                out.push(b);
                k += 1;
            }
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| url.to_owned())
}

/// Jobs submitted so far with the token `jti`.
fn token_uses(conn: &Connection, jti: &str) -> rusqlite::Result<u64> {
    let uses: Option<i64> =
        row(conn, "SELECT uses FROM token_uses WHERE jti = ?1", params![jti], |r| r.get(0)).optional()?;
    Ok(uses.map(from_db).unwrap_or(0))
}

/// Idle, running and held jobs whose submit token `target` names: `(id, state, ep_session)`.
fn active_jobs_named_by(
    conn: &Connection,
    target: &RevocationTarget,
) -> rusqlite::Result<Vec<(String, String, Option<String>)>> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, state, ep_session, token_jti, owner, token_issuer FROM jobs \
         WHERE state IN ('idle', 'running', 'held') ORDER BY seq",
    )?;
    let rows = stmt.query_map([], |r| {
        let credential = Credential { jti: r.get(3)?, owner: Some(r.get(4)?), issuer: r.get(5)? };
        Ok((credential.is_named_by(target), (r.get(0)?, r.get(1)?, r.get(2)?)))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (named, job) = row?;
        if named {
            out.push(job);
        }
    }
    Ok(out)
}

/// Every recorded revocation, oldest first.
fn read_revocations(conn: &Connection) -> Result<Vec<Revocation>, QueueError> {
    let mut stmt =
        conn.prepare_cached("SELECT seq, kind, value, reason, \"by\", at_ms, result FROM revocations ORDER BY seq")?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, String>(3)?,
            r.get::<_, String>(4)?,
            r.get::<_, i64>(5)?,
            r.get::<_, String>(6)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (seq, kind, value, reason, by, at_ms, result) = row?;
        let corrupt = |reason: String| QueueError::Corrupt { id: format!("revocation {seq}"), reason };
        let target = target_from_parts(&kind, value).ok_or_else(|| corrupt(format!("unknown kind {kind:?}")))?;
        let result: RevocationResult = serde_json::from_str(&result).map_err(|e| corrupt(format!("result: {e}")))?;
        out.push(Revocation {
            target,
            reason,
            by,
            at_ms: from_db(at_ms),
            removed_jobs: result.removed_jobs,
            stopped_jobs: result.stopped_jobs,
            closed_eps: result.closed_eps,
        });
    }
    Ok(out)
}

/// What an EP is sent for a job: no owner, no token.
/// Seals, in `tx`, the plain macaroons (stored by a build before [`crate::seal`]) of every job
/// that may still run; returns how many jobs were sealed. Finished jobs keep theirs: never
/// handed out again, they expire within hours.
fn seal_stored(tx: &Transaction<'_>, sealer: &crate::seal::Sealer) -> Result<usize, QueueError> {
    let plain: Vec<(String, String)> = {
        let mut stmt = tx.prepare(
            "SELECT id, request FROM jobs WHERE state IN ('idle', 'held', 'running') \
             AND json_valid(request) AND json_extract(request, '$.input.macaroon') NOT LIKE 'sealed-v1:%'",
        )?;
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<Result<_, _>>()?
    };
    for (id, request) in &plain {
        let Ok(r) = serde_json::from_str::<SubmitRequest>(request) else { continue };
        let sealed = serde_json::to_string(&sealer.seal_request(&r)?)?;
        exec(tx, "UPDATE jobs SET request = ?2 WHERE id = ?1", params![id, sealed])?;
    }
    Ok(plain.len())
}

pub(crate) fn assignment(job_id: String, r: SubmitRequest) -> JobAssignment {
    JobAssignment {
        job_id,
        function: r.function,
        resources: r.resources,
        input: r.input,
        output: r.output,
        args: r.args,
        env: r.env,
        limits: r.limits,
    }
}

fn usage_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<UsageRow> {
    Ok(UsageRow {
        name: r.get(0)?,
        decayed: r.get(1)?,
        at_ms: from_db(r.get(2)?),
        factor: r.get(3)?,
        core_seconds: r.get(4)?,
    })
}

fn account_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Account> {
    Ok(Account {
        owner: r.get(0)?,
        jobs_completed: from_db(r.get(1)?),
        jobs_failed: from_db(r.get(2)?),
        core_seconds: r.get(3)?,
        cpu_seconds: r.get(4)?,
        wall_seconds: r.get(5)?,
        bytes_in: from_db(r.get(6)?),
        bytes_out: from_db(r.get(7)?),
    })
}

fn read_account(tx: &rusqlite::Transaction<'_>, owner: &str) -> rusqlite::Result<Option<Account>> {
    row(
        tx,
        "SELECT owner, jobs_completed, jobs_failed, core_seconds, cpu_seconds, wall_seconds, bytes_in, bytes_out \
         FROM accounts WHERE owner = ?1",
        params![owner],
        account_row,
    )
    .optional()
}

/// A `jobs` row before its JSON columns are decoded.
struct RawRecord {
    id: String,
    owner: String,
    state: String,
    reason: String,
    token_jti: String,
    request: String,
    resources: Resources,
    ep: Option<String>,
    submitted_at_ms: i64,
    started_at_ms: Option<i64>,
    finished_at_ms: Option<i64>,
    exit_code: Option<i32>,
    usage: Option<String>,
    outputs: Option<String>,
    token_issuer: String,
    group: Option<String>,
    annex: Option<String>,
    hold_code: Option<u32>,
    class: Option<String>,
    attempts: u32,
}

fn raw_record(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawRecord> {
    Ok(RawRecord {
        id: r.get(0)?,
        owner: r.get(1)?,
        state: r.get(2)?,
        reason: r.get(3)?,
        token_jti: r.get(4)?,
        request: r.get(5)?,
        resources: Resources {
            cpus: r.get(6)?,
            memory_mb: from_db(r.get(7)?),
            runtime_s: from_db(r.get(8)?),
            gpus: r.get(22)?,
            disk_mb: from_db(r.get(23)?),
        },
        ep: r.get(9)?,
        submitted_at_ms: r.get(10)?,
        started_at_ms: r.get(11)?,
        finished_at_ms: r.get(12)?,
        exit_code: r.get(13)?,
        usage: r.get(14)?,
        outputs: r.get(15)?,
        token_issuer: r.get(16)?,
        group: r.get(17)?,
        annex: r.get(18)?,
        hold_code: r.get(19)?,
        class: r.get(20)?,
        attempts: r.get(21)?,
    })
}

impl RawRecord {
    fn decode(self) -> Result<JobRecord, QueueError> {
        let corrupt = |what: &str, e: &dyn std::fmt::Display| QueueError::Corrupt {
            id: self.id.clone(),
            reason: format!("{what}: {e}"),
        };
        let state = JobState::parse(&self.state).ok_or_else(|| corrupt("state", &format_args!("{:?}", self.state)))?;
        let request: SubmitRequest = serde_json::from_str(&self.request).map_err(|e| corrupt("request", &e))?;
        let usage: Option<Usage> =
            self.usage.as_deref().map(serde_json::from_str).transpose().map_err(|e| corrupt("usage", &e))?;
        let outputs: Vec<OutputFile> = self
            .outputs
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| corrupt("outputs", &e))?
            .unwrap_or_default();
        Ok(JobRecord {
            id: self.id,
            owner: self.owner,
            function: request.function.name,
            version: request.function.version,
            digest: request.function.digest,
            state,
            reason: self.reason,
            input: request.input.url,
            event: request.event,
            token_jti: self.token_jti,
            token_issuer: self.token_issuer,
            group: self.group,
            annex: self.annex,
            class: self.class,
            attempts: self.attempts,
            hold_code: self.hold_code,
            resources: self.resources,
            ep: self.ep,
            submitted_at_ms: from_db(self.submitted_at_ms),
            started_at_ms: self.started_at_ms.map(from_db),
            finished_at_ms: self.finished_at_ms.map(from_db),
            exit_code: self.exit_code,
            usage,
            outputs,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::matching::Pool;
    use htfaas_functions::Digest;
    use htfaas_functions::macaroon::{RootKey, mint};
    use htfaas_functions::proto::{EventRef, FunctionRef, InputSpec, OutputSpec};

    #[test]
    fn the_refusal_budget_lends_a_burst_then_its_rate_and_counts_the_rest() {
        let t0 = std::time::Instant::now();
        let mut b = RefusalBudget { tokens: UNVERIFIED_REFUSALS_BURST, last: t0, suppressed: 0 };
        let burst = UNVERIFIED_REFUSALS_BURST as usize;
        assert!((0..burst).all(|_| b.take(t0) == Some(0)));
        assert_eq!((b.take(t0), b.take(t0), b.suppressed), (None, None, 2));
        // Half a token's time later: still nothing; a full token's: one record, owning up to 3.
        let token = std::time::Duration::from_secs_f64(1.0 / UNVERIFIED_REFUSALS_PER_S);
        assert_eq!(b.take(t0 + token / 2), None);
        assert_eq!(b.take(t0 + token + token / 2), Some(3));
        assert_eq!(b.take(t0 + token + token / 2), None);
        // A long quiet refills to the burst, no more; a clock that goes back adds nothing.
        let later = t0 + token * 10_000;
        assert!((0..burst).all(|_| b.take(later) == Some(0) || b.suppressed == 0));
        assert_eq!(b.take(later), None);
        assert_eq!(b.take(t0), None);
    }

    /// A real macaroon, as the storage would mint it.
    pub(crate) fn macaroon(activity: &str, path: &str) -> String {
        let caveats = [format!("activity:{activity}"), format!("path:{path}")];
        mint(&RootKey::derive(b"queue-test-root"), "loc", "id", &caveats).expect("mint")
    }

    pub(crate) fn request(key: &str) -> SubmitRequest {
        SubmitRequest {
            function: FunctionRef {
                name: "checksum".into(),
                version: 1,
                digest: Digest::of(b"m"),
                module_url: "http://registry/v1/modules/x".into(),
            },
            resources: Resources::new(1, 64, 60),
            input: InputSpec {
                url: "http://storage/data/raw/a".into(),
                name: "a".into(),
                macaroon: macaroon("DOWNLOAD", "/data/raw/a"),
            },
            output: OutputSpec { url: "http://storage/data/out/".into(), macaroon: macaroon("UPLOAD", "/data/out") },
            args: vec![],
            env: vec![],
            event: EventRef::new("dcache", key, "/data/raw/a"),
            dedupe_key: key.into(),
            annex: None,
            bind_ep_address: false,
            class: None,
            limits: Default::default(),
        }
    }

    fn new_job(key: &str, jti: &str, jobs: u32) -> NewJob {
        NewJob {
            request: request(key),
            owner: "alice".into(),
            jti: jti.into(),
            issuer: "gw".into(),
            group: None,
            jobs,
            exp: u64::MAX,
            max_idle: None,
            class: None,
            hold: None,
        }
    }

    /// Issue 18: a reader of the job store's file finds no usable macaroon (each is sealed
    /// under the key beside it); dispatch still hands out the originals; a plain one written by
    /// an older build is read as it is and sealed when the store next opens.
    #[tokio::test]
    async fn stored_macaroons_are_sealed_and_an_older_builds_plain_ones_are_sealed_at_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("q.db");
        let q = Queue::open(&path).expect("open");
        let job = new_job("k1", "t1", 2);
        let (read, write) = (job.request.input.macaroon.clone(), job.request.output.macaroon.clone());
        let first = q.submit(job).await.expect("submit").job_id;
        let raw = || -> String {
            Connection::open(&path)
                .expect("a reader of the file")
                .query_row("SELECT group_concat(request, ' ') FROM jobs", [], |r| r.get(0))
                .expect("requests")
        };
        let stored = raw();
        assert!(!stored.contains(&read) && !stored.contains(&write), "{stored}");
        assert!(stored.contains(crate::seal::PREFIX), "{stored}");
        let marked = q.mark_running(vec![first], "ep".into(), "s1".into(), |a, _| Ok(a)).await.expect("mark");
        assert_eq!((&marked.assigned[0].input.macaroon, &marked.assigned[0].output.macaroon), (&read, &write));

        // An older build's row: the same request in plain.
        let second = q.submit(new_job("k2", "t2", 1)).await.expect("submit").job_id;
        let plain = serde_json::to_string(&request("k2")).expect("json");
        Connection::open(&path)
            .expect("open")
            .execute("UPDATE jobs SET request = ?2 WHERE id = ?1", params![second, plain])
            .expect("write a plain row");
        assert!(raw().contains(&read), "the plain row is there");
        let reopened = Queue::open(&path).expect("reopen");
        assert!(!raw().contains(&read), "sealed at open: {}", raw());
        let marked = reopened.mark_running(vec![second], "ep".into(), "s2".into(), |a, _| Ok(a)).await.expect("mark");
        assert_eq!(marked.assigned[0].input.macaroon, read);

        // Another key opens nothing: the job fails at dispatch, naming why.
        let third = q.submit(new_job("k3", "t3", 1)).await.expect("submit").job_id;
        std::fs::write(dir.path().join("other.key"), hex::encode([9u8; 32])).expect("key");
        let wrong = Queue::open_sealed(&path, Durability::Fsync, &dir.path().join("other.key")).expect("open");
        let marked = wrong.mark_running(vec![third], "ep".into(), "s3".into(), |a, _| Ok(a)).await.expect("mark");
        assert!(marked.assigned.is_empty(), "{:?}", marked.assigned);
    }

    #[tokio::test]
    async fn the_idle_limit_refuses_new_jobs_without_using_the_token_and_holds_under_concurrency() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open(&dir.path().join("q.db")).expect("open");
        let limited = |i: usize| NewJob { max_idle: Some(2), ..new_job(&format!("k{i}"), &format!("t{i}"), 1) };
        // Ten concurrent submits with ten single-use tokens: exactly two get in.
        let handles: Vec<_> = (0..10)
            .map(|i| {
                let (q, j) = (q.clone(), limited(i));
                tokio::spawn(async move { (i, q.submit(j).await) })
            })
            .collect();
        let mut created = Vec::new();
        for h in handles {
            match h.await.expect("joins") {
                (i, Ok(s)) => created.push((i, s.job_id)),
                (_, Err(e)) => {
                    assert_eq!(e.to_string(), "owner alice has 2 idle jobs, the limit is 2; try again later")
                }
            }
        }
        assert_eq!(created.len(), 2);
        // Refused submits counted no use of their tokens.
        for i in 0..10 {
            let expected = u64::from(created.iter().any(|(c, _)| *c == i));
            assert_eq!(q.uses(format!("t{i}")).await.expect("uses"), expected, "t{i}");
        }
        // A dedupe hit is answered as before, even at the limit.
        let (i, id) = created[0].clone();
        assert_eq!(q.submit(limited(i)).await.expect("dedupe hit"), Submitted { job_id: id.clone(), created: false });
        // A held job still counts; a running one does not.
        let refused = created.iter().map(|(c, _)| *c).max().map_or(0, |m| m + 1);
        q.act(id.clone(), Action::Hold, "wait".into()).await.expect("hold");
        assert!(matches!(q.submit(limited(refused)).await, Err(QueueError::TooManyIdle { idle: 2, max: 2, .. })));
        q.act(id.clone(), Action::Release, "go".into()).await.expect("release");
        q.mark_running(vec![id], "ep1".into(), "s1".into(), ok).await.expect("mark");
        assert!(q.submit(limited(refused)).await.expect("room again").created);
        assert_eq!(q.uses(format!("t{refused}")).await.expect("uses"), 1);
    }

    /// The retry rule of the tests that do not look at it.
    const LOSS: Loss = Loss::Ep { max_retries: 2, backoff_ms: 0 };

    fn pr(pool: Pool, room: Resources, free_cpus: u32) -> PoolRoom {
        PoolRoom { pool, room, free_cpus }
    }

    fn ok(a: JobAssignment, _bind: bool) -> Result<JobAssignment, String> {
        Ok(a)
    }

    #[tokio::test]
    async fn token_uses_are_counted_and_dedupe_does_not_consume() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open(&dir.path().join("q.db")).expect("open");
        let a = q.submit(new_job("k1", "t1", 2)).await.expect("first");
        assert!(a.created);
        let again = q.submit(new_job("k1", "t1", 2)).await.expect("dedupe");
        assert_eq!(again, Submitted { job_id: a.job_id.clone(), created: false });
        assert!(q.submit(new_job("k2", "t1", 2)).await.expect("second use").created);
        let err = q.submit(new_job("k3", "t1", 2)).await.expect_err("third use");
        assert_eq!(err.to_string(), "token already used (2 of 2 jobs)");
        assert_eq!(q.list(10).await.expect("list").len(), 2);
    }

    #[tokio::test]
    async fn finish_charges_the_owner_once_and_only_for_its_session() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open(&dir.path().join("q.db")).expect("open");
        let id = q.submit(new_job("k1", "t1", 1)).await.expect("submit").job_id;
        let marked = q.mark_running(vec![id.clone()], "ep1".into(), "s1".into(), ok).await.expect("mark");
        assert_eq!(marked.assigned.len(), 1);
        let report = JobReport {
            job_id: id.clone(),
            outcome: Outcome::Exited { exit_code: 0 },
            usage: Usage {
                wall_ms: 2000,
                cpu_ms: 1500,
                peak_memory_bytes: 1,
                bytes_in: 10,
                bytes_out: 20,
                instructions: None,
            },
            outputs: vec![],
            log: "x".repeat(MAX_LOG_BYTES + 10),
        };
        assert_eq!(q.finish("s2".into(), report.clone(), LOSS).await.expect("other session"), None);
        let f = q.finish("s1".into(), report.clone(), LOSS).await.expect("finish").expect("was running");
        assert_eq!(f.state, JobState::Completed);
        assert_eq!(q.finish("s1".into(), report, LOSS).await.expect("again"), None);
        let acc = q.accounts().await.expect("accounts");
        assert_eq!(acc.len(), 1);
        assert_eq!(acc[0].jobs_completed, 1);
        assert!((acc[0].core_seconds - 2.0).abs() < 1e-9);
        assert_eq!((acc[0].bytes_in, acc[0].bytes_out), (10, 20));
        // The records say the same; a second charge would show as a difference.
        let from_records = q.accounts_from_records().await.expect("from records");
        assert_eq!(from_records.len(), 1);
        assert_eq!(from_records[0].jobs_completed, 1);
        assert!((from_records[0].core_seconds - acc[0].core_seconds).abs() < 1e-9);
        assert_eq!((from_records[0].bytes_in, from_records[0].bytes_out), (10, 20));
    }

    #[tokio::test]
    async fn jobs_that_fit_nowhere_do_not_fill_the_batch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open(&dir.path().join("q.db")).expect("open");
        let mut big = new_job("big", "t1", 1);
        big.request.resources.cpus = 8;
        q.submit(big).await.expect("big");
        let small = q.submit(new_job("small", "t2", 1)).await.expect("small").job_id;
        let room = Resources::new(4, 1024, 3600);
        let site = Pool { annex: None, owner: None };
        let got = q
            .idle_candidates(vec![pr(site.clone(), room, 1)], vec![], HashMap::new(), now_ms())
            .await
            .expect("candidates");
        assert_eq!(got.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), vec![small.as_str()]);
        let alices = Pool { annex: None, owner: Some("alice".into()) };
        let by_owner =
            q.idle_candidates(vec![pr(alices, room, 1)], vec![], HashMap::new(), now_ms()).await.expect("candidates");
        assert_eq!(by_owner.len(), 1);
        let bobs = Pool { annex: None, owner: Some("bob".into()) };
        assert!(
            q.idle_candidates(vec![pr(bobs, room, 1)], vec![], HashMap::new(), now_ms())
                .await
                .expect("candidates")
                .is_empty()
        );
        // Owners at their running limit are not read at all.
        let skipped = q
            .idle_candidates(vec![pr(site, room, 10)], vec!["alice".into()], HashMap::new(), now_ms())
            .await
            .expect("candidates");
        assert!(skipped.is_empty());
    }

    #[tokio::test]
    async fn annex_jobs_are_read_only_for_their_annexs_pool() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open(&dir.path().join("q.db")).expect("open");
        // Many older annex jobs do not hide a plain one from a plain pool's batch.
        for i in 0..3 {
            let mut j = new_job(&format!("gpu{i}"), &format!("t{i}"), 1);
            j.request.annex = Some("gpu".into());
            q.submit(j).await.expect("annex job");
        }
        let plain = q.submit(new_job("plain", "tp", 1)).await.expect("plain").job_id;
        let room = Resources::new(4, 1024, 3600);
        let site = Pool { annex: None, owner: None };
        let got =
            q.idle_candidates(vec![pr(site, room, 1)], vec![], HashMap::new(), now_ms()).await.expect("candidates");
        assert_eq!(got.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), vec![plain.as_str()]);
        let gpu = Pool { annex: Some("gpu".into()), owner: None };
        let got =
            q.idle_candidates(vec![pr(gpu, room, 10)], vec![], HashMap::new(), now_ms()).await.expect("candidates");
        assert_eq!(got.len(), 3);
        assert!(got.iter().all(|j| j.annex.as_deref() == Some("gpu")));
    }

    #[tokio::test]
    async fn a_job_that_prepare_refuses_fails_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open(&dir.path().join("q.db")).expect("open");
        let id = q.submit(new_job("k1", "t1", 1)).await.expect("submit").job_id;
        let marked = q
            .mark_running(vec![id.clone()], "ep1".into(), "s1".into(), |_, _| Err("no, because".into()))
            .await
            .expect("mark");
        assert!(marked.assigned.is_empty());
        assert_eq!(marked.skipped, vec![id.clone()]);
        let rec = q.get(id).await.expect("get").expect("exists");
        assert_eq!((rec.state, rec.reason.as_str()), (JobState::Failed, "no, because"));
    }

    #[tokio::test]
    async fn a_version_1_store_is_migrated_and_its_jobs_read_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v1.db");
        {
            let conn = Connection::open(&path).expect("create v1");
            conn.execute_batch(SCHEMA_1).expect("v1 schema");
            conn.pragma_update(None, "user_version", 1).expect("version");
            conn.execute(
                "INSERT INTO jobs (id, owner, dedupe_key, state, token_jti, request, cpus, memory_mb, runtime_s, \
                 submitted_at_ms) VALUES ('old', 'alice', 'k', 'idle', 'jti-1', ?1, 1, 64, 60, 5)",
                params![serde_json::to_string(&request("k")).expect("json")],
            )
            .expect("v1 row");
        }
        let q = Queue::open(&path).expect("open and migrate");
        let version: i64 = q.call(|c| Ok(c.query_row("PRAGMA user_version", [], |r| r.get(0))?)).await.expect("v");
        assert_eq!(version, SCHEMA_VERSION);
        let rec = q.get("old".into()).await.expect("get").expect("kept");
        assert_eq!((rec.owner.as_str(), rec.token_jti.as_str(), rec.state), ("alice", "jti-1", JobState::Idle));
        assert_eq!((rec.token_issuer.as_str(), rec.group, rec.annex), ("", None, None));
        assert_eq!(q.revocations().await.expect("revocations table"), vec![]);
        // New columns are written and read from now on, and the old row is still revocable by owner.
        let mut j = new_job("k2", "t2", 1);
        (j.group, j.request.annex) = (Some("physics".into()), Some("gpu".into()));
        let id = q.submit(j).await.expect("submit").job_id;
        let rec = q.get(id).await.expect("get").expect("exists");
        assert_eq!(
            (rec.token_issuer.as_str(), rec.group.as_deref(), rec.annex.as_deref()),
            ("gw", Some("physics"), Some("gpu"))
        );
        let target = RevocationTarget::Owner("alice".into());
        let rec = q.record_revocation(target, "r".into(), "admin".into(), vec![]).await.expect("revoke");
        assert_eq!(rec.revocation.removed_jobs.len(), 2);
        drop(q);
        // Opening again is a no-op migration; a newer file is refused.
        let q = Queue::open(&path).expect("reopen");
        q.call_writing(|c| Ok(c.pragma_update(None, "user_version", SCHEMA_VERSION + 1)?)).await.expect("bump");
        drop(q);
        assert!(matches!(Queue::open(&path), Err(QueueError::SchemaTooNew { .. })));
    }

    #[tokio::test]
    async fn a_revocation_removes_idle_and_running_jobs_and_refuses_the_token_durably() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("q.db");
        let q = Queue::open(&path).expect("open");
        let idle = q.submit(new_job("k1", "t1", 3)).await.expect("idle").job_id;
        let running = q.submit(new_job("k2", "t1", 3)).await.expect("running").job_id;
        let other = q.submit(new_job("k3", "t2", 1)).await.expect("other token").job_id;
        q.mark_running(vec![running.clone()], "ep1".into(), "s1".into(), ok).await.expect("mark");
        let target = RevocationTarget::Jti("t1".into());
        q.block(target.clone(), "leaked".into());
        let err = q.submit(new_job("k4", "t1", 3)).await.expect_err("revoked in memory");
        assert_eq!(err.to_string(), "token revoked: leaked");
        let rec = q.record_revocation(target, "leaked".into(), "admin".into(), vec!["s9".into()]).await.expect("rec");
        assert_eq!(rec.revocation.removed_jobs, vec![idle.clone()]);
        assert_eq!(rec.revocation.stopped_jobs, vec![running.clone()]);
        assert_eq!(rec.stopped, vec![(running.clone(), "s1".to_owned())]);
        for id in [&idle, &running] {
            let r = q.get(id.clone()).await.expect("get").expect("exists");
            assert_eq!((r.state, r.reason.as_str()), (JobState::Removed, "token revoked: leaked"));
        }
        assert_eq!(q.get(other).await.expect("get").expect("exists").state, JobState::Idle);

        // The late report of the stopped job is charged once, without changing it.
        let report = JobReport {
            job_id: running.clone(),
            outcome: Outcome::Cancelled { reason: "token revoked: leaked".into() },
            usage: Usage { wall_ms: 1000, ..Usage::default() },
            outputs: vec![],
            log: String::new(),
        };
        let f = q.finish("s1".into(), report.clone(), LOSS).await.expect("finish").expect("charged");
        assert_eq!(f.state, JobState::Removed);
        assert_eq!(q.finish("s1".into(), report, LOSS).await.expect("again"), None);
        let r = q.get(running).await.expect("get").expect("exists");
        assert_eq!((r.state, r.reason.as_str()), (JobState::Removed, "token revoked: leaked"));
        let acc = q.accounts().await.expect("accounts");
        assert_eq!((acc[0].jobs_completed, acc[0].jobs_failed), (0, 0));
        assert!((acc[0].core_seconds - 1.0).abs() < 1e-9);
        drop(q);

        let q = Queue::open(&path).expect("reopen");
        let all = q.revocations().await.expect("list");
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].closed_eps, vec!["s9".to_owned()]);
        let cred = Credential { jti: "t1".into(), owner: None, issuer: "x".into() };
        assert_eq!(q.revoked_reason(&cred).as_deref(), Some("leaked"));
    }

    #[tokio::test]
    async fn a_version_2_store_gains_hold_codes_and_keeps_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v2.db");
        {
            let conn = Connection::open(&path).expect("create v2");
            conn.execute_batch(SCHEMA_1).expect("v1 schema");
            conn.execute_batch(MIGRATE_1_TO_2).expect("v2 step");
            conn.pragma_update(None, "user_version", 2).expect("version");
            conn.execute(
                "INSERT INTO jobs (id, owner, dedupe_key, state, token_jti, request, cpus, memory_mb, runtime_s, \
                 submitted_at_ms, token_issuer) VALUES ('old', 'alice', 'k', 'idle', 'jti-1', ?1, 1, 64, 60, 5, 'gw')",
                params![serde_json::to_string(&request("k")).expect("json")],
            )
            .expect("v2 row");
        }
        let q = Queue::open(&path).expect("open and migrate");
        let version: i64 = q.call(|c| Ok(c.query_row("PRAGMA user_version", [], |r| r.get(0))?)).await.expect("v");
        assert_eq!(version, SCHEMA_VERSION);
        let rec = q.get("old".into()).await.expect("get").expect("kept");
        assert_eq!((rec.state, rec.hold_code, rec.token_issuer.as_str()), (JobState::Idle, None, "gw"));
        // Version 4's columns read as their defaults.
        assert_eq!((rec.attempts, rec.resources.gpus, rec.resources.disk_mb, rec.class), (0, 0, 0, None));
        assert!(q.history("old".into()).await.expect("history").is_empty());
        let held = q.act("old".into(), Action::Hold, "disk full".into()).await.expect("hold").record;
        assert_eq!((held.state, held.reason.as_str(), held.hold_code), (JobState::Held, "disk full", Some(1)));
        drop(q);
        let q = Queue::open(&path).expect("reopen");
        let rec = q.get("old".into()).await.expect("get").expect("kept");
        assert_eq!((rec.state, rec.reason.as_str(), rec.hold_code), (JobState::Held, "disk full", Some(1)));
    }

    #[tokio::test]
    async fn held_jobs_are_not_matched_and_their_stopped_run_is_charged_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open(&dir.path().join("q.db")).expect("open");
        let idle = q.submit(new_job("k1", "t1", 1)).await.expect("idle").job_id;
        let running = q.submit(new_job("k2", "t2", 1)).await.expect("running").job_id;
        q.mark_running(vec![running.clone()], "ep1".into(), "s1".into(), ok).await.expect("mark");

        let acted = q.act(idle.clone(), Action::Hold, "wait".into()).await.expect("hold idle");
        assert_eq!((acted.record.state, acted.stop), (JobState::Held, None));
        let acted = q.act(running.clone(), Action::Hold, "stop".into()).await.expect("hold running");
        assert_eq!((acted.record.state, acted.stop.as_deref()), (JobState::Held, Some("s1")));
        let room = Resources::new(4, 1024, 3600);
        let site = Pool { annex: None, owner: None };
        assert!(
            q.idle_candidates(vec![pr(site.clone(), room, 10)], vec![], HashMap::new(), now_ms())
                .await
                .expect("candidates")
                .is_empty()
        );
        let marked = q.mark_running(vec![idle.clone()], "ep1".into(), "s1".into(), ok).await.expect("mark");
        assert_eq!(marked.skipped, vec![idle.clone()]);
        let err = q.act(idle.clone(), Action::Hold, "again".into()).await.expect_err("held twice");
        assert_eq!(err.to_string(), format!("job {idle} is already held"));

        // The stopped run's report is charged, once, and the job stays held.
        let report = JobReport {
            job_id: running.clone(),
            outcome: Outcome::Cancelled { reason: "stop".into() },
            usage: Usage { wall_ms: 1000, ..Usage::default() },
            outputs: vec![],
            log: String::new(),
        };
        let f = q.finish("s1".into(), report.clone(), LOSS).await.expect("finish").expect("charged");
        assert_eq!(f.state, JobState::Held);
        assert_eq!(q.finish("s1".into(), report, LOSS).await.expect("again"), None);
        let rec = q.get(running.clone()).await.expect("get").expect("exists");
        assert_eq!((rec.state, rec.reason.as_str(), rec.hold_code), (JobState::Held, "stop", Some(1)));
        assert!((q.accounts().await.expect("accounts")[0].core_seconds - 1.0).abs() < 1e-9);

        // Released: idle again, the earlier attempt forgotten, matched again.
        let rec = q.act(running.clone(), Action::Release, "go".into()).await.expect("release").record;
        assert_eq!((rec.state, rec.reason.as_str(), rec.hold_code), (JobState::Idle, "", None));
        assert_eq!((rec.ep, rec.usage, rec.started_at_ms), (None, None, None));
        let got =
            q.idle_candidates(vec![pr(site, room, 10)], vec![], HashMap::new(), now_ms()).await.expect("candidates");
        assert_eq!(got.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), vec![running.as_str()]);
        let err = q.act(running.clone(), Action::Release, "go".into()).await.expect_err("not held");
        assert_eq!(err.to_string(), format!("job {running} is idle; only held jobs can be released"));

        // Removed from held; then nothing more is allowed; an unknown id is not found.
        let rec = q.act(idle.clone(), Action::Remove, "gone".into()).await.expect("remove").record;
        assert_eq!(
            (rec.state, rec.reason.as_str(), rec.hold_code),
            (JobState::Removed, "removed by admin: gone", None)
        );
        let err = q.act(idle.clone(), Action::Hold, "x".into()).await.expect_err("removed");
        assert_eq!(err.to_string(), format!("job {idle} is removed; only idle or running jobs can be held"));
        let err = q.act(idle.clone(), Action::Remove, "x".into()).await.expect_err("removed");
        assert_eq!(err.to_string(), format!("job {idle} is removed; only idle, running or held jobs can be removed"));
        assert!(matches!(q.act("nope".into(), Action::Remove, "x".into()).await, Err(QueueError::JobNotFound { .. })));
    }

    #[tokio::test]
    async fn a_revocation_removes_held_jobs_too() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open(&dir.path().join("q.db")).expect("open");
        let id = q.submit(new_job("k1", "t1", 1)).await.expect("submit").job_id;
        q.act(id.clone(), Action::Hold, "wait".into()).await.expect("hold");
        let rec = q.record_revocation(RevocationTarget::Jti("t1".into()), "leaked".into(), "admin".into(), vec![]);
        assert_eq!(rec.await.expect("revoke").revocation.removed_jobs, vec![id.clone()]);
        let r = q.get(id).await.expect("get").expect("exists");
        assert_eq!((r.state, r.reason.as_str(), r.hold_code), (JobState::Removed, "token revoked: leaked", None));
    }

    #[tokio::test]
    async fn reopening_requeues_running_jobs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("q.db");
        let id = {
            let q = Queue::open(&path).expect("open");
            let id = q.submit(new_job("k1", "t1", 1)).await.expect("submit").job_id;
            q.mark_running(vec![id.clone()], "ep1".into(), "s1".into(), ok).await.expect("mark");
            id
        };
        let q = Queue::open(&path).expect("reopen");
        let rec = q.get(id).await.expect("get").expect("exists");
        assert_eq!(rec.state, JobState::Idle);
        assert_eq!(rec.ep, None);
    }

    /// A write for [`commit_batch`] and the receiver of its answer.
    fn write_request<T, F>(f: F) -> (Box<dyn PendingWrite>, tokio::sync::oneshot::Receiver<Result<T, QueueError>>)
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> Result<T, QueueError> + Send + 'static,
    {
        let (reply, answer) = tokio::sync::oneshot::channel();
        (Box::new(WriteRequest { f: Some(f), result: None, reply }), answer)
    }

    fn audit_records(conn: &Connection) -> i64 {
        conn.query_row("SELECT COUNT(*) FROM audit_records", [], |r| r.get(0)).expect("count")
    }

    #[tokio::test]
    async fn a_batch_commits_every_write_but_the_failing_ones_which_leave_nothing_behind() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open(&dir.path().join("q.db")).expect("open");
        let before = q.call(|c| Ok(audit_records(c))).await.expect("count");
        let note = |jti: &'static str| {
            move |tx: &Transaction<'_>| -> Result<&'static str, QueueError> {
                tx.execute("INSERT INTO token_uses (jti, uses, exp) VALUES (?1, 1, 0)", params![jti])?;
                let subject = Subject { token_jti: Some(jti.into()), ..Subject::default() };
                audit::append_in(tx, AuditDraft::job_refused(subject, 400, "test"))?;
                Ok(jti)
            }
        };
        let mut pending = std::collections::VecDeque::new();
        let (w, first) = write_request(note("a"));
        pending.push_back(w);
        // Writes, and records, then refuses: all of it is rolled back.
        let (w, refused) = write_request(move |tx: &Transaction<'_>| -> Result<(), QueueError> {
            note("b")(tx)?;
            Err(QueueError::Conflict("no".into()))
        });
        pending.push_back(w);
        // SQLite refuses it (a duplicate key) after it recorded.
        let (w, duplicate) = write_request(move |tx: &Transaction<'_>| -> Result<(), QueueError> {
            let subject = Subject { token_jti: Some("dup".into()), ..Subject::default() };
            audit::append_in(tx, AuditDraft::job_refused(subject, 400, "test"))?;
            note("a")(tx).map(|_| ())
        });
        pending.push_back(w);
        let (w, panicked) = write_request(|_tx: &Transaction<'_>| -> Result<(), QueueError> { panic!("a bug") });
        pending.push_back(w);
        let (w, last) = write_request(note("c"));
        pending.push_back(w);
        commit_batch(&q.conn, &mut pending);
        assert!(pending.is_empty());

        assert_eq!(first.await.expect("answered").expect("committed"), "a");
        assert_eq!(refused.await.expect("answered").expect_err("refused").to_string(), "no");
        let e = duplicate.await.expect("answered").expect_err("duplicate");
        assert!(matches!(e, QueueError::Sqlite(_)), "{e}");
        let e = panicked.await.expect("answered").expect_err("panicked");
        assert_eq!(e.to_string(), "database task failed: a write to the store panicked");
        assert_eq!(last.await.expect("answered").expect("committed"), "c");

        let jtis: Vec<String> = q
            .call(|c| {
                let mut stmt = c.prepare("SELECT jti FROM token_uses ORDER BY jti")?;
                Ok(stmt.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?)
            })
            .await
            .expect("read");
        assert_eq!(jtis, vec!["a", "c"]);
        // Two records, one per committed write, chained without a gap.
        assert_eq!(q.call(|c| Ok(audit_records(c))).await.expect("count"), before + 2);
        let (signer, _) = AuditSigner::generate("k").expect("key");
        let report = audit::verify(q.path(), &signer.keys()).expect("verify");
        assert!(report.ok(), "{:?}", report.first_problem);
    }

    #[tokio::test]
    #[expect(clippy::await_holding_lock, reason = "holding the writer's connection is the point: writes pile up")]
    async fn concurrent_submits_and_finishes_share_commits_and_keep_every_count_exact() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open(&dir.path().join("q.db")).expect("open");
        q.block(RevocationTarget::Jti("revoked".into()), "leaked".into());
        // Hold the connection so that the writes pile up and are batched.
        let batches = q.write_batches();
        let guard = q.conn.lock().expect("lock");
        let mut submits = tokio::task::JoinSet::new();
        for i in 0..40 {
            let q = q.clone();
            submits.spawn(async move { (i, q.submit(new_job(&format!("k{i}"), &format!("t{i}"), 1)).await) });
        }
        // One token for one job, used twice in the same batch: exactly one use counts.
        for i in [100, 101] {
            let q = q.clone();
            submits.spawn(async move { (i, q.submit(new_job(&format!("k{i}"), "shared", 1)).await) });
        }
        let revoked = q.clone();
        submits.spawn(async move { (200, revoked.submit(new_job("k200", "revoked", 1)).await) });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        drop(guard);

        let (mut ids, mut used_up) = (Vec::new(), 0);
        while let Some(done) = submits.join_next().await {
            match done.expect("task") {
                (200, r) => assert_eq!(r.expect_err("revoked").to_string(), "token revoked: leaked"),
                (100 | 101, Err(QueueError::TokenUsed { uses: 1, jobs: 1 })) => used_up += 1,
                (_, r) => ids.push(r.expect("accepted").job_id),
            }
        }
        assert_eq!((ids.len(), used_up), (41, 1));
        // The writer took the first write, waited for the connection, then took the rest.
        let batches = q.write_batches() - batches;
        assert!((1..=3).contains(&batches), "43 writes in {batches} batches");
        let (jobs, shared_uses): (i64, i64) = q
            .call(|c| {
                let jobs = c.query_row("SELECT COUNT(*) FROM jobs", [], |r| r.get(0))?;
                Ok((jobs, c.query_row("SELECT uses FROM token_uses WHERE jti = 'shared'", [], |r| r.get(0))?))
            })
            .await
            .expect("counts");
        assert_eq!((jobs, shared_uses), (41, 1));

        q.mark_running(ids.clone(), "ep1".into(), "s1".into(), ok).await.expect("mark");
        let guard = q.conn.lock().expect("lock");
        let mut finishes = tokio::task::JoinSet::new();
        for id in ids.iter().cloned().chain(["unknown".to_owned()]) {
            let q = q.clone();
            let report = JobReport {
                job_id: id,
                outcome: Outcome::Exited { exit_code: 0 },
                usage: Usage { wall_ms: 1000, ..Usage::default() },
                outputs: vec![],
                log: String::new(),
            };
            finishes.spawn(async move { q.finish("s1".into(), report, LOSS).await });
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        drop(guard);
        let mut finished = 0;
        while let Some(done) = finishes.join_next().await {
            finished += usize::from(done.expect("task").expect("finish").is_some());
        }
        assert_eq!(finished, 41);
        let acc = q.accounts().await.expect("accounts");
        assert_eq!(acc[0].jobs_completed, 41);
        assert!((acc[0].core_seconds - 41.0).abs() < 1e-9);
        let (signer, _) = AuditSigner::generate("k").expect("key");
        let report = audit::verify(q.path(), &signer.keys()).expect("verify");
        assert!(report.ok(), "{:?}", report.first_problem);
        // 41 accepted, 41 dispatched, 41 finished.
        assert_eq!(report.records, 123);
    }

    #[tokio::test]
    async fn a_lone_write_is_committed_without_waiting_for_others() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open_with(&dir.path().join("q.db"), Durability::Log).expect("open");
        // Nothing else is written meanwhile: a writer that waited for company (or for a
        // timer of any length worth having) would not answer these in time.
        let start = std::time::Instant::now();
        for i in 0..50 {
            let job = new_job(&format!("k{i}"), &format!("t{i}"), 1);
            let answer = tokio::time::timeout(std::time::Duration::from_secs(10), q.submit(job));
            assert!(answer.await.expect("answered in time").expect("submit").created);
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(5), "took {:?}", start.elapsed());
    }

    #[tokio::test]
    async fn durability_sets_the_synchronous_pragma() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (durability, expected) in [(Durability::Fsync, 2), (Durability::Log, 1)] {
            let q =
                Queue::open_with(&dir.path().join(format!("{}.db", durability.as_str())), durability).expect("open");
            assert_eq!(q.durability(), durability);
            let level: i64 =
                q.call_writing(|c| Ok(c.query_row("PRAGMA synchronous", [], |r| r.get(0))?)).await.expect("pragma");
            assert_eq!(level, expected, "{durability:?}");
        }
        let q = Queue::open(&dir.path().join("default.db")).expect("open");
        assert_eq!(q.durability(), Durability::Fsync);
        let stable = q
            .call(|c| Ok(c.db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG)?))
            .await
            .expect("db_config");
        assert!(stable, "plans must not depend on bound values (no re-prepare per binding)");
        let stable = q
            .call_writing(|c| Ok(c.db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG)?))
            .await
            .expect("db_config");
        assert!(stable, "the writer's plans too");
        // The reading connection reads and refuses to write.
        let n: i64 = q.call(|c| Ok(c.query_row("SELECT COUNT(*) FROM jobs", [], |r| r.get(0))?)).await.expect("read");
        assert_eq!(n, 0);
        assert!(q.call(|c| Ok(c.execute("DELETE FROM jobs", [])?)).await.is_err(), "a write on the reading connection");
    }

    #[tokio::test]
    async fn dropping_the_queue_stops_its_writer_after_answering() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("q.db");
        let q = Queue::open(&path).expect("open");
        let id = q.submit(new_job("k1", "t1", 1)).await.expect("submit").job_id;
        let writer = Arc::downgrade(&q.writer);
        drop(q);
        assert!(writer.upgrade().is_none());
        let q = Queue::open(&path).expect("reopen");
        assert_eq!(q.get(id).await.expect("get").expect("kept").state, JobState::Idle);
    }

    /// Accounts as charged equal accounts recomputed from the attempts' records.
    async fn assert_accounts_match_records(q: &Queue) -> Vec<Account> {
        let charged = q.accounts().await.expect("accounts");
        let recomputed = q.accounts_from_records().await.expect("from records");
        assert_eq!(charged.len(), recomputed.len(), "{charged:?} vs {recomputed:?}");
        for (a, b) in charged.iter().zip(&recomputed) {
            assert_eq!(
                (&a.owner, a.jobs_completed, a.jobs_failed, a.bytes_in, a.bytes_out),
                (&b.owner, b.jobs_completed, b.jobs_failed, b.bytes_in, b.bytes_out),
                "{a:?} vs {b:?}"
            );
            assert!((a.core_seconds - b.core_seconds).abs() < 1e-9, "{a:?} vs {b:?}");
            assert!((a.cpu_seconds - b.cpu_seconds).abs() < 1e-9, "{a:?} vs {b:?}");
            assert!((a.wall_seconds - b.wall_seconds).abs() < 1e-9, "{a:?} vs {b:?}");
        }
        charged
    }

    fn unavailable(id: &str, wall_ms: u64) -> JobReport {
        JobReport {
            job_id: id.into(),
            outcome: Outcome::StorageUnavailable {
                reason: "GET http://storage/data/raw/a: HTTP 503 Service Unavailable: down (gave up after 4 attempts)"
                    .into(),
            },
            usage: Usage { wall_ms, bytes_in: 0, ..Usage::default() },
            outputs: vec![],
            log: "[htfaas-ep] storage down\n".into(),
        }
    }

    fn audit_kinds(conn: &Connection, job: &str, kind: &str) -> i64 {
        conn.query_row("SELECT COUNT(*) FROM audit_records WHERE job = ?1 AND kind = ?2", params![job, kind], |r| {
            r.get(0)
        })
        .expect("count")
    }

    // Issue 9: a storage outage costs the job an attempt, not its life.
    #[tokio::test]
    async fn a_storage_outage_requeues_the_job_with_backoff_then_holds_it_and_a_release_runs_it_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open(&dir.path().join("q.db")).expect("open");
        let id = q.submit(new_job("k1", "t1", 1)).await.expect("submit").job_id;
        let loss = Loss::Ep { max_retries: 1, backoff_ms: 60_000 };

        // First attempt: the storage is down. The job is idle again, waiting out its backoff.
        q.mark_running(vec![id.clone()], "ep-a".into(), "s1".into(), ok).await.expect("mark");
        let before = now_ms();
        let f = q.finish("s1".into(), unavailable(&id, 2000), loss).await.expect("finish").expect("was running");
        assert_eq!(f, Finished { owner: "alice".into(), state: JobState::Idle });
        let job = q.get(id.clone()).await.expect("get").expect("kept");
        assert_eq!((job.state, job.hold_code, job.reason.as_str()), (JobState::Idle, None, ""));
        let (lost, not_before) = q.retry_state(id.clone()).await.expect("retry state");
        assert_eq!(lost, 1);
        assert!(not_before >= before + 60_000 && not_before <= now_ms() + 60_000, "{not_before}");
        let room = Resources::new(8, 4096, 3600);
        let idle =
            q.idle_candidates(vec![pr(Pool { annex: None, owner: None }, room, 8)], vec![], HashMap::new(), now_ms());
        assert!(idle.await.expect("candidates").is_empty(), "in backoff, not matched");
        let later =
            q.idle_candidates(vec![pr(Pool { annex: None, owner: None }, room, 8)], vec![], HashMap::new(), not_before);
        assert_eq!(later.await.expect("candidates").len(), 1, "matched once the backoff is over");
        // The slot it held is charged; the job counts neither completed nor failed.
        let acc = assert_accounts_match_records(&q).await;
        assert_eq!((acc[0].jobs_completed, acc[0].jobs_failed), (0, 0));
        assert!((acc[0].core_seconds - 2.0).abs() < 1e-9);
        // A second copy of the report is not heard.
        assert_eq!(q.finish("s1".into(), unavailable(&id, 2000), loss).await.expect("again"), None);

        // Second attempt: still down, and past the retry limit: held with the storage's reason.
        q.mark_running(vec![id.clone()], "ep-b".into(), "s2".into(), ok).await.expect("mark");
        let f = q.finish("s2".into(), unavailable(&id, 1000), loss).await.expect("finish").expect("was running");
        assert_eq!(f.state, JobState::Held);
        let job = q.get(id.clone()).await.expect("get").expect("kept");
        assert_eq!((job.state, job.hold_code), (JobState::Held, Some(HOLD_CODE_STORAGE)));
        assert!(
            job.reason.starts_with("storage unavailable: GET http://storage/data/raw/a: HTTP 503"),
            "{}",
            job.reason
        );
        assert!(job.reason.ends_with("(on ep-b; lost 2 attempts, the retry limit is 1)"), "{}", job.reason);
        assert_eq!(q.finish("s2".into(), unavailable(&id, 1000), loss).await.expect("late"), None);
        let history = q.history(id.clone()).await.expect("history");
        let summary: Vec<(u32, &str, &str)> =
            history.iter().map(|a| (a.n, a.ep.as_str(), a.outcome.as_str())).collect();
        assert_eq!(summary, [(1, "ep-a", "storage-unavailable"), (2, "ep-b", "storage-unavailable")]);
        assert!(history.iter().all(|a| a.reason.starts_with("storage unavailable: GET ") && a.usage.is_some()));
        let acc = assert_accounts_match_records(&q).await;
        assert_eq!((acc[0].jobs_completed, acc[0].jobs_failed), (0, 0));
        assert!((acc[0].core_seconds - 3.0).abs() < 1e-9);
        // Each decision is in the trail: two reports, one hold with the storage's code.
        let (finished, held) = q
            .call({
                let id = id.clone();
                move |c| Ok((audit_kinds(c, &id, "job.finished"), audit_kinds(c, &id, "job.held")))
            })
            .await
            .expect("audit");
        assert_eq!((finished, held), (2, 1));
        let held_detail: String = q
            .call({
                let id = id.clone();
                move |c| {
                    Ok(c.query_row("SELECT json FROM audit_records WHERE job = ?1 AND kind = 'job.held'", [id], |r| {
                        r.get(0)
                    })?)
                }
            })
            .await
            .expect("record");
        assert!(held_detail.contains("\"hold_code\":13"), "{held_detail}");

        // Released, it runs again with a fresh budget and completes: counted once, all charged.
        q.act(id.clone(), Action::Release, "storage back".into()).await.expect("release");
        assert_eq!(q.retry_state(id.clone()).await.expect("retry state"), (0, 0));
        q.mark_running(vec![id.clone()], "ep-c".into(), "s3".into(), ok).await.expect("mark");
        let done = JobReport { outcome: Outcome::Exited { exit_code: 0 }, ..unavailable(&id, 4000) };
        let f = q.finish("s3".into(), done, loss).await.expect("finish").expect("was running");
        assert_eq!(f.state, JobState::Completed);
        let acc = assert_accounts_match_records(&q).await;
        assert_eq!((acc[0].jobs_completed, acc[0].jobs_failed), (1, 0));
        assert!((acc[0].core_seconds - 7.0).abs() < 1e-9);
        let report = audit::verify(q.path(), &AuditSigner::generate("k").expect("key").0.keys()).expect("verify");
        assert!(report.ok(), "{:?}", report.first_problem);
    }

    #[tokio::test]
    async fn a_storage_refusal_still_fails_the_job_at_once_and_a_shutdown_counts_no_loss() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open(&dir.path().join("q.db")).expect("open");
        let refused = q.submit(new_job("k1", "t1", 1)).await.expect("submit").job_id;
        let other = q.submit(new_job("k2", "t2", 1)).await.expect("submit").job_id;
        q.mark_running(vec![refused.clone(), other.clone()], "ep-a".into(), "s1".into(), ok).await.expect("mark");
        let loss = Loss::Ep { max_retries: 0, backoff_ms: 0 };
        let denied = JobReport {
            outcome: Outcome::InputFailed { reason: "GET http://storage/data/raw/a: HTTP 403 Forbidden".into() },
            ..unavailable(&refused, 500)
        };
        let f = q.finish("s1".into(), denied, loss).await.expect("finish").expect("was running");
        assert_eq!(f.state, JobState::Failed);
        let job = q.get(refused.clone()).await.expect("get").expect("kept");
        assert_eq!((job.state, job.hold_code), (JobState::Failed, None));
        assert_eq!(job.reason, "input failed: GET http://storage/data/raw/a: HTTP 403 Forbidden");
        // With the scheduler shutting down, an outage puts the job back without counting a loss.
        let f = q.finish("s1".into(), unavailable(&other, 500), Loss::Shutdown).await.expect("finish");
        assert_eq!(f.expect("was running").state, JobState::Idle);
        assert_eq!(q.retry_state(other).await.expect("retry state"), (0, 0));
        let acc = assert_accounts_match_records(&q).await;
        assert_eq!((acc[0].jobs_completed, acc[0].jobs_failed), (0, 1));
    }

    // Issue 9: a full disk refuses new work with a clear error and loses nothing accepted.
    #[tokio::test]
    async fn a_full_disk_refuses_submissions_keeps_every_accepted_job_and_heals_when_space_is_freed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open(&dir.path().join("q.db")).expect("open");
        let pages = q.page_count().await.expect("pages");
        assert_eq!(q.set_max_page_count(Some(pages + 8)).await.expect("cap"), pages + 8);
        let mut accepted = Vec::new();
        let full = loop {
            let n = accepted.len();
            assert!(n < 10_000, "the capped store never filled");
            match q.submit(new_job(&format!("k{n}"), &format!("t{n}"), 1)).await {
                Ok(s) => accepted.push(s.job_id),
                Err(e) => break e,
            }
        };
        assert!(matches!(full, QueueError::DiskFull(_)), "{full:?}");
        assert!(full.to_string().starts_with("the scheduler's disk is full: "), "{full}");
        let answer = crate::ApiFailure::from(full);
        assert_eq!(answer.status, axum::http::StatusCode::INSUFFICIENT_STORAGE);
        assert!(answer.message.starts_with("the scheduler's disk is full: "), "{}", answer.message);
        assert!(accepted.len() >= 2, "{}", accepted.len());
        // The refused job left nothing: no row, no token use; the writer goes on answering.
        let n = accepted.len();
        assert_eq!(q.uses(format!("t{n}")).await.expect("uses"), 0);
        assert!(q.submit(new_job(&format!("k{n}"), &format!("t{n}"), 1)).await.expect_err("still full").is_disk_full());
        let listed = q.list(100_000).await.expect("reads still work");
        assert_eq!(listed.len(), n);
        assert!(listed.iter().all(|j| j.state == JobState::Idle && accepted.contains(&j.id)));
        // Room again: the same submission passes, and every accepted job is dispatchable.
        q.set_max_page_count(None).await.expect("uncap");
        let again = q.submit(new_job(&format!("k{n}"), &format!("t{n}"), 1)).await.expect("accepted now");
        assert!(again.created);
        accepted.push(again.job_id);
        let marked = q.mark_running(accepted.clone(), "ep-a".into(), "s1".into(), ok).await.expect("mark");
        assert_eq!(marked.assigned.len(), accepted.len());
        assert!(marked.skipped.is_empty());
    }

    #[tokio::test]
    async fn a_batch_that_fills_the_disk_answers_every_write_it_stored_nothing_of_and_the_writer_goes_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open(&dir.path().join("q.db")).expect("open");
        q.call_writing(|c| Ok(c.execute_batch("CREATE TABLE fill (n INTEGER, b BLOB)")?)).await.expect("table");
        let pages = q.page_count().await.expect("pages");
        q.set_max_page_count(Some(pages)).await.expect("cap");
        let put = |n: i64, bytes: usize| {
            move |tx: &Transaction<'_>| -> Result<i64, QueueError> {
                tx.execute("INSERT INTO fill (n, b) VALUES (?1, zeroblob(?2))", params![n, bytes as i64])?;
                Ok(n)
            }
        };
        let mut pending = std::collections::VecDeque::new();
        let mut answers = Vec::new();
        for (n, bytes) in [(1, 10), (2, 1 << 20), (3, 10)] {
            let (w, answer) = write_request(put(n, bytes));
            pending.push_back(w);
            answers.push((n, answer));
        }
        // SQLite rolls the whole transaction back on SQLITE_FULL: what ran before in the batch
        // is answered with the full disk too, and what had not run yet waits for the next one.
        for _ in 0..3 {
            if !pending.is_empty() {
                commit_batch(&q.conn, &mut pending);
            }
        }
        assert!(pending.is_empty());
        let mut stored_expected = Vec::new();
        for (n, answer) in answers {
            match answer.await.expect("answered") {
                Ok(got) => stored_expected.push(got),
                Err(e) => assert!(e.is_disk_full(), "write {n}: {e}"),
            }
        }
        assert!(!stored_expected.contains(&2), "the megabyte cannot fit");
        let stored: Vec<i64> = q
            .call(|c| {
                let mut stmt = c.prepare("SELECT n FROM fill ORDER BY n")?;
                Ok(stmt.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?)
            })
            .await
            .expect("read");
        assert_eq!(stored, stored_expected, "exactly the writes answered Ok are stored");
        // The writer thread survived: once there is room, writes pass through it again.
        q.set_max_page_count(None).await.expect("uncap");
        assert!(q.submit(new_job("after", "t-after", 1)).await.expect("room again").created);
    }
}
