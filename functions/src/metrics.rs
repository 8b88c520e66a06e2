//! What the components' Prometheus metrics share: the OpenMetrics content type and a
//! lock-free duration [`Histogram`] (`prometheus-client`'s own takes a lock per observation, so
//! the hot paths use this one and the library only formats it at scrape time).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// `Content-Type` of a `/metrics` answer.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The text of a scrape: what `collector` reads, in the OpenMetrics text format.
pub fn encode(collector: impl Collector) -> Result<String, std::fmt::Error> {
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(collector));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    Ok(text)
}

/// A histogram of durations with fixed buckets, in atomics: observing takes no lock.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative); the last one is `+Inf`.
    counts: Box<[AtomicU64]>,
    /// Sum of the observations, microseconds.
    sum_us: AtomicU64,
}

/// A copy of the counts as they are (each bucket read once; a scrape's snapshot).
impl Clone for Histogram {
    fn clone(&self) -> Histogram {
        Histogram {
            bounds: self.bounds,
            counts: self.counts.iter().map(|c| AtomicU64::new(c.load(Ordering::Relaxed))).collect(),
            sum_us: AtomicU64::new(self.sum_us.load(Ordering::Relaxed)),
        }
    }
}

impl Histogram {
    /// An empty histogram with `bounds` (ascending, seconds) and `+Inf`.
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(), sum_us: AtomicU64::new(0) }
    }

    /// Counts one observation of `d`.
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = self.bounds.partition_point(|b| *b < s);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Observations in bucket `i` alone (not cumulative; `i == bounds.len()` is `+Inf`).
    pub fn bucket(&self, i: usize) -> u64 {
        self.counts.get(i).map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Sum of the observations, seconds.
    pub fn sum_s(&self) -> f64 {
        self.sum_us.load(Ordering::Relaxed) as f64 / 1e6
    }

    /// Writes the histogram as metric `name` (in seconds).
    pub fn encode(&self, e: &mut DescriptorEncoder, name: &str, help: &str) -> Result<(), std::fmt::Error> {
        let mut buckets: Vec<(f64, u64)> =
            self.bounds.iter().zip(self.counts.iter()).map(|(b, c)| (*b, c.load(Ordering::Relaxed))).collect();
        buckets.push((f64::INFINITY, self.bucket(self.bounds.len())));
        let count = buckets.iter().map(|(_, c)| c).sum();
        e.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?.encode_histogram::<NoLabelSet>(
            self.sum_s(),
            count,
            &buckets,
            None,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_that_holds_them() {
        static BOUNDS: [f64; 3] = [0.01, 0.1, 1.0];
        let h = Histogram::new(&BOUNDS);
        for ms in [1, 10, 11, 999, 1000, 1001, 7_200_000] {
            h.observe(Duration::from_millis(ms));
        }
        let buckets: Vec<u64> = (0..=BOUNDS.len()).map(|i| h.bucket(i)).collect();
        assert_eq!(buckets, [2, 1, 2, 2], "le 0.01 holds 0.01; +Inf the rest");
        assert_eq!(h.count(), 7);
        assert!((h.sum_s() - 7_203.022).abs() < 1e-9, "{}", h.sum_s());
    }
}
