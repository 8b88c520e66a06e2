//! Back-fill: firing a function on the files of a storage directory that never fired
//! it — for events lost before they reached the stream (a bridge that was down, a stream past
//! its retention). `POST /v1/events/backfill` on the gateway ([`BackfillRequest`] →
//! [`BackfillReport`]); the gateway asks the scheduler which files already have a job of the
//! function (`POST /v1/fired`, [`FiredQuery`] → [`FiredPaths`]).
//!
//! Must not know: how the storage is listed, how firings are stored.

use serde::{Deserialize, Serialize};

/// Most paths one [`FiredQuery`] may name.
pub const MAX_FIRED_QUERY: usize = 1000;
/// The default of [`BackfillRequest::min_age_s`]: files younger than this may still have their
/// event on the way, and are left for it.
pub const DEFAULT_BACKFILL_MIN_AGE_S: u64 = 600;

/// `POST /v1/events/backfill` (a developer: its own function). Response: [`BackfillReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackfillRequest {
    /// The function (its live version fires).
    pub function: String,
    /// The directory whose tree is listed: a clean absolute path in the owner's read namespace.
    pub prefix: String,
    /// List what would fire, fire nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Leave files modified less than this many seconds ago (their event may be on the way;
    /// default [`DEFAULT_BACKFILL_MIN_AGE_S`]).
    #[serde(default)]
    pub min_age_s: Option<u64>,
}

/// What a back-fill found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackfillReport {
    /// The function and the version that fired.
    pub function: String,
    /// Its version.
    pub version: u32,
    /// The directory listed (ending in `/`).
    pub prefix: String,
    /// Whether nothing was fired.
    pub dry_run: bool,
    /// Files listed.
    pub listed: u64,
    /// Files the trigger fires on (outside the function's own outputs, quarantine and re-run
    /// directories).
    pub matched: u64,
    /// Of those, files the function had fired on already (a job, or a firing on its way).
    pub already: u64,
    /// Of those, files left because they are younger than the minimum age.
    pub too_recent: u64,
    /// Files fired on (or, in a dry run, that would be): at most 1000 listed.
    pub fired: Vec<String>,
    /// How many were fired (or would be), whether listed or not.
    pub fired_count: u64,
    /// Whether the listing stopped at its bound before the whole tree was read.
    pub truncated: bool,
}

/// `POST /v1/fired` on the scheduler (admin): which of `paths` has a job of `function` of
/// `owner`, whatever its state. At most [`MAX_FIRED_QUERY`] paths. Response: [`FiredPaths`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FiredQuery {
    /// The owner.
    pub owner: String,
    /// The function's name.
    pub function: String,
    /// Input paths.
    pub paths: Vec<String>,
}

/// The paths of a [`FiredQuery`] that have a job, in the query's order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FiredPaths {
    /// Those paths.
    pub paths: Vec<String>,
}
