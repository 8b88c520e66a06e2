//! Counters of what the gateway did, served at `GET /v1/stats`.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};

/// Monotonic counters; relaxed ordering is enough for reporting.
#[derive(Debug, Default)]
pub struct Stats {
    /// Messages delivered by JetStream (redeliveries included).
    pub events_received: AtomicU64,
    /// Messages that were not billing messages; acked and skipped.
    pub events_malformed: AtomicU64,
    /// Valid messages that never fire (reads, p2p, failures, other types).
    pub events_ignored: AtomicU64,
    /// Writes that matched no trigger.
    pub events_unmatched: AtomicU64,
    /// Jobs the scheduler accepted as new.
    pub jobs_submitted: AtomicU64,
    /// Submissions the scheduler answered with an existing job (same event and function).
    pub jobs_deduplicated: AtomicU64,
    /// Submissions refused for good (bad request, limits); the event is acked.
    pub jobs_refused: AtomicU64,
    /// Transient failures (storage or scheduler unreachable); the event is redelivered.
    pub transient_failures: AtomicU64,
}

/// A snapshot of [`Stats`].
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// See [`Stats::events_received`].
    pub events_received: u64,
    /// See [`Stats::events_malformed`].
    pub events_malformed: u64,
    /// See [`Stats::events_ignored`].
    pub events_ignored: u64,
    /// See [`Stats::events_unmatched`].
    pub events_unmatched: u64,
    /// See [`Stats::jobs_submitted`].
    pub jobs_submitted: u64,
    /// See [`Stats::jobs_deduplicated`].
    pub jobs_deduplicated: u64,
    /// See [`Stats::jobs_refused`].
    pub jobs_refused: u64,
    /// See [`Stats::transient_failures`].
    pub transient_failures: u64,
}

impl Stats {
    /// Adds one to `counter`.
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads every counter.
    pub fn snapshot(&self) -> StatsSnapshot {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            events_received: r(&self.events_received),
            events_malformed: r(&self.events_malformed),
            events_ignored: r(&self.events_ignored),
            events_unmatched: r(&self.events_unmatched),
            jobs_submitted: r(&self.jobs_submitted),
            jobs_deduplicated: r(&self.jobs_deduplicated),
            jobs_refused: r(&self.jobs_refused),
            transient_failures: r(&self.transient_failures),
        }
    }
}
