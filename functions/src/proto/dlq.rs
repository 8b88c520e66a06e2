//! The dead-letter list, as the gateway's API shows it: every firing that could not
//! become a job and every job that ended failed ([`DeadLetter`]), its re-drives and its drop.
//!
//! `GET /v1/dlq[?function&since&dropped]` → `Vec<DeadLetter>`; `GET /v1/dlq/{id}` →
//! [`DeadLetter`]; `POST /v1/dlq/{id}/redrive` [`RedriveRequest`] → [`RedriveResponse`];
//! `POST /v1/dlq/{id}/drop` [`DropRequest`] → [`DeadLetter`].
//!
//! Must not know: how the list is stored, who may see an entry.

use super::events::EventRef;
use serde::{Deserialize, Serialize};

/// Why an entry is in the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeadLetterKind {
    /// The firing was refused for good: by the scheduler, the storage (macaroons), the
    /// namespace check, or it could not be read back.
    Refused,
    /// Its job ended `failed` (past its retries).
    Failed,
    /// JetStream gave up delivering the event (`max_deliver`) before a firing was committed.
    MaxDeliver,
}

impl DeadLetterKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterKind::Refused => "refused",
            DeadLetterKind::Failed => "failed",
            DeadLetterKind::MaxDeliver => "max_deliver",
        }
    }

    /// Parses [`DeadLetterKind::as_str`].
    pub fn parse(s: &str) -> Option<DeadLetterKind> {
        Some(match s {
            "refused" => DeadLetterKind::Refused,
            "failed" => DeadLetterKind::Failed,
            "max_deliver" => DeadLetterKind::MaxDeliver,
            _ => return None,
        })
    }
}

/// One entry of the dead-letter list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The entry's number.
    pub id: u64,
    /// Why it is here.
    pub kind: DeadLetterKind,
    /// The function's owner (empty when not known: an event no function could be named for).
    pub owner: String,
    /// The function (empty when not known).
    pub function: String,
    /// Its version, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    /// Its module digest, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Why it failed: the refusal's, the job's outcome's, or JetStream's.
    pub reason: String,
    /// The event.
    pub event: EventRef,
    /// The failed job, for [`DeadLetterKind::Failed`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    /// When it entered the list, Unix ms.
    pub created_ms: u64,
    /// Whether it can be re-driven (the gateway kept the function version and the event).
    pub redrivable: bool,
    /// Its re-drives, first first.
    #[serde(default)]
    pub redrives: Vec<Redrive>,
    /// Who dropped it and why, once dropped (a dropped entry leaves the list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped: Option<Dropped>,
}

/// One re-drive of an entry: a new firing of the same function version on the same event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Redrive {
    /// Its number: 1 for the first re-drive of the entry.
    pub n: u32,
    /// Who asked.
    pub by: String,
    /// When, Unix ms.
    pub at_ms: u64,
    /// The firing it made (the gateway's firing table).
    pub firing: u64,
    /// The firing's state (`pending`, `submitted`, `refused`, …; `unknown` once pruned).
    pub state: String,
    /// The job it started, once submitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
}

/// Who dropped an entry, when and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dropped {
    /// Who.
    pub by: String,
    /// Why.
    pub reason: String,
    /// When, Unix ms.
    pub at_ms: u64,
}

/// `POST /v1/dlq/{id}/redrive`. `n` names the re-drive (the entry's re-drives so far + 1):
/// a second call with the same `n` (a retry, or a concurrent caller) answers that re-drive
/// again and starts nothing. Without `n`, the next number is taken.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedriveRequest {
    /// The re-drive's number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
}

/// The answer to a [`RedriveRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedriveResponse {
    /// The entry.
    pub id: u64,
    /// The re-drive.
    pub redrive: Redrive,
    /// Whether this call made it (false: it was there already).
    pub created: bool,
}

/// `POST /v1/dlq/{id}/drop`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropRequest {
    /// Why (required, recorded).
    pub reason: String,
}

/// Most characters of a drop's reason.
pub const MAX_DROP_REASON_CHARS: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_and_an_entry_reads_back() {
        for k in [DeadLetterKind::Refused, DeadLetterKind::Failed, DeadLetterKind::MaxDeliver] {
            assert_eq!(DeadLetterKind::parse(k.as_str()), Some(k));
            assert_eq!(serde_json::to_value(k).expect("json"), serde_json::json!(k.as_str()));
        }
        let e = DeadLetter {
            id: 1,
            kind: DeadLetterKind::Failed,
            owner: "alice".into(),
            function: "f".into(),
            version: Some(1),
            digest: None,
            reason: "exit 1".into(),
            event: EventRef::new("s", "e", "/data/a"),
            job_id: Some("j".into()),
            created_ms: 5,
            redrivable: true,
            redrives: vec![Redrive {
                n: 1,
                by: "alice".into(),
                at_ms: 6,
                firing: 9,
                state: "pending".into(),
                job_id: None,
            }],
            dropped: None,
        };
        let text = serde_json::to_string(&e).expect("json");
        assert_eq!(serde_json::from_str::<DeadLetter>(&text).expect("parses"), e);
    }
}
