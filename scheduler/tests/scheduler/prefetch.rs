//! The prefetch window. An EP that asks for it holds jobs beyond its free resources
//! (queued on it, `running` in the store), and everything that holds for running jobs holds
//! for those: a departed EP's queued jobs run elsewhere, once; a cancelled one is told to its
//! EP; a drain hands them back and they run elsewhere at once, no loss counted; an EP can hand
//! back only jobs of its own session, and only its granted number for free; the reports of one
//! array frame are recorded in one write.

use super::*;
use htfaas_functions::proto::{Attempt, Prefetch, decode_frame, encode_frame};

async fn history(server: &Server, id: &str) -> Vec<Attempt> {
    let (status, v) = server.get(&format!("/v1/jobs/{id}/history"), Some(ADMIN)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    serde_json::from_value(v).expect("Attempts")
}

/// Says hello asking for `prefetch` jobs beyond `cpus` cores; returns the grant.
async fn hello_prefetch(ws: &mut Ws, name: &str, cpus: u32, prefetch: u32) -> Prefetch {
    let hello = EpMsg::Hello(Hello {
        name: name.into(),
        slots: Resources::new(cpus, 4096, 3600),
        protocol: 1,
        annex: None,
        labels: Default::default(),
        prefetch: Some(prefetch),
        runtimes: vec![htfaas_functions::manifest::RuntimeKind::Wasm],
        images: Vec::new(),
        renews_attach: false,
    });
    send(ws, &hello).await;
    match serde_json::from_str::<SchedulerMsg>(&next_text(ws).await).expect("welcome") {
        SchedulerMsg::Welcome { prefetch: Some(p), .. } => p,
        other => panic!("expected a welcome granting prefetch, got {other:?}"),
    }
}

/// The messages of the next frame (one, or an array within the extension).
async fn next_msgs(ws: &mut Ws) -> Vec<SchedulerMsg> {
    decode_frame(&next_text(ws).await, true).expect("messages")
}

/// Reads frames until `n` Assigns came; returns their job ids in order.
async fn assigns(ws: &mut Ws, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    while out.len() < n {
        for m in next_msgs(ws).await {
            match m {
                SchedulerMsg::Assign(a) => out.push(a.job_id),
                other => panic!("expected assigns, got {other:?}"),
            }
        }
    }
    assert_eq!(out.len(), n, "more assigns than expected: {out:?}");
    out
}

fn done(id: &str) -> EpMsg {
    report(id, Outcome::Exited { exit_code: 0 }, Usage::default())
}

fn not_started(id: &str, reason: &str) -> EpMsg {
    EpMsg::NotStarted { job_id: id.into(), reason: reason.into() }
}

async fn submit_n(server: &Server, fx: &Fixture, n: usize) -> Vec<String> {
    let mut jobs = Vec::new();
    for i in 0..n {
        jobs.push(server.submit(&fx.token("alice"), &one_cpu(fx, &format!("e{i}"))).await.job_id);
    }
    jobs
}

/// An EP with one core and a prefetch of one holds two jobs: the second is assigned (and
/// `running` in the store) before the first ends; the third only once the first is reported.
#[tokio::test]
async fn an_ep_with_one_slot_and_prefetch_one_holds_two_jobs() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let jobs = submit_n(&server, &fx, 3).await;
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    let grant = hello_prefetch(&mut ep, "ep-1", 1, 1).await;
    assert_eq!(grant.jobs, 1);
    assert!(grant.wait_ms > 0 && grant.wait_ms <= 10_000, "{grant:?}");
    assert_eq!(assigns(&mut ep, 2).await, jobs[..2].to_vec(), "oldest first, the second prefetched");
    for id in &jobs[..2] {
        let job = server.job(id).await;
        assert_eq!((job.state, job.ep.as_deref()), (JobState::Running, Some("ep-1")));
    }
    assert_eq!(server.job(&jobs[2]).await.state, JobState::Idle, "one core + one prefetched: no third");
    let (status, eps) = server.get("/v1/eps", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(eps[0]["running"].as_array().map(Vec::len), Some(2), "{eps}");
    assert_eq!(eps[0]["free"]["cpus"], 0, "the running job holds the core, the queued one nothing: {eps}");

    send(&mut ep, &done(&jobs[0])).await;
    assert_eq!(assigns(&mut ep, 1).await, [jobs[2].clone()], "the queue moved up and took the next");
    send(&mut ep, &done(&jobs[1])).await;
    send(&mut ep, &done(&jobs[2])).await;
    for id in &jobs {
        server.wait_for_state(id, JobState::Completed).await;
    }
    ep.close(None).await.expect("close");
    server.stop().await;
}

/// A prefetched job on an EP that is killed runs again elsewhere, exactly once: both of the
/// departed EP's jobs are requeued; the second EP runs each once; the first's attempts are
/// lost, never completed.
#[tokio::test]
async fn a_prefetched_job_of_a_killed_ep_runs_once_elsewhere() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let jobs = submit_n(&server, &fx, 2).await;
    let mut first = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello_prefetch(&mut first, "ep-1", 1, 1).await;
    assert_eq!(assigns(&mut first, 2).await, jobs);
    drop(first); // killed: no close, no report
    for id in &jobs {
        server.wait_for_state(id, JobState::Idle).await;
    }

    let mut second = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut second, "ep-2", 1).await;
    for id in &jobs {
        assert_eq!(&expect_assign(&mut second, "alice").await, id);
        send(&mut second, &done(id)).await;
        let job = server.wait_for_state(id, JobState::Completed).await;
        assert_eq!(job.ep.as_deref(), Some("ep-2"));
    }
    for id in &jobs {
        let outcomes: Vec<(String, String)> =
            history(&server, id).await.into_iter().map(|a| (a.ep, a.outcome)).collect();
        assert_eq!(
            outcomes,
            [("ep-1".to_owned(), "lost".to_owned()), ("ep-2".to_owned(), "completed".to_owned())],
            "{id}"
        );
    }
    second.close(None).await.expect("close");
    server.stop().await;
}

/// A prefetched job removed by an admin is cancelled on its EP (which answers `Cancelled`
/// without starting it); it stays removed, its report charges nothing, and the queue's room
/// goes to the next job.
#[tokio::test]
async fn a_removed_prefetched_job_is_cancelled_on_its_ep_and_stays_removed() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let jobs = submit_n(&server, &fx, 3).await;
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello_prefetch(&mut ep, "ep-1", 1, 1).await;
    assert_eq!(assigns(&mut ep, 2).await, jobs[..2].to_vec());
    server.act(&jobs[1], "remove", "not wanted").await;
    let msgs = next_msgs(&mut ep).await;
    assert!(
        matches!(&msgs[..], [SchedulerMsg::Cancel { job_id, .. }] if *job_id == jobs[1]),
        "the queued job is cancelled on its EP: {msgs:?}"
    );
    let cancelled = Outcome::Cancelled { reason: "not wanted".into() };
    send(&mut ep, &EpMsg::Finished(JobReport { outputs: vec![], ..report_of(&jobs[1], cancelled) })).await;
    assert_eq!(assigns(&mut ep, 1).await, [jobs[2].clone()], "its room in the queue went to the next job");
    let removed = server.job(&jobs[1]).await;
    assert_eq!(removed.state, JobState::Removed);
    assert_eq!(removed.usage.map(|u| u.cpu_ms), Some(0));
    send(&mut ep, &done(&jobs[0])).await;
    send(&mut ep, &done(&jobs[2])).await;
    server.wait_for_state(&jobs[2], JobState::Completed).await;
    assert_eq!(server.job(&jobs[1]).await.state, JobState::Removed);
    ep.close(None).await.expect("close");
    server.stop().await;
}

fn report_of(id: &str, outcome: Outcome) -> JobReport {
    match report(id, outcome, Usage::default()) {
        EpMsg::Finished(r) => r,
        _ => unreachable!("report makes a Finished"),
    }
}

/// A draining EP hands back its prefetched job: it is idle again at once (no loss counted, no
/// backoff even where one is configured) and runs on another EP; the drained EP's running job
/// still reports.
#[tokio::test]
async fn a_draining_ep_hands_back_its_prefetched_jobs_and_they_run_elsewhere() {
    let fx = Fixture::new();
    let server = Server::start_configured(&fx.path(), |c| c.retry_backoff_s = 3600).await;
    let jobs = submit_n(&server, &fx, 2).await;
    let mut first = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello_prefetch(&mut first, "ep-1", 1, 1).await;
    assert_eq!(assigns(&mut first, 2).await, jobs);
    let frame = encode_frame(&[EpMsg::Draining, not_started(&jobs[1], "EP draining")]).expect("encode");
    first.send(Message::text(frame)).await.expect("send");
    server.wait_for_state(&jobs[1], JobState::Idle).await;

    let mut second = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut second, "ep-2", 1).await;
    assert_eq!(expect_assign(&mut second, "alice").await, jobs[1], "at once, despite the hour of backoff");
    send(&mut second, &done(&jobs[1])).await;
    send(&mut first, &done(&jobs[0])).await;
    assert_eq!(server.wait_for_state(&jobs[1], JobState::Completed).await.ep.as_deref(), Some("ep-2"));
    assert_eq!(server.wait_for_state(&jobs[0], JobState::Completed).await.ep.as_deref(), Some("ep-1"));
    let outcomes: Vec<String> = history(&server, &jobs[1]).await.into_iter().map(|a| a.outcome).collect();
    assert_eq!(outcomes, ["not-started", "completed"]);
    first.close(None).await.expect("close");
    second.close(None).await.expect("close");
    server.stop().await;
}

/// The reports of one array frame are recorded together, each as if sent alone: both jobs
/// the EP holds complete and are charged, a report in the same frame for a job that runs
/// elsewhere is ignored (that job stays running on its own EP), and the freed room is filled.
#[tokio::test]
async fn the_reports_of_one_frame_are_recorded_together_each_on_its_own() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let jobs = submit_n(&server, &fx, 4).await;
    let mut first = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello_prefetch(&mut first, "ep-1", 1, 1).await;
    assert_eq!(assigns(&mut first, 2).await, jobs[..2].to_vec());
    let mut second = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut second, "ep-2", 1).await;
    assert_eq!(expect_assign(&mut second, "alice").await, jobs[2]);

    let frame = encode_frame(&[done(&jobs[0]), done(&jobs[2]), done(&jobs[1])]).expect("encode");
    first.send(Message::text(frame)).await.expect("send");
    for id in &jobs[..2] {
        assert_eq!(server.wait_for_state(id, JobState::Completed).await.ep.as_deref(), Some("ep-1"));
    }
    assert_eq!(assigns(&mut first, 1).await, [jobs[3].clone()], "the freed room is filled");
    assert_eq!(server.job(&jobs[2]).await.state, JobState::Running, "another EP's job is not ended by this one");
    let (_, accounts) = server.get("/v1/accounting", Some(ADMIN)).await;
    assert_eq!(accounts[0]["jobs_completed"], 2, "{accounts}");
    send(&mut second, &done(&jobs[2])).await;
    server.wait_for_state(&jobs[2], JobState::Completed).await;
    server.stop().await;
}
