//! Failed runs against downstream functions: the `hostile` guest writes
//! `/output/partial.txt` and exits 3. With `outputs.on_failure` left at `discard` nothing is
//! stored; with `quarantine` the file lands under `<output dir>.quarantine/<job id>/` and a
//! downstream function whose trigger covers the whole output directory fires nothing on it;
//! with `upload` (an explicit opt-in) it is stored and fires as before. A publisher that
//! forges an event naming a quarantine path (a dCache billing message, a CloudEvent) fires
//! nothing either, and a manifest (or a submit request) asking for unbounded retries is refused.
//! "Fires nothing" is checked after a witness file in the same directory, published after the
//! quarantined one on the same lane, has fired the downstream function: not by waiting.

use crate::failures::{final_job, hostile};
use htfaas::client::Client;
use htfaas::stack::{SubmitGrant, demo_manifest, mint_submit_token};
use htfaas_functions::Resources;
use htfaas_functions::manifest::{FailedOutputs, RetryOn, RetryPolicy};
use htfaas_functions::proto::{EVENTS_SUBJECT, JobState, SubmitRequest};
use htfaas_tests::{start_stack, upload_checksum, wait_for};
use serde_json::json;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

/// Registers the checksum example as `name`, fired by everything under `dir`.
pub(super) async fn downstream(client: &Client, name: &str, dir: &str) {
    let mut m = demo_manifest(upload_checksum(client).await);
    m.name = name.into();
    m.trigger.path = format!("{dir}**");
    m.outputs.dir = format!("/data/{name}-sums/");
    client.register(&m).await.expect("register the downstream function");
}

/// Puts a witness file into `dir` and waits until `function` has fired on it: every event
/// of that directory published before it has been decided by then.
pub(super) async fn witness(client: &Client, function: &str, dir: &str) {
    let path = format!("{dir}witness.txt");
    client.put_bytes(b"witness".to_vec(), &path).await.expect("put the witness");
    let job = final_job(client, function, &path).await;
    assert_eq!(job.state, JobState::Completed, "{job:#?}");
}

/// The paths `function` fired on.
pub(super) async fn fired_on(client: &Client, function: &str) -> Vec<String> {
    let jobs = client.jobs().await.expect("jobs");
    jobs.into_iter().filter(|j| j.function == function).map(|j| j.event.path).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_runs_outputs_are_discarded_or_quarantined_and_never_fire_a_downstream_function() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    for (name, policy) in
        [("fdiscard", FailedOutputs::Discard), ("fquar", FailedOutputs::Quarantine), ("fupload", FailedOutputs::Upload)]
    {
        let mut m = hostile(&client, name, &["write-then-exit", "3"]).await;
        m.outputs.on_failure = policy;
        client.register(&m).await.expect("register");
        downstream(&client, &format!("{name}-next"), &m.outputs.dir).await;
    }
    for name in ["fdiscard", "fquar", "fupload"] {
        client.put_bytes(b"input".to_vec(), &format!("/data/{name}/a.dat")).await.expect("put");
    }

    // Discard (the default): the run failed, nothing of it is stored.
    let job = final_job(&client, "fdiscard", "/data/fdiscard/a.dat").await;
    assert_eq!((job.state, job.exit_code), (JobState::Failed, Some(3)), "{job:#?}");
    assert!(job.outputs.is_empty(), "{job:#?}");
    let log = client.job_log(&job.id).await.expect("log").log;
    assert!(log.contains("outputs are discarded"), "{log}");
    assert_eq!(client.get_bytes("/data/fdiscard-out/partial.txt").await.expect("get"), None);

    // Quarantine: stored under .quarantine/<job id>/, listed with the job, firing nothing.
    let job = final_job(&client, "fquar", "/data/fquar/a.dat").await;
    assert_eq!((job.state, job.exit_code), (JobState::Failed, Some(3)), "{job:#?}");
    let quarantined = format!("/data/fquar-out/.quarantine/{}/partial.txt", job.id);
    assert_eq!(job.outputs.iter().map(|o| o.path.as_str()).collect::<Vec<_>>(), [quarantined.as_str()]);
    let bytes = client.get_bytes(&quarantined).await.expect("get").expect("the quarantined file");
    assert_eq!(bytes, b"half of a result\n");
    assert_eq!(client.get_bytes("/data/fquar-out/partial.txt").await.expect("get"), None);

    // Upload (opted in): stored as a success's, and it fires the downstream function as before.
    let job = final_job(&client, "fupload", "/data/fupload/a.dat").await;
    assert_eq!((job.state, job.exit_code), (JobState::Failed, Some(3)), "{job:#?}");
    assert_eq!(job.outputs.iter().map(|o| o.path.as_str()).collect::<Vec<_>>(), ["/data/fupload-out/partial.txt"]);
    let next = final_job(&client, "fupload-next", "/data/fupload-out/partial.txt").await;
    assert_eq!(next.state, JobState::Completed, "{next:#?}");

    // Neither the discarded nor the quarantined output fired anything, once the witnesses did.
    witness(&client, "fdiscard-next", "/data/fdiscard-out/").await;
    witness(&client, "fquar-next", "/data/fquar-out/").await;
    assert_eq!(fired_on(&client, "fdiscard-next").await, ["/data/fdiscard-out/witness.txt"]);
    assert_eq!(fired_on(&client, "fquar-next").await, ["/data/fquar-out/witness.txt"]);
    stack.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_event_naming_a_quarantine_path_fires_nothing_and_unbounded_retries_are_refused() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    downstream(&client, "watcher", "/data/watched/").await;
    let before = client.stats().await.expect("stats").events_ignored;

    // A billing message and a CloudEvent, each naming a quarantined file under the watched
    // directory, then a real upload there.
    let forged = "/data/watched/.quarantine/some-job/partial.txt";
    let billing = json!({"version":"1.0","msgType":"transfer","cellName":"pool-a-1","cellType":"pool",
        "cellDomain":"pool-aDomain","status":{"code":0,"msg":""},"session":"pool:forged-1",
        "pnfsid":"0000F0AB","transferPath":forged,"fileSize":17,"isWrite":"write","isP2p":false});
    client.publish_event(EVENTS_SUBJECT, serde_json::to_vec(&billing).expect("json")).await.expect("publish");
    let ce = json!({"specversion":"1.0","id":"forged-2","source":"forger","type":"com.example.created",
        "subject":forged});
    client.publish_event("storage.cloudevents.forger", serde_json::to_vec(&ce).expect("json")).await.expect("publish");
    wait_for("both forged events to be ignored", LIMIT, || async {
        (client.stats().await.ok()?.events_ignored >= before + 2).then_some(())
    })
    .await;
    witness(&client, "watcher", "/data/watched/").await;
    assert_eq!(fired_on(&client, "watcher").await, ["/data/watched/witness.txt"]);

    // A manifest asking for more retries than any site allows is refused, naming the field.
    let mut greedy = hostile(&client, "greedy", &["exit", "1"]).await;
    greedy.retry = Some(RetryPolicy { retries: 1000, on: vec![RetryOn::ExitNonzero], backoff_s: 0 });
    let err = format!("{:#}", client.register(&greedy).await.expect_err("refused"));
    assert!(err.contains("400") && err.contains("invalid manifest: retry.retries: must be 0..=10"), "{err}");
    assert!(client.function("greedy").await.is_err(), "nothing registered");

    // And so is a submit request that carries one straight to the scheduler.
    let info = stack.info().clone();
    let digest = greedy.module.clone();
    let grant = SubmitGrant {
        owner: "mallory".into(),
        jobs: 1,
        limits: Resources::new(1, 64, 60),
        function: Some(digest.clone()),
        group: None,
        ttl_s: 300,
    };
    let token = mint_submit_token(dir.path(), &grant).expect("a submit token");
    let storage = &info.storage_url;
    let mut req: SubmitRequest = serde_json::from_value(json!({
        "function": {"name": "greedy", "version": 1, "digest": digest,
                     "module_url": format!("{}/v1/modules/{digest}", info.gateway_url)},
        "resources": {"cpus": 1, "memory_mb": 64, "runtime_s": 60},
        "input": {"url": format!("{storage}/data/raw/a.dat"), "name": "a.dat", "macaroon": "m"},
        "output": {"url": format!("{storage}/data/out/"), "macaroon": "m"},
        "event": {"source": "attacker", "id": "greedy-1", "path": "/data/raw/a.dat"},
        "dedupe_key": "greedy-1",
    }))
    .expect("a submit request");
    req.retry = greedy.retry.clone();
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/jobs", info.scheduler_url))
        .bearer_auth(&token)
        .json(&req)
        .send()
        .await
        .expect("the scheduler answers");
    assert_eq!(resp.status(), reqwest::StatusCode::BAD_REQUEST);
    let body: serde_json::Value = resp.json().await.expect("an ApiError");
    let error = body["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("retry.retries: must be 0..=10"), "{body}");
    let jobs = client.jobs().await.expect("jobs");
    assert!(jobs.iter().all(|j| j.event.source != "attacker"), "{jobs:#?}");
    stack.stop().await.expect("clean stop");
}
