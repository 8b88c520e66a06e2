//! The audit trail in the scheduler's store: every decision leaves its record, written in the
//! decision's own transaction; `GET /v1/audit` answers lineage queries; the trail verifies,
//! online and from a copy of the store; tokens never reach it.

use super::*;
use htfaas_functions::audit::{AuditKind, AuditRecord, VerifyReport, keys_from_jwks, verify};

async fn records(server: &Server, query: &str) -> Vec<AuditRecord> {
    let (status, v) = server.get(&format!("/v1/audit{query}"), Some(ADMIN)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    serde_json::from_value(v).expect("AuditRecords")
}

fn kinds(records: &[AuditRecord]) -> Vec<&str> {
    records.iter().map(|r| r.kind.as_str()).collect()
}

#[tokio::test]
async fn a_jobs_decisions_are_recorded_in_order_linked_and_verifiable() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let claims = fx.claims("alice");
    let token = fx.gw.sign(&claims).expect("sign");
    let job = server.submit(&token, &fx.request("e1")).await.job_id;
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    let session = hello(&mut ep, "ep-1", 4).await;
    assert_eq!(expect_assign(&mut ep, "alice").await, job);
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
    server.wait_for_state(&job, JobState::Completed).await;

    // Exactly these records, in this order, each naming the job, its token, owner and input.
    let by_job = records(&server, &format!("?job={job}")).await;
    assert_eq!(kinds(&by_job), ["job.accepted", "job.dispatched", "job.finished"]);
    for r in &by_job {
        let s = &r.subject;
        assert_eq!(s.job.as_deref(), Some(job.as_str()), "{r:?}");
        assert_eq!(s.token_jti.as_deref(), Some(claims.jti.as_str()), "{r:?}");
        assert_eq!(s.owner.as_deref(), Some("alice"), "{r:?}");
        assert_eq!(s.function.as_deref(), Some("checksum"), "{r:?}");
        assert_eq!(s.digest.as_deref(), Some(fx.digest.as_str()), "{r:?}");
        assert_eq!(s.event_id.as_deref(), Some("e1/s1"), "{r:?}");
        assert!(s.paths.contains(&"/data/raw/a.dat".to_owned()), "{r:?}");
        assert_eq!(r.writer, "scheduler");
    }
    let [accepted, dispatched, finished] = &by_job[..] else { unreachable!("three records") };
    assert_eq!(accepted.detail["output"]["dir"], "/data/out/");
    assert_eq!(accepted.detail["event"]["source"], "dcache");
    assert_eq!(accepted.detail["resources"]["cpus"], 2);
    assert_eq!(
        (&dispatched.detail["ep"], &dispatched.detail["session"], &dispatched.detail["attempt"]),
        (&Value::from("ep-1"), &Value::from(session.as_str()), &Value::from(1))
    );
    assert_eq!(finished.actor.as_deref(), Some("ep-1"));
    assert_eq!(
        finished.detail["input"],
        serde_json::json!({ "path": "/data/raw/a.dat", "bytes": 1000, "sha256": "cd".repeat(32) })
    );
    assert_eq!(finished.detail["outputs"][0]["sha256"], "ab".repeat(32));
    assert!(finished.subject.paths.contains(&"/data/out/a.sum".to_owned()));
    assert_eq!((&finished.detail["state"], &finished.detail["usage"]["wall_ms"]), (&"completed".into(), &3000.into()));
    // The same records by token, by owner, by file; each chained to the one before.
    assert_eq!(records(&server, &format!("?token={}", claims.jti)).await, by_job);
    // The output names its job, and a job's every record goes with it.
    assert_eq!(records(&server, "?file=/data/out/a.sum").await, by_job);
    assert_eq!(records(&server, "?owner=alice&limit=2").await, by_job[..2]);
    assert!(records(&server, "?owner=bob").await.is_empty());
    for pair in by_job.windows(2) {
        assert!(pair[1].seq > pair[0].seq);
    }
    let (status, v) = server.get("/v1/audit?jobs=x", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let (status, _) = server.get("/v1/audit", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let (status, v) = server.get("/v1/audit/verify", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let report: VerifyReport = serde_json::from_value(v).expect("VerifyReport");
    assert!(report.ok() && report.records == 3 && report.last_seq == 3, "{report:?}");
    let (status, jwks) = server.get("/v1/audit/keys", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::OK, "{jwks}");
    let keys = keys_from_jwks(&serde_json::from_value(jwks).expect("JWKS")).expect("keys");
    assert!(keys.contains_key("scheduler-audit-1"));

    ep.close(None).await.expect("close");
    server.stop().await;
    // At shutdown the head is signed: a copy of the store verifies offline, every record
    // covered by a checkpoint (the session's end is recorded too if it had left a job).
    let copy = fx.path().join("copy.sqlite");
    std::fs::copy(fx.path().join("queue.sqlite"), &copy).expect("copy the store");
    let report = verify(&copy, &keys).expect("verify the copy");
    assert!(report.ok(), "{report:?}");
    assert_eq!(report.last_checkpoint_seq, Some(report.last_seq), "{report:?}");
    assert!(fx.path().join("audit-key.pem").exists(), "the key is kept beside the store");
}

#[tokio::test]
async fn refused_submissions_are_recorded_without_the_token() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    // Verified, but over its limits: recorded with its jti, owner, function and event.
    let claims = fx.claims("alice");
    let token = fx.gw.sign(&claims).expect("sign");
    let mut big = fx.request("e1");
    big.resources.cpus = 4;
    let (status, v) = server.submit_raw(Some(&token), &big).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    // Forged: recorded with the jti it claims, never as the token's.
    let (forger, _) = SigningKey::generate(GW_KID).expect("keygen");
    let forged_claims = fx.claims("mallory");
    let forged = forger.sign(&forged_claims).expect("sign");
    let (status, _) = server.submit_raw(Some(&forged), &fx.request("e2")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // No token at all.
    let (status, _) = server.submit_raw(None, &fx.request("e3")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let all = records(&server, "").await;
    assert_eq!(kinds(&all), ["job.refused"; 3]);
    let r = &all[0];
    assert_eq!(r.subject.token_jti.as_deref(), Some(claims.jti.as_str()));
    assert_eq!((r.subject.owner.as_deref(), r.subject.function.as_deref()), (Some("alice"), Some("checksum")));
    assert_eq!((r.subject.job.as_ref(), &r.detail["status"]), (None, &Value::from(403)));
    assert!(r.detail["reason"].as_str().expect("reason").contains("cpus 4 exceeds"), "{r:?}");
    assert_eq!((&all[1].subject.token_jti, &all[1].detail["status"]), (&None, &Value::from(401)));
    assert_eq!(all[1].detail["unverified_jti"], forged_claims.jti.as_str());
    assert_eq!(all[2].detail["reason"], "missing bearer submit token");
    let text = serde_json::to_string(&all).expect("json");
    for t in [&token, &forged] {
        assert!(!text.contains(t.as_str()), "a token reached the trail");
    }
    server.stop().await;
    let mut bytes = std::fs::read(fx.path().join("queue.sqlite")).expect("read");
    bytes.extend(std::fs::read(fx.path().join("queue.sqlite-wal")).unwrap_or_default());
    for t in [&token, &forged] {
        let signature = t.rsplit('.').next().expect("signature");
        assert!(!bytes.windows(signature.len()).any(|w| w == signature.as_bytes()), "a token reached the file");
    }
}

#[tokio::test]
async fn a_flood_of_forged_tokens_is_counted_not_recorded_one_by_one() {
    use htfaas_scheduler::queue::{UNVERIFIED_REFUSALS_BURST, UNVERIFIED_REFUSALS_PER_S};
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let (forger, _) = SigningKey::generate(GW_KID).expect("keygen");
    let forged = forger.sign(&fx.claims("mallory")).expect("sign");
    let sent = 2 * UNVERIFIED_REFUSALS_BURST as u64;
    let started = std::time::Instant::now();
    for i in 0..sent {
        let (status, _) = server.submit_raw(Some(&forged), &fx.request(&format!("f{i}"))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let flood = records(&server, &format!("?limit={}", sent + 10)).await;
    let budget = UNVERIFIED_REFUSALS_BURST + elapsed * UNVERIFIED_REFUSALS_PER_S + 1.0;
    assert!((flood.len() as f64) <= budget && (flood.len() as u64) < sent, "{} records for {sent}", flood.len());
    // A verified refusal is always recorded, whatever the budget.
    let mut big = fx.request("big");
    big.resources.cpus = 4;
    let (status, _) = server.submit_raw(Some(&fx.gw.sign(&fx.claims("alice")).expect("sign")), &big).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Once the bucket refills, the next forged refusal is recorded and says how many were not.
    tokio::time::sleep(std::time::Duration::from_secs_f64(2.0 / UNVERIFIED_REFUSALS_PER_S)).await;
    let (status, _) = server.submit_raw(Some(&forged), &fx.request("last")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let all = records(&server, &format!("?limit={}", sent + 10)).await;
    assert_eq!(all.len(), flood.len() + 2, "the verified refusal and the last forged one");
    assert_eq!(all[flood.len()].subject.owner.as_deref(), Some("alice"));
    let counted: u64 = all.iter().map(|r| 1 + r.detail["unrecorded_before"].as_u64().unwrap_or(0)).sum();
    assert_eq!(counted, sent + 2, "every refusal is either a record or counted in the next one");
    server.stop().await;
}

#[tokio::test]
async fn admin_actions_record_the_admin_and_the_reason() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let job = server.submit(&fx.token("alice"), &fx.request("e1")).await.job_id;
    server.act(&job, "hold", "disk full").await;
    server.act(&job, "release", "disk cleaned").await;
    server.act(&job, "remove", "not needed").await;
    let trail = records(&server, &format!("?job={job}")).await;
    assert_eq!(kinds(&trail), ["job.accepted", "job.held", "job.released", "job.removed"]);
    for r in &trail[1..] {
        assert_eq!(r.actor.as_deref(), Some("admin"), "{r:?}");
    }
    assert_eq!((&trail[1].detail["reason"], &trail[1].detail["hold_code"]), (&"disk full".into(), &1.into()));
    assert_eq!(trail[2].detail["reason"], "disk cleaned");
    assert_eq!(trail[3].detail["reason"], "removed by admin: not needed");

    // EP and fair-share actions, and a revocation, name the admin too.
    let body = serde_json::json!({ "reason": "maintenance" });
    let (status, v) = server.post("/v1/eps/ep-9/disable", Some(ADMIN), Some(&body)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, v) =
        server.post("/v1/accounting/bob/factor", Some(ADMIN), Some(&serde_json::json!({"factor": 2.5}))).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let claims = fx.claims("carol");
    let second = server.submit(&fx.gw.sign(&claims).expect("sign"), &fx.request("e2")).await.job_id;
    server.revoke(RevocationTarget::Jti(claims.jti.clone()), "leaked").await;
    let all = records(&server, "").await;
    let tail: Vec<(&str, Option<&str>)> = all[4..].iter().map(|r| (r.kind.as_str(), r.actor.as_deref())).collect();
    assert_eq!(
        tail,
        [
            ("admin.action", Some("admin")),
            ("admin.action", Some("admin")),
            ("job.accepted", None),
            ("token.revoked", Some("admin")),
            ("job.removed", Some("admin")),
        ]
    );
    assert_eq!((&all[4].detail["action"], &all[4].detail["ep"]), (&"ep.disable".into(), &"ep-9".into()));
    assert_eq!((&all[5].detail["factor"], &all[5].subject.owner), (&"2.5".into(), &Some("bob".to_owned())));
    assert_eq!(all[7].kind, AuditKind::TokenRevoked);
    assert_eq!(all[7].subject.token_jti.as_deref(), Some(claims.jti.as_str()));
    assert_eq!(all[8].subject.job.as_deref(), Some(second.as_str()));
    let (_, v) = server.get("/v1/audit/verify", Some(ADMIN)).await;
    assert_eq!(v["first_problem"], Value::Null, "{v}");
    server.stop().await;
}

#[tokio::test]
async fn a_lost_ep_leaves_an_attempt_lost_record() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let job = server.submit(&fx.token("alice"), &fx.request("e1")).await.job_id;
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-1", 4).await;
    assert_eq!(expect_assign(&mut ep, "alice").await, job);
    drop(ep);
    server.wait_for_state(&job, JobState::Idle).await;
    let trail = records(&server, &format!("?job={job}")).await;
    assert_eq!(kinds(&trail), ["job.accepted", "job.dispatched", "attempt.lost"]);
    assert_eq!((&trail[2].detail["then"], &trail[2].detail["attempt"]), (&"requeued".into(), &1.into()));
    assert_eq!(trail[2].detail["ep"], "ep-1");
    server.stop().await;
}
