//! Applying a revocation everywhere at once (`revoke`): the in-memory set, the EP table, the
//! store, then the sessions. What a target names, and the checks against it, are
//! [`crate::revocation`].
//!
//! Order, and why no submission or attach slips through: the target joins the in-memory set
//! first; then matching EP sessions are marked closing (an attach registers its session under
//! the same lock, after checking the set); then one transaction removes the matching jobs and
//! records the revocation (a submit checks the set inside its own transaction, so a job either
//! is refused or is committed before, and then removed by, this one); then the Cancel and Close
//! messages go out, and every native EP drops its warm handlers. If the store fails, the target stays revoked in memory until a restart.
//!
//! Must not know: HTTP (the API validates the request, then calls `revoke`).

use crate::attach::CLOSE_FORBIDDEN;
use crate::error::QueueError;
use crate::queue::Recorded;
use crate::state::Shared;
use htfaas_functions::proto::{Revocation, RevokeRequest};

/// Applies `req` everywhere (see the module docs for the order) and returns what it did, once
/// recorded.
#[tracing::instrument(name = "scheduler.revoke", skip_all, fields(target = ?req.target, by = %by))]
pub(crate) async fn revoke(shared: &Shared, req: RevokeRequest, by: &str) -> Result<Revocation, QueueError> {
    let RevokeRequest { target, reason } = req;
    shared.queue.block(target.clone(), reason.clone());
    let closing = shared.eps().mark_closing(|c| c.is_named_by(&target));
    let recorded = shared.queue.record_revocation(target, reason.clone(), by.to_owned(), closing.clone()).await;
    {
        let mut eps = shared.eps();
        if let Ok(Recorded { stopped, .. }) = &recorded {
            let why = QueueError::Revoked { reason: reason.clone() }.to_string();
            for (job_id, session) in stopped {
                // A revoked token's jobs are removed: they end, checkpoints and all.
                eps.cancel(session, job_id, &why, true);
            }
        }
        for ep_id in &closing {
            eps.close(ep_id, CLOSE_FORBIDDEN, &format!("attach token revoked: {reason}"));
        }
        // A warm handler holds its function's secrets in memory and would serve the next run
        // at once: none outlives a revocation, whoever's it was (an EP cannot tell owners).
        eps.retire_handlers(&format!("revoked: {reason}"));
    }
    shared.wake.notify_one();
    let revocation = recorded?.revocation;
    tracing::warn!(
        removed = revocation.removed_jobs.len(),
        stopped = revocation.stopped_jobs.len(),
        closed = revocation.closed_eps.len(),
        "revoked"
    );
    Ok(revocation)
}
