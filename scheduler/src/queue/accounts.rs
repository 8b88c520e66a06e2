//! Fair-share accounting: charging a finished run to its owner (and group) with decayed usage
//! ([`decay`]), accounts, usage rows for fair share, and priority factors.
//!
//! Must not know: how priorities are computed from usage (that is [`crate::policy`]).

use super::Queue;
use crate::error::QueueError;
use htfaas_functions::audit::{self, AuditDraft, Subject};
use htfaas_functions::proto::{Account, JobState, Usage};
use htfaas_functions::store::{db_int, exec, from_db, row};
use rusqlite::{Connection, OptionalExtension as _, params};

/// An owner's (or group's) usage as fair share reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageRow {
    /// Owner or group name.
    pub name: String,
    /// Decayed core-seconds as of `at_ms`.
    pub decayed: f64,
    /// When `decayed` was last brought up to date, Unix ms.
    pub at_ms: u64,
    /// Priority factor (owners; 1 for groups).
    pub factor: f64,
    /// All core-seconds ever charged.
    pub core_seconds: f64,
}

/// `u` core-seconds as of `at_ms`, decayed to `now_ms` with a half-life of `half_life_s`.
pub fn decay(u: f64, at_ms: u64, now_ms: u64, half_life_s: f64) -> f64 {
    if half_life_s <= 0.0 {
        return 0.0;
    }
    let dt_s = now_ms.saturating_sub(at_ms) as f64 / 1000.0;
    u * 0.5f64.powf(dt_s / half_life_s)
}

/// Adds one finished job to an account: its usage always, and one to the count of its final
/// state (a removed job counts as neither completed nor failed).
fn charge(acc: &mut Account, state: JobState, cpus: u32, u: &Usage) {
    match state {
        JobState::Completed => acc.jobs_completed = acc.jobs_completed.saturating_add(1),
        JobState::Failed => acc.jobs_failed = acc.jobs_failed.saturating_add(1),
        JobState::Idle | JobState::Running | JobState::Removed | JobState::Held => {}
    }
    let wall_s = u.wall_ms as f64 / 1000.0;
    acc.core_seconds += f64::from(cpus) * wall_s;
    acc.cpu_seconds += u.cpu_ms as f64 / 1000.0;
    acc.wall_seconds += wall_s;
    acc.bytes_in = acc.bytes_in.saturating_add(u.bytes_in);
    acc.bytes_out = acc.bytes_out.saturating_add(u.bytes_out);
}

/// Charges one reported attempt to `owner`'s account (and `group`'s usage) with [`charge`]:
/// its usage, and one to the count of its final `state`, if that is one. Returns the
/// core-seconds charged.
#[allow(clippy::too_many_arguments)]
pub(super) fn charge_owner(
    tx: &Connection,
    owner: &str,
    group: Option<&str>,
    cpus: u32,
    state: JobState,
    u: &Usage,
    now: u64,
    half_life_s: f64,
) -> rusqlite::Result<f64> {
    let mut acc = read_account(tx, owner)?.unwrap_or_else(|| Account { owner: owner.to_owned(), ..Account::default() });
    let before = acc.core_seconds;
    charge(&mut acc, state, cpus, u);
    let core_s = acc.core_seconds - before;
    if let Some(g) = group {
        exec(
            tx,
            "INSERT INTO group_usage (grp, core_seconds, usage_decayed, usage_at_ms) VALUES (?1, 0, 0, ?2) \
             ON CONFLICT (grp) DO NOTHING",
            params![g, db_int(now)],
        )?;
        exec(tx, "UPDATE group_usage SET core_seconds = core_seconds + ?2 WHERE grp = ?1", params![g, core_s])?;
        charge_decayed(tx, "group_usage", "grp", g, core_s, now, half_life_s)?;
    }
    exec(
        tx,
        "INSERT INTO accounts (owner, jobs_completed, jobs_failed, core_seconds, cpu_seconds, \
         wall_seconds, bytes_in, bytes_out) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
         ON CONFLICT (owner) DO UPDATE SET jobs_completed = excluded.jobs_completed, \
         jobs_failed = excluded.jobs_failed, core_seconds = excluded.core_seconds, \
         cpu_seconds = excluded.cpu_seconds, wall_seconds = excluded.wall_seconds, \
         bytes_in = excluded.bytes_in, bytes_out = excluded.bytes_out",
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
    charge_decayed(tx, "accounts", "owner", owner, core_s, now, half_life_s)?;
    Ok(core_s)
}

/// Adds `core_s` to the decayed usage of row `name` of `table` (keyed by `key`), first decaying
/// what it had to `now`. The row must exist. Table and key are our constants, never input.
fn charge_decayed(
    tx: &rusqlite::Connection,
    table: &str,
    key: &str,
    name: &str,
    core_s: f64,
    now: u64,
    half_life_s: f64,
) -> rusqlite::Result<()> {
    let row: Option<(f64, i64)> =
        row(tx, &format!("SELECT usage_decayed, usage_at_ms FROM {table} WHERE {key} = ?1"), params![name], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()?;
    let (u, at) = row.unwrap_or((0.0, 0));
    let u = decay(u, from_db(at), now, half_life_s) + core_s;
    exec(
        tx,
        &format!("UPDATE {table} SET usage_decayed = ?2, usage_at_ms = ?3 WHERE {key} = ?1"),
        params![name, u, db_int(now)],
    )?;
    Ok(())
}

fn usage_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<UsageRow> {
    Ok(UsageRow {
        name: r.get(0)?,
        decayed: r.get(1)?,
        at_ms: from_db(r.get(2)?),
        factor: r.get(3)?,
        core_seconds: r.get(4)?,
    })
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

fn read_account(tx: &rusqlite::Connection, owner: &str) -> rusqlite::Result<Option<Account>> {
    row(
        tx,
        "SELECT owner, jobs_completed, jobs_failed, core_seconds, cpu_seconds, wall_seconds, bytes_in, bytes_out \
         FROM accounts WHERE owner = ?1",
        params![owner],
        account_row,
    )
    .optional()
}

impl Queue {
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

    /// Every owner's account as the job records say it should be: each run attempt's recorded
    /// usage charged with `charge` (the function `finish` charges with), and each job in a
    /// final state counted once. Equal to [`Queue::accounts`] (up to float rounding) unless an
    /// account was charged twice or not at all; the crash harness checks exactly that.
    pub async fn accounts_from_records(&self) -> Result<Vec<Account>, QueueError> {
        self.call(|conn| {
            let mut by_owner: std::collections::BTreeMap<String, Account> = std::collections::BTreeMap::new();
            let mut stmt = conn.prepare(
                "SELECT j.owner, j.cpus, a.usage, j.id, a.n FROM attempts a JOIN jobs j ON j.id = a.job_id \
                 WHERE a.usage IS NOT NULL",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, u32>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, u32>(4)?,
                ))
            })?;
            for row in rows {
                let (owner, cpus, usage, id, n) = row?;
                let u: Usage = serde_json::from_str(&usage)
                    .map_err(|e| QueueError::Corrupt { id, reason: format!("attempt {n} usage: {e}") })?;
                let acc = by_owner.entry(owner.clone()).or_insert_with(|| Account { owner, ..Account::default() });
                charge(acc, JobState::Idle, cpus, &u);
            }
            let mut stmt = conn.prepare(
                "SELECT owner, state, COUNT(*) FROM jobs WHERE state IN ('completed', 'failed') GROUP BY owner, state",
            )?;
            let rows =
                stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, i64>(2)?)))?;
            for row in rows {
                let (owner, state, count) = row?;
                let acc = by_owner.entry(owner.clone()).or_insert_with(|| Account { owner, ..Account::default() });
                match state.as_str() {
                    "completed" => acc.jobs_completed = from_db(count),
                    _ => acc.jobs_failed = from_db(count),
                }
            }
            Ok(by_owner.into_values().collect())
        })
        .await
    }

    /// Every owner's usage row (decayed usage, factor, total), by owner.
    pub async fn owner_usage(&self) -> Result<Vec<UsageRow>, QueueError> {
        // One row per owner: read at once ([`Queue::call_now`]), every dispatch round does.
        self.call_now(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT owner, usage_decayed, usage_at_ms, factor, core_seconds FROM accounts ORDER BY owner",
            )?;
            let rows = stmt.query_map([], usage_row)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Every accounting group's usage row, by group.
    pub async fn group_usage(&self) -> Result<Vec<UsageRow>, QueueError> {
        self.call(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT grp, usage_decayed, usage_at_ms, 1.0, core_seconds FROM group_usage ORDER BY grp",
            )?;
            let rows = stmt.query_map([], usage_row)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Sets an owner's priority factor (creating their account if they have none yet), as
    /// `actor` (recorded in the audit trail).
    pub async fn set_factor(&self, owner: String, factor: f64, actor: String) -> Result<(), QueueError> {
        self.write(move |tx| {
            exec(
                tx,
                "INSERT INTO accounts (owner, jobs_completed, jobs_failed, core_seconds, cpu_seconds, wall_seconds, \
                 bytes_in, bytes_out, factor) VALUES (?1, 0, 0, 0, 0, 0, 0, 0, ?2) \
                 ON CONFLICT (owner) DO UPDATE SET factor = excluded.factor",
                params![owner, factor],
            )?;
            let subject = Subject { owner: Some(owner.clone()), ..Subject::default() };
            // The factor as a string: records hold integers and strings, never floats.
            let args = serde_json::json!({ "factor": factor.to_string() });
            audit::append_in(tx, AuditDraft::admin_action(&actor, "set_factor", subject, args))?;
            Ok(())
        })
        .await
    }
}
