//! Attacks on the events bus: the stack's nats-server admits only the stack's nkey
//! credentials, each with the subjects of its role (`htfaas::nats::stack_user`), and the
//! gateway binds each events subject to the paths it may speak for (`source_paths`).
//!
//! - A client without a credential, or with one the server does not know, cannot connect
//!   (`authorization violation`), so it cannot publish the billing message that would make the
//!   gateway obtain a read macaroon for a file; nothing it tried reaches the stream.
//! - A bridge's credential cannot publish on the billing subject (`Permissions Violation for
//!   Publish to "storage.dcache.billing"`); on its own subject, an event for a path outside the
//!   stack's `/data/` is refused by the gateway, counted (`events_out_of_bounds`,
//!   `htfaas_gateway_events_total{outcome="out_of_bounds"}`) and starts no job, while the same
//!   bridge's event inside `/data/` starts one.
//! - A publisher that may publish billing messages routes one to the lane of another
//!   directory (a path subject carries its file's directory, and the gateway's owner
//!   lanes read the subjects of their namespaces): the gateway finds the payload's path is not
//!   the subject's, counts it malformed and fires nothing for it.
//! - Job-end notifications are the scheduler's: a bridge cannot publish one on
//!   `htfaas.jobs.…`, and the scheduler's credential publishes no storage event.
//!
//! Each test waits for a legitimate event's job after the attack: the gateway reads the stream
//! in order, so by then it has decided whatever the attacker managed to put before it.

use async_nats::jetstream;
use htfaas::stack::{USER, demo_manifest};
use htfaas::traffic::transfer_write;
use htfaas_functions::manifest::Trigger;
use htfaas_functions::nats::{NatsCredential, connect_options};
use htfaas_functions::proto::{CLOUDEVENTS_SUBJECT_PREFIX, EVENTS_STREAM, EVENTS_SUBJECT, JobState, path_subject};
use htfaas_tests::{start_stack, upload_checksum, wait_for};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// Waits until the job fired by `path` has completed.
async fn completed(client: &htfaas::client::Client, path: &str) {
    wait_for(&format!("the job of {path}"), LIMIT, || async {
        let jobs = client.jobs().await.ok()?;
        jobs.iter().any(|j| j.event.path == path && j.state == JobState::Completed).then_some(())
    })
    .await;
}

/// A structured CloudEvent as the XRootD bridge publishes it, for a write of `path`.
fn bridged_write(id: u32, path: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"specversion": "1.0", "id": id.to_string(),
        "source": "xrootd://data01.example.org:1094", "type": "org.htfaas.storage.xrootd-notify.closew",
        "datacontenttype": "application/json",
        "data": {"kind": "write", "msg_type": "closew", "path": path, "size": 5}}))
    .expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_a_known_nats_credential_cannot_connect_and_its_forged_event_starts_no_job() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    client.put_bytes(b"secret".to_vec(), "/data/raw/victim.dat").await.expect("put");
    let digest = upload_checksum(&client).await;
    client.register(&demo_manifest(digest)).await.expect("register");

    // No credential at all, then a well-formed nkey the server was never told of.
    let anonymous = async_nats::connect(stack.nats_url()).await.expect_err("an anonymous client is refused");
    assert_eq!(anonymous.kind(), async_nats::ConnectErrorKind::AuthorizationViolation, "{anonymous}");
    let stranger = NatsCredential::generate();
    let e = connect_options("attacker", Some(&stranger))
        .connect(stack.nats_url())
        .await
        .expect_err("an unknown nkey is refused");
    assert_eq!(e.kind(), async_nats::ConnectErrorKind::AuthorizationViolation, "{e}");

    // A legitimate upload fires after the attempts; then nothing but it ever reached the gateway.
    client.put_bytes(b"legit".to_vec(), "/data/raw/legit.dat").await.expect("put");
    completed(&client, "/data/raw/legit.dat").await;
    let jobs = client.jobs().await.expect("jobs");
    let paths: Vec<&str> = jobs.iter().map(|j| j.event.path.as_str()).collect();
    assert_eq!(paths, ["/data/raw/legit.dat"], "the forged event for victim.dat started no job");
    // The only message naming victim.dat is its own upload's, from before the function existed.
    let js = jetstream::new(stack.nats_client().await.expect("the operator connects"));
    let mut stream = js.get_stream(EVENTS_STREAM).await.expect("the events stream");
    let last = stream.info().await.expect("stream info").state.last_sequence;
    let mut victim = 0;
    for seq in 1..=last {
        let m = stream.get_raw_message(seq).await.expect("a stored message");
        let v: serde_json::Value = serde_json::from_slice(&m.payload).expect("the storage writes JSON");
        victim += usize::from(v["transferPath"] == "/data/raw/victim.dat");
    }
    assert_eq!(victim, 1, "no forged message for victim.dat reached the stream");
    stack.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_credential_cannot_publish_billing_and_its_event_outside_its_paths_is_refused_and_counted() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    client.put_bytes(b"bridged".to_vec(), "/data/raw/bridged.dat").await.expect("put");
    let digest = upload_checksum(&client).await;
    client.register(&demo_manifest(digest.clone())).await.expect("register");
    // A function of the stack's user that would fire on /site/: only the binding stops the
    // bridge's event there.
    client.grant(USER, htfaas_functions::namespace::Right::Read, "/site/").await.expect("grant /site/");
    let mut site = demo_manifest(digest);
    site.name = "site-checksum".into();
    site.trigger = Trigger::on_path("/site/**");
    site.outputs.dir = "/data/site-checksums/".into();
    client.register(&site).await.expect("register on /site/");

    let (errors_tx, mut errors) = tokio::sync::mpsc::unbounded_channel();
    let bridge = stack.nats_credential("bridge-xrootd-notify").expect("the bridge's credential");
    let nats = connect_options("bridge", Some(bridge))
        .event_callback(move |event| {
            let errors_tx = errors_tx.clone();
            async move {
                if let async_nats::Event::ServerError(e) = event {
                    let _ = errors_tx.send(e.to_string());
                }
            }
        })
        .connect(stack.nats_url())
        .await
        .expect("the bridge connects with its own credential");

    // 1. The billing subject is the storage's: the server refuses the bridge's publish.
    nats.publish(EVENTS_SUBJECT, transfer_write("/data/raw/bridged.dat", 7, "forged", 1).into()).await.expect("queued");
    nats.flush().await.expect("flush");
    let refusal = tokio::time::timeout(LIMIT, errors.recv()).await.expect("a refusal").expect("an error");
    assert_eq!(refusal, r#"nats: Permissions Violation for Publish to "storage.dcache.billing""#);

    // 2. Its own subject takes the event, but the gateway refuses a path outside /data/.
    let js = jetstream::new(nats);
    let subject = format!("{CLOUDEVENTS_SUBJECT_PREFIX}.xrootd-notify");
    js.publish(subject.clone(), bridged_write(1, "/site/in/forged.dat").into())
        .await
        .expect("publish")
        .await
        .expect("the stream takes the bridge's event");
    js.publish(subject, bridged_write(2, "/data/raw/bridged.dat").into())
        .await
        .expect("publish")
        .await
        .expect("the stream takes the bridge's event");

    completed(&client, "/data/raw/bridged.dat").await;
    wait_for("the refusal to be counted", LIMIT, || async {
        (client.stats().await.ok()?.events_out_of_bounds == 1).then_some(())
    })
    .await;
    let jobs = client.jobs().await.expect("jobs");
    let paths: Vec<&str> = jobs.iter().map(|j| j.event.path.as_str()).collect();
    assert_eq!(paths, ["/data/raw/bridged.dat"], "neither the forged billing message nor /site/ started a job");
    let info = stack.info();
    let metrics = htfaas_gateway::http_client()
        .expect("http")
        .get(format!("{}/metrics", info.gateway_url))
        .bearer_auth(&info.admin_token)
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("metrics");
    assert!(metrics.contains(r#"htfaas_gateway_events_total{outcome="out_of_bounds"} 1"#), "{metrics}");
    stack.stop().await.expect("clean stop");
}

/// A billing message whose path subject is not its path's (routed to the lane of
/// another directory) fires nothing, is counted malformed, and the lane goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_billing_message_on_another_directorys_path_subject_fires_nothing_and_is_counted_malformed() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    // Stored before the function exists: its own billing message fires nothing.
    client.put_bytes(b"victim".to_vec(), "/data/raw/victim.dat").await.expect("put");
    let digest = upload_checksum(&client).await;
    client.register(&demo_manifest(digest)).await.expect("register");

    // The operator may publish billing messages: one for /data/raw/victim.dat, on the subject
    // of /data/raw/sub/ (the function's lane reads both directories; its trigger, /data/raw/**,
    // would fire on the payload's path if the subject were believed).
    let js = jetstream::new(stack.nats_client().await.expect("operator"));
    let lie = transfer_write("/data/raw/victim.dat", 6, "lie", 1);
    js.publish(path_subject("/data/raw/sub/x.dat"), lie.into()).await.expect("publish").await.expect("stored");
    // Then a legitimate upload, whose storage message comes after it on the same lane.
    client.put_bytes(b"after".to_vec(), "/data/raw/after.dat").await.expect("put");

    completed(&client, "/data/raw/after.dat").await;
    let stats = client.stats().await.expect("stats");
    assert_eq!(stats.events_malformed, 1, "{stats:?}");
    let jobs = client.jobs().await.expect("jobs");
    let paths: Vec<&str> = jobs.iter().map(|j| j.event.path.as_str()).collect();
    assert_eq!(paths, ["/data/raw/after.dat"], "the misrouted message started no job");
    stack.stop().await.expect("clean stop");
}

/// Job-end notifications are the scheduler's alone. A bridge cannot forge one (a
/// failed job's, which would put an entry in its owner's dead-letter list), and the
/// scheduler's credential, which publishes them, cannot publish a storage event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_scheduler_publishes_job_end_notifications_and_it_publishes_no_event() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let refusals = |name: &'static str| {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let options = connect_options(name, stack.nats_credential(name)).event_callback(move |event| {
            let tx = tx.clone();
            async move {
                if let async_nats::Event::ServerError(e) = event {
                    let _ = tx.send(e.to_string());
                }
            }
        });
        (options, rx)
    };
    let forged = serde_json::json!({"seq": 1, "job_id": "forged", "owner": USER, "function": "checksum",
        "version": 1, "state": "failed", "event": {"source": "x", "id": "x", "path": "/data/raw/x"},
        "attempts": 1, "finished_at_ms": 1});
    let (options, mut errors) = refusals("bridge-xrootd-notify");
    let bridge = options.connect(stack.nats_url()).await.expect("the bridge connects");
    bridge.publish("htfaas.jobs.alice.checksum.failed", forged.to_string().into()).await.expect("queued");
    bridge.flush().await.expect("flush");
    let refusal = tokio::time::timeout(LIMIT, errors.recv()).await.expect("a refusal").expect("an error");
    assert_eq!(refusal, r#"nats: Permissions Violation for Publish to "htfaas.jobs.alice.checksum.failed""#);

    let (options, mut errors) = refusals("scheduler");
    let scheduler = options.connect(stack.nats_url()).await.expect("the scheduler's credential connects");
    scheduler.publish(EVENTS_SUBJECT, transfer_write("/data/raw/x", 7, "forged", 1).into()).await.expect("queued");
    scheduler.flush().await.expect("flush");
    let refusal = tokio::time::timeout(LIMIT, errors.recv()).await.expect("a refusal").expect("an error");
    assert_eq!(refusal, r#"nats: Permissions Violation for Publish to "storage.dcache.billing""#);

    // A real job's end still comes through, and the forged failure made no dead letter.
    let digest = upload_checksum(&client).await;
    client.register(&demo_manifest(digest)).await.expect("register");
    client.put_bytes(b"legit".to_vec(), "/data/raw/legit.dat").await.expect("put");
    completed(&client, "/data/raw/legit.dat").await;
    let js = jetstream::new(stack.nats_client().await.expect("operator"));
    wait_for("the real notification", LIMIT, || async {
        let stream = js.get_stream(htfaas_functions::proto::JOBS_STREAM).await.ok()?;
        stream.get_last_raw_message_by_subject("htfaas.jobs.alice.checksum.completed").await.ok()
    })
    .await;
    assert!(client.dead_letters(None, None, true).await.expect("list").is_empty());
    stack.stop().await.expect("clean stop");
}
