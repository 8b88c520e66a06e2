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
//! A thread of its own copies committed WAL pages into the file
//! ([`htfaas_functions::store::Checkpointer`]): the writer checkpoints only as a backstop, so no
//! batch waits behind a checkpoint (the dispatch bench's rate rose by a quarter).
//!
//! Stored format: `PRAGMA user_version` = [`SCHEMA_VERSION`]; [`MIGRATIONS`] bring an older
//! file (or an empty one) up to it in one transaction (version 3 added the nullable
//! `hold_code` column; older rows read it as `NULL`). A job keeps the full [`SubmitRequest`]
//! as JSON, in `job_requests` beside its row (written once; it holds the original macaroons,
//! sealed, which never leave through the API; EPs get attenuated copies), and in its row its
//! submit token's `jti`, issuer and accounting group, and what its records and indexes name of
//! the request (function, digest, event id, input path, trace id). Version 10 shaped the
//! table for a job's writes: a narrow row each step rewrites, state indexes over the jobs
//! that may still change only, and counts by state kept by triggers.
//!
//! Job states (`state` column): `idle` → `running` (dispatch) → `completed` | `failed` (the EP's
//! report); `running` → `idle` (a guest failure its retry policy lists, with retries left: the
//! attempt ends `failed`, the policy's backoff in `not_before_ms`); `running` → `idle` (its session ended, its EP reported the storage unavailable,
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
//! ([`Queue::record_refusals`]). Every job's record names the job, its token's `jti`, owner,
//! function, digest and event, and its input path.
//!
//! The store in files: `schema.rs` (stored format and migrations), `writer.rs` (the group-commit
//! writer thread), `jobs.rs` (submit, admin actions and job records), `runs.rs` (the read model
//! matching reads, dispatch, lost sessions and the EP's reports), `retry.rs` (a function's
//! retry policy after a guest failure), `accounts.rs` (fair-share
//! charging and usage), `revocations.rs`, `ep_admin.rs`, `renewals.rs` (what a renewal of a
//! running job's macaroons reads, and its record) and `trail.rs` (the audit trail's records
//! and checkpoints), `outbox.rs` (the job-end notifications waiting to be published, written
//! by a trigger in the transaction that ends a job). Every file adds its own `impl Queue` block.
//!
//! Layer: the store and its read model. It must not know axum, HTTP, EP sessions, the EP table
//! or the dispatcher: it takes and returns plain values ([`IdleJob`], [`PoolRoom`], [`Action`]).
//!
//! [`SubmitRequest`]: htfaas_functions::proto::SubmitRequest
//! [`HOLD_CODE_RETRIES`]: htfaas_functions::proto::HOLD_CODE_RETRIES
//! [`HOLD_CODE_STORAGE`]: htfaas_functions::proto::HOLD_CODE_STORAGE

mod accounts;
mod ep_admin;
mod handback;
mod idle;
mod jobs;
mod outbox;
mod renewals;
mod resume;
mod retry;
mod revocations;
mod runs;
mod schema;
mod trail;
mod writer;

#[cfg(test)]
mod resume_tests;
#[cfg(test)]
mod schema_tests;
#[cfg(test)]
mod seal_tests;
#[cfg(test)]
mod tests;

pub use accounts::{UsageRow, decay};
pub use ep_admin::EpAdminRow;
pub use handback::HandedBack;
pub use htfaas_functions::store::now_ms;
pub use idle::{BATCH, FunctionLimit, IdleJob, MAX_OWNERS_PER_POOL, MAX_OWNERS_SCANNED, Pool, PoolRoom};
pub use jobs::{Acted, Action, MAX_LOG_BYTES, NewJob, Submitted};
pub use renewals::RenewalFacts;
pub use retry::DEFAULT_MAX_GUEST_RETRIES;
pub use revocations::Recorded;
pub(crate) use runs::assignment;
pub use runs::{Finished, Loss, Lost, MAX_BACKOFF_MS, Marked};
pub use schema::{MIGRATIONS, SCHEMA_VERSION};
pub use trail::{AUDIT_WRITER, Refusal, UNVERIFIED_REFUSALS_BURST, UNVERIFIED_REFUSALS_PER_S, url_path};
pub use writer::MAX_BATCH;

use crate::error::QueueError;
use crate::revocation::Revoked;
use htfaas_functions::audit::{self, AuditDraft};
use htfaas_functions::store::{Checkpointer, Durability, db_int, exec, from_db, writer_checkpoints_as_backstop};
use revocations::read_revocations;
use rusqlite::{Connection, TransactionBehavior, params};
use schema::{migrate, seal_stored};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use trail::{RefusalBudget, job_subject, subject_state};
use writer::Writer;

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
    /// Copies committed WAL pages into the database file, off the writer's thread.
    _checkpointer: Arc<Checkpointer>,
    /// What a commit waits for (the `synchronous` pragma set at open).
    durability: Durability,
    /// The file, for read-only audit queries and verification on connections of their own.
    path: PathBuf,
    /// Half-life of decayed usage, seconds ([`Queue::set_half_life`]).
    half_life_s: f64,
    /// Most retries after guest failures, whatever a job's policy asks for
    /// ([`Queue::set_max_guest_retries`]).
    max_guest_retries: u32,
    /// Revoked targets, loaded at open; checked inside submit transactions and by the API.
    revoked: Arc<RwLock<Revoked>>,
    /// Bounds the records of refusals whose token did not verify ([`Queue::record_refusals`]).
    unverified_refusals: Arc<Mutex<RefusalBudget>>,
    /// Seals the macaroons of every stored request ([`crate::seal`]).
    sealer: Arc<crate::seal::Sealer>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").finish_non_exhaustive()
    }
}

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
        writer_checkpoints_as_backstop(&conn)?;
        // A savepoint's statement journal (each write of a group-committed batch but the first has
        // one) stays in memory, bounded by what one write changes, instead of spilling to a
        // temporary file: those spills were a twentieth of the writer's CPU in the dispatch bench.
        conn.pragma_update(None, "temp_store", "MEMORY")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        // Every hot statement stays parsed ([`exec`]), and its plan does not depend on the
        // values bound to it: without the query planner stability guarantee the bundled
        // SQLite (built with STAT4) prepares a cached statement again whenever a bound value
        // could change its plan, which was most of the scheduler's SQL parsing.
        conn.set_prepared_statement_cache_capacity(128);
        conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
        migrate(&mut conn)?;
        outbox::install(&conn)?;
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
            tracing::info!(jobs = sealed, "sealed for their jobs the macaroons and secrets an older build stored");
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
        let checkpointer = Checkpointer::start(path, durability.sqlite_synchronous(), "queue-checkpoint")
            .map_err(|e| QueueError::Task(e.to_string()))?;
        Ok(Queue {
            _checkpointer: Arc::new(checkpointer),
            conn,
            read: Arc::new(Mutex::new(read)),
            writer: Arc::new(writer),
            durability,
            path: path.to_owned(),
            half_life_s: 86_400.0,
            max_guest_retries: DEFAULT_MAX_GUEST_RETRIES,
            revoked: Arc::new(RwLock::new(revoked)),
            unverified_refusals: Arc::new(Mutex::new(RefusalBudget::new())),
            sealer,
        })
    }

    /// Sets the half-life with which usage decays (charged from now on).
    pub fn set_half_life(&mut self, half_life_s: u64) {
        self.half_life_s = half_life_s as f64;
    }

    /// Caps the retries after guest failures that a job's retry policy may have (the site's
    /// `max_guest_retries`; [`DEFAULT_MAX_GUEST_RETRIES`] until set). 0 retries no guest failure.
    pub fn set_max_guest_retries(&mut self, max: u32) {
        self.max_guest_retries = max;
    }

    /// The half-life of decayed usage, seconds.
    pub fn half_life_s(&self) -> f64 {
        self.half_life_s
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
        self.writer.counts.batches.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many writes the writer has run (committed or not) since the queue was opened.
    pub fn writes(&self) -> u64 {
        self.writer.counts.writes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Runs `f` on the reading connection, off the async threads. Reads only: SQLite refuses a
    /// write there.
    async fn call<T, F>(&self, f: F) -> Result<T, QueueError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, QueueError> + Send + 'static,
    {
        Self::on(self.read.clone(), f).await
    }

    /// Runs `f` on the reading connection on this thread when no other read holds it, else as
    /// [`Queue::call`] does. Only for short reads of a few rows by an index, as every dispatch
    /// round makes: a WAL reader does not wait for the writer, and the hand-off to a blocking
    /// thread and back cost the scheduler more than such a read (four context switches).
    async fn call_now<T, F>(&self, f: F) -> Result<T, QueueError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, QueueError> + Send + 'static,
    {
        let f = match self.read.try_lock() {
            Ok(mut conn) => return f(&mut conn),
            Err(std::sync::TryLockError::Poisoned(_)) => return Err(QueueError::Poisoned),
            Err(std::sync::TryLockError::WouldBlock) => f,
        };
        self.call(f).await
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

    /// The store's file (the audit trail is in it).
    pub fn path(&self) -> &Path {
        &self.path
    }
}
