//! Jobs as the scheduler's API shows them: their [`JobState`] and [`JobRecord`], admin
//! actions on them, hold codes, attempts, logs and the analysis of why a job does not run.
//!
//! Must not know: the attach link's messages beyond a job's outcome, the audit trail.

use super::attach::{OutputFile, Usage};
use super::events::EventRef;
use crate::digest::Digest;
use crate::resources::Resources;
use serde::{Deserialize, Serialize};

/// States of a job in the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Queued, waiting for an EP.
    Idle,
    /// Assigned to an EP.
    Running,
    /// Ran to the end with exit 0 and stored its outputs.
    Completed,
    /// Ended otherwise; `reason` says how.
    Failed,
    /// Taken out of the queue or stopped by the scheduler (revocation, admin); `reason` says why.
    Removed,
    /// Kept, but not run until released (`htfaas jobs release`); `reason` and
    /// [`JobRecord::hold_code`] say why. A held job that was running was stopped.
    Held,
}

impl JobState {
    /// The lower-case name used in the database and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Idle => "idle",
            JobState::Running => "running",
            JobState::Completed => "completed",
            JobState::Failed => "failed",
            JobState::Removed => "removed",
            JobState::Held => "held",
        }
    }

    /// Whether a job in this state has ended for good: completed, failed or removed.
    pub fn is_final(self) -> bool {
        matches!(self, JobState::Completed | JobState::Failed | JobState::Removed)
    }

    /// Parses [`JobState::as_str`].
    pub fn parse(s: &str) -> Option<JobState> {
        Some(match s {
            "idle" => JobState::Idle,
            "running" => JobState::Running,
            "completed" => JobState::Completed,
            "failed" => JobState::Failed,
            "removed" => JobState::Removed,
            "held" => JobState::Held,
            _ => return None,
        })
    }
}

/// A job as the scheduler reports it: `GET /v1/jobs` (a `Vec`) and `GET /v1/jobs/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    /// Job id.
    pub id: String,
    /// Who is accounted (the submit token's subject).
    pub owner: String,
    /// Function name.
    pub function: String,
    /// Function version.
    pub version: u32,
    /// Its code's digest: the wasm module's, or a native function's image's, exactly as it
    /// was fired.
    pub digest: Digest,
    /// A native function's command (then `digest` names its image); absent for wasm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native: Option<super::NativeCode>,
    /// Current state.
    pub state: JobState,
    /// Why it failed; empty otherwise.
    pub reason: String,
    /// The input's storage URL; empty for a job without an input (a run on no file).
    pub input: String,
    /// The event that fired it.
    pub event: EventRef,
    /// `jti` of the submit token that created it.
    pub token_jti: String,
    /// Issuer of that token.
    #[serde(default)]
    pub token_issuer: String,
    /// Why it is held, as HTCondor's `HoldReasonCode` (1: by an admin); set only while held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_code: Option<u32>,
    /// Accounting group from the token, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The annex it must run on, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annex: Option<String>,
    /// Its job class (which bounds its run time), once the scheduler resolved it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// Run attempts started so far (`GET /v1/jobs/{id}/history` lists them).
    #[serde(default)]
    pub attempts: u32,
    /// Resources requested.
    pub resources: Resources,
    /// EP that ran it, once assigned.
    pub ep: Option<String>,
    /// Unix ms.
    pub submitted_at_ms: u64,
    /// Unix ms.
    pub started_at_ms: Option<u64>,
    /// Unix ms.
    pub finished_at_ms: Option<u64>,
    /// Guest exit status, when it exited.
    pub exit_code: Option<i32>,
    /// Usage, once finished.
    pub usage: Option<Usage>,
    /// Outputs stored, once finished.
    pub outputs: Vec<OutputFile>,
}

/// `POST /v1/jobs/{id}/hold`, `/release` and `/remove` (admin): why, recorded with the job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobAction {
    /// Why; for a hold it becomes the job's hold reason.
    pub reason: String,
}

/// HTCondor's `HoldReasonCode` for a hold put by a person (`condor_hold`).
pub const HOLD_CODE_BY_ADMIN: u32 = 1;
/// Hold code: the job lost its EP more often than the retry limit allows (HTCondor's
/// `JobLeaseDuration` expiring too often).
pub const HOLD_CODE_RETRIES: u32 = 2;
/// Hold code: the job violates one of the site's hold requirements (e.g. "Unauthorized GPU
/// request"); the reason is the requirement's message (HTCondor's `SYSTEM_PERIODIC_HOLD`).
pub const HOLD_CODE_POLICY: u32 = 3;
/// Hold code: the storage was unavailable
/// ([`Outcome::StorageUnavailable`](super::Outcome::StorageUnavailable)) on more attempts
/// than the retry limit allows; the reason names the last transfer that failed. HTCondor's
/// `TransferInputError` (13), used here for the module, the input and the outputs alike.
pub const HOLD_CODE_STORAGE: u32 = 13;

/// One run attempt of a job: `GET /v1/jobs/{id}/history` returns them, first first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// 1 for the first attempt.
    pub n: u32,
    /// The EP it ran on.
    pub ep: String,
    /// Unix ms.
    pub started_at_ms: u64,
    /// Unix ms; none while it runs.
    pub ended_at_ms: Option<u64>,
    /// `running`, `completed`, `failed` (the guest failed: the job's last attempt, or one its
    /// function's retry policy ran again), `stopped` (held, removed or revoked while running),
    /// `lost` (its EP went away or fell silent past its lease), `storage-unavailable` (the EP
    /// reported [`Outcome::StorageUnavailable`](super::Outcome::StorageUnavailable): counted like
    /// `lost`), `returned` (the EP turned it away unrun, e.g. while draining: counted like `lost`,
    /// with its backoff), `refused` (the EP's report broke the protocol, e.g. named outputs outside
    /// the job's output directory: not believed, nothing charged, counted like `lost`),
    /// `not-started` (a prefetched job its EP handed back without starting it,
    /// [`super::attach::EpMsg::NotStarted`]: idle again at once, not counted), `checkpointed` (the
    /// guest asked to be resumed and stored a new checkpoint: the job runs again from it, no retry
    /// used) or `interrupted` (the scheduler restarted).
    pub outcome: String,
    /// Why it ended so, when it did not complete.
    pub reason: String,
    /// What it used, when the EP reported.
    pub usage: Option<Usage>,
}

/// `GET /v1/jobs/{id}/log` (admin): the guest's stdout then stderr as the EP captured them
/// (bounded by the EP and again by the scheduler), empty until the job has been reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobLog {
    /// The job.
    pub job_id: String,
    /// The log text.
    pub log: String,
}

/// `GET /v1/jobs/{id}/analyze` (admin): why a job is, or is not, running (`condor_q -analyze`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobAnalysis {
    /// The job.
    pub job_id: String,
    /// Its state.
    pub state: JobState,
    /// One line: what stops it, or that it would run.
    pub summary: String,
    /// Every reason found at the job's level (held, owner at its running limit, group over
    /// quota, retry backoff, ...).
    pub reasons: Vec<String>,
    /// For an idle job, each attached EP's verdict.
    pub eps: Vec<EpVerdict>,
}

/// Whether one EP would take a job, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpVerdict {
    /// The EP's name.
    pub ep: String,
    /// None when it would take the job now; otherwise why not.
    pub refusal: Option<String>,
}
