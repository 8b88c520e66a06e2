//! What the Kafka bridge counted ([`Stats`], [`StatsSnapshot`]): logged now and then and at the
//! end, returned by `run`, and readable live through the `Arc<Stats>` a caller passes in.
//!
//! Must not know: Kafka, NATS.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// What the bridge counted, over every partition.
#[derive(Debug, Default)]
pub struct Stats {
    /// Records fetched from Kafka (each once per fetch: a record fetched again after a restart
    /// counts again).
    pub received: AtomicU64,
    /// Records JetStream acknowledged (on a path subject or the plain billing subject).
    pub published: AtomicU64,
    /// Of those, on the plain billing subject: no usable path (`"Unknown"`, NFS's
    /// `parent:[…]`), or a message that is no event (a failed transfer, a warning).
    pub published_plain: AtomicU64,
    /// Of those, acknowledged as duplicates: a record published before (a restart re-read it
    /// from the last commit, or a retried publish had in fact arrived).
    pub duplicates: AtomicU64,
    /// Records skipped as malformed: not a billing message, a bad path, no value, too large,
    /// or a batch that did not decode (each of its records skipped in turn).
    pub malformed: AtomicU64,
    /// Failed publish attempts (each retried).
    pub publish_failures: AtomicU64,
    /// Failed fetches (broker down, leader moving, …; each retried after a backoff).
    pub fetch_failures: AtomicU64,
    /// Offset commits written to the offsets bucket.
    pub commits: AtomicU64,
    /// Records the partitions' high watermarks are ahead of what was committed, by partition.
    lag: Mutex<BTreeMap<i32, u64>>,
}

/// The counts at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatsSnapshot {
    /// See [`Stats::received`].
    pub received: u64,
    /// See [`Stats::published`].
    pub published: u64,
    /// See [`Stats::published_plain`].
    pub published_plain: u64,
    /// See [`Stats::duplicates`].
    pub duplicates: u64,
    /// See [`Stats::malformed`].
    pub malformed: u64,
    /// See [`Stats::publish_failures`].
    pub publish_failures: u64,
    /// See [`Stats::fetch_failures`].
    pub fetch_failures: u64,
    /// See [`Stats::commits`].
    pub commits: u64,
    /// Records behind the high watermarks, summed over the partitions (as of each one's last
    /// fetch or commit).
    pub lag: u64,
    /// Partitions being read.
    pub partitions: u64,
}

impl Stats {
    /// The current counts.
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let lag = self.lag.lock().unwrap_or_else(|p| p.into_inner());
        StatsSnapshot {
            received: get(&self.received),
            published: get(&self.published),
            published_plain: get(&self.published_plain),
            duplicates: get(&self.duplicates),
            malformed: get(&self.malformed),
            publish_failures: get(&self.publish_failures),
            fetch_failures: get(&self.fetch_failures),
            commits: get(&self.commits),
            lag: lag.values().sum(),
            partitions: lag.len() as u64,
        }
    }

    /// Records `partition`'s lag: its high watermark less its next offset.
    pub(super) fn set_lag(&self, partition: i32, high_watermark: i64, next: i64) {
        let lag = u64::try_from(high_watermark.saturating_sub(next)).unwrap_or(0);
        self.lag.lock().unwrap_or_else(|p| p.into_inner()).insert(partition, lag);
    }
}

pub(super) fn bump(c: &AtomicU64) -> u64 {
    c.fetch_add(1, Ordering::Relaxed) + 1
}

pub(super) fn log_stats(what: &str, s: &StatsSnapshot) {
    tracing::info!(
        received = s.received,
        published = s.published,
        plain = s.published_plain,
        duplicates = s.duplicates,
        malformed = s.malformed,
        lag = s.lag,
        partitions = s.partitions,
        commits = s.commits,
        publish_failures = s.publish_failures,
        fetch_failures = s.fetch_failures,
        "dcache-kafka bridge: {what}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_sums_the_partitions_and_never_goes_negative() {
        let s = Stats::default();
        s.set_lag(0, 10, 4);
        s.set_lag(1, 7, 7);
        s.set_lag(2, 3, 5);
        let snap = s.snapshot();
        assert_eq!((snap.lag, snap.partitions), (6, 3));
        s.set_lag(0, 10, 10);
        assert_eq!(s.snapshot().lag, 0);
    }
}
