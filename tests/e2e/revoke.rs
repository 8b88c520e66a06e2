//! Revocation takes effect at every hop at once: a revoked submit token is refused, its queued
//! jobs are removed and its running jobs stopped; EPs attached with a revoked attach token are
//! disconnected and cannot return; a revoked issuer's tokens fire nothing.

use crate::annex::start_ep;
use htfaas::stack::{SubmitGrant, demo_manifest, mint_ep_token, mint_submit_token};
use htfaas_functions::Resources;
use htfaas_functions::proto::{JobRecord, JobState, RevocationTarget};
use htfaas_tests::{register_spin, start_stack, upload_checksum, wait_for};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

async fn jobs_of(client: &htfaas::client::Client, jti_prefix: &str) -> Vec<JobRecord> {
    let all = client.jobs().await.expect("jobs");
    all.into_iter().filter(|j| j.event.id.starts_with(jti_prefix)).collect()
}

fn jti_of(token: &str) -> String {
    use base64::Engine as _;
    let payload = token.split('.').nth(1).expect("JWT payload");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).expect("base64url");
    let claims: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON claims");
    claims["jti"].as_str().expect("jti").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_submit_token_is_refused_and_its_queued_and_running_jobs_end() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    register_spin(&client).await;

    // Bob may run seven jobs; the stack's EP has two cores and prefetches up to four more:
    // two run, three or four wait on the EP (`running` in the store; the scheduler refills the
    // EP's queue once half of it is free, so it stops at three when the jobs came one by one),
    // the rest wait in the queue. That holds still: the spinners run for two minutes.
    let grant = SubmitGrant {
        owner: "bob".into(),
        jobs: 7,
        limits: Resources::new(1, 64, 120),
        function: None,
        group: None,
        ttl_s: 600,
    };
    htfaas_tests::share_data(&client, "bob").await;
    let token = mint_submit_token(dir.path(), &grant).expect("mint");
    let jti = jti_of(&token);
    for _ in 0..7 {
        client.run_function(&token, "spin", "/data/spin/in.dat").await.expect("submit");
    }
    let (running, idle) = wait_for("five or six running, the rest idle", Duration::from_secs(20), || async {
        let jobs = jobs_of(&client, &jti).await;
        let running = jobs.iter().filter(|j| j.state == JobState::Running).count();
        let idle = jobs.iter().filter(|j| j.state == JobState::Idle).count();
        (running >= 5 && idle >= 1 && running + idle == 7).then_some((running, idle))
    })
    .await;

    let r = client.revoke(RevocationTarget::Jti(jti.clone()), "leaked in a log").await.expect("revoke");
    assert_eq!((r.stopped_jobs.len(), r.removed_jobs.len(), r.closed_eps.len()), (running, idle, 0), "{r:?}");
    for job in jobs_of(&client, &jti).await {
        assert_eq!(job.state, JobState::Removed, "{job:?}");
        assert!(job.reason.contains("token revoked: leaked in a log"), "{job:?}");
    }
    // Refused from now on, before any macaroon is requested, with the reason.
    let err = client.run_function(&token, "spin", "/data/spin/in.dat").await.expect_err("revoked");
    assert!(format!("{err:#}").contains("revoked"), "{err:#}");
    assert!(client.revocations().await.expect("list").iter().any(|x| x.target == RevocationTarget::Jti(jti.clone())));

    // The spinning guests were really stopped: the EP's two cores are free for a normal job
    // long before the spinners' two-minute cap.
    client.register(&demo_manifest(upload_checksum(&client).await)).await.expect("register");
    client.put_bytes(b"after".to_vec(), "/data/raw/after.dat").await.expect("put");
    wait_for("the next job to complete", Duration::from_secs(20), || async {
        let jobs = client.jobs().await.ok()?;
        jobs.into_iter().find(|j| j.event.path == "/data/raw/after.dat" && j.state == JobState::Completed)
    })
    .await;
    stack.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_an_owner_disconnects_their_ep_for_good_and_a_revoked_issuer_fires_nothing() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let scheduler = stack.info().scheduler_url.clone();
    let eps = CancellationToken::new();
    let token = mint_ep_token(dir.path(), Some("bob".into()), None, 600).expect("mint");
    let ep = start_ep(dir.path(), &scheduler, "bob-1", token.clone(), None, &eps).await;
    // Once it is attached, every token of bob is revoked.
    wait_for("bob's EP attached", Duration::from_secs(20), || crate::annex::attached(&client, "bob-1")).await;
    let r = client.revoke(RevocationTarget::Owner("bob".into()), "left the experiment").await.expect("revoke");
    assert_eq!(r.closed_eps.len(), 1, "{r:?}");
    let err = tokio::time::timeout(Duration::from_secs(20), ep).await.expect("exits").expect("join").expect_err("x");
    assert!(format!("{err:#}").contains("revoked"), "{err:#}");
    // Coming back with the same token is refused at the door.
    let again = start_ep(dir.path(), &scheduler, "bob-2", token, None, &eps).await;
    let err = tokio::time::timeout(Duration::from_secs(20), again).await.expect("exits").expect("join").expect_err("x");
    assert!(format!("{err:#}").contains("403"), "{err:#}");
    // Bob's submit tokens are refused too.
    let grant = SubmitGrant {
        owner: "bob".into(),
        jobs: 1,
        limits: Resources::new(1, 64, 60),
        function: None,
        group: None,
        ttl_s: 600,
    };
    let digest = upload_checksum(&client).await;
    let mut m = demo_manifest(digest);
    m.trigger.path = "/data/manual/**".into();
    client.register(&m).await.expect("register");
    client.put_bytes(b"x".to_vec(), "/data/manual/x.dat").await.expect("put");
    htfaas_tests::share_data(&client, "bob").await;
    let submit = mint_submit_token(dir.path(), &grant).expect("mint");
    let err = client.run_function(&submit, "checksum", "/data/manual/x.dat").await.expect_err("owner revoked");
    assert!(format!("{err:#}").contains("revoked"), "{err:#}");

    // Revoking the gateway's own issuer stops triggered jobs: the upload is refused, counted, no job.
    wait_for("x.dat's own triggered job", Duration::from_secs(10), || async {
        (client.stats().await.ok()?.jobs_submitted >= 1).then_some(())
    })
    .await;
    let before = client.jobs().await.expect("jobs").len();
    client.revoke(RevocationTarget::Issuer("htfaas-gateway".into()), "key compromised").await.expect("revoke");
    client.put_bytes(b"y".to_vec(), "/data/manual/y.dat").await.expect("put");
    wait_for("the refusal to be counted", Duration::from_secs(10), || async {
        (client.stats().await.ok()?.jobs_refused >= 1).then_some(())
    })
    .await;
    assert_eq!(client.jobs().await.expect("jobs").len(), before, "no job from a revoked issuer");
    eps.cancel();
    stack.stop().await.expect("clean stop");
}
