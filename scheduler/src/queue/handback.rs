//! Jobs an EP hands back unstarted (the prefetch extension's `NotStarted`): a job it
//! held queued and never started goes back to idle at once, no loss counted.
//!
//! Must not know: the EP table, whether the hand-back is free (the session decides that and
//! sends the costly case through [`Queue::finish`] as a return), the WebSocket.

use super::Queue;
use super::trail::job_subject;
use crate::error::QueueError;
use htfaas_functions::audit::{self, AuditDraft};
use htfaas_functions::store::{db_int, exec, now_ms};
use rusqlite::params;

/// What [`Queue::hand_back`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandedBack {
    /// The job was running on the session: idle again, its attempt ended `not-started`.
    Requeued,
    /// It was not running on the session (held or removed meanwhile, unknown, reported):
    /// nothing changed; a held or removed job's attempt is still open for a report.
    NotRunning,
}

impl Queue {
    /// In one transaction: if `job_id` is running on `ep_session`, it goes back to idle at once
    /// (no loss counted, no backoff: it never started); its attempt ends `not-started` with
    /// `why`, recorded as `attempt.lost` (detail `not_started`, then `requeued`).
    pub async fn hand_back(&self, ep_session: String, job_id: String, why: String) -> Result<HandedBack, QueueError> {
        self.write(move |tx| {
            let Some((attempt, ep)) = super::runs::running_attempt(tx, &job_id, &ep_session)? else {
                return Ok(HandedBack::NotRunning);
            };
            let now = db_int(now_ms());
            exec(
                tx,
                "UPDATE attempts SET outcome = 'not-started', reason = ?3, ended_at_ms = ?4 \
                 WHERE job_id = ?1 AND ep_session = ?2 AND ended_at_ms IS NULL",
                params![job_id, ep_session, why, now],
            )?;
            exec(
                tx,
                "UPDATE jobs SET state = 'idle', ep = NULL, ep_session = NULL, started_at_ms = NULL, \
                 not_before_ms = 0 WHERE id = ?1",
                params![job_id],
            )?;
            if let Some(subject) = job_subject(tx, &job_id)? {
                let why = format!("handed back unstarted: {why}");
                let record = AuditDraft::attempt_lost(subject, &ep, &ep_session, attempt, &why, "requeued")
                    .with_detail("not_started", true.into());
                audit::append_in(tx, record)?;
            }
            Ok(HandedBack::Requeued)
        })
        .await
    }
}
