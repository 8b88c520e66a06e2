//! Bring your own capacity: an EP attached with an annex token runs only the jobs that ask for
//! its annex, and those jobs run nowhere else — decided by the scheduler from the token.

use htfaas::stack::{demo_manifest, mint_ep_token};
use htfaas_functions::proto::{JobRecord, JobState};
use htfaas_tests::{start_stack, upload_checksum, wait_for};
use std::path::Path;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Starts an extra EP in-process, attached with `token` and declaring `annex`.
pub async fn start_ep(
    dir: &Path,
    scheduler_url: &str,
    name: &str,
    token: String,
    annex: Option<&str>,
    shutdown: &CancellationToken,
) -> JoinHandle<anyhow::Result<()>> {
    let work = dir.join(format!("ep-{name}"));
    let settings = htfaas_ep::Config {
        name: name.into(),
        scheduler_url: scheduler_url.into(),
        attach_token: token,
        slots: htfaas_functions::Resources::new(2, 2048, 600),
        work_dir: work,
        log_limit_bytes: 64 * 1024,
        max_output_files: 16,
        max_output_bytes: 1 << 30,
        lifetime_s: None,
        idle_shutdown_s: None,
        annex: annex.map(str::to_owned),
        tls_ca_file: None,
        labels: Default::default(),
        max_scratch_mb: None,
        fuel: None,
        metrics_listen: None,
        allowed_origins: None,
        max_open_files: 256,
        compile_timeout_s: 300,
        prefetch: None,
    }
    .resolve()
    .await
    .expect("resolve EP settings");
    tokio::spawn(htfaas_ep::run(settings, shutdown.child_token()))
}

async fn job_for(client: &htfaas::client::Client, path: &str) -> Option<JobRecord> {
    client.jobs().await.ok()?.into_iter().find(|j| j.event.path == path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_annex_ep_runs_only_its_annex_jobs_and_they_run_nowhere_else() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let digest = upload_checksum(&client).await;
    client.register(&demo_manifest(digest.clone())).await.expect("register the site function");
    let mut mine = demo_manifest(digest);
    mine.name = "on-my-laptop".into();
    mine.trigger.path = "/data/annex/**".into();
    mine.outputs.dir = "/data/annex-out/".into();
    mine.annex = Some("alice-laptop".into());
    // An annex is the owner's to use once an admin grants it.
    let e = client.register(&mine).await.expect_err("no annex grant yet").to_string();
    assert!(e.contains("alice may not use annex \"alice-laptop\""), "{e}");
    client.grant("alice", htfaas_functions::namespace::Right::Annex, "alice-laptop").await.expect("grant");
    client.register(&mine).await.expect("register the annex function");
    let eps = CancellationToken::new();
    let scheduler = stack.info().scheduler_url.clone();

    // Another annex's EP is attached, and the site EP is free: neither takes the job.
    let bobs = mint_ep_token(dir.path(), Some("bob".into()), Some("bob-box".into()), 600).expect("mint");
    let bob_ep = start_ep(dir.path(), &scheduler, "bob-box-1", bobs, Some("bob-box"), &eps).await;
    client.put_bytes(b"annex input".to_vec(), "/data/annex/a.dat").await.expect("put");
    let job = wait_for("the annex job", Duration::from_secs(10), || job_for(&client, "/data/annex/a.dat")).await;
    assert_eq!(job.annex.as_deref(), Some("alice-laptop"));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let job = job_for(&client, "/data/annex/a.dat").await.expect("job");
    assert_eq!(job.state, JobState::Idle, "no EP but alice-laptop's may take it: {job:?}");

    // Alice attaches her laptop: the job runs there.
    let alices = mint_ep_token(dir.path(), Some("alice".into()), Some("alice-laptop".into()), 600).expect("mint");
    let alice_ep = start_ep(dir.path(), &scheduler, "alice-laptop-1", alices, Some("alice-laptop"), &eps).await;
    let done = wait_for("the annex job to complete", Duration::from_secs(30), || async {
        job_for(&client, "/data/annex/a.dat").await.filter(|j| j.state == JobState::Completed)
    })
    .await;
    assert_eq!(done.ep.as_deref(), Some("alice-laptop-1"));
    assert!(client.get_bytes("/data/annex-out/a.dat.checksums.json").await.expect("get").is_some());

    // Plain jobs keep going to the site EP, never to an annex, although both annexes are idle.
    for i in 0..3 {
        client.put_bytes(vec![i; 100], &format!("/data/raw/site-{i}.dat")).await.expect("put");
    }
    for i in 0..3 {
        let path = format!("/data/raw/site-{i}.dat");
        let j = wait_for("a site job to complete", Duration::from_secs(30), || async {
            job_for(&client, &path).await.filter(|j| j.state == JobState::Completed)
        })
        .await;
        assert_eq!(j.ep.as_deref(), Some("ep-local-1"), "{j:?}");
        assert_eq!(j.annex, None);
    }

    eps.cancel();
    alice_ep.await.expect("join").expect("alice's EP stops cleanly");
    bob_ep.await.expect("join").expect("bob's EP stops cleanly");
    stack.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ep_declaring_another_annex_than_its_token_is_refused_and_exits() {
    let (dir, stack) = start_stack().await;
    let scheduler = stack.info().scheduler_url.clone();
    let eps = CancellationToken::new();
    let token = mint_ep_token(dir.path(), Some("alice".into()), Some("alice-laptop".into()), 600).expect("mint");
    let ep = start_ep(dir.path(), &scheduler, "confused", token, Some("gpu-farm"), &eps).await;
    let err = tokio::time::timeout(Duration::from_secs(20), ep)
        .await
        .expect("the EP gives up instead of retrying forever")
        .expect("join")
        .expect_err("refused");
    let msg = format!("{err:#}");
    assert!(msg.contains("annex mismatch"), "{msg}");

    // A token without an annex may not join one either.
    let site = mint_ep_token(dir.path(), None, None, 600).expect("mint");
    let ep = start_ep(dir.path(), &scheduler, "site-as-annex", site, Some("alice-laptop"), &eps).await;
    let err = tokio::time::timeout(Duration::from_secs(20), ep).await.expect("gives up").expect("join").expect_err("x");
    assert!(format!("{err:#}").contains("annex mismatch"), "{err:#}");
    // Annex names are checked where they are minted.
    assert!(mint_ep_token(dir.path(), None, Some("../etc".into()), 600).is_err());
    eps.cancel();
    stack.stop().await.expect("clean stop");
}
