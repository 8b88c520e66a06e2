//! The EP through its public API against the fake scheduler and storage ([`crate::fake`]):
//! the data path, reconnects, the annex in `Hello`, and which refusals end the EP for good.

use crate::common::digest;
use crate::fake::{Harness, READ_MAC, RENEWED_ATTACH, WRITE_MAC, until};
use axum::Router;
use axum::http::StatusCode;
use axum::routing::any;
use htfaas_ep::Config;
use htfaas_functions::proto::{AttachLease, EpMsg, Outcome, SchedulerMsg};
use sha2::Digest as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn assign_runs_checksum_end_to_end() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    c.send_raw("this is not json"); // counted and ignored
    c.send_raw(r#"{"type":"assign","job_id":"half"}"#);
    c.send(&SchedulerMsg::Assign(h.job("job-1", "wiki.txt")));
    let r = c.finished().await;
    assert_eq!(r.job_id, "job-1");
    assert_eq!(r.outcome, Outcome::Exited { exit_code: 0 }, "log: {}", r.log);
    assert_eq!(r.usage.bytes_in, 9);
    assert!(r.log.contains("checksum: wiki.txt: 9 bytes"), "{}", r.log);
    assert_eq!(r.outputs.len(), 1);
    let out = &r.outputs[0];
    assert_eq!(out.path, "/storage/out/wiki.txt.checksums.json");
    {
        let seen = h.seen.lock().expect("lock");
        assert_eq!(seen.input_auth, [format!("Bearer {READ_MAC}")]);
        let (auth, len, body) = seen.puts.get("wiki.txt.checksums.json").expect("PUT seen");
        assert_eq!(auth, &format!("Bearer {WRITE_MAC}"));
        assert_eq!(len.as_deref(), Some(body.len().to_string().as_str()));
        assert_eq!(out.size, body.len() as u64);
        assert_eq!(r.usage.bytes_out, body.len() as u64);
        assert_eq!(out.sha256, hex::encode(sha2::Sha256::digest(body)));
        let v: serde_json::Value = serde_json::from_slice(body).expect("json");
        assert_eq!(v["adler32"], "11e60398");
    }
    eprintln!("job-1 usage: {:?}", r.usage);

    // Second job, same module: served from the in-memory cache (no second GET).
    c.send(&SchedulerMsg::Assign(h.job("job-2", "wiki.txt")));
    let r2 = c.finished().await;
    assert_eq!(r2.outcome, Outcome::Exited { exit_code: 0 });
    assert_eq!(h.seen.lock().expect("lock").module_gets, 1);
    eprintln!("job-2 usage (module cached): {:?}", r2.usage);
    h.stop().await;
}

/// A run on no file: no input is fetched, the reference file is read under `/input/ref/`, and
/// the argv holds no input path (the checksum guest's first argument is the reference's).
#[tokio::test]
async fn a_job_without_an_input_reads_only_its_references() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    let mut j = h.job("no-input", "wiki.txt");
    j.input = None;
    j.refs = vec![htfaas_functions::proto::ReferenceInput {
        url: format!("{}/storage/in/wiki.txt", h.base),
        path: "storage/in/wiki.txt".into(),
        macaroon: READ_MAC.into(),
        sha256: None,
    }];
    j.args = vec!["/input/ref/storage/in/wiki.txt".into()];
    c.send(&SchedulerMsg::Assign(j));
    let r = c.finished().await;
    assert_eq!(r.outcome, Outcome::Exited { exit_code: 0 }, "log: {}", r.log);
    assert_eq!(r.input_sha256, None, "no input read");
    assert_eq!((r.refs.len(), r.usage.bytes_in), (1, 9), "the reference alone: {:?}", r.refs);
    assert_eq!(r.outputs.iter().map(|o| o.path.as_str()).collect::<Vec<_>>(), ["/storage/out/wiki.txt.checksums.json"]);
    // The reference's alone: a HEAD for its sha256 (the EP's cache by content), then its GET.
    assert_eq!(h.seen.lock().expect("lock").input_auth, [READ_MAC, READ_MAC].map(|m| format!("Bearer {m}")));
    h.stop().await;
}

#[tokio::test]
async fn the_ep_asks_for_a_new_attach_token_when_told_and_dials_with_it_from_then_on() {
    let mut h = Harness::start_with(|c| c.metrics_listen = Some("127.0.0.1:0".parse().expect("addr"))).await;
    let mut c = h.conn().await;
    let hello = match c.recv().await {
        EpMsg::Hello(hello) => hello,
        other => panic!("want hello, got {other:?}"),
    };
    assert!(hello.renews_attach, "the EP says it renews");
    let lease = AttachLease { expires_in_ms: 60_000, renew_in_ms: Some(50) };
    c.send(&SchedulerMsg::Welcome { ep_id: "ep-1".into(), prefetch: None, attach: Some(lease) });
    assert_eq!(c.recv().await, EpMsg::RenewAttach, "asked when told");
    let renewed = AttachLease { expires_in_ms: 60_000, renew_in_ms: None };
    c.send(&SchedulerMsg::AttachRenewed { token: RENEWED_ATTACH.into(), lease: renewed });
    // The connection breaks: the EP dials again, with the renewed token.
    c.drop_socket();
    let mut again = h.conn().await;
    again.hello_welcome().await;
    let auths = h.seen.lock().expect("lock").attach_auth.clone();
    assert_eq!(auths, [format!("Bearer {}", crate::fake::ATTACH), format!("Bearer {RENEWED_ATTACH}")]);
    // And kept for a later start (which dials with it when it renews the configured one).
    let kept = h.work.path().join("attach-token");
    until("the renewed token kept", || std::fs::read_to_string(&kept).is_ok_and(|t| t == RENEWED_ATTACH)).await;
    let page = h.metrics_page().await;
    for line in [
        r#"htfaas_ep_attach_renewals_total{result="renewed"} 1"#,
        r#"htfaas_ep_attach_renewals_total{result="refused"} 0"#,
    ] {
        assert!(page.contains(line), "{line} in:\n{page}");
    }
    h.stop().await;
}

#[tokio::test]
async fn failures_become_outcomes() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    c.hello_welcome().await;

    // Digest mismatch: the bytes served are checksum.wasm, the job names other bytes.
    let mut bad = h.job("bad-digest", "wiki.txt");
    bad.function.digest = digest(b"something else");
    c.send(&SchedulerMsg::Assign(bad));
    let r = c.finished().await;
    match &r.outcome {
        Outcome::ModuleFailed { reason } => assert!(reason.contains("digest mismatch"), "{reason}"),
        other => panic!("want ModuleFailed, got {other:?}"),
    }

    // Wrong read macaroon: 403 with the body in the reason, never the macaroon.
    let mut j = h.job("bad-mac", "wiki.txt");
    j.input.as_mut().expect("an input").macaroon = "wrong".into();
    c.send(&SchedulerMsg::Assign(j));
    let r = c.finished().await;
    match &r.outcome {
        Outcome::InputFailed { reason } => {
            assert!(reason.contains("403") && reason.contains("macaroon refused"), "{reason}");
            assert!(!reason.contains("wrong"));
        }
        other => panic!("want InputFailed, got {other:?}"),
    }

    // An input name that is not one path segment.
    let mut j = h.job("bad-name", "wiki.txt");
    j.input.as_mut().expect("an input").name = "../wiki.txt".into();
    c.send(&SchedulerMsg::Assign(j));
    assert!(matches!(c.finished().await.outcome, Outcome::InputFailed { .. }));

    // Output refused: the write macaroon is wrong.
    let mut j = h.job("bad-out", "wiki.txt");
    j.output.macaroon = "nope".into();
    c.send(&SchedulerMsg::Assign(j));
    let r = c.finished().await;
    match &r.outcome {
        Outcome::OutputFailed { reason } => assert!(reason.contains("403"), "{reason}"),
        other => panic!("want OutputFailed, got {other:?}"),
    }
    h.stop().await;
}

#[tokio::test]
async fn reconnects_and_delivers_reports_of_jobs_that_ended_while_disconnected() {
    let mut h = Harness::start().await;

    // First connection: assign, then drop the socket before the job can report.
    let mut c1 = h.conn().await;
    c1.hello_welcome().await;
    c1.send(&SchedulerMsg::Assign(h.job("job-x", "wiki.txt")));
    c1.drop_socket();

    // The EP dials again; its first words are hello, then the report of job-x.
    let mut c2 = h.conn().await;
    c2.hello_welcome().await;
    let r = c2.finished().await;
    assert_eq!(r.job_id, "job-x");
    assert_eq!(r.outcome, Outcome::Exited { exit_code: 0 }, "{}", r.log);

    // And the new connection serves assignments.
    c2.send(&SchedulerMsg::Assign(h.job("job-y", "wiki.txt")));
    assert_eq!(c2.finished().await.job_id, "job-y");
    h.stop().await;
}

/// A scheduler whose attach route always answers `status` with `body`; counts the dials.
/// A scheduler that answers every attach with `status`; the returned list is when each dial came.
async fn refusing_scheduler(status: StatusCode, body: &'static str) -> (String, Arc<Mutex<Vec<Instant>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let hits = Arc::new(Mutex::new(Vec::new()));
    let h2 = hits.clone();
    let app = Router::new().route(
        "/v1/ep/attach",
        any(move || {
            let hits = h2.clone();
            async move {
                hits.lock().expect("lock").push(Instant::now());
                (status, body)
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    (base, hits)
}

async fn start_ep(
    base: String,
    work: &tempfile::TempDir,
) -> (tokio::task::JoinHandle<anyhow::Result<()>>, CancellationToken) {
    let config = Config {
        log_limit_bytes: 1024,
        max_output_files: 1,
        max_output_bytes: 1,
        ..Config::for_test("ep-test", base, "some-token", work.path())
    };
    let settings = config.resolve().await.expect("resolves");
    let shutdown = CancellationToken::new();
    (tokio::spawn(htfaas_ep::run(settings, shutdown.clone())), shutdown)
}

#[tokio::test]
async fn unavailable_scheduler_is_retried_and_shutdown_stops_the_loop() {
    let work = tempfile::tempdir().expect("tempdir");
    let (base, hits) = refusing_scheduler(StatusCode::SERVICE_UNAVAILABLE, "starting up").await;
    let (ep, shutdown) = start_ep(base, &work).await;
    // Backoff 100, 200, 400 ms: four dials, each waiting at least twice as long as the one
    // before (a sleep never ends early), so not a busy loop.
    until("four dials", || hits.lock().expect("lock").len() >= 4).await;
    let dials = hits.lock().expect("lock").clone();
    let gaps: Vec<Duration> = dials.windows(2).map(|w| w[1] - w[0]).collect();
    for (gap, least) in gaps.iter().zip([100, 200, 400]) {
        assert!(*gap >= Duration::from_millis(least), "backoff {gaps:?}");
    }
    assert!(!ep.is_finished(), "a 503 ended the EP");
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), ep).await.expect("stops").expect("task").expect("ok");
}

#[tokio::test]
async fn http_401_or_403_on_attach_ends_the_ep_with_the_reason() {
    for (status, body) in
        [(StatusCode::UNAUTHORIZED, "attach token expired"), (StatusCode::FORBIDDEN, "attach token revoked")]
    {
        let work = tempfile::tempdir().expect("tempdir");
        let (base, hits) = refusing_scheduler(status, body).await;
        let started = Instant::now();
        let (ep, _shutdown) = start_ep(base, &work).await;
        let result = tokio::time::timeout(Duration::from_secs(5), ep).await.expect("ends by itself").expect("task");
        let err = format!("{:#}", result.expect_err("a refused token is an error"));
        assert!(err.contains(&status.as_u16().to_string()) && err.contains(body), "{err}");
        assert_eq!(hits.lock().expect("lock").len(), 1, "{status}: the EP dialled again");
        assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    }
}

#[tokio::test]
async fn close_4403_after_welcome_ends_the_ep_with_the_reason() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    c.close(4403, "annex mismatch: token says gpu-a");
    let err = format!("{:#}", h.ended().await.expect_err("4403 is final"));
    assert!(err.contains("4403") && err.contains("annex mismatch: token says gpu-a"), "{err}");
}

#[tokio::test]
async fn close_4401_with_a_job_running_ends_the_ep_without_waiting_for_it() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    c.send(&SchedulerMsg::Assign(h.job_of("spinning", "spin-writer", "wiki.txt")));
    let partial = h.output_dir("spinning").join("partial.txt");
    crate::fake::until("the guest to run", || partial.exists()).await;
    let started = Instant::now();
    c.close(4401, "attach token expired");
    let err = format!("{:#}", h.ended().await.expect_err("4401 is final"));
    // The job (wall cap 30 s, drain timeout 10 s) is abandoned, not waited for.
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    assert!(err.contains("4401") && err.contains("attach token expired"), "{err}");
}

#[tokio::test]
async fn other_close_codes_and_dropped_sockets_reconnect() {
    let mut h = Harness::start().await;
    for code in [1011, 1008, 4000] {
        let mut c = h.conn().await;
        c.hello_welcome().await;
        c.close(code, "internal error");
    }
    let mut c = h.conn().await;
    c.hello_welcome().await;
    c.drop_socket();
    let mut c = h.conn().await;
    c.hello_welcome().await;
    c.send(&SchedulerMsg::Assign(h.job("after-reconnects", "wiki.txt")));
    assert_eq!(c.finished().await.outcome, Outcome::Exited { exit_code: 0 });
    assert!(!h.ep.is_finished());
    h.stop().await;
}

#[tokio::test]
async fn hello_carries_the_annex() {
    let mut h = Harness::start_with(|c| c.annex = Some("gpu-a".into())).await;
    let mut c = h.conn().await;
    assert_eq!(c.hello_welcome().await.annex.as_deref(), Some("gpu-a"));
    h.stop().await;

    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    assert_eq!(c.hello_welcome().await.annex, None);
    h.stop().await;
}
