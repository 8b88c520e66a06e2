//! Overload: one owner queues 100,000 jobs, another owner's file lands after all of them, and
//! that owner's job still starts in the very next dispatch round (DESY's "single users can
//! disturb schedulers"), on the real stack with its real EP.

use htfaas::stack::{SubmitGrant, demo_manifest, mint_submit_token};
use htfaas_functions::proto::{
    EpAction, EventRef, FunctionRef, InputSpec, JobState, OutputSpec, SubmitRequest, SubmitResponse,
};
use htfaas_tests::{register_spin, request_macaroon, stack_secret, start_stack, upload_checksum, wait_for};
use std::time::{Duration, Instant};

/// Jobs in the flood.
const FLOOD: usize = 100_000;
/// Concurrent submitters.
const SUBMITTERS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_owners_100000_jobs_do_not_keep_anothers_job_out_of_the_next_dispatch_round() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let info = stack.info().clone();
    register_spin(&client).await;
    let digest = upload_checksum(&client).await;
    let mut bobsum = demo_manifest(digest);
    (bobsum.name, bobsum.owner) = ("bobsum".into(), "bob".into());
    (bobsum.trigger.path, bobsum.outputs.dir) = ("/data/bob/**".into(), "/data/bob-out/".into());
    htfaas_tests::share_data(&client, "bob").await;
    client.register(&bobsum).await.expect("register bobsum");
    // The site EP (2 cores) starts nothing while the flood arrives.
    let action = |reason: &str| EpAction { reason: reason.into(), deadline_s: None, group: None };
    client.ep_action("ep-local-1", "disable", &action("flood test")).await.expect("disable");

    // Alice's flood, submitted to the scheduler as the gateway submits triggered jobs: each a
    // 1-core spin that would hold its core for 120 s.
    let spin =
        client.functions().await.expect("functions").into_iter().find(|f| f.manifest.name == "spin").expect("spin");
    let gw = stack_secret(dir.path(), "gateway_storage_secret");
    let storage = info.storage_url.clone();
    let read = request_macaroon(&storage, "gateway", &gw, &["activity:DOWNLOAD", "path:/data/spin/in.dat"]).await;
    let read = read.json::<serde_json::Value>().await.expect("json")["macaroon"].as_str().expect("macaroon").to_owned();
    let write = request_macaroon(&storage, "gateway", &gw, &["activity:UPLOAD,DELETE", "path:/data/spin-out/"]).await;
    let write =
        write.json::<serde_json::Value>().await.expect("json")["macaroon"].as_str().expect("macaroon").to_owned();
    let grant = SubmitGrant {
        owner: "alice".into(),
        jobs: u32::try_from(FLOOD).expect("fits"),
        limits: spin.manifest.resources,
        function: Some(spin.manifest.module.clone()),
        group: None,
        ttl_s: 3600,
    };
    let token = mint_submit_token(dir.path(), &grant).expect("token");
    let request = |i: usize| SubmitRequest {
        retry: None,
        function: FunctionRef {
            name: spin.manifest.name.clone(),
            version: spin.version,
            digest: spin.manifest.module.clone(),
            module_url: format!("{}/v1/modules/{}", info.gateway_url, spin.manifest.module),
            native: None,
        },
        resources: spin.manifest.resources,
        input: Some(InputSpec::new(format!("{storage}/data/spin/in.dat"), "in.dat", read.clone())),
        output: OutputSpec {
            url: format!("{storage}/data/spin-out/"),
            macaroon: write.clone(),
            on_failure: Default::default(),
        },
        args: vec![],
        env: vec![],
        event: EventRef::new("flood", format!("flood-{i}"), "/data/spin/in.dat"),
        dedupe_key: format!("flood-{i}"),
        annex: None,
        bind_ep_address: false,
        class: None,
        limits: Default::default(),
        secrets: Default::default(),
        renewal: None,
        max_concurrent: None,
        refs: Vec::new(),
        checkpoint: None,
    };
    let requests: Vec<SubmitRequest> = (0..FLOOD).map(request).collect();
    let http = htfaas_gateway::http_client().expect("client");
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for part in requests.chunks(FLOOD.div_ceil(SUBMITTERS)) {
        let (part, http, token, url) = (part.to_vec(), http.clone(), token.clone(), info.scheduler_url.clone());
        tasks.spawn(async move {
            for r in part {
                let resp =
                    http.post(format!("{url}/v1/jobs")).bearer_auth(&token).json(&r).send().await.expect("submit");
                assert_eq!(resp.status(), reqwest::StatusCode::CREATED, "{}", resp.text().await.unwrap_or_default());
                let _: SubmitResponse = resp.json().await.expect("answer");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("submitter");
    }
    let flood_s = started.elapsed().as_secs_f64();
    println!("queued {FLOOD} jobs in {flood_s:.1} s ({:.0}/s)", FLOOD as f64 / flood_s);

    // Bob's file lands last; his job is queued behind all of Alice's.
    client.put_bytes(b"bob's calibration run".to_vec(), "/data/bob/in.dat").await.expect("put");
    let bobs = wait_for("bob's job to be queued", Duration::from_secs(30), || async {
        client.jobs().await.ok()?.into_iter().find(|j| j.owner == "bob").map(|j| j.id)
    })
    .await;

    // The EP comes back: its first round has room for two 1-core jobs, and fair share gives
    // one of them to Bob. Alice's spins hold a core for 120 s each, so Bob's job finishing
    // well before that shows it was placed in that first round.
    let enabled_at = Instant::now();
    client.ep_action("ep-local-1", "enable", &action("flood queued")).await.expect("enable");
    let job = wait_for("bob's job to complete", Duration::from_secs(60), || async {
        client.jobs().await.ok()?.into_iter().find(|j| j.id == bobs && j.state == JobState::Completed)
    })
    .await;
    let waited = enabled_at.elapsed();
    println!("bob's job completed {:.0} ms after the EP was enabled", waited.as_secs_f64() * 1000.0);
    assert!(waited < Duration::from_secs(60), "took {waited:?}");
    assert_eq!(job.attempts, 1);
    // The EP's cores now run two of Alice's jobs (one from the first round, beside Bob's, and one
    // that took Bob's core when his job ended), and it may hold up to four more of hers queued
    // (prefetch: dispatched in the first round, started only as cores free). None of
    // hers was dispatched ahead of his: he had a core in the first round (and one attempt: a
    // job of his queued behind 120 s spinners would have been handed back and run again).
    let bob = &client.job_history(&bobs).await.expect("history")[0];
    let eps = client.eps().await.expect("eps");
    let ep = eps.iter().find(|e| e.name == "ep-local-1").expect("the site EP");
    assert!((2..=6).contains(&ep.running.len()), "two cores plus at most four prefetched: {ep:?}");
    let mut starts = Vec::new();
    for id in &ep.running {
        let h = client.job_history(id).await.expect("history");
        assert_eq!(h.len(), 1);
        starts.push(h[0].started_at_ms);
    }
    starts.sort();
    assert!(
        starts[0].abs_diff(bob.started_at_ms) <= 50,
        "first round: alice {} vs bob {}",
        starts[0],
        bob.started_at_ms
    );
    assert!(
        starts.iter().all(|s| s + 50 >= bob.started_at_ms),
        "none of alice's dispatched ahead of bob's ({}): {starts:?}",
        bob.started_at_ms
    );
    stack.stop().await.expect("clean stop");
}
