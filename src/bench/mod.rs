//! `htfaas bench`: the whole path measured on the real stack, with the peer (Parsl's
//! HighThroughputExecutor) measured on the same machine in the same run, and the components'
//! own benches gathered. One JSON line per figure on stdout ([`Figure`]); progress on stderr.
//!
//! See `BENCHMARKS.md` for what each figure means and the last results.

pub mod components;

use serde::{Deserialize, Serialize};

/// One measured figure: `{system, metric, value, unit, n}` plus optional context fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    /// Who was measured: `htfaas`, `parsl-htex`, or `ratio` for htfaas/peer comparisons.
    pub system: String,
    /// What was measured (`event_to_output_p50`, `dispatch.queued_1000000.jobs_per_s`, ...).
    pub metric: String,
    /// The figure.
    pub value: f64,
    /// Its unit (`ms`, `us`, `events/s`, `bytes`, `ratio`, ...).
    pub unit: String,
    /// How many samples (events, jobs, runs) it is computed from.
    pub n: u64,
    /// Context (mode, target, queue size, ...).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Figure {
    /// A figure without context fields.
    pub fn new(system: &str, metric: impl Into<String>, value: f64, unit: &str, n: u64) -> Figure {
        Figure {
            system: system.into(),
            metric: metric.into(),
            value,
            unit: unit.into(),
            n,
            extra: serde_json::Map::new(),
        }
    }

    /// Adds a context field.
    pub fn with(mut self, key: &str, value: impl Into<serde_json::Value>) -> Figure {
        self.extra.insert(key.into(), value.into());
        self
    }
}
