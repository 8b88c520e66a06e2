// Long because it holds every wire type in one place (split by conversation: events, submit, attach, API); kept whole until issue 19 splits it along its layers.
//! Wire types: what gateway, scheduler and execution points (EPs) say to each other.
//!
//! Every message names its response (garage's habit): a request type documents the endpoint
//! it is sent to and the type that comes back. All are JSON.
//!
//! ```text
//! storage  --TransferMessage (NATS JetStream, EVENTS_SUBJECT)-->  gateway
//! gateway  --SubmitRequest (POST /v1/jobs, Bearer submit token)-->  scheduler  -> SubmitResponse
//! ep       --WebSocket GET /v1/ep/attach (Bearer attach token)-->  scheduler
//!          <-- SchedulerMsg::{Welcome, Assign(JobAssignment)}       EpMsg::{Hello, Finished(JobReport)} -->
//! ```
//!
//! Invariant: a [`JobAssignment`] carries no user identity. The owner stays in the scheduler.

use crate::{Digest, Resources};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// NATS subject on which dCache billing messages (and ours) arrive.
pub const EVENTS_SUBJECT: &str = "storage.dcache.billing";
/// Subjects CloudEvents arrive on: `storage.cloudevents.<producer>`. The bridges publish on
/// `storage.cloudevents.xrootd-notify` and `storage.cloudevents.dcache-sse`.
pub const CLOUDEVENTS_SUBJECT_PREFIX: &str = "storage.cloudevents";
/// Every subject the gateway reads events from: dCache billing messages and CloudEvents
/// (`storage.cloudevents.<producer>`). The events stream covers them all.
pub const EVENTS_SUBJECTS: [&str; 2] = [EVENTS_SUBJECT, "storage.cloudevents.>"];
/// JetStream stream that stores [`EVENTS_SUBJECTS`]. File storage, limits retention, 7 days. The
/// gateway makes it (or widens an older one), and so does the built-in storage, with the same
/// subjects, so either may start first.
/// Named for its first source; kept so that deployed streams (and their unread events) stay:
/// the gateway adds the subjects a stream made before lacks at start.
pub const EVENTS_STREAM: &str = "DCACHE_BILLING";
/// How long the stream keeps events.
pub const EVENTS_MAX_AGE_S: u64 = 7 * 24 * 3600;

/// Compiles a trigger glob: absolute, `*` within a segment, `**` across segments.
pub fn compile_glob(glob: &str) -> Result<globset::GlobMatcher, String> {
    if !glob.starts_with('/') {
        return Err(format!("{glob:?} must be absolute (start with '/')"));
    }
    globset::GlobBuilder::new(glob)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| format!("{glob:?}: {e}"))
}

/// A dCache billing message, as dCache's `MoverInfoMessageSerializer` writes it for
/// `msgType: "transfer"` (see `shared/reference/dcache.md` §1.2).
///
/// Keys are optional because dCache omits null values; unknown keys are ignored. `isWrite` is
/// the string `"write"` or `"read"`, not a boolean.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TransferMessage {
    /// `"1.0"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `"transfer"` for this shape; other types are ignored by the gateway today.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub msg_type: Option<String>,
    /// ISO-8601 with offset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub date: Option<String>,
    /// Milliseconds queued.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queuing_time: Option<i64>,
    /// The pool's cell name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cell_name: Option<String>,
    /// `"pool"` for movers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cell_type: Option<String>,
    /// The pool's domain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cell_domain: Option<String>,
    /// Outcome; code 0 is success.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<TransferStatus>,
    /// Pool transaction id; with `pnfsid`, the event's identity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Principals of the client, e.g. `UserNamePrincipal[alice]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<Vec<String>>,
    /// File id, 36 upper-case hex digits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pnfsid: Option<String>,
    /// Path recorded at creation (may be stale after a rename).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub billing_path: Option<String>,
    /// Path used for this transfer: what triggers match.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transfer_path: Option<String>,
    /// File size in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_size: Option<u64>,
    /// `<storageClass>@<hsm>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage_info: Option<String>,
    /// Bytes moved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transfer_size: Option<u64>,
    /// Milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transfer_time: Option<i64>,
    /// `"write"` or `"read"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_write: Option<String>,
    /// Client side of the transfer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol_info: Option<serde_json::Value>,
    /// The door's transaction id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initiator: Option<String>,
    /// Pool-to-pool copy; never fires.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_p2p: Option<bool>,
    /// Bytes per second, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_write_bandwidth: Option<f64>,
}

/// `status` of a billing message.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferStatus {
    /// 0 means success.
    pub code: i64,
    /// Empty on success.
    #[serde(default)]
    pub msg: String,
}

/// Identifies the triggering event in job records, for audit and for the dedupe key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRef {
    /// Who produced the event: `<source kind>:<producer>`, e.g.
    /// `dcache-billing:pool-a-1@pool-aDomain`, `xrootd-notify:xrootd://host:1094`,
    /// `cloudevents://lab.example/daq` (see `event::EventSource`). A job submitted by a token
    /// bearer names its own source.
    pub source: String,
    /// The occurrence's identity (`event::StorageEvent::id`), e.g.
    /// `dcache-billing:write:<pnfsid>/<door session>`.
    pub id: String,
    /// The storage path that fired.
    pub path: String,
    /// When the file was written by an earlier job (the loop guard's provenance): which.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caused_by: Option<Cause>,
}

impl EventRef {
    /// An event that no earlier job caused.
    pub fn new(source: impl Into<String>, id: impl Into<String>, path: impl Into<String>) -> EventRef {
        EventRef { source: source.into(), id: id.into(), path: path.into(), caused_by: None }
    }
}

/// The job whose output is the file an event is about: the event's storage principal was the
/// write macaroon the gateway obtained for that job. It links a chain of functions (`A` writes
/// what fires `B`) for audit, and keeps the chain from looping.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cause {
    /// The function whose job wrote the file.
    pub function: String,
    /// Its module digest.
    pub digest: Digest,
    /// The event that job ran on (`EventRef::id`).
    pub event_id: String,
    /// Every function up the chain, the first cause first and `function` last. None of them
    /// fires on the event again (no loop, however long); any other function may.
    pub chain: Vec<String>,
}

/// The function a job runs. The EP fetches `module_url` and refuses bytes whose digest differs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionRef {
    /// Registered name.
    pub name: String,
    /// Registered version.
    pub version: u32,
    /// Content digest of the module; bound into the submit token.
    pub digest: Digest,
    /// Where the module bytes can be fetched (the registry's `GET /v1/modules/{digest}`).
    pub module_url: String,
}

/// The job's one input file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputSpec {
    /// Full storage URL of the file.
    pub url: String,
    /// File name as the guest sees it: `/input/<name>`. One path segment.
    pub name: String,
    /// Read macaroon for exactly this file (bearer; never logged).
    pub macaroon: String,
}

/// Where the job's outputs go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputSpec {
    /// Full storage URL of the output directory, ending in `/`.
    pub url: String,
    /// Write macaroon for exactly this directory (bearer; never logged).
    pub macaroon: String,
}

/// `POST /v1/jobs` on the scheduler, with `Authorization: Bearer <submit token>`.
/// Response: [`SubmitResponse`] (201 new, 200 when `dedupe_key` already had a job), or an
/// [`ApiError`] with 401 (token), 403 (limits) or 400 (request).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// What to run.
    pub function: FunctionRef,
    /// What it needs; must fit within the token's limits.
    pub resources: Resources,
    /// Its input.
    pub input: InputSpec,
    /// Its outputs.
    pub output: OutputSpec,
    /// Arguments after the input's guest path.
    #[serde(default)]
    pub args: Vec<String>,
    /// The guest's whole environment.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// What fired it.
    pub event: EventRef,
    /// One job per key: a resubmission with the same key returns the first job.
    pub dedupe_key: String,
    /// When set, the job runs only on an EP whose attach token names this annex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annex: Option<String>,
    /// When true, the scheduler adds `ip:<the EP's address as the scheduler sees it>` to both
    /// macaroons at dispatch, so they work only from the EP that runs the job. Only for
    /// storages that understand dCache's `ip:` caveat (dCache, the built-in storage; XRootD
    /// refuses any caveat it does not know), and only where EPs reach the storage from the
    /// address they reach the scheduler from (no NAT or proxy that differs between the two).
    /// Default: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bind_ep_address: bool,
    /// The job class (the function's manifest's); none takes the scheduler's default class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// The function's per-run ceilings ([`JobLimits`]), handed to the EP with the job.
    #[serde(default, skip_serializing_if = "JobLimits::is_unset")]
    pub limits: JobLimits,
}

/// Answer to [`SubmitRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitResponse {
    /// The job's id.
    pub job_id: String,
    /// False when the dedupe key already named a job.
    pub created: bool,
}

/// Error body of every htfaas HTTP API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// Human-readable reason, naming the check that failed.
    pub error: String,
}

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
pub fn check_labels(labels: &std::collections::BTreeMap<String, String>) -> Result<(), String> {
    if labels.len() > MAX_LABELS {
        return Err(format!("labels: {} given, at most {MAX_LABELS}", labels.len()));
    }
    for (k, v) in labels {
        let shown: String = k.chars().take(32).collect();
        if k.is_empty() {
            return Err("labels: a key is empty".into());
        }
        if k.len() > MAX_LABEL_BYTES {
            return Err(format!("labels: key {shown:?}… is {} bytes, at most {MAX_LABEL_BYTES}", k.len()));
        }
        if k.chars().any(char::is_control) {
            return Err(format!("labels: key {k:?} holds a control character"));
        }
        if v.len() > MAX_LABEL_BYTES {
            return Err(format!("labels: {k:?}: value is {} bytes, at most {MAX_LABEL_BYTES}", v.len()));
        }
        if v.chars().any(char::is_control) {
            return Err(format!("labels: {k:?}: value holds a control character"));
        }
    }
    Ok(())
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

/// Per-job ceilings a function may ask for, each narrowing the EP's own setting of the same
/// name: the EP enforces the lower of the two, so nothing here can widen what an EP allows.
/// Every field is optional (absent: the EP's setting alone).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobLimits {
    /// Most output bytes stored (the EP's `max_output_bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    /// Most output files and directories (the EP's `max_output_files`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_files: Option<u64>,
    /// Instruction budget (the EP's `fuel`); applies only on an EP that meters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<u64>,
}

impl JobLimits {
    /// Whether no limit is set (the wire then carries no `limits`).
    pub fn is_unset(&self) -> bool {
        *self == JobLimits::default()
    }
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
    /// Module digest.
    pub digest: Digest,
    /// Current state.
    pub state: JobState,
    /// Why it failed; empty otherwise.
    pub reason: String,
    /// The input's storage URL.
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
/// Hold code: the storage was unavailable ([`Outcome::StorageUnavailable`]) on more attempts
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
    /// `running`, `completed`, `failed`, `stopped` (held, removed or revoked while running),
    /// `lost` (its EP went away or fell silent past its lease), `storage-unavailable` (the EP
    /// reported [`Outcome::StorageUnavailable`]: counted like `lost`), `returned` (the EP turned
    /// it away unrun, e.g. while draining: counted like `lost`, with its backoff), `refused` (the
    /// EP's report broke the protocol, e.g. named outputs outside the job's output directory:
    /// not believed, nothing charged, counted like `lost`) or `interrupted` (the scheduler
    /// restarted).
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

/// What an admin has set on an EP, by name (it outlives sessions and restarts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EpAdminState {
    /// Takes jobs.
    #[default]
    Enabled,
    /// Running jobs finish; a new job starts only if its run time ends before the deadline
    /// (none without a deadline).
    Draining,
    /// Takes no new job; running jobs go on.
    Disabled,
}

/// `POST /v1/eps/{name}/{drain|disable|enable|pause|resume}` (admin).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpAction {
    /// Why; recorded.
    pub reason: String,
    /// For drain: seconds from now until the deadline; none: start nothing new at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_s: Option<u64>,
    /// For pause and resume: the accounting group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// An EP as an admin sees it: `GET /v1/eps` returns every attached one and every name with an
/// admin setting; the answer to each EP action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpInfo {
    /// The EP's name, as its Hello gave it (self-asserted; `owner` and `annex` come from its
    /// attach token).
    pub name: String,
    /// Its session id, when attached.
    pub session: Option<String>,
    /// The address it attached from, when attached.
    pub address: Option<String>,
    /// Its attach token's annex.
    pub annex: Option<String>,
    /// Its attach token's owner restriction.
    pub owner: Option<String>,
    /// What it offered (zero when not attached).
    pub total: Resources,
    /// What is not reserved by running jobs.
    pub free: Resources,
    /// Jobs running there.
    pub running: Vec<String>,
    /// Admin state.
    pub state: EpAdminState,
    /// Drain deadline, Unix ms.
    pub drain_deadline_ms: Option<u64>,
    /// Accounting groups paused there.
    pub paused_groups: Vec<String>,
    /// Why the admin state was last changed.
    pub reason: String,
    /// The labels the EP gave in its Hello (self-asserted).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
}

/// `POST /v1/accounting/{owner}/factor` (admin): `condor_userprio -setfactor`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FactorRequest {
    /// The owner's new priority factor (≥ 1; higher gets less).
    pub factor: f64,
}

/// `GET /v1/priorities` (admin): what `condor_userprio` shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PriorityReport {
    /// Half-life of the decayed usage, seconds.
    pub half_life_s: u64,
    /// Owners, best (lowest) effective priority first.
    pub owners: Vec<OwnerPriority>,
    /// Accounting groups, by name.
    pub groups: Vec<GroupPriority>,
}

/// One owner's fair-share standing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OwnerPriority {
    /// The owner.
    pub owner: String,
    /// Real priority × factor; lower gets slots first.
    pub effective_priority: f64,
    /// 0.5 + decayed usage expressed in cores (usage × ln 2 / half-life): an owner who keeps
    /// `c` cores busy tends to 0.5 + `c`.
    pub real_priority: f64,
    /// Priority factor.
    pub factor: f64,
    /// Cores reserved by running jobs now.
    pub cores_in_use: u64,
    /// Decayed usage, core-hours.
    pub decayed_core_hours: f64,
    /// All usage ever charged, core-hours.
    pub accumulated_core_hours: f64,
}

/// One accounting group's quota and usage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupPriority {
    /// The group.
    pub group: String,
    /// Its quota in cores now (a share is turned into cores of the attached pool); none when
    /// the group has no configured quota.
    pub quota_cores: Option<f64>,
    /// Most cores it may use when the pool is otherwise idle (quota × oversubscription).
    pub cap_cores: Option<f64>,
    /// Cores reserved by its running jobs now.
    pub cores_in_use: u64,
    /// Decayed usage, core-hours.
    pub decayed_core_hours: f64,
    /// All usage ever charged, core-hours.
    pub accumulated_core_hours: f64,
}

/// What a revocation names: exactly one of a token id, an owner (the `sub` of submit tokens and
/// the `owner` of attach tokens) or an issuer.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "value")]
pub enum RevocationTarget {
    /// One token, submit or attach, by its `jti`.
    Jti(String),
    /// Every token of this owner: submit tokens whose `sub` it is, attach tokens bound to it.
    Owner(String),
    /// Every token this issuer signed.
    Issuer(String),
}

/// `POST /v1/revocations` (admin).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevokeRequest {
    /// What to revoke.
    pub target: RevocationTarget,
    /// Why; recorded with every job it removes or stops.
    pub reason: String,
}

/// A recorded revocation and what it did: the answer to `POST /v1/revocations`, and each
/// element of `GET /v1/revocations`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocation {
    /// What was revoked.
    pub target: RevocationTarget,
    /// Why.
    pub reason: String,
    /// Who asked (the admin credential's name).
    pub by: String,
    /// Unix ms.
    pub at_ms: u64,
    /// Idle jobs taken out of the queue.
    pub removed_jobs: Vec<String>,
    /// Running jobs told to stop.
    pub stopped_jobs: Vec<String>,
    /// EP sessions closed because their attach token was revoked.
    pub closed_eps: Vec<String>,
}

/// One owner's account: `GET /v1/accounting` returns a `Vec` of these.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Account {
    /// The owner.
    pub owner: String,
    /// Jobs that completed.
    pub jobs_completed: u64,
    /// Jobs that failed.
    pub jobs_failed: u64,
    /// Sum of cpus × wall time, in core-seconds.
    pub core_seconds: f64,
    /// Sum of guest CPU time, seconds.
    pub cpu_seconds: f64,
    /// Sum of wall time, seconds.
    pub wall_seconds: f64,
    /// Bytes read.
    pub bytes_in: u64,
    /// Bytes written.
    pub bytes_out: u64,
}

/// What an accounting report groups its rows by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccountingBy {
    /// The submit token's subject.
    Owner,
    /// The token's accounting group (`(none)` for jobs without one).
    Group,
    /// The function's name.
    Function,
}

/// Query of `GET /v1/accounting/report` (scheduler, and proxied by the gateway). Jobs count in
/// the period in which they reached their final state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountingQuery {
    /// First instant counted, Unix ms (inclusive). Default: the beginning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
    /// End of the range, Unix ms (exclusive). Default: now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<u64>,
    /// Row key.
    pub by: AccountingBy,
    /// Split each key's row into periods of this many seconds, aligned to the Unix epoch
    /// (3600: hourly). Default: one row per key for the whole range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_s: Option<u64>,
}

/// One row of an [`AccountingReport`]: one key (owner, group or function) in one period.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AccountingRow {
    /// The owner, group or function.
    pub key: String,
    /// Start of the period, Unix ms; the report's `since_ms` when it has no periods.
    pub period_start_ms: u64,
    /// Jobs that reached each final state (`completed`, `failed`, `removed`) in the period,
    /// by [`JobState::as_str`]; states with no job are left out.
    pub jobs: BTreeMap<String, u64>,
    /// Sum over the jobs of cpus × wall time, hours.
    pub core_hours: f64,
    /// Sum of wall time, hours.
    pub wall_hours: f64,
    /// Sum of guest CPU time, hours.
    pub cpu_hours: f64,
    /// Largest peak memory of any job, bytes.
    pub peak_memory_bytes: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Instructions (fuel) of the jobs whose EP meters them; absent when none did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<u64>,
}

/// Answer to `GET /v1/accounting/report`: rows sorted by key, then period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AccountingReport {
    /// The range counted, Unix ms: `[since_ms, until_ms)`.
    pub since_ms: u64,
    /// End of the range (exclusive).
    pub until_ms: u64,
    /// Row key.
    pub by: AccountingBy,
    /// Period length, seconds, when split.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_s: Option<u64>,
    /// The rows.
    pub rows: Vec<AccountingRow>,
}

// ---------------------------------------------------------------------------------------------
// The gateway's HTTP API: what `htfaas` (src/client.rs) and the tests send and read. The logic
// behind these types (windows, plans, time parsing, the counters) stays in the gateway.
// ---------------------------------------------------------------------------------------------

/// Answer to `POST /v1/modules` (admin; the body is the wasm bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleUploaded {
    /// The module's content digest, under which the registry keeps it.
    pub digest: Digest,
}

/// Body of `POST /v1/functions/{name}/runs`, with `Authorization: Bearer <submit token>`.
/// Answer: [`SubmitResponse`] (201).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// Storage path of the input file; it must match the function's trigger.
    pub path: String,
    /// Run on this annex. Allowed only when the function names none or the same one.
    #[serde(default)]
    pub annex: Option<String>,
}

/// A point in time as a request gives it: Unix seconds, or text for the gateway's
/// `replay::parse_time`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TimeArg {
    /// Unix seconds.
    Unix(u64),
    /// RFC 3339, Unix seconds, or `-<n><s|m|h|d>` before now.
    Text(String),
}

/// Body of `POST /v1/events/replay` (admin). Answer: [`Report`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    /// First recording time read (inclusive): Unix seconds, or a string for the gateway's
    /// `replay::parse_time`.
    pub since: TimeArg,
    /// Last recording time read (inclusive). Default: up to the last event recorded when the
    /// request began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<TimeArg>,
    /// Only this function. Default: every registered function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// List the pairs that would fire; submit nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Most messages read, at most the gateway's `replay::MAX_EVENTS`. Default: its
    /// `replay::DEFAULT_LIMIT`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// The replay's id, to continue or retry a replay without starting anything twice
    /// (`[A-Za-z0-9_-]{1,64}`). Default: a fresh one (the gateway's `replay::new_replay_id`).
    /// Not with `dry_run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_id: Option<String>,
}

/// Query of a dry-run registration: `POST /v1/functions?dry_run=true[&since=T][&until=T][&limit=N]`
/// (admin; the body is the `FunctionManifest`). Answer: [`Report`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterQuery {
    /// Validate and list the recorded events the trigger would fire on; store nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// First recording time read. Default: the gateway's `replay::DEFAULT_DRY_RUN_WINDOW_S` ago.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// Last recording time read. Default: the last event recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// Most messages read. Default: the gateway's `replay::DEFAULT_LIMIT`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

/// One (event, function) pair that would fire (dry run) or was fired (replay).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pair {
    /// Stream sequence of the recorded message.
    pub seq: u64,
    /// When the stream stored it (RFC 3339).
    pub recorded: String,
    /// The event's id (the event half of the dedupe key).
    pub event_id: String,
    /// The file's storage path.
    pub path: String,
    /// What happened (`write`, `remove`, …).
    pub kind: String,
    /// The producer's message type (`transfer`, `closew`, …).
    pub msg_type: String,
    /// When the producer says it happened, if it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// The function.
    pub function: String,
    /// Its version (0: a candidate not registered).
    pub version: u32,
    /// Replay only: whether it was started or queued (false: a transient failure; issue the
    /// same replay again to retry it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fired: Option<bool>,
}

/// What a replay or dry run read and did: the answer to [`ReplayRequest`] and to a dry-run
/// registration ([`RegisterQuery`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// True when nothing was submitted.
    pub dry_run: bool,
    /// The replay's id (its jobs' dedupe keys end in `#replay:<id>`); none for a dry run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_id: Option<String>,
    /// Start of the window (RFC 3339).
    pub since: String,
    /// End of the window (RFC 3339), if one was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// Functions whose triggers were evaluated.
    pub functions: Vec<String>,
    /// Messages read.
    pub scanned: u64,
    /// Of those, events.
    pub parsed: u64,
    /// Of those, well-formed messages that are no event.
    pub ignored: u64,
    /// Of those, messages of a type the site did not enable.
    pub not_enabled: u64,
    /// Of those, malformed messages.
    pub malformed: u64,
    /// (event, function) pairs whose trigger is true.
    pub matched: u64,
    /// Replay: pairs started or queued.
    pub fired: u64,
    /// Replay: pairs that failed transiently (not started).
    pub failures: u64,
    /// Why the read stopped before the end of the window, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// When it stopped early: the `since` to continue from (the last message read is read again;
    /// with the same replay id it starts nothing twice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_since: Option<String>,
    /// The pairs, in stream order, at most the gateway's `replay::MAX_LISTED`.
    pub pairs: Vec<Pair>,
    /// Whether more pairs matched than are listed.
    #[serde(default)]
    pub pairs_truncated: bool,
}

/// Body of `POST /v1/functions/{name}/test` (admin): one message, given (`event`, with
/// `subject` and `headers`) or recorded (`seq`, a stream sequence of the events stream).
/// Answer: [`TestReport`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestRequest {
    /// Subject it came on. Default: the dCache billing subject.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// NATS headers (a binary-mode CloudEvent's `ce-*` attributes).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub headers: std::collections::BTreeMap<String, String>,
    /// The message's JSON (the payload is its JSON text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<serde_json::Value>,
    /// Instead of `event`: the recorded message with this stream sequence, with its own
    /// subject and headers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
}

/// What one part of a trigger says about an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartVerdict {
    /// `path` (the trigger's path glob) or `rule`.
    pub part: String,
    /// The part as written.
    pub text: String,
    /// `true`, `false` or `undefined`: the part alone, with the default kind (writes only
    /// unless it names a kind or type).
    pub verdict: String,
}

/// How a message parsed, and what a function's trigger says about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestReport {
    /// The function.
    pub function: String,
    /// Its version.
    pub version: u32,
    /// Its trigger, as one rule.
    pub trigger: String,
    /// `event`, `ignored`, `not-enabled`, `out-of-bounds` (the subject may not speak for the path:
    /// the gateway's `source_paths`) or `malformed`.
    pub outcome: String,
    /// Why it is no event (ignored, not enabled, malformed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The event, when it is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<crate::event::StorageEvent>,
    /// The whole trigger: `true`, `false` or `undefined`; none when the message is no event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    /// The path glob and the rule, each alone.
    #[serde(default)]
    pub parts: Vec<PartVerdict>,
    /// Whether the file is in the function's own output directory (never fires).
    #[serde(default)]
    pub own_output: bool,
    /// Whether the function would fire: the trigger is true and the file is not its own output.
    pub fires: bool,
}

/// `GET /v1/stats` (admin): the gateway's counters at one moment (its `stats::Stats`). Counts
/// are monotonic since the gateway started, except the gauge `firings_pending`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Messages delivered by JetStream (redeliveries included).
    pub events_received: u64,
    /// Of those, on the dCache billing subject.
    #[serde(default)]
    pub events_dcache_billing: u64,
    /// Of those, on a `storage.cloudevents.*` subject.
    #[serde(default)]
    pub events_cloudevents: u64,
    /// Messages that were not events of their source (bad JSON, missing attribute, bad path);
    /// acked and skipped.
    pub events_malformed: u64,
    /// Valid messages that are no event (failed operations, p2p copies, no usable path,
    /// warnings).
    pub events_ignored: u64,
    /// Events refused because their subject may not speak for their path (`source_paths` in
    /// the gateway config: a publisher outside the paths its source is bound to); acked,
    /// never retried.
    #[serde(default)]
    pub events_out_of_bounds: u64,
    /// Valid messages of a type the site did not enable (`sources` in the gateway config).
    #[serde(default)]
    pub events_not_enabled: u64,
    /// Events that matched no trigger.
    pub events_unmatched: u64,
    /// Events all of whose firings were already queued (a redelivery or a duplicate message):
    /// dropped before any macaroon request.
    #[serde(default)]
    pub events_duplicate: u64,
    /// Jobs the scheduler accepted as new.
    pub jobs_submitted: u64,
    /// Firings that started no job because one for the same event and function already
    /// exists: dropped on the firing table's key ([`StatsSnapshot::firings_deduplicated`]) or
    /// answered by the scheduler with the existing job (the difference of the two).
    pub jobs_deduplicated: u64,
    /// Firings refused for good (bad request, limits, an unreadable stored firing).
    pub jobs_refused: u64,
    /// Transient failures: a submission (storage or scheduler unreachable), retried with
    /// backoff from the firing table; or a failed write of the table, the event redelivered.
    pub transient_failures: u64,
    /// Firings written to the firing table (one per matching function of a new event).
    #[serde(default)]
    pub firings_queued: u64,
    /// Firings dropped because their key (event, function, digest) was already in the table.
    #[serde(default)]
    pub firings_deduplicated: u64,
    /// Pending firings replaced by a later event on the same path (debounce); never run.
    #[serde(default)]
    pub firings_superseded: u64,
    /// Functions an event matched but did not fire because the file was written by a job of
    /// theirs or of a function up the same chain (the loop guard).
    #[serde(default)]
    pub firings_loop_guarded: u64,
    /// Times a firing found no rate token and was given a later time (waits, not dropped).
    #[serde(default)]
    pub firings_rate_delayed: u64,
    /// Gauge: firings pending or being submitted now.
    #[serde(default)]
    pub firings_pending: u64,
    /// Batches the ingest loop handled: messages taken together, their firings committed in
    /// one transaction (group commit), then all acked. `events_received / ingest_batches` is
    /// the mean batch size.
    #[serde(default)]
    pub ingest_batches: u64,
}

/// Which audit trail a gateway audit route reads (`?trail=`): the scheduler's (the default)
/// or the gateway's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditTrail {
    /// The scheduler's: jobs accepted, refused, held, dispatched, finished; revocations.
    #[default]
    Scheduler,
    /// The gateway's: events matched, tokens minted, macaroons obtained, admin actions.
    Gateway,
}

/// `GET /v1/lineage?file=PATH[&depth=N]` (gateway, admin).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LineageQuery {
    /// The storage path whose lineage is asked.
    pub file: String,
    /// Most steps followed back (default and at most 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
}

/// Where a file comes from and who read it: the answer of `GET /v1/lineage`. Built from both
/// audit trails: the scheduler's records of each job and the gateway's records of its event and
/// token (each [`crate::audit::AuditRecord`] names its trail in `writer`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lineage {
    /// The file asked about.
    pub file: String,
    /// Every job found, the file's own first (depth 0: the jobs that wrote it, then those that
    /// read it), then, one depth further each, the job that wrote the input of a job before.
    pub steps: Vec<LineageStep>,
    /// The walk stopped at the depth or step limit with more to follow.
    #[serde(default)]
    pub truncated: bool,
}

/// How a job of a lineage relates to its step's file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LineageRelation {
    /// The job wrote the file (one of its outputs).
    Wrote,
    /// The job read the file (its input).
    Read,
}

/// One job of a [`Lineage`]: why it ran (event, rule, function, token, macaroons), what it
/// read and wrote, and every record of it in both trails.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LineageStep {
    /// 0 for the file asked about; n for the input n jobs back.
    pub depth: u32,
    /// The file this step is about.
    pub file: String,
    /// Whether the job wrote or read `file`.
    pub relation: LineageRelation,
    /// The scheduler's job id.
    pub job: String,
    /// The function's name.
    pub function: Option<String>,
    /// The function's version.
    pub function_version: Option<u64>,
    /// The module digest that ran.
    pub digest: Option<String>,
    /// The owner accounted.
    pub owner: Option<String>,
    /// The submit token's `jti`.
    pub token_jti: Option<String>,
    /// The storage event the job came from.
    pub event_id: Option<String>,
    /// The trigger that matched the event (`path glob "…"`, the rule, or both), from the
    /// gateway's `event.matched` record.
    pub rule: Option<String>,
    /// The job that wrote the event's file, when a job did (the loop guard's provenance).
    pub caused_by: Option<Cause>,
    /// The job's input path.
    pub input: Option<String>,
    /// The files the job wrote.
    pub outputs: Vec<String>,
    /// The identifiers of the job's macaroons (read, write), never the macaroons.
    pub macaroons: Vec<String>,
    /// The job's records of both trails, in time order (`writer` says which trail).
    pub records: Vec<crate::audit::AuditRecord>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_star_stays_in_a_segment_and_double_star_spans() {
        let g = compile_glob("/data/raw/**").expect("valid glob");
        assert!(g.is_match("/data/raw/a.dat"));
        assert!(g.is_match("/data/raw/x/y/z.dat"));
        assert!(!g.is_match("/data/rawx/a.dat"));
        assert!(!g.is_match("/data/checksums/a.dat"));
        let one = compile_glob("/data/*.h5").expect("valid glob");
        assert!(one.is_match("/data/a.h5"));
        assert!(!one.is_match("/data/x/a.h5"));
        assert!(compile_glob("data/**").is_err());
    }

    #[test]
    fn transfer_message_parses_dcache_quirks() {
        // Key order arbitrary, isWrite a string, unknown keys ignored, absent keys are None.
        let raw = r#"{"isWrite":"write","msgType":"transfer","transferPath":"/data/raw/a","pnfsid":"00A",
            "status":{"code":0,"msg":""},"isP2p":false,"unknownKey":[1,2],"readIdle":"PT0S"}"#;
        let m: TransferMessage = serde_json::from_str(raw).expect("parses");
        assert_eq!(m.is_write.as_deref(), Some("write"));
        assert_eq!(m.transfer_path.as_deref(), Some("/data/raw/a"));
        assert_eq!(m.session, None);
    }

    #[test]
    fn ep_messages_round_trip() {
        let msg = EpMsg::Finished(JobReport {
            job_id: "j1".into(),
            outcome: Outcome::TimeExceeded { limit_s: 3 },
            usage: Usage { wall_ms: 1, ..Usage::default() },
            outputs: vec![],
            log: "x".into(),
        });
        let text = serde_json::to_string(&msg).expect("serializes");
        assert_eq!(serde_json::from_str::<EpMsg>(&text).expect("parses"), msg);
    }

    #[test]
    fn storage_unavailable_is_transient_named_on_the_wire_and_not_a_success() {
        let o = Outcome::StorageUnavailable { reason: "GET http://s/a: HTTP 503".into() };
        let text = serde_json::to_string(&o).expect("serializes");
        assert_eq!(text, r#"{"kind":"storage_unavailable","reason":"GET http://s/a: HTTP 503"}"#);
        assert_eq!(serde_json::from_str::<Outcome>(&text).expect("parses"), o);
        assert!(o.is_transient() && !o.is_success());
        assert_eq!(o.reason(), "storage unavailable: GET http://s/a: HTTP 503");
        assert!(!Outcome::InputFailed { reason: "HTTP 403".into() }.is_transient());
    }

    #[test]
    fn bind_ep_address_is_on_the_wire_only_when_true() {
        let mut req = SubmitRequest {
            function: FunctionRef {
                name: "f".into(),
                version: 1,
                digest: Digest::of(b"m"),
                module_url: "http://gw/v1/modules/m".into(),
            },
            resources: Resources::new(1, 1, 1),
            input: InputSpec { url: "http://s/data/a".into(), name: "a".into(), macaroon: "r".into() },
            output: OutputSpec { url: "http://s/data/out/".into(), macaroon: "w".into() },
            args: vec![],
            env: vec![],
            event: EventRef::new("dcache", "e", "/data/a"),
            dedupe_key: "k".into(),
            annex: None,
            bind_ep_address: false,
            class: None,
            limits: Default::default(),
        };
        // Absent when false: a request (or a stored one) without the field means false, and a
        // scheduler that predates it still accepts requests that do not ask for it.
        let text = serde_json::to_string(&req).expect("serializes");
        assert!(!text.contains("bind_ep_address"), "{text}");
        assert_eq!(serde_json::from_str::<SubmitRequest>(&text).expect("parses"), req);
        req.bind_ep_address = true;
        let text = serde_json::to_string(&req).expect("serializes");
        assert!(text.contains(r#""bind_ep_address":true"#), "{text}");
        assert_eq!(serde_json::from_str::<SubmitRequest>(&text).expect("parses"), req);
    }

    #[test]
    fn gateway_api_types_read_what_clients_send_and_round_trip() {
        // A time is a number (Unix seconds) or a string; optional fields may be absent.
        let r: ReplayRequest = serde_json::from_str(r#"{"since":0}"#).expect("parses");
        assert_eq!((r.since, r.until, r.dry_run), (TimeArg::Unix(0), None, false));
        let r: ReplayRequest = serde_json::from_str(r#"{"since":"-2h","until":"1795341600"}"#).expect("parses");
        assert_eq!((r.since, r.until), (TimeArg::Text("-2h".into()), Some(TimeArg::Text("1795341600".into()))));
        assert!(serde_json::from_str::<ReplayRequest>(r#"{"since":0,"typo":1}"#).is_err());
        // A run without an annex, as the client sends it (`null`) or leaves it out.
        for text in [r#"{"path":"/a","annex":null}"#, r#"{"path":"/a"}"#] {
            let run: RunRequest = serde_json::from_str(text).expect("parses");
            assert_eq!(run, RunRequest { path: "/a".into(), annex: None });
        }
        // Absent options stay off the wire and read back the same.
        let report = Report { since: "s".into(), pairs_truncated: true, ..Report::default() };
        let text = serde_json::to_string(&report).expect("serializes");
        assert!(!text.contains("replay_id") && !text.contains("resume_since"), "{text}");
        assert_eq!(serde_json::from_str::<Report>(&text).expect("parses"), report);
        // A gateway that predates the newer counters still answers a readable snapshot.
        let old = r#"{"events_received":1,"events_malformed":0,"events_ignored":0,"events_unmatched":0,
            "jobs_submitted":1,"jobs_deduplicated":0,"jobs_refused":0,"transient_failures":0}"#;
        let snapshot: StatsSnapshot = serde_json::from_str(old).expect("parses");
        assert_eq!((snapshot.jobs_submitted, snapshot.firings_pending), (1, 0));
    }
}
