//! Job-end notifications on the real stack: a subscriber of `htfaas.jobs.<owner>.>`
//! receives the end of a job fired by an upload, with its output's checksum, after the job's
//! end is committed; a job that ends while NATS is down is told once NATS is back (the
//! scheduler's outbox kept it).

use futures_util::StreamExt as _;
use htfaas_functions::manifest::{Outputs, Trigger};
use htfaas_functions::proto::{JOBS_STREAM, JobNotification, JobState, MSG_ID_HEADER};
use htfaas_functions::{FunctionManifest, Resources};
use htfaas_tests::{guest_wasm, start_stack, upload_checksum, wait_for};
use sha2::Digest as _;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_receives_each_job_end_with_its_outputs_checksums() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let nc = stack.nats_client().await.expect("operator");
    let mut sub = nc.subscribe("htfaas.jobs.alice.>").await.expect("subscribe");
    nc.flush().await.expect("flush");
    let digest = upload_checksum(&client).await;
    client.register(&htfaas::stack::demo_manifest(digest.clone())).await.expect("register");
    client.put_bytes(b"notify me".to_vec(), "/data/raw/n.dat").await.expect("upload");

    let message = tokio::time::timeout(LIMIT, sub.next()).await.expect("a notification in time").expect("one");
    assert_eq!(message.subject.as_str(), "htfaas.jobs.alice.checksum.completed");
    let n: JobNotification = serde_json::from_slice(&message.payload).expect("a JobNotification");
    assert_eq!((n.owner.as_str(), n.function.as_str(), n.state), ("alice", "checksum", JobState::Completed));
    assert_eq!((n.version, n.digest.as_ref()), (1, Some(&digest)));
    assert_eq!(n.event.path, "/data/raw/n.dat");
    assert_eq!(n.attempts, 1);
    assert!(n.usage.is_some_and(|u| u.bytes_in == 9), "{n:?}");
    let id = message.headers.as_ref().and_then(|h| h.get(MSG_ID_HEADER)).map(|v| v.as_str().to_owned());
    assert_eq!(id, Some(n.msg_id()));
    // Told after the commit: the job is completed when asked, and the output's checksum is
    // the sha256 of the bytes the storage holds.
    let job = client.jobs().await.expect("jobs").into_iter().find(|j| j.id == n.job_id).expect("the job");
    assert_eq!(job.state, JobState::Completed);
    assert_eq!(n.outputs.len(), 1, "{n:?}");
    let bytes = client.get_bytes(&n.outputs[0].path).await.expect("get").expect("the output");
    assert_eq!(n.outputs[0].sha256, hex::encode(sha2::Sha256::digest(&bytes)));
    assert_eq!(n.outputs[0].size, bytes.len() as u64);
    assert_eq!(job.outputs, n.outputs);
    stack.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_ends_while_nats_is_down_is_told_once_nats_is_back() {
    let (_dir, mut stack) = start_stack().await;
    let client = stack.client().expect("client");
    let module = client.upload_module(std::fs::read(guest_wasm("hostile")).expect("wasm")).await.expect("upload");
    let manifest = FunctionManifest {
        // Runs until its run time (3 s) is up, and writes nothing: an upload would wait for
        // NATS (the storage publishes its billing message first).
        args: vec!["spin".into()],
        trigger: Trigger::on_path("/data/slow/**"),
        outputs: Outputs::into_dir("/data/slow-out/"),
        resources: Resources::new(1, 256, 3),
        name: "slow".into(),
        ..htfaas::stack::demo_manifest(module)
    };
    client.register(&manifest).await.expect("register");
    client.put_bytes(b"x".to_vec(), "/data/slow/a.dat").await.expect("upload");
    let job = wait_for("the job running", LIMIT, || async {
        client.jobs().await.ok()?.into_iter().find(|j| j.function == "slow" && j.state == JobState::Running)
    })
    .await;
    let killed_ms = htfaas_functions::time::now_ms();
    // NATS down until the job has ended: nobody can be told meanwhile.
    stack.kill_nats();
    let ended = wait_for("the job's end with NATS down", LIMIT, || async {
        client.jobs().await.ok()?.into_iter().find(|j| j.id == job.id && j.finished_at_ms.is_some())
    })
    .await;
    assert_eq!(ended.state, JobState::Failed, "{ended:?}");
    assert!(ended.finished_at_ms.is_some_and(|t| t > killed_ms), "{ended:?}");
    // The job's end and its notification were stored together while NATS was down; NATS comes
    // back now, and the notification must follow.
    let back_ms = htfaas_functions::time::now_ms();
    stack.restart_nats().expect("restart NATS");

    // The stream has it (read as the operator, by subject), published after NATS came back.
    let js = async_nats::jetstream::new(stack.nats_client().await.expect("operator"));
    let told = wait_for("the notification in the stream", LIMIT, || async {
        let stream = js.get_stream(JOBS_STREAM).await.ok()?;
        let m = stream.get_last_raw_message_by_subject("htfaas.jobs.alice.slow.failed").await.ok()?;
        let n: JobNotification = serde_json::from_slice(&m.payload).ok()?;
        Some((n, m.time))
    })
    .await;
    assert_eq!(told.0.job_id, job.id);
    assert!(told.1.unix_timestamp() as u64 * 1000 + 1000 >= back_ms, "stored at {:?}, NATS back at {back_ms}", told.1);
    stack.stop().await.expect("stop");
}
