//! Tenancy: no owner reaches another's files. Developers are confined to their namespace at
//! registration, bearers at a manual run, every firing again when it becomes a job, and a job's
//! write macaroon creates files only.

use super::{api_token, post, submit_token};
use htfaas_functions::manifest::{Outputs, Trigger};
use htfaas_functions::namespace::Right;
use htfaas_functions::proto::{JobState, TestRequest};
use htfaas_functions::token::Scope;
use htfaas_functions::{FunctionManifest, Resources};
use htfaas_tests::{start_stack, upload_checksum, wait_for};
use serde_json::{Value, json};
use std::time::Duration;

fn manifest(
    name: &str,
    owner: &str,
    module: &htfaas_functions::Digest,
    trigger: Trigger,
    out: &str,
) -> FunctionManifest {
    FunctionManifest {
        runtime: Default::default(),
        command: Vec::new(),
        handler: false,
        retry: None,
        name: name.into(),
        owner: owner.into(),
        module: module.clone(),
        trigger,
        resources: Resources::new(1, 256, 60),
        outputs: Outputs::into_dir(out),
        args: vec![],
        env: vec![],
        annex: None,
        class: None,
        limits: Default::default(),
        group: None,
        secrets: Default::default(),
        webhook: None,
        max_concurrent: None,
        inputs: Default::default(),
        vacate_s: None,
        checkpoint: None,
    }
}

const LIMIT: Duration = Duration::from_secs(60);

fn seq_request(seq: u64) -> TestRequest {
    TestRequest { subject: None, headers: Default::default(), event: None, seq: Some(seq) }
}

fn error(body: &Value) -> &str {
    body["error"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_developer_cannot_register_outside_its_namespace_nor_fire_on_anothers_file() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let gw = stack.info().gateway_url.clone();
    let module = upload_checksum(&client).await;
    let mallory = api_token(dir.path(), "mallory", Scope::Developer);

    // A cross-owner registration: mallory's function on every file, writing into alice's directory.
    let spy = manifest("spy", "mallory", &module, Trigger::on_path("/data/**"), "/data/raw/");
    let (status, body) = post(&gw, "/v1/functions", &mallory, &json!(spy)).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        error(&body),
        "function spy: the trigger /data/** could fire on paths under \"/data/\", outside mallory's read namespace \
         (nothing)"
    );
    // A dry run is a registration that stores nothing: refused the same, so it lists no event.
    let (status, body) = post(&gw, "/v1/functions?dry_run=true", &mallory, &json!(spy)).await;
    assert_eq!(status, 403, "{body}");

    // An admin grants mallory a directory of its own; a rule that could fire anywhere, or the
    // output in another's directory, is still refused, each with its reason.
    for right in [Right::Read, Right::Write] {
        client.grant("mallory", right, "/data/mallory/").await.expect("grant");
    }
    let by_rule = manifest(
        "spy",
        "mallory",
        &module,
        Trigger::on_rule(r#"size > 0 or path prefix "/data/mallory/""#),
        "/data/mallory/out/",
    );
    let (status, body) = post(&gw, "/v1/functions", &mallory, &json!(by_rule)).await;
    assert_eq!(status, 403, "{body}");
    assert!(error(&body).contains("could fire on any path"), "{body}");
    let foreign_out = manifest("spy", "mallory", &module, Trigger::on_path("/data/mallory/**"), "/data/raw/");
    let (status, body) = post(&gw, "/v1/functions", &mallory, &json!(foreign_out)).await;
    assert_eq!(status, 403, "{body}");
    assert!(error(&body).contains("the output directory /data/raw/ is outside mallory's write namespace"), "{body}");
    let replacing = FunctionManifest {
        outputs: Outputs { replace: true, ..Outputs::into_dir("/data/mallory/out/") },
        ..manifest("spy", "mallory", &module, Trigger::on_path("/data/mallory/**"), "/data/mallory/out/")
    };
    let (status, body) = post(&gw, "/v1/functions", &mallory, &json!(replacing)).await;
    assert_eq!(status, 403, "{body}");
    assert!(error(&body).contains("may not replace files in /data/mallory/out/"), "{body}");
    let own = manifest("spy", "mallory", &module, Trigger::on_path("/data/mallory/**"), "/data/mallory/out/");
    let (status, body) = post(&gw, "/v1/functions", &mallory, &json!(own)).await;
    assert_eq!(status, 201, "inside its own namespace: {body}");

    // alice's upload fires alice's function, never mallory's.
    let sums = manifest("sums", "alice", &module, Trigger::on_path("/data/alice/**"), "/data/alice-sums/");
    client.register(&sums).await.expect("register alice's function");
    client.put_bytes(b"top secret".to_vec(), "/data/alice/secret.txt").await.expect("upload");
    let job = wait_for("alice's job", Duration::from_secs(60), || async {
        let jobs = client.jobs().await.ok()?;
        jobs.into_iter().find(|j| j.function == "sums" && j.state == JobState::Completed)
    })
    .await;
    assert_eq!(job.event.path, "/data/alice/secret.txt");
    let jobs = client.jobs().await.expect("jobs");
    assert!(jobs.iter().all(|j| j.owner != "mallory"), "mallory ran nothing: {jobs:?}");

    // mallory cannot read the recorded event through `fn test --seq` (as if it did not exist).
    // The stream's first message is alice's upload (nothing was stored before it); the admin's
    // view below confirms it.
    let seq = 1;
    let (status, body) = post(&gw, "/v1/functions/spy/test", &mallory, &json!(seq_request(seq))).await;
    assert_eq!(status, 404, "{body}");
    assert!(error(&body).contains("in the read namespace of mallory"), "{body}");
    // An admin sees it.
    let report = client.test_function("spy", &seq_request(seq)).await.expect("admin test");
    assert!(report.event.is_some_and(|e| e.path == "/data/alice/secret.txt"), "the admin reads the recorded event");

    // Each namespace change is in the gateway's audit trail, with its actor.
    let records = client
        .audit_trail(
            htfaas_functions::proto::AuditTrail::Gateway,
            &htfaas_functions::audit::AuditFilter { owner: Some("mallory".into()), ..Default::default() },
        )
        .await
        .expect("audit");
    let grants: Vec<(&str, &str, Option<&str>)> = records
        .iter()
        .filter(|r| r.kind == htfaas_functions::audit::AuditKind::AdminAction)
        .map(|r| {
            (r.detail["action"].as_str().unwrap_or(""), r.detail["right"].as_str().unwrap_or(""), r.actor.as_deref())
        })
        .filter(|(action, ..)| action.starts_with("namespace."))
        .collect();
    assert_eq!(grants, [("namespace.grant", "read", Some("admin")), ("namespace.grant", "write", Some("admin"))]);
    stack.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bearer_runs_only_inside_its_own_namespace_on_a_true_trigger_and_a_granted_annex() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let module = upload_checksum(&client).await;
    client
        .register(&manifest("sums", "alice", &module, Trigger::on_path("/data/raw/**"), "/data/sums/"))
        .await
        .expect("register");
    let big = Trigger::on_rule(r#"path prefix "/data/raw/" and size > 1MB"#);
    client.register(&manifest("bigsums", "alice", &module, big, "/data/sums/")).await.expect("register");
    client.put_bytes(b"x".to_vec(), "/data/raw/x.dat").await.expect("upload");

    // bob, with a plain submit token, on alice's function and alice's file.
    let bob = submit_token(dir.path(), "bob", None);
    let e = client.run_function(&bob, "sums", "/data/raw/x.dat").await.expect_err("bob is refused").to_string();
    assert!(e.contains("/data/raw/x.dat is outside the read namespace of bob"), "{e}");
    // Even with read granted, alice's function would write into alice's directory.
    client.grant("bob", Right::Read, "/data/raw/").await.expect("grant");
    let e = client.run_function(&bob, "sums", "/data/raw/x.dat").await.expect_err("bob is refused").to_string();
    assert!(e.contains("writes to /data/sums/, outside the write namespace of bob"), "{e}");

    // alice's own token: an undefined rule (a manual run knows no size) is not a true one.
    let alice = submit_token(dir.path(), "alice", None);
    let e = client.run_function(&alice, "bigsums", "/data/raw/x.dat").await.expect_err("undefined").to_string();
    assert!(e.contains("does not match the trigger"), "{e}");
    // An annex alice was not granted.
    let e = client
        .run_function_on(&alice, "sums", "/data/raw/x.dat", Some("bob-hpc"))
        .await
        .expect_err("annex")
        .to_string();
    assert!(e.contains("alice may not use annex \"bob-hpc\""), "{e}");
    // Inside, on a true trigger: runs.
    let reply = client.run_function(&alice, "sums", "/data/raw/x.dat").await.expect("alice runs her function");
    wait_for("the manual run", Duration::from_secs(60), || async {
        let jobs = client.jobs().await.ok()?;
        jobs.into_iter().find(|j| j.id == reply.job_id && j.state == JobState::Completed)
    })
    .await;
    stack.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_namespace_refuses_the_next_firing_and_a_write_macaroon_replaces_nothing_it_did_not_write() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let module = upload_checksum(&client).await;
    for right in [Right::Read, Right::Write] {
        client.grant("carol", right, "/data/carol/").await.expect("grant");
    }
    client
        .register(&manifest("csums", "carol", &module, Trigger::on_path("/data/carol/in/**"), "/data/carol/out/"))
        .await
        .expect("register inside the namespace");
    client.put_bytes(b"one".to_vec(), "/data/carol/in/a.dat").await.expect("upload");
    wait_for("carol's first job", Duration::from_secs(60), || async {
        let jobs = client.jobs().await.ok()?;
        jobs.into_iter().find(|j| j.function == "csums" && j.state == JobState::Completed)
    })
    .await;

    // A configured grant is the configuration's to take back.
    let e = client.revoke_grant("alice", Right::Read, "/data/").await.expect_err("configured").to_string();
    assert!(e.contains("granted by the gateway's configuration"), "{e}");
    let e = client.revoke_grant("carol", Right::Read, "/data/elsewhere/").await.expect_err("unknown").to_string();
    assert!(e.contains("is not granted"), "{e}");

    // Revoked: the function stays registered, its next firing is refused with the reason.
    client.revoke_grant("carol", Right::Read, "/data/carol/").await.expect("revoke");
    client.put_bytes(b"two".to_vec(), "/data/carol/in/b.dat").await.expect("upload");
    let refused = wait_for("the refusal", Duration::from_secs(60), || async {
        let records = client
            .audit_trail(
                htfaas_functions::proto::AuditTrail::Gateway,
                &htfaas_functions::audit::AuditFilter {
                    file: Some("/data/carol/in/b.dat".into()),
                    ..Default::default()
                },
            )
            .await
            .ok()?;
        records.into_iter().find(|r| r.kind == htfaas_functions::audit::AuditKind::JobRefused)
    })
    .await;
    let why = refused.detail.to_string();
    assert!(why.contains("/data/carol/in/b.dat is outside the read namespace of carol"), "{why}");
    let jobs = client.jobs().await.expect("jobs");
    assert!(!jobs.iter().any(|j| j.event.path == "/data/carol/in/b.dat"), "no job for the refused firing");

    // A write macaroon as the gateway asks for it: UPLOAD only. It creates, and rewrites what a
    // macaroon of its writer and scope wrote (a rerun), but replaces no file that someone else
    // wrote.
    let storage = stack.info().storage_url.clone();
    let write =
        stack.gateway().storage.write_macaroon("/data/carol/out/", false, "run:carol/csums").await.expect("write");
    client.put_bytes(b"user's".to_vec(), "/data/carol/out/users.txt").await.expect("a user's own file");
    let http = htfaas_gateway::http_client().expect("client");
    let put = |path: &str, macaroon: &str| {
        http.put(format!("{storage}{path}")).bearer_auth(macaroon.to_owned()).body("job output").send()
    };
    let r = put("/data/carol/out/users.txt", &write).await.expect("put");
    assert_eq!(r.status(), 403);
    let text = r.text().await.unwrap_or_default();
    assert!(text.contains("was not written by this macaroon's writer: replacing it needs DELETE"), "{text}");
    assert_eq!(client.get_bytes("/data/carol/out/users.txt").await.expect("get"), Some(b"user's".to_vec()));
    assert_eq!(put("/data/carol/out/new.txt", &write).await.expect("put").status(), 201);
    assert_eq!(put("/data/carol/out/new.txt", &write).await.expect("put").status(), 200, "its own output again");
    // Replacing is what a `replace` macaroon is for.
    let replace =
        stack.gateway().storage.write_macaroon("/data/carol/out/", true, "run:carol/csums").await.expect("replace");
    assert_eq!(put("/data/carol/out/users.txt", &replace).await.expect("put").status(), 200);
    stack.stop().await.expect("stop");
}

/// A developer may not see the versions of, roll back, disable, enable or delete
/// another owner's function (403, and the function is unchanged); its own it may.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_developer_cannot_change_or_read_the_life_of_anothers_function() {
    let (dir, stack) = start_stack().await;
    let admin = stack.client().expect("client");
    let digest = upload_checksum(&admin).await;
    admin.register(&htfaas::stack::demo_manifest(digest.clone())).await.expect("alice's function");
    let mallory = admin.clone().with_token(api_token(dir.path(), "mallory", Scope::Developer));
    let refused = |what: &str, r: anyhow::Result<()>| {
        let e = format!("{:#}", r.expect_err(what));
        assert!(e.contains("403") && e.contains("another owner"), "{what}: {e}");
    };
    refused("versions", mallory.function_versions("checksum").await.map(|_| ()));
    refused("show", mallory.function("checksum").await.map(|_| ()));
    refused("rollback", mallory.pin_function("checksum", Some(1)).await.map(|_| ()));
    refused("disable", mallory.set_function_enabled("checksum", false).await.map(|_| ()));
    refused("enable", mallory.set_function_enabled("checksum", true).await.map(|_| ()));
    refused("delete", mallory.delete_function("checksum").await.map(|_| ()));
    let status = admin.function("checksum").await.expect("unchanged");
    assert!(status.enabled && status.pinned.is_none(), "{status:?}");
    // Its owner may.
    let alice = admin.clone().with_token(api_token(dir.path(), "alice", Scope::Developer));
    assert!(!alice.set_function_enabled("checksum", false).await.expect("alice disables hers").enabled);
    stack.stop().await.expect("stop");
}

/// Another owner's developer can neither read the names of a function's secrets nor
/// set (replace) them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_developer_cannot_read_or_set_anothers_function_secrets() {
    let (dir, stack) = start_stack().await;
    let admin = stack.client().expect("client");
    let digest = upload_checksum(&admin).await;
    admin.register(&htfaas::stack::demo_manifest(digest)).await.expect("alice's function");
    let values = std::collections::BTreeMap::from([("K".to_owned(), "v".to_owned())]);
    admin.set_function_secrets("checksum", &values).await.expect("alice's secret");
    let mallory = admin.clone().with_token(api_token(dir.path(), "mallory", Scope::Developer));
    let mine = std::collections::BTreeMap::from([("K".to_owned(), "mallory's".to_owned())]);
    for e in [
        mallory.function_secret_names("checksum").await.map(|_| ()),
        mallory.set_function_secrets("checksum", &mine).await.map(|_| ()),
    ] {
        let e = format!("{:#}", e.expect_err("refused"));
        assert!(e.contains("403") && e.contains("another owner"), "{e}");
    }
    assert_eq!(admin.function_secret_names("checksum").await.expect("names"), ["K"]);
    stack.stop().await.expect("stop");
}

/// A dCache `transfer` write of `path` whose billing names `writer` as the uploader.
fn written_by(path: &str, writer: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "version": "1.0", "msgType": "transfer", "isWrite": "write", "isP2p": false,
        "status": {"code": 0, "msg": ""}, "cellName": "pool-a", "cellDomain": "poolDomain",
        "transferPath": path, "pnfsid": "0000EE11", "session": format!("session-{path}"), "fileSize": 4,
        "subject": [format!("UserNamePrincipal[{writer}]")],
    }))
    .unwrap_or_default()
}

/// A collecting trigger (fan-in) reads many files in one job, so it must merge no file the
/// group's writer did not write, and read no member its owner may no longer read: mallory's
/// file landing in alice's run directory joins nothing (counted, recorded `other_writer`) and
/// alice's merge lists her three files only; a member whose grant was taken back before its
/// group completed refuses the job, naming the member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collecting_trigger_merges_no_other_writers_file_and_reads_no_member_outside_its_namespace() {
    use htfaas_functions::collect::Collect;
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    htfaas_tests::grant_out(&client).await;
    let module = upload_checksum(&client).await;
    let count = |n| Collect { key: None, count: Some(n), marker: None, quiet_s: None, timeout_s: None };
    let mut merge = manifest("merge", htfaas::stack::USER, &module, Trigger::on_path("/data/runs/**"), "/data/merged/");
    merge.args = vec!["--set".into()];
    merge.trigger.collect = Some(count(3));
    client.register(&merge).await.expect("register");
    for name in ["a.dat", "b.dat"] {
        client.put_bytes(name.as_bytes().to_vec(), &format!("/data/runs/7/{name}")).await.expect("upload");
    }
    htfaas_tests::events_settled(&client).await;
    let subject = htfaas_functions::proto::EVENTS_SUBJECT;
    client.publish_event(subject, written_by("/data/runs/7/evil.dat", "mallory")).await.expect("publish");
    htfaas_tests::events_settled(&client).await;
    let filter = htfaas_functions::audit::AuditFilter {
        file: Some("/data/runs/7/evil.dat".into()),
        function: Some("merge".into()),
        ..Default::default()
    };
    let kept_out = wait_for("mallory's file recorded as kept out", LIMIT, || async {
        let records = client.audit_trail(htfaas_functions::proto::AuditTrail::Gateway, &filter).await.ok()?;
        records.into_iter().find(|r| r.subject.paths.iter().any(|p| p == "/data/runs/7/evil.dat"))
    })
    .await;
    assert_eq!(kept_out.detail["functions"][0]["firing"], "other_writer", "{kept_out:#?}");
    assert!(client.jobs().await.expect("jobs").iter().all(|j| j.function != "merge"), "mallory completed nothing");
    let page = htfaas_tests::gateway_metrics(stack.info()).await.expect("metrics");
    assert_eq!(htfaas_tests::metric(&page, "htfaas_gateway_firings_total", "outcome=\"not_collected\""), Some(1.0));
    client.put_bytes(b"c.dat".to_vec(), "/data/runs/7/c.dat").await.expect("upload");
    let out = "/data/merged/7.sha256sums";
    let list = wait_for(out, LIMIT, || async { client.get_bytes(out).await.ok().flatten() }).await;
    let list = String::from_utf8(list).expect("UTF-8");
    let names: Vec<&str> = list.lines().filter_map(|l| l.split("  ").nth(1)).collect();
    assert_eq!(names, ["c.dat", "data/runs/7/a.dat", "data/runs/7/b.dat"], "alice's files only: {list}");

    // carol's group: her read grant of its first file goes before the group completes.
    for (right, value) in [(Right::Read, "/data/carol/"), (Right::Write, "/out/carol/")] {
        client.grant("carol", right, value).await.expect("grant");
    }
    let mut carols = manifest("carol-merge", "carol", &module, Trigger::on_path("/data/carol/**"), "/out/carol/");
    carols.trigger.collect = Some(Collect { key: Some("/data/carol/*/".into()), ..count(2) });
    client.register(&carols).await.expect("register carol's");
    client.put_bytes(b"1".to_vec(), "/data/carol/run/x/first.dat").await.expect("upload");
    htfaas_tests::events_settled(&client).await;
    client.revoke_grant("carol", Right::Read, "/data/carol/").await.expect("revoke");
    client.grant("carol", Right::Read, "/data/carol/run/y/").await.expect("grant the second file's directory alone");
    client.put_bytes(b"2".to_vec(), "/data/carol/run/y/second.dat").await.expect("upload");
    let entry = wait_for("the refused group firing's dead letter", LIMIT, || async {
        let letters = client.dead_letters(None, None, false).await.ok()?;
        letters.into_iter().find(|e| e.event.path == "/data/carol/run/y/second.dat")
    })
    .await;
    assert!(
        entry.reason.contains("/data/carol/run/x/first.dat is outside the read namespace of carol"),
        "names the member: {entry:?}"
    );
    let jobs = client.jobs().await.expect("jobs");
    assert!(jobs.iter().all(|j| j.function != "carol-merge"), "no job: {jobs:#?}");
}
