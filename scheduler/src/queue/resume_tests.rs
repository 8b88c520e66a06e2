//! Resuming from checkpoints ([`super::resume`]): a guest that stored a new checkpoint runs
//! again at once with no retry used and every attempt charged; one that stored nothing new is a
//! non-zero exit its retry policy bounds.

use super::*;
use crate::testing::{LOSS, new_job, ok};
use htfaas_functions::checkpoint::{CheckpointReport, SavedCheckpoint};
use htfaas_functions::manifest::{RetryOn, RetryPolicy};
use htfaas_functions::proto::{JobReport, JobState, Outcome, Usage};

fn checkpointed(id: &str, restored: Option<&str>, saved: &str) -> JobReport {
    JobReport {
        job_id: id.into(),
        outcome: Outcome::Checkpointed { exit_code: 85 },
        usage: Usage { wall_ms: 1000, ..Usage::default() },
        outputs: vec![],
        log: "counting\n".into(),
        input_sha256: None,
        refs: Vec::new(),
        checkpoint: Some(CheckpointReport {
            restored: restored.map(Into::into),
            saved: Some(SavedCheckpoint { sha256: saved.into(), bytes: 10 }),
            not_saved: None,
        }),
    }
}

async fn run(q: &Queue, id: &str, n: u32, report: JobReport) -> JobState {
    let session = format!("s-{id}-{n}");
    q.mark_running(vec![id.to_owned()], format!("ep-{n}"), session.clone(), ok).await.expect("mark");
    q.finish(session, report, LOSS).await.expect("finish").expect("was running").state
}

#[tokio::test]
async fn a_checkpoint_with_progress_runs_again_at_once_and_every_attempt_is_charged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = Queue::open(&dir.path().join("q.db")).expect("open");
    let id = q.submit(new_job("k1", "k1", 1)).await.expect("submit").job_id;

    assert_eq!(run(&q, &id, 1, checkpointed(&id, None, "aa")).await, JobState::Idle);
    let (lost, not_before) = q.retry_state(id.clone()).await.expect("retry state");
    assert_eq!(lost, 0, "no loss");
    assert!(not_before <= htfaas_functions::time::now_ms(), "no backoff: runnable from {not_before}");
    assert_eq!(run(&q, &id, 2, checkpointed(&id, Some("aa"), "bb")).await, JobState::Idle);
    let done = JobReport { outcome: Outcome::Exited { exit_code: 0 }, ..checkpointed(&id, Some("bb"), "bb") };
    assert_eq!(run(&q, &id, 3, done).await, JobState::Completed);

    let history = q.history(id.clone()).await.expect("history");
    let outcomes: Vec<&str> = history.iter().map(|a| a.outcome.as_str()).collect();
    assert_eq!(outcomes, ["checkpointed", "checkpointed", "completed"]);
    assert!(history.iter().all(|a| a.usage.is_some()), "{history:?}");
    let accounts = q.accounts().await.expect("accounts");
    assert_eq!((accounts[0].jobs_completed, accounts[0].jobs_failed), (1, 0), "counted once");
    assert!((accounts[0].core_seconds - 3.0).abs() < 1e-9, "every attempt charged: {accounts:?}");
}

#[tokio::test]
async fn a_checkpoint_exit_without_progress_is_a_failed_exit_its_retries_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = Queue::open(&dir.path().join("q.db")).expect("open");
    // Without a retry policy: it fails at once, saying why.
    let id = q.submit(new_job("k1", "k1", 1)).await.expect("submit").job_id;
    assert_eq!(run(&q, &id, 1, checkpointed(&id, None, "aa")).await, JobState::Idle, "the first is progress");
    assert_eq!(run(&q, &id, 2, checkpointed(&id, Some("aa"), "aa")).await, JobState::Failed);
    let job = q.get(id.clone()).await.expect("get").expect("kept");
    assert_eq!(job.reason, "exited with status 85 (exited with its checkpoint code without storing a new checkpoint)");
    assert_eq!(job.exit_code, Some(85));

    // With one that retries non-zero exits: each attempt without progress uses a retry.
    let mut job = new_job("k2", "k2", 1);
    job.request.retry = Some(RetryPolicy { retries: 1, on: vec![RetryOn::ExitNonzero], backoff_s: 0 });
    let id = q.submit(job).await.expect("submit").job_id;
    assert_eq!(run(&q, &id, 1, checkpointed(&id, None, "aa")).await, JobState::Idle);
    assert_eq!(run(&q, &id, 2, checkpointed(&id, Some("aa"), "aa")).await, JobState::Idle, "one retry");
    assert_eq!(run(&q, &id, 3, checkpointed(&id, Some("aa"), "aa")).await, JobState::Failed);
    let outcomes: Vec<String> = q.history(id).await.expect("history").into_iter().map(|a| a.outcome).collect();
    assert_eq!(outcomes, ["checkpointed", "failed", "failed"]);
}

/// A job its EP stopped on its own while leaving (a drain past its deadline, the EP's end),
/// vacated with a new checkpoint stored, runs again at once without a loss counted; stopped
/// without a new checkpoint it is a return, a lost attempt after the backoff, as before.
#[tokio::test]
async fn a_vacate_that_stored_a_new_checkpoint_resumes_at_once_and_one_without_is_a_loss() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = Queue::open(&dir.path().join("q.db")).expect("open");
    let id = q.submit(new_job("k1", "k1", 1)).await.expect("submit").job_id;
    let vacated = |restored: Option<&str>, saved: &str| JobReport {
        outcome: Outcome::Cancelled { reason: "EP stopping".into() },
        ..checkpointed(&id, restored, saved)
    };
    assert_eq!(run(&q, &id, 1, vacated(None, "aa")).await, JobState::Idle);
    assert_eq!(q.retry_state(id.clone()).await.expect("retry state").0, 0, "no loss");
    assert_eq!(run(&q, &id, 2, vacated(Some("aa"), "aa")).await, JobState::Idle, "a return");
    assert_eq!(q.retry_state(id.clone()).await.expect("retry state").0, 1, "a loss");
    let history = q.history(id.clone()).await.expect("history");
    let outcomes: Vec<&str> = history.iter().map(|a| a.outcome.as_str()).collect();
    assert_eq!(outcomes, ["vacated", "returned"]);
    assert!(history[0].usage.is_some(), "the vacated attempt is charged: {history:?}");
}
