//! Admin job actions: hold, release and remove, idle, running and held, and their checks.

use super::*;

#[tokio::test]
async fn a_held_idle_job_is_not_dispatched_until_released() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let job = server.submit(&fx.token("alice"), &fx.request("h1")).await.job_id;
    let held = server.act(&job, "hold", "input looks wrong").await;
    assert_eq!(
        (held.state, held.reason.as_str(), held.hold_code),
        (JobState::Held, "input looks wrong", Some(HOLD_CODE_BY_ADMIN))
    );
    let (status, v) = server.act_raw(&job, "hold", "again").await;
    assert_eq!((status, error_of(&v)), (StatusCode::CONFLICT, format!("job {job} is already held").as_str()));

    // A free EP does not get it while it is held.
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-1", 4).await;
    expect_silence(&mut ep, Duration::from_millis(300)).await;
    assert_eq!(server.job(&job).await.state, JobState::Held);

    let released = server.act(&job, "release", "checked").await;
    assert_eq!((released.state, released.reason.as_str(), released.hold_code), (JobState::Idle, "", None));
    assert_eq!(expect_assign(&mut ep, "alice").await, job);
    let (status, v) = server.act_raw(&job, "release", "again").await;
    assert_eq!(
        (status, error_of(&v)),
        (StatusCode::CONFLICT, format!("job {job} is running; only held jobs can be released").as_str())
    );

    ep.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn holding_a_running_job_stops_it_and_frees_its_ep_when_it_reports() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-1-cpu", 1).await;
    let first = server.submit(&fx.token("alice"), &one_cpu(&fx, "r1")).await.job_id;
    assert_eq!(expect_assign(&mut ep, "alice").await, first);

    let held = server.act(&first, "hold", "storage maintenance").await;
    assert_eq!(
        (held.state, held.reason.as_str(), held.hold_code),
        (JobState::Held, "storage maintenance", Some(HOLD_CODE_BY_ADMIN))
    );
    assert_eq!(next_json(&mut ep).await, cancel_msg(&first, "storage maintenance"));

    // Its core stays reserved until the EP reports the stop; then the next job gets it.
    let second = server.submit(&fx.token("bob"), &one_cpu(&fx, "r2")).await.job_id;
    expect_silence(&mut ep, Duration::from_millis(300)).await;
    let usage = Usage { wall_ms: 3000, cpu_ms: 100, ..Usage::default() };
    send(&mut ep, &report(&first, Outcome::Cancelled { reason: "storage maintenance".into() }, usage)).await;
    assert_eq!(expect_assign(&mut ep, "bob").await, second);
    let rec = server.job(&first).await;
    assert_eq!((rec.state, rec.reason.as_str(), rec.hold_code), (JobState::Held, "storage maintenance", Some(1)));
    assert_eq!(rec.usage, Some(usage));
    let (_, v) = server.get("/v1/accounting", Some(ADMIN)).await;
    let accounts: Vec<Account> = serde_json::from_value(v).expect("accounts");
    let alice = accounts.iter().find(|a| a.owner == "alice").expect("alice charged");
    assert_eq!((alice.jobs_completed, alice.jobs_failed), (0, 0));
    assert!((alice.core_seconds - 3.0).abs() < 1e-9, "1 cpu × 3 s: {alice:?}");

    // Released, it runs again once the core is free.
    let released = server.act(&first, "release", "maintenance over").await;
    assert_eq!((released.state, released.ep, released.usage), (JobState::Idle, None, None));
    expect_silence(&mut ep, Duration::from_millis(300)).await;
    send(&mut ep, &report(&second, Outcome::Exited { exit_code: 0 }, Usage::default())).await;
    assert_eq!(expect_assign(&mut ep, "alice").await, first);
    send(&mut ep, &report(&first, Outcome::Exited { exit_code: 0 }, Usage::default())).await;
    server.wait_for_state(&first, JobState::Completed).await;

    ep.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn removing_idle_running_and_held_jobs() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-1-cpu", 1).await;
    let running = server.submit(&fx.token("alice"), &one_cpu(&fx, "m1")).await.job_id;
    assert_eq!(expect_assign(&mut ep, "alice").await, running);
    let idle = server.submit(&fx.token("alice"), &one_cpu(&fx, "m2")).await.job_id;
    let held = server.submit(&fx.token("alice"), &one_cpu(&fx, "m3")).await.job_id;
    server.act(&held, "hold", "later").await;

    let rec = server.act(&idle, "remove", "duplicate upload").await;
    assert_eq!((rec.state, rec.reason.as_str()), (JobState::Removed, "removed by admin: duplicate upload"));
    let rec = server.act(&held, "remove", "not needed").await;
    assert_eq!(
        (rec.state, rec.reason.as_str(), rec.hold_code),
        (JobState::Removed, "removed by admin: not needed", None)
    );
    let rec = server.act(&running, "remove", "runaway").await;
    assert_eq!((rec.state, rec.reason.as_str()), (JobState::Removed, "removed by admin: runaway"));
    assert_eq!(next_json(&mut ep).await, ending_cancel_msg(&running, "removed by admin: runaway"));
    assert!(server.job(&running).await.finished_at_ms.is_some());

    // Nothing is left to do to a removed job.
    for (verb, only) in [
        ("hold", "only idle or running jobs can be held"),
        ("release", "only held jobs can be released"),
        ("remove", "only idle, running or held jobs can be removed"),
    ] {
        let (status, v) = server.act_raw(&running, verb, "again").await;
        assert_eq!(
            (status, error_of(&v)),
            (StatusCode::CONFLICT, format!("job {running} is removed; {only}").as_str())
        );
    }

    // The stop's report is charged and frees the core; the removed job stays removed.
    let next = server.submit(&fx.token("bob"), &one_cpu(&fx, "m4")).await.job_id;
    expect_silence(&mut ep, Duration::from_millis(300)).await;
    let usage = Usage { wall_ms: 1000, ..Usage::default() };
    send(&mut ep, &report(&running, Outcome::Cancelled { reason: "removed by admin: runaway".into() }, usage)).await;
    assert_eq!(expect_assign(&mut ep, "bob").await, next);
    let rec = server.job(&running).await;
    assert_eq!((rec.state, rec.usage), (JobState::Removed, Some(usage)));

    ep.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn job_actions_check_the_admin_the_reason_the_job_and_its_state() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let job = server.submit(&fx.token("alice"), &fx.request("c1")).await.job_id;
    let body = serde_json::json!({"reason": "r"});
    let path = format!("/v1/jobs/{job}/hold");
    for (bearer, what) in [(None, "no token"), (Some("wrong"), "wrong token"), (Some(&*fx.token("alice")), "submit")] {
        let (status, v) = server.post(&path, bearer, Some(&body)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {v}");
    }
    for verb in ["hold", "release", "remove"] {
        let (status, v) = server.act_raw("no-such-job", verb, "r").await;
        assert_eq!((status, error_of(&v)), (StatusCode::NOT_FOUND, "job \"no-such-job\" not found"), "{verb}");
    }
    for bad in [
        serde_json::json!({"reason": ""}),
        serde_json::json!({"reason": "a\nb"}),
        serde_json::json!({"reason": "x".repeat(1025)}),
        serde_json::json!({"reason": "r", "extra": 1}),
        serde_json::json!({}),
    ] {
        let (status, v) = server.post(&path, Some(ADMIN), Some(&bad)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {v}");
    }
    let (status, v) = server.post(&path, Some(ADMIN), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "no body: {v}");
    assert_eq!(server.job(&job).await.state, JobState::Idle, "nothing refused changed the job");
    let (status, v) = server.act_raw(&job, "release", "r").await;
    assert_eq!(
        (status, error_of(&v)),
        (StatusCode::CONFLICT, format!("job {job} is idle; only held jobs can be released").as_str())
    );

    // A completed job can be neither held nor removed.
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-1", 2).await;
    assert_eq!(expect_assign(&mut ep, "alice").await, job);
    send(&mut ep, &report(&job, Outcome::Exited { exit_code: 0 }, Usage::default())).await;
    server.wait_for_state(&job, JobState::Completed).await;
    let (status, v) = server.act_raw(&job, "hold", "r").await;
    assert_eq!(
        (status, error_of(&v)),
        (StatusCode::CONFLICT, format!("job {job} is completed; only idle or running jobs can be held").as_str())
    );
    let (status, _) = server.act_raw(&job, "remove", "r").await;
    assert_eq!(status, StatusCode::CONFLICT);

    ep.close(None).await.expect("close");
    server.stop().await;
}
