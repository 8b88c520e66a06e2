//! A guest that asked to be resumed ([`Outcome::Checkpointed`]: it exited with its checkpoint
//! exit code, and its EP stored its `/checkpoint`), or one its EP stopped on its own while
//! leaving and vacated with its checkpoint stored (an [`Outcome::Cancelled`] the scheduler did
//! not ask for, reported with the checkpoint): [`Queue::finish`](super::Queue::finish) asks
//! [`checkpoint_resume`] whether the job runs again from that checkpoint, on any EP.
//!
//! The rule: an attempt that stored a checkpoint other than the one it started from
//! ([`CheckpointReport::progressed`]) runs again at once, no retry used, while the job has
//! been resumed fewer than [`MAX_RESUMES`] times and its attempts together ran less than
//! [`MAX_RUNTIME_FACTOR`] times its run time. Otherwise a checkpoint exit is what it would
//! be without checkpoints, a non-zero exit, and the job's retry policy decides (so a guest that
//! keeps exiting without progress is bounded by its retries), and a vacate is a return (a lost
//! attempt, counted against the retry limit, as without checkpoints). Every attempt is
//! charged; the attempt ends `checkpointed` or `vacated`, and its `job.finished` record names
//! what it started from and stored. So a node drained for a kernel update costs a long job
//! the steps since its last checkpoint, not one of its retries.
//!
//! Must not know: the EP table, sessions beyond their id, HTTP, the storage.

use super::retry::{Again, Failing, back_to_idle};
use crate::error::QueueError;
use htfaas_functions::audit::{self, Subject};
use htfaas_functions::checkpoint::{CheckpointReport, MAX_RESUMES};
use htfaas_functions::proto::{JobReport, Outcome};
use htfaas_functions::store::row;
use rusqlite::{Connection, params};

/// A job's attempts together may run this many times its run time, resumes included.
pub const MAX_RUNTIME_FACTOR: u64 = 100;

/// What [`checkpoint_resume`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Resume {
    /// The job runs again from its checkpoint: the attempt was recorded and charged, the job is
    /// idle.
    Again,
    /// It does not: the report's outcome is now the plain non-zero exit, and `note` says why
    /// for the job's reason.
    AsExit {
        /// E.g. ` (exited with its checkpoint code without storing a new checkpoint)`.
        note: String,
    },
}

/// For a running job whose EP reported `report` with [`Outcome::Checkpointed`]: resumes it
/// ([`Resume::Again`]) or turns the report into the plain exit ([`Resume::AsExit`]); see the
/// module's rule. `runtime_s` is the job's run time.
pub(super) fn checkpoint_resume(
    tx: &Connection,
    job: &Failing<'_>,
    report: &mut JobReport,
    runtime_s: u64,
    subject: &Subject,
    half_life_s: f64,
) -> Result<Resume, QueueError> {
    let (exit_code, outcome) = match report.outcome {
        Outcome::Checkpointed { exit_code } => (Some(exit_code), "checkpointed"),
        Outcome::Cancelled { .. } => (None, "vacated"),
        _ => return Ok(Resume::AsExit { note: String::new() }),
    };
    let checkpoint = report.checkpoint.clone().unwrap_or_default();
    let (resumed, ran_ms): (u32, i64) = row(
        tx,
        "SELECT COUNT(*) FILTER (WHERE outcome IN ('checkpointed', 'vacated')), \
                COALESCE(SUM(json_extract(usage, '$.wall_ms')), 0) \
         FROM attempts WHERE job_id = ?1",
        params![report.job_id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let ran_ms = u64::try_from(ran_ms).unwrap_or(0).saturating_add(report.usage.wall_ms);
    let bound_ms = runtime_s.saturating_mul(MAX_RUNTIME_FACTOR).saturating_mul(1000);
    let why_not = if !checkpoint.progressed() {
        Some(" (exited with its checkpoint code without storing a new checkpoint)".to_owned())
    } else if resumed >= MAX_RESUMES {
        Some(format!(" (resumed {resumed} times from checkpoints, the most a job may be)"))
    } else if ran_ms > bound_ms {
        Some(format!(
            " (its attempts ran {} s together, over {MAX_RUNTIME_FACTOR} times its run time of {runtime_s} s)",
            ran_ms / 1000
        ))
    } else {
        None
    };
    if let Some(note) = why_not {
        if let Some(exit_code) = exit_code {
            report.outcome = Outcome::Exited { exit_code };
        }
        return Ok(Resume::AsExit { note });
    }
    let again = Again { outcome, then: "resume", exit_code, delay_ms: 0 };
    let record = back_to_idle(tx, job, report, subject, again, half_life_s)?
        .with_detail("resumes", (resumed + 1).into())
        .with_detail("checkpoint", checkpoint_detail(&checkpoint));
    audit::append_in(tx, record)?;
    tracing::info!(job.id = %report.job_id, attempt = job.attempt, "{outcome}: runs again from its checkpoint");
    Ok(Resume::Again)
}

/// What an attempt did with its checkpoint, for its `job.finished` record.
pub(super) fn checkpoint_detail(c: &CheckpointReport) -> serde_json::Value {
    serde_json::to_value(c).unwrap_or_default()
}
