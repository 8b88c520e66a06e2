//! The attach conversation, EP to scheduler over one WebSocket (`GET /v1/ep/attach`, Bearer
//! attach token): the protocol version and close codes, the EP's [`Hello`] and its labels,
//! [`EpMsg`] and [`SchedulerMsg`], the [`JobAssignment`] and the EP's [`JobReport`].
//!
//! Frames: one JSON text frame per message. The prefetch extension, which both
//! sides opt into — the EP with [`Hello::prefetch`], the scheduler with
//! [`SchedulerMsg::Welcome`]'s `prefetch` — adds three things, all compatible with protocol 1
//! peers that do not opt in: a text frame may hold a JSON array of messages ([`decode_frame`]);
//! the scheduler may assign up to [`Prefetch::jobs`] jobs beyond the EP's free resources, which
//! the EP queues and starts in order as its resources free; and the EP hands a queued job back
//! unstarted with [`EpMsg::NotStarted`].
//!
//! Renewal: an EP asks for fresh macaroons of a running job with [`EpMsg::Renew`],
//! only for an assignment that carries [`JobAssignment::renew_until`] (so a scheduler that
//! predates it, which would count the message as a bad frame, is never asked); the scheduler
//! answers [`SchedulerMsg::Renewed`] or [`SchedulerMsg::RenewRefused`], which an EP that never
//! asks never receives.
//!
//! Attach renewal: an EP whose Hello says [`Hello::renews_attach`] is told its token's time
//! left in its `Welcome` ([`AttachLease`]) and, when the scheduler will renew it, when to ask;
//! it then asks with [`EpMsg::RenewAttach`] and gets [`SchedulerMsg::AttachRenewed`] (a new
//! token, the same credential with a later expiry, which replaces the old one for this session
//! and for reconnects) or [`SchedulerMsg::AttachRenewRefused`]. A scheduler that predates it
//! sends no lease, so the EP never asks.
//!
//! Must not know: users and owners (an assignment carries no identity), admin routes, the
//! audit trail.

use super::submit::{FunctionRef, InputSpec, OutputSpec, SecretEnv};
use crate::digest::Digest;
use crate::manifest::RuntimeKind;
use crate::on_failure::RetryOn;
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
    /// The prefetch extension: present, the EP speaks it (array frames, a local queue,
    /// [`EpMsg::NotStarted`]) and would hold up to this many assigned jobs beyond its free
    /// resources; the scheduler grants at most this ([`Prefetch`]). Absent (older EPs): one
    /// message per frame and no prefetch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<u32>,
    /// The runtimes it runs functions with. Absent (EPs before native guests): wasm only. An
    /// EP offers `native` only where its sandbox and a cgroup backend work.
    #[serde(default = "wasm_only", skip_serializing_if = "is_wasm_only")]
    pub runtimes: Vec<RuntimeKind>,
    /// Images it holds unpacked (at most [`MAX_HELLO_IMAGES`]): the scheduler prefers it for
    /// their jobs. Self-asserted: a preference only, never a permission.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<Digest>,
    /// The EP renews its attach token over the session when its `Welcome` says when
    /// ([`AttachLease::renew_in_ms`]). Absent from older EPs: their token's expiry ends the
    /// session.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub renews_attach: bool,
}

/// An attach token's time left, as the scheduler tells the EP (in its `Welcome` and with each
/// renewal): durations from receipt, so that clocks need not agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachLease {
    /// Milliseconds until the token expires and the scheduler closes the session
    /// ([`CLOSE_EXPIRED`]).
    pub expires_in_ms: u64,
    /// Milliseconds until the EP should ask for a new token ([`EpMsg::RenewAttach`]); absent:
    /// the scheduler will not renew it (renewal is off, or the token is already as long as its
    /// annex lasts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_in_ms: Option<u64>,
}

/// Most images a [`Hello`] lists.
pub const MAX_HELLO_IMAGES: usize = 256;

fn wasm_only() -> Vec<RuntimeKind> {
    vec![RuntimeKind::Wasm]
}

fn is_wasm_only(r: &[RuntimeKind]) -> bool {
    r == [RuntimeKind::Wasm]
}

/// What the scheduler grants an EP that asked for prefetch ([`Hello::prefetch`]), in its
/// [`SchedulerMsg::Welcome`]; its presence also says the scheduler speaks the extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prefetch {
    /// Most jobs the scheduler assigns beyond the EP's free resources (0: none). The EP queues
    /// them and starts each, oldest first, once its free cpus and memory hold it.
    pub jobs: u32,
    /// Longest a queued job may wait on the EP before it starts, ms: one that would start later
    /// is handed back unstarted ([`EpMsg::NotStarted`]). Its macaroons and the scheduler's
    /// overdue check are cut to its dispatch, so the wait is taken out of their grace.
    pub wait_ms: u64,
}

/// Most messages one frame of the prefetch extension holds.
pub const MAX_FRAME_MESSAGES: usize = 256;

/// Why a frame does not decode ([`decode_frame`]).
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// Not JSON of the expected message (or array of them).
    #[error("does not parse: {0}")]
    Json(#[from] serde_json::Error),
    /// An array of more than [`MAX_FRAME_MESSAGES`] messages.
    #[error("{0} messages in one frame, at most {MAX_FRAME_MESSAGES}")]
    TooMany(usize),
    /// An array frame from a peer that did not opt into the prefetch extension.
    #[error("an array frame outside the prefetch extension")]
    Array,
}

/// The messages of one text frame: one message, or (with `arrays`: the prefetch extension) a
/// JSON array of at most [`MAX_FRAME_MESSAGES`] messages.
pub fn decode_frame<M: serde::de::DeserializeOwned>(text: &str, arrays: bool) -> Result<Vec<M>, FrameError> {
    if text.trim_start().starts_with('[') {
        if !arrays {
            return Err(FrameError::Array);
        }
        let all: Vec<M> = serde_json::from_str(text)?;
        if all.len() > MAX_FRAME_MESSAGES {
            return Err(FrameError::TooMany(all.len()));
        }
        return Ok(all);
    }
    Ok(vec![serde_json::from_str(text)?])
}

/// One text frame holding `msgs`: the message itself when there is one, else a JSON array
/// (only for a peer that speaks the prefetch extension).
pub fn encode_frame<M: Serialize>(msgs: &[M]) -> Result<String, serde_json::Error> {
    match msgs {
        [one] => serde_json::to_string(one),
        many => serde_json::to_string(many),
    }
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
    /// Prefetch extension only: a job assigned here was never started and is handed back (the
    /// EP is draining, or the job waited in its queue past [`Prefetch::wait_ms`]); the
    /// scheduler queues it again at once. Answers an Assign instead of [`EpMsg::Finished`].
    NotStarted {
        /// The job.
        job_id: String,
        /// Why, for the job's record.
        reason: String,
    },
    /// Fresh macaroons for this running job, please: its current ones expire before
    /// the job is done. Sent only for a job whose assignment has
    /// [`JobAssignment::renew_until`] (a scheduler that knows the message), at most one at a
    /// time per job. Answer: [`SchedulerMsg::Renewed`] or [`SchedulerMsg::RenewRefused`].
    Renew {
        /// The job, running on this EP.
        job_id: String,
    },
    /// A new attach token, please: sent once the `Welcome`'s (or the last renewal's)
    /// [`AttachLease::renew_in_ms`] passed, at most one at a time. Answer:
    /// [`SchedulerMsg::AttachRenewed`] or [`SchedulerMsg::AttachRenewRefused`].
    RenewAttach,
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
        /// The prefetch extension granted, for an EP that asked ([`Hello::prefetch`]); absent
        /// otherwise (and from older schedulers).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prefetch: Option<Prefetch>,
        /// The attach token's time left and when to renew it, for an EP that renews
        /// ([`Hello::renews_attach`]); absent otherwise (and from older schedulers).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attach: Option<AttachLease>,
    },
    /// Answers [`EpMsg::RenewAttach`]: the attach token renewed (same credential: revoking it
    /// revokes this one too), for this session and the EP's next dials.
    AttachRenewed {
        /// The new attach token.
        token: String,
        /// Its time left and when to ask again.
        lease: AttachLease,
    },
    /// Answers [`EpMsg::RenewAttach`]: no new token (revoked, the annex ended, renewal off, or
    /// asked too early); the session still ends when the current token expires.
    AttachRenewRefused {
        /// Why.
        reason: String,
    },
    /// Run this job. Answer: [`EpMsg::Finished`] with the same `job_id`.
    Assign(JobAssignment),
    /// Drop every idle handler (native functions' warm workers) now, and keep none that is
    /// serving after its run: sent on a revocation, to EPs offering the native runtime (an EP
    /// before handlers never gets it). No answer.
    Retire {
        /// Why, for the EP's log.
        reason: String,
    },
    /// Stop this job now (its token was revoked, or an admin held or removed it). Answer:
    /// [`EpMsg::Finished`] with [`Outcome::Cancelled`] (also for a job still queued, which is
    /// then never started); unknown ids are ignored.
    Cancel {
        /// The job.
        job_id: String,
        /// Why, for the job's record.
        reason: String,
        /// The job ends for good (removed, not held): its checkpoint is of no more use and is
        /// deleted rather than stored. Absent (an older scheduler): kept, as for a hold.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        ends: bool,
    },
    /// The EP's lifetime ends this many ms from now: it then leaves as at the end of its own
    /// lifetime (drains: running jobs finish, no new one starts), at once for 0. Replaces the
    /// lifetime the EP started with, longer or shorter. Sent to the EPs of an annex
    /// the scheduler keeps a record of ([`super::AnnexRecord`]): right after `Welcome`, and
    /// whenever the annex is extended or deleted. No answer. An older EP ignores it
    /// as an unparsable frame.
    Lifetime {
        /// Milliseconds from receipt.
        leave_in_ms: u64,
    },
    /// Compile this module ahead of its first job: a function using it was
    /// registered. The EP fetches it as it fetches a job's module (its own allowed origins, the
    /// digest checked), compiles it in the background, one at a time, never holding up a job,
    /// and keeps it in its disk cache; a job needing it meanwhile waits for that compile rather
    /// than starting another. Sent after `Welcome` for every module on the scheduler's warm list
    /// that the EP may run, and to attached EPs as modules join the list
    /// ([`super::WarmRequest`]). No answer. An older EP ignores it as an unparsable
    /// frame.
    Warm {
        /// The module's digest.
        digest: crate::digest::Digest,
        /// Where to fetch it (a module store's URL for the digest, checked by the scheduler).
        module_url: String,
    },
    /// Answers [`EpMsg::Renew`]: macaroons for the same input file and output directory, newly
    /// issued by the storage and attenuated as the assignment's were (the job's deadline, and
    /// the EP's address when the job asked for it). They replace the job's current ones. A job
    /// without an input gets the write macaroon alone: the EP refuses an answer with a read
    /// macaroon for it (and one without for a job that has an input).
    Renewed {
        /// The job.
        job_id: String,
        /// Read macaroon for the input file (bearer; never logged); none for a job without
        /// an input.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input_macaroon: Option<String>,
        /// Write macaroon for the output directory (bearer; never logged).
        output_macaroon: String,
        /// Macaroon for the job's checkpoint area, for a job that keeps checkpoints (bearer;
        /// never logged); absent otherwise (and from older schedulers).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        checkpoint_macaroon: Option<String>,
        /// Read macaroons for the job's reference files, in the assignment's order (bearer;
        /// never logged); empty for a job without (and from older schedulers).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        ref_macaroons: Vec<String>,
    },
    /// Answers [`EpMsg::Renew`]: no fresh macaroons (the job is not running on this EP, is past
    /// its run time, was revoked, or the gateway or storage refused). The EP keeps using the
    /// ones it has.
    RenewRefused {
        /// The job.
        job_id: String,
        /// Why.
        reason: String,
    },
}

/// A job as the EP sees it: no owner, no token, only what it needs to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobAssignment {
    /// Job id.
    pub job_id: String,
    /// What to run; for a native function also its vacate time ([`super::NativeCode::vacate_s`]).
    pub function: FunctionRef,
    /// Limits to enforce.
    pub resources: Resources,
    /// Input file and its read macaroon; none for a run on no file (`/input` then holds only
    /// `ref/`). Absent on the wire when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<InputSpec>,
    /// Output directory and its write macaroon.
    pub output: OutputSpec,
    /// Arguments after the input's guest path (or after the function's name, with no input).
    pub args: Vec<String>,
    /// The guest's whole environment.
    pub env: Vec<(String, String)>,
    /// Secret variables added to the guest's environment (never logged: names only in
    /// `Debug`); absent on the wire when none.
    #[serde(default, skip_serializing_if = "SecretEnv::is_empty")]
    pub secrets: SecretEnv,
    /// Limits the function asks for below the EP's own (its manifest's); absent on the wire
    /// when none is set, and ignored by EPs that predate it.
    #[serde(default, skip_serializing_if = "JobLimits::is_unset")]
    pub limits: JobLimits,
    /// Unix seconds until which the scheduler renews this job's macaroons on request
    /// ([`EpMsg::Renew`]): the job's dispatch plus its run time and the macaroons'
    /// grace, the `before:` the scheduler cut them to. Absent when it will not (no renewal
    /// grant, or an older scheduler): the EP then never asks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_until: Option<u64>,
    /// The W3C `traceparent` of this attempt's span: the EP continues the event's
    /// trace under it (its log lines, the `traceparent` of its storage requests). Absent from
    /// schedulers before it; an EP ignores one that does not parse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// Reference files read besides the input, each under `/input/ref/<path>`
    /// ([`super::ReferenceInput`]); absent on the wire when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refs: Vec<super::ReferenceInput>,
    /// The job's own checkpoint area ([`crate::checkpoint`]): `/checkpoint` is restored from it
    /// before the run and stored into it when the guest exits with its `exit_code` or is
    /// stopped before its end; absent on the wire when the function keeps none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<crate::checkpoint::CheckpointSpec>,
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
        /// For a native job sent SIGTERM inside its run time (its vacate time): what it did,
        /// e.g. `SIGTERM 2 s before the limit; exited with status 0 1 s later`. Absent for wasm
        /// and from EPs before it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vacate: Option<String>,
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
    /// held with [`HOLD_CODE_STORAGE`](super::HOLD_CODE_STORAGE). A refusal (any other 4xx) is the final
    /// [`Outcome::InputFailed`], [`Outcome::OutputFailed`] or [`Outcome::ModuleFailed`] instead.
    StorageUnavailable {
        /// The last failure: method, URL without its query, status or error, and the tries.
        reason: String,
    },
    /// The guest asked to be resumed: it exited with its checkpoint exit code and its
    /// `/checkpoint` was stored ([`JobReport::checkpoint`]). The scheduler runs it again, on any
    /// EP, from that checkpoint; an attempt that stored nothing new counts as a failed exit.
    Checkpointed {
        /// The guest's exit status (the manifest's `checkpoint.exit_code`).
        exit_code: i32,
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

    /// The kind a retry policy names this outcome by ([`RetryOn`]); `None` for a success and
    /// for the outcomes no policy retries (a refused input, module or output, an output past
    /// its limit, a cancel).
    pub fn retry_kind(&self) -> Option<RetryOn> {
        Some(match self {
            Outcome::Exited { exit_code: 0 } => return None,
            Outcome::Exited { .. } => RetryOn::ExitNonzero,
            Outcome::Trapped { .. } => RetryOn::Trap,
            Outcome::MemoryExceeded { .. } => RetryOn::MemoryExceeded,
            Outcome::TimeExceeded { .. } => RetryOn::TimeExceeded,
            Outcome::FuelExhausted { .. } => RetryOn::FuelExhausted,
            Outcome::StorageUnavailable { .. } => RetryOn::StorageUnavailable,
            Outcome::InputFailed { .. }
            | Outcome::OutputFailed { .. }
            | Outcome::ModuleFailed { .. }
            | Outcome::Cancelled { .. }
            | Outcome::Checkpointed { .. }
            | Outcome::OutputExceeded { .. } => return None,
        })
    }

    /// Whether the guest ran and failed on its own (a non-zero exit, a trap, a time, memory
    /// or instruction limit passed): the outcomes whose outputs `outputs.on_failure` governs.
    pub fn is_guest_failure(&self) -> bool {
        self.retry_kind().is_some_and(|k| k != RetryOn::StorageUnavailable)
    }

    /// One line for job records: empty on success.
    pub fn reason(&self) -> String {
        match self {
            Outcome::Exited { exit_code: 0 } => String::new(),
            Outcome::Exited { exit_code } => format!("exited with status {exit_code}"),
            Outcome::Trapped { message } => format!("trapped: {message}"),
            Outcome::MemoryExceeded { limit_bytes } => format!("memory limit of {limit_bytes} bytes exceeded"),
            Outcome::TimeExceeded { limit_s, vacate: None } => format!("wall-time limit of {limit_s} s exceeded"),
            Outcome::TimeExceeded { limit_s, vacate: Some(v) } => {
                format!("wall-time limit of {limit_s} s exceeded ({v})")
            }
            Outcome::InputFailed { reason } => format!("input failed: {reason}"),
            Outcome::OutputFailed { reason } => format!("output failed: {reason}"),
            Outcome::ModuleFailed { reason } => format!("module failed: {reason}"),
            Outcome::Cancelled { reason } => format!("cancelled: {reason}"),
            Outcome::FuelExhausted { limit } => format!("instruction budget of {limit} exceeded"),
            Outcome::OutputExceeded { reason } => format!("output limit exceeded: {reason}"),
            Outcome::StorageUnavailable { reason } => format!("storage unavailable: {reason}"),
            Outcome::Checkpointed { exit_code } => format!("checkpointed (exit status {exit_code}): to be resumed"),
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
    /// Where the wall time went on the EP; absent from older EPs.
    #[serde(default, skip_serializing_if = "Phases::is_unset")]
    pub phases: Phases,
}

/// A run's phases on the EP, ms each: fetching the module, compiling or loading it, fetching
/// the input, the guest's run, storing the outputs. A phase that did not happen is 0 (a module
/// already in memory, a run that failed before its input). The scheduler clamps each to the
/// run's wall time ([`Phases::clamped`]): an EP's report is not believed beyond it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Phases {
    /// Fetching the module (from the gateway or the EP's disk cache).
    #[serde(default)]
    pub module_ms: u64,
    /// Compiling the module, or loading its compiled form from the disk cache.
    #[serde(default)]
    pub compile_ms: u64,
    /// Downloading the input.
    #[serde(default)]
    pub input_ms: u64,
    /// The guest's run, from instantiation to its exit (waiting for a free instance included).
    #[serde(default)]
    pub run_ms: u64,
    /// Uploading the outputs.
    #[serde(default)]
    pub output_ms: u64,
}

impl Phases {
    /// No phase recorded (an older EP, a run refused before it started).
    pub fn is_unset(&self) -> bool {
        *self == Phases::default()
    }

    /// Each phase at most `wall_ms`, and together at most `wall_ms`: what an EP reports beyond
    /// its own run's wall time is cut, the later phases first.
    pub fn clamped(self, wall_ms: u64) -> Phases {
        let mut left = wall_ms;
        let mut take = |ms: u64| {
            let t = ms.min(left);
            left -= t;
            t
        };
        Phases {
            module_ms: take(self.module_ms),
            compile_ms: take(self.compile_ms),
            input_ms: take(self.input_ms),
            run_ms: take(self.run_ms),
            output_ms: take(self.output_ms),
        }
    }

    /// The phases in order, with their names (what `htfaas trace` prints).
    pub fn named(&self) -> [(&'static str, u64); 5] {
        [
            ("fetch module", self.module_ms),
            ("compile or load", self.compile_ms),
            ("fetch input", self.input_ms),
            ("run", self.run_ms),
            ("upload outputs", self.output_ms),
        ]
    }
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
    /// The sha256 (hex) of the input as the EP read it, once read whole: recorded with the run
    /// (`job.finished`), so that the file's outputs can be re-derived from the same bytes
    /// ([`super::rerun`]). Absent before the input was read (and from older EPs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_sha256: Option<String>,
    /// The reference files as the EP read them, in the assignment's order (once each was read
    /// whole): recorded with the run, so that its lineage names every file it read. Absent on
    /// the wire when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refs: Vec<ReferenceRead>,
    /// What the attempt did with its checkpoint (a job that keeps checkpoints): what it started
    /// from and what it stored. Absent on the wire when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<crate::checkpoint::CheckpointReport>,
}

/// One reference file as a job read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceRead {
    /// Its path below `/input/ref/` (the assignment's [`super::ReferenceInput::path`]).
    pub path: String,
    /// Bytes read.
    pub size: u64,
    /// sha256 of the bytes read, hex.
    pub sha256: String,
}

impl JobReport {
    /// The report of a job that never started: [`Outcome::Cancelled`] with `reason`, nothing
    /// used, read or written.
    pub fn unstarted(job_id: String, reason: String) -> JobReport {
        JobReport {
            job_id,
            outcome: Outcome::Cancelled { reason },
            usage: Usage::default(),
            outputs: Vec::new(),
            log: String::new(),
            input_sha256: None,
            refs: Vec::new(),
            checkpoint: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_hold_one_message_or_an_array_only_within_the_extension() {
        let msgs = vec![EpMsg::Draining, EpMsg::NotStarted { job_id: "j".into(), reason: "r".into() }];
        let one = encode_frame(&msgs[..1]).expect("encodes");
        assert_eq!(one, r#"{"type":"draining"}"#);
        let many = encode_frame(&msgs).expect("encodes");
        assert!(many.starts_with('['), "{many}");
        assert_eq!(decode_frame::<EpMsg>(&one, false).expect("one"), msgs[..1].to_vec());
        assert_eq!(decode_frame::<EpMsg>(&many, true).expect("array"), msgs);
        assert!(matches!(decode_frame::<EpMsg>(&many, false), Err(FrameError::Array)));
        let flood = encode_frame(&vec![EpMsg::Draining; MAX_FRAME_MESSAGES + 1]).expect("encodes");
        assert!(matches!(decode_frame::<EpMsg>(&flood, true), Err(FrameError::TooMany(_))));
        assert!(matches!(decode_frame::<EpMsg>("[{\"type\":\"nope\"}]", true), Err(FrameError::Json(_))));
    }

    #[test]
    fn phases_are_cut_to_the_wall_time_later_phases_first() {
        let p = Phases { module_ms: 5, compile_ms: 10, input_ms: 20, run_ms: 1_000_000, output_ms: 7 };
        assert_eq!(p.clamped(u64::MAX), p);
        let c = p.clamped(100);
        assert_eq!(c, Phases { module_ms: 5, compile_ms: 10, input_ms: 20, run_ms: 65, output_ms: 0 });
        assert_eq!(c.named().iter().map(|(_, ms)| ms).sum::<u64>(), 100);
        assert!(Phases::default().is_unset() && !c.is_unset());
        // Absent on the wire when unset, and an old report reads as unset.
        let u = Usage::default();
        assert!(!serde_json::to_string(&u).expect("json").contains("phases"));
        let old: Usage =
            serde_json::from_str(r#"{"wall_ms":1,"cpu_ms":1,"peak_memory_bytes":1,"bytes_in":0,"bytes_out":0}"#)
                .expect("old usage");
        assert!(old.phases.is_unset());
    }

    #[test]
    fn the_extension_is_absent_on_the_wire_for_old_peers() {
        let w = SchedulerMsg::Welcome { ep_id: "e".into(), prefetch: None, attach: None };
        assert_eq!(serde_json::to_string(&w).expect("json"), r#"{"type":"welcome","ep_id":"e"}"#);
        let old: SchedulerMsg = serde_json::from_str(r#"{"type":"welcome","ep_id":"e"}"#).expect("old welcome");
        assert_eq!(old, w);
        let hello: Hello =
            serde_json::from_str(r#"{"name":"n","slots":{"cpus":1,"memory_mb":1,"runtime_s":1},"protocol":1}"#)
                .expect("old hello");
        assert_eq!(hello.prefetch, None);
    }
}
