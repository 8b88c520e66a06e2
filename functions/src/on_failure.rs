//! What a function asks for when one of its runs fails: whether to run it again
//! ([`RetryPolicy`]: how many times, after which outcomes, with which backoff) and what becomes
//! of the outputs it wrote ([`FailedOutputs`]: discarded, quarantined under
//! [`QUARANTINE_SEGMENT`], or uploaded as a success's). Carried by the manifest, the submit
//! request and the assignment.
//!
//! Must not know: the wire messages that carry these (an outcome's kind is named by
//! [`RetryOn`], which `proto` maps onto), the scheduler's site caps, the storage.

use serde::{Deserialize, Serialize};

/// Most times a function may ask to be run again after a failed run.
pub const MAX_RETRIES: u32 = 10;
/// Longest first backoff a function may ask for, seconds (one hour; each further retry doubles
/// it, up to [`MAX_RETRY_BACKOFF_S`] too).
pub const MAX_RETRY_BACKOFF_S: u64 = 3600;
/// The first backoff of a policy that names none, seconds.
pub const DEFAULT_RETRY_BACKOFF_S: u64 = 10;

/// The outcomes of a run that a [`RetryPolicy`] may retry. Every other failure (an input,
/// module or output refused by its server, an output past its limit) is final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryOn {
    /// The guest trapped.
    Trap,
    /// The run passed its wall-time limit.
    TimeExceeded,
    /// The guest tried to grow its memory past the job's limit.
    MemoryExceeded,
    /// The guest exited with a status other than 0.
    ExitNonzero,
    /// The guest used up its instruction budget.
    FuelExhausted,
    /// The storage (or the module's server) stayed unavailable through every try of a transfer:
    /// retried by the scheduler's site-wide rule for lost attempts (its `max_retries` and
    /// backoff, then held), not by the policy's `retries`.
    StorageUnavailable,
}

impl RetryOn {
    /// Every kind, in the order of the manifest reference.
    pub const ALL: [RetryOn; 6] = [
        RetryOn::Trap,
        RetryOn::TimeExceeded,
        RetryOn::MemoryExceeded,
        RetryOn::ExitNonzero,
        RetryOn::FuelExhausted,
        RetryOn::StorageUnavailable,
    ];

    /// The name in manifests and on the command line (`exit_nonzero`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            RetryOn::Trap => "trap",
            RetryOn::TimeExceeded => "time_exceeded",
            RetryOn::MemoryExceeded => "memory_exceeded",
            RetryOn::ExitNonzero => "exit_nonzero",
            RetryOn::FuelExhausted => "fuel_exhausted",
            RetryOn::StorageUnavailable => "storage_unavailable",
        }
    }

    /// Parses [`RetryOn::as_str`].
    pub fn parse(s: &str) -> Option<RetryOn> {
        RetryOn::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

fn all_kinds() -> Vec<RetryOn> {
    RetryOn::ALL.to_vec()
}

fn default_backoff_s() -> u64 {
    DEFAULT_RETRY_BACKOFF_S
}

/// A function's retry policy: after a run that ended with an outcome in `on`, the job runs
/// again, at most `retries` times, the first time `backoff_s` after the failure, then twice as
/// long each time (at most [`MAX_RETRY_BACKOFF_S`]). The scheduler may lower `retries` to its
/// site's cap. A function without one keeps the default: storage outages (and lost EPs) are
/// retried by the scheduler's site-wide rule, guest failures are not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// How many times to run again, 0..=[`MAX_RETRIES`].
    pub retries: u32,
    /// Which outcomes are retried; default: every [`RetryOn`]. `storage_unavailable` left out
    /// fails the job at once on a storage outage instead of waiting for the storage.
    #[serde(default = "all_kinds")]
    pub on: Vec<RetryOn>,
    /// Backoff before the first retry, seconds, 0..=[`MAX_RETRY_BACKOFF_S`]; default
    /// [`DEFAULT_RETRY_BACKOFF_S`].
    #[serde(default = "default_backoff_s")]
    pub backoff_s: u64,
}

/// Why a [`RetryPolicy`] is refused: the field (`retry.retries`, `retry.on`, `retry.backoff_s`)
/// and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct RetryPolicyError {
    /// The field, e.g. `retry.retries`.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

impl RetryPolicy {
    /// Checks the bounds: `retries` at most [`MAX_RETRIES`], `backoff_s` at most
    /// [`MAX_RETRY_BACKOFF_S`], `on` one to six distinct kinds.
    pub fn check(&self) -> Result<(), RetryPolicyError> {
        if self.retries > MAX_RETRIES {
            return Err(RetryPolicyError {
                field: "retry.retries",
                reason: format!("must be 0..={MAX_RETRIES} (a run is never retried without bound)"),
            });
        }
        if self.backoff_s > MAX_RETRY_BACKOFF_S {
            return Err(RetryPolicyError {
                field: "retry.backoff_s",
                reason: format!("must be 0..={MAX_RETRY_BACKOFF_S}"),
            });
        }
        let distinct = self.on.iter().enumerate().all(|(i, k)| !self.on[..i].contains(k));
        if self.on.is_empty() || !distinct {
            let names: Vec<&str> = RetryOn::ALL.iter().map(|k| k.as_str()).collect();
            return Err(RetryPolicyError {
                field: "retry.on",
                reason: format!("must name at least one of {}, each once", names.join(", ")),
            });
        }
        Ok(())
    }

    /// Whether outcomes of `kind` are retried.
    pub fn retries_on(&self, kind: RetryOn) -> bool {
        self.on.contains(&kind)
    }

    /// The backoff before retry `n` (1 for the first), ms: `backoff_s` × 2^(n−1), at most
    /// [`MAX_RETRY_BACKOFF_S`].
    pub fn backoff_ms(&self, n: u32) -> u64 {
        let first = self.backoff_s.min(MAX_RETRY_BACKOFF_S).saturating_mul(1000);
        first.saturating_mul(1u64 << n.saturating_sub(1).min(32)).min(MAX_RETRY_BACKOFF_S * 1000)
    }
}

/// The directory segment under a function's output directory that holds quarantined outputs:
/// `<output dir>/.quarantine/<job id>/<name>` ([`quarantine_dir`]). The gateway fires nothing on
/// any event whose path has this segment ([`is_quarantined`]), whoever published it.
pub const QUARANTINE_SEGMENT: &str = ".quarantine";

/// Where a failed job's quarantined outputs go, relative to its output directory:
/// `.quarantine/<job id>/`.
pub fn quarantine_dir(job_id: &str) -> String {
    format!("{QUARANTINE_SEGMENT}/{job_id}/")
}

/// Whether `path` lies in a quarantine directory: one of its segments is [`QUARANTINE_SEGMENT`].
pub fn is_quarantined(path: &str) -> bool {
    path.split('/').any(|s| s == QUARANTINE_SEGMENT)
}

/// What becomes of the outputs of a run that did not succeed (a non-zero exit, a trap, a time,
/// memory or instruction limit passed). A successful run's outputs are always uploaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailedOutputs {
    /// Nothing is uploaded (the default).
    #[default]
    Discard,
    /// Uploaded under `<output dir>/.quarantine/<job id>/` ([`quarantine_dir`]), where they can
    /// be looked at but never fire a function.
    Quarantine,
    /// The outputs of a run that exited with a non-zero status are uploaded as a success's (and
    /// may fire downstream functions): the old default, asked for explicitly.
    Upload,
}

impl FailedOutputs {
    /// Whether this is the default ([`FailedOutputs::Discard`]), left off the wire.
    pub fn is_default(&self) -> bool {
        *self == FailedOutputs::Discard
    }

    /// The name in manifests and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            FailedOutputs::Discard => "discard",
            FailedOutputs::Quarantine => "quarantine",
            FailedOutputs::Upload => "upload",
        }
    }

    /// Parses [`FailedOutputs::as_str`].
    pub fn parse(s: &str) -> Option<FailedOutputs> {
        [FailedOutputs::Discard, FailedOutputs::Quarantine, FailedOutputs::Upload].into_iter().find(|p| p.as_str() == s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(json: &str) -> Result<RetryPolicy, String> {
        let p: RetryPolicy = serde_json::from_str(json).map_err(|e| e.to_string())?;
        p.check().map_err(|e| e.to_string())?;
        Ok(p)
    }

    #[test]
    fn a_policy_reads_with_its_defaults_and_is_bounded() {
        let p = policy(r#"{"retries": 2}"#).expect("valid");
        assert_eq!((p.retries, p.on.len(), p.backoff_s), (2, 6, DEFAULT_RETRY_BACKOFF_S));
        let p = policy(r#"{"retries": 2, "on": ["exit_nonzero", "trap"], "backoff_s": 0}"#).expect("valid");
        assert!(p.retries_on(RetryOn::ExitNonzero) && !p.retries_on(RetryOn::TimeExceeded));
        assert_eq!(
            policy(r#"{"retries": 11}"#).expect_err("refused"),
            "retry.retries: must be 0..=10 (a run is never retried without bound)"
        );
        assert!(policy(r#"{"retries": 4294967295}"#).expect_err("refused").starts_with("retry.retries:"));
        assert!(policy(r#"{"retries": 1, "backoff_s": 3601}"#).expect_err("refused").starts_with("retry.backoff_s:"));
        assert!(policy(r#"{"retries": 1, "on": []}"#).expect_err("refused").starts_with("retry.on:"));
        assert!(policy(r#"{"retries": 1, "on": ["trap", "trap"]}"#).expect_err("refused").starts_with("retry.on:"));
        assert!(policy(r#"{"retries": 1, "on": ["segfault"]}"#).expect_err("refused").contains("unknown variant"));
        assert!(policy(r#"{"retries": 1, "forever": true}"#).expect_err("refused").contains("unknown field"));
        assert!(policy(r#"{"retries": -1}"#).is_err());
    }

    #[test]
    fn backoff_doubles_and_is_bounded() {
        let p = RetryPolicy { retries: 10, on: vec![RetryOn::Trap], backoff_s: 10 };
        assert_eq!([p.backoff_ms(1), p.backoff_ms(2), p.backoff_ms(3)], [10_000, 20_000, 40_000]);
        assert_eq!(p.backoff_ms(40), MAX_RETRY_BACKOFF_S * 1000);
        let p = RetryPolicy { backoff_s: u64::MAX, ..p };
        assert_eq!(p.backoff_ms(1), MAX_RETRY_BACKOFF_S * 1000);
    }

    #[test]
    fn kinds_and_failed_output_policies_have_one_name_each() {
        for k in RetryOn::ALL {
            assert_eq!(RetryOn::parse(k.as_str()), Some(k));
            assert_eq!(serde_json::to_string(&k).expect("json"), format!("\"{}\"", k.as_str()));
        }
        for p in [FailedOutputs::Discard, FailedOutputs::Quarantine, FailedOutputs::Upload] {
            assert_eq!(FailedOutputs::parse(p.as_str()), Some(p));
            assert_eq!(serde_json::to_string(&p).expect("json"), format!("\"{}\"", p.as_str()));
        }
        assert_eq!(FailedOutputs::parse("keep"), None);
    }

    #[test]
    fn quarantine_paths_are_recognised_by_their_segment() {
        assert_eq!(quarantine_dir("j1"), ".quarantine/j1/");
        assert!(is_quarantined("/data/out/.quarantine/j1/partial.txt"));
        assert!(is_quarantined("/.quarantine/x"));
        assert!(!is_quarantined("/data/out/.quarantined/x"));
        assert!(!is_quarantined("/data/out/x.quarantine"));
    }
}
