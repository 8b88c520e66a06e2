//! `htfaas bridge dcache-kafka` against a real Kafka-protocol broker (tansu, `kafka_support`)
//! and the real stack: dCache billing records produced to the topic fire the registered
//! function once each, across a restart of the bridge that re-reads from its last commit (as
//! after a crash between the PubAck and the commit) and across a restart of the broker; the
//! malformed records between them are counted and skipped. Plus the bridge's rate into
//! JetStream (ignored: a measurement).
//!
//! The files are put in the built-in storage before the function exists (its own billing
//! messages fire nothing), so every job comes from a Kafka record. Every address is 127.0.0.1.

use crate::kafka_support::{Tansu, client, create_topic, produce, tansu_installed, transfer};
use async_nats::jetstream;
use htfaas::stack::{Stack, demo_manifest};
use htfaas_functions::proto::{EVENTS_SUBJECT, JobState, KAFKA_OFFSETS_BUCKET, path_subject};
use htfaas_gateway::bridge::kafka::{Settings, StartAt, Stats, StatsSnapshot, offset_key, run_with_stats};
use htfaas_tests::{events_settled, start_stack, start_stack_with, upload_checksum, wait_for};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const LIMIT: Duration = Duration::from_secs(60);
const TOPIC: &str = "billing";

/// The bridge's settings for the stack and the broker: its own NATS credential, every
/// partition from the earliest offset, short fetch waits (tansu holds an empty fetch that long).
pub fn settings(stack: &Stack, bootstrap: &str) -> Settings {
    let mut s = Settings::new(vec![bootstrap.to_owned()], stack.nats_url());
    s.topic = TOPIC.into();
    s.start = StartAt::Earliest;
    s.nats_credential = stack.nats_credential("bridge-dcache-kafka").cloned();
    s.fetch_wait = Duration::from_millis(50);
    s
}

/// A running bridge: its counts, its stop.
pub struct Bridge {
    pub stats: Arc<Stats>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<StatsSnapshot>>,
}

impl Bridge {
    pub fn start(settings: Settings) -> Bridge {
        let stats = Arc::new(Stats::default());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run_with_stats(settings, stats.clone(), shutdown.child_token()));
        Bridge { stats, shutdown, task }
    }

    /// Waits until the counts satisfy `done`; returns them.
    pub async fn wait(&self, what: &str, done: impl Fn(&StatsSnapshot) -> bool) -> StatsSnapshot {
        wait_for(what, LIMIT, || async {
            let s = self.stats.snapshot();
            done(&s).then_some(s)
        })
        .await
    }

    /// Stops it and returns its final counts.
    pub async fn stop(self) -> StatsSnapshot {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the bridge stops within 10 s of shutdown")
            .expect("join")
            .expect("the bridge ends without error")
    }
}

/// Jobs by event path, completed ones only, with how many each path has.
async fn completed_jobs(client: &htfaas::client::Client) -> BTreeMap<String, usize> {
    let mut by_path = BTreeMap::new();
    for j in client.jobs().await.expect("jobs") {
        if j.state == JobState::Completed {
            *by_path.entry(j.event.path.clone()).or_insert(0) += 1;
        }
    }
    by_path
}

/// Waits until every one of `paths` has a completed job.
async fn wait_completed(client: &htfaas::client::Client, paths: &[String]) {
    wait_for(&format!("the jobs of {paths:?}"), LIMIT, || async {
        let done = completed_jobs(client).await;
        paths.iter().all(|p| done.contains_key(p)).then_some(())
    })
    .await;
}

/// Puts `paths` in the storage and registers the checksum function on `/data/raw/**` after
/// them: only Kafka records fire it.
async fn files_then_function(client: &htfaas::client::Client, paths: &[String]) {
    for p in paths {
        client.put_bytes(b"kafka".to_vec(), p).await.expect("put");
    }
    events_settled(client).await;
    let digest = upload_checksum(client).await;
    client.register(&demo_manifest(digest)).await.expect("register");
}

// See: issue 21 (dCache's Kafka stream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dcache_kafka_bridge_fires_each_record_once_across_a_restart_from_its_commit_and_skips_malformed_ones() {
    let Some(tansu) = tansu_installed("the Kafka bridge test") else { return };
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let mut broker = tokio::task::block_in_place(|| Tansu::start(&tansu, &dir.path().join("kafka")));
    let kafka = client_for(&broker).await;
    let partitions = create_topic(&kafka, TOPIC, 2).await;
    let paths: Vec<String> = (0..6).map(|i| format!("/data/raw/kafka-{i}.dat")).collect();
    files_then_function(&client, &paths).await;

    // 1. Three uploads over two partitions, a malformed record and one with a path that is
    // not clean between them.
    let bridge = Bridge::start(settings(&stack, &broker.bootstrap()));
    produce(&partitions[0], &transfer(&paths[0], 0)).await;
    produce(&partitions[0], b"this is not a billing message").await;
    produce(&partitions[1], &transfer(&paths[1], 1)).await;
    produce(&partitions[1], &transfer("/data/raw/../../etc/passwd", 99)).await;
    produce(&partitions[0], &transfer(&paths[2], 2)).await;
    wait_completed(&client, &paths[..3]).await;
    let first =
        bridge.wait("the first records committed", |s| s.received == 5 && s.partitions == 2 && s.lag == 0).await;
    assert_eq!((first.published, first.malformed, first.duplicates), (3, 2, 0), "{first:?}");
    assert_eq!(first.partitions, 2);
    let first = bridge.stop().await;
    assert_eq!(first.publish_failures, 0, "{first:?}");

    // Each record on its file's directory subject, with the record's place as its id.
    let js = jetstream::new(stack.nats_client().await.expect("operator"));
    let stored = stored_ids(&js).await;
    assert_eq!(
        stored.get("kafka:billing:0:0").map(String::as_str),
        Some(path_subject(&paths[0]).as_str()),
        "{stored:?}"
    );
    assert_eq!(stored.get("kafka:billing:1:0").map(String::as_str), Some(path_subject(&paths[1]).as_str()));
    assert!(!stored.contains_key("kafka:billing:0:1") && !stored.contains_key("kafka:billing:1:1"), "no malformed one");

    // 2. A crash between the PubAck and the commit: the committed offsets go back to 0 (written
    // with the bridge's own credential, as the crashed bridge had left them), so the restarted
    // bridge re-reads and re-publishes every record; JetStream drops the copies by their ids.
    rewind(&stack, &[0, 1]).await;
    let bridge = Bridge::start(settings(&stack, &broker.bootstrap()));
    let again = bridge.wait("the re-read records", |s| s.received == 5 && s.partitions == 2 && s.lag == 0).await;
    assert_eq!((again.published, again.duplicates, again.malformed), (3, 3, 2), "{again:?}");

    // 3. The broker dies and comes back on the same port and data; the bridge reconnects.
    tokio::task::block_in_place(|| broker.restart());
    let kafka = client_for(&broker).await;
    let p0 =
        kafka.partition_client(TOPIC, 0, rskafka::client::partition::UnknownTopicHandling::Retry).await.expect("p0");
    let p1 =
        kafka.partition_client(TOPIC, 1, rskafka::client::partition::UnknownTopicHandling::Retry).await.expect("p1");
    produce(&p0, &transfer(&paths[3], 3)).await;
    produce(&p1, &transfer(&paths[4], 4)).await;
    produce(&p1, b"{\"msgType\":\"transfer\"").await;
    produce(&p0, &transfer(&paths[5], 5)).await;
    wait_completed(&client, &paths).await;
    let end = bridge.wait("every record committed", |s| s.received == 9 && s.lag == 0).await;
    assert_eq!((end.published, end.duplicates, end.malformed), (6, 3, 3), "{end:?}");
    bridge.stop().await;

    events_settled(&client).await;
    let jobs = completed_jobs(&client).await;
    let want: BTreeMap<String, usize> = paths.iter().map(|p| (p.clone(), 1)).collect();
    assert_eq!(jobs, want, "one job per record, none twice, none for a malformed record");
    let all = client.jobs().await.expect("jobs");
    assert_eq!(all.len(), paths.len(), "no other job: {all:?}");
    stack.stop().await.expect("clean stop");
}

/// A record without a usable path goes on the plain billing subject; a restart without a
/// rewind re-reads nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dcache_kafka_bridge_puts_a_record_without_a_path_on_the_plain_subject_and_resumes_at_its_commit() {
    let Some(tansu) = tansu_installed("the Kafka bridge test") else { return };
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let broker = tokio::task::block_in_place(|| Tansu::start(&tansu, &dir.path().join("kafka")));
    let kafka = client_for(&broker).await;
    let partitions = create_topic(&kafka, TOPIC, 1).await;
    let paths = vec!["/data/raw/plain-0.dat".to_owned(), "/data/raw/plain-1.dat".to_owned()];
    files_then_function(&client, &paths).await;

    let bridge = Bridge::start(settings(&stack, &broker.bootstrap()));
    // NFS's remove (the 11.2 billing producer): its only path is parent:[<pnfsid>]/<name>.
    let nfs = br#"{"VERSION":"1.0","msgType":"remove","cellType":"door","cellName":"nfs-1","cellDomain":"nfsDomain","date":"2026-03-14T11:00:00.000+01:00","queuingTime":0,"status":{"code":0,"msg":""},"session":"door:nfs-1@nfsDomain:1773483600001","billingPath":"parent:[0000AB12CD34EF56AB12CD34EF56AB12CD34]/run42.h5","pnfsid":"0000C9B4E7A1F2D34E5C8B1A9F0E7D6C5B4A","fileSize":0,"subject":["UidPrincipal[1000]"],"mappedUID":1000,"mappedGID":1000}"#;
    produce(&partitions[0], nfs).await;
    produce(&partitions[0], &transfer(&paths[0], 10)).await;
    wait_completed(&client, &paths[..1]).await;
    let s = bridge.wait("both records committed", |s| s.received == 2 && s.lag == 0).await;
    assert_eq!((s.published, s.published_plain, s.malformed), (2, 1, 0), "{s:?}");
    bridge.stop().await;
    let js = jetstream::new(stack.nats_client().await.expect("operator"));
    assert_eq!(stored_ids(&js).await.get("kafka:billing:0:0").map(String::as_str), Some(EVENTS_SUBJECT));

    let bridge = Bridge::start(settings(&stack, &broker.bootstrap()));
    produce(&partitions[0], &transfer(&paths[1], 11)).await;
    wait_completed(&client, &paths).await;
    let s = bridge.wait("the new record committed", |s| s.received == 1 && s.lag == 0).await;
    assert_eq!((s.published, s.duplicates), (1, 0), "resumed after its commit: {s:?}");
    bridge.stop().await;
    let jobs = completed_jobs(&client).await;
    assert_eq!(jobs, paths.iter().map(|p| (p.clone(), 1)).collect::<BTreeMap<_, _>>());
    stack.stop().await.expect("clean stop");
}

/// The bridge's rate into JetStream: N records on 4 partitions produced first, then the time
/// from the bridge's start to their last commit. A measurement, not a check:
/// `cargo test -p htfaas-tests --test e2e kafka::dcache_kafka_bridge_rate -- --ignored --nocapture`
/// (`HTFAAS_KAFKA_BENCH_RECORDS`, default 20000; `HTFAAS_KAFKA_BENCH_DURABILITY=log` for
/// JetStream without an fsync behind every PubAck, the stack's default being `fsync`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run it by name with --ignored"]
async fn dcache_kafka_bridge_rate() {
    let Some(tansu) = tansu_installed("the Kafka bridge bench") else { return };
    let n: usize = std::env::var("HTFAAS_KAFKA_BENCH_RECORDS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let durability = match std::env::var("HTFAAS_KAFKA_BENCH_DURABILITY").as_deref() {
        Ok("log") => htfaas_functions::store::Durability::Log,
        _ => htfaas_functions::store::Durability::Fsync,
    };
    let (dir, stack) = start_stack_with(|o| o.durability = durability).await;
    let broker = tokio::task::block_in_place(|| Tansu::start(&tansu, &dir.path().join("kafka")));
    let kafka = client_for(&broker).await;
    let partitions = create_topic(&kafka, TOPIC, 4).await;
    let started = std::time::Instant::now();
    for (p, client) in partitions.iter().enumerate() {
        let mut i = p;
        while i < n {
            let batch: Vec<_> = (i..n)
                .step_by(partitions.len())
                .take(500)
                .map(|k| {
                    crate::kafka_support::record(&transfer(&format!("/data/bench/d{}/f{k}.dat", k % 50), k as u64))
                })
                .collect();
            i += batch.len() * partitions.len();
            client.produce(batch, rskafka::client::partition::Compression::NoCompression).await.expect("produce");
        }
    }
    eprintln!("produced {n} records to 4 partitions in {:?}", started.elapsed());
    let bridge = Bridge::start(settings(&stack, &broker.bootstrap()));
    let started = std::time::Instant::now();
    let s = wait_for("every record committed", Duration::from_secs(600), || async {
        let s = bridge.stats.snapshot();
        (s.received as usize == n && s.partitions == 4 && s.lag == 0).then_some(s)
    })
    .await;
    let took = started.elapsed();
    eprintln!(
        "{{\"bench\":\"dcache-kafka bridge\",\"durability\":\"{}\",\"records\":{n},\"partitions\":4,\"seconds\":{:.3},\"records_per_s\":{:.0},\"commits\":{}}}",
        durability.as_str(),
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64(),
        s.commits
    );
    assert_eq!(s.published as usize, n);
    bridge.stop().await;
    stack.stop().await.expect("clean stop");
}

/// A producer's client for `broker`.
async fn client_for(broker: &Tansu) -> rskafka::client::Client {
    client(&broker.bootstrap()).await
}

/// `Nats-Msg-Id` → subject of every message in the events stream.
async fn stored_ids(js: &jetstream::Context) -> BTreeMap<String, String> {
    let mut stream = js.get_stream(htfaas_functions::proto::EVENTS_STREAM).await.expect("the events stream");
    let info = stream.info().await.expect("info");
    let mut out = BTreeMap::new();
    for seq in info.state.first_sequence.max(1)..=info.state.last_sequence {
        let Ok(m) = stream.get_raw_message(seq).await else { continue };
        if let Some(id) = m.headers.get("Nats-Msg-Id") {
            out.insert(id.as_str().to_owned(), m.subject.to_string());
        }
    }
    out
}

/// Sets the committed offset of each of `partitions` back to 0, with the bridge's credential.
async fn rewind(stack: &Stack, partitions: &[i32]) {
    let nats = htfaas_functions::nats::connect_options("test-rewind", stack.nats_credential("bridge-dcache-kafka"))
        .connect(stack.nats_url())
        .await
        .expect("connect as the bridge");
    let kv = jetstream::new(nats).get_key_value(KAFKA_OFFSETS_BUCKET).await.expect("the offsets bucket");
    for p in partitions {
        let value =
            serde_json::to_vec(&htfaas_gateway::bridge::kafka::Committed { version: 1, next_offset: 0 }).expect("json");
        kv.put(offset_key("htfaas", TOPIC, *p), value.into()).await.expect("rewind");
    }
}
