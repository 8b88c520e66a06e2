//! One firing row written inside the caller's transaction ([`insert_firing`]), and the cause a
//! written file carries ([`lookup_cause`]): what an event's firings and a group's firing both
//! write.
//!
//! Must not know: NATS, HTTP, groups, the dead-letter list, claims.

use super::FiringError;
use htfaas_functions::FunctionRecord;
use htfaas_functions::event::StorageEvent;
use htfaas_functions::proto::Cause;
use htfaas_functions::store::{db_int, row};
use rusqlite::{Connection, OptionalExtension as _, params};

/// One firing row to write ([`insert_firing`]): the event (and its JSON), its key, the
/// function version, and what the row carries besides.
#[derive(Clone, Copy)]
pub(super) struct FiringRow<'a> {
    pub(super) key: &'a str,
    pub(super) function: &'a FunctionRecord,
    pub(super) event: &'a StorageEvent,
    pub(super) event_json: &'a str,
    pub(super) replay: Option<&'a str>,
    pub(super) cause_json: Option<&'a str>,
    pub(super) now_ms: u64,
    pub(super) not_before_ms: u64,
    pub(super) window_ms: u64,
    /// The collecting group whose firing this is.
    pub(super) collect: Option<i64>,
}

/// Writes `row` as a pending firing unless its key is taken; returns its `seq` when written.
pub(super) fn insert_firing(tx: &Connection, row: &FiringRow<'_>) -> Result<Option<i64>, FiringError> {
    let m = &row.function.manifest;
    let record = serde_json::to_string(row.function)?;
    let inserted = tx
        .prepare_cached(
            "INSERT OR IGNORE INTO firings (event_key, function, digest, version, path, replay, record, \
             event, state, not_before_ms, created_ms, updated_ms, expires_ms, cause, owner, collect) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'pending', ?9, ?10, ?10, ?11, ?12, ?13, ?14)",
        )?
        .execute(params![
            row.key,
            m.name,
            m.module.as_str(),
            row.function.version,
            row.event.path,
            row.replay,
            record,
            row.event_json,
            db_int(row.not_before_ms),
            db_int(row.now_ms),
            db_int(row.now_ms.saturating_add(row.window_ms)),
            row.cause_json,
            m.owner,
            row.collect,
        ])?;
    Ok((inserted > 0).then(|| tx.last_insert_rowid()))
}

/// The cause recorded for the write macaroon `macaroon`; an unreadable entry counts as none
/// (logged): the worst that does is one more run, which the chain's own guard then stops.
pub(super) fn lookup_cause(conn: &Connection, macaroon: &str) -> Result<Option<Cause>, FiringError> {
    let json: Option<String> =
        row(conn, "SELECT cause FROM provenance WHERE macaroon = ?1", params![macaroon], |r| r.get(0)).optional()?;
    Ok(json.and_then(|j| match serde_json::from_str(&j) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::error!(macaroon, "provenance entry unreadable, ignored: {e}");
            None
        }
    }))
}
