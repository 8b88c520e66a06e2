//! The durable job queue: jobs, submit-token uses and owner accounts in one SQLite file.
//!
//! WAL with `synchronous=FULL`: once a call that writes returns `Ok`, its transaction is on disk.
//! One connection behind a mutex, used from `spawn_blocking`, serializes every writer, so the
//! checks inside a transaction (dedupe key, token uses, "still running on this EP") cannot race.
//!
//! Stored format: `PRAGMA user_version` = [`SCHEMA_VERSION`]. A job keeps the full
//! [`SubmitRequest`] as JSON (it holds the macaroons, which never leave through the API).

use crate::error::QueueError;
use crate::matching::IdleJob;
use htfaas_functions::Resources;
use htfaas_functions::proto::{
    Account, JobAssignment, JobRecord, JobReport, JobState, OutputFile, SubmitRequest, Usage,
};
use rusqlite::{Connection, OptionalExtension as _, TransactionBehavior, params};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Version of the stored format written by this build.
pub const SCHEMA_VERSION: i64 = 1;

/// Longest EP log kept per job, bytes.
pub const MAX_LOG_BYTES: usize = 64 * 1024;

const SCHEMA: &str = "
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

const RECORD_COLUMNS: &str = "id, owner, state, reason, token_jti, request, cpus, memory_mb, runtime_s, ep, \
     submitted_at_ms, started_at_ms, finished_at_ms, exit_code, usage, outputs";

/// A job to insert: the verified request and what the token says about it.
#[derive(Debug, Clone)]
pub struct NewJob {
    /// The validated request.
    pub request: SubmitRequest,
    /// The token's subject: who is accounted.
    pub owner: String,
    /// The token's id, whose uses are counted.
    pub jti: String,
    /// How many jobs the token allows.
    pub jobs: u32,
    /// The token's expiry, so that its use count can be pruned after it.
    pub exp: u64,
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
    /// Jobs that were no longer idle, or whose stored request did not decode.
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

/// Handle on the job store; cheap to clone.
#[derive(Clone)]
pub struct Queue {
    conn: Arc<Mutex<Connection>>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").finish_non_exhaustive()
    }
}

/// Unix milliseconds now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// SQLite integers are signed; everything we store fits, and anything that would not is capped.
fn db_int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn from_db(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl Queue {
    /// Opens (or creates) the store at `path`: WAL, `synchronous=FULL`, schema checked.
    /// Jobs left `running` by a previous process go back to `idle`: their EP sessions are gone.
    pub fn open(path: &Path) -> Result<Queue, QueueError> {
        let conn = Connection::open(path)?;
        let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(journal_mode = %mode, "SQLite refused WAL; continuing with {mode}");
        }
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let found: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if found > SCHEMA_VERSION {
            return Err(QueueError::SchemaTooNew { found, supported: SCHEMA_VERSION });
        }
        conn.execute_batch(SCHEMA)?;
        conn.pragma_update(None, "user_version", SCHEMA_VERSION)?;
        let requeued = conn.execute(
            "UPDATE jobs SET state = 'idle', ep = NULL, ep_session = NULL, started_at_ms = NULL \
             WHERE state = 'running'",
            [],
        )?;
        if requeued > 0 {
            tracing::info!(jobs = requeued, "jobs left running by the previous process are idle again");
        }
        Ok(Queue { conn: Arc::new(Mutex::new(conn)) })
    }

    /// Runs `f` on the connection in a blocking task.
    async fn call<T, F>(&self, f: F) -> Result<T, QueueError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, QueueError> + Send + 'static,
    {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = conn.lock().map_err(|_| QueueError::Poisoned)?;
            f(&mut guard)
        })
        .await
        .map_err(|e| QueueError::Task(e.to_string()))?
    }

    /// In one transaction: returns the job that already has `(owner, dedupe_key)`, or counts a
    /// use of the token (refusing past `jobs`) and inserts the job as idle.
    pub async fn submit(&self, job: NewJob) -> Result<Submitted, QueueError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
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
            let uses: i64 = tx
                .query_row("SELECT uses FROM token_uses WHERE jti = ?1", params![job.jti], |r| r.get(0))
                .optional()?
                .unwrap_or(0);
            let uses = from_db(uses);
            if uses >= u64::from(job.jobs) {
                return Err(QueueError::TokenUsed { uses, jobs: job.jobs });
            }
            tx.execute(
                "INSERT INTO token_uses (jti, uses, exp) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (jti) DO UPDATE SET uses = excluded.uses",
                params![job.jti, db_int(uses + 1), db_int(job.exp)],
            )?;
            let job_id = uuid::Uuid::new_v4().to_string();
            let r = job.request.resources;
            tx.execute(
                "INSERT INTO jobs (id, owner, dedupe_key, state, token_jti, request, cpus, memory_mb, \
                 runtime_s, submitted_at_ms) VALUES (?1, ?2, ?3, 'idle', ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    job_id,
                    job.owner,
                    job.request.dedupe_key,
                    job.jti,
                    serde_json::to_string(&job.request)?,
                    r.cpus,
                    db_int(r.memory_mb),
                    db_int(r.runtime_s),
                    db_int(now_ms()),
                ],
            )?;
            tx.commit()?;
            Ok(Submitted { job_id, created: true })
        })
        .await
    }

    /// The oldest idle jobs that fit within `room` (at most `limit`), plus the oldest `limit`
    /// of each owner in `owners` (so that an owner-restricted EP is not starved by other
    /// owners' older jobs); oldest first, without duplicates. `room` keeps jobs that fit no EP
    /// from filling the batch and blocking the queue behind them.
    pub async fn idle_candidates(
        &self,
        owners: Vec<String>,
        room: Resources,
        limit: usize,
    ) -> Result<Vec<IdleJob>, QueueError> {
        self.call(move |conn| {
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let (cpus, memory_mb, runtime_s) = (room.cpus, db_int(room.memory_mb), db_int(room.runtime_s));
            let mut seen = std::collections::BTreeMap::new();
            let mut collect = |stmt: &mut rusqlite::Statement<'_>, p: &[&dyn rusqlite::ToSql]| {
                let rows = stmt.query_map(p, |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        IdleJob {
                            id: r.get(1)?,
                            owner: r.get(2)?,
                            resources: Resources {
                                cpus: r.get(3)?,
                                memory_mb: from_db(r.get(4)?),
                                runtime_s: from_db(r.get(5)?),
                            },
                        },
                    ))
                })?;
                for row in rows {
                    let (seq, job) = row?;
                    seen.insert(seq, job);
                }
                Ok::<(), rusqlite::Error>(())
            };
            let mut all = conn.prepare_cached(
                "SELECT seq, id, owner, cpus, memory_mb, runtime_s FROM jobs \
                 WHERE state = 'idle' AND cpus <= ?2 AND memory_mb <= ?3 AND runtime_s <= ?4 \
                 ORDER BY seq LIMIT ?1",
            )?;
            collect(&mut all, &[&limit, &cpus, &memory_mb, &runtime_s])?;
            let mut by_owner = conn.prepare_cached(
                "SELECT seq, id, owner, cpus, memory_mb, runtime_s FROM jobs \
                 WHERE owner = ?1 AND state = 'idle' AND cpus <= ?3 AND memory_mb <= ?4 AND runtime_s <= ?5 \
                 ORDER BY seq LIMIT ?2",
            )?;
            for owner in &owners {
                collect(&mut by_owner, &[owner, &limit, &cpus, &memory_mb, &runtime_s])?;
            }
            Ok(seen.into_values().collect())
        })
        .await
    }

    /// In one transaction: marks each job that is still idle as running on EP session
    /// `ep_session` (named `ep_name`), and returns what to send for it.
    pub async fn mark_running(
        &self,
        job_ids: Vec<String>,
        ep_name: String,
        ep_session: String,
    ) -> Result<Marked, QueueError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut marked = Marked::default();
            let started = db_int(now_ms());
            for id in job_ids {
                let request: Option<String> = tx
                    .query_row("SELECT request FROM jobs WHERE id = ?1 AND state = 'idle'", params![id], |r| r.get(0))
                    .optional()?;
                let Some(request) = request else {
                    marked.skipped.push(id);
                    continue;
                };
                let request: SubmitRequest = match serde_json::from_str(&request) {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::error!(job.id = %id, "stored request does not decode; failing the job: {e}");
                        tx.execute(
                            "UPDATE jobs SET state = 'failed', reason = ?2, finished_at_ms = ?3 WHERE id = ?1",
                            params![id, format!("stored request is corrupt: {e}"), started],
                        )?;
                        marked.skipped.push(id);
                        continue;
                    }
                };
                tx.execute(
                    "UPDATE jobs SET state = 'running', ep = ?2, ep_session = ?3, started_at_ms = ?4 \
                     WHERE id = ?1 AND state = 'idle'",
                    params![id, ep_name, ep_session, started],
                )?;
                marked.assigned.push(JobAssignment {
                    job_id: id,
                    function: request.function,
                    resources: request.resources,
                    input: request.input,
                    output: request.output,
                    args: request.args,
                    env: request.env,
                });
            }
            tx.commit()?;
            Ok(marked)
        })
        .await
    }

    /// Puts jobs that are running on `ep_session` back to idle (an Assign that could not be
    /// sent). Returns how many changed.
    pub async fn revert_to_idle(&self, job_ids: Vec<String>, ep_session: String) -> Result<usize, QueueError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut n = 0;
            for id in job_ids {
                n += tx.execute(
                    "UPDATE jobs SET state = 'idle', ep = NULL, ep_session = NULL, started_at_ms = NULL \
                     WHERE id = ?1 AND state = 'running' AND ep_session = ?2",
                    params![id, ep_session],
                )?;
            }
            tx.commit()?;
            Ok(n)
        })
        .await
    }

    /// Every job running on `ep_session` goes back to idle (the EP went away).
    pub async fn requeue_session(&self, ep_session: String) -> Result<usize, QueueError> {
        self.call(move |conn| {
            Ok(conn.execute(
                "UPDATE jobs SET state = 'idle', ep = NULL, ep_session = NULL, started_at_ms = NULL \
                 WHERE state = 'running' AND ep_session = ?1",
                params![ep_session],
            )?)
        })
        .await
    }

    /// In one transaction: if the report's job is running on `ep_session`, records its end and
    /// charges its owner. `None` when it is not (unknown, finished, or requeued meanwhile).
    pub async fn finish(&self, ep_session: String, report: JobReport) -> Result<Option<Finished>, QueueError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let row: Option<(String, u32)> = tx
                .query_row(
                    "SELECT owner, cpus FROM jobs WHERE id = ?1 AND state = 'running' AND ep_session = ?2",
                    params![report.job_id, ep_session],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            let Some((owner, cpus)) = row else {
                return Ok(None);
            };
            let success = report.outcome.is_success();
            let state = if success { JobState::Completed } else { JobState::Failed };
            let exit_code = match report.outcome {
                htfaas_functions::proto::Outcome::Exited { exit_code } => Some(exit_code),
                _ => None,
            };
            let mut log = report.log;
            if log.len() > MAX_LOG_BYTES {
                let mut cut = MAX_LOG_BYTES;
                while !log.is_char_boundary(cut) {
                    cut -= 1;
                }
                log.truncate(cut);
            }
            let u = report.usage;
            tx.execute(
                "UPDATE jobs SET state = ?2, reason = ?3, exit_code = ?4, usage = ?5, outputs = ?6, log = ?7, \
                 finished_at_ms = ?8 WHERE id = ?1",
                params![
                    report.job_id,
                    state.as_str(),
                    report.outcome.reason(),
                    exit_code,
                    serde_json::to_string(&u)?,
                    serde_json::to_string(&report.outputs)?,
                    log,
                    db_int(now_ms()),
                ],
            )?;
            let mut acc =
                read_account(&tx, &owner)?.unwrap_or_else(|| Account { owner: owner.clone(), ..Account::default() });
            charge(&mut acc, success, cpus, &u);
            tx.execute(
                "INSERT OR REPLACE INTO accounts (owner, jobs_completed, jobs_failed, core_seconds, cpu_seconds, \
                 wall_seconds, bytes_in, bytes_out) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
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
            tx.commit()?;
            Ok(Some(Finished { owner, state }))
        })
        .await
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

    /// Forgets use counts of tokens that expired before `before_s` (they no longer verify).
    pub async fn prune_token_uses(&self, before_s: u64) -> Result<usize, QueueError> {
        self.call(move |conn| Ok(conn.execute("DELETE FROM token_uses WHERE exp < ?1", params![db_int(before_s)])?))
            .await
    }
}

/// Adds one finished job to an account.
fn charge(acc: &mut Account, success: bool, cpus: u32, u: &Usage) {
    if success {
        acc.jobs_completed = acc.jobs_completed.saturating_add(1);
    } else {
        acc.jobs_failed = acc.jobs_failed.saturating_add(1);
    }
    let wall_s = u.wall_ms as f64 / 1000.0;
    acc.core_seconds += f64::from(cpus) * wall_s;
    acc.cpu_seconds += u.cpu_ms as f64 / 1000.0;
    acc.wall_seconds += wall_s;
    acc.bytes_in = acc.bytes_in.saturating_add(u.bytes_in);
    acc.bytes_out = acc.bytes_out.saturating_add(u.bytes_out);
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
    tx.query_row(
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
}

fn raw_record(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawRecord> {
    Ok(RawRecord {
        id: r.get(0)?,
        owner: r.get(1)?,
        state: r.get(2)?,
        reason: r.get(3)?,
        token_jti: r.get(4)?,
        request: r.get(5)?,
        resources: Resources { cpus: r.get(6)?, memory_mb: from_db(r.get(7)?), runtime_s: from_db(r.get(8)?) },
        ep: r.get(9)?,
        submitted_at_ms: r.get(10)?,
        started_at_ms: r.get(11)?,
        finished_at_ms: r.get(12)?,
        exit_code: r.get(13)?,
        usage: r.get(14)?,
        outputs: r.get(15)?,
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
            token_issuer: String::new(),
            group: None,
            annex: request.annex.clone(),
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
    use htfaas_functions::Digest;
    use htfaas_functions::proto::{EventRef, FunctionRef, InputSpec, Outcome, OutputSpec};

    pub(crate) fn request(key: &str) -> SubmitRequest {
        SubmitRequest {
            function: FunctionRef {
                name: "checksum".into(),
                version: 1,
                digest: Digest::of(b"m"),
                module_url: "http://registry/v1/modules/x".into(),
            },
            resources: Resources { cpus: 1, memory_mb: 64, runtime_s: 60 },
            input: InputSpec { url: "http://storage/data/raw/a".into(), name: "a".into(), macaroon: "m1".into() },
            output: OutputSpec { url: "http://storage/data/out/".into(), macaroon: "m2".into() },
            args: vec![],
            env: vec![],
            event: EventRef { source: "dcache".into(), id: key.into(), path: "/data/raw/a".into() },
            dedupe_key: key.into(),
            annex: None,
        }
    }

    fn new_job(key: &str, jti: &str, jobs: u32) -> NewJob {
        NewJob { request: request(key), owner: "alice".into(), jti: jti.into(), jobs, exp: u64::MAX }
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
        let marked = q.mark_running(vec![id.clone()], "ep1".into(), "s1".into()).await.expect("mark");
        assert_eq!(marked.assigned.len(), 1);
        let report = JobReport {
            job_id: id.clone(),
            outcome: Outcome::Exited { exit_code: 0 },
            usage: Usage { wall_ms: 2000, cpu_ms: 1500, peak_memory_bytes: 1, bytes_in: 10, bytes_out: 20 },
            outputs: vec![],
            log: "x".repeat(MAX_LOG_BYTES + 10),
        };
        assert_eq!(q.finish("s2".into(), report.clone()).await.expect("other session"), None);
        let f = q.finish("s1".into(), report.clone()).await.expect("finish").expect("was running");
        assert_eq!(f.state, JobState::Completed);
        assert_eq!(q.finish("s1".into(), report).await.expect("again"), None);
        let acc = q.accounts().await.expect("accounts");
        assert_eq!(acc.len(), 1);
        assert_eq!(acc[0].jobs_completed, 1);
        assert!((acc[0].core_seconds - 2.0).abs() < 1e-9);
        assert_eq!((acc[0].bytes_in, acc[0].bytes_out), (10, 20));
    }

    #[tokio::test]
    async fn jobs_that_fit_nowhere_do_not_fill_the_batch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open(&dir.path().join("q.db")).expect("open");
        let mut big = new_job("big", "t1", 1);
        big.request.resources.cpus = 8;
        q.submit(big).await.expect("big");
        let small = q.submit(new_job("small", "t2", 1)).await.expect("small").job_id;
        let room = Resources { cpus: 4, memory_mb: 1024, runtime_s: 3600 };
        let got = q.idle_candidates(vec![], room, 1).await.expect("candidates");
        assert_eq!(got.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), vec![small.as_str()]);
        let by_owner = q.idle_candidates(vec!["alice".into()], room, 1).await.expect("candidates");
        assert_eq!(by_owner.len(), 1);
    }

    #[tokio::test]
    async fn reopening_requeues_running_jobs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("q.db");
        let id = {
            let q = Queue::open(&path).expect("open");
            let id = q.submit(new_job("k1", "t1", 1)).await.expect("submit").job_id;
            q.mark_running(vec![id.clone()], "ep1".into(), "s1".into()).await.expect("mark");
            id
        };
        let q = Queue::open(&path).expect("reopen");
        let rec = q.get(id).await.expect("get").expect("exists");
        assert_eq!(rec.state, JobState::Idle);
        assert_eq!(rec.ep, None);
    }
}
