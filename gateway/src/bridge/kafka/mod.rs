//! `htfaas bridge dcache-kafka`: dCache's billing messages from a Kafka topic to NATS JetStream,
//! where the gateway reads dCache billing messages.
//!
//! dCache sends its billing messages (`transfer`, `request`, `remove`, `store`, `restore`,
//! `hit`, `warning`; JSON, null key) to one Kafka topic, `billing` by default
//! (`dcache.kafka.topic`, `shared/reference/dcache.md` §1). The bridge reads every partition of
//! that topic and publishes each record's value unchanged:
//!
//! - on its file's **path subject** (`storage.dcache.billing.path.<dir>._`,
//!   [`htfaas_functions::proto::path_subject`]) when it names a usable path, as the built-in
//!   storage does, so the gateway's per-owner lanes read Kafka-fed events too; the path is the
//!   one the gateway's own parser finds ([`route`]), so the gateway's check of subject against
//!   payload holds;
//! - on the plain billing subject (`storage.dcache.billing`, the default lane) when it names
//!   none (`"Unknown"`, NFS's `parent:[…]/name`) or is no event (a failed transfer, a warning);
//! - nowhere when it is malformed (not a billing message, a bad path, no value, over
//!   [`MAX_RECORD_BYTES`]): counted, logged, skipped; the next record is not held up.
//!
//! # Delivery: at least once into JetStream, exactly once per firing
//!
//! Each record's `Nats-Msg-Id` is `kafka:<topic>:<partition>:<offset>` ([`message_id`]). A
//! partition's reader fetches a batch, publishes it, waits for every PubAck (retrying a failed
//! publish, same id, with backoff, as long as it takes), and only then commits the next offset.
//! A crash or restart between the PubAck and the commit re-publishes those records under the
//! same ids: JetStream's duplicate window (2 minutes on the events stream) drops them
//! (`duplicates` counts them), and beyond that window the gateway's firing key (event id ×
//! function × digest) does, so every (event, function version) still fires once.
//!
//! # Offsets: in JetStream, not in a Kafka consumer group
//!
//! Offsets are committed to a JetStream key-value bucket
//! ([`htfaas_functions::proto::KAFKA_OFFSETS_BUCKET`]), key `<consumer>.<topic>.<partition>`,
//! each write a compare-and-set on the last revision (a second bridge with the same consumer
//! name that finds the key moved to a value it did not write stops with an error instead of
//! racing). Why not Kafka's consumer groups: the Rust clients that have them wrap librdkafka
//! (`rdkafka`), which must be built from its bundled C sources (Debian's 2.0.2 cannot talk to
//! current brokers such as tansu; ≥ 2.3 is needed). Measured on this project's 2-core machine
//! (dev profile, dependencies at opt-level 1, under load): librdkafka's build script alone
//! takes 116 CPU-s without gzip, zstd, TLS or SASL, each of which adds its C library (zlib,
//! zstd, OpenSSL, Cyrus SASL); the pure-Rust `rskafka` (fetch, list offsets, metadata, produce;
//! no groups) and its 24 new crates take 154 CPU-s with all four codecs Kafka producers may
//! use, 85 of them the lz4 and zstd C libraries it wraps, and its TLS would be the workspace's
//! rustls. So build time is a wash; what decides is the rest. With rskafka the commit lives in
//! the same system as the publishes it follows (JetStream, replicated like the events stream),
//! written by the same task right after their PubAcks, with a compare-and-set that fences off
//! a second writer; nothing runs in C threads behind callbacks, and there is one dependency
//! stack less to keep patched (librdkafka's C CVEs and its Debian/bundled version split, the
//! pitfall that breaks against tansu). What groups would give is spreading partitions over
//! several bridges and moving them when one dies: a dCache's billing topic carries hundreds of
//! messages per second, which one bridge carries with room to spare (see the bench in
//! `tests/e2e/kafka.rs`), a restarted bridge resumes from its commits, and load can be spread
//! by hand with disjoint `partitions`.
//!
//! A partition with no committed offset starts at [`Settings::start`] (default: the latest
//! offset: events from now on, not the topic's retention), committed at once. An offset that
//! has left Kafka's retention, or lies past the end (the topic was recreated), is logged at
//! WARN and the reader goes on from the earliest offset kept. A topic recreated within the
//! duplicate window reuses offsets, and so message ids: such records are dropped as
//! duplicates; wait two minutes before feeding a recreated topic.
//!
//! # Faults
//!
//! Nothing read from Kafka panics the bridge. Broker down, a leader moving, NATS down, no
//! events stream yet (the gateway makes it): each is retried with backoff (100 ms doubling to
//! 5 s), counted (`fetch_failures`, `publish_failures`) and logged at the first failure and
//! then at powers of two; the bridge holds its place meanwhile. A batch that does not decode
//! (corrupt) is fetched three times and then stepped over record
//! by record, each counted malformed and logged at ERROR. New partitions are found every
//! [`PARTITION_CHECK`].
//!
//! # Counters
//!
//! [`Stats`]: received, published (of which on the plain subject, of which duplicates),
//! malformed, lag (records between each partition's committed offset and its high watermark,
//! summed), commits and failures; logged every [`Settings::stats_interval`] when they changed
//! and at the end, returned by [`run`], readable live through [`run_with_stats`].
//!
//! # Not yet
//!
//! TLS and SASL to the brokers (the client has them; not wired or tested): run the bridge where
//! it reaches the brokers' plaintext listener.
//!
//! Here: the settings and the partitions' supervisor; one partition's loop is `partition`, the
//! record's subject `route`, the offsets bucket `offsets`, the counts `stats`. Must not know:
//! the gateway beyond its billing parser (it only publishes on NATS).

use async_nats::jetstream;
use htfaas_functions::proto::KAFKA_OFFSETS_BUCKET;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub mod offsets;
mod partition;
mod route;
mod stats;

pub use offsets::{Committed, OffsetError, PartitionOffset, key as offset_key, open_bucket};
pub use route::{MAX_RECORD_BYTES, RecordError, Routed, message_id, route};
pub use stats::*;

/// How often the topic's partitions are listed again (a partition added to the topic is read
/// from then on).
pub const PARTITION_CHECK: Duration = Duration::from_secs(60);
/// After shutdown, how long the partition readers may take to stop.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(5);
/// How long one publish waits for its PubAck before it is retried.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the Kafka client retries a request on its own before the bridge sees the error
/// (and counts and logs it).
const KAFKA_RETRY_DEADLINE: Duration = Duration::from_secs(10);

/// Where a partition with no committed offset starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartAt {
    /// The oldest record Kafka still keeps.
    Earliest,
    /// The next record produced: events from now on.
    #[default]
    Latest,
}

/// How the bridge runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Bootstrap brokers, `host:port` each (`--brokers`); the client learns the rest.
    pub brokers: Vec<String>,
    /// The billing topic (`--topic`). Default: `billing`, dCache's `dcache.kafka.topic`.
    pub topic: String,
    /// Partitions to read (`--partition`, repeatable). Default: empty, every partition, and
    /// those added later.
    pub partitions: Vec<i32>,
    /// Name under which offsets are committed (`--consumer`), `[A-Za-z0-9_-]+`: two bridges
    /// with different names each read the whole topic. Default: `htfaas`.
    pub consumer: String,
    /// Where a partition with no committed offset starts (`--start`). Default: latest.
    pub start: StartAt,
    /// NATS server URL (`--nats`).
    pub nats_url: String,
    /// The bridge's NATS credential (`--nats-nkey-seed-file`): it publishes billing messages,
    /// like a storage, and keeps its offsets bucket. Default: none.
    pub nats_credential: Option<htfaas_functions::nats::NatsCredential>,
    /// Replicas of the offsets bucket when the bridge creates it (`--offsets-replicas`); as the
    /// events stream's. Default: 1.
    pub offsets_replicas: usize,
    /// Most bytes one fetch returns per partition. Default: 1 MiB.
    pub fetch_max_bytes: usize,
    /// How long the broker holds a fetch open while it has nothing new. Default: 500 ms.
    pub fetch_wait: Duration,
    /// How often the counts are logged (only when they changed). Default: 60 s.
    pub stats_interval: Duration,
}

impl Settings {
    /// The defaults, for a broker list and a NATS server.
    pub fn new(brokers: Vec<String>, nats_url: impl Into<String>) -> Settings {
        Settings {
            brokers,
            topic: "billing".into(),
            partitions: Vec::new(),
            consumer: "htfaas".into(),
            start: StartAt::Latest,
            nats_url: nats_url.into(),
            nats_credential: None,
            offsets_replicas: 1,
            fetch_max_bytes: 1 << 20,
            fetch_wait: Duration::from_millis(500),
            stats_interval: Duration::from_secs(60),
        }
    }

    fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(!self.brokers.is_empty(), "no Kafka broker given");
        anyhow::ensure!(
            !self.topic.is_empty()
                && self.topic.len() <= 249
                && self.topic.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
                && self.topic != "."
                && self.topic != "..",
            "bad Kafka topic name {:?} (1 to 249 of [A-Za-z0-9._-])",
            self.topic
        );
        anyhow::ensure!(
            !self.consumer.is_empty()
                && self.consumer.len() <= 64
                && self.consumer.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-')),
            "bad consumer name {:?} (1 to 64 of [A-Za-z0-9_-])",
            self.consumer
        );
        anyhow::ensure!(self.partitions.iter().all(|p| *p >= 0), "a partition number is negative");
        anyhow::ensure!(self.fetch_max_bytes >= 1024, "fetch_max_bytes must be at least 1 KiB");
        anyhow::ensure!((1..=5).contains(&self.offsets_replicas), "offsets_replicas must be 1 to 5");
        Ok(())
    }
}

/// Runs the bridge until `shutdown`. Returns the counts.
pub async fn run(settings: Settings, shutdown: CancellationToken) -> anyhow::Result<StatsSnapshot> {
    run_with_stats(settings, Arc::new(Stats::default()), shutdown).await
}

/// [`run`], counting into `stats` (which the caller may read meanwhile).
pub async fn run_with_stats(
    settings: Settings,
    stats: Arc<Stats>,
    shutdown: CancellationToken,
) -> anyhow::Result<StatsSnapshot> {
    settings.validate()?;
    let client =
        super::connect_nats("htfaas-bridge-dcache-kafka", settings.nats_credential.as_ref(), &settings.nats_url)
            .await?;
    let js = jetstream::ContextBuilder::new().timeout(PUBLISH_TIMEOUT).build(client);
    tracing::info!(
        brokers = %settings.brokers.join(","),
        topic = %settings.topic,
        consumer = %settings.consumer,
        partitions = ?settings.partitions,
        nats = %settings.nats_url,
        "dcache-kafka bridge starting"
    );
    let result = supervise(settings, js, stats.clone(), shutdown).await;
    let end = stats.snapshot();
    log_stats("stopped", &end);
    result.map(|()| end)
}

/// Connects to Kafka and the offsets bucket (retrying both), then keeps one reader per
/// partition until shutdown (then waits up to [`DRAIN_DEADLINE`] for the readers to stop) or a
/// reader's fatal error.
async fn supervise(
    settings: Settings,
    js: jetstream::Context,
    stats: Arc<Stats>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let connected = tokio::select! {
        _ = shutdown.cancelled() => return Ok(()),
        c = connect(settings, js, stats.clone()) => c,
    };
    let shared = Arc::new(connected);
    // Stops the readers: at shutdown, or when one of them failed for good.
    let stop = shutdown.child_token();
    let mut readers = JoinSet::new();
    let mut started = BTreeSet::new();
    let mut check = tokio::time::interval(PARTITION_CHECK);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let interval = shared.settings.stats_interval;
    let mut stats_tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    stats_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_logged = stats.snapshot();
    let mut missing_logged = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => {
                // Each reader stops at its next await; none holds anything it must finish.
                let drained = tokio::time::timeout(DRAIN_DEADLINE, async {
                    while readers.join_next().await.is_some() {}
                })
                .await;
                if drained.is_err() {
                    tracing::warn!("partition readers still running after {DRAIN_DEADLINE:?}; stopping them");
                }
                return Ok(());
            }
            _ = check.tick() => {
                match partitions(&shared).await {
                    Ok(found) if found.is_empty() => {
                        if !missing_logged {
                            tracing::warn!(topic = %shared.settings.topic, "the topic does not exist (yet), or has none of the partitions asked for; looking again");
                            missing_logged = true;
                        }
                        // Sooner than the regular check while there is nothing to read.
                        check.reset_after(Duration::from_secs(1));
                    }
                    Ok(found) => {
                        for p in found.difference(&started).copied().collect::<Vec<_>>() {
                            started.insert(p);
                            readers.spawn(partition::run(shared.clone(), p, stop.child_token()));
                        }
                    }
                    Err(e) => {
                        tracing::warn!("cannot list the topics: {e}; looking again");
                        check.reset_after(Duration::from_secs(1));
                    }
                }
            }
            Some(done) = readers.join_next() => match done {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::error!("{e}; stopping");
                    stop.cancel();
                    while readers.join_next().await.is_some() {}
                    return Err(e.into());
                }
                Err(e) => {
                    stop.cancel();
                    while readers.join_next().await.is_some() {}
                    anyhow::bail!("a partition reader failed: {e}");
                }
            },
            _ = stats_tick.tick() => {
                let now = stats.snapshot();
                if now != last_logged {
                    log_stats("running", &now);
                    last_logged = now;
                }
            }
        }
    }
}

/// Opens the offsets bucket and the Kafka client, each retried with backoff until it works.
async fn connect(settings: Settings, js: jetstream::Context, stats: Arc<Stats>) -> partition::Shared {
    let mut backoff = Duration::from_millis(100);
    let mut failures = 0u64;
    let offsets = loop {
        match offsets::open_bucket(&js, KAFKA_OFFSETS_BUCKET, settings.offsets_replicas).await {
            Ok(b) => break b,
            Err(e) => pause(&mut failures, &mut backoff, "open the offsets bucket", e.to_string()).await,
        }
    };
    let kafka = loop {
        let built = rskafka::client::ClientBuilder::new(settings.brokers.clone())
            .client_id("htfaas-bridge-dcache-kafka")
            .backoff_config(rskafka::BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(2),
                base: 2.0,
                deadline: Some(KAFKA_RETRY_DEADLINE),
            })
            .build()
            .await;
        match built {
            Ok(c) => break c,
            Err(e) => {
                let what = format!("reach the Kafka brokers {}", settings.brokers.join(","));
                pause(&mut failures, &mut backoff, &what, e.to_string()).await
            }
        }
    };
    tracing::info!("connected to Kafka and to the offsets bucket {KAFKA_OFFSETS_BUCKET}");
    let in_flight = Arc::new(tokio::sync::Semaphore::new(partition::MAX_IN_FLIGHT));
    partition::Shared { settings, kafka, js, offsets, stats, in_flight }
}

/// Logs a failure to `what` (the first, then at powers of two) and sleeps `backoff`, doubling it
/// up to 5 s.
async fn pause(failures: &mut u64, backoff: &mut Duration, what: &str, e: String) {
    *failures += 1;
    if *failures <= 1 || failures.is_power_of_two() {
        tracing::warn!("cannot {what}: {e}; retrying");
    }
    tokio::time::sleep(*backoff).await;
    *backoff = (*backoff * 2).min(Duration::from_secs(5));
}

/// The topic's partitions the bridge should read: all of them, or those asked for that exist.
async fn partitions(shared: &partition::Shared) -> anyhow::Result<BTreeSet<i32>> {
    let topics = shared.kafka.list_topics().await?;
    let all: BTreeSet<i32> =
        topics.into_iter().filter(|t| t.name == shared.settings.topic).flat_map(|t| t.partitions).collect();
    Ok(if shared.settings.partitions.is_empty() {
        all
    } else {
        shared.settings.partitions.iter().copied().filter(|p| all.contains(p)).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_refuse_bad_names() {
        let ok = Settings::new(vec!["127.0.0.1:9092".into()], "nats://127.0.0.1:4222");
        ok.validate().expect("defaults are valid");
        let bad = |f: &dyn Fn(&mut Settings)| {
            let mut s = ok.clone();
            f(&mut s);
            s.validate().expect_err("refused").to_string()
        };
        assert_eq!(bad(&|s| s.brokers.clear()), "no Kafka broker given");
        assert!(bad(&|s| s.topic = "a topic".into()).starts_with("bad Kafka topic name"));
        assert!(bad(&|s| s.topic = "..".into()).starts_with("bad Kafka topic name"));
        assert!(bad(&|s| s.consumer = "a.b".into()).starts_with("bad consumer name"), "a dot would split the key");
        assert!(bad(&|s| s.consumer = "a>".into()).starts_with("bad consumer name"));
        assert_eq!(bad(&|s| s.partitions = vec![0, -1]), "a partition number is negative");
    }
}
