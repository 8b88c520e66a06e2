//! The reader: the consumer's message stream, each record routed and published with its
//! `Nats-Msg-Id`, the PubAcks awaited in the order the records came, and each partition's offset
//! committed to the group once every record before it is acknowledged.
//!
//! One task, one ordered pipeline over every assigned partition: a record's PubAck counts only
//! when the acks of every record before it (any partition) came, so "acknowledged up to" is
//! contiguous per partition without bookkeeping per offset. A failed publish is retried, same
//! id, with backoff, as long as it takes, holding the line behind it (NATS trouble is rarely
//! one subject's). At most [`MAX_IN_FLIGHT`] records wait for their PubAcks; the stream is not
//! read meanwhile (librdkafka keeps prefetching up to its queue limits and heartbeating; the
//! group drops a bridge that does not read for `max.poll.interval.ms`, 5 minutes, and its
//! partitions go to another member, which reads on from the last commit).
//!
//! Commits are synchronous (librdkafka reports a manual commit's result only to the caller of a
//! synchronous one), so each runs on a blocking thread, one at a time: started every
//! [`COMMIT_INTERVAL`], whenever the pipeline empties and when the previous one ends, if
//! something was acknowledged since.
//!
//! Must not know: how a record is routed (`route`), how partitions are assigned and started
//! (`group`).

use super::group::Group;
use super::route::{self, RecordError};
use super::stats::{Stats, bump};
use async_nats::jetstream::{self, context::PublishErrorKind, message::PublishMessage};
use bytes::Bytes;
use futures_util::future::OptionFuture;
use futures_util::stream::{FuturesOrdered, StreamExt};
use rdkafka::Message;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Backoff between publish attempts: from the first value, doubling, up to the second.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));
/// PubAcks awaited at once, at most: fewer than the JetStream context's own limit (5,000, after
/// which a publish waits for a permit that only an awaited ack gives back).
pub(super) const MAX_IN_FLIGHT: usize = 4096;
/// How often acknowledged offsets are committed while records keep coming.
pub(super) const COMMIT_INTERVAL: Duration = Duration::from_millis(500);
/// After shutdown, how long the PubAcks still awaited may take.
pub(super) const DRAIN_DEADLINE: Duration = Duration::from_secs(5);

/// A record whose PubAck came (or that was skipped): its partition is acknowledged up to `next`.
struct Done {
    partition: i32,
    epoch: u64,
    next: i64,
}

type Pending = Pin<Box<dyn Future<Output = Done> + Send>>;

/// What a commit committed (partition, next offset), and its result.
type Committed = (Vec<(i32, i64)>, KafkaResult<()>);
/// A commit running on a blocking thread.
type Commit = tokio::task::JoinHandle<Committed>;

/// A record ready to publish.
struct Outgoing {
    id: String,
    subject: String,
    plain: bool,
    payload: Bytes,
}

/// Logs the first failure and then every power of two.
fn often(n: u64) -> bool {
    n <= 1 || n.is_power_of_two()
}

/// Whether a consumer error is about the data (a batch that does not decode, a corrupt
/// record) rather than the brokers or the network.
fn malformed(e: &KafkaError) -> bool {
    matches!(
        e,
        KafkaError::MessageConsumption(
            RDKafkaErrorCode::BadMessage
                | RDKafkaErrorCode::BadCompression
                | RDKafkaErrorCode::InvalidMessage
                | RDKafkaErrorCode::InvalidRecord
        )
    )
}

/// Reads until `shutdown`, then waits up to [`DRAIN_DEADLINE`] for the PubAcks still due and
/// commits what they acknowledged. Returns an error only for a fatal consumer error (the
/// client cannot go on).
pub(super) async fn run(
    consumer: &Arc<StreamConsumer<Group>>,
    js: &jetstream::Context,
    stats: &Arc<Stats>,
    stats_interval: Duration,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let group = consumer.context().clone();
    let topic = group.topic.clone();
    let progress = group.progress.clone();
    let mut committing: Option<Commit> = None;
    let mut stream = consumer.stream();
    let mut pending: FuturesOrdered<Pending> = FuturesOrdered::new();
    let mut commit_tick = tokio::time::interval(COMMIT_INTERVAL);
    commit_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stats_tick = tokio::time::interval_at(tokio::time::Instant::now() + stats_interval, stats_interval);
    stats_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_logged = stats.snapshot();
    let result = loop {
        tokio::select! {
            _ = shutdown.cancelled() => break Ok(()),
            Some(done) = pending.next(), if !pending.is_empty() => {
                progress.acked(done.partition, done.epoch, done.next);
                if pending.is_empty() {
                    commit(consumer, &mut committing);
                }
            }
            Some(finished) = OptionFuture::from(committing.as_mut()), if committing.is_some() => {
                committing = None;
                settle_commit(&group, finished);
                commit(consumer, &mut committing);
            }
            // Safe to cancel: a message is taken from the queue only when this completes.
            m = stream.next(), if pending.len() < MAX_IN_FLIGHT => match m {
                Some(Ok(m)) => {
                    bump(&stats.received);
                    let (partition, offset) = (m.partition(), m.offset());
                    let Some(epoch) = progress.epoch(partition) else {
                        // Not (any more) this bridge's: its owner reads it.
                        tracing::debug!(partition, offset, "a record of a partition not assigned here; left to its owner");
                        continue;
                    };
                    let next = offset + 1;
                    match route::route(m.payload()) {
                        Ok(routed) => {
                            let o = Outgoing {
                                id: route::message_id(&topic, partition, offset),
                                subject: routed.subject,
                                plain: routed.plain,
                                payload: Bytes::copy_from_slice(m.payload().unwrap_or_default()),
                            };
                            // Sent here, in the stream's order; the ack is awaited in `pending`.
                            let first = js.send_publish(o.subject.clone(), message(&o)).await;
                            let (js, stats) = (js.clone(), stats.clone());
                            pending.push_back(Box::pin(async move {
                                settle(&js, &o, first, &stats).await;
                                Done { partition, epoch, next }
                            }));
                        }
                        Err(e) => {
                            let n = bump(&stats.malformed);
                            if n <= 20 || n.is_power_of_two() {
                                tracing::warn!(partition, offset, malformed = n, "skipping a record: {e}");
                            }
                            pending.push_back(Box::pin(std::future::ready(Done { partition, epoch, next })));
                        }
                    }
                }
                Some(Err(e)) if malformed(&e) => {
                    let n = bump(&stats.malformed);
                    let why = RecordError::Undecodable(e.to_string());
                    tracing::error!(malformed = n, "skipping what did not decode: {why}");
                }
                Some(Err(e @ KafkaError::MessageConsumptionFatal(_))) => {
                    bump(&stats.kafka_failures);
                    break Err(anyhow::anyhow!("the Kafka consumer failed for good: {e}"));
                }
                Some(Err(e)) => {
                    // Logged with librdkafka's reason by `group`.
                    let n = bump(&stats.kafka_failures);
                    match e {
                        KafkaError::MessageConsumption(RDKafkaErrorCode::SSL) => bump(&stats.tls_refused),
                        KafkaError::MessageConsumption(RDKafkaErrorCode::Authentication) => bump(&stats.login_refused),
                        _ => 0,
                    };
                    tracing::debug!(failures = n, "Kafka: {e}");
                }
                None => break Err(anyhow::anyhow!("the Kafka consumer's stream ended")),
            },
            _ = commit_tick.tick() => commit(consumer, &mut committing),
            _ = stats_tick.tick() => {
                let now = stats.snapshot();
                if now != last_logged {
                    super::stats::log_stats("running", &now);
                    last_logged = now;
                }
            }
        }
    };
    drop(stream);
    let drained = tokio::time::timeout(DRAIN_DEADLINE, async {
        while let Some(done) = pending.next().await {
            progress.acked(done.partition, done.epoch, done.next);
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!("PubAcks still due after {DRAIN_DEADLINE:?}; those records are read again at the next start");
    }
    // What is acknowledged now is committed when the consumer closes (the revoke callback);
    // a commit still running ends first, so that it cannot land after that one.
    if let Some(running) = committing {
        match tokio::time::timeout(DRAIN_DEADLINE, running).await {
            Ok(finished) => settle_commit(&group, finished),
            Err(_) => tracing::warn!("a commit still running after {DRAIN_DEADLINE:?}"),
        }
    }
    result
}

fn message(o: &Outgoing) -> PublishMessage {
    PublishMessage::build().payload(o.payload.clone()).message_id(&o.id)
}

/// Starts a commit of what was acknowledged since the last, unless one is running.
fn commit(consumer: &Arc<StreamConsumer<Group>>, committing: &mut Option<Commit>) {
    if committing.is_some() {
        return;
    }
    let offsets = consumer.context().progress.to_commit();
    if offsets.is_empty() {
        return;
    }
    let consumer = consumer.clone();
    *committing = Some(tokio::task::spawn_blocking(move || {
        let list = consumer.context().list(&offsets);
        let result = consumer.commit(&list, CommitMode::Sync);
        (offsets, result)
    }));
}

/// Counts a finished commit; a failed one is sent again with the next.
fn settle_commit(group: &Group, finished: Result<Committed, tokio::task::JoinError>) {
    match finished {
        Ok((offsets, Ok(()))) => group.confirmed(&offsets),
        Ok((offsets, Err(e))) => {
            let n = bump(&group.stats.kafka_failures);
            if often(n) {
                tracing::warn!(offsets = ?offsets, "cannot commit: {e}; sending it again");
            }
            group.progress.commit_failed(&offsets);
        }
        Err(e) => tracing::error!("the commit's thread failed: {e}"),
    }
}

/// Waits until JetStream acknowledged `o` (retrying a failed publish, same id, with backoff, as
/// long as it takes), counting it.
async fn settle(
    js: &jetstream::Context,
    o: &Outgoing,
    first: Result<jetstream::context::PublishAckFuture, jetstream::context::PublishError>,
    stats: &Stats,
) {
    let mut attempt = match first {
        Ok(ack) => ack.await,
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
                return;
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
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF.1);
                attempt = async { js.send_publish(o.subject.clone(), message(o)).await?.await }.await;
            }
        }
    }
}
