//! The dispatcher's writes to the firing table, many firings' in one transaction: a job's
//! write-macaroon provenance with its credentials' audit records (before the submit), and a
//! claimed firing's outcome (after it) — [`Write`], applied in batches by
//! [`Firings::write_batch`]; [`FiringWriter`] is the group commit that gathers them from the
//! dispatcher's tasks (each firing made three transactions of its own).
//!
//! Each write of a batch runs in a savepoint of its own: a write that fails is undone alone
//! and answered with its reason, the others commit. The caller is answered only after the
//! commit, so what must be durable before the submit (provenance, `token.minted`,
//! `macaroons.obtained`) is on disk when the submit starts, as with one transaction each. An
//! outcome waits a little ([`OUTCOME_LINGER`]) for a provenance write to share its commit.
//!
//! Must not know: NATS, HTTP, the storage or the scheduler.

use super::{FiringError, FiringState, Firings, backoff_ms, now_ms};
use htfaas_functions::audit::{self, AuditDraft, AuditError};
use htfaas_functions::proto::Cause;
use htfaas_functions::store::db_int;
use htfaas_functions::store::{begin_immediate, exec, row};
use rusqlite::{Connection, OptionalExtension as _, params};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Duration;

/// Most writes one transaction takes.
pub const WRITE_BATCH: usize = 64;
/// How long an outcome waits for a provenance write to share its transaction. An outcome need
/// not be on disk before anything (lost in a crash, its firing is submitted again at the next
/// start and the scheduler's dedupe key drops the copy), a provenance must be before its
/// submit: so outcomes ride along with the next provenance (the next firing's, mostly within
/// milliseconds), and a firing costs one commit of the dispatcher's instead of two.
pub const OUTCOME_LINGER: Duration = Duration::from_millis(10);

/// One write of the dispatcher.
#[derive(Debug, Clone)]
pub enum Write {
    /// The write macaroon (its identifier) `macaroon` was obtained for a job of
    /// `cause.function` ([`Firings::record_provenance`]), with the audit records of the job's
    /// credentials (`token.minted`, `macaroons.obtained`). Must be committed before the submit.
    Provenance {
        /// The write macaroon's identifier.
        macaroon: String,
        /// The job it was obtained for.
        cause: Cause,
        /// The job's credentials' records.
        records: Vec<AuditDraft>,
    },
    /// What came of claimed firing `seq`.
    Outcome {
        /// The firing.
        seq: i64,
        /// What came of it.
        outcome: Outcome,
    },
}

/// What came of a claimed (`submitting`) firing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The scheduler holds its job: `submitted`.
    Submitted {
        /// The scheduler's job id.
        job_id: String,
    },
    /// Refused for good, with a `job.refused` record: `refused`.
    Refused {
        /// Why.
        reason: String,
    },
    /// A transient failure: `pending` again after a backoff that grows with its attempts.
    RetryLater {
        /// Why.
        reason: String,
    },
}

/// What one write did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Written {
    /// For [`Outcome::RetryLater`]: when the firing may run again.
    pub retry_at_ms: Option<u64>,
    /// For an outcome: whether the firing was `submitting` and is now finished (`submitted`
    /// or `refused`); the pending gauge counts it no more.
    pub finished: bool,
}

impl Firings {
    /// Applies `writes` in ONE transaction (one fsync), each in a savepoint of its own: a write
    /// that fails is undone alone and answered with its error; when the commit fails, every
    /// write is answered with that error and nothing of the batch is written. Answers in the
    /// order of `writes`, each only once committed.
    pub fn write_batch(&self, writes: Vec<Write>, now_ms: u64) -> Vec<Result<Written, FiringError>> {
        let n = writes.len();
        if n == 0 {
            return Vec::new();
        }
        let done = self.with(|conn| {
            let tx = begin_immediate(conn)?;
            let mut done = Vec::with_capacity(n);
            for w in writes {
                exec(&tx, "SAVEPOINT firing_write", [])?;
                let result = apply(&tx, w, now_ms, self.window_ms);
                exec(&tx, if result.is_ok() { "RELEASE firing_write" } else { "ROLLBACK TO firing_write" }, [])?;
                if result.is_err() {
                    exec(&tx, "RELEASE firing_write", [])?;
                }
                done.push(result);
            }
            tx.commit()?;
            Ok(done)
        });
        match done {
            Ok(done) => {
                let finished = done.iter().filter(|d| d.as_ref().is_ok_and(|w| w.finished)).count() as u64;
                self.pending.fetch_sub(finished.min(self.pending()), Ordering::Relaxed);
                done
            }
            Err(e) => (0..n).map(|_| Err(e.for_each_item())).collect(),
        }
    }

    /// One write in a transaction of its own.
    fn write_one(&self, write: Write, now_ms: u64) -> Result<Written, FiringError> {
        self.write_batch(vec![write], now_ms).pop().unwrap_or_else(|| Err(FiringError::Task("no answer".into())))
    }

    /// Records that the write macaroon `macaroon` (its identifier) was obtained for a job of
    /// `cause.function`: files written with it are that job's outputs. Kept as long as firing
    /// keys. Must be committed before the job is submitted, so no output can come first.
    pub fn record_provenance(&self, macaroon: &str, cause: &Cause, now_ms: u64) -> Result<(), FiringError> {
        self.record_provenance_with(macaroon, cause, now_ms, Vec::new())
    }

    /// [`Firings::record_provenance`] and the audit records of the job's credentials
    /// (`token.minted`, `macaroons.obtained`: `crate::dispatch::credentials`), in one
    /// transaction.
    pub fn record_provenance_with(
        &self,
        macaroon: &str,
        cause: &Cause,
        now_ms: u64,
        records: Vec<AuditDraft>,
    ) -> Result<(), FiringError> {
        let write = Write::Provenance { macaroon: macaroon.to_owned(), cause: cause.clone(), records };
        self.write_one(write, now_ms).map(|_| ())
    }

    /// Ends a claimed firing: `submitted` with `job_id`.
    pub fn mark_submitted(&self, seq: i64, job_id: &str, now_ms: u64) -> Result<(), FiringError> {
        let outcome = Outcome::Submitted { job_id: job_id.to_owned() };
        self.write_one(Write::Outcome { seq, outcome }, now_ms).map(|_| ())
    }

    /// Ends a claimed firing: `refused` for `reason`, with its `job.refused` record.
    pub fn mark_refused(&self, seq: i64, reason: &str, now_ms: u64) -> Result<(), FiringError> {
        let outcome = Outcome::Refused { reason: reason.to_owned() };
        self.write_one(Write::Outcome { seq, outcome }, now_ms).map(|_| ())
    }

    /// Puts a claimed firing that failed transiently back to `pending`, after a backoff that
    /// grows with its attempts; returns when it may run again.
    pub fn retry_later(&self, seq: i64, reason: &str, now_ms: u64) -> Result<u64, FiringError> {
        let outcome = Outcome::RetryLater { reason: reason.to_owned() };
        let written = self.write_one(Write::Outcome { seq, outcome }, now_ms)?;
        Ok(written.retry_at_ms.unwrap_or(now_ms))
    }
}

impl FiringError {
    /// This error for one of the writes of a batch that failed as a whole (SQLite's code is
    /// kept, so [`FiringError::is_disk_full`] still answers).
    fn for_each_item(&self) -> FiringError {
        match self {
            FiringError::Sqlite(rusqlite::Error::SqliteFailure(code, msg)) => {
                FiringError::Sqlite(rusqlite::Error::SqliteFailure(*code, msg.clone()))
            }
            FiringError::Audit(AuditError::Db(rusqlite::Error::SqliteFailure(code, msg))) => {
                FiringError::Audit(AuditError::Db(rusqlite::Error::SqliteFailure(*code, msg.clone())))
            }
            other => FiringError::Task(format!("the batch failed: {}", other)),
        }
    }
}

/// One write inside the caller's transaction.
fn apply(tx: &Connection, write: Write, now_ms: u64, window_ms: u64) -> Result<Written, FiringError> {
    match write {
        Write::Provenance { macaroon, cause, records } => {
            let json = serde_json::to_string(&cause)?;
            exec(
                tx,
                "INSERT OR REPLACE INTO provenance (macaroon, cause, expires_ms) VALUES (?1, ?2, ?3)",
                params![macaroon, json, db_int(now_ms.saturating_add(window_ms))],
            )?;
            for r in records {
                audit::append_in(tx, r)?;
            }
            Ok(Written::default())
        }
        Write::Outcome { seq, outcome: Outcome::RetryLater { reason } } => {
            let attempts: Option<i64> =
                row(tx, "SELECT attempts FROM firings WHERE seq = ?1", params![seq], |r| r.get(0)).optional()?;
            let attempts = u32::try_from(attempts.unwrap_or(1)).unwrap_or(u32::MAX);
            let at = now_ms.saturating_add(backoff_ms(attempts));
            exec(
                tx,
                "UPDATE firings SET state = 'pending', reason = ?2, not_before_ms = ?3, rate_reserved = 1, \
                 updated_ms = ?4 WHERE seq = ?1 AND state = 'submitting'",
                params![seq, reason, db_int(at), db_int(now_ms)],
            )?;
            Ok(Written { retry_at_ms: Some(at), finished: false })
        }
        Write::Outcome { seq, outcome: Outcome::Submitted { job_id } } => {
            finish(tx, seq, FiringState::Submitted, Some(&job_id), None, now_ms)
        }
        Write::Outcome { seq, outcome: Outcome::Refused { reason } } => {
            finish(tx, seq, FiringState::Refused, None, Some(&reason), now_ms)
        }
    }
}

/// Ends claimed firing `seq` in `state`, inside the caller's transaction; a refusal gets its
/// `job.refused` record and its dead-letter entry.
fn finish(
    tx: &Connection,
    seq: i64,
    state: FiringState,
    job_id: Option<&str>,
    reason: Option<&str>,
    now_ms: u64,
) -> Result<Written, FiringError> {
    let changed = exec(
        tx,
        "UPDATE firings SET state = ?2, job_id = ?3, reason = ?4, updated_ms = ?5 \
         WHERE seq = ?1 AND state = 'submitting'",
        params![seq, state.as_str(), job_id, reason, db_int(now_ms)],
    )?;
    if changed > 0 && state == FiringState::Refused {
        audit::append_in(tx, super::table::refusal_record(tx, seq, reason.unwrap_or_default())?)?;
        super::dlq::record_refused(tx, seq, reason.unwrap_or_default(), now_ms)?;
    }
    Ok(Written { retry_at_ms: None, finished: changed > 0 })
}

/// A write on its way to the group commit, and where its answer goes.
type Queued = (Write, tokio::sync::oneshot::Sender<Result<Written, FiringError>>);

/// The group commit of the dispatcher's writes: a thread of its own takes the writes queued by
/// any number of tasks, up to [`WRITE_BATCH`] at a time (what queued while the last
/// transaction ran), applies them in one transaction ([`Firings::write_batch`]) and answers
/// each once committed. A provenance write is committed at once; outcomes are held up to
/// [`OUTCOME_LINGER`] for one to ride along with. The thread ends once every handle is dropped,
/// after committing what is queued and held: dropping the writer loses no write.
#[derive(Debug, Clone)]
pub struct FiringWriter {
    queue: mpsc::Sender<Queued>,
}

impl FiringWriter {
    /// Starts the group commit on `firings`.
    pub fn start(firings: Firings) -> Result<FiringWriter, FiringError> {
        let (queue, rx) = mpsc::channel::<Queued>();
        std::thread::Builder::new()
            .name("firing-writer".into())
            .spawn(move || group_commit(&firings, &rx))
            .map_err(|e| FiringError::Task(format!("start the firing writer: {e}")))?;
        Ok(FiringWriter { queue })
    }

    /// Applies `write` with whatever else is queued; answers once it is committed.
    pub async fn write(&self, write: Write) -> Result<Written, FiringError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.queue.send((write, tx)).map_err(|_| FiringError::Task("the firing writer has stopped".into()))?;
        rx.await.map_err(|_| FiringError::Task("the firing writer dropped a write".into()))?
    }
}

/// The writer thread's loop (see [`FiringWriter`]).
fn group_commit(firings: &Firings, rx: &mpsc::Receiver<Queued>) {
    // Outcomes waiting for a provenance write, and since when the first of them waits.
    let mut held: Vec<Queued> = Vec::new();
    let mut held_since = std::time::Instant::now();
    loop {
        let first = if held.is_empty() {
            match rx.recv() {
                Ok(q) => q,
                // Every handle is gone and nothing is held.
                Err(mpsc::RecvError) => return,
            }
        } else {
            let left = (held_since + OUTCOME_LINGER).saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(q) => q,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    commit(firings, std::mem::take(&mut held));
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    commit(firings, std::mem::take(&mut held));
                    return;
                }
            }
        };
        if held.is_empty() {
            held_since = std::time::Instant::now();
        }
        held.push(first);
        while held.len() < WRITE_BATCH {
            match rx.try_recv() {
                Ok(q) => held.push(q),
                Err(_) => break,
            }
        }
        let urgent = held.iter().any(|(w, _)| matches!(w, Write::Provenance { .. }));
        if urgent || held.len() >= WRITE_BATCH {
            commit(firings, std::mem::take(&mut held));
        }
    }
}

/// Applies `batch` in one transaction and answers each write.
fn commit(firings: &Firings, batch: Vec<Queued>) {
    if batch.is_empty() {
        return;
    }
    let (writes, answers): (Vec<Write>, Vec<_>) = batch.into_iter().unzip();
    let results = firings.write_batch(writes, now_ms());
    for (answer, result) in answers.into_iter().zip(results) {
        // A task that went away (shutdown) no longer waits for its answer.
        let _ = answer.send(result);
    }
}
