//! Submission: tokens, limits and requests checked; the idle limit (429); submit latency.

use super::*;

#[tokio::test]
async fn submit_checks_tokens_limits_and_requests() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;

    // A good token: 201, listed idle with owner = sub.
    let token = fx.token("alice");
    let first = server.submit(&token, &fx.request("e1")).await;
    assert!(first.created);
    let (status, list) = server.get("/v1/jobs", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let list: Vec<JobRecord> = serde_json::from_value(list).expect("records");
    assert_eq!(list.len(), 1);
    assert_eq!((list[0].id.as_str(), list[0].owner.as_str()), (first.job_id.as_str(), "alice"));
    assert_eq!(list[0].state, JobState::Idle);
    assert_eq!((list[0].function.as_str(), list[0].version), ("checksum", 3));
    assert_eq!(list[0].input, "http://storage.invalid/data/raw/a.dat");
    assert!(!serde_json::to_string(&list).expect("json").contains("macaroon"));

    // The same token again (another event): used up.
    let (status, v) = server.submit_raw(Some(&token), &fx.request("e2")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(error_of(&v), "token already used (1 of 1 jobs)");

    // The same dedupe key with a fresh token: the first job, not a new one, token not consumed.
    let fresh = fx.token("alice");
    let (status, v) = server.submit_raw(Some(&fresh), &fx.request("e1")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let again: SubmitResponse = serde_json::from_value(v).expect("SubmitResponse");
    assert_eq!((again.job_id.as_str(), again.created), (first.job_id.as_str(), false));
    assert!(server.submit(&fresh, &fx.request("e3")).await.created, "dedupe hit did not consume the token");

    // Tokens that must not verify.
    let mut expired = fx.claims("alice");
    expired.exp = now_s() - 120;
    let mut wrong_aud = fx.claims("alice");
    wrong_aud.aud = ATTACH_AUDIENCE.into();
    let mut untrusted = fx.claims("alice");
    untrusted.iss = "someone-else".into();
    let (forger, _) = SigningKey::generate(GW_KID).expect("keygen");
    let (other_kid, _) = SigningKey::generate("gw-2").expect("keygen");
    let good = fx.token("alice");
    let mut widened = fx.claims("alice");
    widened.cpus = 64;
    let payload =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(&widened).expect("claims json"));
    let parts: Vec<&str> = good.split('.').collect();
    let tampered = format!("{}.{payload}.{}", parts[0], parts[2]);
    let cases = [
        (fx.gw.sign(&expired).expect("sign"), "expired"),
        (fx.gw.sign(&wrong_aud).expect("sign"), "audience"),
        (fx.gw.sign(&untrusted).expect("sign"), "untrusted issuer"),
        (forger.sign(&fx.claims("alice")).expect("sign"), "signature"),
        (other_kid.sign(&fx.claims("alice")).expect("sign"), "unknown signing key"),
        (tampered, "signature"),
        ("not-a-jwt".into(), "malformed"),
    ];
    for (bad, expected) in &cases {
        let (status, v) = server.submit_raw(Some(bad), &fx.request("bad")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{expected}: {v}");
        assert!(error_of(&v).contains(expected), "{expected}: {v}");
    }
    let (status, v) = server.submit_raw(None, &fx.request("bad")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(error_of(&v).contains("missing bearer"), "{v}");

    // Over the token's limits: 403 naming the limit.
    let limited = |f: &dyn Fn(&mut SubmitClaims)| {
        let mut c = fx.claims("alice");
        c.cpus = 1;
        f(&mut c);
        fx.gw.sign(&c).expect("sign")
    };
    let over = [
        (limited(&|_| {}), "cpus 2 exceeds the token's limit of 1"),
        (limited(&|c| (c.cpus, c.memory_mb) = (2, 128)), "memory_mb 256 exceeds the token's limit of 128"),
        (limited(&|c| (c.cpus, c.runtime_s) = (2, 30)), "runtime_s 60 exceeds the token's limit of 30"),
        (limited(&|c| (c.cpus, c.function) = (2, Some(Digest::of(b"other")))), "function digest"),
    ];
    for (t, expected) in &over {
        let (status, v) = server.submit_raw(Some(t), &fx.request("over")).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{expected}: {v}");
        assert!(error_of(&v).contains(expected), "{expected}: {v}");
    }

    // Bad requests: 400.
    let mut bad_name = fx.request("bad-name");
    bad_name.input.as_mut().expect("an input").name = "../x".into();
    let mut bad_out = fx.request("bad-out");
    bad_out.output.url = "http://storage.invalid/data/out".into();
    let mut bad_key = fx.request("");
    bad_key.dedupe_key.clear();
    for (req, expected) in [(bad_name, "input.name"), (bad_out, "output.url"), (bad_key, "dedupe_key")] {
        let (status, v) = server.submit_raw(Some(&fx.token("alice")), &req).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{expected}: {v}");
        assert!(error_of(&v).contains(expected), "{expected}: {v}");
    }
    let (status, v) = server.submit_raw(Some(&fx.token("alice")), &serde_json::json!({"nope": 1})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error_of(&v).contains("invalid request body"), "{v}");

    let huge = serde_json::json!({ "x": "a".repeat(300 * 1024) });
    let (status, v) = server.submit_raw(Some(&fx.token("alice")), &huge).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert!(error_of(&v).contains("request body"), "{v}");
    let (status, v) = server.get("/v1/nope", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(error_of(&v).contains("no such endpoint"), "{v}");

    // Admin endpoints.
    for path in ["/v1/jobs", "/v1/accounting"] {
        let (status, v) = server.get(path, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}: {v}");
        assert!(error_of(&v).contains("missing admin"), "{v}");
        let (status, v) = server.get(path, Some("admin-token-0123456788")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}: {v}");
        assert!(error_of(&v).contains("invalid admin token"), "{v}");
    }
    let (status, v) = server.get("/v1/jobs?limit=1", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v.as_array().map(Vec::len), Some(1));
    let (status, v) = server.get("/v1/jobs?limit=x", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let (status, v) = server.get("/v1/jobs/no-such-job", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a job record is for admins: {v}");
    let (status, v) = server.get("/v1/jobs/no-such-job", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(error_of(&v).contains("not found"));
    let (status, _) = server.get("/healthz", None).await;
    assert_eq!(status, StatusCode::OK);

    server.stop().await;
}

#[tokio::test]
#[ignore = "measurement, not a check"]
async fn submit_latency() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let n = 300;
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let t = fx.token("alice");
        let req = fx.request(&format!("e{i}"));
        let start = Instant::now();
        server.submit(&t, &req).await;
        times.push(start.elapsed());
    }
    times.sort();
    println!(
        "submit latency over {n}: p50 {:?}, p90 {:?}, p99 {:?}",
        times[n / 2],
        times[n * 9 / 10],
        times[n * 99 / 100]
    );
    server.stop().await;
}

/// A request for one core, so that a 1-cpu EP has room for exactly one such job.

#[tokio::test]
async fn the_idle_limit_refuses_new_jobs_with_429_and_keeps_the_token_unused() {
    let fx = Fixture::new();
    let limits = OwnerLimits { max_idle: Some(2), max_running: None };
    let server = Server::start_with(&fx.path(), limits).await;
    let first = server.submit(&fx.token("alice"), &fx.request("e1")).await.job_id;
    server.submit(&fx.token("alice"), &fx.request("e2")).await;

    // A third one is refused, transiently, and the single-use token is not spent.
    let token = fx.token("alice");
    let (status, v) = server.submit_raw(Some(&token), &fx.request("e3")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(error_of(&v), "owner alice has 2 idle jobs, the limit is 2; try again later");
    assert_eq!(server.preflight(&token).await, (StatusCode::OK, serde_json::json!({"remaining": 1})));
    // A dedupe hit is answered as before; other owners are not limited by alice's queue.
    let (status, v) = server.submit_raw(Some(&fx.token("alice")), &fx.request("e1")).await;
    assert_eq!(
        (status, v["job_id"].as_str(), v["created"].as_bool()),
        (StatusCode::OK, Some(first.as_str()), Some(false))
    );
    server.submit(&fx.token("bob"), &fx.request("b1")).await;

    // Once one of alice's jobs runs, the same token passes.
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-2-cores", 2).await;
    assert_eq!(expect_assign(&mut ep, "alice").await, first);
    server.submit(&token, &fx.request("e3")).await;
    let (status, v) = server.submit_raw(Some(&token), &fx.request("e4")).await;
    assert_eq!((status, error_of(&v)), (StatusCode::UNAUTHORIZED, "token already used (1 of 1 jobs)"));

    ep.close(None).await.expect("close");
    server.stop().await;
}

/// `POST /v1/jobs/batch` answers each job as `POST /v1/jobs` would have, in order: a job's
/// rights are its own token's (a used-up token, a forged one, one over its limits or naming
/// another digest refuse only that job); jobs of one batch see each other (a token allowing
/// one job submits only the first that uses it; a dedupe key repeated makes one job); the
/// refusals are recorded, and no token is. A body that is no batch, or an empty or too large
/// one, is refused whole.
#[tokio::test]
async fn a_batch_answers_each_job_as_if_posted_alone() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let (a, b, c) = (fx.token("alice"), fx.token("bob"), fx.token("alice"));
    let (forger, _) = SigningKey::generate(GW_KID).expect("keygen");
    let forged = forger.sign(&fx.claims("mallory")).expect("sign");
    let over = {
        let mut claims = fx.claims("alice");
        claims.cpus = 1;
        fx.gw.sign(&claims).expect("sign")
    };
    let other_digest = {
        let mut claims = fx.claims("alice");
        claims.function = Some(Digest::of(b"another module"));
        fx.gw.sign(&claims).expect("sign")
    };
    let jobs = [
        (a.as_str(), "e1"),
        (a.as_str(), "e2"),
        (forged.as_str(), "e3"),
        (over.as_str(), "e4"),
        (other_digest.as_str(), "e5"),
        (b.as_str(), "b1"),
        (c.as_str(), "e1"),
    ];
    let body = serde_json::json!({
        "jobs": jobs.iter().map(|(t, k)| serde_json::json!({"token": t, "request": fx.request(k)})).collect::<Vec<_>>()
    });
    let (status, v) = server.post("/v1/jobs/batch", None, Some(&body)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let results = v["results"].as_array().expect("results").clone();
    let answer = |i: usize| (results[i]["status"].as_u64().unwrap_or(0), results[i]["error"].as_str().unwrap_or(""));
    assert_eq!(results.len(), jobs.len(), "{v}");
    assert_eq!(answer(0).0, 201, "{v}");
    assert_eq!(answer(1), (401, "token already used (1 of 1 jobs)"));
    assert_eq!(answer(2).0, 401);
    assert!(answer(2).1.contains("signature"), "{v}");
    assert_eq!(answer(3), (403, "cpus 2 exceeds the token's limit of 1"));
    assert_eq!(answer(4).0, 403);
    assert!(answer(4).1.contains("is not the token's"), "{v}");
    assert_eq!(answer(5).0, 201, "{v}");
    // The dedupe key of the first job, with a fresh token: that job, and the token unspent.
    let first = results[0]["job"]["job_id"].as_str().expect("job id");
    assert_eq!((answer(6).0, results[6]["job"]["job_id"].as_str()), (200, Some(first)), "{v}");
    assert_eq!(results[6]["job"]["created"].as_bool(), Some(false));
    assert_eq!(server.preflight(&c).await, (StatusCode::OK, serde_json::json!({"remaining": 1})));

    let (_, list) = server.get("/v1/jobs", Some(ADMIN)).await;
    let list: Vec<JobRecord> = serde_json::from_value(list).expect("records");
    let mut owners: Vec<&str> = list.iter().map(|j| j.owner.as_str()).collect();
    owners.sort_unstable();
    assert_eq!(owners, ["alice", "bob"]);

    // Each refusal is recorded (the forged token's within the unverified budget), no token is.
    let (status, trail) = server.get("/v1/audit?limit=1000", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::OK);
    let mut refused: Vec<u64> = trail
        .as_array()
        .expect("records")
        .iter()
        .filter(|r| r["kind"] == "job.refused")
        .filter_map(|r| r["detail"]["status"].as_u64())
        .collect();
    refused.sort_unstable();
    assert_eq!(refused, [401, 401, 403, 403], "{trail}");
    let text = trail.to_string();
    for t in [&a, &b, &c, &forged, &over, &other_digest] {
        assert!(!text.contains(t.as_str()), "a token is in the audit trail");
    }

    // Refused whole: no batch, an empty one, one too large.
    let too_many = serde_json::json!({
        "jobs": (0..=htfaas_functions::proto::MAX_SUBMIT_BATCH)
            .map(|i| serde_json::json!({"token": a, "request": fx.request(&format!("n{i}"))}))
            .collect::<Vec<_>>()
    });
    for (case, body) in [
        ("not a batch", serde_json::json!({"job": []})),
        ("empty", serde_json::json!({"jobs": []})),
        ("too many", too_many),
    ] {
        let (status, v) = server.post("/v1/jobs/batch", None, Some(&body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{case}: {v}");
    }
    server.stop().await;
}
