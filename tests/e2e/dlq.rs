//! The dead-letter list on the real stack: a firing refused (its owner's namespace
//! revoked) and a job that failed land in it with their reasons; a re-drive asked twice at once
//! with one number makes one job, which succeeds once the cause is mended; another number makes
//! another; a drop leaves the list with who and why recorded; re-drives and drops are audited
//! with their actor. Another owner can do none of it: `attacks::dlq`.

use htfaas::client::Client;
use htfaas_functions::audit::{AuditFilter, AuditKind};
use htfaas_functions::manifest::{Outputs, Trigger};
use htfaas_functions::namespace::Right;
use htfaas_functions::proto::{AuditTrail, DeadLetter, DeadLetterKind, JobState};
use htfaas_functions::{FunctionManifest, Resources};
use htfaas_tests::{guest_wasm, start_stack, upload_checksum, wait_for};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// `name` of `owner` on `module`, fired under `/data/<owner>/in/`, writing to `…/out/`.
pub fn manifest(name: &str, owner: &str, module: &htfaas_functions::Digest, args: &[&str]) -> FunctionManifest {
    FunctionManifest {
        name: name.into(),
        owner: owner.into(),
        trigger: Trigger::on_path(format!("/data/{owner}/in/**")),
        outputs: Outputs::into_dir(format!("/data/{owner}/out/")),
        resources: Resources::new(1, 256, 60),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        ..htfaas::stack::demo_manifest(module.clone())
    }
}

/// Grants `owner` read and write under `/data/<owner>/`.
pub async fn grant(client: &Client, owner: &str) {
    for right in [Right::Read, Right::Write] {
        client.grant(owner, right, &format!("/data/{owner}/")).await.expect("grant");
    }
}

/// A refused firing of `carol`'s `csums` on `/data/carol/in/<file>` (her read grant revoked
/// after registration): waits for its dead-letter entry and returns it.
pub async fn refused_entry(client: &Client, file: &str) -> DeadLetter {
    let module = upload_checksum(client).await;
    grant(client, "carol").await;
    client.register(&manifest("csums", "carol", &module, &[])).await.expect("register");
    client.revoke_grant("carol", Right::Read, "/data/carol/").await.expect("revoke");
    let path = format!("/data/carol/in/{file}");
    client.put_bytes(b"refuse me".to_vec(), &path).await.expect("upload");
    wait_for("the refused firing's entry", LIMIT, || async {
        client.dead_letters(None, None, false).await.ok()?.into_iter().find(|e| e.event.path == path)
    })
    .await
}

async fn jobs_on(client: &Client, path: &str) -> Vec<htfaas_functions::proto::JobRecord> {
    client.jobs().await.expect("jobs").into_iter().filter(|j| j.event.path == path).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_firings_and_failed_jobs_are_dead_letters_redriven_once_per_number_and_dropped_with_a_reason() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");

    // A refused firing: kind, owner, function version and reason.
    let refused = refused_entry(&client, "a.dat").await;
    assert_eq!(
        (refused.kind, refused.owner.as_str(), refused.function.as_str()),
        (DeadLetterKind::Refused, "carol", "csums")
    );
    assert_eq!(refused.version, Some(1));
    assert!(refused.reason.contains("outside the read namespace of carol"), "{refused:?}");
    assert!(refused.redrivable && refused.job_id.is_none(), "{refused:?}");

    // A failed job (exit 3): from the scheduler's notification.
    let hostile = client.upload_module(std::fs::read(guest_wasm("hostile")).expect("wasm")).await.expect("upload");
    grant(&client, "dave").await;
    client.register(&manifest("fails", "dave", &hostile, &["exit", "3"])).await.expect("register");
    client.put_bytes(b"fail".to_vec(), "/data/dave/in/f.dat").await.expect("upload");
    let failed = wait_for("the failed job's entry", LIMIT, || async {
        client.dead_letters(Some("fails"), None, false).await.ok()?.into_iter().next()
    })
    .await;
    let job = jobs_on(&client, "/data/dave/in/f.dat").await.pop().expect("the failed job");
    assert_eq!(job.state, JobState::Failed);
    assert_eq!((failed.kind, failed.job_id.as_deref()), (DeadLetterKind::Failed, Some(job.id.as_str())));
    assert!(failed.reason.contains('3'), "{failed:?}");
    assert!(failed.redrivable, "the gateway made its job: {failed:?}");
    // --function filters, --since too.
    let only = client.dead_letters(Some("csums"), None, false).await.expect("list");
    assert_eq!(only.iter().map(|e| e.id).collect::<Vec<_>>(), [refused.id]);
    assert!(client.dead_letters(None, Some("-1s"), false).await.expect("list").len() <= 2);
    assert!(client.dead_letters(None, Some("2100-01-01T00:00:00Z"), false).await.expect("list").is_empty());

    // Mend the cause, then re-drive the refused firing: two calls at once with number 1 make
    // one firing and one job, which completes.
    client.grant("carol", Right::Read, "/data/carol/").await.expect("grant again");
    let (a, b) = tokio::join!(client.redrive(refused.id, Some(1)), client.redrive(refused.id, Some(1)));
    let (a, b) = (a.expect("re-drive"), b.expect("re-drive"));
    assert_eq!(a.redrive.firing, b.redrive.firing);
    assert!(a.created != b.created, "one call made it: {a:?} {b:?}");
    let path = "/data/carol/in/a.dat";
    let done = wait_for("the re-driven job completed", LIMIT, || async {
        jobs_on(&client, path).await.into_iter().find(|j| j.state == JobState::Completed)
    })
    .await;
    let entry = client.dead_letter(refused.id).await.expect("show");
    assert_eq!(entry.redrives.len(), 1);
    assert_eq!((entry.redrives[0].n, entry.redrives[0].job_id.as_deref()), (1, Some(done.id.as_str())));
    assert_eq!(entry.redrives[0].by, "admin");
    // Number 1 again starts nothing; number 3 is out of turn; number 2 makes a second job.
    assert!(!client.redrive(refused.id, Some(1)).await.expect("again").created);
    let e = client.redrive(refused.id, Some(3)).await.expect_err("out of turn").to_string();
    assert!(e.contains("409") && e.contains("the next is 2"), "{e}");
    let second = client.redrive(refused.id, None).await.expect("re-drive 2");
    assert!(second.created && second.redrive.n == 2, "{second:?}");
    wait_for("two jobs on the file", LIMIT, || async {
        let jobs = jobs_on(&client, path).await;
        (jobs.len() == 2 && jobs.iter().all(|j| j.state == JobState::Completed)).then_some(())
    })
    .await;

    // Drop the failed job's entry: it leaves the list, kept with who and why.
    let dropped = client.drop_dead_letter(failed.id, "exit 3 is what it does").await.expect("drop");
    let d = dropped.dropped.expect("dropped");
    assert_eq!((d.by.as_str(), d.reason.as_str()), ("admin", "exit 3 is what it does"));
    let list = client.dead_letters(None, None, false).await.expect("list");
    assert!(list.iter().all(|e| e.id != failed.id), "{list:?}");
    let all = client.dead_letters(None, None, true).await.expect("list with dropped");
    assert!(all.iter().any(|e| e.id == failed.id && e.dropped.is_some()), "{all:?}");
    let e = client.redrive(failed.id, None).await.expect_err("dropped").to_string();
    assert!(e.contains("409") && e.contains("dropped"), "{e}");

    // Each re-drive (not the repeats) and the drop is in the gateway's trail with its actor.
    let mut records = Vec::new();
    for function in ["csums", "fails"] {
        let filter = AuditFilter { function: Some(function.into()), ..Default::default() };
        records.extend(client.audit_trail(AuditTrail::Gateway, &filter).await.expect("trail"));
    }
    let actions: Vec<String> = records
        .iter()
        .filter(|r| r.kind == AuditKind::AdminAction && r.actor.as_deref() == Some("admin"))
        .filter_map(|r| r.detail["action"].as_str().map(str::to_owned))
        .filter(|a| a.starts_with("dlq."))
        .collect();
    assert_eq!(actions, ["dlq.redrive", "dlq.redrive", "dlq.drop"], "{records:#?}");
    stack.stop().await.expect("stop");
}

/// An event whose firing cannot be committed (the firing table locked by another writer: each
/// delivery waits out its busy timeout and is NAKed) until JetStream's `max_deliver` (2 here)
/// gives up on it lands in the dead-letter list from the server's advisory, kind `max_deliver`,
/// with its event and function version; its re-drive, once the table is free, makes the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_past_max_deliver_is_a_dead_letter_and_its_redrive_runs() {
    let (dir, stack) = htfaas_tests::start_stack_with(|o| {
        o.gateway_settings.insert("max_deliver".into(), serde_json::json!(2));
    })
    .await;
    let client = stack.client().expect("client");
    let mut m = htfaas::stack::demo_manifest(upload_checksum(&client).await);
    m.name = "maxd".into();
    client.register(&m).await.expect("register");
    let path = "/data/raw/undeliverable.dat";

    // Another writer holds the firing table: every commit of the event's firing times out.
    let mut lock = rusqlite::Connection::open(dir.path().join("gateway/firings.sqlite")).expect("open the table");
    let held = lock.transaction_with_behavior(rusqlite::TransactionBehavior::Exclusive).expect("lock");
    client.put_bytes(b"late".to_vec(), path).await.expect("put");
    let gave_up = wait_for("JetStream to give up on the event", LIMIT, || async {
        let s = client.stats().await.ok()?;
        (s.transient_failures >= 2).then_some(s.transient_failures)
    })
    .await;
    assert!(gave_up >= 2, "both deliveries failed to commit");
    held.rollback().expect("release");

    let entry = wait_for("the event's dead-letter entry", LIMIT, || async {
        let list = client.dead_letters(Some("maxd"), None, false).await.ok()?;
        list.into_iter().find(|e| e.kind == DeadLetterKind::MaxDeliver && e.event.path == path)
    })
    .await;
    assert!(
        entry.reason.contains("JetStream gave up delivering it") && entry.reason.contains("(max_deliver)"),
        "{entry:#?}"
    );
    assert_eq!((entry.version, entry.redrivable, entry.job_id.as_deref()), (Some(1), true, None), "{entry:#?}");
    assert!(client.jobs().await.expect("jobs").iter().all(|j| j.event.path != path), "no job before the re-drive");
    let done = client.redrive(entry.id, Some(1)).await.expect("re-drive");
    assert!(done.created);
    let job = wait_for("the re-driven job", LIMIT, || async {
        let jobs = client.jobs().await.ok()?;
        jobs.into_iter().find(|j| j.event.path == path && j.state == JobState::Completed)
    })
    .await;
    assert_eq!(job.function, "maxd");
    assert!(client.get_bytes("/data/checksums/undeliverable.dat.checksums.json").await.expect("get").is_some());
    stack.stop().await.expect("stop");
}
