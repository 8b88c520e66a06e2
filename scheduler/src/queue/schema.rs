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
pub const SCHEMA_VERSION: i64 = 9;

/// `MIGRATIONS[v]` takes a file from version `v` to `v + 1`; a new file runs them all.
pub const MIGRATIONS: [&str; 9] = [
    SCHEMA_1,
    MIGRATE_1_TO_2,
    MIGRATE_2_TO_3,
    MIGRATE_3_TO_4,
    MIGRATE_4_TO_5,
    MIGRATE_5_TO_6,
    MIGRATE_6_TO_7,
    MIGRATE_7_TO_8,
    MIGRATE_8_TO_9,
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
/// [`TRACE_ID_OF_JOB`] is the same expression, for queries the index serves.
pub(super) const MIGRATE_5_TO_6: &str = "
CREATE INDEX IF NOT EXISTS jobs_by_trace ON jobs ((CASE WHEN json_valid(request) THEN substr(json_extract(request, '$.event.trace'), 4, 32) END))
    WHERE json_valid(request) AND json_extract(request, '$.event.trace') IS NOT NULL;
";

/// Version 7: jobs by owner, function and input path (`events backfill`: which files
/// a function has fired on). [`FUNCTION_OF_JOB`] and [`PATH_OF_JOB`] are the same expressions.
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

/// A job's function name, as [`MIGRATE_6_TO_7`] indexes it.
pub const FUNCTION_OF_JOB: &str = "(CASE WHEN json_valid(request) THEN json_extract(request, '$.function.name') END)";
/// A job's input path (its event's), as [`MIGRATE_6_TO_7`] indexes it.
pub const PATH_OF_JOB: &str = "(CASE WHEN json_valid(request) THEN json_extract(request, '$.event.path') END)";

/// A job's trace id, as [`MIGRATE_5_TO_6`] indexes it.
pub const TRACE_ID_OF_JOB: &str =
    "(CASE WHEN json_valid(request) THEN substr(json_extract(request, '$.event.trace'), 4, 32) END)";

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
        let mut stmt = tx.prepare(
            "SELECT id, request FROM jobs WHERE state IN ('idle', 'held', 'running') AND sealed_for_job = 0 \
             AND json_valid(request)",
        )?;
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
        exec(tx, "UPDATE jobs SET request = ?2, sealed_for_job = 1 WHERE id = ?1", params![id, bound])?;
        sealed += 1;
    }
    Ok(sealed)
}
