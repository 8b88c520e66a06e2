//! When a run fails, on the real stack: a function's retry policy runs the `hostile`
//! guest (`exit 3`) again as often as it asks, each attempt in `jobs history` with its outcome
//! and reason, and the job then fails saying how many attempts it had; a function without a
//! policy fails after one attempt. What becomes of a failed run's outputs (discard,
//! quarantine, upload) and that they never fire a function: `attacks::failures`.

use htfaas::client::Client;
use htfaas::stack::demo_manifest;
use htfaas_functions::manifest::{RetryOn, RetryPolicy};
use htfaas_functions::proto::{JobRecord, JobState};
use htfaas_functions::{FunctionManifest, Resources};
use htfaas_tests::{guest_wasm, start_stack, wait_for};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

/// The hostile guest as `name` with `args`, fired by `/data/<name>/**`, writing to
/// `/data/<name>-out/`.
pub async fn hostile(client: &Client, name: &str, args: &[&str]) -> FunctionManifest {
    let module = std::fs::read(guest_wasm("hostile")).expect("read hostile.wasm");
    let mut m = demo_manifest(client.upload_module(module).await.expect("upload hostile"));
    m.name = name.into();
    m.trigger.path = format!("/data/{name}/**");
    m.outputs.dir = format!("/data/{name}-out/");
    m.args = args.iter().map(|a| a.to_string()).collect();
    m.resources = Resources::new(1, 64, 60);
    m
}

/// The job `path` fired of `function`, once it has reached a final state.
pub async fn final_job(client: &Client, function: &str, path: &str) -> JobRecord {
    wait_for(&format!("the {function} job of {path} to end"), LIMIT, || async {
        client.jobs().await.ok()?.into_iter().find(|j| {
            j.function == function
                && j.event.path == path
                && matches!(j.state, JobState::Completed | JobState::Failed | JobState::Removed)
        })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_policy_runs_a_failed_guest_again_and_history_shows_every_attempt() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let mut retried = hostile(&client, "retried", &["exit", "3"]).await;
    retried.retry = Some(RetryPolicy { retries: 2, on: vec![RetryOn::ExitNonzero], backoff_s: 0 });
    client.register(&retried).await.expect("register with a retry policy");
    client.register(&hostile(&client, "once", &["exit", "3"]).await).await.expect("register without one");
    let shown = client.function("retried").await.expect("the function");
    assert_eq!(shown.record.manifest.retry, retried.retry, "the policy is kept with the manifest");

    client.put_bytes(b"input".to_vec(), "/data/retried/a.dat").await.expect("put");
    client.put_bytes(b"input".to_vec(), "/data/once/a.dat").await.expect("put");

    let job = final_job(&client, "retried", "/data/retried/a.dat").await;
    assert_eq!(job.state, JobState::Failed, "{job:#?}");
    assert_eq!((job.attempts, job.exit_code), (3, Some(3)));
    assert_eq!(job.reason, "exited with status 3 (after 3 attempts; its retry policy allows 2 retries)");
    let history = client.job_history(&job.id).await.expect("history");
    let summary: Vec<(u32, &str, &str)> =
        history.iter().map(|a| (a.n, a.outcome.as_str(), a.reason.as_str())).collect();
    assert_eq!(
        summary,
        [
            (1, "failed", "exited with status 3"),
            (2, "failed", "exited with status 3"),
            (3, "failed", "exited with status 3"),
        ],
        "{history:#?}"
    );
    assert!(history.iter().all(|a| a.usage.is_some() && a.ended_at_ms.is_some()), "{history:#?}");

    let job = final_job(&client, "once", "/data/once/a.dat").await;
    assert_eq!((job.state, job.attempts, job.reason.as_str()), (JobState::Failed, 1, "exited with status 3"));
    let history = client.job_history(&job.id).await.expect("history");
    assert_eq!(history.len(), 1, "{history:#?}");
    assert_eq!((history[0].outcome.as_str(), history[0].reason.as_str()), ("failed", "exited with status 3"));

    // Accounting: two failed jobs, each attempt charged.
    let accounts = client.accounting().await.expect("accounts");
    let alice = accounts.iter().find(|a| a.owner == retried.owner).expect("the owner's account");
    assert_eq!((alice.jobs_completed, alice.jobs_failed), (0, 2), "{accounts:#?}");
    stack.stop().await.expect("clean stop");
}
