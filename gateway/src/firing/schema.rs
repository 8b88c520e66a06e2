//! The firing table's stored format: its versions and the migrations between them.
//!
//! Must not know: what the rows mean (the table, [`super::table`]).

use super::FiringError;
use rusqlite::Connection;

/// Version of the stored format written by this build.
pub const SCHEMA_VERSION: i64 = 7;

/// `MIGRATIONS[v]` takes a file from version `v` to `v + 1`; a new file runs them all.
pub(super) const MIGRATIONS: [&str; 7] = [SCHEMA_1, SCHEMA_2, SCHEMA_3, SCHEMA_4, SCHEMA_5, SCHEMA_6, SCHEMA_7];

pub(super) const SCHEMA_1: &str = "
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
/// for a job to that job's [`Cause`](htfaas_functions::proto::Cause) (JSON); a firing keeps the cause of its event.
pub(super) const SCHEMA_2: &str = "
ALTER TABLE firings ADD COLUMN cause TEXT;
CREATE TABLE IF NOT EXISTS provenance (
    macaroon   TEXT PRIMARY KEY,
    cause      TEXT NOT NULL,
    expires_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS provenance_expiry ON provenance (expires_ms);
";

/// Version 3: ready firings by function, for the claim's round robin over functions
/// (`ready_rows`).
pub(super) const SCHEMA_3: &str = "
CREATE INDEX IF NOT EXISTS firings_ready_by_function ON firings (function, not_before_ms, seq) WHERE state = 'pending';
";

/// Version 4: a firing's owner (the function's, from its record), and ready firings by owner
/// then function, for the claim's round robin over owners, then over each owner's functions
/// (`ready_rows`); the index by function alone is no longer read. A firing
/// whose record does not say has the owner `''` (it is refused when claimed anyway).
pub(super) const SCHEMA_4: &str = "
ALTER TABLE firings ADD COLUMN owner TEXT NOT NULL DEFAULT '';
UPDATE firings SET owner = COALESCE(json_extract(record, '$.manifest.owner'), '')
    WHERE state IN ('pending', 'submitting') AND json_valid(record);
DROP INDEX IF EXISTS firings_ready_by_function;
CREATE INDEX IF NOT EXISTS firings_ready_by_owner ON firings (owner, function, not_before_ms, seq) WHERE state = 'pending';
";

/// Version 5: firings by function and path, whatever their state (`events backfill`:
/// which files a function has fired on while their rows are kept).
pub(super) const SCHEMA_5: &str = "
CREATE INDEX IF NOT EXISTS firings_by_function_path ON firings (function, path);
";

/// Version 6: each scheduled function's last fired tick (Unix ms), written once its firings
/// are, so that a tick fires once however often the gateway restarts, and ticks missed while
/// it was down collapse into the latest.
pub(super) const SCHEMA_6: &str = "
CREATE TABLE IF NOT EXISTS schedule_ticks (function TEXT PRIMARY KEY, tick_ms INTEGER NOT NULL) WITHOUT ROWID;
";

/// Version 7: collecting triggers' groups (`super::groups`). A group is open until complete
/// (`fired`, with the firing it made) or past its timeout (`expired`); at most one group per
/// function and key is open. Its members are the distinct files that joined it, each with the
/// event that brought it; a copy of a member's event finds its key taken (function, event
/// key). A firing made by a group names it (`firings.collect`).
pub(super) const SCHEMA_7: &str = "
CREATE TABLE IF NOT EXISTS collect_groups (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    function    TEXT NOT NULL,
    group_key   TEXT NOT NULL,
    owner       TEXT NOT NULL,
    writer      TEXT,
    record      TEXT NOT NULL,
    state       TEXT NOT NULL,
    members     INTEGER NOT NULL DEFAULT 0,
    opened_ms   INTEGER NOT NULL,
    last_ms     INTEGER NOT NULL,
    closes_ms   INTEGER NOT NULL,
    quiet_ms    INTEGER,
    closed_ms   INTEGER,
    firing      INTEGER
);
CREATE UNIQUE INDEX IF NOT EXISTS collect_groups_open ON collect_groups (function, group_key) WHERE state = 'open';
CREATE INDEX IF NOT EXISTS collect_groups_open_by_time ON collect_groups (closes_ms) WHERE state = 'open';
CREATE TABLE IF NOT EXISTS collect_members (
    group_id   INTEGER NOT NULL,
    function   TEXT NOT NULL,
    event_key  TEXT NOT NULL,
    path       TEXT NOT NULL,
    event      TEXT NOT NULL,
    arrived_ms INTEGER NOT NULL,
    PRIMARY KEY (group_id, path),
    UNIQUE (function, event_key)
);
ALTER TABLE firings ADD COLUMN collect INTEGER;
";

/// Brings the file up to [`SCHEMA_VERSION`] in one transaction; refuses a newer one.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), FiringError> {
    const _: () = assert!(SCHEMA_VERSION as usize == MIGRATIONS.len());
    htfaas_functions::store::migrate(conn, &MIGRATIONS, "firing store")?
        .map_err(|found| FiringError::SchemaTooNew { found, supported: SCHEMA_VERSION })
}
