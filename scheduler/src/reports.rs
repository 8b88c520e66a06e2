//! An EP's reports recorded in the store, for its session ([`crate::ep_link`]): a frame's
//! `Finished` reports in one write ([`finished_many`]), a job handed back unstarted
//! ([`not_started`]); what follows each (its resources released on its EP, the dispatcher
//! woken, an ended job's spans exported). A write the store cannot take for now (a full disk,
//! a batch not committed) is tried again until it passes or the scheduler stops
//! ([`until_stored`]): a report counts only on the session its job was assigned to, so the EP
//! could not usefully send it again later.
//!
//! Must not know: the WebSocket (`axum`), the attach protocol's frames.

use crate::error::QueueError;
use crate::metrics::Metrics;
use crate::queue::{Finished, HandedBack};
use crate::state::Shared;
use htfaas_functions::proto::JobReport;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// First wait before a write the store could not take for now (a full disk) is tried again.
pub const STORE_RETRY_FIRST: Duration = Duration::from_millis(200);
/// Longest wait between two tries of such a write.
pub const STORE_RETRY_CAP: Duration = Duration::from_secs(5);

/// Takes a job the EP handed back unstarted: with `free`, back to idle at once
/// ([`crate::queue::Queue::hand_back`]); otherwise, or when it is no longer running (held or
/// removed meanwhile), as a `Cancelled` report the scheduler did not ask for ([`finished`]).
#[tracing::instrument(name = "scheduler.not_started", skip_all, fields(job.id = %job_id, free))]
pub(crate) async fn not_started(shared: Arc<Shared>, ep_id: String, job_id: String, reason: String, free: bool) {
    if !shared.eps().is_running(&ep_id, &job_id) {
        shared.metrics.ignored_report();
        tracing::warn!("ignoring a hand-back of a job not assigned to this EP");
        return;
    }
    let reason: String = reason.chars().take(1024).collect();
    if free {
        let handed = until_stored(&shared.shutdown, &shared.metrics, "requeue a job handed back", || {
            shared.queue.hand_back(ep_id.clone(), job_id.clone(), reason.clone())
        });
        match handed.await {
            Ok(HandedBack::Requeued) => {
                tracing::info!(%reason, "handed back unstarted; idle again");
                shared.eps().release(&ep_id, &job_id);
                shared.wake.notify_one();
                return;
            }
            Ok(HandedBack::NotRunning) => {}
            Err(e) => {
                tracing::error!("failed to requeue a job handed back: {e}");
                return;
            }
        }
    }
    finished(shared, ep_id, JobReport::unstarted(job_id, reason)).await;
}

/// Records a finished job, frees its resources and wakes the dispatcher.
///
/// A report the store cannot take for now (its disk is full, or its batch was not committed)
/// is kept and tried again ([`until_stored`]) until it is recorded or the scheduler shuts down:
/// a report counts only on the session its job was assigned to, so the EP could not usefully
/// send it again later. Meanwhile its job stays running here and keeps its resources.
#[tracing::instrument(name = "scheduler.finish", skip_all,
    fields(job.id = %report.job_id, outcome = ?report.outcome, state = tracing::field::Empty))]
async fn finished(shared: Arc<Shared>, ep_id: String, report: JobReport) {
    let job_id = report.job_id.clone();
    if !shared.eps().is_running(&ep_id, &job_id) {
        shared.metrics.ignored_report();
        tracing::warn!("ignoring a report for a job not running on this EP");
        return;
    }
    let recorded = until_stored(&shared.shutdown, &shared.metrics, "record a finished job", || {
        shared.queue.finish(ep_id.clone(), report.clone(), shared.policy.loss())
    });
    if settle(&shared, &ep_id, &job_id, recorded.await.as_ref().map(Option::as_ref)) {
        shared.wake.notify_one();
    }
}

/// Records the reports of one frame from the EP in one write ([`crate::queue::Queue::finish_many`]),
/// each as [`finished`] records one; those for jobs not running on this EP are ignored.
#[tracing::instrument(name = "scheduler.finish_many", skip_all, fields(reports = reports.len()))]
pub(crate) async fn finished_many(shared: Arc<Shared>, ep_id: String, mut reports: Vec<JobReport>) {
    if reports.len() == 1
        && let Some(report) = reports.pop()
    {
        return finished(shared, ep_id, report).await;
    }
    reports.retain(|r| {
        let running = shared.eps().is_running(&ep_id, &r.job_id);
        if !running {
            shared.metrics.ignored_report();
            tracing::warn!(job.id = %r.job_id, "ignoring a report for a job not running on this EP");
        }
        running
    });
    if reports.is_empty() {
        return;
    }
    let recorded = until_stored(&shared.shutdown, &shared.metrics, "record finished jobs", || {
        shared.queue.finish_many(ep_id.clone(), reports.clone(), shared.policy.loss())
    });
    let mut released = false;
    match recorded.await {
        Ok(results) => {
            for (report, result) in reports.iter().zip(&results) {
                released |= settle(&shared, &ep_id, &report.job_id, Ok(result.as_ref()));
            }
        }
        Err(e) => {
            for report in &reports {
                released |= settle(&shared, &ep_id, &report.job_id, Err(&e));
            }
        }
    }
    if released {
        shared.wake.notify_one();
    }
}

/// What follows the write of `job_id`'s report: the log line, the OTLP export of a job that
/// ended, and the release of its resources on this EP. Whether it was released: not when the
/// store did not have the job running on this EP (a stale report, or one already recorded),
/// whose reservation, if the table holds one now, is the dispatcher's new assignment of the
/// job to this EP, which stays (releasing it left that attempt's own report ignored and the
/// job running until its run time).
fn settle(shared: &Shared, ep_id: &str, job_id: &str, recorded: Result<Option<&Finished>, &QueueError>) -> bool {
    match recorded {
        Ok(Some(f)) => {
            tracing::Span::current().record("state", f.state.as_str());
            tracing::info!(job.id = %job_id, owner = %f.owner, "job finished");
            if let Some(otlp) = &shared.otlp
                && matches!(
                    f.state,
                    htfaas_functions::proto::JobState::Completed | htfaas_functions::proto::JobState::Failed
                )
            {
                otlp.job_ended(shared.queue.clone(), job_id.to_owned());
            }
        }
        Ok(None) => {
            shared.metrics.ignored_report();
            tracing::warn!(job.id = %job_id, "ignoring a report for a job the store does not have running on this EP");
            return false;
        }
        Err(e) => tracing::error!(job.id = %job_id, "failed to record a finished job: {e}"),
    }
    shared.eps().release(ep_id, job_id);
    true
}

/// Runs the store write `write` to its answer, trying it again while the store cannot take it
/// for now ([`QueueError::DiskFull`], or [`QueueError::Batch`]: its batch was not committed),
/// after [`STORE_RETRY_FIRST`] doubling to [`STORE_RETRY_CAP`], until the scheduler shuts down
/// (then the last error is returned: a restart puts the jobs left running back to idle).
pub(crate) async fn until_stored<T, F, Fut>(
    shutdown: &CancellationToken,
    metrics: &Metrics,
    what: &str,
    mut write: F,
) -> Result<T, QueueError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, QueueError>>,
{
    let mut wait = STORE_RETRY_FIRST;
    loop {
        match write().await {
            Err(e @ (QueueError::DiskFull(_) | QueueError::Batch(_))) if !shutdown.is_cancelled() => {
                tracing::error!(retry_in_ms = wait.as_millis(), "failed to {what}, trying again: {e}");
                metrics.store_retry();
                tokio::select! {
                    _ = shutdown.cancelled() => return Err(e),
                    _ = tokio::time::sleep(wait) => {}
                }
                wait = (wait * 2).min(STORE_RETRY_CAP);
            }
            answer => return answer,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[tokio::test(start_paused = true)]
    async fn a_write_the_full_store_refused_is_tried_again_until_it_passes_or_the_scheduler_stops() {
        // On tokio's paused clock: the backoff's sleeps pass at once, and are measured on it.
        let (shutdown, metrics) = (CancellationToken::new(), Metrics::new());
        let tries = std::sync::atomic::AtomicU32::new(0);
        let started = tokio::time::Instant::now();
        let answer = until_stored(&shutdown, &metrics, "test", || async {
            match tries.fetch_add(1, Ordering::Relaxed) {
                0 => Err(QueueError::DiskFull("full".into())),
                1 => Err(QueueError::Batch("a neighbour filled the disk".into())),
                n => Ok(n),
            }
        });
        assert_eq!(answer.await.expect("stored at last"), 2);
        assert_eq!(started.elapsed(), STORE_RETRY_FIRST * 3, "two waits, 200 + 400 ms");
        assert_eq!(metrics.store_retries(), 2, "each kept write counted");
        // Other errors are answered at once, and a shutdown stops the tries.
        let other = until_stored(&shutdown, &metrics, "test", || async { Err::<(), _>(QueueError::Poisoned) });
        assert!(matches!(other.await, Err(QueueError::Poisoned)));
        shutdown.cancel();
        let full =
            until_stored(&shutdown, &metrics, "test", || async { Err::<(), _>(QueueError::DiskFull("full".into())) });
        assert!(matches!(full.await, Err(QueueError::DiskFull(_))));
    }
}
