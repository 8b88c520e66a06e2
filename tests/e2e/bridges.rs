//! The storage-event bridges against real producers and a real nats-server.
//!
//! `htfaas bridge xrootd-notify` (in-process: `htfaas_bridges::xrootd::run`) reads the
//! FIFO of a real XRootD (Debian `xrootd-server` 5.5.x, started by `scripts/xrootd/start.sh`
//! with `scripts/xrootd/notify-fifo.cfg`) while a client writes and removes a file through
//! XrdHttp, and publishes CloudEvents to a JetStream stream the test creates on
//! `storage.cloudevents.>`. Without `xrootd` installed that test is skipped with a notice,
//! unless `CI` is set. Retries (NATS down, no stream yet) are tested with a FIFO the test
//! writes itself. Every address is 127.0.0.1.

use crate::xrootd_support::{Xrootd, xrootd_installed};
use async_nats::jetstream;
use htfaas::nats::NatsServer;
use htfaas_bridges::xrootd::{Input, Settings, StatsSnapshot, run};
use std::io::Write as _;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const LIMIT: Duration = Duration::from_secs(20);

/// A nats-server with JetStream storing under `dir`, on `port` (0: any).
fn start_nats(dir: &Path, port: u16) -> NatsServer {
    let binary = htfaas::nats::find_binary().expect("nats-server (scripts/install-deps.sh, or HTFAAS_NATS_SERVER)");
    NatsServer::start(&binary, dir, port).expect("start nats-server")
}

/// The stream the gateway would own, made by the test: every CloudEvents subject.
async fn create_stream(js: &jetstream::Context) {
    js.create_stream(jetstream::stream::Config {
        name: "BRIDGE_TEST".into(),
        subjects: vec![format!("{}.>", htfaas_functions::proto::CLOUDEVENTS_SUBJECT_PREFIX)],
        ..Default::default()
    })
    .await
    .expect("create the stream");
}

/// One stored message: subject, `Nats-Msg-Id`, `content-type`, CloudEvent JSON.
#[derive(Debug)]
struct Stored {
    subject: String,
    msg_id: Option<String>,
    content_type: Option<String>,
    ce: serde_json::Value,
}

/// Every message of the test stream, in order.
async fn stored(js: &jetstream::Context) -> Vec<Stored> {
    let Ok(mut stream) = js.get_stream("BRIDGE_TEST").await else { return Vec::new() };
    let Ok(info) = stream.info().await else { return Vec::new() };
    let (first, last) = (info.state.first_sequence, info.state.last_sequence);
    let mut out = Vec::new();
    for seq in first.max(1)..=last {
        let m = stream.get_raw_message(seq).await.expect("stored message");
        let header = |name: &str| m.headers.get(name).map(|v| v.as_str().to_owned());
        out.push(Stored {
            subject: m.subject.to_string(),
            msg_id: header("Nats-Msg-Id"),
            content_type: header("content-type"),
            ce: serde_json::from_slice(&m.payload).expect("the bridge publishes JSON"),
        });
    }
    out
}

/// Waits until the stream holds a message for which `pick` says yes, and returns it.
async fn wait_stored(js: &jetstream::Context, what: &str, pick: impl Fn(&Stored) -> bool) -> Stored {
    htfaas_tests::wait_for(what, LIMIT, || async { stored(js).await.into_iter().find(|m| pick(m)) }).await
}

/// Cancels the bridge and returns its final counts.
async fn stop(
    shutdown: CancellationToken,
    bridge: tokio::task::JoinHandle<anyhow::Result<StatsSnapshot>>,
) -> StatsSnapshot {
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), bridge)
        .await
        .expect("the bridge stops within 10 s of shutdown")
        .expect("join")
        .expect("the bridge ends without error")
}

/// Opens a FIFO for writing without blocking (read-write: it needs no reader). What is written
/// stays in the pipe only while some process has it open: keep the file until the bridge read.
fn fifo_writer(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new().read(true).write(true).open(path).expect("open the FIFO")
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().expect("run mkfifo");
    assert!(status.success(), "mkfifo {}", path.display());
}

// `htfaas bridge xrootd-notify` against a real xrootd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xrootd_notify_bridge_publishes_a_real_xrootds_closew_and_rm_as_cloudevents() {
    if !xrootd_installed("the XRootD bridge test") {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let nats = tokio::task::block_in_place(|| start_nats(&dir.path().join("nats"), 0));
    let js = jetstream::new(async_nats::connect(nats.url()).await.expect("connect"));
    create_stream(&js).await;
    // The issuer may delete here (authdb-delete), for the `rm` event.
    let x = tokio::task::spawn_blocking(|| {
        Xrootd::start_with_notify(|data| std::fs::create_dir_all(data.join("store")).expect("mkdir"), true)
    })
    .await
    .expect("start xrootd");
    let fifo = x.notify_fifo();

    let shutdown = CancellationToken::new();
    let mut settings = Settings::new(nats.url(), Input::Fifo(fifo.clone()));
    settings.path_prefix = "/site/".into();
    settings.source_host = "xrd-test.example.org".into();
    let bridge = tokio::spawn(run(settings, shutdown.child_token()));

    // A real write and remove through XrdHttp, as the issuer (its authdb here allows 'd').
    const BODY: &[u8] = b"hello xrootd notify\n";
    let issuer = x.issuer();
    let put = issuer.put(x.https("/store/in/run1.dat")).body(BODY).send().await.expect("PUT");
    assert!(put.status().is_success(), "PUT: {}", put.status());
    // The bridge reads and publishes while the file exists (no ordering is assumed between
    // xrootd's write of the line and the PUT's answer).
    let write = wait_stored(&js, "the closew event", |m| m.ce["data"]["msg_type"] == "closew").await;
    let del = issuer.delete(x.https("/store/in/run1.dat")).send().await.expect("DELETE");
    assert!(del.status().is_success(), "DELETE: {}", del.status());
    let remove = wait_stored(&js, "the rm event", |m| m.ce["data"]["msg_type"] == "rm").await;
    // Garbage in the FIFO is skipped, not fatal: the bridge goes on.
    writeln!(fifo_writer(&fifo), "this is not a notify line").expect("write garbage");
    let put = issuer.put(x.https("/store/in/run2.dat")).body(&b"2"[..]).send().await.expect("PUT");
    assert!(put.status().is_success(), "PUT: {}", put.status());
    // Its closew, the last line: its create comes first and would not prove the rest is read.
    wait_stored(&js, "the second closew event", |m| {
        m.ce["subject"] == "/site/store/in/run2.dat" && m.ce["data"]["msg_type"] == "closew"
    })
    .await;

    eprintln!("closew: {:#}", write.ce);
    assert_eq!(write.subject, "storage.cloudevents.xrootd-notify");
    assert_eq!(write.ce["specversion"], "1.0");
    assert_eq!(write.ce["type"], "org.htfaas.storage.xrootd-notify.closew");
    assert_eq!(write.ce["source"], "xrootd://xrd-test.example.org");
    assert_eq!(write.ce["subject"], "/site/store/in/run1.dat");
    assert_eq!(write.ce["datacontenttype"], "application/json");
    assert!(write.ce["time"].as_str().is_some_and(|t| t.ends_with('Z') && t.len() == 24), "{}", write.ce["time"]);
    let data: htfaas_functions::event::BridgedEvent =
        serde_json::from_value(write.ce["data"].clone()).expect("data is a BridgedEvent");
    assert_eq!(data.kind, htfaas_functions::event::EventKind::Write);
    assert_eq!(data.path, "/site/store/in/run1.dat");
    assert_eq!(data.size, Some(BODY.len() as u64), "ofs.notifymsg closew … $FSIZE");
    // The trace id's user: the gridmapped issuer's name, cut by XRootD to 8 characters.
    assert_eq!(data.owner.as_deref(), Some("faasadmi"));
    assert_eq!(write.msg_id.as_deref(), write.ce["id"].as_str(), "Nats-Msg-Id is the CE id");
    assert_eq!(write.content_type.as_deref(), Some("application/cloudevents+json"));

    eprintln!("rm: {:#}", remove.ce);
    assert_eq!(remove.ce["type"], "org.htfaas.storage.xrootd-notify.rm");
    assert_eq!(remove.ce["subject"], "/site/store/in/run1.dat");
    assert_eq!(remove.ce["data"]["kind"], "remove");
    assert_ne!(remove.ce["id"], write.ce["id"]);

    // Every event once: create + closew for each PUT, one rm.
    let all = stored(&js).await;
    let kinds: Vec<_> = all.iter().map(|m| m.ce["data"]["msg_type"].as_str().unwrap_or("?").to_owned()).collect();
    assert_eq!(kinds, ["create", "closew", "rm", "create", "closew"], "{all:#?}");
    let stats = stop(shutdown, bridge).await;
    eprintln!("bridge stats: {stats:?}");
    assert_eq!((stats.lines, stats.skipped, stats.published, stats.unpublished()), (6, 1, 5, 0));
}

/// A line read while NATS is down is kept and published once NATS is back; JetStream's
/// duplicate window (the `Nats-Msg-Id`) keeps a retried publish that had arrived from being
/// stored twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xrootd_notify_bridge_publishes_a_line_read_while_nats_was_down_once_it_is_back() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("nats");
    let mut nats = tokio::task::block_in_place(|| start_nats(&store, 0));
    let (url, port) = (nats.url(), nats.port());
    let js = jetstream::new(async_nats::connect(&url).await.expect("connect"));
    create_stream(&js).await;
    let fifo = dir.path().join("notify.fifo");
    mkfifo(&fifo);

    let shutdown = CancellationToken::new();
    let settings = Settings {
        publish_timeout: Duration::from_millis(500),
        ..Settings::new(url.clone(), Input::Fifo(fifo.clone()))
    };
    let live = settings.stats.clone();
    let bridge = tokio::spawn(run(settings, shutdown.child_token()));
    let mut w = fifo_writer(&fifo);
    writeln!(w, "alice.1:2@[::1] closew /store/before.dat 1").expect("write");
    wait_stored(&js, "the first event", |m| m.ce["subject"] == "/store/before.dat").await;

    tokio::task::block_in_place(|| nats.stop());
    writeln!(w, "alice.1:2@[::1] closew /store/during.dat 2").expect("write");
    writeln!(w, "alice.1:2@[::1] rm /store/during.dat").expect("write");
    // Until a publish timed out waiting for its PubAck: the bridge's own retry runs, not just
    // the NATS client's buffering across the reconnect.
    let failed = || async { (live.publish_failures.load(Ordering::Relaxed) >= 1).then_some(()) };
    htfaas_tests::wait_for("a failed publish while NATS is down", Duration::from_secs(30), failed).await;
    let _nats = tokio::task::block_in_place(|| start_nats(&store, port));
    let js = jetstream::new(async_nats::connect(&url).await.expect("reconnect"));
    wait_stored(&js, "the rm read while NATS was down", |m| m.ce["type"] == "org.htfaas.storage.xrootd-notify.rm")
        .await;
    let all = stored(&js).await;
    let subjects: Vec<_> = all.iter().map(|m| m.ce["subject"].as_str().unwrap_or("?").to_owned()).collect();
    assert_eq!(subjects, ["/store/before.dat", "/store/during.dat", "/store/during.dat"], "each once, in order");
    assert_eq!(all[1].ce["data"]["size"], 2);

    let stats = stop(shutdown, bridge).await;
    eprintln!("bridge stats: {stats:?}");
    assert_eq!((stats.lines, stats.published, stats.unpublished()), (3, 3, 0));
    assert!(stats.publish_failures >= 1, "NATS was down: {stats:?}");
}

/// The bridge never creates a stream: until one covers its subject it retries, then the
/// event arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xrootd_notify_bridge_waits_for_the_stream_instead_of_creating_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let nats = tokio::task::block_in_place(|| start_nats(&dir.path().join("nats"), 0));
    let js = jetstream::new(async_nats::connect(nats.url()).await.expect("connect"));
    let fifo = dir.path().join("notify.fifo");
    mkfifo(&fifo);
    let shutdown = CancellationToken::new();
    let settings = Settings::new(nats.url(), Input::Fifo(fifo.clone()));
    let live = settings.stats.clone();
    let bridge = tokio::spawn(run(settings, shutdown.child_token()));
    // Kept open: a pipe's content is gone once nobody has it open, and the bridge may not
    // have opened it yet.
    let mut w = fifo_writer(&fifo);
    writeln!(w, "bob.7:9@host create 644 /store/early.dat").expect("write");
    // Until it tried to publish and found no stream.
    let refused = || async { (live.publish_failures.load(Ordering::Relaxed) >= 1).then_some(()) };
    htfaas_tests::wait_for("a publish refused for want of a stream", Duration::from_secs(30), refused).await;
    let mut names = js.stream_names();
    let mut streams = Vec::new();
    while let Some(name) = futures_util::StreamExt::next(&mut names).await {
        streams.push(name.expect("stream name"));
    }
    assert!(streams.is_empty(), "the bridge must not create a stream: {streams:?}");
    create_stream(&js).await;
    let m = wait_stored(&js, "the event published before the stream existed", |_| true).await;
    assert_eq!(m.ce["subject"], "/store/early.dat");
    assert_eq!(m.ce["data"]["owner"], "bob");
    let stats = stop(shutdown, bridge).await;
    assert_eq!((stats.published, stats.unpublished()), (1, 0));
    assert!(stats.publish_failures >= 1, "{stats:?}");
}
