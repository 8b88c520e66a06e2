//! Faults without a crash, on a real scheduler with EPs over WebSocket: the storage
//! away for longer than an EP's retries (the job runs again, then is held with the reason), an
//! EP gone silent mid-job whose late report comes after the job ran elsewhere (ignored), and a
//! full disk (submissions refused with 507, nothing accepted lost, a report kept until it can be
//! recorded).

use super::policy::{admin_get, attach_ep, finish_ok, submit_as};
use super::*;
use htfaas_functions::proto::{Attempt, HOLD_CODE_STORAGE};

/// Accounts as charged equal accounts recomputed from the attempts' records (a lost attempt
/// charged twice, or not at all, shows here).
async fn assert_accounts_match_records(q: &Queue) -> Vec<Account> {
    let charged = q.accounts().await.expect("accounts");
    let recomputed = q.accounts_from_records().await.expect("accounts from records");
    assert_eq!(charged.len(), recomputed.len(), "{charged:?} vs {recomputed:?}");
    for (a, b) in charged.iter().zip(&recomputed) {
        assert_eq!(
            (&a.owner, a.jobs_completed, a.jobs_failed, a.bytes_in, a.bytes_out),
            (&b.owner, b.jobs_completed, b.jobs_failed, b.bytes_in, b.bytes_out),
            "{a:?} vs {b:?}"
        );
        assert!((a.core_seconds - b.core_seconds).abs() < 1e-9, "{a:?} vs {b:?}");
        assert!((a.wall_seconds - b.wall_seconds).abs() < 1e-9, "{a:?} vs {b:?}");
    }
    charged
}

/// `htfaas_scheduler_ignored_reports_total` from `GET /metrics`.
pub(super) async fn ignored_reports(server: &Server) -> u64 {
    counter(server, "htfaas_scheduler_ignored_reports_total").await
}

/// The counter `name` from `GET /metrics`.
async fn counter(server: &Server, name: &str) -> u64 {
    let (status, v) = server.get("/metrics", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let text = v.as_str().expect("metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

fn unavailable(reason: &str) -> Outcome {
    Outcome::StorageUnavailable { reason: reason.into() }
}

// An EP's connection drops mid-job (the lease expires, the job runs elsewhere, the
// late result of the first attempt is ignored).
#[tokio::test]
async fn a_silent_eps_late_report_after_its_job_ran_elsewhere_is_ignored_and_charged_nothing() {
    let fx = Fixture::new();
    let (server, queue) = Server::start_with_queue(&fx.path(), |c| c.lease_s = 1).await;
    let id = submit_as(&server, &fx, "alice", None, &fx.request("k")).await;
    // EP A takes the job and falls silent, its socket open: its lease ends.
    let (mut a, a_session) = attach_ep(&server, &fx, "ep-a", Resources::new(2, 4096, 3600)).await;
    assert_eq!(expect_assign(&mut a, "alice").await, id);
    assert_eq!(expect_close(&mut a).await, (1001, "lease expired".to_owned()));
    server.wait_for_state(&id, JobState::Idle).await;
    // EP B runs it to the end.
    let (mut b, _) = attach_ep(&server, &fx, "ep-b", Resources::new(2, 4096, 3600)).await;
    assert_eq!(expect_assign(&mut b, "alice").await, id);
    finish_ok(&mut b, &id, 3000).await;
    let done = server.wait_for_state(&id, JobState::Completed).await;
    // EP A comes back under its name and reports its first attempt, late and differently.
    let (mut a, a_again) = attach_ep(&server, &fx, "ep-a", Resources::new(2, 4096, 3600)).await;
    assert_ne!(a_session, a_again);
    let late = Usage { wall_ms: 50_000, cpu_ms: 50_000, bytes_in: 7, bytes_out: 7, ..Usage::default() };
    let ignored_before = ignored_reports(&server).await;
    send(&mut a, &report(&id, Outcome::Exited { exit_code: 3 }, late)).await;
    let start = Instant::now();
    while ignored_reports(&server).await == ignored_before {
        assert!(start.elapsed() < WAIT, "the late report was never handled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The job keeps B's result; A gets nothing to run.
    let job = server.job(&id).await;
    assert_eq!((job.state, job.exit_code, job.ep.as_deref()), (JobState::Completed, Some(0), Some("ep-b")));
    assert_eq!(job.usage, done.usage);
    assert_eq!(job.usage.map(|u| u.wall_ms), Some(3000));
    expect_silence(&mut a, Duration::from_millis(200)).await;
    let history: Vec<Attempt> = admin_get(&server, &format!("/v1/jobs/{id}/history")).await;
    let summary: Vec<(u32, &str, &str)> = history.iter().map(|h| (h.n, h.ep.as_str(), h.outcome.as_str())).collect();
    assert_eq!(summary, [(1, "ep-a", "lost"), (2, "ep-b", "completed")]);
    assert!(history[0].reason.contains("lease expired") && history[0].usage.is_none(), "{:?}", history[0]);
    // Charged once, for B's run: the lost attempt reported nothing, so it costs nothing.
    let accounts = assert_accounts_match_records(&queue).await;
    assert_eq!(accounts.len(), 1);
    assert_eq!((accounts[0].jobs_completed, accounts[0].jobs_failed), (1, 0));
    assert!((accounts[0].core_seconds - 6.0).abs() < 1e-9, "2 cores × 3 s: {:?}", accounts[0]);
    assert_eq!(accounts[0].bytes_in, 0);
    server.stop().await;
}

// The storage refuses or stalls (retries with backoff, then the job is held with the
// reason), through the protocol: the EP's report of its give-up is a lost attempt.
#[tokio::test]
async fn a_storage_outage_reported_by_eps_requeues_the_job_then_holds_it_and_a_release_runs_it() {
    let fx = Fixture::new();
    let (server, queue) = Server::start_with_queue(&fx.path(), |c| c.max_retries = 1).await;
    let id = submit_as(&server, &fx, "alice", None, &fx.request("k")).await;
    let (mut ws, _) = attach_ep(&server, &fx, "ep-a", Resources::new(2, 4096, 3600)).await;
    let down = "GET http://storage.invalid/data/raw/a.dat: HTTP 503 Service Unavailable (gave up after 4 attempts)";
    for attempt in 1..=2u64 {
        assert_eq!(expect_assign(&mut ws, "alice").await, id, "attempt {attempt}");
        send(&mut ws, &report(&id, unavailable(down), Usage { wall_ms: 1000, ..Usage::default() })).await;
    }
    let job = server.wait_for_state(&id, JobState::Held).await;
    assert_eq!(job.hold_code, Some(HOLD_CODE_STORAGE));
    assert!(job.reason.starts_with(&format!("storage unavailable: {down}")), "{}", job.reason);
    assert!(job.reason.ends_with("(on ep-a; lost 2 attempts, the retry limit is 1)"), "{}", job.reason);
    let history: Vec<Attempt> = admin_get(&server, &format!("/v1/jobs/{id}/history")).await;
    assert!(history.iter().all(|h| h.outcome == "storage-unavailable"), "{history:?}");
    assert_eq!(history.len(), 2);
    // Held, it is not run; released, it runs and completes.
    expect_silence(&mut ws, Duration::from_millis(300)).await;
    server.act(&id, "release", "storage back").await;
    assert_eq!(expect_assign(&mut ws, "alice").await, id);
    finish_ok(&mut ws, &id, 1000).await;
    server.wait_for_state(&id, JobState::Completed).await;
    let accounts = assert_accounts_match_records(&queue).await;
    assert_eq!((accounts[0].jobs_completed, accounts[0].jobs_failed), (1, 0));
    assert!((accounts[0].core_seconds - 6.0).abs() < 1e-9, "three attempts of 2 cores × 1 s: {:?}", accounts[0]);
    // A refusal by the storage fails a job at once.
    let refused = submit_as(&server, &fx, "alice", None, &fx.request("k2")).await;
    assert_eq!(expect_assign(&mut ws, "alice").await, refused);
    let denied =
        Outcome::InputFailed { reason: "GET http://storage.invalid/data/raw/a.dat: HTTP 403 Forbidden".into() };
    send(&mut ws, &report(&refused, denied, Usage::default())).await;
    let job = server.wait_for_state(&refused, JobState::Failed).await;
    assert_eq!((job.hold_code, job.attempts), (None, 1));
    assert_eq!(assert_accounts_match_records(&queue).await[0].jobs_failed, 1);
    server.stop().await;
}

// The disk fills (submissions are refused with a clear error, nothing accepted is
// lost). The store's file is capped for real (SQLite's max_page_count), then uncapped.
#[tokio::test]
async fn a_full_disk_refuses_submissions_with_507_keeps_every_job_and_report_and_heals() {
    let fx = Fixture::new();
    let (server, queue) = Server::start_with_queue(&fx.path(), |_| {}).await;
    let first = submit_as(&server, &fx, "alice", None, &fx.request("k0")).await;
    let (mut ws, _) = attach_ep(&server, &fx, "ep-a", Resources::new(2, 4096, 3600)).await;
    assert_eq!(expect_assign(&mut ws, "alice").await, first);
    // Fill the disk: submit until the scheduler says it is full.
    let pages = queue.page_count().await.expect("pages");
    queue.set_max_page_count(Some(pages)).await.expect("cap");
    let mut accepted = vec![first.clone()];
    let refusal = loop {
        assert!(accepted.len() < 2000, "the capped store never filled");
        let (status, v) =
            server.submit_raw(Some(&fx.token("alice")), &fx.request(&format!("k{}", accepted.len()))).await;
        match status {
            StatusCode::CREATED => accepted.push(v["job_id"].as_str().expect("job_id").to_owned()),
            StatusCode::INSUFFICIENT_STORAGE => break error_of(&v).to_owned(),
            other => panic!("unexpected answer {other}: {v}"),
        }
    };
    assert!(refusal.starts_with("the scheduler's disk is full: "), "{refusal}");
    // Reads still work, and every accepted job is there as it was.
    let (status, list) = server.get("/v1/jobs?limit=5000", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let list: Vec<JobRecord> = serde_json::from_value(list).expect("records");
    assert_eq!(list.len(), accepted.len());
    assert!(list.iter().all(|j| accepted.contains(&j.id)));
    assert!(list.iter().all(|j| j.state == if j.id == first { JobState::Running } else { JobState::Idle }));
    // A report that cannot be stored now (its log alone needs new pages) is kept, not lost.
    let usage = Usage { wall_ms: 2000, cpu_ms: 1000, ..Usage::default() };
    let big = JobReport {
        input_sha256: None,
        job_id: first.clone(),
        outcome: Outcome::Exited { exit_code: 0 },
        usage,
        outputs: vec![],
        log: "x".repeat(60 * 1024),
        refs: Vec::new(),
        checkpoint: None,
    };
    send(&mut ws, &EpMsg::Finished(big)).await;
    // Until the store refused it and the scheduler kept it to try again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while counter(&server, "htfaas_scheduler_store_retries_total").await < 1 {
        assert!(tokio::time::Instant::now() < deadline, "the report was never tried");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(server.job(&first).await.state, JobState::Running, "nothing could be recorded yet");
    // Room again: the report is recorded, the EP gets the next job, submissions pass.
    queue.set_max_page_count(None).await.expect("uncap");
    let done = server.wait_for_state(&first, JobState::Completed).await;
    assert_eq!(done.usage.map(|u| u.wall_ms), Some(2000));
    let next = expect_assign(&mut ws, "alice").await;
    assert!(accepted.contains(&next) && next != first, "{next}");
    let again = server.submit(&fx.token("alice"), &fx.request("after")).await;
    assert!(again.created);
    let accounts = assert_accounts_match_records(&queue).await;
    assert_eq!((accounts[0].jobs_completed, accounts[0].jobs_failed), (1, 0));
    server.stop().await;
}
