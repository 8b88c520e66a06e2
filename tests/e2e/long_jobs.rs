//! Jobs longer than their EP's credentials, on the real stack: an EP whose attach token lives
//! a few seconds keeps its session by renewing the token, so a job running across several
//! of its lives completes on its first attempt; and where the site does not renew, the
//! scheduler places no job on an EP whose token expires before the job's run time would end
//! (`jobs analyze` says why), while a job short enough still runs there.

use crate::annex::{attached, start_ep};
use htfaas::stack::{demo_manifest, mint_ep_token};
use htfaas_functions::Resources;
use htfaas_functions::manifest::FunctionManifest;
use htfaas_functions::proto::{EpAction, JobRecord, JobState};
use htfaas_tests::{guest_wasm, start_stack_with, wait_for};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const LIMIT: Duration = Duration::from_secs(90);
/// The life of the extra EP's attach token, seconds.
const TOKEN_TTL_S: u64 = 8;

/// A function of the `hostile` guest that sleeps `sleep_s` and then writes `/sleeping`.
async fn sleeper(client: &htfaas::client::Client, name: &str, sleep_s: u64, runtime_s: u64) -> FunctionManifest {
    let hostile = client.upload_module(std::fs::read(guest_wasm("hostile")).expect("hostile.wasm")).await;
    let mut m = demo_manifest(hostile.expect("upload hostile"));
    m.name = name.into();
    m.trigger.path = format!("/data/{name}/**");
    m.outputs.dir = format!("/data/{name}-out/");
    m.args = vec!["sleep".into(), sleep_s.to_string()];
    m.resources = Resources::new(1, 64, runtime_s);
    m
}

async fn job_for(client: &htfaas::client::Client, path: &str) -> Option<JobRecord> {
    client.jobs().await.ok()?.into_iter().find(|j| j.event.path == path)
}

/// The stack's own EP takes nothing, so jobs can run only on the EP a test starts.
async fn disable_site_ep(client: &htfaas::client::Client) {
    let off = EpAction { reason: "only the short-token EP".into(), deadline_s: None, group: None };
    client.ep_action("ep-local-1", "disable", &off).await.expect("disable the site EP");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_longer_than_its_eps_attach_token_completes_as_the_ep_renews_the_token() {
    let (dir, stack) = start_stack_with(|_| {}).await;
    let client = stack.client().expect("client");
    disable_site_ep(&client).await;
    // Sleeps across three lives of the token.
    let sleep_s = 3 * TOKEN_TTL_S;
    client.register(&sleeper(&client, "long", sleep_s, 120).await).await.expect("register");
    let eps = CancellationToken::new();
    let token = mint_ep_token(dir.path(), Some("alice".into()), None, TOKEN_TTL_S).expect("mint");
    let minted = Instant::now();
    let ep = start_ep(dir.path(), &stack.info().scheduler_url, "short-token-1", token, None, &eps).await;
    wait_for("the EP attached", Duration::from_secs(20), || attached(&client, "short-token-1")).await;

    client.put_bytes(b"a long one".to_vec(), "/data/long/in.dat").await.expect("put");
    let done = wait_for("the long job to end", LIMIT, || async {
        job_for(&client, "/data/long/in.dat")
            .await
            .filter(|j| matches!(j.state, JobState::Completed | JobState::Failed | JobState::Removed))
    })
    .await;
    assert!(minted.elapsed() > Duration::from_secs(2 * TOKEN_TTL_S), "the job outlived the first token twice");
    assert_eq!(done.state, JobState::Completed, "{done:#?}");
    assert_eq!(done.attempts, 1, "never lost with its session: {done:#?}");
    assert_eq!(done.ep.as_deref(), Some("short-token-1"), "{done:#?}");
    assert!(client.get_bytes("/data/long-out/sleeping").await.expect("get").is_some(), "the output is stored");
    // Still attached on a renewed token, long after the first one expired.
    assert!(attached(&client, "short-token-1").await.is_some(), "the session outlived its first token");

    eps.cancel();
    ep.await.expect("join").expect("the EP stops cleanly");
    stack.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_would_outlast_an_eps_token_is_not_placed_there_and_analyze_says_why() {
    let (dir, stack) = start_stack_with(|o| {
        o.scheduler_settings.insert("renew_attach".into(), false.into());
    })
    .await;
    let client = stack.client().expect("client");
    disable_site_ep(&client).await;
    let eps = CancellationToken::new();
    let token = mint_ep_token(dir.path(), Some("alice".into()), None, 600).expect("mint");
    let ep = start_ep(dir.path(), &stack.info().scheduler_url, "leaving-1", token, None, &eps).await;
    wait_for("the EP attached", Duration::from_secs(20), || attached(&client, "leaving-1")).await;

    // Asks for more run time than the EP's token has left: it waits, and analyze says why.
    client.register(&sleeper(&client, "toolong", 1, 3000).await).await.expect("register");
    client.put_bytes(b"too long".to_vec(), "/data/toolong/in.dat").await.expect("put");
    let job = wait_for("the job, idle", LIMIT, || async {
        job_for(&client, "/data/toolong/in.dat").await.filter(|j| j.state == JobState::Idle)
    })
    .await;
    let analysis = wait_for("the EP's verdict", LIMIT, || async {
        let a = client.job_analyze(&job.id).await.ok()?;
        a.eps.iter().any(|v| v.ep == "leaving-1").then_some(a)
    })
    .await;
    let verdict = analysis.eps.iter().find(|v| v.ep == "leaving-1").and_then(|v| v.refusal.clone());
    let verdict = verdict.expect("the EP refuses the job");
    assert!(verdict.contains("would end after the EP's attach token expires"), "{analysis:#?}");
    assert!(verdict.contains("it is not renewed"), "{verdict}");

    // One that ends in time runs there.
    client.register(&sleeper(&client, "short", 1, 60).await).await.expect("register");
    client.put_bytes(b"short".to_vec(), "/data/short/in.dat").await.expect("put");
    let done = wait_for("the short job to complete", LIMIT, || async {
        job_for(&client, "/data/short/in.dat").await.filter(|j| j.state == JobState::Completed)
    })
    .await;
    assert_eq!(done.ep.as_deref(), Some("leaving-1"));
    let still = job_for(&client, "/data/toolong/in.dat").await.expect("job");
    assert_eq!(still.state, JobState::Idle, "the long one still waits: {still:#?}");

    eps.cancel();
    ep.await.expect("join").expect("the EP stops cleanly");
    stack.stop().await.expect("clean stop");
}
