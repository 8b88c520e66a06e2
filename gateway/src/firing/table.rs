//! The durable firing table ([`Firings`]): inserts (one transaction per batch, with the
//! events' audit records), claims, outcomes, pruning, provenance for the loop guard.
//!
//! Must not know: NATS, HTTP, the storage or the scheduler.

use super::bucket::TokenBucket;
use super::insert::lookup_cause;
use super::rows::insert_event;
use super::schema::migrate;
use super::{CLAIM_SCAN, Claim, Claimed, Firing, FiringError, FiringState, Inserted, NewFirings, now_ms};
use htfaas_functions::FunctionRecord;
use htfaas_functions::audit::{self, AuditDraft, AuditSigner, Checkpoint, CheckpointPolicy};
use htfaas_functions::event::StorageEvent;
use htfaas_functions::proto::Cause;
use htfaas_functions::store::begin_immediate;
use htfaas_functions::store::{Checkpointer, Durability, db_int, exec, from_db, row};
use rusqlite::{Connection, OptionalExtension as _, params};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// The durable firing table; cheap to clone.
#[derive(Clone)]
pub struct Firings {
    conn: Arc<Mutex<Connection>>,
    /// Copies committed WAL pages into the database file, off the connection's lock.
    _checkpointer: Arc<Checkpointer>,
    /// The file, for read-only audit queries and verification on connections of their own.
    path: Arc<PathBuf>,
    pub(super) window_ms: u64,
    max_in_flight: usize,
    /// Firings pending or submitting: a gauge, kept in step with every write.
    pub(super) pending: Arc<AtomicU64>,
    /// Rate buckets per function name.
    buckets: Arc<Mutex<HashMap<String, TokenBucket>>>,
    /// Wakes the dispatcher after an insert.
    pub(crate) wake: Arc<Notify>,
    /// Claims so far: where each claim's round robin over functions starts ([`ready_rows`]).
    claims: Arc<AtomicU64>,
}

impl std::fmt::Debug for Firings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Firings").field("window_ms", &self.window_ms).finish_non_exhaustive()
    }
}

/// A ready row as read by a claim: seq, record, event, rate_reserved, replay, cause.
type ClaimRow = (i64, String, String, i64, Option<String>, Option<String>, i64, Option<i64>);

/// Up to `limit` ready firings (`pending`, `not_before_ms` ≤ `now_ms`), taken in turn from each
/// owner that has some, and within an owner in turn from each of its functions, each
/// function's oldest first; returned oldest first. One owner's backlog (a flood, or many
/// functions with a backlog each) does not keep another owner's firing waiting behind it, nor
/// one function's another function's of the same owner. Owners and their
/// functions are found by walking the `firings_ready_by_owner` index from name to name, so
/// the cost grows with the number of owners and functions with pending firings, not with the
/// firings. Claim number `turn` starts its round with the `turn`-th owner (and each owner's
/// round with its `turn`-th function), so that claims of one firing each still go round.
fn ready_rows(tx: &Connection, now_ms: u64, limit: usize, turn: u64) -> rusqlite::Result<Vec<ClaimRow>> {
    let rotate = |names: &mut Vec<String>| {
        if !names.is_empty() {
            let start = usize::try_from(turn % names.len() as u64).unwrap_or(0);
            names.rotate_left(start);
        }
    };
    let mut owners: Vec<String> = tx
        .prepare_cached(
            "WITH RECURSIVE o(name) AS ( \
               SELECT MIN(owner) FROM firings WHERE state = 'pending' \
               UNION ALL \
               SELECT (SELECT MIN(owner) FROM firings WHERE state = 'pending' AND owner > o.name) \
               FROM o WHERE o.name IS NOT NULL) \
             SELECT name FROM o WHERE name IS NOT NULL",
        )?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    rotate(&mut owners);
    let per_owner = limit.div_ceil(owners.len().max(1));
    // Per owner: its functions' queues, taken from in turn.
    let mut by_owner = Vec::with_capacity(owners.len());
    for owner in &owners {
        let mut functions: Vec<String> = tx
            .prepare_cached(
                "WITH RECURSIVE f(name) AS ( \
                   SELECT MIN(function) FROM firings WHERE state = 'pending' AND owner = ?1 \
                   UNION ALL \
                   SELECT (SELECT MIN(function) FROM firings WHERE state = 'pending' AND owner = ?1 \
                           AND function > f.name) \
                   FROM f WHERE f.name IS NOT NULL) \
                 SELECT name FROM f WHERE name IS NOT NULL",
            )?
            .query_map(params![owner], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        rotate(&mut functions);
        let per_function = per_owner.div_ceil(functions.len().max(1));
        let mut queues = Vec::with_capacity(functions.len());
        for function in &functions {
            let mut stmt = tx.prepare_cached(
                "SELECT not_before_ms, seq, record, event, rate_reserved, replay, cause, created_ms, collect FROM firings \
                 WHERE state = 'pending' AND owner = ?1 AND function = ?2 AND not_before_ms <= ?3 \
                 ORDER BY not_before_ms, seq LIMIT ?4",
            )?;
            let rows: Vec<(i64, ClaimRow)> = stmt
                .query_map(params![owner, function, db_int(now_ms), db_int(per_function as u64)], |r| {
                    let row = (r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?, r.get(8)?);
                    Ok((r.get(0)?, row))
                })?
                .collect::<Result<_, _>>()?;
            queues.push(rows.into_iter());
        }
        by_owner.push(round_robin(queues, per_owner).into_iter());
    }
    let mut out = round_robin(by_owner, limit);
    // Those taken, in the order they became ready.
    out.sort_by_key(|(not_before, row)| (*not_before, row.0));
    Ok(out.into_iter().map(|(_, row)| row).collect())
}

/// Up to `limit` items: the first of each queue, then the second of each, …
fn round_robin<T>(mut queues: Vec<impl Iterator<Item = T>>, limit: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(limit);
    while out.len() < limit {
        let before = out.len();
        for q in &mut queues {
            if out.len() < limit
                && let Some(item) = q.next()
            {
                out.push(item);
            }
        }
        if out.len() == before {
            break;
        }
    }
    out
}

impl Firings {
    /// Opens (or creates) the table at `path`: WAL, `synchronous=FULL`, migrated to
    /// [`super::SCHEMA_VERSION`], with the gateway's audit tables installed ([`crate::audit`]).
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
        htfaas_functions::store::writer_checkpoints_as_backstop(&conn)?;
        // A savepoint's statement journal (each write of a group-committed batch but the first has
        // one) stays in memory, bounded by what one write changes, instead of spilling to a
        // temporary file: those spills were a twentieth of the writer's CPU in the dispatch bench.
        conn.pragma_update(None, "temp_store", "MEMORY")?;
        conn.busy_timeout(Duration::from_secs(5))?;
        // Hot statements stay parsed ([`exec`], [`row`]) with plans that do not depend on the
        // values bound (see the scheduler's queue for why).
        conn.set_prepared_statement_cache_capacity(64);
        conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
        migrate(&mut conn)?;
        super::dlq::install(&conn)?;
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
        let checkpointer = Checkpointer::start(path, durability.sqlite_synchronous(), "firings-checkpoint")
            .map_err(|e| FiringError::Task(e.to_string()))?;
        Ok(Firings {
            _checkpointer: Arc::new(checkpointer),
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

    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut Connection) -> Result<T, FiringError>) -> Result<T, FiringError> {
        // A panic while holding the lock cannot leave SQLite inconsistent (transactions roll back).
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    pub(crate) async fn call<T: Send + 'static>(
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
            let tx = begin_immediate(conn)?;
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
            let tx = begin_immediate(conn)?;
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
    pub(super) fn inserted(&self, done: &[Inserted]) {
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
            let tx = begin_immediate(conn)?;
            let mut scanned = 0;
            while claim.ready.len() < max && scanned < CLAIM_SCAN {
                let turn = self.claims.fetch_add(1, Ordering::Relaxed);
                let rows = ready_rows(&tx, now_ms, max - claim.ready.len(), turn)?;
                if rows.is_empty() {
                    break;
                }
                scanned += rows.len();
                for (seq, record, event, rate_reserved, replay, cause, created_ms, collect) in rows {
                    let parsed = serde_json::from_str::<FunctionRecord>(&record).and_then(|f| {
                        let cause = cause.as_deref().map(serde_json::from_str::<Cause>).transpose()?;
                        Ok((f, serde_json::from_str::<StorageEvent>(&event)?, cause))
                    });
                    let (function, event, cause) = match parsed {
                        Ok(p) => p,
                        Err(e) => {
                            tracing::error!(seq, "stored firing unreadable, refused: {e}");
                            let reason = format!("stored firing unreadable: {e}");
                            exec(
                                &tx,
                                "UPDATE firings SET state = 'refused', reason = ?2, updated_ms = ?3 WHERE seq = ?1",
                                params![seq, reason, db_int(now_ms)],
                            )?;
                            super::dlq::record_refused(&tx, seq, &reason, now_ms)?;
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
                    let created_ms = u64::try_from(created_ms).unwrap_or(0);
                    let members = match (collect, &replay) {
                        (Some(group), _) => super::groups::other_members(&tx, group, &event.path)?,
                        (None, Some(r)) if r.starts_with(super::dlq::REDRIVE_PREFIX) => {
                            super::dlq::redrive_members(&tx, seq)?
                        }
                        (None, _) => Vec::new(),
                    };
                    claim.ready.push(Claimed { seq, function, event, replay, cause, created_ms, members });
                }
            }
            tx.commit()?;
            Ok(())
        })?;
        self.pending.fetch_sub(claim.unreadable.min(self.pending()), Ordering::Relaxed);
        Ok(claim)
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
            Firings::prune_groups(conn, now_ms, self.window_ms, batch)?;
            exec(
                conn,
                "DELETE FROM provenance WHERE macaroon IN (SELECT macaroon FROM provenance WHERE expires_ms <= ?1 \
                 LIMIT ?2)",
                params![db_int(now_ms), db_int(batch as u64)],
            )?;
            // A re-drive's members go with its firing (every row below the oldest firing left).
            exec(
                conn,
                "DELETE FROM redrive_members WHERE firing < (SELECT COALESCE(MIN(seq), 9223372036854775807) FROM firings)",
                [],
            )?;
            Ok(exec(
                conn,
                "DELETE FROM firings WHERE seq IN (SELECT seq FROM firings WHERE expires_ms <= ?1 \
                 AND state IN ('submitted', 'refused', 'superseded') LIMIT ?2)",
                params![db_int(now_ms), db_int(batch as u64)],
            )?)
        })
    }

    /// Appends one audit record in a transaction of its own (an admin action, which changed
    /// another database).
    pub fn append(&self, draft: AuditDraft) -> Result<audit::AuditRecord, FiringError> {
        self.with(|conn| {
            let tx = begin_immediate(conn)?;
            let record = audit::append_in(&tx, draft)?;
            tx.commit()?;
            Ok(record)
        })
    }

    /// Which of `paths` has a firing of `function` in the table, in any state (`events
    /// backfill`; rows leave the table when they expire, after their job is in the scheduler).
    pub fn fired_paths(&self, function: &str, paths: &[String]) -> Result<Vec<String>, FiringError> {
        self.with(|conn| {
            let mut stmt = conn.prepare_cached("SELECT 1 FROM firings WHERE function = ?1 AND path = ?2 LIMIT 1")?;
            let mut out = Vec::new();
            for p in paths {
                if stmt.exists(params![function, p])? {
                    out.push(p.clone());
                }
            }
            Ok(out)
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

    /// The last tick of `function`'s schedule whose firings were written, Unix ms.
    pub fn last_tick(&self, function: &str) -> Result<Option<u64>, FiringError> {
        self.with(|conn| {
            let at: Option<i64> =
                row(conn, "SELECT tick_ms FROM schedule_ticks WHERE function = ?1", params![function], |r| r.get(0))
                    .optional()?;
            Ok(at.map(from_db))
        })
    }

    /// Records `tick_ms` as `function`'s last fired tick (never moving it back).
    pub fn set_last_tick(&self, function: &str, tick_ms: u64) -> Result<(), FiringError> {
        self.with(|conn| {
            exec(
                conn,
                "INSERT INTO schedule_ticks (function, tick_ms) VALUES (?1, ?2) \
                 ON CONFLICT (function) DO UPDATE SET tick_ms = MAX(tick_ms, excluded.tick_ms)",
                params![function, db_int(tick_ms)],
            )?;
            Ok(())
        })
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

/// The `job.refused` record of firing `seq`, refused for good for `reason` (read inside the
/// refusing transaction).
pub(super) fn refusal_record(tx: &Connection, seq: i64, reason: &str) -> Result<AuditDraft, FiringError> {
    let row: Option<(String, String, String, Option<String>)> =
        row(tx, "SELECT function, digest, event, replay FROM firings WHERE seq = ?1", params![seq], |r| {
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
