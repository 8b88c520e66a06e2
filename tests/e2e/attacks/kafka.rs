//! Attacks through dCache's Kafka topic (issue 21): whoever may produce to the billing topic
//! speaks, through `htfaas bridge dcache-kafka`, as the storage does, and may lie. What a
//! lying record gets, on the real stack with a real broker (tansu):
//!
//! - a record claiming an upload in another owner's directory (and another uploader) fires
//!   only the functions that directory's rules fire, as a real upload there would: its owner's,
//!   never the claimed uploader's; the bridge puts it on that directory's path subject, which
//!   only that owner's lane reads;
//! - a record for a path outside the paths the billing subject may speak for (`source_paths`)
//!   is refused by the gateway and counted (`events_out_of_bounds`), though a function waits on
//!   that path;
//! - a path that is not clean (`..`) is refused by the bridge, counted malformed, and never
//!   published;
//! - a record's own `Nats-Msg-Id` header (and key) are dropped: it cannot make JetStream drop
//!   the next record as a duplicate of itself;
//! - the bridge's NATS credential publishes billing messages and nothing else
//!   (`Permissions Violation` on a CloudEvents subject).
//!
//! A legitimate record last: the lanes read in order, so by its job everything before it was
//! decided.

use crate::kafka::{Bridge, settings};
use crate::kafka_support::{
    Tansu, client as kafka_client, create_topic, produce, produce_record, record, tansu_installed, transfer,
};
use htfaas::stack::{USER, demo_manifest};
use htfaas_functions::manifest::{Outputs, Trigger};
use htfaas_functions::namespace::Right;
use htfaas_functions::nats::connect_options;
use htfaas_functions::proto::{CLOUDEVENTS_SUBJECT_PREFIX, JobState};
use htfaas_gateway::bridge::kafka::message_id;
use htfaas_tests::{events_settled, start_stack, upload_checksum, wait_for};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_record_fires_only_what_its_directorys_rules_allow_and_chooses_neither_subject_nor_message_id() {
    let Some(tansu) = tansu_installed("the Kafka attack") else { return };
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let broker = tokio::task::block_in_place(|| Tansu::start(&tansu, &dir.path().join("kafka")));
    let kafka = kafka_client(&broker.bootstrap()).await;
    let topic = create_topic(&kafka, "billing", 1).await;
    let p = &topic[0];

    // bob reads /data/bob/ and fires on it (writing to /data/bob-out/); alice (the stack's user) fires on /data/alice/ and,
    // granted /site/, on /site/ (outside the billing subject's source_paths, /data/).
    client.grant("bob", Right::Read, "/data/bob/").await.expect("grant bob /data/bob/");
    client.grant("bob", Right::Write, "/data/bob-out/").await.expect("grant bob /data/bob-out/");
    client.grant(USER, Right::Read, "/site/").await.expect("grant /site/");
    for path in ["/data/bob/in.dat", "/data/alice/in.dat", "/data/alice/next.dat"] {
        client.put_bytes(b"kafka".to_vec(), path).await.expect("put");
    }
    events_settled(&client).await;
    let digest = upload_checksum(&client).await;
    let function = |name: &str, owner: &str, trigger: &str, out: &str| {
        let mut m = demo_manifest(digest.clone());
        m.name = name.into();
        m.owner = owner.into();
        m.trigger = Trigger::on_path(trigger);
        m.outputs = Outputs { dir: out.into(), replace: false };
        m
    };
    client.register(&function("bobs", "bob", "/data/bob/**", "/data/bob-out/")).await.expect("bob's function");
    client.register(&function("alices", USER, "/data/alice/**", "/data/alice-out/")).await.expect("alice's");
    client.register(&function("site", USER, "/site/**", "/data/site-out/")).await.expect("alice's on /site/");

    let bridge = Bridge::start(settings(&stack, &broker.bootstrap()));
    // 1. An upload to bob's directory, claimed as alice's.
    let o1 = produce(p, &transfer("/data/bob/in.dat", 1)).await;
    // 2. Outside the paths the billing subject may speak for.
    produce(p, &transfer("/site/in/forged.dat", 2)).await;
    // 3. A path climbing out of alice's directory into bob's.
    produce(p, &transfer("/data/alice/../bob/in.dat", 3)).await;
    // 4. A record naming the next record's message id (and a key): if the bridge passed it on,
    // JetStream would drop the next one as its duplicate.
    let next = o1 + 4;
    let mut forged = record(&transfer("/data/alice/in.dat", 4));
    forged.key = Some(b"storage.dcache.billing.path.data.bob._".to_vec());
    forged.headers.insert("Nats-Msg-Id".into(), message_id("billing", 0, next).into_bytes());
    produce_record(p, forged).await;
    let o5 = produce(p, &transfer("/data/alice/next.dat", 5)).await;
    assert_eq!(o5, next);

    let jobs = wait_for("the jobs of every record", LIMIT, || async {
        let jobs = client.jobs().await.ok()?;
        let done = |path: &str| jobs.iter().any(|j| j.event.path == path && j.state == JobState::Completed);
        (done("/data/bob/in.dat") && done("/data/alice/in.dat") && done("/data/alice/next.dat")).then_some(jobs)
    })
    .await;
    wait_for("the refusal to be counted", LIMIT, || async {
        (client.stats().await.ok()?.events_out_of_bounds == 1).then_some(())
    })
    .await;
    let mut ran: Vec<(String, String, String)> =
        jobs.iter().map(|j| (j.function.clone(), j.owner.clone(), j.event.path.clone())).collect();
    ran.sort();
    let want = [
        ("alices", USER, "/data/alice/in.dat"),
        ("alices", USER, "/data/alice/next.dat"),
        ("bobs", "bob", "/data/bob/in.dat"),
    ]
    .map(|(f, o, p)| (f.to_owned(), o.to_owned(), p.to_owned()));
    assert_eq!(ran, want, "bob's directory fired bob's function only, /site/ nothing, the climbing path nothing");
    let s = bridge.wait("every record committed", |s| s.received == 5 && s.lag == 0).await;
    assert_eq!((s.published, s.malformed, s.duplicates), (4, 1, 0), "the climbing path was never published: {s:?}");
    bridge.stop().await;

    // 5. The bridge's credential publishes billing messages only.
    let (errors_tx, mut errors) = tokio::sync::mpsc::unbounded_channel();
    let nats = connect_options("kafka-bridge", stack.nats_credential("bridge-dcache-kafka"))
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
        .expect("the bridge's credential connects");
    let subject = format!("{CLOUDEVENTS_SUBJECT_PREFIX}.dcache-sse");
    nats.publish(subject.clone(), b"{}".to_vec().into()).await.expect("queued");
    nats.flush().await.expect("flush");
    let refusal = tokio::time::timeout(LIMIT, errors.recv()).await.expect("a refusal").expect("an error");
    assert_eq!(refusal, format!(r#"nats: Permissions Violation for Publish to "{subject}""#));
    stack.stop().await.expect("clean stop");
}
