//! Collecting triggers' groups (fan-in, [`htfaas_functions::collect`]): an event of a
//! collecting function joins its group in the ingest batch's transaction ([`join`]); a group
//! completed by count, marker or fullness writes its one firing in that same transaction; the
//! clock ([`Firings::sweep_groups`]) fires groups whose quiet period is over and expires those
//! past their timeout. Every close writes its `group.closed` record in its transaction. A
//! group's firing names it, so a claim reads its other members ([`other_members`]).
//!
//! A group merges one writer's files: it keeps the writer of its first file (the event's
//! `owner`, which dCache billing names), and a file of another writer joins nothing.
//!
//! Must not know: NATS, HTTP, the dead-letter list, how a claim is dispatched.

use super::insert::{FiringRow, insert_firing, lookup_cause};
use super::{FiringError, Firings};
use crate::audit::Fired;
use htfaas_functions::FunctionRecord;
use htfaas_functions::audit;
use htfaas_functions::collect::{Closing, Collect};
use htfaas_functions::event::StorageEvent;
use htfaas_functions::store::{begin_immediate, db_int, exec, from_db, row};
use rusqlite::{Connection, OptionalExtension as _, params};
use std::sync::atomic::Ordering;

/// What one sweep of the groups did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    /// Groups fired by their quiet period.
    pub fired: u64,
    /// Groups expired by their timeout (recorded, not fired).
    pub expired: u64,
}

/// A collecting function's open group, as `fn test` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenGroup {
    /// Its files so far, sorted.
    pub members: Vec<String>,
    /// Its first file's writer.
    pub writer: Option<String>,
}

/// Joins `row`'s event to its group of the collecting function `row.function`, inside the
/// caller's transaction: a copy of a member's event joins nothing (`Duplicate`); a file of
/// another writer than the group's is kept out (`OtherWriter`); a file that completes the
/// group writes its firing and closes it (`Completed`); else it waits (`Collected`). A file
/// below no directory of the key fires alone (`Ungrouped`).
pub(super) fn join(tx: &Connection, row_: &FiringRow<'_>, collect: &Collect) -> Result<Fired, FiringError> {
    let event = row_.event;
    let Some(group) = collect.group_of(&event.path) else {
        return Ok(insert_firing(tx, row_)?.map_or(Fired::Duplicate, |_| Fired::Ungrouped));
    };
    let name = &row_.function.manifest.name;
    let known: Option<i64> =
        row(tx, "SELECT 1 FROM collect_members WHERE function = ?1 AND event_key = ?2", params![name, row_.key], |r| {
            r.get(0)
        })
        .optional()?;
    if known.is_some() {
        return Ok(Fired::Duplicate);
    }
    let open: Option<(i64, Option<String>, i64)> = row(
        tx,
        "SELECT id, writer, members FROM collect_groups WHERE function = ?1 AND group_key = ?2 AND state = 'open'",
        params![name, group],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
    .optional()?;
    let now = row_.now_ms;
    let (id, members) = match open {
        Some((_, writer, _)) if writer != event.owner => return Ok(Fired::OtherWriter(group)),
        Some((id, _, members)) => (id, u32::try_from(members).unwrap_or(u32::MAX)),
        None => {
            let record = serde_json::to_string(row_.function)?;
            let closes = now.saturating_add(collect.timeout_s().saturating_mul(1000));
            let quiet_ms = collect.quiet_s.map(|q| db_int(q.saturating_mul(1000)));
            exec(
                tx,
                "INSERT INTO collect_groups (function, group_key, owner, writer, record, state, members, \
                 opened_ms, last_ms, closes_ms, quiet_ms) VALUES (?1, ?2, ?3, ?4, ?5, 'open', 0, ?6, ?6, ?7, ?8)",
                params![
                    name,
                    group,
                    row_.function.manifest.owner,
                    event.owner,
                    record,
                    db_int(now),
                    db_int(closes),
                    quiet_ms
                ],
            )?;
            (tx.last_insert_rowid(), 0)
        }
    };
    let added = exec(
        tx,
        "INSERT OR IGNORE INTO collect_members (group_id, function, event_key, path, event, arrived_ms) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![id, name, row_.key, event.path, row_.event_json, db_int(now)],
    )?;
    let members = members.saturating_add(u32::try_from(added).unwrap_or(0));
    exec(tx, "UPDATE collect_groups SET members = ?2, last_ms = ?3 WHERE id = ?1", params![id, members, db_int(now)])?;
    let file = event.path.rsplit('/').next().unwrap_or_default();
    let Some(how) = collect.complete_on_arrival(members, file) else { return Ok(Fired::Collected(group)) };
    let firing = insert_firing(tx, &FiringRow { collect: Some(id), ..*row_ })?;
    close(tx, id, row_.function, &group, how, firing, now)?;
    Ok(Fired::Completed(group))
}

/// Closes group `id` (fired with `firing`, or expired when `None`) and records it.
fn close(
    tx: &Connection,
    id: i64,
    function: &FunctionRecord,
    group: &str,
    how: Closing,
    firing: Option<i64>,
    now_ms: u64,
) -> Result<(), FiringError> {
    let state = if firing.is_some() { "fired" } else { "expired" };
    exec(
        tx,
        "UPDATE collect_groups SET state = ?2, closed_ms = ?3, firing = ?4 WHERE id = ?1",
        params![id, state, db_int(now_ms), firing],
    )?;
    let members = member_paths(tx, id)?;
    audit::append_in(tx, crate::audit::group_closed(function, group, how, &members, firing))?;
    Ok(())
}

/// Every member path of group `id`, sorted.
pub(super) fn member_paths(conn: &Connection, id: i64) -> Result<Vec<String>, FiringError> {
    let mut stmt = conn.prepare_cached("SELECT path FROM collect_members WHERE group_id = ?1 ORDER BY path")?;
    let paths = stmt.query_map(params![id], |r| r.get(0))?.collect::<Result<_, _>>()?;
    Ok(paths)
}

/// The members of group `id` other than `input` (the firing's own file), sorted.
pub(super) fn other_members(conn: &Connection, id: i64, input: &str) -> Result<Vec<String>, FiringError> {
    let mut paths = member_paths(conn, id)?;
    paths.retain(|p| p != input);
    Ok(paths)
}

/// Inside the caller's transaction: fires each open group whose quiet period is over (on its
/// newest member's event) and expires each past its timeout.
fn sweep(tx: &Connection, now_ms: u64, window_ms: u64) -> Result<Swept, FiringError> {
    let due: Vec<(i64, String, String, u64, Option<u64>)> = tx
        .prepare_cached(
            "SELECT id, group_key, record, last_ms, quiet_ms FROM collect_groups WHERE state = 'open' \
             AND (closes_ms <= ?1 OR (quiet_ms IS NOT NULL AND last_ms + quiet_ms <= ?1))",
        )?
        .query_map(params![db_int(now_ms)], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, from_db(r.get(3)?), r.get::<_, Option<i64>>(4)?.map(from_db)))
        })?
        .collect::<Result<_, _>>()?;
    let mut swept = Swept::default();
    for (id, group, record, last_ms, quiet_ms) in due {
        let function: FunctionRecord = match serde_json::from_str(&record) {
            Ok(f) => f,
            Err(e) => {
                // Nothing can be fired from it; close it so it is not read every second.
                tracing::error!(id, "a collecting group's function record is unreadable, closed: {e}");
                exec(
                    tx,
                    "UPDATE collect_groups SET state = 'expired', closed_ms = ?2 WHERE id = ?1",
                    params![id, db_int(now_ms)],
                )?;
                swept.expired += 1;
                continue;
            }
        };
        let quiet = quiet_ms.is_some_and(|q| last_ms.saturating_add(q) <= now_ms);
        let newest: Option<(String, String)> = if quiet {
            row(
                tx,
                "SELECT event_key, event FROM collect_members WHERE group_id = ?1 \
                 ORDER BY arrived_ms DESC, rowid DESC LIMIT 1",
                params![id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?
        } else {
            None
        };
        let event =
            newest.and_then(|(key, json)| serde_json::from_str::<StorageEvent>(&json).ok().map(|e| (key, json, e)));
        let Some((key, event_json, event)) = event else {
            close(tx, id, &function, &group, Closing::Timeout, None, now_ms)?;
            swept.expired += 1;
            continue;
        };
        let cause = match &event.macaroon {
            Some(m) => lookup_cause(tx, m)?,
            None => None,
        };
        let cause_json = cause.as_ref().map(serde_json::to_string).transpose()?;
        let firing = insert_firing(
            tx,
            &FiringRow {
                key: &key,
                function: &function,
                event: &event,
                event_json: &event_json,
                replay: None,
                cause_json: cause_json.as_deref(),
                now_ms,
                not_before_ms: now_ms,
                window_ms,
                collect: Some(id),
            },
        )?;
        close(tx, id, &function, &group, Closing::Quiet, firing, now_ms)?;
        if firing.is_some() {
            swept.fired += 1;
        }
    }
    Ok(swept)
}

impl Firings {
    /// Fires the groups whose quiet period is over and expires those past their timeout, in
    /// one transaction; wakes the dispatcher when it fired any.
    pub fn sweep_groups(&self, now_ms: u64) -> Result<Swept, FiringError> {
        let swept = self.with(|conn| {
            let tx = begin_immediate(conn)?;
            let swept = sweep(&tx, now_ms, self.window_ms)?;
            tx.commit()?;
            Ok(swept)
        })?;
        if swept.fired > 0 {
            self.pending.fetch_add(swept.fired, Ordering::Relaxed);
            self.wake();
        }
        Ok(swept)
    }

    /// The open group `group` of the collecting function `function`, if one is open.
    pub fn open_group(&self, function: &str, group: &str) -> Result<Option<OpenGroup>, FiringError> {
        self.with(|conn| {
            let open: Option<(i64, Option<String>)> = row(
                conn,
                "SELECT id, writer FROM collect_groups WHERE function = ?1 AND group_key = ?2 AND state = 'open'",
                params![function, group],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
            match open {
                None => Ok(None),
                Some((id, writer)) => Ok(Some(OpenGroup { members: member_paths(conn, id)?, writer })),
            }
        })
    }

    /// Deletes up to `batch` groups closed before `now_ms` minus the dedupe window, with their
    /// members (a member's key stops a copy of its event only as long as a firing's would).
    pub(super) fn prune_groups(
        conn: &Connection,
        now_ms: u64,
        window_ms: u64,
        batch: usize,
    ) -> Result<(), FiringError> {
        let before = db_int(now_ms.saturating_sub(window_ms));
        exec(
            conn,
            "DELETE FROM collect_members WHERE group_id IN (SELECT id FROM collect_groups WHERE state != 'open' \
             AND closed_ms <= ?1 LIMIT ?2)",
            params![before, db_int(batch as u64)],
        )?;
        exec(
            conn,
            "DELETE FROM collect_groups WHERE id IN (SELECT id FROM collect_groups WHERE state != 'open' \
             AND closed_ms <= ?1 AND id NOT IN (SELECT group_id FROM collect_members) LIMIT ?2)",
            params![before, db_int(batch as u64)],
        )?;
        Ok(())
    }
}
