//! Counters of what the gateway did, served at `GET /v1/stats`.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};

/// Monotonic counters; relaxed ordering is enough for reporting.
#[derive(Debug, Default)]
pub struct Stats {
    /// Messages delivered by JetStream (redeliveries included).
    pub events_received: AtomicU64,
    /// Of those, on the dCache billing subject.
    pub events_dcache_billing: AtomicU64,
    /// Of those, on a `storage.cloudevents.*` subject.
    pub events_cloudevents: AtomicU64,
    /// Messages that were not events of their source (bad JSON, missing attribute, bad path);
    /// acked and skipped.
    pub events_malformed: AtomicU64,
    /// Valid messages that are no event (failed operations, p2p copies, no usable path,
    /// warnings).
    pub events_ignored: AtomicU64,
    /// Valid messages of a type the site did not enable (`sources` in the gateway config).
    pub events_not_enabled: AtomicU64,
    /// Events that matched no trigger.
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
    /// See [`Stats::events_dcache_billing`].
    #[serde(default)]
    pub events_dcache_billing: u64,
    /// See [`Stats::events_cloudevents`].
    #[serde(default)]
    pub events_cloudevents: u64,
    /// See [`Stats::events_malformed`].
    pub events_malformed: u64,
    /// See [`Stats::events_ignored`].
    pub events_ignored: u64,
    /// See [`Stats::events_not_enabled`].
    #[serde(default)]
    pub events_not_enabled: u64,
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
            events_dcache_billing: r(&self.events_dcache_billing),
            events_cloudevents: r(&self.events_cloudevents),
            events_malformed: r(&self.events_malformed),
            events_ignored: r(&self.events_ignored),
            events_not_enabled: r(&self.events_not_enabled),
            events_unmatched: r(&self.events_unmatched),
            jobs_submitted: r(&self.jobs_submitted),
            jobs_deduplicated: r(&self.jobs_deduplicated),
            jobs_refused: r(&self.jobs_refused),
            transient_failures: r(&self.transient_failures),
        }
    }
}
