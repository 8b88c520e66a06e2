//! Direct invocation on the real stack: `htfaas fn invoke NAME PATH --wait` runs a registered
//! function on a file with the caller's own credential and prints how the job ended and its
//! outputs' paths; without `--wait` it prints the job id. A developer who is not the owner runs
//! it as a bearer: a file outside its own namespace is refused, and nothing is submitted.

use htfaas_functions::audit::AuditFilter;
use htfaas_functions::proto::{AuditTrail, InvokeRequest, JobState};
use htfaas_functions::token::Scope;
use htfaas_tests::{htfaas_cli, start_stack, upload_checksum, wait_for};
use std::path::Path;
use std::process::Output;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

fn api_token(stack_dir: &Path, sub: &str) -> String {
    htfaas_tests::api_token(stack_dir, sub, Scope::Developer)
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fn_invoke_waits_and_prints_the_outputs_and_refuses_a_file_outside_the_callers_namespace() {
    let (dir, stack) = start_stack().await;
    let info = stack.info().clone();
    let client = stack.client().expect("client");
    let module = upload_checksum(&client).await;
    client.register(&htfaas::stack::demo_manifest(module)).await.expect("register");
    // The trigger's own run of the file: what the invocation must reproduce.
    client.put_bytes(b"invoke me".to_vec(), "/data/raw/a.dat").await.expect("upload");
    let fired = wait_for("the triggered job", LIMIT, || async {
        client.jobs().await.ok()?.into_iter().find(|j| j.event.path == "/data/raw/a.dat" && j.state.is_final())
    })
    .await;
    assert_eq!(fired.state, JobState::Completed, "{fired:#?}");

    // alice, the owner, with a profile of her own API token.
    let home = tempfile::tempdir().expect("home");
    let h = home.path();
    std::fs::write(h.join("alice.token"), api_token(dir.path(), htfaas::stack::USER)).expect("token");
    std::fs::write(h.join("bob.token"), api_token(dir.path(), "bob")).expect("token");
    let login = |profile: &'static str, file: &'static str| {
        let gateway = info.gateway_url.clone();
        async move {
            let args = ["login", "--insecure-http", "--profile", profile, "--gateway", &gateway, "--token-file", file];
            let out = htfaas_cli(h, &args).await;
            assert!(out.status.success(), "login: {}", text(&out));
        }
    };
    login("alice", "alice.token").await;
    login("bob", "bob.token").await;

    let out = htfaas_cli(h, &["fn", "invoke", "--profile", "alice", "checksum", "/data/raw/a.dat", "--wait"]).await;
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    let first = said.lines().next().unwrap_or_default();
    assert!(first.starts_with("job ") && first.ends_with(" completed (exit 0)"), "{said}");
    let job_id = first.split_whitespace().nth(1).expect("job id").to_owned();
    let written = &fired.outputs[0];
    assert!(said.contains(&format!("{}\t{} bytes\tsha256 {}", written.path, written.size, written.sha256)), "{said}");
    let job = client.job(&job_id).await.expect("the invoked job");
    assert_eq!((job.owner.as_str(), job.event.source.as_str()), (htfaas::stack::USER, "invoke"));
    assert_eq!(job.outputs, fired.outputs, "the same bytes, the same output");
    // The gateway's trail names who invoked it, and the run's token.
    let filter = AuditFilter { job: Some(job_id.clone()), ..AuditFilter::default() };
    let records = client.audit_trail(AuditTrail::Gateway, &filter).await.expect("the gateway's trail");
    let invoked = records.iter().find(|r| r.detail["action"] == "function.invoke").expect("the invocation's record");
    assert_eq!(invoked.actor.as_deref(), Some(htfaas::stack::USER));
    assert_eq!(invoked.subject.token_jti.as_deref(), Some(job.token_jti.as_str()));

    // Without --wait: the id, at once; the job runs all the same.
    let out = htfaas_cli(h, &["fn", "invoke", "--profile", "alice", "checksum", "/data/raw/a.dat"]).await;
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    let id = said.trim().strip_prefix("job ").expect("job id").to_owned();
    wait_for("the unwaited job to complete", LIMIT, || async {
        (client.job(&id).await.ok()?.state == JobState::Completed).then_some(())
    })
    .await;

    // bob has no grant on /data/: refused before anything is submitted, with the reason.
    let before = client.jobs().await.expect("jobs").len();
    let out = htfaas_cli(h, &["fn", "invoke", "--profile", "bob", "checksum", "/data/raw/a.dat", "--wait"]).await;
    let said = text(&out);
    assert!(!out.status.success(), "bob invoked on alice's file: {said}");
    assert!(said.contains("outside the read namespace of bob"), "{said}");
    // A wait beyond the bound and a path that is not clean are refused too.
    let bad = InvokeRequest { path: "/data/raw/a.dat".into(), annex: None, wait_s: 301 };
    assert!(client.invoke_function("checksum", &bad).await.is_err(), "a wait of 301 s");
    let bad = InvokeRequest { path: "/data/raw/../x".into(), annex: None, wait_s: 0 };
    assert!(client.invoke_function("checksum", &bad).await.is_err(), "an unclean path");
    assert_eq!(client.jobs().await.expect("jobs").len(), before, "a refusal submits nothing");
}
