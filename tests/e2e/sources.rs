//! Every storage event source becomes one event: dCache billing messages
//! of the types the site enabled, CloudEvents in binary and structured mode; the pool's
//! `transfer` and the door's `request` of one upload start one job; a type the site did not
//! enable starts nothing and is counted; an events stream made before CloudEvents existed is
//! widened at start, its unread events kept.

use htfaas::stack::demo_manifest;
use htfaas_functions::proto::{
    CLOUDEVENTS_SUBJECT_PREFIX, DEFAULT_LANE_SUBJECTS, EVENTS_STREAM, EVENTS_SUBJECT, EVENTS_SUBJECTS,
};
use htfaas_functions::sources::SourcePolicy;
use htfaas_tests::{adler32_hex, start_stack, upload_checksum, wait_for};
use serde_json::json;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(30);
const PNFSID: &str = "0000C9B4E7A1F2D34E5C8B1A9F0E7D6C5B4A";
const DOOR_SESSION: &str = "door:webdav-1@webdavDomain:1773479729001";

/// Puts `bytes` at each path before any function is registered, so that the built-in storage's
/// own billing messages fire nothing: the events under test are the ones the test publishes.
async fn put_unmatched(client: &htfaas::client::Client, files: &[(&str, &[u8])]) {
    for (path, bytes) in files {
        client.put_bytes(bytes.to_vec(), path).await.expect("put");
    }
    htfaas_tests::events_settled(client).await;
}

async fn checksum_output(client: &htfaas::client::Client, name: &str) -> String {
    let out = wait_for(&format!("the checksum of {name}"), LIMIT, || async {
        client.get_bytes(&format!("/data/checksums/{name}.checksums.json")).await.expect("get")
    })
    .await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transfer_and_the_request_of_one_upload_start_one_job_and_a_type_not_enabled_none() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    stack
        .gateway()
        .set_sources(SourcePolicy { dcache_msg_types: vec!["transfer".into(), "request".into()], cloudevents: true })
        .expect("a valid policy");
    const DATA: &[u8] = b"run 42, as dCache saw it\n";
    put_unmatched(&client, &[("/data/raw/run42.h5", DATA)]).await;
    let digest = upload_checksum(&client).await;
    client.register(&demo_manifest(digest)).await.expect("register");

    // The pool's transfer and the door's request of the same upload (shared/reference/dcache.md
    // §1.3), the door's with its quirks: upper-case VERSION, the mover's view nested.
    let transfer = json!({"version":"1.0","msgType":"transfer","date":"2026-03-14T10:15:30.123+01:00",
        "cellName":"pool-a-1","cellType":"pool","cellDomain":"pool-aDomain","status":{"code":0,"msg":""},
        "session":"pool:pool-a-1@pool-aDomain:1773479730123-4711",
        "subject":["UidPrincipal[1000]","UserNamePrincipal[alice]","Origin[198.51.100.7]"],
        "pnfsid":PNFSID,"billingPath":"/data/raw/run42.h5","transferPath":"/data/raw/run42.h5",
        "fileSize":DATA.len(),"storageInfo":"exp:raw@osm","isWrite":"write","initiator":DOOR_SESSION,"isP2p":false});
    let request = json!({"VERSION":"1.0","msgType":"request","date":"2026-03-14T10:15:30.200+01:00",
        "cellName":"webdav-1","cellType":"door","cellDomain":"webdavDomain","status":{"code":0,"msg":""},
        "session":DOOR_SESSION,"transferPath":"/data/raw/run42.h5","owner":"alice","pnfsid":PNFSID,
        "billingPath":"/data/raw/run42.h5","fileSize":DATA.len(),
        "moverInfo":{"version":"1.0","msgType":"transfer","cellName":"pool-a-1","cellType":"pool",
            "cellDomain":"pool-aDomain","status":{"code":0,"msg":""},"isWrite":"write","isP2p":false,
            "transferPath":"/data/raw/run42.h5"}});
    for m in [&transfer, &request] {
        client.publish_event(EVENTS_SUBJECT, serde_json::to_vec(m).expect("json")).await.expect("publish");
    }
    assert!(checksum_output(&client, "run42.h5").await.contains(&adler32_hex(DATA)));
    wait_for("the request to be deduplicated against the transfer", LIMIT, || async {
        (client.stats().await.ok()?.jobs_deduplicated == 1).then_some(())
    })
    .await;

    // A door remove: a type this site did not enable.
    let remove = json!({"VERSION":"1.0","msgType":"remove","cellType":"door","cellName":"webdav-1",
        "cellDomain":"webdavDomain","status":{"code":0,"msg":""},"session":"door:webdav-1@webdavDomain:2",
        "transferPath":"/data/raw/run42.h5","pnfsid":PNFSID,"owner":"alice"});
    client.publish_event(EVENTS_SUBJECT, serde_json::to_vec(&remove).expect("json")).await.expect("publish");
    let stats = wait_for("the remove to be counted as not enabled", LIMIT, || async {
        let s = client.stats().await.ok()?;
        (s.events_not_enabled == 1).then_some(s)
    })
    .await;
    assert_eq!((stats.jobs_submitted, stats.jobs_deduplicated, stats.events_malformed), (1, 1, 0), "{stats:?}");
    // The transfer, the request, the remove. The put's own and the job's output's went on path
    // subjects no lane reads (no trigger is bounded to their directories then).
    assert_eq!((stats.events_dcache_billing, stats.events_unmatched), (3, 0), "{stats:?}");
    let jobs = client.jobs().await.expect("jobs");
    assert_eq!(jobs.len(), 1, "one upload, one job: {jobs:#?}");
    let event = &jobs[0].event;
    assert_eq!(event.id, format!("dcache-billing:write:{PNFSID}/{DOOR_SESSION}"));
    assert_eq!(event.source, "dcache-billing:pool-a-1@pool-aDomain", "the first producer, for audit");
    assert_eq!(event.path, "/data/raw/run42.h5");
    stack.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_in_binary_and_in_structured_mode_each_fire_a_function() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    const BIN: &[u8] = b"sent as a binary-mode CloudEvent\n";
    const STRUCT: &[u8] = b"sent as a structured CloudEvent by a bridge\n";
    put_unmatched(&client, &[("/data/raw/ce-bin.dat", BIN), ("/data/raw/ce-struct.dat", STRUCT)]).await;
    let digest = upload_checksum(&client).await;
    client.register(&demo_manifest(digest)).await.expect("register");

    // Binary mode, from any producer: attributes in headers, the path in ce-subject.
    let headers: Vec<(String, String)> = [
        ("ce-specversion", "1.0"),
        ("ce-id", "daq-1"),
        ("ce-source", "//lab.example/daq"),
        ("ce-type", "org.example.daq.closed"),
        ("ce-subject", "/data/raw/ce-bin.dat"),
        ("content-type", "application/json"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let subject = format!("{CLOUDEVENTS_SUBJECT_PREFIX}.daq");
    let data = json!({"kind": "write", "size": BIN.len()});
    client
        .publish_event_with_headers(&subject, &headers, serde_json::to_vec(&data).expect("json"))
        .await
        .expect("publish binary");
    // Structured mode, as the XRootD bridge publishes: a BridgedEvent in data.
    let structured = json!({"specversion":"1.0","id":"17","source":"xrootd://data01.example.org:1094",
        "type":"org.htfaas.storage.xrootd-notify.closew","datacontenttype":"application/json",
        "data":{"kind":"write","msg_type":"closew","path":"/data/raw/ce-struct.dat","size":STRUCT.len()}});
    client
        .publish_event(
            &format!("{CLOUDEVENTS_SUBJECT_PREFIX}.xrootd-notify"),
            serde_json::to_vec(&structured).expect("json"),
        )
        .await
        .expect("publish structured");

    assert!(checksum_output(&client, "ce-bin.dat").await.contains(&adler32_hex(BIN)));
    assert!(checksum_output(&client, "ce-struct.dat").await.contains(&adler32_hex(STRUCT)));
    let mut events: Vec<_> = client.jobs().await.expect("jobs").into_iter().map(|j| j.event).collect();
    events.sort_by(|a, b| a.path.cmp(&b.path));
    let seen: Vec<_> = events.iter().map(|e| (e.source.as_str(), e.id.as_str(), e.path.as_str())).collect();
    assert_eq!(
        seen,
        [
            ("cloudevents://lab.example/daq", "cloudevents://lab.example/daq/daq-1", "/data/raw/ce-bin.dat"),
            (
                "xrootd-notify:xrootd://data01.example.org:1094",
                "xrootd-notify:xrootd://data01.example.org:1094/17",
                "/data/raw/ce-struct.dat"
            ),
        ]
    );
    let stats = client.stats().await.expect("stats");
    assert_eq!((stats.events_cloudevents, stats.jobs_submitted, stats.events_malformed), (2, 2, 0), "{stats:?}");
    stack.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_events_stream_and_consumer_made_for_billing_only_are_widened_and_keep_their_events() {
    use async_nats::jetstream::{self, consumer::pull};
    let binary = htfaas::nats::find_binary().expect("nats-server (HTFAAS_NATS_SERVER)");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut nats = htfaas::nats::NatsServer::start(&binary, dir.path(), htfaas::nats::free_port().expect("port"))
        .expect("start nats-server");
    let js = jetstream::new(async_nats::connect(nats.url()).await.expect("connect"));
    // As an older gateway (or the storage) left it: one subject, a consumer filtered on it,
    // and an event not read yet.
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: EVENTS_STREAM.into(),
            subjects: vec![EVENTS_SUBJECT.into()],
            ..Default::default()
        })
        .await
        .expect("old stream");
    stream
        .create_consumer(pull::Config {
            durable_name: Some("gateway".into()),
            filter_subject: EVENTS_SUBJECT.into(),
            ..Default::default()
        })
        .await
        .expect("old consumer");
    js.publish(EVENTS_SUBJECT, "{}".into()).await.expect("publish").await.expect("stored");

    for _ in 0..2 {
        // Twice: the second start finds everything as it should be.
        let mut consumer = htfaas_gateway::ingest::connect(&nats.url(), "gateway", 20).await.expect("connect");
        let info = consumer.info().await.expect("consumer info");
        assert_eq!(info.config.filter_subjects, DEFAULT_LANE_SUBJECTS.map(String::from), "the default lane");
        assert_eq!(info.num_pending, 1, "the unread event is still there");
    }
    let mut stream = js.get_stream(EVENTS_STREAM).await.expect("stream");
    let info = stream.info().await.expect("info");
    assert_eq!(info.config.subjects, EVENTS_SUBJECTS.map(String::from));
    assert_eq!(info.state.messages, 1);
    let ack = js.publish(format!("{CLOUDEVENTS_SUBJECT_PREFIX}.any"), "{}".into()).await.expect("publish");
    ack.await.expect("the stream now stores CloudEvents");
    nats.stop();
}
