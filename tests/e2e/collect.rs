//! Collecting a set (fan-in) on the real stack: a function registered with
//! `trigger.collect` (`count=4` over a run's directory) fires once, after the 4th file of the
//! run lands, with the gateway restarted between the 3rd and the 4th; its one job reads all
//! four (the input and the three others as reference inputs) and its lineage names them.
//! `fn test` says which group a file joins and what it still waits for. A group that never
//! completes expires after its timeout: recorded (`group.closed`), never fired.

use htfaas::stack::demo_manifest;
use htfaas_functions::audit::{AuditFilter, AuditKind};
use htfaas_functions::collect::Collect;
use htfaas_functions::proto::{AuditTrail, JobState, LineageRelation, TestRequest};
use htfaas_tests::{events_settled, grant_out, start_stack, upload_checksum, wait_for};
use sha2::Digest as _;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// A successful dCache `transfer` write of `path`, as the storage's billing names it.
fn transfer_write(path: &str) -> serde_json::Value {
    serde_json::json!({
        "version": "1.0", "msgType": "transfer", "isWrite": "write", "isP2p": false,
        "status": {"code": 0, "msg": ""}, "cellName": "pool-a", "cellDomain": "poolDomain",
        "transferPath": path, "pnfsid": "0000BEEF", "session": format!("session-{path}"), "fileSize": 1,
        "subject": [format!("UserNamePrincipal[{}]", htfaas::stack::USER)],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_of_four_files_fires_one_merge_job_after_the_fourth_across_a_gateway_restart() {
    let (_dir, mut stack) = start_stack().await;
    let client = stack.client().expect("client");
    grant_out(&client).await;
    let module = upload_checksum(&client).await;
    let mut m = demo_manifest(module);
    m.name = "merge".into();
    m.trigger.path = "/data/runs/**".into();
    m.outputs.dir = "/data/merged/".into();
    m.args = vec!["--set".into()];
    // Two completion rules at once are refused, naming the field.
    m.trigger.collect = Some(Collect { marker: Some("_COMPLETE".into()), ..count(4) });
    let refused = client.register(&m).await.expect_err("two completion rules");
    assert!(format!("{refused:#}").contains("trigger.collect"), "{refused:#}");
    m.trigger.collect = Some(Collect { key: Some("/data/runs/*/".into()), ..count(4) });
    client.register(&m).await.expect("register");

    let files: Vec<(String, Vec<u8>)> = ["a.dat", "b.dat", "sub/c.dat", "d.dat"]
        .iter()
        .map(|n| (format!("/data/runs/42/{n}"), n.as_bytes().to_vec()))
        .collect();
    for (path, bytes) in &files[..3] {
        client.put_bytes(bytes.clone(), path).await.expect("upload");
    }
    events_settled(&client).await;
    // `fn test` of the 4th: it joins run 42's group of three, and completes it.
    let test = |path: &str| TestRequest {
        subject: None,
        headers: Default::default(),
        event: Some(transfer_write(path)),
        seq: None,
    };
    let report = client.test_function("merge", &test("/data/runs/42/d.dat")).await.expect("fn test");
    let group = report.group.expect("the group it joins");
    assert_eq!(group.key, "/data/runs/42/");
    assert_eq!(group.members, ["/data/runs/42/a.dat", "/data/runs/42/b.dat", "/data/runs/42/sub/c.dat"]);
    assert!(group.completes && group.missing.is_none(), "{group:#?}");
    // A file of another run would open a group of its own, and say what it waits for.
    let other = client.test_function("merge", &test("/data/runs/43/x.dat")).await.expect("fn test");
    let other = other.group.expect("a group");
    assert_eq!((other.members.len(), other.missing.as_deref()), (0, Some("3 more file(s): it holds 1 of 4")));
    // Three files fired nothing.
    assert!(client.jobs().await.expect("jobs").iter().all(|j| j.function != "merge"), "fired before the 4th");

    // The gateway restarts between the 3rd and the 4th: the group's three files are durable.
    stack.restart_gateway().await.expect("restart the gateway");
    let client = stack.client().expect("client");
    let (last, bytes) = &files[3];
    client.put_bytes(bytes.clone(), last).await.expect("upload the 4th");
    // Exactly one job, on the 4th file, completed.
    let jobs = wait_for("the merge job ended", LIMIT, || async {
        let jobs: Vec<_> = client.jobs().await.ok()?.into_iter().filter(|j| j.function == "merge").collect();
        (!jobs.is_empty() && jobs.iter().all(|j| j.state.is_final())).then_some(jobs)
    })
    .await;
    assert_eq!(jobs.len(), 1, "{jobs:#?}");
    assert_eq!((jobs[0].event.path.as_str(), jobs[0].state), (last.as_str(), JobState::Completed), "{jobs:#?}");
    let out = "/data/merged/42.sha256sums";
    let got = client.get_bytes(out).await.expect("get").expect("the merge's list");
    let mut expected: Vec<(String, String)> = files
        .iter()
        .map(|(p, b)| {
            let name = if p == last { "d.dat".to_owned() } else { p.trim_start_matches('/').to_owned() };
            (name, hex::encode(sha2::Sha256::digest(b)))
        })
        .collect();
    expected.sort();
    let text: String = expected.iter().map(|(p, sha)| format!("{sha}  {p}\n")).collect();
    assert_eq!(String::from_utf8(got).expect("UTF-8"), text, "the one job read all four files");

    // The gateway's trail closed the group once, fired, with every member.
    let filter = AuditFilter { function: Some("merge".into()), ..AuditFilter::default() };
    let closed = wait_for("group.closed", LIMIT, || async {
        let records = client.audit_trail(AuditTrail::Gateway, &filter).await.ok()?;
        let closed: Vec<_> = records.into_iter().filter(|r| r.kind == AuditKind::GroupClosed).collect();
        (!closed.is_empty()).then_some(closed)
    })
    .await;
    assert_eq!(closed.len(), 1, "{closed:#?}");
    assert_eq!(
        (closed[0].detail["outcome"].as_str(), closed[0].detail["how"].as_str()),
        (Some("fired"), Some("count"))
    );
    assert_eq!(closed[0].detail["members"].as_array().map(Vec::len), Some(4), "{closed:#?}");
    assert_eq!(client.stats().await.expect("stats").firings_pending, 0, "no firing left over");
    // Lineage names the input and the three others.
    let lineage = client.lineage(out).await.expect("lineage");
    let step = lineage.steps.iter().find(|s| s.relation == LineageRelation::Wrote).expect("the writing job");
    assert_eq!(step.input.as_deref(), Some(last.as_str()));
    let mut refs: Vec<&str> = step.refs.iter().map(|r| r.path.as_str()).collect();
    refs.sort();
    assert_eq!(refs, ["/data/runs/42/a.dat", "/data/runs/42/b.dat", "/data/runs/42/sub/c.dat"], "{step:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_never_completes_expires_recorded_and_unfired() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    grant_out(&client).await;
    let module = upload_checksum(&client).await;
    let mut m = demo_manifest(module);
    m.name = "never".into();
    m.trigger.path = "/data/lone/**".into();
    m.outputs.dir = "/data/never-out/".into();
    m.trigger.collect = Some(Collect { timeout_s: Some(2), ..count(3) });
    client.register(&m).await.expect("register");
    for name in ["a.dat", "b.dat"] {
        client.put_bytes(name.as_bytes().to_vec(), &format!("/data/lone/{name}")).await.expect("upload");
    }
    let filter = AuditFilter { function: Some("never".into()), ..AuditFilter::default() };
    let closed = wait_for("the group's expiry", LIMIT, || async {
        let records = client.audit_trail(AuditTrail::Gateway, &filter).await.ok()?;
        records.into_iter().find(|r| r.kind == AuditKind::GroupClosed)
    })
    .await;
    assert_eq!((closed.detail["outcome"].as_str(), closed.detail["how"].as_str()), (Some("expired"), Some("timeout")));
    assert_eq!(closed.detail["firing"], serde_json::Value::Null, "{closed:#?}");
    assert_eq!(closed.detail["members"].as_array().map(Vec::len), Some(2), "{closed:#?}");
    // Expired, not fired: no job, no firing waiting; the gateway's page counts it.
    assert!(client.jobs().await.expect("jobs").iter().all(|j| j.function != "never"));
    assert_eq!(client.stats().await.expect("stats").firings_pending, 0);
    let page = htfaas_tests::gateway_metrics(stack.info()).await.expect("the gateway's metrics");
    assert_eq!(htfaas_tests::metric(&page, "htfaas_gateway_groups_closed_total", "outcome=\"expired\""), Some(1.0));
    assert_eq!(htfaas_tests::metric(&page, "htfaas_gateway_firings_total", "outcome=\"collected\""), Some(2.0));
}

fn count(n: u32) -> Collect {
    Collect { key: None, count: Some(n), marker: None, quiet_s: None, timeout_s: None }
}
