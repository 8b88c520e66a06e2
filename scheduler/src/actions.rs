//! Admin job actions, HTCondor's `condor_hold`, `condor_release` and `condor_rm` for one job:
//! [`Action`], [`validate_reason`] and `apply`.
//!
//! | action | from | to |
//! |---|---|---|
//! | hold | `idle`, `running` | `held`, `reason` = the given reason, `hold_code` = [`HOLD_CODE_BY_ADMIN`] |
//! | release | `held` | `idle` (reason and hold code cleared), dispatched like any idle job |
//! | remove | `idle`, `running`, `held` | `removed`, `reason` = `removed by admin: <reason>` |
//!
//! Any other state is a conflict (409). A running job that is held or removed is stopped the
//! way a revocation stops one: the state changes in one transaction
//! ([`crate::queue::Queue::act_by`]), then its EP session gets
//! [`SchedulerMsg::Cancel`](htfaas_functions::proto::SchedulerMsg::Cancel) with the job's new
//! reason. Its reservation on the EP stays until the EP's `Finished` (charged, state kept) or
//! the end of the session; a released job is not put on that same session again before then.
//!
//! [`HOLD_CODE_BY_ADMIN`]: htfaas_functions::proto::HOLD_CODE_BY_ADMIN

use crate::error::QueueError;
use crate::state::Shared;
use htfaas_functions::proto::JobRecord;

pub use crate::queue::Action;

/// Longest action reason, bytes.
pub const MAX_REASON_BYTES: usize = 1024;

/// An action's reason is refused (400): it must be 1..=[`MAX_REASON_BYTES`] bytes without
/// control characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("reason must be 1-{MAX_REASON_BYTES} bytes without control characters")]
pub struct BadReason;

/// Why a reason is refused (400): it must be 1..=[`MAX_REASON_BYTES`] bytes without control
/// characters.
pub fn validate_reason(reason: &str) -> Result<(), BadReason> {
    if reason.is_empty() || reason.len() > MAX_REASON_BYTES || reason.chars().any(char::is_control) {
        return Err(BadReason);
    }
    Ok(())
}

/// Applies `action` to job `id` with a validated `reason`, as `actor` (the admin, named in the
/// audit record written with the change): records it, stops the job on its EP when it was
/// running, wakes the dispatcher, and returns the job as it is now.
#[tracing::instrument(name = "scheduler.job_action", skip_all, fields(job.id = %id, action = action.done()))]
pub(crate) async fn apply(
    shared: &Shared,
    id: String,
    action: Action,
    reason: String,
    actor: &str,
) -> Result<JobRecord, QueueError> {
    let acted = shared
        .queue
        .act_by(id, action, reason, actor.to_owned())
        .await
        .inspect_err(|e| tracing::info!("refused: {e}"))?;
    if let Some(session) = &acted.stop {
        let record = &acted.record;
        let ends = record.state == htfaas_functions::proto::JobState::Removed;
        if !shared.eps().cancel(session, &record.id, &record.reason, ends) {
            tracing::info!("the job's EP session no longer holds it; nothing to stop");
        }
    }
    tracing::info!(state = acted.record.state.as_str(), "job {}", action.done());
    shared.wake.notify_one();
    Ok(acted.record)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_bounded_and_printable() {
        assert_eq!(validate_reason("disk full"), Ok(()));
        assert_eq!(validate_reason(&"é".repeat(MAX_REASON_BYTES / 2)), Ok(()));
        for bad in [String::new(), "x".repeat(MAX_REASON_BYTES + 1), "a\nb".into(), "a\0".into(), "\u{7f}".into()] {
            assert_eq!(validate_reason(&bad), Err(BadReason), "{bad:?} accepted");
        }
    }
}
