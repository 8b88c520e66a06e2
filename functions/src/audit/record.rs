//! The record format: [`AuditRecord`], its [`AuditKind`] and [`Subject`], the canonical JSON
//! encoding and the record hash (see the parent module's documentation for the format).
//!
//! Must not know: SQLite, signing keys, the wire types or what any kind of record means.

use super::AuditError;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// Domain separation of record hashes.
const RECORD_DOMAIN: &[u8] = b"htfaas-audit-record-v1\n";

/// What a record says happened. Stored as the dotted string of [`AuditKind::as_str`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum AuditKind {
    /// `event.matched`: a storage event reached the gateway and fired functions (which, by which
    /// rule, and what became of each firing).
    EventMatched,
    /// `token.minted`: a submit or attach token was signed.
    TokenMinted,
    /// `macaroons.obtained`: the storage cut macaroons for a job.
    MacaroonsObtained,
    /// `job.accepted`: the scheduler queued a job.
    JobAccepted,
    /// `job.refused`: a submit was refused.
    JobRefused,
    /// `job.held`: a job was held (policy, retries, an admin).
    JobHeld,
    /// `job.released`: a held job was released (an admin).
    JobReleased,
    /// `job.removed`: a job was taken out of the queue (an admin, a revocation, its run time).
    JobRemoved,
    /// `job.dispatched`: a job was assigned to an EP.
    JobDispatched,
    /// `job.finished`: an EP reported a job's outcome, the input it read, the outputs it stored
    /// and its usage (or the scheduler failed the job).
    JobFinished,
    /// `attempt.lost`: a run attempt ended without a report (its EP left, fell silent, the
    /// scheduler restarted, or the Assign could not be sent).
    AttemptLost,
    /// `token.revoked`: tokens were revoked.
    TokenRevoked,
    /// `admin.action`: any other admin action.
    AdminAction,
    /// `macaroons.renewal`: a running job's macaroons were renewed, or a renewal was refused;
    /// the scheduler records the EP's request, the gateway the storage's answer.
    MacaroonsRenewal,
    /// `identity.mapped`: an identity of the site's OIDC provider became an owner (first
    /// sign-in), or its rule, groups or grants changed.
    IdentityMapped,
    /// `identity.refused`: a verified identity of the site's OIDC provider was refused (no
    /// rule, a refused mapping, an owner bound to another identity).
    IdentityRefused,
    /// `group.closed`: a collecting function's group fired (complete) or expired (its timeout
    /// passed first), with its members.
    GroupClosed,
    /// A kind this build does not know (written by a newer one).
    Other(String),
}

impl AuditKind {
    /// Every kind this build knows.
    pub const KNOWN: [AuditKind; 17] = [
        AuditKind::EventMatched,
        AuditKind::TokenMinted,
        AuditKind::MacaroonsObtained,
        AuditKind::JobAccepted,
        AuditKind::JobRefused,
        AuditKind::JobHeld,
        AuditKind::JobReleased,
        AuditKind::JobRemoved,
        AuditKind::JobDispatched,
        AuditKind::JobFinished,
        AuditKind::AttemptLost,
        AuditKind::TokenRevoked,
        AuditKind::AdminAction,
        AuditKind::MacaroonsRenewal,
        AuditKind::IdentityMapped,
        AuditKind::IdentityRefused,
        AuditKind::GroupClosed,
    ];

    /// The stored name.
    pub fn as_str(&self) -> &str {
        match self {
            AuditKind::EventMatched => "event.matched",
            AuditKind::TokenMinted => "token.minted",
            AuditKind::MacaroonsObtained => "macaroons.obtained",
            AuditKind::JobAccepted => "job.accepted",
            AuditKind::JobRefused => "job.refused",
            AuditKind::JobHeld => "job.held",
            AuditKind::JobReleased => "job.released",
            AuditKind::JobRemoved => "job.removed",
            AuditKind::JobDispatched => "job.dispatched",
            AuditKind::JobFinished => "job.finished",
            AuditKind::AttemptLost => "attempt.lost",
            AuditKind::TokenRevoked => "token.revoked",
            AuditKind::AdminAction => "admin.action",
            AuditKind::MacaroonsRenewal => "macaroons.renewal",
            AuditKind::IdentityMapped => "identity.mapped",
            AuditKind::IdentityRefused => "identity.refused",
            AuditKind::GroupClosed => "group.closed",
            AuditKind::Other(s) => s,
        }
    }
}

impl From<String> for AuditKind {
    fn from(s: String) -> AuditKind {
        AuditKind::KNOWN.iter().find(|k| k.as_str() == s).cloned().unwrap_or(AuditKind::Other(s))
    }
}

impl From<AuditKind> for String {
    fn from(k: AuditKind) -> String {
        k.as_str().to_owned()
    }
}

impl std::fmt::Display for AuditKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a record is about: the fields lineage queries index. Every field is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Subject {
    /// The scheduler's job id.
    pub job: Option<String>,
    /// The submit (or attach) token's `jti`.
    pub token_jti: Option<String>,
    /// The owner accounted for it.
    pub owner: Option<String>,
    /// The function's name.
    pub function: Option<String>,
    /// The function module's digest (`sha256:…`).
    pub digest: Option<String>,
    /// The storage event's id.
    pub event_id: Option<String>,
    /// Storage paths read or written.
    pub paths: Vec<String>,
}

/// One record of the trail. See the module documentation for the format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// [`super::RECORD_FORMAT`].
    pub format: u32,
    /// 1-based, contiguous.
    pub seq: u64,
    /// Unix ms; never less than the previous record's.
    pub time_ms: u64,
    /// The log's writer (`gateway`, `scheduler`, …).
    pub writer: String,
    /// What happened.
    pub kind: AuditKind,
    /// Who acted, when not the writer itself: an admin credential's name, an owner, an EP.
    pub actor: Option<String>,
    /// What it is about.
    pub subject: Subject,
    /// The kind's other facts; never a secret.
    pub detail: Value,
    /// The previous record's `hash`, or [`super::GENESIS_HASH`].
    pub prev_hash: String,
    /// SHA-256 of the canonical encoding without this field, hex.
    pub hash: String,
}

impl AuditRecord {
    /// The record as stored: its canonical JSON (with `hash`).
    pub fn to_stored_json(&self) -> Result<String, AuditError> {
        let value = serde_json::to_value(self).map_err(|e| AuditError::Corrupt(e.to_string()))?;
        Ok(canonical_json(&value))
    }

    /// The hash this record's content calls for (whatever its `hash` field says).
    pub fn compute_hash(&self) -> Result<String, AuditError> {
        let mut value = serde_json::to_value(self).map_err(|e| AuditError::Corrupt(e.to_string()))?;
        if let Some(obj) = value.as_object_mut() {
            obj.remove("hash");
        }
        Ok(content_hash(&value))
    }
}

/// The canonical JSON of `value`: members sorted by key bytes at every depth, no whitespace.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            // Sorted here, whatever order the map keeps (serde_json's `preserve_order` feature).
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            members.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (key, item)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
    }
}

fn write_string(s: &str, out: &mut String) {
    // serde_json's string escaping is fixed (RFC 8259 minimal, lowercase `\u00xx`).
    // It escapes only `"`, `\` and control characters: a string without them is written as is.
    if !s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        out.push('"');
        out.push_str(s);
        out.push('"');
        return;
    }
    match serde_json::to_string(s) {
        Ok(quoted) => out.push_str(&quoted),
        // Serializing a `&str` cannot fail; keep the output well-formed anyway.
        Err(_) => out.push_str("\"\""),
    }
}

#[cfg(feature = "db")]
/// Sets `record.hash` and returns the canonical JSON of the record without `hash` (what was
/// hashed) and with it (what is stored), encoding each member once: the same bytes as
/// [`canonical_json`] of the record's value with and without `hash`.
pub(super) fn encode_record(record: &mut AuditRecord) -> Result<(String, String), AuditError> {
    let quoted = |s: &str| {
        let mut out = String::with_capacity(s.len() + 2);
        write_string(s, &mut out);
        out
    };
    let subject = serde_json::to_value(&record.subject).map_err(|e| AuditError::Corrupt(e.to_string()))?;
    // In the byte order of their keys; `hash` goes between `format` and `kind`.
    let before = [
        ("actor", record.actor.as_deref().map_or_else(|| "null".to_owned(), quoted)),
        ("detail", canonical_json(&record.detail)),
        ("format", record.format.to_string()),
    ];
    let after = [
        ("kind", quoted(record.kind.as_str())),
        ("prev_hash", quoted(&record.prev_hash)),
        ("seq", record.seq.to_string()),
        ("subject", canonical_json(&subject)),
        ("time_ms", record.time_ms.to_string()),
        ("writer", quoted(&record.writer)),
    ];
    let join = |hash: Option<&str>| {
        let hash = hash.map(|h| ("hash", quoted(h)));
        let mut out = String::with_capacity(before.iter().chain(&after).map(|(_, t)| t.len() + 16).sum::<usize>() + 96);
        out.push('{');
        for (i, (key, text)) in before.iter().chain(hash.as_ref()).chain(&after).enumerate() {
            if i > 0 {
                out.push(',');
            }
            write_string(key, &mut out);
            out.push(':');
            out.push_str(text);
        }
        out.push('}');
        out
    };
    let hashed = join(None);
    let mut hasher = Sha256::new();
    hasher.update(RECORD_DOMAIN);
    hasher.update(hashed.as_bytes());
    record.hash = hex::encode(hasher.finalize());
    let stored = join(Some(&record.hash));
    Ok((hashed, stored))
}

/// Hex SHA-256 of the record domain and the canonical JSON of `value` (a record without `hash`).
pub(super) fn content_hash(value: &Value) -> String {
    let mut hasher = Sha256::new();
    hasher.update(RECORD_DOMAIN);
    hasher.update(canonical_json(value).as_bytes());
    hex::encode(hasher.finalize())
}
