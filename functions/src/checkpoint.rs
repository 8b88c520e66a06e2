//! Checkpoints: what a function's manifest asks for ([`CheckpointPolicy`]: the exit code by
//! which its guest asks to be resumed, and the bound on what it keeps) and what travels with a
//! job ([`CheckpointSpec`]: its own checkpoint area in the storage) and comes back in its
//! report ([`CheckpointReport`]).
//!
//! A guest keeps its state in `/checkpoint` (wasm and native alike). When it exits with its
//! manifest's `exit_code`, or is stopped before its end (its EP leaving, a hold, its run time
//! reached), the EP packs `/checkpoint` into one tar file ([`CHECKPOINT_FILE`]) and stores it
//! in the job's own area with the job's checkpoint macaroon (read, write and replace in exactly
//! that directory: no other job's area); the next attempt, on any EP, starts with it unpacked
//! into `/checkpoint`. When the job ends for good, the EP deletes it. A checkpoint over
//! `max_bytes` is not stored.
//!
//! Must not know: HTTP, the storage's dialect, the EP's sandbox, the scheduler's store.

use serde::{Deserialize, Serialize};

/// The one file of a job's checkpoint area: `/checkpoint` as a tar archive.
pub const CHECKPOINT_FILE: &str = "checkpoint.tar";
/// Default bound of a function's checkpoint, MiB.
pub const DEFAULT_CHECKPOINT_MB: u64 = 1024;
/// Largest bound a manifest may ask for, MiB (64 GiB).
pub const MAX_CHECKPOINT_MB: u64 = 64 * 1024;
/// Most times a job is resumed from a checkpoint its guest asked for (the exit code); past it,
/// the checkpoint exit is a failure like any other non-zero exit.
pub const MAX_RESUMES: u32 = 1000;

/// A function's checkpoints, from its manifest (`checkpoint`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointPolicy {
    /// The exit code by which the guest asks to be run again from its checkpoint (HTCondor's
    /// `checkpoint_exit_code`), 1..=255; none: a checkpoint is only kept when the run is
    /// stopped before its end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Largest checkpoint kept, MiB (the tar of `/checkpoint`): 1..=[`MAX_CHECKPOINT_MB`].
    #[serde(default = "default_max_mb")]
    pub max_mb: u64,
}

fn default_max_mb() -> u64 {
    DEFAULT_CHECKPOINT_MB
}

impl Default for CheckpointPolicy {
    fn default() -> Self {
        CheckpointPolicy { exit_code: None, max_mb: DEFAULT_CHECKPOINT_MB }
    }
}

impl CheckpointPolicy {
    /// Why the policy is refused: `(field, reason)`.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if let Some(code) = self.exit_code
            && !(1..=255).contains(&code)
        {
            return Err(("checkpoint.exit_code", "must be 1..=255 (0 is success)".into()));
        }
        if self.max_mb == 0 || self.max_mb > MAX_CHECKPOINT_MB {
            return Err(("checkpoint.max_mb", format!("must be 1..={MAX_CHECKPOINT_MB}")));
        }
        Ok(())
    }

    /// The bound, bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_mb.saturating_mul(1024 * 1024)
    }
}

/// A job's checkpoint area, as it travels with the job (submitted by the gateway, assigned by
/// the scheduler, the same for every attempt).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointSpec {
    /// Full storage URL of the job's own checkpoint directory, ending in `/`; the checkpoint is
    /// [`CHECKPOINT_FILE`] in it.
    pub url: String,
    /// Macaroon for exactly that directory: download, upload and replace (bearer; never logged).
    pub macaroon: String,
    /// Largest checkpoint stored, bytes.
    pub max_bytes: u64,
    /// The exit code by which the guest asks to be resumed; none: only a stop keeps one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

impl CheckpointSpec {
    /// The URL of the checkpoint file.
    pub fn file_url(&self) -> String {
        format!("{}{CHECKPOINT_FILE}", self.url)
    }
}

/// What one attempt did with its checkpoint, in its report: recorded with the attempt, so the
/// lineage names what each attempt started from and left.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointReport {
    /// The sha256 (hex) of the checkpoint it started from; none: it started afresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<String>,
    /// The checkpoint it stored: sha256 (hex) and bytes; none: it stored none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved: Option<SavedCheckpoint>,
    /// Why a checkpoint was not stored (over its bound, the storage refused), if it was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_saved: Option<String>,
}

impl CheckpointReport {
    /// Whether the attempt moved on: it stored a checkpoint other than the one it started from.
    pub fn progressed(&self) -> bool {
        self.saved.as_ref().is_some_and(|s| self.restored.as_deref() != Some(s.sha256.as_str()))
    }
}

/// A stored checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedCheckpoint {
    /// sha256 of the tar file, hex.
    pub sha256: String,
    /// Its size, bytes.
    pub bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_needs_a_failure_code_and_a_bound() {
        assert_eq!(CheckpointPolicy::default().check(), Ok(()));
        let p = |exit_code, max_mb| CheckpointPolicy { exit_code, max_mb };
        assert_eq!(p(Some(85), 10).check(), Ok(()));
        assert_eq!(p(Some(0), 10).check().map_err(|e| e.0), Err("checkpoint.exit_code"));
        assert_eq!(p(Some(256), 10).check().map_err(|e| e.0), Err("checkpoint.exit_code"));
        assert_eq!(p(None, 0).check().map_err(|e| e.0), Err("checkpoint.max_mb"));
        assert_eq!(p(None, MAX_CHECKPOINT_MB + 1).check().map_err(|e| e.0), Err("checkpoint.max_mb"));
        assert_eq!(p(None, 2).max_bytes(), 2 * 1024 * 1024);
        let read: CheckpointPolicy = serde_json::from_str(r#"{"exit_code":85}"#).expect("parses");
        assert_eq!(read, p(Some(85), DEFAULT_CHECKPOINT_MB));
        assert!(serde_json::from_str::<CheckpointPolicy>(r#"{"exit":85}"#).is_err(), "unknown fields refused");
    }

    #[test]
    fn progress_is_a_stored_checkpoint_other_than_the_one_started_from() {
        let saved = |s: &str| Some(SavedCheckpoint { sha256: s.into(), bytes: 1 });
        let r = |restored: Option<&str>, saved| CheckpointReport {
            restored: restored.map(Into::into),
            saved,
            not_saved: None,
        };
        assert!(r(None, saved("a")).progressed(), "the first checkpoint");
        assert!(r(Some("a"), saved("b")).progressed());
        assert!(!r(Some("a"), saved("a")).progressed(), "the same state again");
        assert!(!r(Some("a"), None).progressed(), "nothing stored");
        assert!(!r(None, None).progressed());
    }
}
