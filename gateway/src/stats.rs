//! Counters of what the gateway did, served at `GET /v1/stats` as a [`StatsSnapshot`] (a wire
//! type of [`htfaas_functions::proto`], where each counter's meaning is documented), and their
//! [`History`]: a sample every [`HISTORY_INTERVAL`] for the last hour (`GET /v1/stats/history`),
//! so the console's event-flow chart starts full.
//!
//! Must not know: the firing table, NATS, routes.

use htfaas_functions::proto::{StatsHistory, StatsSample, StatsSnapshot};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Time between two samples of the [`History`].
pub const HISTORY_INTERVAL: Duration = Duration::from_secs(2);
/// Samples kept: one hour of them.
pub const HISTORY_SAMPLES: usize = 1800;

/// The last [`HISTORY_SAMPLES`] samples of the counters, oldest first; in memory only.
#[derive(Debug, Default)]
pub struct History {
    samples: Mutex<VecDeque<StatsSample>>,
}

impl History {
    /// Adds a sample of `snapshot` taken at `at_ms`, dropping the oldest past the bound.
    pub fn record(&self, at_ms: u64, snapshot: &StatsSnapshot) {
        // A poisoned lock only means a panic elsewhere mid-push: the deque is still whole.
        let mut samples = self.samples.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if samples.len() >= HISTORY_SAMPLES {
            samples.pop_front();
        }
        samples.push_back(StatsSample::of(at_ms, snapshot));
    }

    /// The samples, oldest first.
    pub fn history(&self) -> StatsHistory {
        let samples = self.samples.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        StatsHistory { interval_ms: HISTORY_INTERVAL.as_millis() as u64, samples: samples.iter().copied().collect() }
    }
}

/// Monotonic counters (and one gauge), one per field of [`StatsSnapshot`], plus two that only
/// `GET /metrics` shows ([`crate::metrics`]); relaxed ordering is enough for reporting.
#[derive(Debug, Default)]
pub struct Stats {
    /// See [`StatsSnapshot::events_received`].
    pub events_received: AtomicU64,
    /// See [`StatsSnapshot::events_dcache_billing`].
    pub events_dcache_billing: AtomicU64,
    /// See [`StatsSnapshot::events_cloudevents`].
    pub events_cloudevents: AtomicU64,
    /// See [`StatsSnapshot::events_malformed`].
    pub events_malformed: AtomicU64,
    /// See [`StatsSnapshot::events_ignored`].
    pub events_ignored: AtomicU64,
    /// See [`StatsSnapshot::events_out_of_bounds`].
    pub events_out_of_bounds: AtomicU64,
    /// See [`StatsSnapshot::events_not_enabled`].
    pub events_not_enabled: AtomicU64,
    /// See [`StatsSnapshot::events_unmatched`].
    pub events_unmatched: AtomicU64,
    /// See [`StatsSnapshot::events_duplicate`].
    pub events_duplicate: AtomicU64,
    /// See [`StatsSnapshot::events_disabled`].
    pub events_disabled: AtomicU64,
    /// See [`StatsSnapshot::firings_disabled`].
    pub firings_disabled: AtomicU64,
    /// See [`StatsSnapshot::jobs_submitted`].
    pub jobs_submitted: AtomicU64,
    /// See [`StatsSnapshot::jobs_deduplicated`].
    pub jobs_deduplicated: AtomicU64,
    /// See [`StatsSnapshot::jobs_refused`].
    pub jobs_refused: AtomicU64,
    /// See [`StatsSnapshot::transient_failures`].
    pub transient_failures: AtomicU64,
    /// See [`StatsSnapshot::firings_queued`].
    pub firings_queued: AtomicU64,
    /// See [`StatsSnapshot::firings_deduplicated`].
    pub firings_deduplicated: AtomicU64,
    /// See [`StatsSnapshot::firings_superseded`].
    pub firings_superseded: AtomicU64,
    /// See [`StatsSnapshot::firings_loop_guarded`].
    pub firings_loop_guarded: AtomicU64,
    /// See [`StatsSnapshot::firings_rate_delayed`].
    pub firings_rate_delayed: AtomicU64,
    /// See [`StatsSnapshot::firings_pending`].
    pub firings_pending: AtomicU64,
    /// See [`StatsSnapshot::ingest_batches`].
    pub ingest_batches: AtomicU64,
    /// Gauge: the owners' ingest lanes running (`crate::lanes`; `/metrics` only).
    pub ingest_lanes: AtomicU64,
    /// Events that queued one firing or more (`/metrics` only).
    pub events_fired: AtomicU64,
    /// Events none of whose matching functions fired, each stopped by the loop guard
    /// (`/metrics` only).
    pub events_loop_guarded: AtomicU64,
    /// Events that fired nothing yet but joined a collecting function's group (`/metrics` only).
    pub events_collected: AtomicU64,
    /// Collecting functions' files that joined their group (`/metrics` only).
    pub firings_collected: AtomicU64,
    /// Collecting functions' files kept out of their group: another writer's (`/metrics` only).
    pub firings_not_collected: AtomicU64,
    /// Collecting groups fired by their quiet period (`/metrics` only).
    pub groups_quiet: AtomicU64,
    /// Collecting groups expired by their timeout, not fired (`/metrics` only).
    pub groups_expired: AtomicU64,
    /// Times the ingest's NATS connection was lost (`/metrics` only).
    pub nats_disconnects: AtomicU64,
    /// Times the ingest's NATS connection came back after a loss; the durable consumer then
    /// resumes where its acks left it (`/metrics` only).
    pub nats_reconnects: AtomicU64,
    /// Batches of events whose firings could not be written because the firing table's disk
    /// (or its size limit) is full (`SQLITE_FULL`): none was acked, each is redelivered
    /// (`/metrics` only; each event also counts in `transient_failures`).
    pub firings_store_full: AtomicU64,
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
            events_out_of_bounds: r(&self.events_out_of_bounds),
            events_not_enabled: r(&self.events_not_enabled),
            events_unmatched: r(&self.events_unmatched),
            events_duplicate: r(&self.events_duplicate),
            events_disabled: r(&self.events_disabled),
            firings_disabled: r(&self.firings_disabled),
            jobs_submitted: r(&self.jobs_submitted),
            jobs_deduplicated: r(&self.jobs_deduplicated),
            jobs_refused: r(&self.jobs_refused),
            transient_failures: r(&self.transient_failures),
            firings_queued: r(&self.firings_queued),
            firings_deduplicated: r(&self.firings_deduplicated),
            firings_superseded: r(&self.firings_superseded),
            firings_loop_guarded: r(&self.firings_loop_guarded),
            firings_rate_delayed: r(&self.firings_rate_delayed),
            firings_pending: r(&self.firings_pending),
            ingest_batches: r(&self.ingest_batches),
            // JetStream's to say (`crate::lanes::Lanes::pending`), not a counter here.
            events_pending: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_keeps_the_last_hour_oldest_first_and_sums_what_fired_nothing() {
        let stats = Stats::default();
        let history = History::default();
        for i in 0..(HISTORY_SAMPLES as u64 + 5) {
            Stats::bump(&stats.events_received);
            if i % 2 == 0 {
                Stats::bump(&stats.events_unmatched);
            } else {
                Stats::bump(&stats.events_malformed);
            }
            history.record(1_000 + i, &stats.snapshot());
        }
        let h = history.history();
        assert_eq!(h.interval_ms, 2000);
        assert_eq!(h.samples.len(), HISTORY_SAMPLES);
        let (first, last) = (h.samples[0], h.samples[HISTORY_SAMPLES - 1]);
        assert_eq!(first.at_ms, 1_005, "the five oldest were dropped");
        assert_eq!(last.events_received, HISTORY_SAMPLES as u64 + 5);
        assert_eq!(last.events_ignored, last.events_received, "unmatched and malformed both count");
        assert!(h.samples.windows(2).all(|w| w[0].at_ms < w[1].at_ms));
    }
}
