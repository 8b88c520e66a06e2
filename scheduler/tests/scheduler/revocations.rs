//! Revocations: of a submit token, an owner and an EP's attach token, refused everywhere at once.

use super::*;

#[tokio::test]
async fn revoking_a_submit_token_refuses_it_everywhere_and_removes_its_jobs() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let mut claims = fx.claims("alice");
    claims.jobs = 3;
    let token = fx.gw.sign(&claims).expect("sign");

    let (status, v) = server.preflight(&token).await;
    assert_eq!((status, v["remaining"].as_u64()), (StatusCode::OK, Some(3)), "{v}");
    let job = server.submit(&token, &fx.request("e1")).await.job_id;
    let (status, v) = server.preflight(&token).await;
    assert_eq!((status, v["remaining"].as_u64()), (StatusCode::OK, Some(2)), "preflight used nothing: {v}");
    let single = fx.token("bob");
    let bobs = server.submit(&single, &fx.request("b1")).await.job_id;
    let (status, v) = server.preflight(&single).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{v}");
    assert_eq!(error_of(&v), "token already used (1 of 1 jobs)");
    let (status, v) = server.preflight("not-a-jwt").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{v}");

    // Only an admin may revoke, and only with a sound request.
    let leaked = serde_json::json!({"target": {"kind": "jti", "value": claims.jti}, "reason": "leaked"});
    let (status, v) = server.post("/v1/revocations", None, Some(&leaked)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{v}");
    let (status, _) = server.post("/v1/revocations", Some(&token), Some(&leaked)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let invalid = [
        (serde_json::json!({"target": {"kind": "jti", "value": ""}, "reason": "r"}), "value"),
        (serde_json::json!({"target": {"kind": "owner", "value": "x".repeat(257)}, "reason": "r"}), "value"),
        (serde_json::json!({"target": {"kind": "issuer", "value": GW}, "reason": "r".repeat(1025)}), "reason"),
        (serde_json::json!({"target": {"kind": "user", "value": "x"}, "reason": "r"}), "invalid revocation"),
    ];
    for (body, expected) in &invalid {
        let (status, v) = server.post("/v1/revocations", Some(ADMIN), Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert!(error_of(&v).contains(expected), "{body}: {v}");
    }
    let (_, v) = server.get("/v1/revocations", Some(ADMIN)).await;
    assert_eq!(v, serde_json::json!([]), "refused requests record nothing");

    let r = server.revoke(RevocationTarget::Jti(claims.jti.clone()), "leaked").await;
    assert_eq!((r.removed_jobs, r.stopped_jobs, r.closed_eps), (vec![job.clone()], vec![], vec![]));
    assert_eq!((r.by.as_str(), r.reason.as_str()), ("admin", "leaked"));
    let removed = server.job(&job).await;
    assert_eq!((removed.state, removed.reason.as_str()), (JobState::Removed, "token revoked: leaked"));
    assert_eq!(server.job(&bobs).await.state, JobState::Idle);
    for (status, v) in [server.submit_raw(Some(&token), &fx.request("e2")).await, server.preflight(&token).await] {
        assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
        assert_eq!(error_of(&v), "token revoked: leaked");
    }
    let (status, v) = server.get("/v1/revocations", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{v}");

    // Recorded: it survives a restart.
    server.stop().await;
    let server = Server::start(&fx.path()).await;
    let (status, v) = server.submit_raw(Some(&token), &fx.request("e3")).await;
    assert_eq!((status, error_of(&v)), (StatusCode::FORBIDDEN, "token revoked: leaked"));

    // An issuer: every token it signed, and every idle job they made.
    let r = server.revoke(RevocationTarget::Issuer(GW.into()), "gateway key compromised").await;
    assert_eq!(r.removed_jobs, vec![bobs.clone()]);
    let (status, v) = server.submit_raw(Some(&fx.token("carol")), &fx.request("c1")).await;
    assert_eq!((status, error_of(&v)), (StatusCode::FORBIDDEN, "token revoked: gateway key compromised"));
    let (_, v) = server.get("/v1/revocations", Some(ADMIN)).await;
    let all: Vec<Revocation> = serde_json::from_value(v).expect("revocations");
    let targets: Vec<_> = all.iter().map(|r| r.target.clone()).collect();
    assert_eq!(targets, vec![RevocationTarget::Jti(claims.jti), RevocationTarget::Issuer(GW.into())]);
    assert_eq!(all[1].removed_jobs, vec![bobs]);
    server.stop().await;
}

#[tokio::test]
async fn revoking_an_owner_stops_their_running_jobs_and_closes_their_eps() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let mut site = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut site, "site-ep", 2).await;
    let on_site = server.submit(&fx.token("alice"), &fx.request("a1")).await.job_id;
    assert_eq!(expect_assign(&mut site, "alice").await, on_site);
    let mut alices = server.attach(Some(&fx.attach_token(Some("alice")))).await.expect("attach");
    let alices_id = hello(&mut alices, "alices-ep", 2).await;
    let on_alices = server.submit(&fx.token("alice"), &fx.request("a2")).await.job_id;
    assert_eq!(expect_assign(&mut alices, "alice").await, on_alices);
    let queued = server.submit(&fx.token("alice"), &fx.request("a3")).await.job_id;

    let mut r = server.revoke(RevocationTarget::Owner("alice".into()), "account closed").await;
    r.stopped_jobs.sort();
    let mut stopped = vec![on_site.clone(), on_alices.clone()];
    stopped.sort();
    assert_eq!((r.removed_jobs, r.stopped_jobs, r.closed_eps), (vec![queued.clone()], stopped, vec![alices_id]));
    let cancel = |id: &str| serde_json::json!({"type": "cancel", "job_id": id, "reason": "token revoked: account closed", "ends": true});
    assert_eq!(next_json(&mut site).await, cancel(&on_site));
    assert_eq!(next_json(&mut alices).await, cancel(&on_alices));
    assert_eq!(expect_close(&mut alices).await, (4403, "attach token revoked: account closed".to_owned()));
    for id in [&on_site, &on_alices, &queued] {
        let rec = server.job(id).await;
        assert_eq!((rec.state, rec.reason.as_str()), (JobState::Removed, "token revoked: account closed"), "{id}");
    }

    // The stopped job keeps its room on the site EP until the EP reports; the report is charged
    // but changes nothing else.
    let bobs = server.submit(&fx.token("bob"), &fx.request("b1")).await.job_id;
    expect_silence(&mut site, Duration::from_millis(300)).await;
    let usage = Usage { wall_ms: 2000, cpu_ms: 100, ..Usage::default() };
    let cancelled = Outcome::Cancelled { reason: "token revoked: account closed".into() };
    send(&mut site, &report(&on_site, cancelled, usage)).await;
    assert_eq!(expect_assign(&mut site, "bob").await, bobs);
    let rec = server.job(&on_site).await;
    assert_eq!((rec.state, rec.usage), (JobState::Removed, Some(usage)));
    let (_, v) = server.get("/v1/accounting", Some(ADMIN)).await;
    let accounts: Vec<Account> = serde_json::from_value(v).expect("accounts");
    let alice = accounts.iter().find(|a| a.owner == "alice").expect("alice charged");
    assert_eq!((alice.jobs_completed, alice.jobs_failed), (0, 0));
    assert!((alice.core_seconds - 4.0).abs() < 1e-9, "2 cpus × 2 s: {alice:?}");

    let refused = "attach token revoked: account closed";
    assert_attach_refused_with(&server, Some(&fx.attach_token(Some("alice"))), 403, refused, "alice's EP").await;
    let (status, v) = server.submit_raw(Some(&fx.token("alice")), &fx.request("a4")).await;
    assert_eq!((status, error_of(&v)), (StatusCode::FORBIDDEN, "token revoked: account closed"));

    site.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn revoking_an_eps_attach_token_closes_it_and_its_jobs_run_elsewhere() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let (token, claims) = fx.attach_token_with_claims(300);
    let mut ep = server.attach(Some(&token)).await.expect("attach");
    let ep_id = hello(&mut ep, "ep-1", 2).await;
    let job = server.submit(&fx.token("alice"), &fx.request("e1")).await.job_id;
    assert_eq!(expect_assign(&mut ep, "alice").await, job);

    let r = server.revoke(RevocationTarget::Jti(claims.jti), "stolen laptop").await;
    assert_eq!((r.removed_jobs, r.stopped_jobs, r.closed_eps), (vec![], vec![], vec![ep_id]));
    assert_eq!(expect_close(&mut ep).await, (4403, "attach token revoked: stolen laptop".to_owned()));
    server.wait_for_state(&job, JobState::Idle).await;
    assert_attach_refused_with(&server, Some(&token), 403, "attach token revoked: stolen laptop", "revoked").await;

    let mut other = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut other, "ep-2", 2).await;
    assert_eq!(expect_assign(&mut other, "alice").await, job);
    other.close(None).await.expect("close");
    server.stop().await;
}
