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
        slots: htfaas_functions::Resources::new(2, 2048, 600),
        max_output_files: 16,
        max_output_bytes: 1 << 30,
        annex: annex.map(str::to_owned),
        ..htfaas_ep::Config::for_test(name, scheduler_url, token, work)
    }
    .resolve()
    .await
    .expect("resolve EP settings");
    tokio::spawn(htfaas_ep::run(settings, shutdown.child_token()))
}

async fn job_for(client: &htfaas::client::Client, path: &str) -> Option<JobRecord> {
    client.jobs().await.ok()?.into_iter().find(|j| j.event.path == path)
}

/// `Some` once the EP `name` is attached.
pub async fn attached(client: &htfaas::client::Client, name: &str) -> Option<()> {
    client.eps().await.ok()?.iter().any(|e| e.name == name && e.session.is_some()).then_some(())
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
    wait_for("bob's EP attached", Duration::from_secs(20), || attached(&client, "bob-box-1")).await;
    client.put_bytes(b"annex input".to_vec(), "/data/annex/a.dat").await.expect("put");
    let job = wait_for("the annex job", Duration::from_secs(10), || job_for(&client, "/data/annex/a.dat")).await;
    assert_eq!(job.annex.as_deref(), Some("alice-laptop"));
    // A site job queued behind it runs to its end: the scheduler dispatched past the annex job.
    client.put_bytes(b"behind".to_vec(), "/data/raw/behind.dat").await.expect("put");
    wait_for("the site job behind it", Duration::from_secs(30), || async {
        job_for(&client, "/data/raw/behind.dat").await.filter(|j| j.state == JobState::Completed)
    })
    .await;
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

/// An annex through the API (as `htfaas annex create` makes it, without a batch system): the
/// record and its token, for alice.
async fn api_annex(
    client: &htfaas::client::Client,
    name: &str,
    lifetime_s: u64,
) -> htfaas_functions::proto::AnnexCreated {
    client.grant("alice", htfaas_functions::namespace::Right::Annex, name).await.expect("grant");
    let request = htfaas_functions::proto::AnnexRequest {
        name: name.into(),
        owner: "alice".into(),
        provider: "slurm".into(),
        count: 1,
        cpus: 1,
        memory_mb: 512,
        lifetime_s,
        idle_shutdown_s: None,
        partition: None,
        token_ttl_s: None,
    };
    client.annex_create(&request).await.expect("annex create")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_annex_ep_learns_the_annexs_end_when_it_attaches_and_when_it_moves() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let scheduler = stack.info().scheduler_url.clone();
    let created = api_annex(&client, "alice-moving", 3600).await;
    assert_eq!(created.annex.owner, "alice");
    assert_eq!(created.annex.drain_s, 360);
    assert!(created.annex.token_exp_ms > created.annex.ends_ms, "the token outlives the annex");
    // The token is bound to the annex and the owner: an EP attached with it shows both.
    let eps = CancellationToken::new();
    let ep = start_ep(dir.path(), &scheduler, "moving-1", created.attach_token, Some("alice-moving"), &eps).await;
    let view = wait_for("the annex EP to attach", Duration::from_secs(20), || async {
        client.annex("alice-moving").await.ok().filter(|v| v.eps.len() == 1)
    })
    .await;
    assert_eq!((view.eps[0].annex.as_deref(), view.eps[0].owner.as_deref()), (Some("alice-moving"), Some("alice")));
    // Batch job ids are recorded with it; a malformed one is refused.
    let record = client.annex_jobs("alice-moving", vec!["17".into()]).await.expect("record jobs");
    assert_eq!(record.jobs, vec!["17".to_owned()]);
    let bad = client.annex_jobs("alice-moving", vec!["17; scancel -u root".into()]).await.expect_err("refused");
    assert!(bad.to_string().contains("400"), "{bad}");
    // Extended past its token: refused, nothing changes.
    let e = client.annex_extend("alice-moving", 3 * 24 * 3600).await.expect_err("past the token");
    assert!(e.to_string().contains("cannot outlive its attach token"), "{e}");
    // Brought forward to a minute from now (less than its drain window): the EP is told and
    // leaves by itself, without any signal of ours.
    let moved = client.annex_extend("alice-moving", 60).await.expect("extend");
    assert!(moved.ends_ms < created.annex.ends_ms);
    tokio::time::timeout(Duration::from_secs(30), ep)
        .await
        .expect("the EP left when told its lifetime was over")
        .expect("join")
        .expect("it left cleanly (a drain, not a refusal)");
    // An EP attaching now is told at once, and leaves too.
    let again = mint_ep_token(dir.path(), Some("alice".into()), Some("alice-moving".into()), 600).expect("mint");
    let late = start_ep(dir.path(), &scheduler, "moving-2", again, Some("alice-moving"), &eps).await;
    tokio::time::timeout(Duration::from_secs(30), late).await.expect("left").expect("join").expect("cleanly");
    let deleted = client.annex_delete("alice-moving").await.expect("delete");
    assert_eq!(deleted.revocation.target, htfaas_functions::proto::RevocationTarget::Jti(created.annex.token_jti));
    eps.cancel();
    stack.stop().await.expect("clean stop");
}
