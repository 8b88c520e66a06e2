//! The scheduler's admin API: EPs (state, drain, listing), fair-share priorities, token
//! revocations and accounting.
//!
//! Must not know: the attach link's messages, the gateway's API, the audit trail.

use crate::resources::Resources;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
    /// by [`JobState::as_str`](super::JobState::as_str); states with no job are left out.
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
