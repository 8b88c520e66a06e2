//! The SQLite store of a trail (feature `db`): the `audit_` tables and their migrations
//! ([`install`]), the append that numbers, times and chains a record ([`append_in`],
//! [`AuditLog::append`]), checkpoints of the head ([`checkpoint_in`]), and a log in a file of
//! its own ([`AuditLog`]).
//!
//! Must not know: what a record kind means, lineage queries, the verifier, the wire types.

use super::draft::AuditDraft;
use super::record::{AuditRecord, canonical_json, encode_record};
use super::sign::{AuditSigner, Checkpoint, CheckpointPolicy};
use super::{AuditError, GENESIS_HASH, RECORD_FORMAT};
use crate::store::{begin_immediate, db_int as to_db, from_db};
use crate::time::now_ms;
use rusqlite::{Connection, OpenFlags, OptionalExtension as _, params};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Version of the audit tables written by this build (`audit_meta`'s `schema_version`).
pub const SCHEMA_VERSION: i64 = 2;
/// `MIGRATIONS[i]` brings the audit tables from version i to i + 1 (`audit_meta` itself is
/// made by [`install`] before they run).
pub const MIGRATIONS: &[&str] = &[
    // 0 → 1: the first schema.
    "CREATE TABLE audit_records (
         seq INTEGER PRIMARY KEY,
         time_ms INTEGER NOT NULL,
         kind TEXT NOT NULL,
         job TEXT, token_jti TEXT, owner TEXT, function TEXT, digest TEXT, event_id TEXT,
         hash TEXT NOT NULL,
         json TEXT NOT NULL);
     CREATE INDEX audit_records_by_time ON audit_records (time_ms);
     CREATE INDEX audit_records_by_job ON audit_records (job) WHERE job IS NOT NULL;
     CREATE INDEX audit_records_by_token ON audit_records (token_jti) WHERE token_jti IS NOT NULL;
     CREATE INDEX audit_records_by_owner ON audit_records (owner) WHERE owner IS NOT NULL;
     CREATE INDEX audit_records_by_function ON audit_records (function) WHERE function IS NOT NULL;
     CREATE INDEX audit_records_by_event ON audit_records (event_id) WHERE event_id IS NOT NULL;
     CREATE TABLE audit_record_paths (path TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (path, seq))
         WITHOUT ROWID;
     CREATE TABLE audit_checkpoints (seq INTEGER PRIMARY KEY, time_ms INTEGER NOT NULL, json TEXT NOT NULL);
     CREATE TRIGGER audit_records_append_only_u BEFORE UPDATE ON audit_records
         BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END;
     CREATE TRIGGER audit_records_append_only_d BEFORE DELETE ON audit_records
         BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END;
     CREATE TRIGGER audit_record_paths_append_only_u BEFORE UPDATE ON audit_record_paths
         BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END;
     CREATE TRIGGER audit_record_paths_append_only_d BEFORE DELETE ON audit_record_paths
         BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END;
     CREATE TRIGGER audit_checkpoints_append_only_u BEFORE UPDATE ON audit_checkpoints
         BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END;
     CREATE TRIGGER audit_checkpoints_append_only_d BEFORE DELETE ON audit_checkpoints
         BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END;",
    // 1 → 2: no index by time. Times never decrease along the chain, so a time range is a
    // range of `seq` ([`super::query`] finds its ends by bisection); the index cost every
    // append one more page written.
    "DROP INDEX IF EXISTS audit_records_by_time;",
];

/// How long a call waits for another connection's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// One writer's audit log. Cloning is cheap; clones share one connection.
#[derive(Clone)]
pub struct AuditLog {
    inner: Arc<Inner>,
}

struct Inner {
    /// One connection: appends are serialized here, and across processes by SQLite's write
    /// lock (each append is an `IMMEDIATE` transaction that reads the chain head).
    conn: Mutex<Connection>,
    /// The one writer of this chain.
    writer: String,
    /// Signs checkpoints; without it the chain alone protects the trail.
    signer: Option<AuditSigner>,
    /// When to sign.
    policy: CheckpointPolicy,
    /// For messages.
    path: PathBuf,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("path", &self.inner.path)
            .field("writer", &self.inner.writer)
            .field("signer", &self.inner.signer)
            .field("policy", &self.inner.policy)
            .finish()
    }
}

fn valid_writer(writer: &str) -> bool {
    !writer.is_empty()
        && writer.len() <= 64
        && writer.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Runs `f` in a transaction: the caller's, if `conn` is inside one, else an `IMMEDIATE` one
/// of its own (committed when `f` succeeds, rolled back otherwise).
fn in_transaction<T>(conn: &Connection, f: impl FnOnce(&Connection) -> Result<T, AuditError>) -> Result<T, AuditError> {
    if !conn.is_autocommit() {
        return f(conn);
    }
    // Through the statement cache; dropped on an error, which rolls back.
    let tx = begin_immediate(conn)?;
    let v = f(&tx)?;
    tx.commit()?;
    Ok(v)
}

/// The audit schema version of the database: `None` when it has no `audit_meta` table.
fn schema_version(conn: &Connection) -> Result<Option<i64>, AuditError> {
    let has_meta: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'audit_meta')",
        [],
        |r| r.get(0),
    )?;
    if !has_meta {
        return Ok(None);
    }
    let text: Option<String> =
        conn.query_row("SELECT value FROM audit_meta WHERE key = 'schema_version'", [], |r| r.get(0)).optional()?;
    match text {
        None => Ok(Some(0)),
        Some(t) => t.parse().map(Some).map_err(|_| AuditError::NotALog(format!("audit schema version {t:?}"))),
    }
}

/// Creates or migrates the audit tables of `conn`'s database to [`SCHEMA_VERSION`] and makes
/// `writer` the writer of its chain (refusing another writer's). Runs in the caller's
/// transaction if there is one, else in one of its own; the host's own tables and `PRAGMA
/// user_version` are not touched. Idempotent: services call it at every open.
pub fn install(conn: &Connection, writer: &str) -> Result<(), AuditError> {
    if !valid_writer(writer) {
        return Err(AuditError::BadWriter(writer.to_owned()));
    }
    in_transaction(conn, |tx| {
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS audit_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
        )?;
        let found = schema_version(tx)?.unwrap_or(0);
        if found > SCHEMA_VERSION {
            return Err(AuditError::SchemaTooNew { found, supported: SCHEMA_VERSION });
        }
        for (version, step) in MIGRATIONS.iter().enumerate().skip(usize::try_from(found).unwrap_or(0)) {
            tx.execute_batch(step)?;
            tracing::info!(from = version, to = version + 1, "audit tables migrated");
        }
        if found != SCHEMA_VERSION {
            tx.execute(
                "INSERT OR REPLACE INTO audit_meta (key, value) VALUES ('schema_version', ?1)",
                [SCHEMA_VERSION.to_string()],
            )?;
        }
        match writer_of(tx)? {
            Some(found) if found != writer => Err(AuditError::WrongWriter { found, expected: writer.to_owned() }),
            Some(_) => Ok(()),
            None => {
                tx.execute("INSERT INTO audit_meta (key, value) VALUES ('writer', ?1)", [writer])?;
                Ok(())
            }
        }
    })
}

/// The writer named in `audit_meta`.
fn writer_of(conn: &Connection) -> Result<Option<String>, AuditError> {
    Ok(conn
        .prepare_cached("SELECT value FROM audit_meta WHERE key = 'writer'")?
        .query_row([], |r| r.get(0))
        .optional()?)
}

/// Appends `draft` as the next record of the chain in `tx`'s database (see [`install`]):
/// redacts bearer credentials, reads the head, numbers, times and chains the record, all inside
/// the transaction open on `tx` (a `rusqlite::Transaction`, a [`crate::store::CachedTx`]), so
/// the record commits (or rolls back) with whatever else it does; on a connection outside any
/// transaction, in one of its own. Signs no checkpoint: the owner of the key calls
/// [`checkpoint_in`] (e.g. on a timer).
pub fn append_in(tx: &Connection, draft: AuditDraft) -> Result<AuditRecord, AuditError> {
    in_transaction(tx, |tx| {
        let writer =
            writer_of(tx)?.ok_or_else(|| AuditError::NotALog("no writer in audit_meta (not installed)".into()))?;
        append_to(tx, &writer, draft, None)
    })
}

/// The one append: inside the open transaction on `tx`; with `signer`, signs a checkpoint of
/// the new record when `policy` says one is due.
fn append_to(
    tx: &Connection,
    writer: &str,
    mut draft: AuditDraft,
    signer: Option<(&AuditSigner, CheckpointPolicy)>,
) -> Result<AuditRecord, AuditError> {
    let redacted = draft.scrub();
    if redacted > 0 {
        tracing::warn!(kind = %draft.kind, redacted, "bearer credentials redacted from an audit record");
    }
    let head: Option<(i64, String, i64)> = tx
        .prepare_cached("SELECT seq, hash, time_ms FROM audit_records ORDER BY seq DESC LIMIT 1")?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let (seq, prev_hash, time_ms) = match head {
        Some((seq, hash, time)) => (from_db(seq) + 1, hash, now_ms().max(from_db(time))),
        None => (1, GENESIS_HASH.to_owned(), now_ms()),
    };
    let mut record = AuditRecord {
        format: RECORD_FORMAT,
        seq,
        time_ms,
        writer: writer.to_owned(),
        kind: draft.kind,
        actor: draft.actor,
        subject: draft.subject,
        detail: draft.detail,
        prev_hash,
        hash: String::new(),
    };
    // The members are encoded once; the hashed text (without `hash`) and the stored text (with
    // it) are the same members, in the same sorted order, one apart.
    let (hashed, json) = encode_record(&mut record)?;
    debug_assert_eq!(hashed.len() + record.hash.len() + ",\"hash\":\"\"".len(), json.len());
    let s = &record.subject;
    // What the first record of a job indexes is not indexed again for its later records; nor,
    // for records of no job, what the first record of their token indexes (queries select
    // every record of a job or token that a selected record is about: `super::query`). The
    // gateway's two records of a job's credentials are of one token, before the job has an id.
    let first = match (&s.job, &s.token_jti) {
        (Some(job), _) => first_of_job(tx, job)?,
        (None, Some(token)) => first_of_token(tx, token)?,
        (None, None) => None,
    };
    // A record of a job finds its job's records by the job; one of no job keeps its token,
    // by which its token's records are found.
    let token_jti = if s.job.is_some() {
        unless_first(first.as_ref(), |f| &f.token_jti, &s.token_jti)
    } else {
        s.token_jti.as_deref()
    };
    tx.prepare_cached(
        "INSERT INTO audit_records (seq, time_ms, kind, job, token_jti, owner, function, digest, event_id, hash, json)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    )?
    .execute(params![
        to_db(seq),
        to_db(time_ms),
        record.kind.as_str(),
        s.job,
        token_jti,
        unless_first(first.as_ref(), |f| &f.owner, &s.owner),
        unless_first(first.as_ref(), |f| &f.function, &s.function),
        s.digest,
        unless_first(first.as_ref(), |f| &f.event_id, &s.event_id),
        record.hash,
        json
    ])?;
    if !s.paths.is_empty() {
        let mut insert_path =
            tx.prepare_cached("INSERT OR IGNORE INTO audit_record_paths (path, seq) VALUES (?1, ?2)")?;
        let mut named_first =
            tx.prepare_cached("SELECT EXISTS (SELECT 1 FROM audit_record_paths WHERE path = ?1 AND seq = ?2)")?;
        for p in &s.paths {
            let known = match &first {
                Some(f) => named_first.query_row(params![p, f.seq], |r| r.get::<_, bool>(0))?,
                None => false,
            };
            if !known {
                insert_path.execute(params![p, to_db(seq)])?;
            }
        }
    }
    if let Some((signer, policy)) = signer
        && checkpoint_due(tx, policy, seq, time_ms, false)?
    {
        insert_checkpoint(tx, signer, writer, seq, &record.hash, time_ms)?;
    }
    Ok(record)
}

/// What the first record of a job (or of a token, for records of no job) indexed: its `seq`
/// (its paths are found by it) and its subject's token, owner, function and event.
struct FirstOfJob {
    seq: i64,
    token_jti: Option<String>,
    owner: Option<String>,
    function: Option<String>,
    event_id: Option<String>,
}

/// `mine`, unless the first record of the job (or token) names the same (then nothing, for
/// the column).
fn unless_first<'a>(
    first: Option<&FirstOfJob>,
    field: fn(&FirstOfJob) -> &Option<String>,
    mine: &'a Option<String>,
) -> Option<&'a str> {
    if first.is_some_and(|f| field(f) == mine) { None } else { mine.as_deref() }
}

/// The indexed subject of `job`'s first record in the trail, if it has one.
fn first_of_job(tx: &Connection, job: &str) -> Result<Option<FirstOfJob>, AuditError> {
    first_where(
        tx,
        "SELECT seq, token_jti, owner, function, event_id FROM audit_records WHERE job = ?1 ORDER BY seq LIMIT 1",
        job,
    )
}

/// The indexed subject of the first record of no job that names `token`, if there is one.
fn first_of_token(tx: &Connection, token: &str) -> Result<Option<FirstOfJob>, AuditError> {
    first_where(
        tx,
        "SELECT seq, token_jti, owner, function, event_id FROM audit_records \
         WHERE token_jti = ?1 AND job IS NULL ORDER BY seq LIMIT 1",
        token,
    )
}

/// The first row `sql` selects by `key`, as a [`FirstOfJob`].
fn first_where(tx: &Connection, sql: &str, key: &str) -> Result<Option<FirstOfJob>, AuditError> {
    Ok(tx
        .prepare_cached(sql)?
        .query_row([key], |r| {
            Ok(FirstOfJob {
                seq: r.get(0)?,
                token_jti: r.get(1)?,
                owner: r.get(2)?,
                function: r.get(3)?,
                event_id: r.get(4)?,
            })
        })
        .optional()?)
}

/// Whether record `seq` (at `time_ms`) should be checkpointed: by count, by time, or
/// (`force`) whenever it is not yet.
fn checkpoint_due(
    tx: &Connection,
    policy: CheckpointPolicy,
    seq: u64,
    time_ms: u64,
    force: bool,
) -> Result<bool, AuditError> {
    let last: Option<(i64, i64)> = tx
        .prepare_cached("SELECT seq, time_ms FROM audit_checkpoints ORDER BY seq DESC LIMIT 1")?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let (last_seq, last_ms) = match last {
        Some((s, t)) => (from_db(s), from_db(t)),
        None => {
            let first: Option<i64> =
                tx.query_row("SELECT time_ms FROM audit_records WHERE seq = 1", [], |r| r.get(0)).optional()?;
            (0, first.map_or(time_ms, from_db))
        }
    };
    if seq <= last_seq {
        return Ok(false);
    }
    let every_records = policy.every_records.max(1);
    Ok(force || seq - last_seq >= every_records || time_ms.saturating_sub(last_ms) >= policy.every_ms)
}

fn insert_checkpoint(
    tx: &Connection,
    signer: &AuditSigner,
    writer: &str,
    seq: u64,
    hash: &str,
    time_ms: u64,
) -> Result<Checkpoint, AuditError> {
    let cp = signer.sign(writer, seq, hash, time_ms)?;
    let json = serde_json::to_value(&cp).map(|v| canonical_json(&v)).map_err(|e| AuditError::Corrupt(e.to_string()))?;
    tx.execute(
        "INSERT INTO audit_checkpoints (seq, time_ms, json) VALUES (?1, ?2, ?3)",
        params![to_db(seq), to_db(time_ms), json],
    )?;
    Ok(cp)
}

/// Signs a checkpoint of the head of the chain in `conn`'s database with `signer`, when
/// `policy` says one is due or (`force`) whenever the head has none yet; `None` when nothing
/// was signed (no record, or not due). Runs in the caller's transaction if there is one, else
/// in one of its own.
pub fn checkpoint_in(
    conn: &Connection,
    signer: &AuditSigner,
    policy: CheckpointPolicy,
    force: bool,
) -> Result<Option<Checkpoint>, AuditError> {
    in_transaction(conn, |tx| {
        let writer = writer_of(tx)?.ok_or_else(|| AuditError::NotALog("no writer in audit_meta".into()))?;
        checkpoint_head(tx, signer, &writer, policy, force)
    })
}

fn checkpoint_head(
    tx: &Connection,
    signer: &AuditSigner,
    writer: &str,
    policy: CheckpointPolicy,
    force: bool,
) -> Result<Option<Checkpoint>, AuditError> {
    let Some((seq, hash)) = head_in(tx)? else { return Ok(None) };
    let time_ms = now_ms();
    if !checkpoint_due(tx, policy, seq, time_ms, force)? {
        return Ok(None);
    }
    insert_checkpoint(tx, signer, writer, seq, &hash, time_ms).map(Some)
}

/// The head of the chain in `conn`'s database: the last record's seq and hash.
pub fn head_in(conn: &Connection) -> Result<Option<(u64, String)>, AuditError> {
    let head: Option<(i64, String)> = conn
        .prepare_cached("SELECT seq, hash FROM audit_records ORDER BY seq DESC LIMIT 1")?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    Ok(head.map(|(s, h)| (from_db(s), h)))
}

/// The checkpoints in `conn`'s database, in seq order.
pub fn checkpoints_in(conn: &Connection) -> Result<Vec<Checkpoint>, AuditError> {
    let mut stmt = conn.prepare("SELECT json FROM audit_checkpoints ORDER BY seq")?;
    let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
    rows.map(|text| serde_json::from_str(&text?).map_err(|e| AuditError::Corrupt(e.to_string()))).collect()
}

impl AuditLog {
    /// Opens (creating if needed) `writer`'s log at `path`, a file of its own (WAL,
    /// `synchronous=FULL`; [`install`]ed). With `signer`, checkpoints are signed per `policy`.
    pub fn open(
        path: &Path,
        writer: &str,
        signer: Option<AuditSigner>,
        policy: CheckpointPolicy,
    ) -> Result<AuditLog, AuditError> {
        if !valid_writer(writer) {
            return Err(AuditError::BadWriter(writer.to_owned()));
        }
        crate::store::prepare_private_db(path).map_err(|e| AuditError::NotALog(format!("{}: {e}", path.display())))?;
        let conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        install(&conn, writer)?;
        let policy = CheckpointPolicy { every_records: policy.every_records.max(1), ..policy };
        Ok(AuditLog {
            inner: Arc::new(Inner {
                conn: Mutex::new(conn),
                writer: writer.to_owned(),
                signer,
                policy,
                path: path.to_owned(),
            }),
        })
    }

    pub(super) fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave SQLite inconsistent (transactions roll back).
        self.inner.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The writer's name.
    pub fn writer(&self) -> &str {
        &self.inner.writer
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Appends `draft` as the next record: numbers, times and chains it in one transaction
    /// (the head is read inside it), signs a checkpoint when one is due, and returns the record
    /// once it is on disk. Bearer credentials in the draft are redacted first.
    pub fn append(&self, draft: AuditDraft) -> Result<AuditRecord, AuditError> {
        let conn = self.conn();
        let tx = begin_immediate(&conn)?;
        let signer = self.inner.signer.as_ref().map(|s| (s, self.inner.policy));
        let record = append_to(&tx, &self.inner.writer, draft, signer)?;
        tx.commit()?;
        Ok(record)
    }

    /// Signs a checkpoint of the head now, unless it has one (or there is no key or no record).
    /// Services call it at shutdown, and on a timer so that a quiet log's tail is signed too.
    pub fn checkpoint_now(&self) -> Result<Option<Checkpoint>, AuditError> {
        self.checkpoint(true)
    }

    /// Signs a checkpoint of the head if the policy says one is due.
    pub fn checkpoint_if_due(&self) -> Result<Option<Checkpoint>, AuditError> {
        self.checkpoint(false)
    }

    fn checkpoint(&self, force: bool) -> Result<Option<Checkpoint>, AuditError> {
        let Some(signer) = &self.inner.signer else { return Ok(None) };
        let conn = self.conn();
        let tx = begin_immediate(&conn)?;
        let cp = checkpoint_head(&tx, signer, &self.inner.writer, self.inner.policy, force)?;
        tx.commit()?;
        Ok(cp)
    }

    /// The head: the last record's seq and hash.
    pub fn head(&self) -> Result<Option<(u64, String)>, AuditError> {
        head_in(&self.conn())
    }

    /// The checkpoints, in seq order.
    pub fn checkpoints(&self) -> Result<Vec<Checkpoint>, AuditError> {
        checkpoints_in(&self.conn())
    }
}

/// Opens the database at `path` read-only, refusing one without audit tables or of a newer
/// schema (queries, the verifier, the anchor).
pub(super) fn open_read_only(path: &Path) -> Result<Connection, AuditError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    match schema_version(&conn)? {
        None | Some(0) => Err(AuditError::NotALog(format!("{}: no audit tables", path.display()))),
        Some(found) if found > SCHEMA_VERSION => Err(AuditError::SchemaTooNew { found, supported: SCHEMA_VERSION }),
        Some(_) => Ok(conn),
    }
}
