//! The stored format: the schema version, the migrations that bring any older file up to it,
//! and sealing the macaroons an older build stored in plain.
//!
//! Must not know: the writer, jobs' states or any caller of the store.

use crate::error::QueueError;
use crate::seal::SealRequest as _;
use htfaas_functions::proto::SubmitRequest;
use htfaas_functions::store::exec;
use rusqlite::{Connection, Transaction, params};

/// Version of the stored format written by this build.
pub const SCHEMA_VERSION: i64 = 13;

/// `MIGRATIONS[v]` takes a file from version `v` to `v + 1`; a new file runs them all.
pub const MIGRATIONS: [&str; 13] = [
    SCHEMA_1,
    MIGRATE_1_TO_2,
    MIGRATE_2_TO_3,
    MIGRATE_3_TO_4,
    MIGRATE_4_TO_5,
    MIGRATE_5_TO_6,
    MIGRATE_6_TO_7,
    MIGRATE_7_TO_8,
    MIGRATE_8_TO_9,
    MIGRATE_9_TO_10,
    MIGRATE_10_TO_11,
    MIGRATE_11_TO_12,
    MIGRATE_12_TO_13,
];

/// Version 1: jobs, token uses, accounts.
pub(super) const SCHEMA_1: &str = "
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
pub(super) const MIGRATE_1_TO_2: &str = "
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
pub(super) const MIGRATE_2_TO_3: &str = "
ALTER TABLE jobs ADD COLUMN hold_code INTEGER;
";

/// Version 4: job class, GPUs and disk, run attempts (one row each in `attempts`), EP losses
/// and retry backoff; decayed usage and priority factor per owner; usage per accounting
/// group; admin settings per EP name.
pub(super) const MIGRATE_3_TO_4: &str = "
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
pub(super) const MIGRATE_4_TO_5: &str = "
CREATE INDEX IF NOT EXISTS jobs_final_by_time ON jobs (finished_at_ms, owner, grp,
    (CASE WHEN json_valid(request) THEN json_extract(request, '$.function.name') END), state, cpus, usage)
    WHERE state IN ('completed', 'failed', 'removed');
";

/// Version 6: jobs by the trace id of their event (`htfaas trace`): the 32 hex
/// digits of `event.trace` (`00-<trace id>-<span id>-<flags>`) in the stored request.
/// Replaced in version 10 by the `trace_id` column.
pub(super) const MIGRATE_5_TO_6: &str = "
CREATE INDEX IF NOT EXISTS jobs_by_trace ON jobs ((CASE WHEN json_valid(request) THEN substr(json_extract(request, '$.event.trace'), 4, 32) END))
    WHERE json_valid(request) AND json_extract(request, '$.event.trace') IS NOT NULL;
";

/// Version 7: jobs by owner, function and input path (`events backfill`: which files
/// a function has fired on). Replaced in version 10 by the `function_name` and `input_path` columns.
pub(super) const MIGRATE_6_TO_7: &str = "
CREATE INDEX IF NOT EXISTS jobs_by_function_path ON jobs (owner,
    (CASE WHEN json_valid(request) THEN json_extract(request, '$.function.name') END),
    (CASE WHEN json_valid(request) THEN json_extract(request, '$.event.path') END));
";

/// Version 8: whether a job's sealed fields are sealed for that job (`crate::seal`: the slots
/// name the job). Rows of an older build are 0; [`seal_stored`] seals the unfinished ones
/// again, bound, when the store opens.
pub(super) const MIGRATE_7_TO_8: &str = "
ALTER TABLE jobs ADD COLUMN sealed_for_job INTEGER NOT NULL DEFAULT 0;
";

/// Version 9: a native job's image digest (NULL: a wasm job), which placement matches against
/// the EPs that run native code.
pub(super) const MIGRATE_8_TO_9: &str = "
ALTER TABLE jobs ADD COLUMN image TEXT;
UPDATE jobs SET image = json_extract(request, '$.function.digest')
    WHERE json_valid(request) AND json_extract(request, '$.function.native') IS NOT NULL;
";

/// Version 10: a job's writes cost as little as they can.
/// - A job's stored request (JSON, about 3 KiB with its sealed macaroons) moves to a table of
///   its own, `job_requests`, keyed by the job's `seq`: written once at submit, never updated.
///   The job's row, which each step of a job rewrites whole (dispatch, end), shrinks from
///   about a page to a tenth of one.
/// - What the job's records and indexes name of its request — the function's name and digest,
///   the event's id, the input path and the trace id (the 32 hex digits of `event.trace`,
///   `00-<trace id>-<span id>-<flags>`) — are columns, written once at submit from the request
///   the scheduler has parsed anyway. Before, each index over them parsed the stored request
///   in SQL at every insert and every job's end, and each audit record of a job parsed it again.
/// - Jobs by state are indexed only while they may still change ([`LIVE`]): a job's end takes
///   it out of those small indexes instead of moving it within two large ones that grew with
///   every job ever run (`jobs_by_state`, `jobs_by_owner_state`); jobs by EP session likewise,
///   only while running.
/// - `job_counts` holds the number of jobs in each state, kept by triggers in the transaction
///   that changes it, so counting them (the metrics, on every scrape) reads a row per state,
///   not an index entry per job.
///
/// The first job-end trigger of the outbox read the request; it is dropped here (the outbox
/// installs its successor at open), as a column a trigger names cannot be dropped.
pub(super) const MIGRATE_9_TO_10: &str = "
ALTER TABLE jobs ADD COLUMN function_name TEXT;
ALTER TABLE jobs ADD COLUMN function_digest TEXT;
ALTER TABLE jobs ADD COLUMN event_id TEXT;
ALTER TABLE jobs ADD COLUMN input_path TEXT;
ALTER TABLE jobs ADD COLUMN trace_id TEXT;
UPDATE jobs SET function_name = json_extract(request, '$.function.name'),
                function_digest = json_extract(request, '$.function.digest'),
                event_id = json_extract(request, '$.event.id'),
                input_path = json_extract(request, '$.event.path'),
                trace_id = substr(json_extract(request, '$.event.trace'), 4, 32)
    WHERE json_valid(request);
DROP INDEX IF EXISTS jobs_by_state;
DROP INDEX IF EXISTS jobs_by_owner_state;
DROP INDEX IF EXISTS jobs_by_session;
DROP INDEX IF EXISTS jobs_final_by_time;
DROP INDEX IF EXISTS jobs_by_trace;
DROP INDEX IF EXISTS jobs_by_function_path;
DROP TRIGGER IF EXISTS job_outbox_on_end;
CREATE TABLE job_requests (seq INTEGER PRIMARY KEY, request TEXT NOT NULL);
INSERT INTO job_requests (seq, request) SELECT seq, request FROM jobs;
ALTER TABLE jobs DROP COLUMN request;
CREATE INDEX jobs_live_by_owner ON jobs (owner, state, seq) WHERE state IN ('idle', 'held', 'running');
CREATE INDEX jobs_running_by_session ON jobs (ep_session) WHERE state = 'running';
CREATE INDEX jobs_final_by_time ON jobs (finished_at_ms, owner, grp, function_name, state, cpus, usage)
    WHERE state IN ('completed', 'failed', 'removed');
CREATE INDEX jobs_by_trace ON jobs (trace_id) WHERE trace_id IS NOT NULL;
CREATE INDEX jobs_by_function_path ON jobs (owner, function_name, input_path);
CREATE TABLE job_counts (state TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO job_counts (state, n) SELECT state, COUNT(*) FROM jobs GROUP BY state;
CREATE TRIGGER job_counts_on_insert AFTER INSERT ON jobs BEGIN
    INSERT INTO job_counts (state, n) VALUES (NEW.state, 1) ON CONFLICT (state) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER job_counts_on_state AFTER UPDATE OF state ON jobs WHEN OLD.state IS NOT NEW.state BEGIN
    UPDATE job_counts SET n = n - 1 WHERE state = OLD.state;
    INSERT INTO job_counts (state, n) VALUES (NEW.state, 1) ON CONFLICT (state) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER job_counts_on_delete AFTER DELETE ON jobs BEGIN
    UPDATE job_counts SET n = n - 1 WHERE state = OLD.state;
    DELETE FROM job_requests WHERE seq = OLD.seq;
END;
";

/// Version 11: a job's function's limit of runs at once (its manifest's `max_concurrent`), which
/// matching reads with the idle jobs; older jobs have none.
pub(super) const MIGRATE_10_TO_11: &str = "
ALTER TABLE jobs ADD COLUMN max_concurrent INTEGER;
";

/// Version 12: `attempts` and `token_uses` keyed by their primary key alone (`WITHOUT ROWID`).
/// As rowid tables each was two B-trees, the rows and the index of their key, and every job
/// wrote both: its token's use at submit, its attempt at dispatch and again at its end. Every
/// read of them goes by that key (or reads them all), never by a rowid.
pub(super) const MIGRATE_11_TO_12: &str = "
CREATE TABLE attempts_by_key (
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
) WITHOUT ROWID;
INSERT INTO attempts_by_key SELECT job_id, n, ep, ep_session, started_at_ms, ended_at_ms, outcome, reason, usage
    FROM attempts;
DROP TABLE attempts;
ALTER TABLE attempts_by_key RENAME TO attempts;
CREATE TABLE token_uses_by_key (
    jti  TEXT PRIMARY KEY,
    uses INTEGER NOT NULL,
    exp  INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO token_uses_by_key SELECT jti, uses, exp FROM token_uses;
DROP TABLE token_uses;
ALTER TABLE token_uses_by_key RENAME TO token_uses;
";

/// Version 13: no index of running jobs by start time. Its one reader, the overdue check
/// ([`super::jobs::OVERDUE`]), compares each running job's start plus its own run time with
/// now, which no order of start times can narrow: it reads every running job either way, now
/// through `jobs_running_by_session`. Each dispatch and each end wrote both indexes.
pub(super) const MIGRATE_12_TO_13: &str = "
DROP INDEX IF EXISTS jobs_running_by_start;
";

/// A job's columns and its stored request together: `FROM {JOB_WITH_REQUEST}`.
pub(crate) const JOB_WITH_REQUEST: &str = "jobs JOIN job_requests USING (seq)";

/// The states a job may still leave, as the partial indexes of [`MIGRATE_9_TO_10`] name them:
/// a query that reads only such jobs repeats this very term, which is how SQLite knows such an
/// index holds every row it needs.
pub(crate) const LIVE: &str = "state IN ('idle', 'held', 'running')";

/// A job's trace id as [`MIGRATE_9_TO_10`] stores it: the 32 characters after `00-` of the
/// event's `traceparent` (SQL's `substr(trace, 4, 32)`, on characters).
pub(crate) fn trace_id_of(trace: &str) -> String {
    trace.chars().skip(3).take(32).collect()
}

/// Brings the file up to [`SCHEMA_VERSION`] in one transaction; refuses a newer one.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), QueueError> {
    const _: () = assert!(SCHEMA_VERSION as usize == MIGRATIONS.len());
    htfaas_functions::store::migrate(conn, &MIGRATIONS, "job store")?
        .map_err(|found| QueueError::SchemaTooNew { found, supported: SCHEMA_VERSION })
}

/// Seals, in `tx`, for its own job ([`crate::seal`]) every job that may still run whose
/// request an older build stored sealed without its job, or plain (before sealing existed);
/// returns how many jobs were sealed. Finished jobs keep theirs: never handed out again, their
/// macaroons expire within hours.
pub(super) fn seal_stored(tx: &Transaction<'_>, sealer: &crate::seal::Sealer) -> Result<usize, QueueError> {
    let unbound: Vec<(String, String)> = {
        let mut stmt = tx.prepare(&format!(
            "SELECT id, request FROM {JOB_WITH_REQUEST} WHERE state IN ('idle', 'held', 'running') \
             AND sealed_for_job = 0 AND json_valid(request)"
        ))?;
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<Result<_, _>>()?
    };
    let mut sealed = 0;
    for (id, request) in &unbound {
        let Ok(r) = serde_json::from_str::<SubmitRequest>(request) else { continue };
        let r = match sealer.open_request_unbound(r) {
            Ok(r) => r,
            Err(e) => {
                // Left as it is: it will not open at dispatch either, and is failed there.
                tracing::warn!(job = %id, "a stored request does not open: {e}");
                continue;
            }
        };
        let bound = serde_json::to_string(&sealer.seal_request(id, &r)?)?;
        exec(
            tx,
            "UPDATE job_requests SET request = ?2 WHERE seq = (SELECT seq FROM jobs WHERE id = ?1)",
            params![id, bound],
        )?;
        exec(tx, "UPDATE jobs SET sealed_for_job = 1 WHERE id = ?1", params![id])?;
        sealed += 1;
    }
    Ok(sealed)
}
