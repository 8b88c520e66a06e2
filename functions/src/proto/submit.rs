//! The submit conversation, gateway to scheduler: `POST /v1/jobs` with a submit token
//! ([`SubmitRequest`] → [`SubmitResponse`]), or several jobs in one `POST /v1/jobs/batch`,
//! each with its own token ([`SubmitBatch`] → [`SubmitBatchResponse`]), and what a job runs, reads and writes
//! ([`FunctionRef`], [`InputSpec`], [`OutputSpec`]).
//!
//! Must not know: the attach link, admin routes, the audit trail.

use super::events::EventRef;
use crate::digest::Digest;
use crate::on_failure::{FailedOutputs, RetryPolicy};
use crate::resources::{JobLimits, Resources};
use serde::{Deserialize, Serialize};

/// Secret environment variables of a job (name, value): serialized as a list of pairs like
/// `env`, but its `Debug` shows the names only, so a request or an assignment logged with `?`
/// shows no value.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretEnv(pub Vec<(String, String)>);

impl SecretEnv {
    /// No secret.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.0.iter().map(|(n, _)| n.as_str()).collect()
    }
}

impl std::fmt::Debug for SecretEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter().map(|(n, _)| format!("{n}=<secret>"))).finish()
    }
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
    /// Where the module bytes can be fetched (the registry's `GET /v1/modules/{digest}`, or
    /// `GET /v1/images/{digest}` for a native function).
    pub module_url: String,
    /// A native function's command; `digest` and `module_url` then name its image. Absent: a
    /// wasm module.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native: Option<NativeCode>,
}

/// What a native function runs in its image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeCode {
    /// argv: the command and its first arguments; the input's guest path and the job's `args`
    /// follow.
    pub command: Vec<String>,
    /// The command is a handler: one warm worker serves run after run over its stdin and
    /// descriptor 3 (the manifest's `handler`); its argv then holds no input path.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub handler: bool,
    /// The manifest's `vacate_s`: seconds between a stop's SIGTERM and the SIGKILL of the
    /// run's control group (the EP bounds it, [`crate::manifest::vacate_time`]). Absent when the
    /// manifest names none (the EP's default then applies) and from gateways before it; an EP
    /// before it ignores it and kills at once. Not part of [`FunctionRef::bound_digest`]: it is
    /// no code, and the token still binds the command that runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vacate_s: Option<u64>,
}

impl FunctionRef {
    /// What a submit token's `function` claim binds ([`crate::token::SubmitClaims::function`]):
    /// a wasm module's digest; for a native function the digest of its image's digest and its
    /// command together (and the handler form, when it is one), so a token for one command in
    /// an image runs no other command in it, nor the same command in the other form.
    pub fn bound_digest(&self) -> Digest {
        match &self.native {
            None => self.digest.clone(),
            Some(n) if n.handler => {
                let all = serde_json::json!({ "image": self.digest.as_str(), "command": n.command, "handler": true });
                Digest::of(all.to_string().as_bytes())
            }
            Some(n) => {
                let both = serde_json::json!({ "image": self.digest.as_str(), "command": n.command });
                Digest::of(both.to_string().as_bytes())
            }
        }
    }
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
    /// The sha256 (hex) the file's bytes must have: the EP runs nothing on other bytes
    /// ([`super::rerun::input_changed`]). Set by a re-run ([`super::rerun`]); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

impl InputSpec {
    /// The file at `url`, seen by the guest as `/input/<name>`, read with `macaroon`; no
    /// sha256 pinned (what every job but a re-run has).
    pub fn new(url: impl Into<String>, name: impl Into<String>, macaroon: impl Into<String>) -> InputSpec {
        InputSpec { url: url.into(), name: name.into(), macaroon: macaroon.into(), sha256: None }
    }
}

/// Where the job's outputs go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputSpec {
    /// Full storage URL of the output directory, ending in `/`.
    pub url: String,
    /// Write macaroon for exactly this directory (bearer; never logged).
    pub macaroon: String,
    /// What the EP does with the outputs of a run that did not succeed (the manifest's
    /// `outputs.on_failure`): nothing stored, stored under `.quarantine/<job id>/`, or stored
    /// as a success's. Absent on the wire for the default (discard); an older EP
    /// ignores it and stores a non-zero exit's outputs.
    #[serde(default, skip_serializing_if = "FailedOutputs::is_default")]
    pub on_failure: FailedOutputs,
}

impl OutputSpec {
    /// Outputs to `url` with `macaroon`, failed runs' outputs discarded.
    pub fn new(url: impl Into<String>, macaroon: impl Into<String>) -> OutputSpec {
        OutputSpec { url: url.into(), macaroon: macaroon.into(), on_failure: FailedOutputs::Discard }
    }
}

/// `POST /v1/jobs` on the scheduler, with `Authorization: Bearer <submit token>`.
/// Response: [`SubmitResponse`] (201 new, 200 when `dedupe_key` already had a job), or an
/// [`ApiError`](super::ApiError) with 401 (token), 403 (limits) or 400 (request).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// What to run.
    pub function: FunctionRef,
    /// What it needs; must fit within the token's limits.
    pub resources: Resources,
    /// Its input file; none for a run on no file (a schedule's tick with neither a path glob
    /// nor a rule: the job reads only its reference files, `event.path` is empty, and it gets
    /// no read macaroon). Absent on the wire when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<InputSpec>,
    /// Its outputs.
    pub output: OutputSpec,
    /// Arguments after the input's guest path (or after the function's name, with no input).
    #[serde(default)]
    pub args: Vec<String>,
    /// The guest's whole environment.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// The function's secrets, added to the guest's environment only: sealed in the scheduler's
    /// store, never shown by an API, never logged ([`SecretEnv`]'s `Debug` names them only).
    #[serde(default, skip_serializing_if = "SecretEnv::is_empty")]
    pub secrets: SecretEnv,
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
    /// The gateway's grant to renew this job's macaroons while it runs
    /// ([`super::renew`]): sealed in the scheduler's store with the macaroons, presented only to
    /// the gateway, never handed to an EP. Absent (a direct submitter, an older gateway):
    /// the job's macaroons are never renewed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewal: Option<super::RenewalGrant>,
    /// The function's retry policy (its manifest's), which the scheduler caps to its site's
    /// `max_guest_retries`. Absent (and from older gateways): guest failures are
    /// final, storage outages are retried by the site's rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
    /// Most runs of its function at once (the manifest's `max_concurrent`): the scheduler
    /// starts no more of the function's jobs while that many are assigned. Absent: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u32>,
    /// The reference files it reads besides its input (the manifest's `inputs.ref`), each with a
    /// read macaroon for exactly that file. Absent on the wire when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refs: Vec<ReferenceInput>,
    /// The job's own checkpoint area (the manifest asks for checkpoints), the same for every
    /// attempt; absent on the wire when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<crate::checkpoint::CheckpointSpec>,
}

/// Most reference files one job may read (a directory reference counts each file below it).
pub const MAX_REFERENCE_FILES: usize = 256;

/// One reference file of a job: read-only, seen by the guest as `/input/ref/<path>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceInput {
    /// Full storage URL of the file.
    pub url: String,
    /// Its path below `/input/ref/` in the guest: its storage path without the leading `/`
    /// (`data/calib/pedestals-v3.h5`), clean relative segments only.
    pub path: String,
    /// Read macaroon for exactly this file (bearer; never logged).
    pub macaroon: String,
    /// The sha256 (hex) the file's bytes must have: the EP runs nothing on other bytes. Set by a
    /// re-run (the constants the run it re-derives read); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

impl ReferenceInput {
    /// Whether `path` may name a file below `/input/ref/`: relative, 1-4096 bytes, no empty,
    /// `.` or `..` segment, no NUL or backslash.
    pub fn is_clean_path(path: &str) -> bool {
        !path.is_empty()
            && path.len() <= 4096
            && !path.starts_with('/')
            && !path.contains(['\0', '\\'])
            && path.split('/').all(|s| !s.is_empty() && s != "." && s != "..")
    }
}

/// Answer to [`SubmitRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitResponse {
    /// The job's id.
    pub job_id: String,
    /// False when the dedupe key already named a job.
    pub created: bool,
}

/// Most jobs in one [`SubmitBatch`].
pub const MAX_SUBMIT_BATCH: usize = 64;

/// Largest body of a [`SubmitBatch`], bytes (a sender puts a job that would pass it into the
/// next batch).
pub const MAX_SUBMIT_BATCH_BYTES: usize = 1024 * 1024;

/// `POST /v1/jobs/batch` on the scheduler: up to [`MAX_SUBMIT_BATCH`] jobs, each with the
/// submit token that allows exactly it. Each is checked as `POST /v1/jobs` checks one (its
/// token, revocation, request, trust, policy, limits) and answered on its own; those accepted
/// are stored in one transaction. The request itself carries no credential of its own: what
/// a job may do is its token's alone.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubmitBatch {
    /// The jobs, in order.
    pub jobs: Vec<BatchJob>,
}

/// One job of a [`SubmitBatch`].
#[derive(Clone, Serialize, Deserialize)]
pub struct BatchJob {
    /// The submit token allowing exactly this job (what `Authorization: Bearer` carries for
    /// a single submit).
    pub token: String,
    /// The job.
    pub request: SubmitRequest,
}

// The token is a credential: a batch logged with `?` does not show it.
impl std::fmt::Debug for BatchJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchJob").field("token", &"<redacted>").field("request", &self.request).finish()
    }
}

/// Answer to [`SubmitBatch`]: one [`BatchAnswer`] per job, in the batch's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitBatchResponse {
    /// Each job's answer.
    pub results: Vec<BatchAnswer>,
}

/// What became of one job of a batch: the HTTP status `POST /v1/jobs` would have answered
/// (201 created, 200 a dedupe hit, else a refusal or a failure), with the job or the reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchAnswer {
    /// The status a single submit would have had.
    pub status: u16,
    /// The job, when it was stored (or already was).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<SubmitResponse>,
    /// Why not, otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `POST /v1/modules/warm` on the scheduler, with `Authorization: Bearer <submit
/// token>` whose `function` claim is `digest` (no use of the token is counted): the module of a
/// function just registered (or still registered, said again now and then), for the attached
/// EPs to fetch and compile ahead of its first job. The scheduler checks `module_url` as it
/// checks a job's (a module store's URL for `digest`), keeps the module in its warm list and
/// sends each EP that may run the token's owner's jobs a
/// [`SchedulerMsg::Warm`](super::SchedulerMsg::Warm), now and when an EP attaches later.
/// Response: [`WarmResponse`], or an [`ApiError`](super::ApiError) with 401 (token), 403
/// (revoked token, a digest the token does not name, a URL no module store has) or 400.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmRequest {
    /// The module's digest.
    pub digest: Digest,
    /// Where EPs fetch it (the registry's `GET /v1/modules/{digest}`).
    pub module_url: String,
}

/// Answer to [`WarmRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmResponse {
    /// EPs told now (0 when the module was already on the warm list: they were told before).
    pub eps: u32,
    /// Whether the module was new to the warm list.
    pub new: bool,
}
