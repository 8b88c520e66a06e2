//! One partition's reader: fetch a batch of records, publish each on its subject with its
//! `Nats-Msg-Id`, wait for every PubAck, then commit the next offset; over and over until
//! shutdown.
//!
//! Safe to cancel anywhere (shutdown): what was fetched but not committed is read again by the
//! next run and published again under the same message ids (JetStream's duplicate window drops
//! the copies; past the window the gateway's firing key does).
//!
//! Must not know: how a record is routed (`route`), how offsets are stored (`offsets`).

use super::offsets::{self, OffsetError, PartitionOffset};
use super::route::{self, RecordError};
use super::stats::{Stats, bump};
use super::{Settings, StartAt};
use async_nats::jetstream::{self, context::PublishErrorKind, message::PublishMessage};
use bytes::Bytes;
use rskafka::client::error::{Error as KafkaError, ProtocolError, RequestError};
use rskafka::client::partition::{OffsetAt, PartitionClient, UnknownTopicHandling};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Backoff between attempts (fetches, publishes, commits): from the first value, doubling, up
/// to the second.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));
/// Fetches of one offset that must fail to decode before its record is stepped over.
const UNDECODABLE_ATTEMPTS: u32 = 3;
/// Records stepped over in a row (no fetch decoded in between) after which the reader stops
/// stepping and waits instead: that many undecodable records are no corrupt batch but a client
/// the broker's answers do not fit, and skipping on would drop the topic.
const MAX_STEPPED_OVER: u64 = 10_000;

/// Records one reader publishes before it awaits their PubAcks.
const PUBLISH_WINDOW: usize = 256;
/// PubAcks awaited at once over all readers, at most: fewer than the JetStream context's own
/// limit (5,000, after which a publish waits for a permit that only an awaited ack gives back,
/// so that readers each holding unawaited publishes would wait on each other for ever). A
/// reader takes its whole window's permits at once, so it can always finish it.
pub(super) const MAX_IN_FLIGHT: usize = 4096;

/// What every partition's reader shares.
pub(super) struct Shared {
    pub settings: Settings,
    pub kafka: rskafka::client::Client,
    pub js: jetstream::Context,
    pub offsets: async_nats::jetstream::kv::Store,
    pub stats: Arc<Stats>,
    /// Permits for PubAcks awaited at once ([`MAX_IN_FLIGHT`]).
    pub in_flight: Arc<tokio::sync::Semaphore>,
}

/// Why a partition's reader stopped before shutdown: the bridge stops.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReaderError {
    /// Another bridge commits this partition, or its key is corrupt.
    #[error("partition {partition}: {source}")]
    Offsets {
        /// The partition.
        partition: i32,
        /// What the offsets bucket said.
        #[source]
        source: OffsetError,
    },
}

/// Sleeps `backoff` (then doubles it, up to the cap) unless shutdown comes first: `false` then.
async fn pause(backoff: &mut Duration, shutdown: &CancellationToken) -> bool {
    let wait = *backoff;
    *backoff = (*backoff * 2).min(BACKOFF.1);
    tokio::select! {
        _ = shutdown.cancelled() => false,
        _ = tokio::time::sleep(wait) => true,
    }
}

/// Logs the first failure and then every power of two.
fn often(n: u64) -> bool {
    n <= 1 || n.is_power_of_two()
}

/// Whether a fetch error is the batch itself failing to decode (the same answer will fail the
/// same way) rather than the broker or the network.
fn undecodable(e: &KafkaError) -> bool {
    matches!(
        e,
        KafkaError::InvalidResponse(_)
            | KafkaError::Request(
                RequestError::ReadError(_) | RequestError::ReadVersionedError(_) | RequestError::TooMuchData { .. }
            )
    )
}

/// Reads `partition` until shutdown. Returns an error only for what a retry cannot mend.
pub(super) async fn run(shared: Arc<Shared>, partition: i32, shutdown: CancellationToken) -> Result<(), ReaderError> {
    let s = &shared.settings;
    let stats = &shared.stats;
    let mut backoff = BACKOFF.0;
    // The partition's leader (the client finds it again when it moves).
    let client = loop {
        match shared.kafka.partition_client(s.topic.clone(), partition, UnknownTopicHandling::Retry).await {
            Ok(c) => break c,
            Err(e) => {
                let n = bump(&stats.fetch_failures);
                if often(n) {
                    tracing::warn!(partition, "cannot reach the leader of {}/{partition}: {e}; retrying", s.topic);
                }
                if !pause(&mut backoff, &shutdown).await {
                    return Ok(());
                }
            }
        }
    };
    let key = offsets::key(&s.consumer, &s.topic, partition);
    let fatal = |source: OffsetError| ReaderError::Offsets { partition, source };
    let mut committed = loop {
        match PartitionOffset::load(shared.offsets.clone(), key.clone()).await {
            Ok(c) => break c,
            Err(e) if e.is_transient() => {
                tracing::warn!(partition, "{e}; retrying");
                if !pause(&mut backoff, &shutdown).await {
                    return Ok(());
                }
            }
            Err(e) => return Err(fatal(e)),
        }
    };
    let mut next = match committed.next() {
        Some(next) => next,
        None => {
            let at = match s.start {
                StartAt::Earliest => OffsetAt::Earliest,
                StartAt::Latest => OffsetAt::Latest,
            };
            let Some(start) = offset_at(&client, at, stats, &shutdown).await else { return Ok(()) };
            // Kept at once: records produced after this point and before the first commit
            // would otherwise be skipped by a restart that chose `latest` again.
            if !commit(&mut committed, start, stats, &shutdown).await.map_err(fatal)? {
                return Ok(());
            }
            tracing::info!(partition, offset = start, "no committed offset: starting at the {:?} offset", s.start);
            start
        }
    };
    tracing::info!(partition, offset = next, "reading {}/{partition}", s.topic);

    let max_bytes = i32::try_from(s.fetch_max_bytes).unwrap_or(i32::MAX).max(1);
    let max_wait = i32::try_from(s.fetch_wait.as_millis()).unwrap_or(i32::MAX);
    let mut failed_at = (next, 0u32);
    let mut stepped_over = 0u64;
    backoff = BACKOFF.0;
    loop {
        // Safe to cancel: nothing is consumed by a fetch.
        let fetched = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            r = client.fetch_records(next, 1..max_bytes, max_wait) => r,
        };
        let (records, high_watermark) = match fetched {
            Ok(f) => f,
            Err(KafkaError::ServerError { protocol_error: ProtocolError::OffsetOutOfRange, .. }) => {
                let Some(earliest) = offset_at(&client, OffsetAt::Earliest, stats, &shutdown).await else {
                    return Ok(());
                };
                if next == earliest {
                    // Out of range at the start itself: the broker's view is moving (a leader
                    // change, a topic being made); try again after a pause, never in a spin.
                    bump(&stats.fetch_failures);
                    if !pause(&mut backoff, &shutdown).await {
                        return Ok(());
                    }
                    continue;
                }
                if next < earliest {
                    tracing::warn!(
                        partition,
                        lost = earliest - next,
                        "records expired from Kafka before the bridge read them (retention); going on at {earliest}"
                    );
                } else {
                    tracing::warn!(
                        partition,
                        committed = next,
                        "the committed offset is past the partition's end (the topic was recreated or truncated?); \
                         reading from its earliest offset {earliest}"
                    );
                }
                next = earliest;
                if !commit(&mut committed, next, stats, &shutdown).await.map_err(fatal)? {
                    return Ok(());
                }
                continue;
            }
            Err(e) => {
                let n = bump(&stats.fetch_failures);
                if undecodable(&e) && stepped_over < MAX_STEPPED_OVER {
                    failed_at = if failed_at.0 == next { (next, failed_at.1 + 1) } else { (next, 1) };
                    if failed_at.1 >= UNDECODABLE_ATTEMPTS {
                        stepped_over += 1;
                        bump(&stats.malformed);
                        let why = RecordError::Undecodable(e.to_string());
                        tracing::error!(partition, offset = next, "skipping a record: {why}");
                        next += 1;
                        if !commit(&mut committed, next, stats, &shutdown).await.map_err(fatal)? {
                            return Ok(());
                        }
                        continue;
                    }
                } else if undecodable(&e) && often(n) {
                    tracing::error!(
                        partition,
                        offset = next,
                        "{MAX_STEPPED_OVER} records in a row did not decode: not skipping more, retrying: {e}"
                    );
                }
                if often(n) {
                    tracing::warn!(
                        partition,
                        offset = next,
                        "cannot fetch from {}/{partition}: {e}; retrying",
                        s.topic
                    );
                }
                if !pause(&mut backoff, &shutdown).await {
                    return Ok(());
                }
                continue;
            }
        };
        backoff = BACKOFF.0;
        stepped_over = 0;
        // Behind by what was fetched too, until its commit.
        shared.stats.set_lag(partition, high_watermark, next);
        let Some(last) = records.iter().map(|r| r.offset).max() else { continue };
        let mut batch = Vec::with_capacity(records.len());
        for r in records {
            bump(&stats.received);
            match route::route(r.record.value.as_deref()) {
                Ok(routed) => {
                    let id = route::message_id(&s.topic, partition, r.offset);
                    let payload = Bytes::from(r.record.value.unwrap_or_default());
                    batch.push(Outgoing { id, subject: routed.subject, plain: routed.plain, payload });
                }
                Err(e) => {
                    let n = bump(&stats.malformed);
                    if n <= 20 || n.is_power_of_two() {
                        tracing::warn!(partition, offset = r.offset, malformed = n, "skipping a record: {e}");
                    }
                }
            }
        }
        for window in batch.chunks(PUBLISH_WINDOW) {
            let permits = u32::try_from(window.len()).unwrap_or(u32::MAX);
            let _permits = tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                p = shared.in_flight.acquire_many(permits) => match p {
                    Ok(p) => p,
                    Err(_closed) => return Ok(()),
                },
            };
            if !publish_all(&shared.js, window, stats, &shutdown).await {
                return Ok(());
            }
        }
        next = last + 1;
        if !commit(&mut committed, next, stats, &shutdown).await.map_err(fatal)? {
            return Ok(());
        }
        shared.stats.set_lag(partition, high_watermark, next);
    }
}

/// A record ready to publish.
struct Outgoing {
    id: String,
    subject: String,
    plain: bool,
    payload: Bytes,
}

/// Publishes `batch`, pipelined, and waits until JetStream acknowledged each one (retrying a
/// failed one, same id, with backoff). `false`: shutdown came first.
async fn publish_all(js: &jetstream::Context, batch: &[Outgoing], stats: &Stats, shutdown: &CancellationToken) -> bool {
    let message = |o: &Outgoing| PublishMessage::build().payload(o.payload.clone()).message_id(&o.id);
    // Sent back to back; acks awaited after (at most a fetch's worth in flight).
    let mut sent = Vec::with_capacity(batch.len());
    for o in batch {
        let r = tokio::select! {
            _ = shutdown.cancelled() => return false,
            r = js.send_publish(o.subject.clone(), message(o)) => r,
        };
        sent.push(r);
    }
    for (o, first) in batch.iter().zip(sent) {
        let mut attempt = match first {
            Ok(ack) => tokio::select! {
                _ = shutdown.cancelled() => return false,
                r = ack => r,
            },
            Err(e) => Err(e),
        };
        let mut backoff = BACKOFF.0;
        let mut failures = 0u32;
        loop {
            match attempt {
                Ok(ack) => {
                    bump(&stats.published);
                    if o.plain {
                        bump(&stats.published_plain);
                    }
                    if ack.duplicate {
                        bump(&stats.duplicates);
                    }
                    break;
                }
                Err(e) => {
                    failures += 1;
                    bump(&stats.publish_failures);
                    if failures == 1 || failures.is_power_of_two() {
                        let hint = match e.kind() {
                            PublishErrorKind::StreamNotFound => {
                                " (no stream covers the subject yet: the gateway creates it)"
                            }
                            _ => "",
                        };
                        tracing::warn!(id = %o.id, attempt = failures, "cannot publish to {}: {e}{hint}; retrying", o.subject);
                    }
                    if !pause(&mut backoff, shutdown).await {
                        return false;
                    }
                    attempt = tokio::select! {
                        _ = shutdown.cancelled() => return false,
                        r = async { js.send_publish(o.subject.clone(), message(o)).await?.await } => r,
                    };
                }
            }
        }
    }
    true
}

/// Commits `next`, retrying NATS trouble until it succeeds; `Ok(false)`: shutdown came first.
async fn commit(
    committed: &mut PartitionOffset,
    next: i64,
    stats: &Stats,
    shutdown: &CancellationToken,
) -> Result<bool, OffsetError> {
    let mut backoff = BACKOFF.0;
    let mut failures = 0u64;
    loop {
        let r = tokio::select! {
            _ = shutdown.cancelled() => return Ok(false),
            r = committed.commit(next) => r,
        };
        match r {
            Ok(()) => {
                bump(&stats.commits);
                return Ok(true);
            }
            Err(e) if e.is_transient() => {
                failures += 1;
                if often(failures) {
                    tracing::warn!(offset = next, "cannot commit: {e}; retrying");
                }
                if !pause(&mut backoff, shutdown).await {
                    return Ok(false);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// The partition's offset `at`, retried until it is known; `None`: shutdown came first.
async fn offset_at(client: &PartitionClient, at: OffsetAt, stats: &Stats, shutdown: &CancellationToken) -> Option<i64> {
    let mut backoff = BACKOFF.0;
    loop {
        let r = tokio::select! {
            _ = shutdown.cancelled() => return None,
            r = client.get_offset(at) => r,
        };
        match r {
            Ok(o) => return Some(o),
            Err(e) => {
                let n = bump(&stats.fetch_failures);
                if often(n) {
                    tracing::warn!(partition = client.partition(), "cannot look up the {at:?} offset: {e}; retrying");
                }
                if !pause(&mut backoff, shutdown).await {
                    return None;
                }
            }
        }
    }
}
