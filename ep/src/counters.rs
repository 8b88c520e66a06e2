//! The EP's counters ([`Metrics`]): jobs ended by outcome, their durations, guest
//! instantiations, modules compiled ahead or refused for it, reference files by where they
//! came from, checkpoints restored, saved or refused, and attach-token renewals. Every counter is an atomic: a job's end costs a few relaxed additions.
//!
//! Bottom of the EP: the job tasks count here and [`crate::metrics`] serves them; must not
//! know about HTTP or the config.

use htfaas_functions::metrics::Histogram;
use htfaas_functions::proto::Outcome;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the job duration buckets, seconds.
pub const DURATION_BUCKETS: [f64; 14] =
    [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0, 300.0, 3600.0];
/// Outcome labels, in the order of [`Metrics::runs`].
pub(crate) const OUTCOMES: [&str; 12] = [
    "exited",
    "trapped",
    "memory_exceeded",
    "time_exceeded",
    "input_failed",
    "output_failed",
    "module_failed",
    "cancelled",
    "fuel_exhausted",
    "output_exceeded",
    "storage_unavailable",
    "checkpointed",
];

/// The label of `o`'s kind.
pub(crate) fn outcome_label(o: &Outcome) -> &'static str {
    OUTCOMES[outcome_index(o)]
}

pub(crate) fn outcome_index(o: &Outcome) -> usize {
    match o {
        Outcome::Exited { .. } => 0,
        Outcome::Trapped { .. } => 1,
        Outcome::MemoryExceeded { .. } => 2,
        Outcome::TimeExceeded { .. } => 3,
        Outcome::InputFailed { .. } => 4,
        Outcome::OutputFailed { .. } => 5,
        Outcome::ModuleFailed { .. } => 6,
        Outcome::Cancelled { .. } => 7,
        Outcome::FuelExhausted { .. } => 8,
        Outcome::OutputExceeded { .. } => 9,
        Outcome::StorageUnavailable { .. } => 10,
        Outcome::Checkpointed { .. } => 11,
    }
}

/// What happened to a job's checkpoint, as [`Metrics::checkpoint`] counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CheckpointEvent {
    /// One was found and unpacked into `/checkpoint` before the run.
    Restored = 0,
    /// `/checkpoint` was packed and stored.
    Saved = 1,
    /// One was refused for its bound (stored or found larger than it, or too many entries).
    OverBound = 2,
    /// Restoring or saving one failed otherwise (the storage, an unsafe entry, the disk).
    Failed = 3,
}

/// Checkpoint event labels, in the order of [`CheckpointEvent`].
pub(crate) const CHECKPOINT_EVENTS: [&str; 4] = ["restored", "saved", "over_bound", "failed"];

/// The EP's counters, shared by the job tasks and the metrics listener.
#[derive(Debug)]
pub struct Metrics {
    pub(crate) runs: [AtomicU64; OUTCOMES.len()],
    pub(crate) instantiations: AtomicU64,
    pub(crate) duration: Histogram,
    /// Modules compiled ahead of their first job (`SchedulerMsg::Warm`).
    pub(crate) warmed: AtomicU64,
    /// Warm messages refused: a module URL outside the allowed origins.
    pub(crate) warm_refused_origin: AtomicU64,
    /// Warm messages refused: the fetched bytes do not hash to the digest named.
    pub(crate) warm_refused_digest: AtomicU64,
    /// Warm messages that failed otherwise (fetch, compile) or were dropped (queue full).
    pub(crate) warm_failed: AtomicU64,
    /// Reference files linked from the EP's cache instead of downloaded.
    pub(crate) refs_from_cache: AtomicU64,
    /// Reference files downloaded from the storage.
    pub(crate) refs_from_storage: AtomicU64,
    /// Checkpoints, by [`CheckpointEvent`].
    pub(crate) checkpoints: [AtomicU64; CHECKPOINT_EVENTS.len()],
    /// Attach tokens the scheduler renewed (`[0]`) and renewals it refused (`[1]`).
    pub(crate) attach_renewals: [AtomicU64; 2],
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            runs: Default::default(),
            instantiations: AtomicU64::new(0),
            duration: Histogram::new(&DURATION_BUCKETS),
            warmed: AtomicU64::new(0),
            warm_refused_origin: AtomicU64::new(0),
            warm_refused_digest: AtomicU64::new(0),
            warm_failed: AtomicU64::new(0),
            refs_from_cache: AtomicU64::new(0),
            refs_from_storage: AtomicU64::new(0),
            checkpoints: Default::default(),
            attach_renewals: Default::default(),
        }
    }
}

impl Metrics {
    /// A job ended with `outcome` after `took`.
    pub fn job_finished(&self, outcome: &Outcome, took: Duration) {
        self.runs[outcome_index(outcome)].fetch_add(1, Ordering::Relaxed);
        self.duration.observe(took);
    }

    /// A guest run is about to instantiate its module.
    pub fn instantiating(&self) {
        self.instantiations.fetch_add(1, Ordering::Relaxed);
    }

    /// Modules compiled ahead of their first job.
    pub fn warmed(&self) -> u64 {
        self.warmed.load(Ordering::Relaxed)
    }

    /// Warm messages refused: (module URL outside the allowed origins, digest mismatch).
    pub fn warm_refused(&self) -> (u64, u64) {
        (self.warm_refused_origin.load(Ordering::Relaxed), self.warm_refused_digest.load(Ordering::Relaxed))
    }

    /// The scheduler answered a renewal of the attach token: `renewed`, or refused.
    pub(crate) fn attach_renewal(&self, renewed: bool) {
        self.attach_renewals[usize::from(!renewed)].fetch_add(1, Ordering::Relaxed);
    }

    /// A job's reference file was read: linked from the cache, or downloaded.
    pub(crate) fn reference_read(&self, from_cache: bool) {
        let counter = if from_cache { &self.refs_from_cache } else { &self.refs_from_storage };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Reference files read: (linked from the cache, downloaded from the storage).
    pub fn reference_files(&self) -> (u64, u64) {
        (self.refs_from_cache.load(Ordering::Relaxed), self.refs_from_storage.load(Ordering::Relaxed))
    }

    /// A job's checkpoint was restored, saved or refused.
    pub(crate) fn checkpoint(&self, event: CheckpointEvent) {
        self.checkpoints[event as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Checkpoint events labelled `label` ([`CHECKPOINT_EVENTS`]).
    pub fn checkpoints(&self, label: &str) -> u64 {
        CHECKPOINT_EVENTS.iter().position(|e| *e == label).map_or(0, |i| self.checkpoints[i].load(Ordering::Relaxed))
    }

    /// Jobs ended with an outcome labelled `label`.
    pub fn runs(&self, label: &str) -> u64 {
        OUTCOMES.iter().position(|o| *o == label).map_or(0, |i| self.runs[i].load(Ordering::Relaxed))
    }
}
