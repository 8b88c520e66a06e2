// Long because it holds the firing table, its token buckets and its dispatcher (split: table, bucket, dispatch); kept whole until issue 19 splits it along its layers.
//! Durable firings: (event, function) pairs waiting to become jobs, and the dispatcher that
//! turns them into jobs.
//!
//! # Exactly once
//!
//! The ingest loop does not submit jobs itself: for each event it inserts one *firing* per
//! matching function into a SQLite table (WAL; `synchronous=FULL`, or `NORMAL` with
//! [`Durability::Log`]), and acks the JetStream
//! message only once the transaction holding them is committed. That transaction is a *group
//! commit* ([`Firings::insert_batch`]): the firings of every event of one batch of messages
//! (what the consumer had at hand, see [`crate::ingest`]), one fsync for all, each event
//! treated as it would be alone and in arrival order — its key checked against the table and
//! the batch's earlier events (two copies in one batch make one firing), its debounce
//! superseding earlier pending firings (of the batch too), its cause looked up for the loop
//! guard. It is all or nothing: when it fails no firing of the batch is written and no
//! message of it is acked; they come again. The table's key is
//! `(event_key, function, digest)`: the event's identity ([`StorageEvent::id`], e.g. for dCache
//! `dcache-billing:write:<pnfsid>/<door session>`), the function's name and its module digest.
//! A second copy of the event (a JetStream redelivery, a duplicate message from the storage, a
//! redelivery after a gateway restart) finds the key taken and is dropped there, before any
//! macaroon is asked for. A replay (`fire_all(.., Some(id))`) uses the event key
//! `replay:<id>#<event id>`, so it runs again on purpose, once per replay.
//!
//! Keys are kept for `dedupe_window_s` after the firing was made (default 7 days: the events
//! stream's `max_age`, so every redelivery the stream can still make falls inside the window),
//! then pruned in bounded batches. Only finished firings are pruned: a firing still pending is
//! kept whatever its age. Behind this table the scheduler still dedupes on
//! `<event id>#<function>@<digest>` (forever), so a firing re-submitted after a crash, or an
//! event seen again after its window, still starts no second job.
//!
//! # States
//!
//! `pending` (waits until `not_before_ms`) → `submitting` (claimed by the dispatcher: macaroons
//! and submit in flight) → `submitted` (with the scheduler's job id) | `refused` (with the
//! reason; for good) | `pending` again (a transient failure: storage or scheduler unreachable
//! or answering 5xx — 507 from a scheduler whose disk is full among them — or 429, or a
//! macaroon request unanswered within [`crate::storage_client::MACAROON_TIMEOUT`]; retried
//! after an exponential backoff of 0.5 s × 2^(attempts − 1), at most
//! [`MAX_BACKOFF_MS`]). `pending` → `superseded` (debounce, below; with the superseding
//! firing's `seq`). A gateway that stops with firings `submitting` puts them back to `pending`
//! when it opens the table again: they are submitted again, and the scheduler's dedupe key keeps
//! that to one job.
//!
//! # Rate and debounce
//!
//! - `trigger.rate` (`per_s`, `burst`): a token bucket per function, in the dispatcher's memory.
//!   A firing that finds no token is not dropped: it is given the time its token will be there
//!   (`not_before_ms`, the token reserved for it) and waits. The buckets start full when the
//!   gateway starts.
//! - `trigger.debounce_s` = D: a firing waits D seconds before it may run. A new firing for the
//!   same function and path that arrives while one is still pending supersedes it (the older is
//!   marked `superseded` and never runs), and itself waits D from its arrival. A burst of writes
//!   to one file thus starts one job, on the last event to arrive, D after the burst ends. A
//!   firing already `submitting` is not superseded: the next one waits its own D and runs too.
//!
//! # Loop guard
//!
//! Before a job is submitted, the identifier of the write macaroon obtained for it is recorded
//! in `provenance` with the job's [`Cause`]: its function, digest, event, and the chain of
//! functions that led to it (its own event's chain, then itself). The storage names the
//! macaroon that authorized an upload in the billing `subject` (`MacaroonPrincipal[<id>]`,
//! [`StorageEvent::macaroon`]), so the event of a file a job wrote finds that cause when its
//! firings are inserted: no function of the chain fires on it (nor anything once the chain is
//! [`MAX_CHAIN`] long), every other matching function does, and its firing (and so its job's
//! `EventRef::caused_by`) records the cause. Sources that do not name the macaroon (XRootD,
//! SSE, CloudEvents) still have the older rule in the ingest: a function never fires on a file
//! in its own output directory. Provenance is kept as long as firing keys.
//!
//! # Audit trail
//!
//! The gateway's audit trail ([`crate::audit`]) lives in this database, in its own `audit_*`
//! tables, installed at open. Each decision here is recorded in its own transaction: an
//! event's firings with its `event.matched` record ([`Firings::insert_batch`]), a job's
//! write-macaroon provenance with its `token.minted` and `macaroons.obtained` records
//! ([`Firings::record_provenance_with`]), a firing refused for good with its `job.refused`. The
//! dispatcher signs a checkpoint of the trail when one is due (checked every second) and at
//! shutdown.
//!
//! # Concurrency
//!
//! One connection behind a mutex, used from `spawn_blocking`. The dispatcher claims ready
//! firings (`pending`, `not_before_ms` ≤ now, oldest first) up to `max_in_flight`, runs each
//! as its own task (so one slow storage answer does not hold back the others) and is woken by
//! every insert, every finished task and a periodic tick.

use crate::Shared;
use crate::audit::Fired;
use crate::ingest::{Failure, event_ref, prepare, scheduler_dedupe_key};
use crate::stats::Stats;
use crate::submit::SubmitError;
use htfaas_functions::FunctionRecord;
use htfaas_functions::audit::{self, AuditDraft, AuditError, AuditSigner, Checkpoint, CheckpointPolicy};
use htfaas_functions::event::StorageEvent;
use htfaas_functions::proto::Cause;
use rusqlite::{Connection, OptionalExtension as _, TransactionBehavior, params};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Version of the stored format written by this build.
pub const SCHEMA_VERSION: i64 = 3;

/// `MIGRATIONS[v]` takes a file from version `v` to `v + 1`; a new file runs them all.
const MIGRATIONS: [&str; 3] = [SCHEMA_1, SCHEMA_2, SCHEMA_3];

const SCHEMA_1: &str = "
CREATE TABLE IF NOT EXISTS firings (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    event_key     TEXT NOT NULL,
    function      TEXT NOT NULL,
    digest        TEXT NOT NULL,
    version       INTEGER NOT NULL,
    path          TEXT NOT NULL,
    replay        TEXT,
    record        TEXT NOT NULL,
    event         TEXT NOT NULL,
    state         TEXT NOT NULL,
    job_id        TEXT,
    reason        TEXT,
    superseded_by INTEGER,
    not_before_ms INTEGER NOT NULL,
    rate_reserved INTEGER NOT NULL DEFAULT 0,
    attempts      INTEGER NOT NULL DEFAULT 0,
    created_ms    INTEGER NOT NULL,
    updated_ms    INTEGER NOT NULL,
    expires_ms    INTEGER NOT NULL,
    UNIQUE (event_key, function, digest)
);
CREATE INDEX IF NOT EXISTS firings_ready ON firings (not_before_ms, seq) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS firings_debounce ON firings (function, path) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS firings_expiry ON firings (expires_ms);
";

/// Version 2: the loop guard. `provenance` maps the identifier of each write macaroon obtained
/// for a job to that job's [`Cause`] (JSON); a firing keeps the cause of its event.
const SCHEMA_2: &str = "
ALTER TABLE firings ADD COLUMN cause TEXT;
CREATE TABLE IF NOT EXISTS provenance (
    macaroon   TEXT PRIMARY KEY,
    cause      TEXT NOT NULL,
    expires_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS provenance_expiry ON provenance (expires_ms);
";

/// Version 3: ready firings by function, for the claim's round robin over functions
/// ([`ready_rows`]).
const SCHEMA_3: &str = "
CREATE INDEX IF NOT EXISTS firings_ready_by_function ON firings (function, not_before_ms, seq) WHERE state = 'pending';
";

/// Longest chain of functions (`A` writes what fires `B`, …) the loop guard lets grow; an event
/// whose cause's chain is this long fires nothing more.
pub const MAX_CHAIN: usize = 16;

/// Longest wait between two attempts of a firing that failed transiently.
pub const MAX_BACKOFF_MS: u64 = 60_000;
/// First retry delay after a transient failure.
const BASE_BACKOFF_MS: u64 = 500;
/// Most finished firings deleted per prune.
pub const PRUNE_BATCH: usize = 10_000;
/// How often the dispatcher prunes expired firings.
const PRUNE_EVERY: Duration = Duration::from_secs(30);
/// Longest the dispatcher sleeps without looking at the table.
const TICK: Duration = Duration::from_secs(1);
/// Most rows one claim looks at (rate-delayed ones included).
const CLAIM_SCAN: usize = 1_000;
/// Longest the dispatcher waits for its in-flight submissions at shutdown.
const DRAIN_DEADLINE: Duration = Duration::from_secs(10);

/// Why the firing table failed.
#[derive(Debug, thiserror::Error)]
pub enum FiringError {
    /// SQLite.
    #[error("firing store: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A record or event that could not be encoded.
    #[error("firing store: encode: {0}")]
    Encode(#[from] serde_json::Error),
    /// The file was written by a newer gateway.
    #[error("firing store: schema version {found} is newer than this gateway's {supported}")]
    SchemaTooNew {
        /// Version in the file.
        found: i64,
        /// Version this build writes.
        supported: i64,
    },
    /// The blocking task failed or the lock was poisoned.
    #[error("firing store: {0}")]
    Task(String),
    /// The audit trail kept in the same file.
    #[error("firing store: audit trail: {0}")]
    Audit(#[from] AuditError),
    /// The file could not be made private (created 0600, or tightened to it).
    #[error("firing store: {0}: {1}")]
    Io(String, #[source] std::io::Error),
}

impl FiringError {
    /// Whether the write failed because the disk (or the database's size limit) is full
    /// (`SQLITE_FULL`): the batch was rolled back and may go through once there is room.
    pub fn is_disk_full(&self) -> bool {
        let sqlite = match self {
            FiringError::Sqlite(e) | FiringError::Audit(AuditError::Db(e)) => e,
            _ => return false,
        };
        sqlite.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull)
    }
}

/// Where a firing is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FiringState {
    /// Waits for `not_before_ms` and the dispatcher.
    Pending,
    /// Claimed by the dispatcher: macaroons and submit in flight.
    Submitting,
    /// The scheduler holds its job.
    Submitted,
    /// Refused for good (storage or scheduler said no).
    Refused,
    /// A later firing for the same function and path replaced it (debounce).
    Superseded,
}

impl FiringState {
    fn as_str(self) -> &'static str {
        match self {
            FiringState::Pending => "pending",
            FiringState::Submitting => "submitting",
            FiringState::Submitted => "submitted",
            FiringState::Refused => "refused",
            FiringState::Superseded => "superseded",
        }
    }

    fn parse(s: &str) -> Option<FiringState> {
        Some(match s {
            "pending" => FiringState::Pending,
            "submitting" => FiringState::Submitting,
            "submitted" => FiringState::Submitted,
            "refused" => FiringState::Refused,
            "superseded" => FiringState::Superseded,
            _ => return None,
        })
    }
}

/// One firing as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Firing {
    /// Row id: arrival order.
    pub seq: i64,
    /// The event's identity (`replay:<id>#<event id>` for a replay's firings).
    pub event_key: String,
    /// The function's name.
    pub function: String,
    /// Its module digest.
    pub digest: String,
    /// The replay this firing belongs to, if any.
    pub replay: Option<String>,
    /// Where it is.
    pub state: FiringState,
    /// The scheduler's job id, once submitted.
    pub job_id: Option<String>,
    /// Why it was refused, or the last transient failure.
    pub reason: Option<String>,
    /// The firing that superseded it (debounce).
    pub superseded_by: Option<i64>,
    /// Not dispatched before this time (Unix ms).
    pub not_before_ms: u64,
    /// Submit attempts so far.
    pub attempts: u32,
    /// When it was made (Unix ms).
    pub created_ms: u64,
    /// When its key may be forgotten (Unix ms).
    pub expires_ms: u64,
}

/// A firing claimed for dispatch: what the job is made from.
#[derive(Debug, Clone)]
pub struct Claimed {
    /// Row id.
    pub seq: i64,
    /// The function version that matched.
    pub function: FunctionRecord,
    /// The event.
    pub event: StorageEvent,
    /// The replay, if any.
    pub replay: Option<String>,
    /// The job whose output the event is about, if one is (the loop guard's provenance).
    pub cause: Option<Cause>,
}

/// What inserting one event's firings did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Inserted {
    /// New firings.
    pub queued: u64,
    /// Firings whose key was already there (dropped).
    pub deduplicated: u64,
    /// Older pending firings superseded by the new ones (debounce).
    pub superseded: u64,
    /// Functions not fired because the event is about a file written by a job of theirs, or of
    /// a function up the same chain (the loop guard).
    pub loop_guarded: u64,
}

/// One event's firings to insert, as one element of a [`Firings::insert_batch`].
#[derive(Debug, Clone)]
pub struct NewFirings {
    /// The event.
    pub event: StorageEvent,
    /// The functions it fires (matched, before the loop guard).
    pub functions: Vec<FunctionRecord>,
    /// The replay run, for a replay's firings (keys of their own).
    pub replay: Option<String>,
}

/// A ready row as read by a claim: seq, record, event, rate_reserved, replay, cause.
type ClaimRow = (i64, String, String, i64, Option<String>, Option<String>);

/// Up to `limit` ready firings (`pending`, `not_before_ms` ≤ `now_ms`), taken in turn from each
/// function that has some, each function's oldest first, and returned oldest first: one
/// function's backlog (an owner's flood) does not keep another function's firing waiting
/// behind it. The functions are found
/// by walking the `firings_ready_by_function` index from name to name, so the cost grows with
/// the number of functions with pending firings, not with the firings.
/// Claim number `turn` starts its round with the `turn`-th function (modulo their number), so
/// that claims of one firing each still go round every function.
fn ready_rows(tx: &rusqlite::Transaction<'_>, now_ms: u64, limit: usize, turn: u64) -> rusqlite::Result<Vec<ClaimRow>> {
    let functions: Vec<String> = {
        let mut stmt = tx.prepare_cached(
            "WITH RECURSIVE f(name) AS ( \
               SELECT MIN(function) FROM firings WHERE state = 'pending' \
               UNION ALL \
               SELECT (SELECT MIN(function) FROM firings WHERE state = 'pending' AND function > f.name) \
               FROM f WHERE f.name IS NOT NULL) \
             SELECT name FROM f WHERE name IS NOT NULL",
        )?;
        stmt.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?
    };
    let mut functions = functions;
    if !functions.is_empty() {
        let start = usize::try_from(turn % functions.len() as u64).unwrap_or(0);
        functions.rotate_left(start);
    }
    let per_function = limit.div_ceil(functions.len().max(1));
    let mut queues = Vec::with_capacity(functions.len());
    for function in &functions {
        let mut stmt = tx.prepare_cached(
            "SELECT not_before_ms, seq, record, event, rate_reserved, replay, cause FROM firings \
             WHERE state = 'pending' AND function = ?1 AND not_before_ms <= ?2 ORDER BY not_before_ms, seq LIMIT ?3",
        )?;
        let rows: Vec<(i64, ClaimRow)> = stmt
            .query_map(params![function, db_int(now_ms), db_int(per_function as u64)], |r| {
                Ok((r.get(0)?, (r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?)))
            })?
            .collect::<Result<_, _>>()?;
        queues.push(rows.into_iter());
    }
    // Round robin: the first of each function, then the second of each, …
    let mut out = Vec::with_capacity(limit);
    while out.len() < limit {
        let before = out.len();
        for q in &mut queues {
            if out.len() < limit
                && let Some(row) = q.next()
            {
                out.push(row);
            }
        }
        if out.len() == before {
            break;
        }
    }
    // Those taken, in the order they became ready.
    out.sort_by_key(|(not_before, row)| (*not_before, row.0));
    Ok(out.into_iter().map(|(_, row)| row).collect())
}

/// What one claim did.
#[derive(Debug, Default)]
pub struct Claim {
    /// Firings now `submitting`, to dispatch.
    pub ready: Vec<Claimed>,
    /// Firings that found no rate token and were given a later time.
    pub rate_delayed: u64,
    /// Rows that could not be read back (refused).
    pub unreadable: u64,
}

/// A token bucket that lends: a request always gets a time, now when a token is there,
/// otherwise when its (reserved) token will be.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenBucket {
    per_s: f64,
    burst: f64,
    /// Tokens at `at_ms`; negative when tokens are lent ahead.
    tokens: f64,
    at_ms: u64,
}

impl TokenBucket {
    /// A full bucket at `now_ms`.
    pub fn new(per_s: f64, burst: u32, now_ms: u64) -> TokenBucket {
        let burst = f64::from(burst.max(1));
        TokenBucket { per_s: per_s.max(1e-9), burst, tokens: burst, at_ms: now_ms }
    }

    /// Takes one token and returns when it may be used: `now_ms`, or later when the bucket
    /// is empty (the token is reserved: the caller waits, and no one else gets it).
    pub fn reserve(&mut self, now_ms: u64) -> u64 {
        if now_ms > self.at_ms {
            let refill = (now_ms - self.at_ms) as f64 / 1000.0 * self.per_s;
            self.tokens = (self.tokens + refill).min(self.burst);
            self.at_ms = now_ms;
        }
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            now_ms
        } else {
            let wait_ms = (-self.tokens / self.per_s * 1000.0).ceil();
            now_ms.saturating_add(if wait_ms.is_finite() { wait_ms as u64 } else { u64::MAX / 2 })
        }
    }

    fn same_limit(&self, per_s: f64, burst: u32) -> bool {
        self.per_s.to_bits() == per_s.max(1e-9).to_bits() && self.burst == f64::from(burst.max(1))
    }
}

/// The durable firing table; cheap to clone.
#[derive(Clone)]
pub struct Firings {
    conn: Arc<Mutex<Connection>>,
    /// The file, for read-only audit queries and verification on connections of their own.
    path: Arc<PathBuf>,
    window_ms: u64,
    max_in_flight: usize,
    /// Firings pending or submitting: a gauge, kept in step with every write.
    pending: Arc<AtomicU64>,
    /// Rate buckets per function name.
    buckets: Arc<Mutex<HashMap<String, TokenBucket>>>,
    /// Wakes the dispatcher after an insert.
    wake: Arc<Notify>,
    /// Claims so far: where each claim's round robin over functions starts ([`ready_rows`]).
    claims: Arc<AtomicU64>,
}

impl std::fmt::Debug for Firings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Firings").field("window_ms", &self.window_ms).finish_non_exhaustive()
    }
}

pub use htfaas_functions::store::now_ms;
use htfaas_functions::store::{Durability, db_int, exec, from_db, row};

/// Retry delay after the `attempts`-th transient failure.
pub fn backoff_ms(attempts: u32) -> u64 {
    BASE_BACKOFF_MS.saturating_mul(1u64 << attempts.saturating_sub(1).min(20)).min(MAX_BACKOFF_MS)
}

/// The event key of `event` (and of `replay`, when it is one).
pub fn event_key(event: &StorageEvent, replay: Option<&str>) -> String {
    match replay {
        // The replay first: an event id is `<source kind>:…`, so no id reads as a replay's key.
        Some(r) => format!("replay:{r}#{}", event.id),
        None => event.id.clone(),
    }
}

impl Firings {
    /// Opens (or creates) the table at `path`: WAL, `synchronous=FULL`, migrated to
    /// [`SCHEMA_VERSION`], with the gateway's audit tables installed ([`crate::audit`]).
    /// Firings left `submitting` by a previous process are `pending` again.
    /// Keys are kept `dedupe_window_s` after their firing was made; at most `max_in_flight`
    /// firings are dispatched at once.
    pub fn open(path: &Path, dedupe_window_s: u64, max_in_flight: usize) -> Result<Firings, FiringError> {
        Firings::open_with(path, dedupe_window_s, max_in_flight, Durability::Fsync)
    }

    /// [`Firings::open`] with the `synchronous` mode of `durability` (`FULL` for
    /// [`Durability::Fsync`], `NORMAL` for [`Durability::Log`]).
    pub fn open_with(
        path: &Path,
        dedupe_window_s: u64,
        max_in_flight: usize,
        durability: Durability,
    ) -> Result<Firings, FiringError> {
        // 0600 (with its -wal and -shm): the provenance of write macaroons is the gateway's.
        htfaas_functions::store::prepare_private_db(path)
            .map_err(|e| FiringError::Io(path.display().to_string(), e))?;
        let mut conn = Connection::open(path)?;
        let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(journal_mode = %mode, "SQLite refused WAL; continuing with {mode}");
        }
        conn.pragma_update(None, "synchronous", durability.sqlite_synchronous())?;
        conn.busy_timeout(Duration::from_secs(5))?;
        // Hot statements stay parsed ([`exec`], [`row`]) with plans that do not depend on the
        // values bound (see the scheduler's queue for why).
        conn.set_prepared_statement_cache_capacity(64);
        conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
        migrate(&mut conn)?;
        audit::install(&conn, crate::audit::AUDIT_WRITER)?;
        let requeued = exec(
            &conn,
            "UPDATE firings SET state = 'pending', updated_ms = ?1 WHERE state = 'submitting'",
            params![db_int(now_ms())],
        )?;
        if requeued > 0 {
            tracing::info!(firings = requeued, "firings left submitting by the previous process are pending again");
        }
        let pending: i64 =
            row(&conn, "SELECT COUNT(*) FROM firings WHERE state IN ('pending', 'submitting')", [], |r| r.get(0))?;
        Ok(Firings {
            conn: Arc::new(Mutex::new(conn)),
            path: Arc::new(path.to_owned()),
            window_ms: dedupe_window_s.saturating_mul(1000),
            max_in_flight: max_in_flight.max(1),
            pending: Arc::new(AtomicU64::new(from_db(pending))),
            buckets: Arc::default(),
            wake: Arc::new(Notify::new()),
            claims: Arc::default(),
        })
    }

    /// The database file (the audit trail is in it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Firings pending or being submitted.
    pub fn pending(&self) -> u64 {
        self.pending.load(Ordering::Relaxed)
    }

    /// Most firings dispatched at once.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// Wakes the dispatcher.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Test hook: caps the database file at about `pages` pages of its current page size
    /// (`PRAGMA max_page_count`; never below what it holds), so that a write past it fails as
    /// on a full disk (`SQLITE_FULL`). Returns the cap in effect. `u32::MAX` lifts it.
    #[doc(hidden)]
    pub fn set_max_page_count(&self, pages: u32) -> Result<i64, FiringError> {
        self.with(|conn| Ok(conn.pragma_update_and_check(None, "max_page_count", pages, |r| r.get(0))?))
    }

    fn with<T>(&self, f: impl FnOnce(&mut Connection) -> Result<T, FiringError>) -> Result<T, FiringError> {
        // A panic while holding the lock cannot leave SQLite inconsistent (transactions roll back).
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Firings) -> Result<T, FiringError> + Send + 'static,
    ) -> Result<T, FiringError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || f(&this)).await.map_err(|e| FiringError::Task(e.to_string()))?
    }

    /// In one transaction: one firing per function of `functions` on `event` at `now_ms`,
    /// each unless its key is already there; a debounced function's new firing supersedes
    /// the pending ones for its path. Committed (on disk) when it returns `Ok`. A batch of one
    /// ([`Firings::insert_batch`]).
    pub fn insert(
        &self,
        event: &StorageEvent,
        functions: &[FunctionRecord],
        replay: Option<&str>,
        now_ms: u64,
    ) -> Result<Inserted, FiringError> {
        let done = self.with(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let done = insert_event(&tx, event, functions, replay, now_ms, self.window_ms)?;
            tx.commit()?;
            Ok(done)
        })?;
        self.inserted(std::slice::from_ref(&done));
        Ok(done)
    }

    /// Group commit: the firings of every event of `batch`, in its order, in ONE transaction
    /// (one fsync), each event exactly as [`Firings::insert`] would do it alone: an event
    /// whose key is already there (in the table, or earlier in the batch) is dropped; a
    /// debounced firing supersedes the pending ones for its path, earlier ones of the batch
    /// included; the loop guard looks up each event's cause. Returns what each event did, in
    /// the batch's order. All or nothing: on `Err` no firing of the batch is written.
    pub fn insert_batch(&self, batch: &[NewFirings], now_ms: u64) -> Result<Vec<Inserted>, FiringError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let done = self.with(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let done = batch
                .iter()
                .map(|b| insert_event(&tx, &b.event, &b.functions, b.replay.as_deref(), now_ms, self.window_ms))
                .collect::<Result<Vec<_>, _>>()?;
            // Dropping `tx` on an error above rolls the whole batch back.
            tx.commit()?;
            Ok(done)
        })?;
        self.inserted(&done);
        Ok(done)
    }

    /// [`Firings::insert_batch`] on a blocking thread.
    pub async fn insert_batch_async(&self, batch: Vec<NewFirings>, now_ms: u64) -> Result<Vec<Inserted>, FiringError> {
        self.call(move |f| f.insert_batch(&batch, now_ms)).await
    }

    /// [`Firings::insert`] on a blocking thread.
    pub async fn insert_async(
        &self,
        event: StorageEvent,
        functions: Vec<FunctionRecord>,
        replay: Option<String>,
        now_ms: u64,
    ) -> Result<Inserted, FiringError> {
        self.call(move |f| f.insert(&event, &functions, replay.as_deref(), now_ms)).await
    }

    /// Keeps the pending gauge in step with committed inserts and wakes the dispatcher.
    fn inserted(&self, done: &[Inserted]) {
        let queued: u64 = done.iter().map(|d| d.queued).sum();
        let superseded: u64 = done.iter().map(|d| d.superseded).sum();
        self.pending.fetch_add(queued, Ordering::Relaxed);
        self.pending.fetch_sub(superseded.min(self.pending()), Ordering::Relaxed);
        if queued > 0 {
            self.wake();
        }
    }

    /// Claims up to `max` ready firings (`pending`, `not_before_ms` ≤ `now_ms`, oldest first):
    /// each either takes a rate token and becomes `submitting`, or finds none and is given the
    /// time its token will be there.
    pub fn claim(&self, now_ms: u64, max: usize) -> Result<Claim, FiringError> {
        let mut claim = Claim::default();
        if max == 0 {
            return Ok(claim);
        }
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        self.with(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut scanned = 0;
            while claim.ready.len() < max && scanned < CLAIM_SCAN {
                let turn = self.claims.fetch_add(1, Ordering::Relaxed);
                let rows = ready_rows(&tx, now_ms, max - claim.ready.len(), turn)?;
                if rows.is_empty() {
                    break;
                }
                scanned += rows.len();
                for (seq, record, event, rate_reserved, replay, cause) in rows {
                    let parsed = serde_json::from_str::<FunctionRecord>(&record).and_then(|f| {
                        let cause = cause.as_deref().map(serde_json::from_str::<Cause>).transpose()?;
                        Ok((f, serde_json::from_str::<StorageEvent>(&event)?, cause))
                    });
                    let (function, event, cause) = match parsed {
                        Ok(p) => p,
                        Err(e) => {
                            tracing::error!(seq, "stored firing unreadable, refused: {e}");
                            exec(
                                &tx,
                                "UPDATE firings SET state = 'refused', reason = ?2, updated_ms = ?3 WHERE seq = ?1",
                                params![seq, format!("stored firing unreadable: {e}"), db_int(now_ms)],
                            )?;
                            claim.unreadable += 1;
                            continue;
                        }
                    };
                    if rate_reserved == 0
                        && let Some(rate) = function.manifest.trigger.rate
                    {
                        let name = &function.manifest.name;
                        let bucket = buckets
                            .entry(name.clone())
                            .and_modify(|b| {
                                if !b.same_limit(rate.per_s, rate.burst) {
                                    *b = TokenBucket::new(rate.per_s, rate.burst, now_ms);
                                }
                            })
                            .or_insert_with(|| TokenBucket::new(rate.per_s, rate.burst, now_ms));
                        let at = bucket.reserve(now_ms);
                        if at > now_ms {
                            exec(
                                &tx,
                                "UPDATE firings SET not_before_ms = ?2, rate_reserved = 1, updated_ms = ?3 \
                                 WHERE seq = ?1",
                                params![seq, db_int(at), db_int(now_ms)],
                            )?;
                            claim.rate_delayed += 1;
                            continue;
                        }
                    }
                    exec(
                        &tx,
                        "UPDATE firings SET state = 'submitting', attempts = attempts + 1, updated_ms = ?2 \
                         WHERE seq = ?1",
                        params![seq, db_int(now_ms)],
                    )?;
                    claim.ready.push(Claimed { seq, function, event, replay, cause });
                }
            }
            tx.commit()?;
            Ok(())
        })?;
        self.pending.fetch_sub(claim.unreadable.min(self.pending()), Ordering::Relaxed);
        Ok(claim)
    }

    /// Ends a claimed firing: `submitted` with `job_id`.
    pub fn mark_submitted(&self, seq: i64, job_id: &str, now_ms: u64) -> Result<(), FiringError> {
        self.finish(seq, FiringState::Submitted, Some(job_id), None, now_ms)
    }

    /// Ends a claimed firing: `refused` for `reason`.
    pub fn mark_refused(&self, seq: i64, reason: &str, now_ms: u64) -> Result<(), FiringError> {
        self.finish(seq, FiringState::Refused, None, Some(reason), now_ms)
    }

    fn finish(
        &self,
        seq: i64,
        state: FiringState,
        job_id: Option<&str>,
        reason: Option<&str>,
        now_ms: u64,
    ) -> Result<(), FiringError> {
        let changed = self.with(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let changed = exec(
                &tx,
                "UPDATE firings SET state = ?2, job_id = ?3, reason = ?4, updated_ms = ?5 \
                 WHERE seq = ?1 AND state = 'submitting'",
                params![seq, state.as_str(), job_id, reason, db_int(now_ms)],
            )?;
            if changed > 0 && state == FiringState::Refused {
                audit::append_in(&tx, refusal_record(&tx, seq, reason.unwrap_or_default())?)?;
            }
            tx.commit()?;
            Ok(changed)
        })?;
        if changed > 0 {
            self.pending.fetch_sub(1u64.min(self.pending()), Ordering::Relaxed);
        }
        Ok(())
    }

    /// Puts a claimed firing that failed transiently back to `pending`, after a backoff that
    /// grows with its attempts; returns when it may run again.
    pub fn retry_later(&self, seq: i64, reason: &str, now_ms: u64) -> Result<u64, FiringError> {
        self.with(|conn| {
            let attempts: Option<i64> =
                row(conn, "SELECT attempts FROM firings WHERE seq = ?1", params![seq], |r| r.get(0)).optional()?;
            let attempts = u32::try_from(attempts.unwrap_or(1)).unwrap_or(u32::MAX);
            let at = now_ms.saturating_add(backoff_ms(attempts));
            exec(
                conn,
                "UPDATE firings SET state = 'pending', reason = ?2, not_before_ms = ?3, rate_reserved = 1, \
                 updated_ms = ?4 WHERE seq = ?1 AND state = 'submitting'",
                params![seq, reason, db_int(at), db_int(now_ms)],
            )?;
            Ok(at)
        })
    }

    /// The earliest time a pending firing may run, if any is pending.
    pub fn next_due_ms(&self) -> Result<Option<u64>, FiringError> {
        self.with(|conn| {
            let at: Option<i64> =
                row(conn, "SELECT MIN(not_before_ms) FROM firings WHERE state = 'pending'", [], |r| r.get(0))?;
            Ok(at.map(from_db))
        })
    }

    /// Deletes up to `batch` finished firings whose window ended by `now_ms`, and up to `batch`
    /// expired provenance entries; returns how many firings.
    pub fn prune(&self, now_ms: u64, batch: usize) -> Result<usize, FiringError> {
        self.with(|conn| {
            exec(
                conn,
                "DELETE FROM provenance WHERE macaroon IN (SELECT macaroon FROM provenance WHERE expires_ms <= ?1 \
                 LIMIT ?2)",
                params![db_int(now_ms), db_int(batch as u64)],
            )?;
            Ok(exec(
                conn,
                "DELETE FROM firings WHERE seq IN (SELECT seq FROM firings WHERE expires_ms <= ?1 \
                 AND state IN ('submitted', 'refused', 'superseded') LIMIT ?2)",
                params![db_int(now_ms), db_int(batch as u64)],
            )?)
        })
    }

    /// Records that the write macaroon `macaroon` (its identifier) was obtained for a job of
    /// `cause.function`: files written with it are that job's outputs. Kept as long as firing
    /// keys. Must be committed before the job is submitted, so no output can come first.
    pub fn record_provenance(&self, macaroon: &str, cause: &Cause, now_ms: u64) -> Result<(), FiringError> {
        self.record_provenance_with(macaroon, cause, now_ms, Vec::new())
    }

    /// [`Firings::record_provenance`] and the audit records of the job's credentials
    /// (`token.minted`, `macaroons.obtained`: [`crate::audit::job_credentials`]), in one
    /// transaction.
    pub fn record_provenance_with(
        &self,
        macaroon: &str,
        cause: &Cause,
        now_ms: u64,
        records: Vec<AuditDraft>,
    ) -> Result<(), FiringError> {
        let json = serde_json::to_string(cause)?;
        self.with(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            exec(
                &tx,
                "INSERT OR REPLACE INTO provenance (macaroon, cause, expires_ms) VALUES (?1, ?2, ?3)",
                params![macaroon, json, db_int(now_ms.saturating_add(self.window_ms))],
            )?;
            for r in records {
                audit::append_in(&tx, r)?;
            }
            tx.commit()?;
            Ok(())
        })
    }

    /// Appends one audit record in a transaction of its own (an admin action, which changed
    /// another database).
    pub fn append(&self, draft: AuditDraft) -> Result<audit::AuditRecord, FiringError> {
        self.with(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let record = audit::append_in(&tx, draft)?;
            tx.commit()?;
            Ok(record)
        })
    }

    /// [`Firings::append`] on a blocking thread.
    pub async fn append_async(&self, draft: AuditDraft) -> Result<audit::AuditRecord, FiringError> {
        self.call(move |f| f.append(draft)).await
    }

    /// Signs a checkpoint of the audit trail's head with `signer` when `policy` says one is
    /// due, or (`force`, at shutdown) whenever the head has none.
    pub fn checkpoint(
        &self,
        signer: &AuditSigner,
        policy: CheckpointPolicy,
        force: bool,
    ) -> Result<Option<Checkpoint>, FiringError> {
        self.with(|conn| Ok(audit::checkpoint_in(conn, signer, policy, force)?))
    }

    /// The job a write macaroon was obtained for, if this gateway obtained it.
    pub fn cause_of(&self, macaroon: &str) -> Result<Option<Cause>, FiringError> {
        self.with(|conn| lookup_cause(conn, macaroon))
    }

    /// Firings in arrival order, from `after_seq` on, at most `limit` (tests, an admin view).
    pub fn list(&self, after_seq: i64, limit: usize) -> Result<Vec<Firing>, FiringError> {
        self.with(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT seq, event_key, function, digest, replay, state, job_id, reason, superseded_by, \
                 not_before_ms, attempts, created_ms, expires_ms FROM firings WHERE seq > ?1 ORDER BY seq LIMIT ?2",
            )?;
            let rows = stmt
                .query_map(params![after_seq, db_int(limit as u64)], |r| {
                    let state: String = r.get(5)?;
                    Ok(Firing {
                        seq: r.get(0)?,
                        event_key: r.get(1)?,
                        function: r.get(2)?,
                        digest: r.get(3)?,
                        replay: r.get(4)?,
                        // An unknown state (a newer gateway's) reads as refused: never dispatched.
                        state: FiringState::parse(&state).unwrap_or(FiringState::Refused),
                        job_id: r.get(6)?,
                        reason: r.get(7)?,
                        superseded_by: r.get(8)?,
                        not_before_ms: from_db(r.get(9)?),
                        attempts: u32::try_from(r.get::<_, i64>(10)?).unwrap_or(0),
                        created_ms: from_db(r.get(11)?),
                        expires_ms: from_db(r.get(12)?),
                    })
                })?
                .collect::<Result<_, _>>()?;
            Ok(rows)
        })
    }
}

/// One event's firings inside the caller's transaction (see [`Firings::insert`]); sees
/// what earlier events of the same transaction wrote.
fn insert_event(
    tx: &rusqlite::Transaction<'_>,
    event: &StorageEvent,
    functions: &[FunctionRecord],
    replay: Option<&str>,
    now_ms: u64,
    window_ms: u64,
) -> Result<Inserted, FiringError> {
    let key = event_key(event, replay);
    let event_json = serde_json::to_string(event)?;
    let mut done = Inserted::default();
    let cause = match &event.macaroon {
        Some(id) => lookup_cause(tx, id)?,
        None => None,
    };
    let cause_json = cause.as_ref().map(serde_json::to_string).transpose()?;
    let mut fired = Vec::with_capacity(functions.len());
    for f in functions {
        let m = &f.manifest;
        if let Some(c) = &cause
            && (c.chain.len() >= MAX_CHAIN || c.chain.iter().any(|n| n == &m.name))
        {
            tracing::info!(function = %m.name, path = %event.path, chain = ?c.chain,
                "not fired: the file was written by this function's chain (loop guard)");
            done.loop_guarded += 1;
            fired.push((f, Fired::LoopGuarded));
            continue;
        }
        let debounce_ms = m.trigger.debounce_s.unwrap_or(0).saturating_mul(1000);
        let record = serde_json::to_string(f)?;
        let inserted = tx
            .prepare_cached(
                "INSERT OR IGNORE INTO firings (event_key, function, digest, version, path, replay, record, \
                 event, state, not_before_ms, created_ms, updated_ms, expires_ms, cause) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'pending', ?9, ?10, ?10, ?11, ?12)",
            )?
            .execute(params![
                key,
                m.name,
                m.module.as_str(),
                f.version,
                event.path,
                replay,
                record,
                event_json,
                db_int(now_ms.saturating_add(debounce_ms)),
                db_int(now_ms),
                db_int(now_ms.saturating_add(window_ms)),
                cause_json,
            ])?;
        if inserted == 0 {
            done.deduplicated += 1;
            fired.push((f, Fired::Duplicate));
            continue;
        }
        done.queued += 1;
        fired.push((f, Fired::Queued));
        if debounce_ms > 0 {
            let seq = tx.last_insert_rowid();
            let superseded = tx
                .prepare_cached(
                    "UPDATE firings SET state = 'superseded', superseded_by = ?1, updated_ms = ?2 \
                     WHERE function = ?3 AND path = ?4 AND state = 'pending' AND seq != ?1",
                )?
                .execute(params![seq, db_int(now_ms), m.name, event.path])?;
            done.superseded += superseded as u64;
        }
    }
    if let Some(record) = crate::audit::event_matched(event, &fired, cause.as_ref(), replay) {
        audit::append_in(tx, record)?;
    }
    Ok(done)
}

/// The `job.refused` record of firing `seq`, refused for good for `reason` (read inside the
/// refusing transaction).
fn refusal_record(tx: &rusqlite::Transaction<'_>, seq: i64, reason: &str) -> Result<AuditDraft, FiringError> {
    let row: Option<(String, String, String, Option<String>)> = tx
        .query_row("SELECT function, digest, event, replay FROM firings WHERE seq = ?1", params![seq], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .optional()?;
    let mut subject = audit::Subject::default();
    let mut replay = None;
    if let Some((function, digest, event, r)) = row {
        let event: Option<StorageEvent> = serde_json::from_str(&event).ok();
        subject = audit::Subject {
            function: Some(function),
            digest: Some(digest),
            event_id: event.as_ref().map(|e| e.id.clone()),
            paths: event.map(|e| vec![e.path]).unwrap_or_default(),
            ..subject
        };
        replay = r;
    }
    let detail = serde_json::json!({ "reason": reason, "firing": seq, "replay": replay, "by": "gateway" });
    Ok(AuditDraft::new(audit::AuditKind::JobRefused, subject, detail))
}

/// The cause recorded for the write macaroon `macaroon`; an unreadable entry counts as none
/// (logged): the worst that does is one more run, which the chain's own guard then stops.
fn lookup_cause(conn: &Connection, macaroon: &str) -> Result<Option<Cause>, FiringError> {
    let json: Option<String> = conn
        .query_row("SELECT cause FROM provenance WHERE macaroon = ?1", params![macaroon], |r| r.get(0))
        .optional()?;
    Ok(json.and_then(|j| match serde_json::from_str(&j) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::error!(macaroon, "provenance entry unreadable, ignored: {e}");
            None
        }
    }))
}

/// Brings the file up to [`SCHEMA_VERSION`] in one transaction; refuses a newer one.
fn migrate(conn: &mut Connection) -> Result<(), FiringError> {
    const _: () = assert!(SCHEMA_VERSION as usize == MIGRATIONS.len());
    htfaas_functions::store::migrate(conn, &MIGRATIONS, "firing store")?
        .map_err(|found| FiringError::SchemaTooNew { found, supported: SCHEMA_VERSION })
}

/// Dispatches firings until `shutdown`: claims the ready ones, submits each in a task of its
/// own (at most `max_in_flight` at once), prunes expired keys now and then. Cancel-safe at its
/// waits; at shutdown it lets the submissions in flight finish (up to a deadline) and
/// returns; any left `submitting` are pending again at the next start.
pub async fn dispatch(shared: Arc<Shared>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let firings = shared.firings.clone();
    let max = firings.max_in_flight();
    let mut tasks = tokio::task::JoinSet::new();
    let mut last_prune: Option<Instant> = None;
    let mut last_checkpoint = Instant::now();
    while !shutdown.is_cancelled() {
        let room = max.saturating_sub(tasks.len());
        let mut claimed_ok = true;
        if room > 0 {
            match firings.call(move |f| f.claim(now_ms(), room)).await {
                Ok(claim) => {
                    shared.stats.firings_rate_delayed.fetch_add(claim.rate_delayed, Ordering::Relaxed);
                    shared.stats.jobs_refused.fetch_add(claim.unreadable, Ordering::Relaxed);
                    for c in claim.ready {
                        tasks.spawn(fire_one(shared.clone(), c));
                    }
                }
                Err(e) => {
                    claimed_ok = false;
                    tracing::warn!("could not claim firings (will retry): {e}");
                }
            }
        }
        if last_prune.is_none_or(|t| t.elapsed() >= PRUNE_EVERY) {
            last_prune = Some(Instant::now());
            match firings.call(|f| f.prune(now_ms(), PRUNE_BATCH)).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(firings = n, "pruned expired firings"),
                Err(e) => tracing::warn!("could not prune firings: {e}"),
            }
        }
        if last_checkpoint.elapsed() >= TICK {
            last_checkpoint = Instant::now();
            checkpoint(&shared, false).await;
        }
        shared.stats.firings_pending.store(firings.pending(), Ordering::Relaxed);
        let mut wait = TICK;
        // Sleep until the next firing is due, unless the table failed (then a tick) or every
        // slot is taken (then a finished task wakes us).
        if claimed_ok
            && tasks.len() < max
            && let Ok(Some(due)) = firings.call(|f| f.next_due_ms()).await
        {
            wait = wait.min(Duration::from_millis(due.saturating_sub(now_ms())));
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = firings.wake.notified() => {}
            Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                if let Err(e) = done {
                    tracing::error!("a firing's task failed: {e}");
                }
            }
            _ = tokio::time::sleep(wait) => {}
        }
    }
    let drained = tokio::time::timeout(DRAIN_DEADLINE, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(left = tasks.len(), "firings still submitting at shutdown; they are pending again at start");
        tasks.abort_all();
    }
    // The trail's last records are signed before the gateway stops.
    checkpoint(&shared, true).await;
    tracing::info!("dispatcher stopped");
    Ok(())
}

/// Signs a checkpoint of the audit trail when one is due (or, `force`, whenever its head has
/// none); a failure is logged (the next tick tries again).
async fn checkpoint(shared: &Shared, force: bool) {
    let a = shared.audit.clone();
    match shared.firings.call(move |f| f.checkpoint(&a.signer, a.policy, force)).await {
        Ok(Some(cp)) => tracing::debug!(seq = cp.seq, "audit checkpoint signed"),
        Ok(None) => {}
        Err(e) => tracing::warn!("could not sign an audit checkpoint (will retry): {e}"),
    }
}

/// Records the job's write macaroon with the job's cause (this function appended to its
/// event's chain), so an event about a file it writes is recognised, together with the audit
/// records of its credentials (`records`). A macaroon whose identifier cannot be read is
/// refused (the guard could not work); a failed write is transient.
async fn record_provenance(
    shared: &Shared,
    c: &Claimed,
    write_macaroon: &str,
    records: Vec<AuditDraft>,
) -> Result<(), Failure> {
    let id = htfaas_functions::macaroon::identifier(write_macaroon)
        .map_err(|e| Failure::Permanent(format!("the storage's write macaroon has no readable identifier: {e}")))?;
    let m = &c.function.manifest;
    let mut chain = c.cause.as_ref().map(|cause| cause.chain.clone()).unwrap_or_default();
    chain.push(m.name.clone());
    let cause = Cause { function: m.name.clone(), digest: m.module.clone(), event_id: c.event.id.clone(), chain };
    shared
        .firings
        .call(move |f| f.record_provenance_with(&id, &cause, now_ms(), records))
        .await
        .map_err(|e| Failure::Transient(format!("record the write macaroon's provenance: {e}")))
}

/// Prepares and submits one claimed firing, and records what came of it.
async fn fire_one(shared: Arc<Shared>, c: Claimed) {
    let name = c.function.manifest.name.clone();
    let key = scheduler_dedupe_key(&c.event, &c.function, c.replay.as_deref());
    let outcome = match prepare(&shared, &c.function, event_ref(&c.event, c.cause.clone()), key).await {
        // The token is minted, and recorded with the macaroons, before the submit.
        Ok(request) => match shared.submitter.mint(&c.function.manifest.owner, &request) {
            Err(e) => Err(Failure::Permanent(e.to_string())),
            Ok((claims, token)) => {
                let records = crate::audit::job_credentials(&c, &claims, &request).to_vec();
                match record_provenance(&shared, &c, &request.output.macaroon, records).await {
                    Err(e) => Err(e),
                    Ok(()) => match shared.submitter.submit_with_token(&token, &request).await {
                        Ok(reply) => {
                            tracing::info!(job = %reply.job_id, jti = %claims.jti, created = reply.created, "job accepted");
                            Ok(reply)
                        }
                        Err(e @ (SubmitError::Unavailable(_) | SubmitError::Busy(_))) => {
                            Err(Failure::Transient(e.to_string()))
                        }
                        Err(e) => Err(Failure::Permanent(e.to_string())),
                    },
                }
            }
        },
        Err(e) => Err(e),
    };
    let (seq, firings) = (c.seq, shared.firings.clone());
    let recorded = match outcome {
        Ok(reply) => {
            Stats::bump(if reply.created { &shared.stats.jobs_submitted } else { &shared.stats.jobs_deduplicated });
            firings.call(move |f| f.mark_submitted(seq, &reply.job_id, now_ms())).await
        }
        Err(Failure::Transient(e)) => {
            tracing::warn!(function = %name, seq, "transient failure, will retry: {e}");
            Stats::bump(&shared.stats.transient_failures);
            firings.call(move |f| f.retry_later(seq, &e, now_ms()).map(|_| ())).await
        }
        Err(Failure::Permanent(e)) => {
            tracing::error!(function = %name, path = %c.event.path, "job refused: {e}");
            Stats::bump(&shared.stats.jobs_refused);
            firings.call(move |f| f.mark_refused(seq, &e, now_ms())).await
        }
    };
    if let Err(e) = recorded {
        // The row stays `submitting` until the next start re-submits it (the scheduler dedupes).
        tracing::error!(function = %name, seq, "could not record a firing's outcome: {e}");
    }
    shared.stats.firings_pending.store(shared.firings.pending(), Ordering::Relaxed);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use htfaas_functions::event::{EventKind, EventSource, SourceKind};
    use htfaas_functions::manifest::{Outputs, RateLimit, Resources, Trigger};
    use htfaas_functions::{Digest, FunctionManifest};

    /// Function `name` (version 3, owner alice) on `/data/**`, writing into `/out/<name>/`.
    pub(crate) fn function(name: &str, rate: Option<RateLimit>, debounce_s: Option<u64>) -> FunctionRecord {
        FunctionRecord {
            schema: 1,
            version: 3,
            registered_at: 0,
            manifest: FunctionManifest {
                name: name.into(),
                owner: "alice".into(),
                module: Digest::of(name.as_bytes()),
                trigger: Trigger { rate, debounce_s, ..Trigger::on_path("/data/**") },
                resources: Resources::default(),
                outputs: Outputs { dir: format!("/out/{name}/"), replace: false },
                args: vec![],
                env: vec![],
                annex: None,
                class: None,
                limits: Default::default(),
            },
        }
    }

    /// A dCache `transfer` of 7 bytes to `path`.
    pub(crate) fn event(id: &str, path: &str) -> StorageEvent {
        StorageEvent {
            source: EventSource { kind: SourceKind::DcacheBilling, producer: "pool@d".into(), message: None },
            kind: EventKind::Write,
            msg_type: "transfer".into(),
            path: path.into(),
            size: Some(7),
            storage_class: None,
            owner: None,
            id: id.into(),
            time: None,
            macaroon: None,
        }
    }

    fn open(dir: &Path) -> Firings {
        Firings::open(&dir.join("firings.sqlite"), 3600, 16).expect("open")
    }

    fn states(f: &Firings) -> Vec<(String, String, FiringState)> {
        f.list(0, 1000).expect("list").into_iter().map(|r| (r.event_key, r.function, r.state)).collect()
    }

    #[test]
    fn an_output_never_fires_its_own_chain_and_a_claim_carries_its_cause() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = open(dir.path());
        let (a, b) = (function("a", None, None), function("b", None, None));
        // a's job wrote with macaroon M1; b's job (caused by it) wrote with M2.
        let cause_a = Cause {
            function: "a".into(),
            digest: a.manifest.module.clone(),
            event_id: "e0".into(),
            chain: vec!["a".into()],
        };
        f.record_provenance("M1", &cause_a, 1_000).expect("record");
        let cause_b = Cause {
            function: "b".into(),
            event_id: "e1".into(),
            chain: vec!["a".into(), "b".into()],
            ..cause_a.clone()
        };
        f.record_provenance("M2", &cause_b, 1_000).expect("record");
        assert_eq!(f.cause_of("M1").expect("lookup"), Some(cause_a.clone()));
        assert_eq!(f.cause_of("unknown").expect("lookup"), None);

        let written =
            |id: &str, path: &str, macaroon: &str| StorageEvent { macaroon: Some(macaroon.into()), ..event(id, path) };
        // a's output: a is guarded, b fires and carries the cause.
        let done = f.insert(&written("e1", "/data/a/x", "M1"), &[a.clone(), b.clone()], None, 2_000).expect("insert");
        assert_eq!(done, Inserted { queued: 1, deduplicated: 0, superseded: 0, loop_guarded: 1 });
        // b's output: both a and b are up its chain.
        let done = f.insert(&written("e2", "/data/b/x", "M2"), &[a.clone(), b.clone()], None, 2_000).expect("insert");
        assert_eq!(done, Inserted { queued: 0, deduplicated: 0, superseded: 0, loop_guarded: 2 });
        // A file written with a macaroon this gateway never handed out fires as usual.
        let done = f.insert(&written("e3", "/data/c/x", "M9"), std::slice::from_ref(&a), None, 2_000).expect("insert");
        assert_eq!(done.queued, 1);
        let claim = f.claim(10_000, 10).expect("claim");
        let causes: Vec<_> = claim.ready.iter().map(|c| (c.function.manifest.name.clone(), c.cause.clone())).collect();
        assert_eq!(causes, [("b".to_owned(), Some(cause_a)), ("a".to_owned(), None)]);
        // Provenance goes with the key window.
        f.prune(1_000 + 3_600_000, 100).expect("prune");
        assert_eq!(f.cause_of("M1").expect("lookup"), None);
    }

    #[test]
    fn a_second_copy_of_an_event_is_dropped_on_its_key_and_a_replay_gets_its_own() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = open(dir.path());
        let (a, b) = (function("a", None, None), function("b", None, None));
        let e = event("dcache-billing:write:0001/s1", "/data/x");
        let first = f.insert(&e, &[a.clone(), b.clone()], None, 1_000).expect("insert");
        assert_eq!(first, Inserted { queued: 2, deduplicated: 0, superseded: 0, loop_guarded: 0 });
        let again = f.insert(&e, &[b.clone(), a.clone()], None, 2_000).expect("insert");
        assert_eq!(again, Inserted { queued: 0, deduplicated: 2, superseded: 0, loop_guarded: 0 });
        // Another session of the same file is another occurrence.
        let other = f.insert(&event("dcache-billing:write:0001/s2", "/data/x"), std::slice::from_ref(&a), None, 2_000);
        assert_eq!(other.expect("insert").queued, 1);
        // A replay runs again, once per replay id.
        assert_eq!(f.insert(&e, std::slice::from_ref(&a), Some("r1"), 3_000).expect("insert").queued, 1);
        assert_eq!(f.insert(&e, std::slice::from_ref(&a), Some("r1"), 3_000).expect("insert").deduplicated, 1);
        assert_eq!(f.pending(), 4);
        let rows = f.list(0, 100).expect("list");
        assert_eq!(rows[3].event_key, "replay:r1#dcache-billing:write:0001/s1");
        assert_eq!(rows[3].replay.as_deref(), Some("r1"));
        assert_eq!(rows[0].expires_ms, 1_000 + 3_600_000);
    }

    #[test]
    fn one_functions_backlog_does_not_keep_another_functions_firing_out_of_the_next_claim() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = open(dir.path());
        let (flood, one, two) =
            (function("flood", None, None), function("one", None, None), function("two", None, None));
        for i in 0..200 {
            f.insert(&event(&format!("a{i}"), "/data/a"), std::slice::from_ref(&flood), None, 0).expect("insert");
        }
        // Later events of two other functions.
        f.insert(&event("b0", "/data/b"), std::slice::from_ref(&one), None, 5).expect("insert");
        f.insert(&event("c0", "/data/c"), std::slice::from_ref(&two), None, 6).expect("insert");
        let claim = f.claim(10, 4).expect("claim");
        let ids: Vec<&str> = claim.ready.iter().map(|c| c.event.id.as_str()).collect();
        assert_eq!(ids.len(), 4);
        assert!(ids.contains(&"b0") && ids.contains(&"c0"), "{ids:?}");
        // The flood's own firings still go oldest first.
        let flood_ids: Vec<&str> = ids.iter().copied().filter(|i| i.starts_with('a')).collect();
        assert_eq!(flood_ids, ["a0", "a1"]);
        // With the others claimed, a claim takes the flood alone, in order.
        let next = f.claim(10, 3).expect("claim");
        assert_eq!(next.ready.iter().map(|c| c.event.id.as_str()).collect::<Vec<_>>(), ["a2", "a3", "a4"]);
        // Claims of one firing each (a dispatcher with one free slot) go round the functions.
        f.insert(&event("b1", "/data/b"), std::slice::from_ref(&one), None, 20).expect("insert");
        f.insert(&event("c1", "/data/c"), std::slice::from_ref(&two), None, 20).expect("insert");
        let mut singles: Vec<String> =
            (0..3).map(|_| f.claim(30, 1).expect("claim").ready[0].event.id.clone()).collect();
        singles.sort();
        assert_eq!(singles, ["a5", "b1", "c1"]);
    }

    #[test]
    fn keys_are_forgotten_after_their_window_but_pending_firings_are_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = open(dir.path());
        let a = function("a", None, None);
        for (i, at) in [(1, 0), (2, 0), (3, 0), (4, 1_000_000)] {
            f.insert(&event(&format!("e{i}"), "/data/x"), std::slice::from_ref(&a), None, at).expect("insert");
        }
        let claim = f.claim(0, 2).expect("claim");
        assert_eq!(claim.ready.iter().map(|c| c.event.id.as_str()).collect::<Vec<_>>(), ["e1", "e2"]);
        f.mark_submitted(claim.ready[0].seq, "job-1", 10).expect("mark");
        f.mark_refused(claim.ready[1].seq, "no", 10).expect("mark");
        assert_eq!(f.pending(), 2);
        // Not yet expired.
        assert_eq!(f.prune(3_599_999, 10).expect("prune"), 0);
        // e1 and e2 are finished and expired; e3 expired too but is pending; e4 is not expired.
        assert_eq!(f.prune(3_600_000, 1).expect("prune"), 1, "bounded batch");
        assert_eq!(f.prune(3_600_000, 10).expect("prune"), 1);
        let left: Vec<_> = states(&f).into_iter().map(|(k, _, s)| (k, s)).collect();
        assert_eq!(left, [("e3".into(), FiringState::Pending), ("e4".into(), FiringState::Pending)]);
        // Its key forgotten, e1 may be inserted again (the scheduler's key still dedupes it).
        assert_eq!(f.insert(&event("e1", "/data/x"), &[a], None, 3_600_001).expect("insert").queued, 1);
    }

    #[test]
    fn a_burst_of_writes_to_one_path_leaves_one_firing_for_the_last_event_after_the_window() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = open(dir.path());
        let d = function("d", None, Some(2));
        let plain = function("plain", None, None);
        let both = [d.clone(), plain.clone()];
        for (i, at) in [(1, 0u64), (2, 100), (3, 200)] {
            let done = f.insert(&event(&format!("w{i}"), "/data/one"), &both, None, at).expect("insert");
            assert_eq!(done.superseded, u64::from(i > 1), "w{i}");
        }
        // Another path is debounced on its own.
        f.insert(&event("o1", "/data/other"), std::slice::from_ref(&d), None, 200).expect("insert");
        // The plain function fires on every event, at once; the debounced one waits.
        let now = f.claim(300, 100).expect("claim");
        let fired: Vec<_> =
            now.ready.iter().map(|c| (c.function.manifest.name.as_str(), c.event.id.as_str())).collect();
        assert_eq!(fired, [("plain", "w1"), ("plain", "w2"), ("plain", "w3")]);
        assert!(f.claim(2_199, 100).expect("claim").ready.is_empty(), "w3 waits 2 s from its arrival");
        let later = f.claim(2_200, 100).expect("claim");
        let fired: Vec<_> =
            later.ready.iter().map(|c| (c.function.manifest.name.as_str(), c.event.id.as_str())).collect();
        assert_eq!(fired, [("d", "w3"), ("d", "o1")]);
        let rows = f.list(0, 100).expect("list");
        let w1 = rows.iter().find(|r| r.event_key == "w1" && r.function == "d").expect("w1");
        let w2 = rows.iter().find(|r| r.event_key == "w2" && r.function == "d").expect("w2");
        let w3 = rows.iter().find(|r| r.event_key == "w3" && r.function == "d").expect("w3");
        assert_eq!((w1.state, w2.state), (FiringState::Superseded, FiringState::Superseded));
        assert_eq!((w1.superseded_by, w2.superseded_by), (Some(w2.seq), Some(w3.seq)));
        // A redelivered superseded event stays dropped.
        assert_eq!(f.insert(&event("w1", "/data/one"), &[d], None, 3_000).expect("insert").deduplicated, 1);
        assert_eq!(f.pending(), 5, "3 plain + w3 + o1 submitting");
    }

    fn new(e: StorageEvent, functions: &[FunctionRecord]) -> NewFirings {
        NewFirings { event: e, functions: functions.to_vec(), replay: None }
    }

    #[test]
    fn two_copies_of_an_event_in_one_batch_make_one_firing_per_function() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = open(dir.path());
        let (a, b) = (function("a", None, None), function("b", None, None));
        let e = event("dcache-billing:write:0001/s1", "/data/x");
        let batch = [
            new(e.clone(), &[a.clone(), b.clone()]),
            new(event("e2", "/data/y"), std::slice::from_ref(&a)),
            new(e.clone(), &[b.clone(), a.clone()]),
            // A replay's copy of the same event in the same batch is its own.
            NewFirings { replay: Some("r1".into()), ..new(e.clone(), std::slice::from_ref(&a)) },
        ];
        let done = f.insert_batch(&batch, 1_000).expect("batch");
        let q = |queued, deduplicated| Inserted { queued, deduplicated, superseded: 0, loop_guarded: 0 };
        assert_eq!(done, [q(2, 0), q(1, 0), q(0, 2), q(1, 0)]);
        assert_eq!(f.pending(), 4);
        let keys: Vec<_> = states(&f).into_iter().map(|(k, func, _)| format!("{k}/{func}")).collect();
        assert_eq!(
            keys,
            [
                "dcache-billing:write:0001/s1/a",
                "dcache-billing:write:0001/s1/b",
                "e2/a",
                "replay:r1#dcache-billing:write:0001/s1/a"
            ]
        );
        // The same batch redelivered (acks lost) is dropped whole; so is one insert of it.
        let again = f.insert_batch(&batch, 2_000).expect("batch");
        assert_eq!(again, [q(0, 2), q(0, 1), q(0, 2), q(0, 1)]);
        assert_eq!(f.insert(&e, &[a], None, 3_000).expect("insert"), q(0, 1));
        assert_eq!(f.pending(), 4);
        assert!(f.insert_batch(&[], 3_000).expect("empty").is_empty());
    }

    #[test]
    fn debounce_supersedes_in_arrival_order_inside_a_batch_and_across_batches() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = open(dir.path());
        let d = function("d", None, Some(2));
        let one = |id: &str, path: &str| new(event(id, path), std::slice::from_ref(&d));
        f.insert_batch(&[one("w1", "/data/one")], 0).expect("batch");
        let done = f
            .insert_batch(&[one("w2", "/data/one"), one("o1", "/data/other"), one("w3", "/data/one")], 100)
            .expect("batch");
        assert_eq!(done.iter().map(|d| (d.queued, d.superseded)).collect::<Vec<_>>(), [(1, 1), (1, 0), (1, 1)]);
        assert_eq!(f.pending(), 2, "w3 and o1");
        let rows = f.list(0, 100).expect("list");
        let row = |k: &str| rows.iter().find(|r| r.event_key == k).expect("row").clone();
        let (w1, w2, w3, o1) = (row("w1"), row("w2"), row("w3"), row("o1"));
        assert_eq!((w1.state, w1.superseded_by), (FiringState::Superseded, Some(w2.seq)));
        assert_eq!((w2.state, w2.superseded_by), (FiringState::Superseded, Some(w3.seq)));
        assert_eq!((w3.state, o1.state), (FiringState::Pending, FiringState::Pending));
        assert_eq!(w3.not_before_ms, 2_100);
        let fired: Vec<_> = f.claim(2_100, 10).expect("claim").ready.into_iter().map(|c| c.event.id).collect();
        assert_eq!(fired, ["o1", "w3"], "arrival order");
    }

    #[test]
    fn the_loop_guard_looks_up_each_event_of_a_batch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = open(dir.path());
        let (a, b) = (function("a", None, None), function("b", None, None));
        let cause_a = Cause {
            function: "a".into(),
            digest: a.manifest.module.clone(),
            event_id: "e0".into(),
            chain: vec!["a".into()],
        };
        f.record_provenance("M1", &cause_a, 0).expect("record");
        let long = Cause { chain: vec!["x".into(); MAX_CHAIN], ..cause_a.clone() };
        f.record_provenance("M2", &long, 0).expect("record");
        let written =
            |id: &str, macaroon: &str| StorageEvent { macaroon: Some(macaroon.into()), ..event(id, "/data/x") };
        let both = [a.clone(), b.clone()];
        let done = f
            .insert_batch(
                &[
                    new(written("e1", "M1"), &both),
                    new(event("e2", "/data/x"), &both),
                    new(written("e3", "M2"), &both),
                    new(written("e4", "M9"), &both),
                ],
                1_000,
            )
            .expect("batch");
        let g = |queued, loop_guarded| Inserted { queued, deduplicated: 0, superseded: 0, loop_guarded };
        assert_eq!(done, [g(1, 1), g(2, 0), g(0, 2), g(2, 0)]);
        let claim = f.claim(1_000, 10).expect("claim");
        let fired: Vec<_> = claim
            .ready
            .iter()
            .map(|c| (c.event.id.as_str(), c.function.manifest.name.as_str(), c.cause.is_some()))
            .collect();
        assert_eq!(
            fired,
            [("e1", "b", true), ("e2", "a", false), ("e2", "b", false), ("e4", "a", false), ("e4", "b", false)]
        );
        assert_eq!(claim.ready[0].cause, Some(cause_a));
    }

    #[test]
    fn a_failed_batch_writes_nothing_and_can_be_inserted_again_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = open(dir.path());
        let (a, d) = (function("a", None, None), function("d", None, Some(2)));
        f.insert(&event("w0", "/data/one"), std::slice::from_ref(&d), None, 0).expect("insert");
        // The table refuses the third event's firing, after the first two were written in the
        // transaction (and w0 superseded by w1).
        f.with(|c| {
            Ok(c.execute_batch(
                "CREATE TRIGGER refuse_bad BEFORE INSERT ON firings WHEN NEW.event_key = 'bad' \
                 BEGIN SELECT RAISE(ABORT, 'injected failure'); END;",
            )?)
        })
        .expect("trigger");
        let batch = [
            new(event("w1", "/data/one"), &[a.clone(), d.clone()]),
            new(event("e2", "/data/two"), std::slice::from_ref(&a)),
            new(event("bad", "/data/three"), std::slice::from_ref(&a)),
        ];
        let e = f.insert_batch(&batch, 100).expect_err("refused");
        assert!(e.to_string().contains("injected failure"), "{e}");
        assert_eq!(states(&f), [("w0".into(), "d".into(), FiringState::Pending)], "nothing of the batch");
        assert_eq!(f.pending(), 1);
        f.with(|c| Ok(c.execute_batch("DROP TRIGGER refuse_bad;")?)).expect("drop trigger");
        // Redelivered, the whole batch is new: no half of it was kept.
        let done = f.insert_batch(&batch, 200).expect("batch");
        assert_eq!(
            done.iter().map(|d| (d.queued, d.deduplicated, d.superseded)).collect::<Vec<_>>(),
            [(2, 0, 1), (1, 0, 0), (1, 0, 0)]
        );
        assert_eq!(f.pending(), 4, "w1 a, w1 d, e2, bad; w0 superseded");
    }

    #[test]
    fn the_token_bucket_lends_future_tokens_at_its_rate() {
        let mut b = TokenBucket::new(2.0, 1, 0);
        assert_eq!(b.reserve(0), 0);
        assert_eq!(b.reserve(0), 500);
        assert_eq!(b.reserve(0), 1_000);
        assert_eq!(b.reserve(100), 1_500, "lent tokens stay lent");
        // After a quiet spell the bucket is full again, up to its burst.
        let mut b = TokenBucket::new(10.0, 3, 0);
        assert_eq!([b.reserve(0), b.reserve(0), b.reserve(0), b.reserve(0)], [0, 0, 0, 100]);
        assert_eq!(b.reserve(10_000), 10_000);
        assert_eq!(b.reserve(10_000), 10_000);
        assert_eq!(b.reserve(10_000), 10_000);
        assert_eq!(b.reserve(10_000), 10_100);
        // Refill is capped at the burst.
        let mut b = TokenBucket::new(1.0, 2, 0);
        assert_eq!([b.reserve(100_000), b.reserve(100_000), b.reserve(100_000)], [100_000, 100_000, 101_000]);
    }

    #[test]
    fn rate_limited_firings_wait_for_their_token_and_none_is_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = open(dir.path());
        let r = function("r", Some(RateLimit { per_s: 2.0, burst: 1 }), None);
        for i in 0..4 {
            f.insert(&event(&format!("e{i}"), &format!("/data/{i}")), std::slice::from_ref(&r), None, 0).expect("ins");
        }
        let first = f.claim(0, 100).expect("claim");
        assert_eq!((first.ready.len(), first.rate_delayed), (1, 3));
        let nb: Vec<u64> = f.list(0, 10).expect("list").iter().map(|r| r.not_before_ms).collect();
        assert_eq!(nb, [0, 500, 1_000, 1_500]);
        assert!(f.claim(499, 100).expect("claim").ready.is_empty());
        for at in [500, 1_000, 1_500] {
            let c = f.claim(at, 100).expect("claim");
            assert_eq!((c.ready.len(), c.rate_delayed), (1, 0), "at {at}: its reserved token");
        }
        assert_eq!(f.pending(), 4, "all submitting, none dropped");
    }

    #[test]
    fn pending_and_submitting_firings_survive_a_restart_and_failures_back_off() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = function("a", None, None);
        {
            let f = open(dir.path());
            for i in 0..3 {
                f.insert(&event(&format!("e{i}"), "/data/x"), std::slice::from_ref(&a), None, 0).expect("insert");
            }
            let c = f.claim(0, 2).expect("claim");
            f.mark_submitted(c.ready[0].seq, "job-0", 1).expect("mark");
            // e1 is submitting when the gateway dies; e2 is pending.
        }
        let f = open(dir.path());
        assert_eq!(f.pending(), 2);
        let c = f.claim(10, 10).expect("claim");
        assert_eq!(c.ready.iter().map(|c| c.event.id.as_str()).collect::<Vec<_>>(), ["e1", "e2"]);
        assert_eq!(c.ready[0].function, a, "the stored record");
        // A redelivery after the restart is still dropped.
        assert_eq!(f.insert(&event("e0", "/data/x"), std::slice::from_ref(&a), None, 20).expect("ins").deduplicated, 1);
        // Transient failures: 0.5 s, 1 s, 2 s, … up to a minute.
        let seq = c.ready[1].seq;
        assert_eq!(f.retry_later(seq, "down", 100).expect("retry"), 100 + 500);
        assert!(f.claim(599, 10).expect("claim").ready.is_empty());
        assert_eq!(f.claim(600, 10).expect("claim").ready.len(), 1);
        assert_eq!(f.retry_later(seq, "down", 1_000).expect("retry"), 1_000 + 1_000);
        assert_eq!((backoff_ms(1), backoff_ms(3), backoff_ms(8), backoff_ms(40)), (500, 2_000, 60_000, 60_000));
        let row = f.list(0, 10).expect("list").into_iter().find(|r| r.seq == seq).expect("row");
        assert_eq!((row.state, row.attempts, row.reason.as_deref()), (FiringState::Pending, 2, Some("down")));
    }

    #[test]
    fn a_newer_schema_is_refused_and_an_unreadable_row_is_refused_not_fatal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = open(dir.path());
        f.insert(&event("e", "/data/x"), &[function("a", None, None)], None, 0).expect("insert");
        f.with(|c| Ok(c.execute("UPDATE firings SET record = 'not json'", [])?)).expect("corrupt");
        let c = f.claim(0, 10).expect("claim");
        assert_eq!((c.ready.len(), c.unreadable), (0, 1));
        assert_eq!(states(&f)[0].2, FiringState::Refused);
        f.with(|c| Ok(c.pragma_update(None, "user_version", SCHEMA_VERSION + 1)?)).expect("bump");
        drop(f);
        let e = Firings::open(&dir.path().join("firings.sqlite"), 1, 1).expect_err("refused");
        assert!(
            matches!(e, FiringError::SchemaTooNew { found, supported } if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION),
            "{e}"
        );
    }

    #[test]
    fn a_version_1_file_is_migrated_keeping_its_firings() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("firings.sqlite");
        {
            let conn = Connection::open(&path).expect("open");
            conn.execute_batch(SCHEMA_1).expect("version 1 schema");
            conn.pragma_update(None, "user_version", 1).expect("version");
            conn.execute(
                "INSERT INTO firings (event_key, function, digest, version, path, record, event, state, not_before_ms, \
                 created_ms, updated_ms, expires_ms) VALUES ('e', 'a', 'd', 1, '/p', ?1, ?2, 'pending', 0, 0, 0, 1)",
                params![
                    serde_json::to_string(&function("a", None, None)).expect("json"),
                    serde_json::to_string(&event("e", "/p")).expect("json")
                ],
            )
            .expect("a version 1 firing");
        }
        let f = Firings::open(&path, 3600, 16).expect("migrated");
        let claim = f.claim(0, 10).expect("claim");
        assert_eq!(claim.ready.len(), 1);
        assert_eq!(claim.ready[0].cause, None);
        assert_eq!(f.cause_of("M").expect("provenance table exists"), None);
    }

    /// A stand-in on 127.0.0.1 answering every request with `status` and `body`.
    async fn answering(status: u16, body: serde_json::Value) -> (String, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let app = axum::Router::new().fallback(move || {
            let body = body.clone();
            async move { (axum::http::StatusCode::from_u16(status).expect("status"), axum::Json(body)) }
        });
        (url, tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") }))
    }

    /// A gateway whose storage and scheduler are at these URLs, its macaroon requests bounded
    /// by `storage_timeout`.
    async fn gateway(dir: &Path, storage: &str, scheduler: &str, storage_timeout: Duration) -> Arc<Shared> {
        let config: crate::Config = serde_json::from_value(serde_json::json!({
            "listen": "127.0.0.1:0", "nats_url": "nats://127.0.0.1:1",
            "registry_dir": dir.join("registry"), "storage_url": storage, "storage_user": "gateway",
            "scheduler_url": scheduler, "scheduler_admin_token": "s", "signing_key_file": dir.join("submit.pem"),
            "admin_token": "a",
            "namespaces": [{"principal": "alice", "right": "read", "value": "/data/"},
                {"principal": "alice", "right": "write", "value": "/out/"}],
        }))
        .expect("config");
        let mut settings = config.resolve().await.expect("resolve");
        let shared = Arc::get_mut(&mut settings.shared).expect("the only reference");
        let http = crate::storage_http_client(None, None, None).expect("client");
        let auth = crate::storage_client::StorageAuth::Basic { user: "gateway".into(), secret: "s".into() };
        shared.storage = crate::storage_client::StorageClient::new(
            http,
            crate::storage_client::StorageKind::Dcache,
            storage,
            auth,
            "PT2H",
            "PT4H",
        )
        .with_timeout(storage_timeout);
        settings.shared()
    }

    /// Issue 9: a scheduler whose disk is full answers 507, and a storage that accepts the
    /// connection and then never answers costs a macaroon request its timeout; either way the
    /// firing stays pending with the reason and a backoff, is counted as a transient failure,
    /// and is neither refused nor dropped.
    #[tokio::test]
    async fn a_full_scheduler_disk_or_a_stalled_storage_leaves_the_firing_pending_with_backoff() {
        let key = htfaas_functions::macaroon::RootKey::derive(b"stand-in storage secret");
        let macaroon =
            htfaas_functions::macaroon::mint(&key, "stand-in", "mac-1", &["activity:UPLOAD".into()]).expect("mint");
        let (storage, storage_task) = answering(200, serde_json::json!({ "macaroon": macaroon })).await;
        let full = serde_json::json!({"error": "insufficient storage: the job queue's disk is full"});
        let (scheduler, scheduler_task) = answering(507, full).await;
        // Accepts connections and holds them without a byte of answer.
        let stalled = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let stalled_url = format!("http://{}", stalled.local_addr().expect("addr"));
        let stall_task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = stalled.accept().await {
                held.push(conn);
            }
        });

        for (case, storage_url, expect) in [
            (
                "scheduler disk full",
                storage.as_str(),
                "scheduler unavailable: 507 Insufficient Storage: insufficient storage",
            ),
            ("storage stalls", stalled_url.as_str(), "storage unavailable: no answer within 300ms"),
        ] {
            let dir = tempfile::tempdir().expect("tempdir");
            let shared = gateway(dir.path(), storage_url, &scheduler, Duration::from_millis(300)).await;
            let a = function("a", None, None);
            shared.firings.insert(&event("e1", "/data/x"), std::slice::from_ref(&a), None, now_ms()).expect("insert");
            let mut claim = shared.firings.claim(now_ms(), 10).expect("claim");
            let claimed = claim.ready.pop().expect("one ready");
            let before = now_ms();
            fire_one(shared.clone(), claimed).await;

            let rows = shared.firings.list(0, 10).expect("list");
            let row = &rows[0];
            assert_eq!((row.state, row.attempts), (FiringState::Pending, 1), "{case}: {row:?}");
            let reason = row.reason.as_deref().unwrap_or_default();
            assert!(reason.starts_with(expect), "{case}: {reason}");
            assert!(row.not_before_ms >= before + backoff_ms(1), "{case}: retried after a backoff");
            assert_eq!(shared.firings.pending(), 1, "{case}");
            let s = shared.stats.snapshot();
            assert_eq!((s.transient_failures, s.jobs_refused, s.jobs_submitted), (1, 0, 0), "{case}");
            // Not yet due again; due after the backoff.
            assert!(shared.firings.claim(before, 10).expect("claim").ready.is_empty(), "{case}");
            assert_eq!(shared.firings.claim(row.not_before_ms, 10).expect("claim").ready.len(), 1, "{case}");
        }
        for t in [storage_task, scheduler_task, stall_task] {
            t.abort();
        }
    }
}
