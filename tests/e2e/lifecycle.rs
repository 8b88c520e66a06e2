//! A function's life after registration, on the real stack: versions listed, a
//! rollback that changes what fires (and never a job already made), disable (nothing fires, the
//! events are counted), enable, delete (nothing fires; its versions stay), each change audited
//! with its actor. Another owner may do none of it: `attacks::tenancy`.

use htfaas::client::Client;
use htfaas_functions::audit::{AuditFilter, AuditKind};
use htfaas_functions::proto::{AuditTrail, JobRecord, JobState};
use htfaas_functions::{Digest, FunctionManifest};
use htfaas_tests::{guest_wasm, start_stack, wait_for};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

fn manifest(module: Digest) -> FunctionManifest {
    htfaas::stack::demo_manifest(module)
}

/// Uploads `name` under /data/raw/ and waits for its job to complete.
async fn fire(client: &Client, name: &str) -> JobRecord {
    let path = format!("/data/raw/{name}");
    client.put_bytes(name.as_bytes().to_vec(), &path).await.expect("upload");
    wait_for(&format!("the job of {path}"), LIMIT, || async {
        client
            .jobs()
            .await
            .ok()?
            .into_iter()
            .find(|j| j.function == "checksum" && j.event.path == path && j.state == JobState::Completed)
    })
    .await
}

/// Uploads `name` and waits until its event is done with: the witness function (on the same
/// files) completed its job; then `checksum` made no job of it.
async fn fire_nothing(client: &Client, name: &str) {
    let path = format!("/data/raw/{name}");
    client.put_bytes(name.as_bytes().to_vec(), &path).await.expect("upload");
    wait_for(&format!("the witness's job of {path}"), LIMIT, || async {
        client
            .jobs()
            .await
            .ok()?
            .into_iter()
            .find(|j| j.function == WITNESS && j.event.path == path && j.state == JobState::Completed)
    })
    .await;
    let jobs = client.jobs().await.expect("jobs");
    assert!(jobs.iter().all(|j| j.function != "checksum" || j.event.path != path), "{path} fired: {jobs:#?}");
}

/// Another function of the same owner on the same files: its job tells when an event that
/// fires nothing of `checksum` has been handled.
const WITNESS: &str = "witness";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_disable_enable_and_delete_change_what_fires_and_are_audited() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    // v1 is the checksum module, v2 the no-op module: which one ran is in each job's digest.
    let checksum = client.upload_module(std::fs::read(guest_wasm("checksum")).expect("wasm")).await.expect("up");
    let noop = client.upload_module(std::fs::read(guest_wasm("noop")).expect("wasm")).await.expect("up");
    assert_eq!(client.register(&manifest(checksum.clone())).await.expect("v1").version, 1);
    assert_eq!(client.register(&manifest(noop.clone())).await.expect("v2").version, 2);
    let mut witness = manifest(noop.clone());
    witness.name = WITNESS.into();
    witness.outputs.dir = "/data/witness/".into();
    client.register(&witness).await.expect("the witness");

    let job = fire(&client, "a.dat").await;
    assert_eq!((job.version, &job.digest), (2, &noop));
    let versions = client.function_versions("checksum").await.expect("versions");
    assert_eq!(versions.iter().map(|r| r.version).collect::<Vec<_>>(), [1, 2]);

    // Roll back to v1: the next event runs v1; the job already made stays v2's.
    let status = client.pin_function("checksum", Some(1)).await.expect("rollback");
    assert_eq!((status.record.version, status.latest_version, status.pinned), (1, 2, Some(1)));
    let job = fire(&client, "b.dat").await;
    assert_eq!((job.version, &job.digest), (1, &checksum));
    let jobs = client.jobs().await.expect("jobs");
    let first = jobs.iter().find(|j| j.event.path == "/data/raw/a.dat").expect("a.dat's job");
    assert_eq!(first.digest, noop, "a job keeps the digest it was fired with");
    assert!(client.pin_function("checksum", Some(9)).await.is_err(), "no version 9");

    // Disabled: nothing fires; the event is counted.
    assert!(!client.set_function_enabled("checksum", false).await.expect("disable").enabled);
    fire_nothing(&client, "c.dat").await;
    // Counted once its batch is acked, which may be just after the witness's job ended.
    wait_for("the disabled firing to be counted", LIMIT, || async {
        (client.stats().await.ok()?.firings_disabled == 1).then_some(())
    })
    .await;
    let listed = client.function_statuses().await.expect("list");
    assert!(listed.iter().any(|f| f.record.manifest.name == "checksum" && !f.enabled), "{listed:#?}");

    // Enabled again: fires (still v1, pinned).
    assert!(client.set_function_enabled("checksum", true).await.expect("enable").enabled);
    assert_eq!(fire(&client, "d.dat").await.version, 1);

    // Deleted: nothing fires, it is listed nowhere, its versions stay.
    assert_eq!(client.delete_function("checksum").await.expect("delete").version, 1);
    let listed = client.function_statuses().await.expect("list");
    assert!(listed.iter().all(|f| f.record.manifest.name != "checksum"), "{listed:#?}");
    assert!(client.function("checksum").await.is_err(), "a deleted function is not found");
    fire_nothing(&client, "e.dat").await;
    let admin_versions = client.function_versions("checksum").await.expect("versions stay");
    assert_eq!(admin_versions.len(), 2);

    // Each change in the gateway's trail, with its actor.
    let filter = AuditFilter { function: Some("checksum".into()), ..AuditFilter::default() };
    let records = client.audit_trail(AuditTrail::Gateway, &filter).await.expect("audit");
    let actions: Vec<&str> = records
        .iter()
        .filter(|r| r.kind == AuditKind::AdminAction)
        .filter_map(|r| r.detail["action"].as_str())
        .filter(|a| a.starts_with("function."))
        .collect();
    assert_eq!(
        actions,
        [
            "function.register",
            "function.register",
            "function.pin",
            "function.disable",
            "function.enable",
            "function.delete"
        ],
        "{records:#?}"
    );
    assert!(
        records.iter().filter(|r| r.kind == AuditKind::AdminAction).all(|r| r.actor.as_deref() == Some("admin")),
        "{records:#?}"
    );

    // Registering it again brings it back, as a new version.
    let back = client.register(&manifest(checksum)).await.expect("again");
    assert_eq!(back.version, 3);
    assert_eq!(fire(&client, "f.dat").await.version, 3);
    stack.stop().await.expect("stop");
}
