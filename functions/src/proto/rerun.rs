//! "Re-derive this file": `POST /v1/audit/rerun` on the gateway runs the function
//! version that wrote a file again, on the same input (the bytes its run recorded: the EP refuses
//! other bytes, [`super::InputSpec::sha256`]), into a scratch directory of the function's output
//! directory ([`RERUN_SEGMENT`]); [`verdict`] then says whether the output came out identical.
//!
//! Must not know: how the gateway finds the run that wrote the file, how a job is submitted or
//! waited for.

use super::{JobRecord, JobState, Outcome};
use crate::digest::Digest;
use serde::{Deserialize, Serialize};

/// The path segment of re-runs' scratch directories: `<output dir>.rerun/<rerun id>/`. The
/// gateway fires nothing on a path with this segment, whoever published the event.
pub const RERUN_SEGMENT: &str = ".rerun";

/// What the EP's [`Outcome::InputFailed`] reason starts with when the input's bytes are not
/// those the job expects ([`super::InputSpec::sha256`]).
pub const INPUT_CHANGED: &str = "input changed";

/// The scratch directory of re-run `id` of a function writing to `output_dir` (ending in `/`).
pub fn scratch_dir(output_dir: &str, id: &str) -> String {
    format!("{output_dir}{RERUN_SEGMENT}/{id}/")
}

/// Whether `path` lies in a re-run's scratch directory (one of its segments is
/// [`RERUN_SEGMENT`]).
pub fn in_scratch(path: &str) -> bool {
    path.split('/').any(|s| s == RERUN_SEGMENT)
}

/// `POST /v1/audit/rerun` (a developer: its own files; an admin: any). Response: [`Rerun`]
/// (201), or an [`super::ApiError`]: 404 when no completed job of the caller's wrote the file,
/// 409 when it cannot be re-run (its run recorded no input checksum, its function version is
/// gone).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RerunRequest {
    /// The file to re-derive: an output of a completed job.
    pub file: String,
}

/// A re-run, as submitted: what it re-derives and where its output will be.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rerun {
    /// The file re-derived.
    pub file: String,
    /// Its sha256 as the run that wrote it recorded it.
    pub sha256: String,
    /// The job that wrote it.
    pub job: String,
    /// That job's function, version and module digest: what runs again.
    pub function: String,
    /// The function's version.
    pub version: u32,
    /// The module digest.
    pub digest: Digest,
    /// The job's input.
    pub input: String,
    /// The input's sha256 as the job read it: the re-run reads these bytes or does not run.
    pub input_sha256: String,
    /// The scratch directory the re-run writes to.
    pub scratch: String,
    /// Where the re-derived file will be: the file's name in `scratch`.
    pub expected: String,
    /// The re-run's job.
    pub rerun_job: String,
}

/// What a re-run showed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "verdict")]
pub enum RerunVerdict {
    /// Not ended yet.
    Pending {
        /// The re-run's state.
        state: JobState,
    },
    /// The re-derived file has the recorded sha256.
    Identical,
    /// It does not: the function is not reproducible on this input.
    Differs {
        /// The re-derived file's sha256.
        sha256: String,
    },
    /// The re-run completed without writing the file.
    Missing,
    /// The input's bytes are no longer those the job read: nothing ran.
    InputChanged {
        /// The EP's account.
        reason: String,
    },
    /// The re-run failed otherwise.
    Failed {
        /// How it ended.
        state: JobState,
        /// Why.
        reason: String,
    },
}

impl RerunVerdict {
    /// Whether the check passed (the only verdict a script may take for "reproducible").
    pub fn is_identical(&self) -> bool {
        matches!(self, RerunVerdict::Identical)
    }
}

/// The verdict on `rerun` from its job's record, `job`.
pub fn verdict(rerun: &Rerun, job: &JobRecord) -> RerunVerdict {
    match job.state {
        JobState::Idle | JobState::Running | JobState::Held => RerunVerdict::Pending { state: job.state },
        JobState::Completed => match job.outputs.iter().find(|o| o.path == rerun.expected) {
            Some(o) if o.sha256.eq_ignore_ascii_case(&rerun.sha256) => RerunVerdict::Identical,
            Some(o) => RerunVerdict::Differs { sha256: o.sha256.clone() },
            None => RerunVerdict::Missing,
        },
        state => {
            let changed = job.reason.contains(INPUT_CHANGED) && job.outputs.is_empty();
            if changed {
                RerunVerdict::InputChanged { reason: job.reason.clone() }
            } else {
                RerunVerdict::Failed { state, reason: job.reason.clone() }
            }
        }
    }
}

/// The EP's account of a reference file whose bytes are not those expected.
pub fn reference_changed(path: &str, got: &str, expected: &str) -> Outcome {
    Outcome::InputFailed {
        reason: format!("{INPUT_CHANGED}: reference /{path}'s sha256 is {got}, the run re-derived read {expected}"),
    }
}

/// The EP's account of an input whose bytes are not those expected.
pub fn input_changed(got: &str, expected: &str) -> Outcome {
    Outcome::InputFailed { reason: format!("{INPUT_CHANGED}: its sha256 is {got}, the run re-derived read {expected}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_directories_are_recognised_by_their_segment_only() {
        let dir = scratch_dir("/data/out/", "j1.ab");
        assert_eq!(dir, "/data/out/.rerun/j1.ab/");
        assert!(in_scratch(&format!("{dir}x.json")));
        assert!(!in_scratch("/data/out/.reruns/x"));
        assert!(!in_scratch("/data/out/x.rerun"));
    }
}
