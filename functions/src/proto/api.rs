//! The gateway's HTTP API: what `htfaas` (src/client.rs) and the tests send and read
//! (modules, runs, replays, registration, tests of triggers, stats). The logic behind these
//! types (windows, plans, time parsing, the counters) stays in the gateway.
//!
//! Must not know: the scheduler's routes, the attach link, the audit trail.

use super::jobs::JobRecord;
use crate::digest::Digest;
use serde::{Deserialize, Serialize};

/// Answer to `POST /v1/modules` (admin; the body is the wasm bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleUploaded {
    /// The module's content digest, under which the registry keeps it.
    pub digest: Digest,
}

/// An image as `GET /v1/images` and `GET /v1/images/{digest}/info` tell it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageInfo {
    /// Its content digest.
    pub digest: Digest,
    /// Its size, bytes.
    pub size: u64,
    /// When it was first stored, Unix seconds.
    pub stored_at: u64,
    /// The asking owner's tags for it.
    #[serde(default)]
    pub tags: Vec<String>,
    /// The function versions that name it (`name@version`), every owner's: such an image is
    /// kept.
    #[serde(default)]
    pub used_by: Vec<String>,
}

/// Query of `POST /v1/images`: the tag the uploader names the image by.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageQuery {
    /// A name of the uploader's for it (a function name's syntax), moved to it from any
    /// image it named before.
    #[serde(default)]
    pub tag: Option<String>,
}

/// Body of `POST /v1/functions/{name}/runs`, with `Authorization: Bearer <submit token>`.
/// Answer: [`SubmitResponse`](super::SubmitResponse) (201).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// Storage path of the input file; it must match the function's trigger.
    pub path: String,
    /// Run on this annex. Allowed only when the function names none or the same one.
    #[serde(default)]
    pub annex: Option<String>,
}

/// Longest a direct invocation waits for its job to end ([`InvokeRequest::wait_s`]).
pub const MAX_INVOKE_WAIT_S: u64 = 300;

/// `POST /v1/functions/{name}/invoke`: the caller (an API or OIDC token) runs a registered
/// function on a file of its own namespace, as a manual run does, and may wait for the answer.
/// Answer: [`InvokeResponse`] (200 when the job ended within the wait, 202 otherwise).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InvokeRequest {
    /// Storage path of the input file; it must match the function's trigger.
    pub path: String,
    /// Run on this annex. Allowed only when the function names none or the same one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annex: Option<String>,
    /// Seconds to wait for the job to end, at most [`MAX_INVOKE_WAIT_S`]; 0 (the default):
    /// answer as soon as the scheduler holds the job.
    #[serde(default)]
    pub wait_s: u64,
}

/// Answer to [`InvokeRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvokeResponse {
    /// The job's id.
    pub job_id: String,
    /// The job as it ended (outcome, exit code, outputs' paths), when it ended within the
    /// wait; absent otherwise (`GET /v1/jobs/{id}` follows it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobRecord>,
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

/// Answer of `GET /v1/whoami`: who the request's credential acts as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WhoAmI {
    /// The owner an API token acts as (its `sub`), or `admin` for the admin token.
    pub name: String,
    /// `developer` or `admin`.
    pub scope: String,
    /// For a token of the site's OIDC provider: who it is and what the identity map made of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<MappedIdentity>,
}

/// A signed-in identity of the site's OIDC provider, as [`WhoAmI`] shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MappedIdentity {
    /// The token's issuer.
    pub issuer: String,
    /// Its `sub`.
    pub sub: String,
    /// The identity map's rule that matched.
    pub rule: String,
    /// The accounting groups the owner may charge.
    pub groups: Vec<String>,
    /// The token's WLCG scopes, when it has a `scope` claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scopes: Option<Vec<String>>,
}

/// What a file credential is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileAccess {
    /// Download the file.
    Read,
    /// Upload new files into the file's directory.
    Write,
}

/// Body of `POST /v1/files/credential`: a storage credential for one file of the caller's
/// namespace, for a client that holds an API token and no storage password.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileCredentialRequest {
    /// The storage path (clean, absolute).
    pub path: String,
    /// Read or write.
    pub access: FileAccess,
}

/// Answer of `POST /v1/files/credential`: the file's URL on the storage and a macaroon limited
/// to that file (read) or to new files in its directory (write), sent as `Authorization:
/// Bearer <macaroon>`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileCredential {
    /// The file's URL on the storage.
    pub url: String,
    /// The macaroon (a secret).
    pub macaroon: String,
}

impl std::fmt::Debug for FileCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileCredential").field("url", &self.url).finish_non_exhaustive()
    }
}

/// Answer of `PUT` and `GET /v1/functions/{name}/secrets`: the names of the function's secrets,
/// never their values. (The `PUT` body is a JSON object, name to value.)
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretNames {
    /// Names, sorted.
    pub names: Vec<String>,
}

/// Body of `POST /v1/functions/{name}/pin`: the version that fires from now on (a rollback),
/// or `null` for the latest again. Answer: the function's status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinRequest {
    /// The version to pin; `None`: follow the latest.
    pub version: Option<u32>,
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
    /// A collecting function's group the file joins (its key); a replay fires the file alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
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
    /// A collecting function's file then joins its group ([`TestReport::group`]).
    pub fires: bool,
    /// A collecting function's group the file would join, as it stands now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<GroupReport>,
}

/// The group a file would join ([`TestReport::group`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupReport {
    /// The group's key: its directory.
    pub key: String,
    /// Its files so far (none: the file would open it).
    pub members: Vec<String>,
    /// Whether this file completes it (its count or marker); a quiet period completes by the
    /// clock only.
    pub completes: bool,
    /// What it still waits for after this file, in words (none when it completes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing: Option<String>,
    /// Why the file would be kept out of it, if it would (another writer's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// `GET /v1/stats/history` (admin): the gateway's ingest counters as it sampled them every
/// `interval_ms` for up to an hour (kept in memory: a restarted gateway starts a new history),
/// oldest first, so a chart of the event flow starts full rather than from when it was opened.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StatsHistory {
    /// Milliseconds between samples.
    pub interval_ms: u64,
    /// The samples, oldest first.
    pub samples: Vec<StatsSample>,
}

/// One sample of [`StatsHistory`]: counters as in [`StatsSnapshot`], monotonic since the
/// gateway started.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct StatsSample {
    /// When, Unix ms.
    pub at_ms: u64,
    /// [`StatsSnapshot::events_received`].
    pub events_received: u64,
    /// [`StatsSnapshot::firings_queued`].
    pub firings_queued: u64,
    /// Events that fired nothing: [`StatsSnapshot::events_ignored`], `events_not_enabled`,
    /// `events_unmatched`, `events_malformed` and `events_duplicate` together.
    pub events_ignored: u64,
    /// [`StatsSnapshot::jobs_submitted`].
    pub jobs_submitted: u64,
}

impl StatsSample {
    /// The sample of `s` at `at_ms`.
    pub fn of(at_ms: u64, s: &StatsSnapshot) -> StatsSample {
        StatsSample {
            at_ms,
            events_received: s.events_received,
            firings_queued: s.firings_queued,
            events_ignored: s.events_ignored
                + s.events_not_enabled
                + s.events_unmatched
                + s.events_malformed
                + s.events_duplicate,
            jobs_submitted: s.jobs_submitted,
        }
    }
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
    /// Events that matched only disabled functions: nothing fired (`htfaas fn disable`).
    #[serde(default)]
    pub events_disabled: u64,
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
    /// Functions an event matched that were disabled: counted, not fired.
    #[serde(default)]
    pub firings_disabled: u64,
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
    /// Gauge: messages JetStream holds for the gateway's ingest lanes (the default lane and
    /// each owner's) not yet acked, summed over the lanes (a message two lanes read counts
    /// twice); read from JetStream at each request. 0 once every event published so far that
    /// any lane reads has been decided (a path-subject message no owner's lane reads is
    /// never read: no function could fire on it).
    #[serde(default)]
    pub events_pending: u64,
}
