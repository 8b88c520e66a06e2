//! Credentials that last as long as the job. On the real stack with macaroons valid
//! a few seconds: a job that waited in the queue past its first macaroons still runs (its EP
//! renews them, its reference file's with them, before its input fetch), and a job that runs across several validities still
//! writes its output (its EP renews them while it runs). Each renewal is in both trails.
//! The refusals (a job not running on the asking EP, a revoked job) are in the attack suite
//! (`attacks::renewals`).

use htfaas::stack::demo_manifest;
use htfaas_functions::audit::{AuditFilter, AuditKind, AuditRecord};
use htfaas_functions::proto::{AuditTrail, EpAction, JobRecord, JobState};
use htfaas_functions::{Resources, time::now_s};
use htfaas_tests::{guest_wasm, start_stack_with, upload_checksum, wait_for};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(90);
/// The stack's macaroons in these tests: valid this many seconds.
pub(crate) const VALIDITY_S: u64 = 3;
/// How long past a `before:` the built-in storage still takes a macaroon (its clock skew).
const STORAGE_SKEW_S: u64 = htfaas_functions::token::LEEWAY_S;

pub(crate) fn short_validity(o: &mut htfaas::stack::StackOptions) {
    let v = format!("PT{VALIDITY_S}S");
    o.macaroon_validity = (v.clone(), v);
}

/// The `macaroons.renewal` records of `job` in `trail` that renewed (not refused).
async fn renewals(client: &htfaas::client::Client, trail: AuditTrail, job: &str) -> Vec<AuditRecord> {
    let filter = AuditFilter { job: Some(job.to_owned()), ..AuditFilter::default() };
    let records = client.audit_trail(trail, &filter).await.expect("audit");
    records.into_iter().filter(|r| r.kind == AuditKind::MacaroonsRenewal && r.detail["refused"].is_null()).collect()
}

async fn final_job(client: &htfaas::client::Client, what: &str) -> JobRecord {
    wait_for(what, LIMIT, || async {
        let jobs = client.jobs().await.ok()?;
        jobs.into_iter().find(|j| matches!(j.state, JobState::Completed | JobState::Failed | JobState::Removed))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_waited_in_the_queue_past_its_macaroons_runs() {
    let (_dir, stack) = start_stack_with(short_validity).await;
    let client = stack.client().expect("client");
    // It reads a reference file too, whose macaroon expires with the others.
    client.put_bytes(b"constants".to_vec(), "/data/ref/constants.txt").await.expect("put the reference");
    let mut m = demo_manifest(upload_checksum(&client).await);
    m.inputs.refs = vec!["/data/ref/constants.txt".into()];
    client.register(&m).await.expect("register");
    // No EP takes work: the job waits in the queue.
    let off = EpAction { reason: "hold the queue".into(), deadline_s: None, group: None };
    client.ep_action("ep-local-1", "disable", &off).await.expect("disable the EP");
    client.put_bytes(b"waited a while".to_vec(), "/data/raw/waited.dat").await.expect("put");
    let job = wait_for("the job, idle", LIMIT, || async {
        client.jobs().await.ok()?.into_iter().find(|j| j.state == JobState::Idle)
    })
    .await;
    // Past its first macaroons' validity, and the storage's skew: they no longer work.
    let expired_at = job.submitted_at_ms / 1000 + VALIDITY_S + STORAGE_SKEW_S + 1;
    wait_for("the job's first macaroons to expire", LIMIT, || async { (now_s() > expired_at).then_some(()) }).await;
    client.ep_action("ep-local-1", "enable", &off).await.expect("enable the EP");

    let done = final_job(&client, "the job to end").await;
    assert_eq!(done.state, JobState::Completed, "{done:#?}");
    assert_eq!(done.outputs.len(), 1, "{done:#?}");
    assert!(client.get_bytes(&done.outputs[0].path).await.expect("get").is_some(), "the output is stored");
    // Renewed once at least, through the scheduler (asked by the EP) and the gateway.
    let at_scheduler = renewals(&client, AuditTrail::Scheduler, &done.id).await;
    assert!(!at_scheduler.is_empty(), "no renewal at the scheduler");
    assert!(at_scheduler.iter().all(|r| r.actor.as_deref() == Some("ep-local-1")), "{at_scheduler:#?}");
    let at_gateway = renewals(&client, AuditTrail::Gateway, &done.id).await;
    assert!(!at_gateway.is_empty(), "no renewal at the gateway");
    assert!(at_gateway.iter().all(|r| r.actor.as_deref() == Some("scheduler")), "{at_gateway:#?}");
    // The same file and directory: the read macaroon is the directory's base narrowed to the
    // file (dCache chains the two `path:` caveats), the write one the directory's.
    let caveats = at_gateway[0].detail["macaroons"].to_string();
    assert!(caveats.contains(r#""path:/data/raw/","path:/waited.dat""#), "{caveats}");
    assert!(caveats.contains(r#""path:/data/ref/","path:/constants.txt""#), "the reference file's: {caveats}");
    assert!(caveats.contains("path:/data/checksums/"), "{caveats}");
    stack.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_running_across_several_validities_writes_its_output() {
    let (_dir, stack) = start_stack_with(short_validity).await;
    let client = stack.client().expect("client");
    let hostile = client.upload_module(std::fs::read(guest_wasm("hostile")).expect("hostile.wasm")).await;
    let mut sleeper = demo_manifest(hostile.expect("upload hostile"));
    sleeper.name = "sleeper".into();
    sleeper.trigger.path = "/data/long/**".into();
    sleeper.outputs.dir = "/data/long-out/".into();
    // Sleeps past three validities and the storage's skew, then its output is uploaded.
    let sleep_s = 3 * VALIDITY_S + STORAGE_SKEW_S + 2;
    sleeper.args = vec!["sleep".into(), sleep_s.to_string()];
    sleeper.resources = Resources::new(1, 64, 120);
    client.register(&sleeper).await.expect("register");
    client.put_bytes(b"a long one".to_vec(), "/data/long/in.dat").await.expect("put");

    let done = final_job(&client, "the long job to end").await;
    assert_eq!(done.state, JobState::Completed, "{done:#?}");
    let paths: Vec<&str> = done.outputs.iter().map(|o| o.path.as_str()).collect();
    assert_eq!(paths, ["/data/long-out/sleeping"], "{done:#?}");
    assert!(client.get_bytes("/data/long-out/sleeping").await.expect("get").is_some(), "the output is stored");
    let at_scheduler = renewals(&client, AuditTrail::Scheduler, &done.id).await;
    assert!(at_scheduler.len() >= 2, "renewed {} times: {at_scheduler:#?}", at_scheduler.len());
    let at_gateway = renewals(&client, AuditTrail::Gateway, &done.id).await;
    assert_eq!(at_gateway.len(), at_scheduler.len(), "each renewal at both");
    stack.stop().await.expect("clean stop");
}
