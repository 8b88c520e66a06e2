//! What the bridge counted ([`Stats`], [`StatsSnapshot`]), logged now and then and at the end.
//!
//! Must not know: lines, NATS.

use std::sync::atomic::{AtomicU64, Ordering};

/// What the bridge counted. Logged every [`Settings::stats_interval`](super::Settings::stats_interval) and at the end.
#[derive(Debug, Default)]
pub struct Stats {
    /// Lines read (every line, whatever became of it).
    pub lines: AtomicU64,
    /// Lines skipped as malformed or too long.
    pub skipped: AtomicU64,
    /// Lines that report nothing the bridge publishes (`trunc`, blank lines).
    pub ignored: AtomicU64,
    /// Events handed to the publisher.
    pub queued: AtomicU64,
    /// Events JetStream acknowledged.
    pub published: AtomicU64,
    /// Of those, acknowledged as duplicates (a retry of a publish that had arrived).
    pub duplicates: AtomicU64,
    /// Failed publish attempts (each retried).
    pub publish_failures: AtomicU64,
}

/// The counts at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatsSnapshot {
    /// See [`Stats::lines`].
    pub lines: u64,
    /// See [`Stats::skipped`].
    pub skipped: u64,
    /// See [`Stats::ignored`].
    pub ignored: u64,
    /// See [`Stats::queued`].
    pub queued: u64,
    /// See [`Stats::published`].
    pub published: u64,
    /// See [`Stats::duplicates`].
    pub duplicates: u64,
    /// See [`Stats::publish_failures`].
    pub publish_failures: u64,
}

impl StatsSnapshot {
    /// Events queued but not (yet) published: at the end of a run, the ones lost.
    pub fn unpublished(&self) -> u64 {
        self.queued.saturating_sub(self.published)
    }
}

impl Stats {
    /// The current counts.
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            lines: get(&self.lines),
            skipped: get(&self.skipped),
            ignored: get(&self.ignored),
            queued: get(&self.queued),
            published: get(&self.published),
            duplicates: get(&self.duplicates),
            publish_failures: get(&self.publish_failures),
        }
    }
}

pub(super) fn bump(c: &AtomicU64) -> u64 {
    c.fetch_add(1, Ordering::Relaxed) + 1
}

pub(super) fn log_stats(what: &str, s: &StatsSnapshot) {
    tracing::info!(
        lines = s.lines,
        published = s.published,
        skipped = s.skipped,
        ignored = s.ignored,
        pending = s.unpublished(),
        duplicates = s.duplicates,
        publish_failures = s.publish_failures,
        "xrootd-notify bridge: {what}"
    );
}
