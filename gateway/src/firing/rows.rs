//! One event's firing rows, written inside the caller's transaction ([`insert_event`]), and
//! the cause a written file carries ([`lookup_cause`]): what both the table's inserts and the
//! dead-letter list's re-drives write.
//!
//! Must not know: NATS, HTTP, the dead-letter list, claims.

use super::{FiringError, Inserted, MAX_CHAIN, event_key};
use crate::audit::Fired;
use htfaas_functions::FunctionRecord;
use htfaas_functions::audit;
use htfaas_functions::event::StorageEvent;
use htfaas_functions::proto::Cause;
use htfaas_functions::store::{db_int, row};
use rusqlite::{Connection, OptionalExtension as _, params};

/// One event's firings inside the caller's transaction (see [`Firings::insert`]); sees
/// what earlier events of the same transaction wrote.
pub(super) fn insert_event(
    tx: &Connection,
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
                 event, state, not_before_ms, created_ms, updated_ms, expires_ms, cause, owner) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'pending', ?9, ?10, ?10, ?11, ?12, ?13)",
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
                m.owner,
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
