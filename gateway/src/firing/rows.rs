//! One event's firing rows, written inside the caller's transaction ([`insert_event`]): what
//! both the table's inserts and the dead-letter list's re-drives write.
//!
//! Must not know: NATS, HTTP, the dead-letter list, claims.

use super::insert::{FiringRow, insert_firing, lookup_cause};
use super::{FiringError, Inserted, MAX_CHAIN, event_key};
use crate::audit::Fired;
use htfaas_functions::FunctionRecord;
use htfaas_functions::audit;
use htfaas_functions::event::StorageEvent;
use htfaas_functions::store::db_int;
use rusqlite::{Connection, params};

/// One event's firings inside the caller's transaction (see [`super::Firings::insert`]); sees
/// what earlier events of the same transaction wrote. A collecting function's event joins
/// its group instead ([`super::groups::join`]), unless it is a replay's.
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
            done.count(&Fired::LoopGuarded);
            fired.push((f, Fired::LoopGuarded));
            continue;
        }
        let debounce_ms = m.trigger.debounce_s.unwrap_or(0).saturating_mul(1000);
        let row = FiringRow {
            key: &key,
            function: f,
            event,
            event_json: &event_json,
            replay,
            cause_json: cause_json.as_deref(),
            now_ms,
            not_before_ms: now_ms.saturating_add(debounce_ms),
            window_ms,
            collect: None,
        };
        let outcome = match (&m.trigger.collect, replay) {
            (Some(collect), None) => super::groups::join(tx, &row, collect)?,
            (Some(_), Some(_)) => insert_firing(tx, &row)?.map_or(Fired::Duplicate, |_| Fired::Ungrouped),
            (None, _) => match insert_firing(tx, &row)? {
                None => Fired::Duplicate,
                Some(seq) => {
                    if debounce_ms > 0 {
                        let superseded = tx
                            .prepare_cached(
                                "UPDATE firings SET state = 'superseded', superseded_by = ?1, updated_ms = ?2 \
                                 WHERE function = ?3 AND path = ?4 AND state = 'pending' AND seq != ?1",
                            )?
                            .execute(params![seq, db_int(now_ms), m.name, event.path])?;
                        done.superseded += superseded as u64;
                    }
                    Fired::Queued
                }
            },
        };
        done.count(&outcome);
        fired.push((f, outcome));
    }
    if let Some(record) = crate::audit::event_matched(event, &fired, cause.as_ref(), replay) {
        audit::append_in(tx, record)?;
    }
    Ok(done)
}
