//! Faults without a crash, on the real stack: nats-server SIGKILLed and restarted
//! while events are in flight. The gateway's client reconnects, its durable consumer resumes
//! where its acks left it, and every uploaded file fires exactly one job; an upload made while
//! NATS is down waits for the event's PubAck at most the storage's bound (5 s): within it (a
//! short outage) it is answered 201; past it, 503 with a message saying the file was stored and
//! the upload should be retried, never a hang. The storage's NATS client still holds that
//! event and publishes it when NATS is back, so the file fires once even if nobody retries.

use htfaas::stack::demo_manifest;
use htfaas_functions::proto::{EVENTS_STREAM, JobRecord, JobState};
use htfaas_tests::{start_stack, upload_checksum, wait_for};
use reqwest::StatusCode;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(120);

/// Jobs per input path.
fn per_path(jobs: &[JobRecord]) -> BTreeMap<String, usize> {
    let mut paths = BTreeMap::new();
    for j in jobs {
        *paths.entry(j.event.path.clone()).or_default() += 1;
    }
    paths
}

/// Whether the gateway's consumer has delivered every message of the stream. (One delivered
/// just before the kill may stay unacked, its ack lost with the connection, until the
/// consumer's `ack_wait` redelivers it; the firing table then drops the copy.)
async fn consumer_delivered_all(client: &htfaas::client::Client) -> bool {
    let Ok(nats) = client.nats().await else { return false };
    let js = async_nats::jetstream::new(nats);
    let Ok(stream) = js.get_stream(EVENTS_STREAM).await else { return false };
    let Ok(mut consumer) = stream.get_consumer::<async_nats::jetstream::consumer::pull::Config>("gateway").await else {
        return false;
    };
    consumer.info().await.is_ok_and(|i| i.num_pending == 0)
}

/// A PUT of `body` to `path` as the stack's user: its status, its body and how long it took.
async fn put(info: &htfaas::client::StackInfo, path: &str, body: &str) -> (StatusCode, String, Duration) {
    let started = Instant::now();
    let resp = reqwest::Client::new()
        .put(format!("{}{path}", info.storage_url))
        .basic_auth(&info.user, Some(&info.user_secret))
        .body(body.to_owned())
        .send()
        .await
        .expect("the storage answers");
    let status = resp.status();
    (status, resp.text().await.unwrap_or_default(), started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_killed_with_events_in_flight_loses_none_and_the_gateway_resumes() {
    let (_dir, mut stack) = start_stack().await;
    let client = stack.client().expect("client");
    let info = client.info().clone();
    let checksum = upload_checksum(&client).await;
    client.register(&demo_manifest(checksum)).await.expect("register checksum on /data/raw/**");
    let mut expected: BTreeMap<String, usize> = BTreeMap::new();

    // Uploads whose events are in the stream (each PUT is answered after its PubAck), then
    // NATS is killed before the gateway has turned them all into jobs.
    const BEFORE: usize = 8;
    for i in 0..BEFORE {
        let path = format!("/data/raw/before-{i}.dat");
        client.put_bytes(format!("before {i}").into_bytes(), &path).await.expect("upload");
        expected.insert(path, 1);
    }
    let jobs_at_kill = client.jobs().await.expect("jobs");
    let finished_at_kill = jobs_at_kill.iter().filter(|j| j.state == JobState::Completed).count();
    let received_at_kill = stack.gateway().stats.snapshot().events_received;
    // A short outage, with an upload in it: it waits for NATS to come back (its PubAck within
    // the storage's bound) or is refused; either way it is answered.
    let short = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        put(&info, "/data/raw/during-short.dat", "during a short outage").await
    };
    let (restarted, (status, body, took)) = tokio::join!(stack.kill_and_restart_nats(Duration::from_secs(2)), short);
    restarted.expect("restart nats-server");
    eprintln!(
        "when NATS was killed: {received_at_kill} events received, {} jobs submitted, {finished_at_kill}/{BEFORE} \
         finished; PUT in a 2 s outage: {status} after {took:?}: {body}",
        jobs_at_kill.len()
    );
    assert!(took < Duration::from_secs(15), "answered in bounded time: {took:?}");
    match status {
        StatusCode::CREATED => {
            expected.insert("/data/raw/during-short.dat".into(), 1);
        }
        StatusCode::SERVICE_UNAVAILABLE => assert!(body.contains("was stored") && body.contains("retry"), "{body}"),
        other => panic!("PUT during a short outage: {other}: {body}"),
    }
    // The gateway's client is back before the second outage starts: otherwise, waiting out its
    // reconnect backoff, it would see the two outages as one (as CI's load once made it).
    wait_for("the gateway back on NATS after the short outage", LIMIT, || async {
        let g = &stack.gateway().stats;
        (g.nats_reconnects.load(Ordering::Relaxed) >= 1).then_some(())
    })
    .await;

    // A longer outage: the PUT is refused with 503 once its PubAck is overdue, saying what
    // became of the file and what to do.
    let long = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        put(&info, "/data/raw/during-long.dat", "during a long outage").await
    };
    let (restarted, (status, body, took)) = tokio::join!(stack.kill_and_restart_nats(Duration::from_secs(9)), long);
    restarted.expect("restart nats-server");
    eprintln!("PUT in a 9 s outage: {status} after {took:?}: {body}");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(took < Duration::from_secs(12), "refused in bounded time, not a hang: {took:?}");
    assert!(
        body.contains("/data/raw/during-long.dat was stored, but its storage event could not be published")
            && body.contains("retry the upload"),
        "{body}"
    );
    assert_eq!(
        client.get_bytes("/data/raw/during-long.dat").await.expect("get").as_deref(),
        Some(&b"during a long outage"[..])
    );

    // After: more uploads; all are processed by the same gateway, which reconnected.
    const AFTER: usize = 6;
    for i in 0..AFTER {
        let path = format!("/data/raw/after-{i}.dat");
        client.put_bytes(format!("after {i}").into_bytes(), &path).await.expect("upload after the restart");
        expected.insert(path, 1);
    }
    // ... and the refused upload's: see below.
    let want = expected.len() + 1;
    let resumed = Instant::now();
    let jobs = wait_for("a finished job for every upload, nothing left to deliver or dispatch", LIMIT, || async {
        let jobs = client.jobs().await.ok()?;
        let finished = jobs.iter().filter(|j| j.state == JobState::Completed).count();
        let done = finished >= want && stack.gateway().firings.pending() == 0 && consumer_delivered_all(&client).await;
        done.then_some(jobs)
    })
    .await;
    eprintln!("every upload processed {:?} after the last one", resumed.elapsed());
    // Nothing is left in flight (every message delivered and acked, every firing submitted, and
    // a submit answers only once the job is stored): a duplicate would be among these jobs now.
    let mut got = per_path(&jobs);
    let long_outage_jobs = got.remove("/data/raw/during-long.dat").unwrap_or(0);
    let short_outage_jobs = got.get("/data/raw/during-short.dat").copied();
    if !expected.contains_key("/data/raw/during-short.dat") {
        got.remove("/data/raw/during-short.dat");
    }
    eprintln!("refused uploads' jobs: long outage {long_outage_jobs}, short outage {short_outage_jobs:?}");
    // The refused upload's event was still held by the storage's NATS client and went out when
    // NATS came back: announced late, once (a retry of the PUT, as the answer asks, would
    // announce the file again, with an event of its own).
    assert_eq!(long_outage_jobs, 1, "the refused upload was announced once NATS was back");
    assert_eq!(got, expected, "exactly one job per accepted upload");
    assert!(jobs.iter().all(|j| j.state == JobState::Completed), "{jobs:#?}");

    let g = &stack.gateway().stats;
    // Its return is counted by the client's event task, which may run after the jobs it let in.
    wait_for("the gateway's second return counted", LIMIT, || async {
        (g.nats_reconnects.load(Ordering::Relaxed) >= 2).then_some(())
    })
    .await;
    let (disconnects, reconnects) =
        (g.nats_disconnects.load(Ordering::Relaxed), g.nats_reconnects.load(Ordering::Relaxed));
    let s = g.snapshot();
    eprintln!("gateway: {disconnects} disconnects, {reconnects} reconnects; {s:?}");
    assert!(disconnects >= 2 && reconnects >= 2, "both outages seen and recovered: {disconnects}, {reconnects}");
    assert_eq!((s.jobs_refused, s.firings_pending), (0, 0), "{s:?}");
    assert!(s.events_received >= want as u64, "{s:?}");
    stack.stop().await.expect("clean stop: no component failed");
}
