//! EP admin settings kept by EP name (drain, disable, paused groups), so they outlive sessions.
//!
//! Must not know: the EP table that applies them.

use super::Queue;
use crate::error::QueueError;
use htfaas_functions::audit::{self, AuditDraft};
use htfaas_functions::proto::EpAdminState;
use htfaas_functions::store::{db_int, exec, from_db};
use rusqlite::params;

/// An EP's admin settings as stored, by name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EpAdminRow {
    /// The EP's name.
    pub name: String,
    /// Enabled, draining or disabled.
    pub state: EpAdminState,
    /// Drain deadline, Unix ms.
    pub deadline_ms: Option<u64>,
    /// Paused accounting groups.
    pub paused: Vec<String>,
    /// Why it was last changed.
    pub reason: String,
    /// When, Unix ms.
    pub at_ms: u64,
}

impl Queue {
    /// Every EP name's admin settings.
    pub async fn ep_admin(&self) -> Result<Vec<EpAdminRow>, QueueError> {
        self.call(|conn| {
            let mut stmt = conn
                .prepare_cached("SELECT name, state, deadline_ms, paused, reason, at_ms FROM ep_admin ORDER BY name")?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<i64>>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, i64>(5)?,
                ))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (name, state, deadline, paused, reason, at) = row?;
                let corrupt = |what: String| QueueError::Corrupt { id: format!("ep_admin {name}"), reason: what };
                let state = match state.as_str() {
                    "enabled" => EpAdminState::Enabled,
                    "draining" => EpAdminState::Draining,
                    "disabled" => EpAdminState::Disabled,
                    other => return Err(corrupt(format!("state {other:?}"))),
                };
                let paused: Vec<String> = serde_json::from_str(&paused).map_err(|e| corrupt(format!("paused: {e}")))?;
                out.push(EpAdminRow {
                    name,
                    state,
                    deadline_ms: deadline.map(from_db),
                    paused,
                    reason,
                    at_ms: from_db(at),
                });
            }
            Ok(out)
        })
        .await
    }

    /// Stores an EP name's admin settings (replacing what it had), with `audit`, the record of
    /// the admin action that set them, in the same transaction.
    pub async fn set_ep_admin(&self, row: EpAdminRow, audit: AuditDraft) -> Result<(), QueueError> {
        self.write(move |tx| {
            let state = match row.state {
                EpAdminState::Enabled => "enabled",
                EpAdminState::Draining => "draining",
                EpAdminState::Disabled => "disabled",
            };
            exec(
                tx,
                "INSERT OR REPLACE INTO ep_admin (name, state, deadline_ms, paused, reason, at_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    row.name,
                    state,
                    row.deadline_ms.map(db_int),
                    serde_json::to_string(&row.paused)?,
                    row.reason,
                    db_int(row.at_ms)
                ],
            )?;
            audit::append_in(tx, audit)?;
            Ok(())
        })
        .await
    }
}
