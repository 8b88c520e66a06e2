//! The attach conversation, EP to scheduler over one WebSocket (`GET /v1/ep/attach`, Bearer
//! attach token): the protocol version and close codes, the EP's [`Hello`] and its labels,
//! [`EpMsg`] and [`SchedulerMsg`], the [`JobAssignment`] and the EP's [`JobReport`].
//!
//! Must not know: users and owners (an assignment carries no identity), admin routes, the
//! audit trail.

use super::submit::{FunctionRef, InputSpec, OutputSpec};
use crate::resources::{JobLimits, Resources};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Version of the attach protocol: the `protocol` of an EP's [`Hello`] (the scheduler refuses
/// any other). The scheduler and the EP both name this one.
pub const PROTOCOL: u32 = 1;
/// WebSocket close code: the attach token expired during the session. Final: the EP does not
/// reconnect with the same token.
pub const CLOSE_EXPIRED: u16 = 4401;
/// WebSocket close code: the attach token does not allow this session (revoked, or another
/// annex). Final, as [`CLOSE_EXPIRED`].
pub const CLOSE_FORBIDDEN: u16 = 4403;
/// The close codes that end a session for good: the EP stops instead of reconnecting.
pub const FINAL_CLOSE_CODES: [u16; 2] = [CLOSE_EXPIRED, CLOSE_FORBIDDEN];

/// First message an EP sends after the WebSocket opens. Answer: [`SchedulerMsg::Welcome`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The EP's name, for logs and job records. Self-asserted: the scheduler does not check it
    /// (nothing in the attach token names the EP), so admin settings by name and the `ep` of job
    /// records are the EP's own word; what an EP may run comes from its token alone.
    pub name: String,
    /// Total resources it offers (cpus, memory); `runtime_s` is the longest job it takes.
    pub slots: Resources,
    /// Protocol version; 1.
    pub protocol: u32,
    /// The annex the operator meant to join (`htfaas ep --annex`). Never trusted: the scheduler
    /// refuses the session when it differs from the attach token's annex, so a mistake shows at
    /// once instead of as an EP that never gets work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annex: Option<String>,
    /// Free-form labels of the EP (site, rack, GPU model, ...), shown to admins. At most 32,
    /// keys and values at most 128 bytes. Self-asserted, like `name`: no policy uses them.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
}

/// Most labels in a [`Hello`].
pub const MAX_LABELS: usize = 32;
/// Longest label key or value, bytes.
pub const MAX_LABEL_BYTES: usize = 128;

/// Why labels are refused: more than [`MAX_LABELS`], an empty key, a key or value longer than
/// [`MAX_LABEL_BYTES`], or a control character. The message starts with `labels:` and names the
/// label. The one rule: the EP checks its config with it, the scheduler every Hello.
pub fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), LabelError> {
    if labels.len() > MAX_LABELS {
        return Err(LabelError::TooMany(labels.len()));
    }
    for (k, v) in labels {
        if k.is_empty() {
            return Err(LabelError::EmptyKey);
        }
        if k.len() > MAX_LABEL_BYTES {
            return Err(LabelError::KeyTooLong { shown: k.chars().take(32).collect(), bytes: k.len() });
        }
        if k.chars().any(char::is_control) {
            return Err(LabelError::KeyControl(k.clone()));
        }
        if v.len() > MAX_LABEL_BYTES {
            return Err(LabelError::ValueTooLong { key: k.clone(), bytes: v.len() });
        }
        if v.chars().any(char::is_control) {
            return Err(LabelError::ValueControl(k.clone()));
        }
    }
    Ok(())
}

/// Why [`check_labels`] refused labels; every message starts with `labels:`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    /// More than [`MAX_LABELS`] labels.
    #[error("labels: {0} given, at most {MAX_LABELS}")]
    TooMany(usize),
    /// A key is the empty string.
    #[error("labels: a key is empty")]
    EmptyKey,
    /// A key is longer than [`MAX_LABEL_BYTES`] (`shown`: its first 32 characters).
    #[error("labels: key {shown:?}… is {bytes} bytes, at most {MAX_LABEL_BYTES}")]
    KeyTooLong {
        /// The key's first 32 characters.
        shown: String,
        /// Its length in bytes.
        bytes: usize,
    },
    /// A key holds a control character.
    #[error("labels: key {0:?} holds a control character")]
    KeyControl(String),
    /// A value is longer than [`MAX_LABEL_BYTES`].
    #[error("labels: {key:?}: value is {bytes} bytes, at most {MAX_LABEL_BYTES}")]
    ValueTooLong {
        /// The label's key.
        key: String,
        /// The value's length in bytes.
        bytes: usize,
    },
    /// A value holds a control character.
    #[error("labels: {0:?}: value holds a control character")]
    ValueControl(String),
}

/// The message, for callers whose errors are strings (the scheduler's Hello checks).
impl From<LabelError> for String {
    fn from(e: LabelError) -> String {
        e.to_string()
    }
}

/// Messages from an EP to the scheduler, over the attach WebSocket (one JSON text frame each).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EpMsg {
    /// Opens the session.
    Hello(Hello),
    /// A job ended, whatever the outcome.
    Finished(JobReport),
    /// The EP is draining (e.g. on SIGTERM): it finishes its running jobs and takes no new
    /// ones; the scheduler sends it none from now on.
    Draining,
}

/// Messages from the scheduler to an EP.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
// Messages live for one send; boxing the assignment would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub enum SchedulerMsg {
    /// The attach was accepted.
    Welcome {
        /// Session id the scheduler gave this EP.
        ep_id: String,
    },
    /// Run this job. Answer: [`EpMsg::Finished`] with the same `job_id`.
    Assign(JobAssignment),
    /// Stop this job now (its token was revoked, or an admin removed it). Answer:
    /// [`EpMsg::Finished`] with [`Outcome::Cancelled`]; unknown ids are ignored.
    Cancel {
        /// The job.
        job_id: String,
        /// Why, for the job's record.
        reason: String,
    },
}

/// A job as the EP sees it: no owner, no token, only what it needs to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobAssignment {
    /// Job id.
    pub job_id: String,
    /// What to run.
    pub function: FunctionRef,
    /// Limits to enforce.
    pub resources: Resources,
    /// Input file and its read macaroon.
    pub input: InputSpec,
    /// Output directory and its write macaroon.
    pub output: OutputSpec,
    /// Arguments after the input's guest path.
    pub args: Vec<String>,
    /// The guest's whole environment.
    pub env: Vec<(String, String)>,
    /// Limits the function asks for below the EP's own (its manifest's); absent on the wire
    /// when none is set, and ignored by EPs that predate it.
    #[serde(default, skip_serializing_if = "JobLimits::is_unset")]
    pub limits: JobLimits,
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    /// The module ran to the end and every output was stored. `exit_code` may be non-zero.
    Exited {
        /// The guest's exit status.
        exit_code: i32,
    },
    /// The guest trapped (e.g. `unreachable`, out-of-bounds).
    Trapped {
        /// Trap message.
        message: String,
    },
    /// The guest tried to grow memory past the job's cap.
    MemoryExceeded {
        /// The cap, in bytes.
        limit_bytes: u64,
    },
    /// The job ran past its wall-time cap.
    TimeExceeded {
        /// The cap, in seconds.
        limit_s: u64,
    },
    /// The input could not be fetched.
    InputFailed {
        /// Why.
        reason: String,
    },
    /// An output could not be stored.
    OutputFailed {
        /// Why.
        reason: String,
    },
    /// The module could not be fetched, verified or instantiated.
    ModuleFailed {
        /// Why.
        reason: String,
    },
    /// The scheduler stopped it ([`SchedulerMsg::Cancel`]).
    Cancelled {
        /// The reason the scheduler gave.
        reason: String,
    },
    /// The guest used up its instruction budget (fuel).
    FuelExhausted {
        /// The budget, in fuel units (about one per wasm instruction).
        limit: u64,
    },
    /// The guest wrote more output (bytes or files) than the EP allows; nothing was stored.
    OutputExceeded {
        /// Which limit, and by how much.
        reason: String,
    },
    /// A transfer (the module, the input or an output) failed transiently on every one of the
    /// EP's tries (connection refused or reset, a timeout, HTTP 5xx or 429): the storage (or the
    /// module's server) was unavailable, not the job at fault. The scheduler treats the attempt
    /// like a lost one: the job runs again after the retry backoff, and past the retry limit is
    /// held with [`HOLD_CODE_STORAGE`]. A refusal (any other 4xx) is the final
    /// [`Outcome::InputFailed`], [`Outcome::OutputFailed`] or [`Outcome::ModuleFailed`] instead.
    StorageUnavailable {
        /// The last failure: method, URL without its query, status or error, and the tries.
        reason: String,
    },
}

impl Outcome {
    /// Whether the job completed (ran to the end with exit 0 and stored its outputs).
    pub fn is_success(&self) -> bool {
        matches!(self, Outcome::Exited { exit_code: 0 })
    }

    /// Whether the attempt failed for a reason outside the job that may pass by itself (the
    /// storage was unavailable): the job is to run again rather than fail.
    pub fn is_transient(&self) -> bool {
        matches!(self, Outcome::StorageUnavailable { .. })
    }

    /// One line for job records: empty on success.
    pub fn reason(&self) -> String {
        match self {
            Outcome::Exited { exit_code: 0 } => String::new(),
            Outcome::Exited { exit_code } => format!("exited with status {exit_code}"),
            Outcome::Trapped { message } => format!("trapped: {message}"),
            Outcome::MemoryExceeded { limit_bytes } => format!("memory limit of {limit_bytes} bytes exceeded"),
            Outcome::TimeExceeded { limit_s } => format!("wall-time limit of {limit_s} s exceeded"),
            Outcome::InputFailed { reason } => format!("input failed: {reason}"),
            Outcome::OutputFailed { reason } => format!("output failed: {reason}"),
            Outcome::ModuleFailed { reason } => format!("module failed: {reason}"),
            Outcome::Cancelled { reason } => format!("cancelled: {reason}"),
            Outcome::FuelExhausted { limit } => format!("instruction budget of {limit} exceeded"),
            Outcome::OutputExceeded { reason } => format!("output limit exceeded: {reason}"),
            Outcome::StorageUnavailable { reason } => format!("storage unavailable: {reason}"),
        }
    }
}

/// What one run used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Wall time of the whole job on the EP (fetch, run, store), ms.
    pub wall_ms: u64,
    /// CPU time of the guest, ms.
    pub cpu_ms: u64,
    /// Largest linear memory the guest had, bytes.
    pub peak_memory_bytes: u64,
    /// Input bytes downloaded.
    pub bytes_in: u64,
    /// Output bytes uploaded.
    pub bytes_out: u64,
    /// Fuel the guest consumed (about one unit per wasm instruction), when the EP meters it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<u64>,
}

/// One stored output file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputFile {
    /// Storage path.
    pub path: String,
    /// Bytes.
    pub size: u64,
    /// sha256, hex.
    pub sha256: String,
}

/// An EP's account of one job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobReport {
    /// Job id from the assignment.
    pub job_id: String,
    /// How it ended.
    pub outcome: Outcome,
    /// What it used.
    pub usage: Usage,
    /// Outputs stored.
    pub outputs: Vec<OutputFile>,
    /// The guest's stdout then stderr, bounded by the EP.
    pub log: String,
}
