//! Revocations in the store: the in-memory revoked set checked by submit, recording a
//! revocation (its jobs removed or stopped in the same transaction) and reading them back.
//!
//! Must not know: EP sessions (it is told which sessions close) or HTTP.

use super::Queue;
use super::schema::LIVE;
use super::trail::job_subject;
use crate::error::QueueError;
use crate::revocation::{Credential, target_from_parts, target_parts};
use htfaas_functions::audit::{self, AuditDraft};
use htfaas_functions::proto::{Revocation, RevocationTarget};
use htfaas_functions::store::{db_int, exec, from_db, now_ms};
use rusqlite::{Connection, params};
use serde::{Deserialize, Serialize};

/// What [`Queue::record_revocation`] did to jobs, and the record it wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The revocation as stored and answered.
    pub revocation: Revocation,
    /// Running jobs now removed, with the EP session each runs on: they are to be stopped.
    pub stopped: Vec<(String, String)>,
}

/// The `result` column of `revocations` (a stored format, not a wire type).
#[derive(Serialize, Deserialize)]
struct RevocationResult {
    removed_jobs: Vec<String>,
    stopped_jobs: Vec<String>,
    closed_eps: Vec<String>,
}

/// Every live job's credential, oldest first. Without `INDEXED BY` the planner, lacking
/// statistics, walks the whole table in `seq` order.
pub(super) fn live_credentials_sql() -> String {
    format!(
        "SELECT id, state, ep_session, token_jti, owner, token_issuer FROM jobs INDEXED BY jobs_live_by_owner \
         WHERE {LIVE} ORDER BY seq"
    )
}

/// Idle, running and held jobs whose submit token `target` names: `(id, state, ep_session)`.
fn active_jobs_named_by(
    conn: &Connection,
    target: &RevocationTarget,
) -> rusqlite::Result<Vec<(String, String, Option<String>)>> {
    let mut stmt = conn.prepare_cached(&live_credentials_sql())?;
    let rows = stmt.query_map([], |r| {
        let credential = Credential { jti: r.get(3)?, owner: Some(r.get(4)?), issuer: r.get(5)? };
        Ok((credential.is_named_by(target), (r.get(0)?, r.get(1)?, r.get(2)?)))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (named, job) = row?;
        if named {
            out.push(job);
        }
    }
    Ok(out)
}

/// Every recorded revocation, oldest first.
pub(super) fn read_revocations(conn: &Connection) -> Result<Vec<Revocation>, QueueError> {
    let mut stmt =
        conn.prepare_cached("SELECT seq, kind, value, reason, \"by\", at_ms, result FROM revocations ORDER BY seq")?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, String>(3)?,
            r.get::<_, String>(4)?,
            r.get::<_, i64>(5)?,
            r.get::<_, String>(6)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (seq, kind, value, reason, by, at_ms, result) = row?;
        let corrupt = |reason: String| QueueError::Corrupt { id: format!("revocation {seq}"), reason };
        let target = target_from_parts(&kind, value).ok_or_else(|| corrupt(format!("unknown kind {kind:?}")))?;
        let result: RevocationResult = serde_json::from_str(&result).map_err(|e| corrupt(format!("result: {e}")))?;
        out.push(Revocation {
            target,
            reason,
            by,
            at_ms: from_db(at_ms),
            removed_jobs: result.removed_jobs,
            stopped_jobs: result.stopped_jobs,
            closed_eps: result.closed_eps,
        });
    }
    Ok(out)
}

impl Queue {
    /// Why `c` is revoked, if it is (O(1), in memory).
    pub fn revoked_reason(&self, c: &Credential) -> Option<String> {
        self.revoked.read().unwrap_or_else(|p| p.into_inner()).reason_for(c).map(str::to_owned)
    }

    /// From now on, credentials named by `target` are refused (in memory only:
    /// [`Queue::record_revocation`] makes it durable).
    pub fn block(&self, target: RevocationTarget, reason: String) {
        self.revoked.write().unwrap_or_else(|p| p.into_inner()).insert(target, reason);
    }

    /// In one transaction: every idle, running or held job whose submit token `target` names
    /// becomes `removed` with the reason `token revoked: <reason>` (running ones keep their
    /// session, so that their late report is still charged), and the revocation is recorded with what it
    /// did (`closed_eps` is the caller's part).
    pub async fn record_revocation(
        &self,
        target: RevocationTarget,
        reason: String,
        by: String,
        closed_eps: Vec<String>,
    ) -> Result<Recorded, QueueError> {
        self.write(move |tx| {
            let at_ms = now_ms();
            let job_reason = QueueError::Revoked { reason: reason.clone() }.to_string();
            let mut result = RevocationResult { removed_jobs: vec![], stopped_jobs: vec![], closed_eps };
            let mut stopped = Vec::new();
            let mut removals = Vec::new();
            for (id, state, session) in active_jobs_named_by(tx, &target)? {
                exec(
                    tx,
                    "UPDATE jobs SET state = 'removed', reason = ?2, hold_code = NULL, finished_at_ms = ?3 \
                     WHERE id = ?1",
                    params![id, job_reason, db_int(at_ms)],
                )?;
                if let Some(subject) = job_subject(tx, &id)? {
                    removals.push(AuditDraft::job_removed(subject, &job_reason, &state).with_actor(by.clone()));
                }
                match (state.as_str(), session) {
                    ("running", Some(session)) => {
                        result.stopped_jobs.push(id.clone());
                        stopped.push((id, session));
                    }
                    _ => result.removed_jobs.push(id),
                }
            }
            let (kind, value) = target_parts(&target);
            exec(
                tx,
                "INSERT INTO revocations (kind, value, reason, \"by\", at_ms, result) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![kind, value, reason, by, db_int(at_ms), serde_json::to_string(&result)?],
            )?;
            let RevocationResult { removed_jobs, stopped_jobs, closed_eps } = result;
            let revocation = Revocation { target, reason, by, at_ms, removed_jobs, stopped_jobs, closed_eps };
            audit::append_in(tx, AuditDraft::token_revoked(&revocation))?;
            for draft in removals {
                audit::append_in(tx, draft)?;
            }
            Ok(Recorded { revocation, stopped })
        })
        .await
    }

    /// Every recorded revocation, oldest first.
    pub async fn revocations(&self) -> Result<Vec<Revocation>, QueueError> {
        self.call(|conn| read_revocations(conn)).await
    }
}
