//! The storage-event conversation: the NATS stream and subjects that carry storage events,
//! dCache's billing message ([`TransferMessage`]), and how a job names the event that caused it
//! ([`EventRef`], [`Cause`]).
//!
//! Must not know: trigger rules, jobs beyond their provenance, the audit trail.

use crate::digest::Digest;
use serde::{Deserialize, Serialize};

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
