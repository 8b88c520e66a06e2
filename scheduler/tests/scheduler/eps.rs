//! Attached EPs: jobs run and charged, owner-restricted and annex EPs, slots, a departed EP,
//! restarts, attenuated and bound macaroons, attach-token expiry and the per-owner running limit.

use super::*;

#[tokio::test]
async fn an_attached_ep_runs_a_job_and_its_owner_is_charged() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;

    // Refused before the upgrade.
    let (forger, _) = SigningKey::generate(ATTACH_KID).expect("keygen");
    let forged = mint_attach_token(&forger, NAME, "site", None, None, 300).expect("mint");
    let expired = fx
        .attach_key()
        .sign(&AttachClaims {
            iss: NAME.into(),
            sub: "site".into(),
            aud: ATTACH_AUDIENCE.into(),
            exp: now_s() - 120,
            iat: now_s() - 400,
            jti: new_jti(),
            owner: None,
            annex: None,
        })
        .expect("sign");
    let mut wrong_aud = fx.claims("site");
    wrong_aud.iss = NAME.into();
    let wrong_aud = fx.attach_key().sign(&wrong_aud).expect("sign");
    assert_attach_refused(&server, None, "no token").await;
    assert_attach_refused(&server, Some(&forged), "forged").await;
    assert_attach_refused(&server, Some(&expired), "expired").await;
    assert_attach_refused(&server, Some(&wrong_aud), "wrong audience").await;
    assert_attach_refused(&server, Some(&fx.token("alice")), "a submit token").await;

    let job = server.submit(&fx.token("alice"), &fx.request("e1")).await.job_id;
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-1", 4).await;
    assert_eq!(expect_assign(&mut ep, "alice").await, job);
    let running = server.job(&job).await;
    assert_eq!((running.state, running.ep.as_deref()), (JobState::Running, Some("ep-1")));

    // Noise is ignored: a report for a job not running here, garbage, a second hello.
    send(&mut ep, &report("not-a-job", Outcome::Exited { exit_code: 0 }, Usage::default())).await;
    ep.send(Message::text("{garbage")).await.expect("send");
    ep.send(Message::binary(vec![1, 2, 3])).await.expect("send");
    send(
        &mut ep,
        &EpMsg::Hello(Hello {
            name: "x".into(),
            slots: Resources::default(),
            protocol: 1,
            annex: None,
            labels: Default::default(),
            prefetch: None,
            runtimes: vec![htfaas_functions::manifest::RuntimeKind::Wasm],
            images: Vec::new(),
            renews_attach: false,
        }),
    )
    .await;

    let usage = Usage {
        wall_ms: 3000,
        cpu_ms: 2500,
        peak_memory_bytes: 1 << 20,
        bytes_in: 1000,
        bytes_out: 64,
        instructions: None,
        phases: Default::default(),
    };
    send(&mut ep, &report(&job, Outcome::Exited { exit_code: 0 }, usage)).await;
    let done = server.wait_for_state(&job, JobState::Completed).await;
    assert_eq!(done.usage, Some(usage));
    assert_eq!(done.exit_code, Some(0));
    assert_eq!(done.outputs.len(), 1);
    assert!(done.finished_at_ms.is_some() && done.started_at_ms.is_some());
    let (status, log) = server.get(&format!("/v1/jobs/{job}/log"), Some(ADMIN)).await;
    assert_eq!((status, log["log"].as_str()), (StatusCode::OK, Some("done\n")));
    let (status, _) = server.get("/v1/jobs/nope/log", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = server.get(&format!("/v1/jobs/{job}/log"), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // A second, failing job on the same session (which survived the noise).
    let job2 = server.submit(&fx.token("alice"), &fx.request("e2")).await.job_id;
    assert_eq!(expect_assign(&mut ep, "alice").await, job2);
    let usage2 = Usage {
        wall_ms: 1000,
        cpu_ms: 500,
        peak_memory_bytes: 0,
        bytes_in: 10,
        bytes_out: 0,
        instructions: None,
        phases: Default::default(),
    };
    send(&mut ep, &report(&job2, Outcome::Trapped { message: "unreachable".into() }, usage2)).await;
    let failed = server.wait_for_state(&job2, JobState::Failed).await;
    assert_eq!(failed.reason, "trapped: unreachable");
    // A duplicate report changes nothing.
    send(&mut ep, &report(&job2, Outcome::Exited { exit_code: 0 }, usage2)).await;

    let (status, v) = server.get("/v1/accounting", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let accounts: Vec<Account> = serde_json::from_value(v).expect("accounts");
    assert_eq!(accounts.len(), 1);
    let a = &accounts[0];
    assert_eq!((a.owner.as_str(), a.jobs_completed, a.jobs_failed), ("alice", 1, 1));
    assert!((a.core_seconds - 8.0).abs() < 1e-9, "2 cpus × (3 s + 1 s): {a:?}");
    assert!((a.cpu_seconds - 3.0).abs() < 1e-9, "{a:?}");
    assert!((a.wall_seconds - 4.0).abs() < 1e-9, "{a:?}");
    assert_eq!((a.bytes_in, a.bytes_out), (1010, 64));

    ep.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn an_owner_restricted_ep_gets_only_its_owners_jobs() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let bobs = server.submit(&fx.token("bob"), &fx.request("b1")).await.job_id;
    let alices = server.submit(&fx.token("alice"), &fx.request("a1")).await.job_id;

    let mut mine = server.attach(Some(&fx.attach_token(Some("alice")))).await.expect("attach");
    hello(&mut mine, "alices-ep", 8).await;
    assert_eq!(expect_assign(&mut mine, "alice").await, alices);
    expect_silence(&mut mine, Duration::from_millis(300)).await;
    assert_eq!(server.job(&bobs).await.state, JobState::Idle);

    let mut site = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut site, "site-ep", 8).await;
    assert_eq!(expect_assign(&mut site, "bob").await, bobs);

    mine.close(None).await.expect("close");
    site.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn a_departed_eps_job_runs_again_elsewhere() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let job = server.submit(&fx.token("alice"), &fx.request("e1")).await.job_id;

    let mut first = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut first, "ep-1", 2).await;
    assert_eq!(expect_assign(&mut first, "alice").await, job);
    drop(first);
    let idle = server.wait_for_state(&job, JobState::Idle).await;
    assert_eq!(idle.ep, None);

    let mut second = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut second, "ep-2", 2).await;
    assert_eq!(expect_assign(&mut second, "alice").await, job);
    send(&mut second, &report(&job, Outcome::Exited { exit_code: 0 }, Usage::default())).await;
    let done = server.wait_for_state(&job, JobState::Completed).await;
    assert_eq!(done.ep.as_deref(), Some("ep-2"));

    second.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn an_ep_gets_no_more_than_its_slots() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let mut jobs = Vec::new();
    for i in 0..3 {
        jobs.push(server.submit(&fx.token("alice"), &fx.request(&format!("e{i}"))).await.job_id);
    }
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-4-cores", 4).await;
    let a = expect_assign(&mut ep, "alice").await;
    let b = expect_assign(&mut ep, "alice").await;
    assert_eq!(vec![a.clone(), b], jobs[..2].to_vec(), "oldest first");
    expect_silence(&mut ep, Duration::from_millis(300)).await;
    send(&mut ep, &report(&a, Outcome::Exited { exit_code: 0 }, Usage::default())).await;
    assert_eq!(expect_assign(&mut ep, "alice").await, jobs[2]);
    ep.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn queued_jobs_survive_a_restart() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let job = server.submit(&fx.token("alice"), &fx.request("e1")).await.job_id;
    server.stop().await;

    let server = Server::start(&fx.path()).await;
    assert_eq!(server.job(&job).await.state, JobState::Idle);
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-1", 2).await;
    assert_eq!(expect_assign(&mut ep, "alice").await, job);
    // Stopping with the job running puts it back to idle, durably.
    server.stop().await;
    let server = Server::start(&fx.path()).await;
    assert_eq!(server.job(&job).await.state, JobState::Idle);
    server.stop().await;
}

#[tokio::test]
async fn annex_jobs_run_only_on_their_annexs_eps() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let mut claims = fx.claims("alice");
    claims.group = Some("physics".into());
    let mut annex_req = fx.request("gpu-1");
    annex_req.annex = Some("gpu".into());
    let annex_job = server.submit(&fx.gw.sign(&claims).expect("sign"), &annex_req).await.job_id;
    let rec = server.job(&annex_job).await;
    assert_eq!(
        (rec.token_issuer.as_str(), rec.group.as_deref(), rec.annex.as_deref()),
        (GW, Some("physics"), Some("gpu"))
    );
    let mut bad = fx.request("bad-annex");
    bad.annex = Some("GPU!".into());
    let (status, v) = server.submit_raw(Some(&fx.token("alice")), &bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(error_of(&v).contains("annex"), "{v}");

    // A site EP gets the plain job, never the annex job.
    let mut site = server.attach(Some(&fx.annex_token(None))).await.expect("attach");
    hello(&mut site, "site-ep", 8).await;
    expect_silence(&mut site, Duration::from_millis(300)).await;
    let plain = server.submit(&fx.token("alice"), &fx.request("plain-1")).await.job_id;
    assert_eq!(expect_assign(&mut site, "alice").await, plain);
    site.close(None).await.expect("close");

    // Another annex's EP gets nothing; the annex's own EP (whose Hello need not repeat the
    // annex) gets the annex job and no plain job.
    let mut other = server.attach(Some(&fx.annex_token(Some("other")))).await.expect("attach");
    hello_annex(&mut other, "other-ep", 8, Some("other")).await;
    let mut gpu = server.attach(Some(&fx.annex_token(Some("gpu")))).await.expect("attach");
    hello(&mut gpu, "gpu-ep", 8).await;
    assert_eq!(expect_assign(&mut gpu, "alice").await, annex_job);
    let plain2 = server.submit(&fx.token("alice"), &fx.request("plain-2")).await.job_id;
    expect_silence(&mut gpu, Duration::from_millis(300)).await;
    expect_silence(&mut other, Duration::from_millis(10)).await;
    assert_eq!(server.job(&plain2).await.state, JobState::Idle);

    // A Hello naming another annex than the token's is refused at once.
    let cases = [
        (Some("gpu"), r#"annex mismatch: the attach token is for annex "gpu", the EP asked for "cpu""#),
        (None, r#"annex mismatch: the attach token is for no annex, the EP asked for "cpu""#),
    ];
    for (token_annex, expected) in cases {
        let mut ws = server.attach(Some(&fx.annex_token(token_annex))).await.expect("attach");
        send(&mut ws, &hello_msg("wrong-annex", 8, Some("cpu"))).await;
        assert_eq!(expect_close(&mut ws).await, (4403, expected.to_owned()));
    }
    assert_eq!(server.job(&plain2).await.state, JobState::Idle, "a refused session took no job");

    other.close(None).await.expect("close");
    gpu.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn assignments_carry_macaroons_attenuated_to_the_jobs_lifetime() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let req = fx.request("e1");
    let job = server.submit(&fx.token("alice"), &req).await.job_id;
    let runtime = req.resources.runtime_s;
    let root = RootKey::derive(STORAGE_SECRET);

    let t0 = htfaas_functions::token::now_s();
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-1", 2).await;
    let a = expect_assignment(&mut ep).await;
    let t1 = htfaas_functions::token::now_s();
    assert_eq!(a.job_id, job);
    let earliest = format!("before:{}", utc_timestamp(t0 + runtime + MACAROON_GRACE_S));
    let latest = format!("before:{}", utc_timestamp(t1 + runtime + MACAROON_GRACE_S));
    for (sent, stored) in [
        (&a.input.as_ref().expect("an input").macaroon, &req.input.as_ref().expect("an input").macaroon),
        (&a.output.macaroon, &req.output.macaroon),
    ] {
        let original = inspect(stored).expect("stored macaroon parses");
        let caveats = inspect(sent).expect("sent macaroon parses");
        assert_eq!(caveats.len(), original.len() + 1, "{caveats:?}");
        assert!(!caveats.iter().any(|c| c.starts_with("ip:")), "not asked to bind, yet bound: {caveats:?}");
        assert_eq!(caveats[..original.len()], original[..]);
        let before = &caveats[original.len()];
        assert!(
            before.as_str() >= earliest.as_str() && before.as_str() <= latest.as_str(),
            "{before} not in [{earliest}, {latest}]"
        );
        let verified = authenticate(sent, &root).expect("the storage's root key still verifies the chain");
        assert_eq!(verified.caveats, caveats);
    }

    // The stored macaroons are unchanged: the job run again gets one `before:`, not two.
    drop(ep);
    server.wait_for_state(&job, JobState::Idle).await;
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-2", 2).await;
    let again = expect_assignment(&mut ep).await;
    let caveats = inspect(&again.input.as_ref().expect("an input").macaroon).expect("parses");
    assert_eq!(caveats.iter().filter(|c| c.starts_with("before:")).count(), 1, "{caveats:?}");
    send(&mut ep, &report(&job, Outcome::Exited { exit_code: 0 }, Usage::default())).await;
    server.wait_for_state(&job, JobState::Completed).await;

    // A macaroon that does not parse fails its job at once; nothing is sent.
    let mut broken = fx.request("e2");
    broken.output.macaroon = "not-a-macaroon".into();
    let bad = server.submit(&fx.token("alice"), &broken).await.job_id;
    let failed = server.wait_for_state(&bad, JobState::Failed).await;
    assert!(failed.reason.starts_with("macaroon could not be attenuated: "), "{}", failed.reason);
    expect_silence(&mut ep, Duration::from_millis(300)).await;

    ep.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn assignments_bind_macaroons_to_the_eps_address_when_the_job_asks() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let root = RootKey::derive(STORAGE_SECRET);
    let mut req = fx.request("bound");
    req.bind_ep_address = true;
    let job = server.submit(&fx.token("alice"), &req).await.job_id;

    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-1", 2).await;
    let a = expect_assignment(&mut ep).await;
    assert_eq!(a.job_id, job);
    for (sent, stored) in [
        (&a.input.as_ref().expect("an input").macaroon, &req.input.as_ref().expect("an input").macaroon),
        (&a.output.macaroon, &req.output.macaroon),
    ] {
        let original = inspect(stored).expect("stored macaroon parses");
        let caveats = inspect(sent).expect("sent macaroon parses");
        // The stored caveats, then the deadline, then the address this EP attached from.
        assert_eq!(caveats[..original.len()], original[..]);
        let added: Vec<&str> = caveats[original.len()..].iter().map(String::as_str).collect();
        assert!(matches!(added[..], [before, "ip:127.0.0.1"] if before.starts_with("before:")), "{caveats:?}");
        let verified = authenticate(sent, &root).expect("the storage's root key still verifies the chain");
        assert_eq!(verified.caveats, caveats);
    }
    send(&mut ep, &report(&job, Outcome::Exited { exit_code: 0 }, Usage::default())).await;
    server.wait_for_state(&job, JobState::Completed).await;

    // A job that does not ask gets no `ip:` caveat from the same EP.
    let unbound = server.submit(&fx.token("alice"), &fx.request("unbound")).await.job_id;
    let a = expect_assignment(&mut ep).await;
    assert_eq!(a.job_id, unbound);
    for m in [&a.input.as_ref().expect("an input").macaroon, &a.output.macaroon] {
        let caveats = inspect(m).expect("parses");
        assert!(!caveats.iter().any(|c| c.starts_with("ip:")), "{caveats:?}");
        assert!(caveats.last().is_some_and(|c| c.starts_with("before:")), "{caveats:?}");
    }

    ep.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn a_session_is_closed_when_its_attach_token_expires() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let job = server.submit(&fx.token("alice"), &fx.request("e1")).await.job_id;
    let (token, claims) = fx.attach_token_with_claims(2);
    let mut ep = server.attach(Some(&token)).await.expect("attach");
    // It says it renews its token (so the job, longer than the token, is placed on it) and
    // then never asks.
    let EpMsg::Hello(h) = hello_msg("short-lived", 2, None) else { unreachable!("a hello") };
    send(&mut ep, &EpMsg::Hello(Hello { renews_attach: true, ..h })).await;
    assert_eq!(next_json(&mut ep).await["type"], "welcome");
    assert_eq!(expect_assign(&mut ep, "alice").await, job);
    assert_eq!(expect_close(&mut ep).await, (4401, "attach token expired".to_owned()));
    let now = htfaas_functions::token::now_s();
    assert!(now >= claims.exp, "closed at {now}, before exp {}", claims.exp);
    assert!(now <= claims.exp + 2, "closed at {now}, long after exp {}", claims.exp);
    server.wait_for_state(&job, JobState::Idle).await;
    server.stop().await;
}

/// Measures submit latency (commit with synchronous=FULL included). Run with `--ignored --nocapture`.

#[tokio::test]
async fn the_running_limit_holds_back_one_owner_while_others_run() {
    let fx = Fixture::new();
    let limits = OwnerLimits { max_idle: None, max_running: Some(1) };
    let server = Server::start_with(&fx.path(), limits).await;
    let mut alices = Vec::new();
    for i in 0..3 {
        alices.push(server.submit(&fx.token("alice"), &one_cpu(&fx, &format!("a{i}"))).await.job_id);
    }
    let bobs = server.submit(&fx.token("bob"), &one_cpu(&fx, "b1")).await.job_id;

    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-4-cores", 4).await;
    let mut started = vec![expect_assign(&mut ep, "alice").await, expect_assign(&mut ep, "bob").await];
    started.sort();
    let mut expected = vec![alices[0].clone(), bobs.clone()];
    expected.sort();
    assert_eq!(started, expected, "one of alice's (the oldest) and bob's, though four cores are free");
    expect_silence(&mut ep, Duration::from_millis(300)).await;
    for id in &alices[1..] {
        assert_eq!(server.job(id).await.state, JobState::Idle);
    }

    // Alice's ends: her next one starts, and only that one.
    send(&mut ep, &report(&alices[0], Outcome::Exited { exit_code: 0 }, Usage::default())).await;
    assert_eq!(expect_assign(&mut ep, "alice").await, alices[1]);
    expect_silence(&mut ep, Duration::from_millis(300)).await;
    assert_eq!(server.job(&alices[2]).await.state, JobState::Idle);

    ep.close(None).await.expect("close");
    server.stop().await;
}
