//! The scheduler's side of the attack suite: a submit-token holder who names URLs of its choosing, and a
//! malicious EP (a protocol-level EP, written here) that inflates its usage, reports outputs
//! that are not its job's and bounces jobs. Each attack is refused, and each test shows the
//! refusal.

use super::*;
use htfaas_functions::audit::AuditRecord;
use htfaas_functions::proto::{Attempt, HOLD_CODE_RETRIES};
use htfaas_scheduler::doubt::{MAX_REPORTED_OUTPUTS, WALL_SLACK_MS};

async fn audit(server: &Server, query: &str) -> Vec<AuditRecord> {
    let (status, v) = server.get(&format!("/v1/audit{query}"), Some(ADMIN)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    serde_json::from_value(v).expect("AuditRecords")
}

async fn history(server: &Server, id: &str) -> Vec<Attempt> {
    let (status, v) = server.get(&format!("/v1/jobs/{id}/history"), Some(ADMIN)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    serde_json::from_value(v).expect("Attempts")
}

async fn accounts(server: &Server) -> Vec<Account> {
    let (status, v) = server.get("/v1/accounting", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    serde_json::from_value(v).expect("accounts")
}

fn now_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    u64::try_from(since.as_millis()).expect("fits")
}

/// A job posted straight to `POST /v1/jobs` may name only the site's storage (input, output)
/// and the module store's URL for its own digest: anything else is refused with 403 naming the
/// field, the URL and what is trusted, recorded as `job.refused`, and never reaches an EP.
#[tokio::test]
async fn a_submitted_job_may_name_only_the_sites_storage_and_its_modules_store_url() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-1", 4).await;

    let digest = fx.digest.clone();
    let other = Digest::of(b"another module");
    let elsewhere = format!("{MODULES}/v1/modules/{other}");
    type Change = Box<dyn Fn(&mut SubmitRequest)>;
    let cases: Vec<(Change, String)> = vec![
        (
            Box::new(|r| r.input.as_mut().expect("an input").url = "http://10.0.0.5:8080/admin".into()),
            "input.url \"http://10.0.0.5:8080/admin\" is not on a storage this scheduler trusts \
             (http://storage.invalid:80)"
                .into(),
        ),
        (
            Box::new(|r| r.output.url = "http://attacker.example:9000/loot/".into()),
            "output.url \"http://attacker.example:9000/loot/\" is not on a storage this scheduler trusts \
             (http://storage.invalid:80)"
                .into(),
        ),
        (
            Box::new(|r| r.function.module_url = "http://attacker.example/m.wasm".into()),
            format!(
                "function.module_url \"http://attacker.example/m.wasm\" is not the module store's URL for the \
                 job's digest: expected http://registry.invalid:80/v1/modules/{digest}"
            ),
        ),
        (
            Box::new(move |r| r.function.module_url = elsewhere.clone()),
            format!(
                "function.module_url \"{MODULES}/v1/modules/{other}\" is not the module store's URL for the \
                 job's digest: expected http://registry.invalid:80/v1/modules/{digest}"
            ),
        ),
        (
            Box::new(|r| {
                r.input.as_mut().expect("an input").url = "http://storage.invalid/data/raw/../../etc/passwd".into()
            }),
            "input.url \"http://storage.invalid/data/raw/../../etc/passwd\" is refused: its path \
             \"/data/raw/../../etc/passwd\" is not in canonical form (it reads as \"/etc/passwd\"): no '.' or \
             '..' segment, no backslash, no character that needs escaping"
                .into(),
        ),
        (
            Box::new(|r| r.output.url = "http://storage.invalid/data/out/%2e%2e/raw/".into()),
            "output.url \"http://storage.invalid/data/out/%2e%2e/raw/\" is refused: its path \
             \"/data/out/%2e%2e/raw/\" is not in canonical form (it reads as \"/data/raw/\"): no '.' or '..' \
             segment, no backslash, no character that needs escaping"
                .into(),
        ),
        (
            Box::new(|r| r.input.as_mut().expect("an input").url = "http://storage.invalid/data%2Fraw/a.dat".into()),
            "input.url \"http://storage.invalid/data%2Fraw/a.dat\" is refused: its path holds an encoded '/', \
             '\\', '.' or NUL"
                .into(),
        ),
        (
            Box::new(|r| {
                r.input.as_mut().expect("an input").url = "http://gateway:secret@storage.invalid/data/raw/a.dat".into()
            }),
            "input.url \"http://storage.invalid/data/raw/a.dat\" is refused: user info (user:password@) is not \
             allowed"
                .into(),
        ),
        (
            // Lying about having no input: a run on no file whose event claims a file would sit
            // in that file's lineage without the file's read macaroon ever being asked for.
            Box::new(|r| r.input = None),
            "event.path \"/data/raw/a.dat\" names a file, but the job has no input: a run on no file names no path"
                .into(),
        ),
    ];
    for (i, (change, expected)) in cases.iter().enumerate() {
        let mut req = fx.request(&format!("attack-{i}"));
        change(&mut req);
        let (status, v) = server.submit_raw(Some(&fx.token("mallory")), &req).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{expected}: {v}");
        assert_eq!(error_of(&v), expected);
    }
    let refused = audit(&server, "?owner=mallory").await;
    assert_eq!(refused.len(), cases.len(), "one job.refused each: {refused:?}");
    assert!(refused.iter().all(|r| r.kind.as_str() == "job.refused" && r.detail["status"] == 403), "{refused:?}");
    assert!(!serde_json::to_string(&refused).expect("json").contains("secret"), "no password in the trail");

    // Nothing refused was queued: the EP's first job is the good one.
    let good = server.submit(&fx.token("alice"), &fx.request("good")).await.job_id;
    assert_eq!(expect_assign(&mut ep, "alice").await, good);
    let (_, list) = server.get("/v1/jobs", Some(ADMIN)).await;
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    server.stop().await;
}

/// An EP that claims a year of wall time, more CPU than its cores could give and more memory
/// than the job had is charged what the scheduler saw: wall time from dispatch to report plus
/// the slack, CPU time at most wall × cpus, memory at most the job's; the claim is kept in the
/// report's audit record.
#[tokio::test]
async fn an_ep_that_inflates_its_usage_is_charged_only_what_the_scheduler_saw() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let submitted = Instant::now();
    let id = server.submit(&fx.token("alice"), &fx.request("inflate")).await.job_id;
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "liar", 4).await;
    assert_eq!(expect_assign(&mut ep, "alice").await, id);
    let year_ms = 365 * 24 * 3600 * 1000;
    let claimed = Usage { wall_ms: year_ms, cpu_ms: u64::MAX / 4, peak_memory_bytes: u64::MAX, ..Usage::default() };
    send(&mut ep, &report(&id, Outcome::Exited { exit_code: 0 }, claimed)).await;
    let done = server.wait_for_state(&id, JobState::Completed).await;

    // The scheduler's view of the attempt lies within this test's own view of it.
    let bound_ms = u64::try_from(submitted.elapsed().as_millis()).expect("fits") + WALL_SLACK_MS;
    let charged = done.usage.expect("usage recorded");
    assert!(charged.wall_ms <= bound_ms, "wall clamped to the observed attempt: {charged:?}");
    assert!(charged.cpu_ms <= charged.wall_ms * 2, "cpu at most wall × 2 cpus: {charged:?}");
    assert_eq!(charged.peak_memory_bytes, 256 << 20, "memory at most the job's 256 MiB");
    let alice = accounts(&server).await.into_iter().find(|a| a.owner == "alice").expect("alice charged");
    assert!(alice.core_seconds <= 2.0 * bound_ms as f64 / 1000.0, "{alice:?}");
    assert!(alice.cpu_seconds <= 2.0 * bound_ms as f64 / 1000.0, "{alice:?}");

    let finished = audit(&server, &format!("?job={id}")).await;
    let finished = finished.iter().find(|r| r.kind.as_str() == "job.finished").expect("job.finished");
    assert_eq!(finished.detail["clamped"]["wall_ms"], year_ms, "{}", finished.detail);
    assert_eq!(finished.detail["clamped"]["peak_memory_bytes"], u64::MAX, "{}", finished.detail);
    assert_eq!(finished.detail["usage"]["wall_ms"], charged.wall_ms, "the record shows what was charged");
    server.stop().await;
}

/// A report naming outputs outside the job's output directory, or too many of them, is a
/// protocol violation: not believed at all (no outcome, no outputs in the lineage, nothing
/// charged), recorded as a lost attempt with the violation, and the job runs again; an honest
/// report then completes it.
#[tokio::test]
async fn a_report_with_foreign_or_too_many_outputs_is_refused_and_the_job_runs_again() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let id = server.submit(&fx.token("alice"), &fx.request("foreign")).await.job_id;
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "liar", 4).await;
    assert_eq!(expect_assign(&mut ep, "alice").await, id);

    let output = |path: String| OutputFile { path, size: 64, sha256: "ab".repeat(32) };
    let usage = Usage { wall_ms: 1000, cpu_ms: 1000, ..Usage::default() };
    let forged = JobReport {
        input_sha256: None,
        job_id: id.clone(),
        outcome: Outcome::Exited { exit_code: 0 },
        usage,
        outputs: vec![output("/data/out/a.sum".into()), output("/data/other/planted.sum".into())],
        log: String::new(),
        refs: Vec::new(),
        checkpoint: None,
    };
    send(&mut ep, &EpMsg::Finished(forged)).await;
    // Refused, it runs again (the test scheduler has no backoff).
    assert_eq!(expect_assign(&mut ep, "alice").await, id);
    let flood = JobReport {
        input_sha256: None,
        job_id: id.clone(),
        outcome: Outcome::Exited { exit_code: 0 },
        usage,
        outputs: (0..=MAX_REPORTED_OUTPUTS).map(|i| output(format!("/data/out/{i}"))).collect(),
        log: String::new(),
        refs: Vec::new(),
        checkpoint: None,
    };
    send(&mut ep, &EpMsg::Finished(flood)).await;
    assert_eq!(expect_assign(&mut ep, "alice").await, id);

    let attempts = history(&server, &id).await;
    let ended: Vec<(&str, &str, bool)> =
        attempts.iter().map(|a| (a.outcome.as_str(), a.reason.as_str(), a.usage.is_some())).collect();
    assert_eq!(
        ended[..2],
        [
            (
                "refused",
                "protocol violation: the report names output \"/data/other/planted.sum\", which is not a file under \
                 the job's output directory \"/data/out/\"",
                false
            ),
            ("refused", "protocol violation: the report names 10001 outputs, at most 10000 are accepted", false),
        ]
    );
    assert!(accounts(&server).await.iter().all(|a| a.owner != "alice"), "nothing charged for refused reports");
    // No lineage names the planted file; the trail names the violations.
    assert!(audit(&server, "?file=/data/other/planted.sum").await.is_empty());
    let records = audit(&server, &format!("?job={id}")).await;
    let violations: Vec<&AuditRecord> =
        records.iter().filter(|r| r.kind.as_str() == "attempt.lost" && r.detail["violation"] == true).collect();
    assert_eq!(violations.len(), 2, "{records:?}");
    assert_eq!(violations[0].detail["then"], "requeued");
    assert!(records.iter().all(|r| r.kind.as_str() != "job.finished"), "no report believed: {records:?}");

    // An honest report is recorded.
    send(&mut ep, &report(&id, Outcome::Exited { exit_code: 0 }, usage)).await;
    let done = server.wait_for_state(&id, JobState::Completed).await;
    assert_eq!(done.outputs.iter().map(|o| o.path.as_str()).collect::<Vec<_>>(), ["/data/out/a.sum"]);
    server.stop().await;
}

/// An EP that turns every job away (an unasked-for `Cancelled`) costs the job an attempt and
/// the retry backoff each time, so it cannot bounce a job for ever without delay: past the
/// retry limit the job is held.
#[tokio::test]
async fn an_ep_that_bounces_a_job_costs_it_an_attempt_and_the_backoff_until_it_is_held() {
    let fx = Fixture::new();
    let (server, queue) = Server::start_with_queue(&fx.path(), |c| {
        c.retry_backoff_s = 1;
        c.max_retries = 1;
    })
    .await;
    let id = server.submit(&fx.token("alice"), &fx.request("bounce")).await.job_id;
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "bouncer", 4).await;
    assert_eq!(expect_assign(&mut ep, "alice").await, id);
    let bounced = now_ms();
    send(&mut ep, &report(&id, Outcome::Cancelled { reason: "not today".into() }, Usage::default())).await;
    server.wait_for_state(&id, JobState::Idle).await;
    let (lost, not_before) = queue.retry_state(id.clone()).await.expect("retry state");
    assert_eq!(lost, 1, "a bounce counts as a lost attempt");
    assert!(not_before >= bounced + 1000, "and waits the backoff: {not_before} vs {bounced}");

    // It comes back only once its backoff is over, and a second bounce holds it.
    assert_eq!(expect_assign(&mut ep, "alice").await, id);
    assert!(now_ms() >= not_before, "dispatched before its backoff ended");
    send(&mut ep, &report(&id, Outcome::Cancelled { reason: "not today".into() }, Usage::default())).await;
    let held = server.wait_for_state(&id, JobState::Held).await;
    assert_eq!(held.hold_code, Some(HOLD_CODE_RETRIES));
    assert_eq!(
        held.reason,
        "lost or returned by its EP 2 times (last: bouncer: the EP returned it: not today); the retry limit is 1"
    );
    let attempts = history(&server, &id).await;
    assert_eq!(attempts.iter().map(|a| a.outcome.as_str()).collect::<Vec<_>>(), ["returned", "returned"]);
    assert!(accounts(&server).await.iter().all(|a| a.owner != "alice"), "a bounce charges nothing");
    server.stop().await;
}

/// The prefetch extension's hand-back (`NotStarted`) is believed only from the
/// session the job is assigned to, and free of a loss only for as many jobs as the EP was
/// granted to prefetch (outside a drain): another session's hand-back is ignored and counted,
/// and a hand-back past the budget counts as a return (a lost attempt), so an EP cannot bounce
/// jobs for ever at no cost. The first free hand-back also ends prefetching to the EP.
#[tokio::test]
async fn an_ep_can_hand_back_only_its_own_jobs_and_only_its_granted_number_for_free() {
    use htfaas_functions::proto::{Prefetch, decode_frame};
    async fn hello_prefetch(ws: &mut Ws, name: &str) -> Prefetch {
        let hello = EpMsg::Hello(Hello {
            name: name.into(),
            slots: Resources::new(1, 4096, 3600),
            protocol: 1,
            annex: None,
            labels: Default::default(),
            prefetch: Some(1),
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
    async fn assigns(ws: &mut Ws, n: usize) -> Vec<String> {
        let mut out = Vec::new();
        while out.len() < n {
            for m in decode_frame::<SchedulerMsg>(&next_text(ws).await, true).expect("frame") {
                match m {
                    SchedulerMsg::Assign(a) => out.push(a.job_id),
                    other => panic!("expected assigns, got {other:?}"),
                }
            }
        }
        out
    }
    let not_started = |id: &str| EpMsg::NotStarted { job_id: id.into(), reason: "no".into() };
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let mut jobs = Vec::new();
    for i in 0..2 {
        jobs.push(server.submit(&fx.token("alice"), &one_cpu(&fx, &format!("e{i}"))).await.job_id);
    }
    let (a, b) = (jobs[0].clone(), jobs[1].clone());
    let mut first = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    assert_eq!(hello_prefetch(&mut first, "ep-1").await.jobs, 1);
    assert_eq!(assigns(&mut first, 2).await, jobs);
    let mut second = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello_prefetch(&mut second, "ep-2").await;

    // Another session's job: ignored, counted.
    let before = super::faults::ignored_reports(&server).await;
    send(&mut second, &not_started(&a)).await;
    let deadline = Instant::now() + WAIT;
    while super::faults::ignored_reports(&server).await == before {
        assert!(Instant::now() < deadline, "the foreign hand-back was never counted as ignored");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let job_a = server.job(&a).await;
    assert_eq!((job_a.state, job_a.ep.as_deref()), (JobState::Running, Some("ep-1")));

    // Its own queued job, within the budget: idle at once, no loss; it runs on the other EP.
    send(&mut first, &not_started(&b)).await;
    assert_eq!(assigns(&mut second, 1).await, std::slice::from_ref(&b));
    assert_eq!(history(&server, &b).await[0].outcome, "not-started");

    // Past the budget (and not draining): a return, counted as a lost attempt.
    send(&mut first, &not_started(&a)).await;
    let deadline = Instant::now() + WAIT;
    loop {
        let h = history(&server, &a).await;
        if h[0].outcome != "running" {
            assert_eq!(h[0].outcome, "returned", "{h:?}");
            break;
        }
        assert!(Instant::now() < deadline, "the costly hand-back was never recorded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.close(None).await.expect("close");
    second.close(None).await.expect("close");
    server.stop().await;
}
