//! Attacks on checkpoints, by an EP holding two jobs' checkpoint macaroons: each reaches
//! exactly its own job's area (read, write, replace and delete there), never the other job's
//! (nor deletes it), nor the job's input or output directory; and a job's write macaroon does
//! not reach its checkpoint area. This test is the EP (an annex's), against the real built-in storage.

use crate::probe_ep::{attach_probe_with, next_msg};
use futures_util::SinkExt as _;
use htfaas_functions::checkpoint::{CHECKPOINT_FILE, CheckpointPolicy};
use htfaas_functions::proto::{EpMsg, JobAssignment, JobReport, Outcome, SchedulerMsg};
use htfaas_tests::start_stack_with;
use reqwest::StatusCode;
use tokio_tungstenite::tungstenite::Message;

async fn put(url: &str, macaroon: &str, body: &'static [u8]) -> StatusCode {
    let resp = reqwest::Client::new().put(url).bearer_auth(macaroon).body(body).send().await.expect("PUT");
    resp.status()
}

async fn delete(url: &str, macaroon: &str) -> StatusCode {
    reqwest::Client::new().delete(url).bearer_auth(macaroon).send().await.expect("DELETE").status()
}

async fn get(url: &str, macaroon: &str) -> (StatusCode, Vec<u8>) {
    let resp = reqwest::Client::new().get(url).bearer_auth(macaroon).send().await.expect("GET");
    let status = resp.status();
    (status, resp.bytes().await.expect("body").to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_macaroon_reaches_its_own_jobs_area_only() {
    let (dir, stack) = start_stack_with(|_| {}).await;
    let client = stack.client().expect("client");
    let mut ws = attach_probe_with(&stack, dir.path(), "probe", |m| {
        m.checkpoint = Some(CheckpointPolicy { exit_code: Some(85), max_mb: 1 });
    })
    .await;
    // Two jobs, one after the other (the probe EP has room for one).
    let mut assigned: Vec<JobAssignment> = Vec::new();
    for name in ["one", "two"] {
        client.put_bytes(name.as_bytes().to_vec(), &format!("/data/probe/{name}.dat")).await.expect("put");
        let a = match next_msg(&mut ws).await {
            SchedulerMsg::Assign(a) => a,
            other => panic!("expected an assignment, got {other:?}"),
        };
        let done = JobReport {
            outcome: Outcome::Exited { exit_code: 0 },
            ..JobReport::unstarted(a.job_id.clone(), String::new())
        };
        ws.send(Message::text(serde_json::to_string(&EpMsg::Finished(done)).expect("encode"))).await.expect("report");
        assigned.push(a);
    }
    let (a, b) = (&assigned[0], &assigned[1]);
    let (ca, cb) = (a.checkpoint.as_ref().expect("a's area"), b.checkpoint.as_ref().expect("b's area"));
    assert_ne!(ca.url, cb.url, "an area per job");
    for c in [ca, cb] {
        assert!(c.url.contains("/checkpoints/") && c.url.ends_with('/'), "{}", c.url);
        assert_eq!((c.max_bytes, c.exit_code), (1024 * 1024, Some(85)));
    }

    // Its own area: written, replaced, read back.
    let own = format!("{}{CHECKPOINT_FILE}", ca.url);
    assert!(put(&own, &ca.macaroon, b"state 1").await.is_success());
    assert!(put(&own, &ca.macaroon, b"state 2").await.is_success(), "replaced");
    assert_eq!(get(&own, &ca.macaroon).await, (StatusCode::OK, b"state 2".to_vec()));

    // The other job's area: neither written nor read.
    let theirs = format!("{}{CHECKPOINT_FILE}", cb.url);
    assert!(put(&theirs, &cb.macaroon, b"theirs").await.is_success());
    assert_eq!(put(&theirs, &ca.macaroon, b"overwritten").await, StatusCode::FORBIDDEN);
    assert_eq!(get(&theirs, &ca.macaroon).await.0, StatusCode::FORBIDDEN);
    assert_eq!(delete(&theirs, &ca.macaroon).await, StatusCode::FORBIDDEN);
    assert_eq!(delete(&cb.url, &ca.macaroon).await, StatusCode::FORBIDDEN);
    assert_eq!(get(&theirs, &cb.macaroon).await, (StatusCode::OK, b"theirs".to_vec()), "left as it was");

    // Nor the job's input or output directory, nor its area with its write macaroon.
    let input = &a.input.as_ref().expect("an input").url;
    assert_eq!(get(input, &ca.macaroon).await.0, StatusCode::FORBIDDEN);
    assert_eq!(put(&format!("{}x", a.output.url), &ca.macaroon, b"x").await, StatusCode::FORBIDDEN);
    assert_eq!(put(&format!("{}other", ca.url), &a.output.macaroon, b"x").await, StatusCode::FORBIDDEN);
    assert_eq!(delete(input, &ca.macaroon).await, StatusCode::FORBIDDEN);
    assert_eq!(delete(&own, &a.output.macaroon).await, StatusCode::FORBIDDEN);

    // Its own area it clears: the checkpoint, then the directory, once empty.
    assert_eq!(delete(&ca.url, &ca.macaroon).await, StatusCode::CONFLICT, "not empty");
    assert_eq!(delete(&own, &ca.macaroon).await, StatusCode::NO_CONTENT);
    assert_eq!(delete(&ca.url, &ca.macaroon).await, StatusCode::NO_CONTENT);
    assert_eq!(get(&own, &ca.macaroon).await.0, StatusCode::NOT_FOUND);
    stack.stop().await.expect("clean stop");
}
