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
    /// Events all of whose firings were already queued (a redelivery or a duplicate message):
    /// dropped before any macaroon request.
    pub events_duplicate: AtomicU64,
    /// Jobs the scheduler accepted as new.
    pub jobs_submitted: AtomicU64,
    /// Firings that started no job because one for the same event and function already
    /// exists: dropped on the firing table's key ([`Stats::firings_deduplicated`]) or answered by
    /// the scheduler with the existing job (the difference of the two).
    pub jobs_deduplicated: AtomicU64,
    /// Firings refused for good (bad request, limits, an unreadable stored firing).
    pub jobs_refused: AtomicU64,
    /// Transient failures: a submission (storage or scheduler unreachable), retried with
    /// backoff from the firing table; or a failed write of the table, the event redelivered.
    pub transient_failures: AtomicU64,
    /// Firings written to the firing table (one per matching function of a new event).
    pub firings_queued: AtomicU64,
    /// Firings dropped because their key (event, function, digest) was already in the table.
    pub firings_deduplicated: AtomicU64,
    /// Pending firings replaced by a later event on the same path (debounce); never run.
    pub firings_superseded: AtomicU64,
    /// Times a firing found no rate token and was given a later time (waits, not dropped).
    pub firings_rate_delayed: AtomicU64,
    /// Gauge: firings pending or being submitted now.
    pub firings_pending: AtomicU64,
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
    /// See [`Stats::events_duplicate`].
    #[serde(default)]
    pub events_duplicate: u64,
    /// See [`Stats::jobs_submitted`].
    pub jobs_submitted: u64,
    /// See [`Stats::jobs_deduplicated`].
    pub jobs_deduplicated: u64,
    /// See [`Stats::jobs_refused`].
    pub jobs_refused: u64,
    /// See [`Stats::transient_failures`].
    pub transient_failures: u64,
    /// See [`Stats::firings_queued`].
    #[serde(default)]
    pub firings_queued: u64,
    /// See [`Stats::firings_deduplicated`].
    #[serde(default)]
    pub firings_deduplicated: u64,
    /// See [`Stats::firings_superseded`].
    #[serde(default)]
    pub firings_superseded: u64,
    /// See [`Stats::firings_rate_delayed`].
    #[serde(default)]
    pub firings_rate_delayed: u64,
    /// See [`Stats::firings_pending`].
    #[serde(default)]
    pub firings_pending: u64,
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
            events_duplicate: r(&self.events_duplicate),
            jobs_submitted: r(&self.jobs_submitted),
            jobs_deduplicated: r(&self.jobs_deduplicated),
            jobs_refused: r(&self.jobs_refused),
            transient_failures: r(&self.transient_failures),
            firings_queued: r(&self.firings_queued),
            firings_deduplicated: r(&self.firings_deduplicated),
            firings_superseded: r(&self.firings_superseded),
            firings_rate_delayed: r(&self.firings_rate_delayed),
            firings_pending: r(&self.firings_pending),
        }
    }
}
