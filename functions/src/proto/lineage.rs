//! The gateway's audit routes: which trail a route reads ([`AuditTrail`]) and the lineage of a
//! file ([`LineageQuery`] → [`Lineage`]), whose steps carry [`crate::audit::AuditRecord`]s.
//!
//! Must not know: how records are stored, chained or verified (the audit module's).

use super::events::Cause;
use crate::audit::AuditRecord;
use serde::{Deserialize, Serialize};

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
    /// read it), then, one depth further each, the job that wrote the input (or a reference
    /// file) of a job before.
    pub steps: Vec<LineageStep>,
    /// The walk stopped at the depth or step limit with more to follow.
    #[serde(default)]
    pub truncated: bool,
}

/// A reference file a job of a [`Lineage`] read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineageRef {
    /// Its storage path.
    pub path: String,
    /// The sha256 of the bytes the job read, hex.
    pub sha256: String,
}

/// How a job of a lineage relates to its step's file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LineageRelation {
    /// The job wrote the file (one of its outputs).
    Wrote,
    /// The job read the file (its input, or one of its reference files).
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
    /// The reference files the job read besides its input, each with the sha256 it read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refs: Vec<LineageRef>,
    /// The identifiers of the job's macaroons (read, write), never the macaroons.
    pub macaroons: Vec<String>,
    /// The job's records of both trails, in time order (`writer` says which trail).
    pub records: Vec<AuditRecord>,
}
