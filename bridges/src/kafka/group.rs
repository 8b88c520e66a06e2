//! The bridge's side of Kafka's consumer group: what librdkafka calls back ([`Group`], the
//! consumer's context) and what each assigned partition has been acknowledged up to
//! ([`Progress`]).
//!
//! librdkafka calls [`Group`] while the bridge polls its consumer (the message stream, one
//! task), and `log` from its own threads: each callback is short, never panics (every value
//! from the broker is matched, none unwrapped), and only takes the [`Progress`] lock for a few
//! map operations.
//!
//! - **Assign** (eager protocol: every rebalance revokes everything, then assigns): each
//!   partition starts at the group's committed offset. One without (a new group, a new
//!   partition) starts at the [`StartAt`] end of the partition, looked up and **committed at
//!   once**, so a restart before the first record's commit resumes there rather than choosing
//!   `latest` again and skipping what came in between. A lookup that fails (broker trouble
//!   during the rebalance) leaves the partition to librdkafka (`auto.offset.reset`, the same
//!   `StartAt`). Each assignment of a partition gets a new epoch.
//! - **Revoke**: commits, synchronously, what was acknowledged in the partitions being taken
//!   away (not when the assignment was lost: the group has moved on), then forgets them, so
//!   that a PubAck arriving later for a record of theirs (an older epoch) commits nothing: the
//!   new owner reads on from the commit, and JetStream's duplicate window drops what both
//!   published.
//! - **Statistics** (each partition's high watermark, for the lag) and **errors** (counted as
//!   Kafka failures by the stream's reader; logged here with librdkafka's reason, which the
//!   stream's error lacks). Commit results are not called back: librdkafka reports a manual
//!   commit's result to the caller of a synchronous commit only, so every commit here and in
//!   `consume` is synchronous.
//!
//! Must not know: NATS, records, subjects.

use super::StartAt;
use super::stats::{Stats, bump};
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaRespErr;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How long a lookup or a commit inside a rebalance callback may take (the callback holds the
/// consumer meanwhile).
const REBALANCE_TIMEOUT: Duration = Duration::from_secs(10);

/// One assigned partition.
#[derive(Debug, Clone, Copy, Default)]
struct Partition {
    /// Which assignment of the partition this is: records of an older one commit nothing.
    epoch: u64,
    /// The next offset after the last record JetStream acknowledged (or that was skipped as
    /// malformed) with every record before it.
    acked: Option<i64>,
    /// The next offset whose commit was sent and not (yet) refused.
    requested: Option<i64>,
    /// The next offset the group confirmed as committed.
    committed: Option<i64>,
    /// The partition's high watermark, from librdkafka's statistics.
    high: Option<i64>,
}

/// What each assigned partition was acknowledged and committed up to; shared by the stream's
/// reader and the [`Group`] callbacks.
#[derive(Debug, Default)]
pub(super) struct Progress {
    partitions: Mutex<BTreeMap<i32, Partition>>,
    epochs: AtomicU64,
}

impl Progress {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<i32, Partition>> {
        self.partitions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The epoch of `partition`'s assignment, `None` when it is not assigned to this bridge.
    pub fn epoch(&self, partition: i32) -> Option<u64> {
        self.lock().get(&partition).map(|p| p.epoch)
    }

    /// Every record of `partition` before `next` is acknowledged (or skipped), in `epoch`.
    pub fn acked(&self, partition: i32, epoch: u64, next: i64) {
        if let Some(p) = self.lock().get_mut(&partition).filter(|p| p.epoch == epoch) {
            p.acked = Some(p.acked.map_or(next, |a| a.max(next)));
        }
    }

    /// The partitions whose acknowledged offset is ahead of the last commit sent, marked as
    /// sent.
    pub fn to_commit(&self) -> Vec<(i32, i64)> {
        let mut out = Vec::new();
        for (n, p) in self.lock().iter_mut() {
            if let Some(acked) = p.acked.filter(|a| Some(*a) > p.requested) {
                p.requested = Some(acked);
                out.push((*n, acked));
            }
        }
        out
    }

    /// A commit of `offsets` was refused or failed: they are sent again at the next commit.
    pub fn commit_failed(&self, offsets: &[(i32, i64)]) {
        let mut partitions = self.lock();
        for (n, next) in offsets {
            if let Some(p) = partitions.get_mut(n).filter(|p| p.requested == Some(*next)) {
                p.requested = p.committed;
            }
        }
    }

    /// The group confirmed `next` as `partition`'s committed offset; returns (high watermark,
    /// committed) when the watermark is known.
    fn committed(&self, partition: i32, next: i64) -> Option<(i64, i64)> {
        let mut partitions = self.lock();
        let p = partitions.get_mut(&partition)?;
        let committed = p.committed.map_or(next, |c| c.max(next));
        p.committed = Some(committed);
        p.high.map(|h| (h, committed))
    }

    /// `partition`'s high watermark is `high`; returns (high, committed) when both are known.
    fn high(&self, partition: i32, high: i64) -> Option<(i64, i64)> {
        let mut partitions = self.lock();
        let p = partitions.get_mut(&partition)?;
        p.high = Some(high);
        p.committed.map(|c| (high, c))
    }

    /// `partitions` are this bridge's now, each (partition, committed offset if known).
    fn assign(&self, partitions: &[(i32, Option<i64>)]) {
        let mut map = self.lock();
        for (n, committed) in partitions {
            let epoch = self.epochs.fetch_add(1, Ordering::Relaxed) + 1;
            map.insert(*n, Partition { epoch, requested: *committed, committed: *committed, ..Default::default() });
        }
    }

    /// What is acknowledged and not yet confirmed committed in `partitions`.
    fn uncommitted(&self, partitions: &[i32]) -> Vec<(i32, i64)> {
        let map = self.lock();
        partitions
            .iter()
            .filter_map(|n| {
                let p = map.get(n)?;
                p.acked.filter(|a| Some(*a) > p.committed).map(|a| (*n, a))
            })
            .collect()
    }

    /// `partitions` are no longer this bridge's.
    fn revoke(&self, partitions: &[i32]) {
        let mut map = self.lock();
        for n in partitions {
            map.remove(n);
        }
    }

    /// How many partitions are assigned.
    fn count(&self) -> usize {
        self.lock().len()
    }
}

/// The consumer's context: the rebalance, commit, statistics, error and log callbacks.
pub(super) struct Group {
    pub topic: String,
    pub start: StartAt,
    pub progress: Arc<Progress>,
    pub stats: Arc<Stats>,
    /// Errors librdkafka reported, for logging the first and then at powers of two.
    errors: AtomicU64,
}

impl Group {
    pub fn new(topic: String, start: StartAt, progress: Arc<Progress>, stats: Arc<Stats>) -> Group {
        Group { topic, start, progress, stats, errors: AtomicU64::new(0) }
    }

    /// The group confirmed `offsets` (partition, next offset) as committed: counted, and the
    /// partitions' lag updated.
    pub fn confirmed(&self, offsets: &[(i32, i64)]) {
        bump(&self.stats.commits);
        for (p, next) in offsets {
            if let Some((high, committed)) = self.progress.committed(*p, *next) {
                self.stats.set_lag(*p, high, committed);
            }
        }
    }

    /// Builds a list of (partition, offset) of this bridge's topic.
    pub fn list(&self, offsets: &[(i32, i64)]) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::with_capacity(offsets.len());
        for (p, next) in offsets {
            // Only refused for a negative offset, which no caller passes.
            let _ = tpl.add_partition_offset(&self.topic, *p, Offset::Offset(*next));
        }
        tpl
    }

    /// Where `partition` starts when the group has no offset for it: looked up now.
    fn start_offset(&self, consumer: &BaseConsumer<Group>, partition: i32) -> KafkaResult<i64> {
        let (low, high) = consumer.fetch_watermarks(&self.topic, partition, REBALANCE_TIMEOUT)?;
        Ok(match self.start {
            StartAt::Earliest => low,
            StartAt::Latest => high,
        })
    }

    fn on_assign(&self, consumer: &BaseConsumer<Group>, tpl: &TopicPartitionList) {
        let partitions: Vec<i32> = tpl.elements_for_topic(&self.topic).iter().map(|e| e.partition()).collect();
        let mut assignment = TopicPartitionList::with_capacity(partitions.len());
        let mut known = Vec::new();
        let mut fresh = Vec::new();
        let committed = match consumer.committed_offsets(tpl.clone(), REBALANCE_TIMEOUT) {
            Ok(c) => c,
            Err(e) => {
                bump(&self.stats.kafka_failures);
                tracing::warn!(
                    "cannot read the group's committed offsets: {e}; the partitions start where librdkafka \
                     finds them (committed, else auto.offset.reset = {:?})",
                    self.start
                );
                TopicPartitionList::new()
            }
        };
        for &p in &partitions {
            let offset = match committed.find_partition(&self.topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(n)) if n >= 0 => {
                    known.push((p, Some(n)));
                    Offset::Offset(n)
                }
                Some(_) => match self.start_offset(consumer, p) {
                    Ok(n) => {
                        fresh.push((p, n));
                        known.push((p, Some(n)));
                        Offset::Offset(n)
                    }
                    Err(e) => {
                        bump(&self.stats.kafka_failures);
                        tracing::warn!(partition = p, "cannot look up the {:?} offset: {e}", self.start);
                        known.push((p, None));
                        Offset::Stored
                    }
                },
                None => {
                    known.push((p, None));
                    Offset::Stored
                }
            };
            let _ = assignment.add_partition_offset(&self.topic, p, offset);
        }
        if !fresh.is_empty() {
            // Kept at once: see the module's doc.
            match consumer.commit(&self.list(&fresh), CommitMode::Sync) {
                Ok(()) => {
                    bump(&self.stats.commits);
                    tracing::info!(partitions = ?fresh, "no committed offset: starting at the {:?} offset, committed", self.start);
                }
                Err(e) => {
                    bump(&self.stats.kafka_failures);
                    tracing::warn!(partitions = ?fresh, "cannot commit the start offsets: {e}");
                    // Not confirmed: the first acknowledged records commit them.
                    for k in known.iter_mut().filter(|k| fresh.iter().any(|f| f.0 == k.0)) {
                        k.1 = None;
                    }
                }
            }
        }
        if let Err(e) = consumer.assign(&assignment) {
            bump(&self.stats.kafka_failures);
            tracing::error!("cannot take the partitions {partitions:?} assigned by the group: {e}");
            return;
        }
        self.progress.assign(&known);
        self.stats.assigned(partitions.len());
        tracing::info!(topic = %self.topic, partitions = ?known, "partitions assigned (partition, committed offset)");
    }

    fn on_revoke(&self, consumer: &BaseConsumer<Group>, tpl: &TopicPartitionList) {
        let partitions: Vec<i32> = tpl.elements_for_topic(&self.topic).iter().map(|e| e.partition()).collect();
        if consumer.assignment_lost() {
            tracing::warn!(partitions = ?partitions, "the group took the partitions away (session lost): nothing committed");
        } else {
            let acked = self.progress.uncommitted(&partitions);
            if !acked.is_empty() {
                match consumer.commit(&self.list(&acked), CommitMode::Sync) {
                    Ok(()) => bump(&self.stats.commits),
                    Err(e) => {
                        bump(&self.stats.kafka_failures);
                        tracing::warn!(offsets = ?acked, "cannot commit the revoked partitions' offsets: {e}");
                        0
                    }
                };
            }
        }
        self.progress.revoke(&partitions);
        self.stats.revoked(&partitions, self.progress.count());
        tracing::info!(topic = %self.topic, partitions = ?partitions, "partitions revoked");
    }
}

impl ClientContext for Group {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error
            | RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", "{fac}: {message}"),
            RDKafkaLogLevel::Notice => tracing::info!(target: "librdkafka", "{fac}: {message}"),
            RDKafkaLogLevel::Info => tracing::debug!(target: "librdkafka", "{fac}: {message}"),
            RDKafkaLogLevel::Debug => tracing::trace!(target: "librdkafka", "{fac}: {message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // Counted where the stream yields it (`consume`); here for its reason.
        let n = self.errors.fetch_add(1, Ordering::Relaxed) + 1;
        if n <= 1 || n.is_power_of_two() {
            tracing::warn!(errors = n, "Kafka: {error}: {reason}");
        }
    }

    fn stats_raw(&self, json: &[u8]) {
        let Ok(s) = serde_json::from_slice::<Statistics>(json) else {
            tracing::debug!("librdkafka's statistics did not parse");
            return;
        };
        let Some(topic) = s.topics.get(&self.topic) else { return };
        for (p, part) in &topic.partitions {
            // librdkafka lists an internal partition -1; -1 is also an unknown watermark.
            let (Ok(p), Some(high)) = (p.parse::<i32>(), part.hi_offset.filter(|h| *h >= 0)) else { continue };
            if let Some((high, committed)) = self.progress.high(p, high) {
                self.stats.set_lag(p, high, committed);
            }
        }
    }
}

impl ConsumerContext for Group {
    fn rebalance(&self, consumer: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => self.on_assign(consumer, tpl),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                self.on_revoke(consumer, tpl);
                if let Err(e) = consumer.unassign() {
                    tracing::warn!("cannot give the revoked partitions up: {e}");
                }
            }
            other => {
                bump(&self.stats.kafka_failures);
                tracing::error!("the group's rebalance failed: {other:?}; giving every partition up");
                let all: Vec<i32> = self.progress.lock().keys().copied().collect();
                self.progress.revoke(&all);
                self.stats.revoked(&all, 0);
                if let Err(e) = consumer.unassign() {
                    tracing::warn!("cannot give the partitions up: {e}");
                }
            }
        }
    }
}

/// The part of librdkafka's statistics (JSON, `statistics.interval.ms`) the lag needs.
#[derive(serde::Deserialize)]
struct Statistics {
    #[serde(default)]
    topics: BTreeMap<String, TopicStatistics>,
}

#[derive(serde::Deserialize)]
struct TopicStatistics {
    #[serde(default)]
    partitions: BTreeMap<String, PartitionStatistics>,
}

#[derive(serde::Deserialize)]
struct PartitionStatistics {
    hi_offset: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_follow_the_acks_of_the_current_assignment_only() {
        let p = Progress::default();
        p.assign(&[(0, Some(5)), (1, None)]);
        let e0 = p.epoch(0).expect("assigned");
        assert_eq!(p.epoch(2), None);
        assert!(p.to_commit().is_empty(), "nothing acknowledged yet");
        p.acked(0, e0, 8);
        assert_eq!(p.to_commit(), [(0, 8)]);
        assert!(p.to_commit().is_empty(), "sent once");
        p.commit_failed(&[(0, 8)]);
        assert_eq!(p.to_commit(), [(0, 8)], "sent again after a failure");
        assert_eq!(p.committed(0, 8), None, "no watermark yet");
        assert_eq!(p.high(0, 10), Some((10, 8)));
        // Revoked and assigned again: an ack of the old assignment commits nothing.
        p.revoke(&[0]);
        p.assign(&[(0, Some(8))]);
        assert_ne!(p.epoch(0), Some(e0));
        p.acked(0, e0, 12);
        assert!(p.to_commit().is_empty(), "{:?}", p.lock());
        assert_eq!(p.uncommitted(&[0, 1]), []);
        let e1 = p.epoch(1).expect("assigned");
        p.acked(1, e1, 3);
        assert_eq!(p.uncommitted(&[0, 1]), [(1, 3)]);
    }

    #[test]
    fn the_statistics_give_the_high_watermarks() {
        let json = br#"{"name":"x","topics":{"billing":{"topic":"billing","partitions":{
            "0":{"partition":0,"hi_offset":42,"committed_offset":40},
            "-1":{"partition":-1,"hi_offset":-1}}}}}"#;
        let s: Statistics = serde_json::from_slice(json).expect("parses");
        let parts = &s.topics["billing"].partitions;
        assert_eq!(parts["0"].hi_offset, Some(42));
        assert_eq!(parts["-1"].hi_offset, Some(-1));
    }
}
