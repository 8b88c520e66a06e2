//! Annexes: an annex's token is minted only for an owner the namespace allows, its EP
//! runs only that owner's jobs of that annex, and a deleted annex's token never attaches again.

use crate::annex::start_ep;
use htfaas::stack::demo_manifest;
use htfaas_functions::namespace::Right;
use htfaas_functions::proto::{AnnexRequest, EpAction, JobRecord, JobState};
use htfaas_functions::token::{ApiClaims, Scope, SigningKey};
use htfaas_tests::{share_data, start_stack, upload_checksum, wait_for};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

fn request(name: &str, owner: &str) -> AnnexRequest {
    AnnexRequest {
        name: name.into(),
        owner: owner.into(),
        provider: "slurm".into(),
        count: 1,
        cpus: 1,
        memory_mb: 512,
        lifetime_s: 3600,
        idle_shutdown_s: None,
        partition: None,
        token_ttl_s: None,
    }
}

async fn job_for(client: &htfaas::client::Client, path: &str) -> Option<JobRecord> {
    client.jobs().await.ok()?.into_iter().find(|j| j.event.path == path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_without_the_annex_right_gets_no_annex_token() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    // Another owner's right, or a right to another annex, is not bob's right to this one.
    client.grant("alice", Right::Annex, "bob-gpu").await.expect("grant");
    client.grant("bob", Right::Annex, "bob-cpu").await.expect("grant");
    let e = client.annex_create(&request("bob-gpu", "bob")).await.expect_err("refused");
    assert!(e.to_string().contains("403") && e.to_string().contains("bob may not use annex \"bob-gpu\""), "{e}");
    assert!(client.annexes().await.expect("list").is_empty(), "nothing recorded, no token minted");
    // A developer cannot create annexes at all, not even its own with the right.
    let key = SigningKey::load_or_create(&dir.path().join("gateway/submit.pem"), "gateway-1").expect("key");
    let dev = key.sign(&ApiClaims::new("htfaas-gateway", "bob", Scope::Developer, 600)).expect("sign");
    let e = client.clone().with_token(dev).annex_create(&request("bob-cpu", "bob")).await.expect_err("admin only");
    assert!(e.to_string().contains("403"), "{e}");
    assert!(client.annexes().await.expect("list").is_empty());
    stack.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_annex_ep_runs_no_other_owners_job_and_no_plain_job() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let digest = upload_checksum(&client).await;
    share_data(&client, "bob").await;
    // Both alice and bob may ask for annex "shared-name" (an admin granted both), but the
    // annex's token is alice's.
    client.grant("alice", Right::Annex, "shared-name").await.expect("grant");
    client.grant("bob", Right::Annex, "shared-name").await.expect("grant");
    let created = client.annex_create(&request("shared-name", "alice")).await.expect("create");
    let fun = |name: &str, owner: &str, dir_in: &str, annex: Option<&str>| {
        let mut m = demo_manifest(digest.clone());
        m.name = name.into();
        m.owner = owner.into();
        m.trigger.path = format!("/data/{dir_in}/**");
        m.outputs.dir = format!("/data/{dir_in}-out/");
        m.annex = annex.map(str::to_owned);
        m
    };
    client.register(&fun("alices", "alice", "alice-annex", Some("shared-name"))).await.expect("register");
    client.register(&fun("bobs", "bob", "bob-annex", Some("shared-name"))).await.expect("register");
    client.register(&fun("plain", "alice", "plain", None)).await.expect("register");
    // The site EP takes nothing new: only the annex EP could take the plain job.
    let hold = EpAction { reason: "attack test".into(), deadline_s: None, group: None };
    client.ep_action("ep-local-1", "disable", &hold).await.expect("disable the site EP");
    let eps = CancellationToken::new();
    let scheduler = stack.info().scheduler_url.clone();
    let ep = start_ep(dir.path(), &scheduler, "alice-annex-1", created.attach_token, Some("shared-name"), &eps).await;

    let why = [
        ("/data/bob-annex/x.dat", "bob's annex job", "the EP runs only alice's jobs"),
        ("/data/plain/x.dat", "alice's plain job", "annex mismatch: the EP's annex is \"shared-name\", the job's none"),
    ];
    for (path, what, reason) in why {
        client.put_bytes(b"x".to_vec(), path).await.expect("put");
        let job = wait_for(what, Duration::from_secs(20), || job_for(&client, path)).await;
        // The scheduler says why the annex EP may not run it, from the token.
        let analysis = wait_for("an analysis naming the annex EP", Duration::from_secs(20), || async {
            let a = client.job_analyze(&job.id).await.ok()?;
            a.eps.iter().find(|v| v.ep == "alice-annex-1").and_then(|v| v.refusal.clone())
        })
        .await;
        assert_eq!(analysis, reason, "{what}");
    }
    // Alice's annex job runs there at once; bob's and the plain job are still idle after it.
    client.put_bytes(b"y".to_vec(), "/data/alice-annex/y.dat").await.expect("put");
    let done = wait_for("alice's annex job", Duration::from_secs(30), || async {
        job_for(&client, "/data/alice-annex/y.dat").await.filter(|j| j.state == JobState::Completed)
    })
    .await;
    assert_eq!(done.ep.as_deref(), Some("alice-annex-1"));
    for path in ["/data/bob-annex/x.dat", "/data/plain/x.dat"] {
        let j = job_for(&client, path).await.expect("job");
        assert_eq!(j.state, JobState::Idle, "{path} ran on the annex EP: {j:?}");
    }
    // The site EP back: the plain job runs there (never on the annex); bob's annex job stays,
    // for no EP of its annex is his.
    client.ep_action("ep-local-1", "enable", &hold).await.expect("enable");
    let plain = wait_for("the plain job on the site EP", Duration::from_secs(30), || async {
        job_for(&client, "/data/plain/x.dat").await.filter(|j| j.state == JobState::Completed)
    })
    .await;
    assert_eq!(plain.ep.as_deref(), Some("ep-local-1"));
    assert_eq!(job_for(&client, "/data/bob-annex/x.dat").await.expect("job").state, JobState::Idle);
    eps.cancel();
    ep.await.expect("join").expect("the annex EP stops cleanly");
    stack.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_annexs_token_is_refused_at_attach() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    client.grant("alice", Right::Annex, "short-lived").await.expect("grant");
    let created = client.annex_create(&request("short-lived", "alice")).await.expect("create");
    let token = created.attach_token.clone();
    let scheduler = stack.info().scheduler_url.clone();
    let eps = CancellationToken::new();
    let first = start_ep(dir.path(), &scheduler, "short-1", token.clone(), Some("short-lived"), &eps).await;
    wait_for("the annex EP to attach", Duration::from_secs(20), || async {
        client.annex("short-lived").await.ok().filter(|v| v.eps.len() == 1)
    })
    .await;
    // Delete as `htfaas annex delete` does: drain (the EP leaves by itself), then revoke.
    client.annex_drain("short-lived").await.expect("drain");
    tokio::time::timeout(Duration::from_secs(30), first).await.expect("left").expect("join").expect("cleanly");
    let deleted = client.annex_delete("short-lived").await.expect("delete");
    assert_eq!(deleted.annex.token_jti, created.annex.token_jti);
    // A leftover EP (or anyone who kept the token) dials in again: refused before the upgrade.
    let again = start_ep(dir.path(), &scheduler, "short-2", token, Some("short-lived"), &eps).await;
    let e = tokio::time::timeout(Duration::from_secs(20), again)
        .await
        .expect("gives up")
        .expect("join")
        .expect_err("refused");
    assert!(format!("{e:#}").contains("revoked: annex short-lived deleted"), "{e:#}");
    // The name is free again; the new annex has a new token, and the old one stays refused.
    let renewed = client.annex_create(&request("short-lived", "alice")).await.expect("create again");
    assert_ne!(renewed.annex.token_jti, created.annex.token_jti);
    eps.cancel();
    stack.stop().await.expect("clean stop");
}
