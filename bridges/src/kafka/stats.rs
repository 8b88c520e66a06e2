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
    /// Errors from Kafka: a broker unreachable, a refused TLS handshake or SASL login, a failed
    /// offset lookup or commit (each retried, by librdkafka or at the next commit).
    pub kafka_failures: AtomicU64,
    /// Of those, TLS handshakes that failed (above all: a broker certificate the CA did not
    /// sign, or one for another name): check `--ca-file` and the broker's address.
    pub tls_refused: AtomicU64,
    /// Of those, SASL logins that failed (above all: a wrong user name or password): check the
    /// credential. librdkafka reports an error that repeats on one connection once in 30 s.
    pub login_refused: AtomicU64,
    /// Commits the group confirmed (each of one or more partitions' offsets).
    pub commits: AtomicU64,
    /// Partitions the group assigned to this bridge now.
    partitions: AtomicU64,
    /// Records the assigned partitions' high watermarks are ahead of what was committed, by
    /// partition (known once librdkafka's statistics gave the watermark).
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
    /// See [`Stats::kafka_failures`].
    pub kafka_failures: u64,
    /// See [`Stats::tls_refused`].
    pub tls_refused: u64,
    /// See [`Stats::login_refused`].
    pub login_refused: u64,
    /// See [`Stats::commits`].
    pub commits: u64,
    /// Records behind the high watermarks, summed over the assigned partitions (as of the last
    /// statistics or commit).
    pub lag: u64,
    /// Partitions assigned to this bridge.
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
            kafka_failures: get(&self.kafka_failures),
            tls_refused: get(&self.tls_refused),
            login_refused: get(&self.login_refused),
            commits: get(&self.commits),
            lag: lag.values().sum(),
            partitions: get(&self.partitions),
        }
    }

    /// Records `partition`'s lag: its high watermark less its committed offset.
    pub(super) fn set_lag(&self, partition: i32, high_watermark: i64, committed: i64) {
        let lag = u64::try_from(high_watermark.saturating_sub(committed)).unwrap_or(0);
        self.lag.lock().unwrap_or_else(|p| p.into_inner()).insert(partition, lag);
    }

    /// `n` partitions are assigned now.
    pub(super) fn assigned(&self, n: usize) {
        self.partitions.store(n as u64, Ordering::Relaxed);
    }

    /// `partitions` were revoked; `remaining` are still assigned.
    pub(super) fn revoked(&self, partitions: &[i32], remaining: usize) {
        let mut lag = self.lag.lock().unwrap_or_else(|p| p.into_inner());
        for p in partitions {
            lag.remove(p);
        }
        self.partitions.store(remaining as u64, Ordering::Relaxed);
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
        kafka_failures = s.kafka_failures,
        tls_refused = s.tls_refused,
        login_refused = s.login_refused,
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
        s.assigned(3);
        let snap = s.snapshot();
        assert_eq!((snap.lag, snap.partitions), (6, 3));
        s.set_lag(0, 10, 10);
        assert_eq!(s.snapshot().lag, 0);
        s.set_lag(0, 12, 10);
        s.revoked(&[0, 1], 1);
        let snap = s.snapshot();
        assert_eq!((snap.lag, snap.partitions), (0, 1), "a revoked partition's lag is no longer this bridge's");
    }
}
