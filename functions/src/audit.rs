// Long because it holds record format, signing, store and verifier of the trail (split: record, sign, store, verify); kept whole until issue 19 splits it along its layers.
//! The audit trail: an append-only, hash-chained record of every decision a writer (the
//! gateway, the scheduler) makes, with signed checkpoints, lineage queries and a verifier that
//! names the first record that was altered, removed, reordered or inserted.
//!
//! This is a **stored, security-relevant format**: a change to anything below breaks the
//! verification of every trail already written. Change it only with a new format number.
//!
//! # Records
//!
//! Each writer owns one log (one chain) in one SQLite database (its own file, or its component's). A record ([`AuditRecord`]) is
//! `{format, seq, time_ms, writer, kind, actor, subject, detail, prev_hash, hash}`:
//! - `format` is [`RECORD_FORMAT`] (1);
//! - `seq` counts from 1 without gaps; `time_ms` is Unix milliseconds, never smaller than the
//!   previous record's (a clock stepping back repeats the last time);
//! - `kind` is an [`AuditKind`], stored as a dotted string (`job.accepted`);
//! - `actor` is who acted, when it is not the writer itself (an admin credential's name, an
//!   owner, an EP);
//! - `subject` ([`Subject`]) holds what lineage queries index: job id, token `jti`, owner,
//!   function name, module digest, event id, storage paths; every field may be `null`;
//! - `detail` holds the kind's other facts (see [`AuditDraft`]'s constructors for each kind);
//! - `prev_hash` is the previous record's `hash`; record 1 has [`GENESIS_HASH`] (64 zeros);
//! - `hash` is the record's own hash, defined next.
//!
//! **Secrets never enter a record.** The typed constructors take claims, identifiers and
//! caveats, never an encoded token or a bearer macaroon ([`MacaroonFacts::from_bearer`] keeps
//! the identifier and caveats and drops the rest). As a second line, every append
//! replaces any string of a draft that parses as a JWT/JWS or a macaroon, or starts with
//! `Bearer `, by `[redacted: bearer credential]` (and logs a warning).
//!
//! # Canonical encoding and hash
//!
//! `hash` = lowercase hex of SHA-256( `"htfaas-audit-record-v1\n"` ‖ C ), where C is the
//! canonical JSON of the record as a JSON object **without** its `hash` member:
//! - objects at every depth have their members sorted by the UTF-8 bytes of their keys;
//! - no whitespace anywhere;
//! - strings are written as `serde_json` writes them: `"` and `\` escaped, control characters
//!   as `\b \f \n \r \t` or `\u00xx` (lowercase hex), everything else as raw UTF-8;
//! - numbers as `serde_json` writes them: integers in decimal (by convention records hold only
//!   integers), a float in its shortest round-trip form;
//! - absent optional fields are present as `null`; `subject.paths` is always an array.
//!
//! The stored text of a record is the canonical JSON of the whole record (with `hash`). The
//! verifier hashes the stored text's JSON value, so a member added to a stored record changes
//! its hash too. See the `canonical_encoding_is_pinned` test for a golden value.
//!
//! # Checkpoints
//!
//! With a signing key, the writer signs a [`Checkpoint`] `{writer, seq, hash, time_ms, kid,
//! signature}` every [`CheckpointPolicy::every_records`] records or, at the next append, once
//! [`CheckpointPolicy::every_ms`] have passed (and when the service calls
//! [`AuditLog::checkpoint_now`] or [`checkpoint_in`], e.g. on a timer and at shutdown); an
//! [`AuditLog`] signs in the same transaction as the record it names. The signature is Ed25519 (hex, 128 digits) over
//! `"htfaas-audit-checkpoint-v1\0"` ‖ u32 BE length of `writer` ‖ `writer` ‖ u64 BE `seq` ‖ the
//! 32 bytes of `hash` ‖ u64 BE `time_ms`. Keys are the same PKCS#8 Ed25519 keys and JWKS
//! documents as [`crate::token`]'s; verifiers look them up by `kid` ([`keys_from_jwks`]).
//! Records after the last checkpoint are protected by the chain only: removing them, or
//! rewriting them with recomputed hashes, is only detectable once a later checkpoint exists
//! (the [`VerifyReport`] says how many such records there are).
//!
//! # Storage
//!
//! SQLite tables with an `audit_` prefix, so that a log can live **inside another component's
//! database** and be written in the same transaction as the decision it records (no extra
//! fsync; never a decision without its record, nor a record without its decision):
//! [`install`] creates or migrates them in any database, [`append_in`] appends inside the
//! caller's transaction, [`checkpoint_in`] signs the head on a connection. [`AuditLog::open`]
//! is the same on a file of its own (WAL, `synchronous=FULL`: a returned `append` is on disk).
//!
//! The audit schema has its own version, [`SCHEMA_VERSION`], kept in `audit_meta`
//! (`schema_version`; `PRAGMA user_version` belongs to the host database and is never
//! touched), and stepwise [`MIGRATIONS`]. Tables: `audit_meta` (the writer's name and the
//! schema version), `audit_records` (`seq` primary key, the stored JSON text, and copies of
//! `time_ms`, `kind`, the subject fields and `hash` as indexed columns for queries and
//! appends), `audit_record_paths` (`path`, `seq`) and `audit_checkpoints` (`seq`, `time_ms`,
//! JSON text). Triggers refuse `UPDATE` and `DELETE` on the last three, so a bug cannot
//! rewrite history; they do not stop someone with the file, which is what the chain and the
//! signatures are for. [`verify`] and [`query`] work on any file that holds the tables (a
//! standalone log or, say, the scheduler's queue); [`verify`] reads only the JSON texts and
//! never trusts the copied columns.
//!
//! One database holds one chain, of one writer (`audit_meta`'s `writer`).
//!
//! Calls block on disk; async callers clone the [`AuditLog`] (a cheap handle) into
//! `spawn_blocking`.

pub mod anchor;

use crate::manifest::Resources;
use crate::proto::{Outcome, OutputFile, Revocation, RevocationTarget, Usage};
use crate::token::{AttachClaims, SubmitClaims};
use base64::Engine as _;
use ed25519_dalek::pkcs8::DecodePrivateKey as _;
use ed25519_dalek::{Signer as _, VerifyingKey};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags, OptionalExtension as _, TransactionBehavior, params};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest as _, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The SQLite binding of [`install`], [`append_in`] and [`checkpoint_in`], for callers that
/// must name its types (the same version as this crate's).
pub use rusqlite;

/// The record format this build writes and verifies.
pub const RECORD_FORMAT: u32 = 1;
/// `prev_hash` of record 1.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// Domain separation of record hashes.
const RECORD_DOMAIN: &[u8] = b"htfaas-audit-record-v1\n";
/// Domain separation of checkpoint signatures.
const CHECKPOINT_DOMAIN: &[u8] = b"htfaas-audit-checkpoint-v1\0";
/// What a bearer credential found in a draft is replaced by.
pub const REDACTED: &str = "[redacted: bearer credential]";

/// Version of the audit tables written by this build (`audit_meta`'s `schema_version`).
pub const SCHEMA_VERSION: i64 = 1;
/// `MIGRATIONS[i]` brings the audit tables from version i to i + 1 (`audit_meta` itself is
/// made by [`install`] before they run).
pub const MIGRATIONS: &[&str] = &[
    // 0 → 1: the first schema.
    "CREATE TABLE audit_records (
         seq INTEGER PRIMARY KEY,
         time_ms INTEGER NOT NULL,
         kind TEXT NOT NULL,
         job TEXT, token_jti TEXT, owner TEXT, function TEXT, digest TEXT, event_id TEXT,
         hash TEXT NOT NULL,
         json TEXT NOT NULL);
     CREATE INDEX audit_records_by_time ON audit_records (time_ms);
     CREATE INDEX audit_records_by_job ON audit_records (job) WHERE job IS NOT NULL;
     CREATE INDEX audit_records_by_token ON audit_records (token_jti) WHERE token_jti IS NOT NULL;
     CREATE INDEX audit_records_by_owner ON audit_records (owner) WHERE owner IS NOT NULL;
     CREATE INDEX audit_records_by_function ON audit_records (function) WHERE function IS NOT NULL;
     CREATE INDEX audit_records_by_event ON audit_records (event_id) WHERE event_id IS NOT NULL;
     CREATE TABLE audit_record_paths (path TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (path, seq))
         WITHOUT ROWID;
     CREATE TABLE audit_checkpoints (seq INTEGER PRIMARY KEY, time_ms INTEGER NOT NULL, json TEXT NOT NULL);
     CREATE TRIGGER audit_records_append_only_u BEFORE UPDATE ON audit_records
         BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END;
     CREATE TRIGGER audit_records_append_only_d BEFORE DELETE ON audit_records
         BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END;
     CREATE TRIGGER audit_record_paths_append_only_u BEFORE UPDATE ON audit_record_paths
         BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END;
     CREATE TRIGGER audit_record_paths_append_only_d BEFORE DELETE ON audit_record_paths
         BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END;
     CREATE TRIGGER audit_checkpoints_append_only_u BEFORE UPDATE ON audit_checkpoints
         BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END;
     CREATE TRIGGER audit_checkpoints_append_only_d BEFORE DELETE ON audit_checkpoints
         BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END;",
];

/// How long a call waits for another connection's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why an audit call failed. A damaged trail is not an error of [`verify`]: it is its answer.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// SQLite failed, or the file is not a database.
    #[error("audit log database: {0}")]
    Db(#[from] rusqlite::Error),
    /// The file is of a newer schema than this build.
    #[error("audit log schema {found} is newer than this build's {supported}")]
    SchemaTooNew {
        /// `audit_meta`'s `schema_version` in the file.
        found: i64,
        /// [`SCHEMA_VERSION`].
        supported: i64,
    },
    /// The file is a database, but not an audit log.
    #[error("not an audit log: {0}")]
    NotALog(String),
    /// The log belongs to another writer.
    #[error("audit log belongs to writer {found:?}, not {expected:?}")]
    WrongWriter {
        /// The writer the file names.
        found: String,
        /// The writer that opened it.
        expected: String,
    },
    /// A writer name must be 1 to 64 of `A-Z a-z 0-9 . _ -`.
    #[error("invalid audit writer name {0:?}")]
    BadWriter(String),
    /// A stored record did not parse (queries; [`verify`] reports it as a problem instead).
    #[error("corrupt audit record: {0}")]
    Corrupt(String),
    /// Key material could not be read, made or used.
    #[error("audit key: {0}")]
    Key(String),
    /// A helper was handed a bearer credential where an identifier belongs.
    #[error("refused to record a bearer credential as {0}")]
    Secret(&'static str),
    /// A bearer macaroon did not parse.
    #[error("macaroon: {0}")]
    Macaroon(String),
}

// ---------------------------------------------------------------------------------------------
// Records
// ---------------------------------------------------------------------------------------------

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
    /// A kind this build does not know (written by a newer one).
    Other(String),
}

impl AuditKind {
    /// Every kind this build knows.
    pub const KNOWN: [AuditKind; 13] = [
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
    /// [`RECORD_FORMAT`].
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
    /// The previous record's `hash`, or [`GENESIS_HASH`].
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

/// Sets `record.hash` and returns the canonical JSON of the record without `hash` (what was
/// hashed) and with it (what is stored), encoding each member once: the same bytes as
/// [`canonical_json`] of the record's value with and without `hash`.
fn encode_record(record: &mut AuditRecord) -> Result<(String, String), AuditError> {
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
fn content_hash(value: &Value) -> String {
    let mut hasher = Sha256::new();
    hasher.update(RECORD_DOMAIN);
    hasher.update(canonical_json(value).as_bytes());
    hex::encode(hasher.finalize())
}

// ---------------------------------------------------------------------------------------------
// Drafts: what callers hand to `append`
// ---------------------------------------------------------------------------------------------

/// A record before the log numbers, times and chains it. Build it with the constructor of its
/// kind; each documents what goes into `detail`. No constructor takes a credential.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditDraft {
    kind: AuditKind,
    actor: Option<String>,
    subject: Subject,
    detail: Value,
}

/// The facts of one macaroon worth keeping: never the bearer string itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MacaroonFacts {
    /// What it is for: `read` (the input) or `write` (the output directory).
    pub role: String,
    /// Its identifier (not a secret: it names the macaroon, it does not grant anything).
    pub identifier: String,
    /// Its first-party caveats (`path:…`, `activity:…`, `before:…`, …).
    pub caveats: Vec<String>,
}

impl MacaroonFacts {
    /// Keeps the identifier and caveats of the serialized macaroon `bearer`, and nothing else.
    pub fn from_bearer(role: &str, bearer: &str) -> Result<MacaroonFacts, AuditError> {
        let identifier = crate::macaroon::identifier(bearer).map_err(|e| AuditError::Macaroon(e.to_string()))?;
        let caveats = crate::macaroon::inspect(bearer).map_err(|e| AuditError::Macaroon(e.to_string()))?;
        MacaroonFacts::new(role, &identifier, caveats)
    }

    /// Facts given piecewise; refuses a bearer credential in any of them.
    pub fn new(role: &str, identifier: &str, caveats: Vec<String>) -> Result<MacaroonFacts, AuditError> {
        if looks_like_bearer(role) {
            return Err(AuditError::Secret("a macaroon's role"));
        }
        if looks_like_bearer(identifier) {
            return Err(AuditError::Secret("a macaroon identifier"));
        }
        if caveats.iter().any(|c| looks_like_bearer(c)) {
            return Err(AuditError::Secret("a macaroon caveat"));
        }
        Ok(MacaroonFacts { role: role.to_owned(), identifier: identifier.to_owned(), caveats })
    }
}

fn opt(s: &Option<String>) -> Value {
    s.as_ref().map_or(Value::Null, |s| Value::String(s.clone()))
}

impl AuditDraft {
    /// Any kind, with free-form `detail`. Prefer the typed constructors; bearer credentials
    /// anywhere in the draft are redacted when it is appended.
    pub fn new(kind: AuditKind, subject: Subject, detail: Value) -> AuditDraft {
        AuditDraft { kind, actor: None, subject, detail }
    }

    /// Says who acted.
    pub fn with_actor(mut self, actor: impl Into<String>) -> AuditDraft {
        self.actor = Some(actor.into());
        self
    }

    /// Adds `key: value` to the detail (an object; any other detail is kept under `detail`).
    pub fn with_detail(mut self, key: &str, value: Value) -> AuditDraft {
        if !self.detail.is_object() {
            let old = std::mem::take(&mut self.detail);
            let mut map = Map::new();
            if !old.is_null() {
                map.insert("detail".into(), old);
            }
            self.detail = Value::Object(map);
        }
        if let Value::Object(map) = &mut self.detail {
            map.insert(key.to_owned(), value);
        }
        self
    }

    /// The kind.
    pub fn kind(&self) -> &AuditKind {
        &self.kind
    }

    /// `token.minted` for a submit token, from its claims (the signed token is never seen).
    /// Subject: `jti`, owner (`sub`), digest (the `function` claim). Detail: `{type: "submit",
    /// iss, aud, iat, exp, jobs, cpus, memory_mb, runtime_s, group}`. `subject` adds what the
    /// caller knows (event id, function name).
    pub fn token_minted(claims: &SubmitClaims, subject: Subject) -> AuditDraft {
        let subject = Subject {
            token_jti: Some(claims.jti.clone()),
            owner: Some(claims.sub.clone()),
            digest: claims.function.as_ref().map(|d| d.as_str().to_owned()).or(subject.digest.clone()),
            ..subject
        };
        let detail = serde_json::json!({
            "type": "submit", "iss": claims.iss, "aud": claims.aud, "iat": claims.iat, "exp": claims.exp,
            "jobs": claims.jobs, "cpus": claims.cpus, "memory_mb": claims.memory_mb,
            "runtime_s": claims.runtime_s, "group": opt(&claims.group),
        });
        AuditDraft::new(AuditKind::TokenMinted, subject, detail)
    }

    /// `token.minted` for an attach token. Subject: `jti`, owner (the EP's `owner` claim).
    /// Detail: `{type: "attach", iss, sub, aud, iat, exp, annex}`.
    pub fn attach_token_minted(claims: &AttachClaims) -> AuditDraft {
        let subject =
            Subject { token_jti: Some(claims.jti.clone()), owner: claims.owner.clone(), ..Subject::default() };
        let detail = serde_json::json!({
            "type": "attach", "iss": claims.iss, "sub": claims.sub, "aud": claims.aud,
            "iat": claims.iat, "exp": claims.exp, "annex": opt(&claims.annex),
        });
        AuditDraft::new(AuditKind::TokenMinted, subject, detail)
    }

    /// `macaroons.obtained`. Subject: as the caller knows it (event, function, owner, token),
    /// plus each macaroon's `path:` caveats. Detail: `{macaroons: [{role, identifier,
    /// caveats}]}`; see [`MacaroonFacts::from_bearer`].
    pub fn macaroons_obtained(mut subject: Subject, macaroons: &[MacaroonFacts]) -> AuditDraft {
        for m in macaroons {
            for c in &m.caveats {
                if let Some(path) = c.strip_prefix("path:")
                    && !subject.paths.iter().any(|p| p == path)
                {
                    subject.paths.push(path.to_owned());
                }
            }
        }
        AuditDraft::new(AuditKind::MacaroonsObtained, subject, serde_json::json!({ "macaroons": macaroons }))
    }

    /// `job.accepted`. Subject: job, token, owner, function, digest, event, input path.
    /// Detail: `{resources, group}`.
    pub fn job_accepted(subject: Subject, resources: &Resources, group: Option<&str>) -> AuditDraft {
        let detail = serde_json::json!({ "resources": resources, "group": group });
        AuditDraft::new(AuditKind::JobAccepted, subject, detail)
    }

    /// `job.refused`. Subject: as known (token, owner, function, event). Detail: `{status,
    /// reason}` (the HTTP status answered and the refusal's message).
    pub fn job_refused(subject: Subject, status: u16, reason: &str) -> AuditDraft {
        AuditDraft::new(AuditKind::JobRefused, subject, serde_json::json!({ "status": status, "reason": reason }))
    }

    /// `job.held`. Subject: the job (and what else is known). Detail: `{reason, hold_code}`.
    /// An admin's hold adds [`AuditDraft::with_actor`].
    pub fn job_held(subject: Subject, reason: &str, hold_code: Option<i64>) -> AuditDraft {
        AuditDraft::new(AuditKind::JobHeld, subject, serde_json::json!({ "reason": reason, "hold_code": hold_code }))
    }

    /// `job.released`, by an admin (add [`AuditDraft::with_actor`]). Subject: the job. Detail:
    /// `{reason}`.
    pub fn job_released(subject: Subject, reason: &str) -> AuditDraft {
        AuditDraft::new(AuditKind::JobReleased, subject, serde_json::json!({ "reason": reason }))
    }

    /// `job.removed`. Subject: the job. Detail: `{reason, state}` (the reason recorded with the
    /// job, and the state it was removed from). An admin's or a revocation's adds
    /// [`AuditDraft::with_actor`].
    pub fn job_removed(subject: Subject, reason: &str, from_state: &str) -> AuditDraft {
        let detail = serde_json::json!({ "reason": reason, "state": from_state });
        AuditDraft::new(AuditKind::JobRemoved, subject, detail)
    }

    /// `attempt.lost`: attempt `attempt` of the job, on EP `ep` (session `session`), ended
    /// without a report because `why`; `then` says what became of the job (`requeued`, `held`,
    /// `interrupted`, `kept`). Subject: the job.
    pub fn attempt_lost(subject: Subject, ep: &str, session: &str, attempt: u32, why: &str, then: &str) -> AuditDraft {
        let detail = serde_json::json!({ "ep": ep, "session": session, "attempt": attempt, "why": why, "then": then });
        AuditDraft::new(AuditKind::AttemptLost, subject, detail)
    }

    /// `job.dispatched`. Subject: the job. Detail: `{ep, session, attempt}`.
    pub fn job_dispatched(subject: Subject, ep: &str, session: &str, attempt: u32) -> AuditDraft {
        let detail = serde_json::json!({ "ep": ep, "session": session, "attempt": attempt });
        AuditDraft::new(AuditKind::JobDispatched, subject, detail)
    }

    /// `job.finished`, as the EP `ep` reported it: one record for what the run did. Subject: the
    /// job (whose paths hold its input) and every output path, so a query by either file finds it.
    /// Detail: `{outcome, reason, usage, input: {path, bytes} | null, outputs: [{path, size,
    /// sha256}]}`. The guest's log is not recorded.
    pub fn job_finished(
        mut subject: Subject,
        ep: &str,
        input: Option<(&str, u64)>,
        outputs: &[OutputFile],
        outcome: &Outcome,
        usage: &Usage,
    ) -> AuditDraft {
        for o in outputs {
            if !subject.paths.contains(&o.path) {
                subject.paths.push(o.path.clone());
            }
        }
        let input = input.map(|(path, bytes)| serde_json::json!({ "path": path, "bytes": bytes }));
        let detail = serde_json::json!({
            "outcome": outcome, "reason": outcome.reason(), "usage": usage, "input": input, "outputs": outputs,
        });
        AuditDraft::new(AuditKind::JobFinished, subject, detail).with_actor(ep)
    }

    /// `token.revoked`: actor `by`. Subject: the `jti` or owner named. Detail: the
    /// [`Revocation`] (target, reason, jobs removed and stopped, EP sessions closed).
    pub fn token_revoked(revocation: &Revocation) -> AuditDraft {
        let mut subject = Subject::default();
        match &revocation.target {
            RevocationTarget::Jti(jti) => subject.token_jti = Some(jti.clone()),
            RevocationTarget::Owner(owner) => subject.owner = Some(owner.clone()),
            RevocationTarget::Issuer(_) => {}
        }
        let detail = serde_json::to_value(revocation).unwrap_or(Value::Null);
        AuditDraft::new(AuditKind::TokenRevoked, subject, detail).with_actor(revocation.by.clone())
    }

    /// `admin.action`: `actor` did `action` (`hold`, `release`, `remove`, `drain`, `register`,
    /// …) to `subject`. Detail: `{action}` merged with `args` (an object; anything else is kept
    /// under `args`).
    pub fn admin_action(actor: &str, action: &str, subject: Subject, args: Value) -> AuditDraft {
        let mut detail = Map::new();
        match args {
            Value::Object(map) => detail.extend(map),
            Value::Null => {}
            other => {
                detail.insert("args".into(), other);
            }
        }
        detail.insert("action".into(), Value::String(action.to_owned()));
        AuditDraft::new(AuditKind::AdminAction, subject, Value::Object(detail)).with_actor(actor)
    }

    /// Replaces every bearer credential in the draft by [`REDACTED`]; returns how many.
    fn scrub(&mut self) -> usize {
        let mut n = 0;
        if let Some(actor) = &mut self.actor {
            n += scrub_string(actor);
        }
        let s = &mut self.subject;
        for field in [&mut s.job, &mut s.token_jti, &mut s.owner, &mut s.function, &mut s.digest, &mut s.event_id] {
            n += field.iter_mut().map(scrub_string).sum::<usize>();
        }
        for p in &mut s.paths {
            n += scrub_string(p);
        }
        if let AuditKind::Other(k) = &mut self.kind {
            n += scrub_string(k);
        }
        n + scrub_value(&mut self.detail)
    }
}

/// Whether `s` is (or carries) a bearer credential: a JWT/JWS, a serialized macaroon, or an
/// `Authorization` value.
pub fn looks_like_bearer(s: &str) -> bool {
    let t = s.trim();
    if t.len() >= 7 && t.as_bytes()[..7].eq_ignore_ascii_case(b"bearer ") {
        return true;
    }
    // The shortest real credentials are far longer; identifiers, paths and digests contain
    // characters a token does not.
    if t.len() < 24 || t.bytes().any(|b| b.is_ascii_whitespace()) {
        return false;
    }
    if t.starts_with("eyJ") && t.contains('.') && jsonwebtoken::decode_header(t).is_ok() {
        return true;
    }
    // A serialized macaroon is V2JSON (`{…`) or base64 (standard or url-safe, maybe padded):
    // the macaroon parser refuses any other byte before it decodes, so skip the attempt (and
    // its allocations) for paths, digests (`sha256:`), URLs, ids with dots and the like.
    let base64ish = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'-' | b'_' | b'=');
    if !t.starts_with('{') && !t.bytes().all(base64ish) {
        return false;
    }
    crate::macaroon::identifier(t).is_ok()
}

fn scrub_string(s: &mut String) -> usize {
    if looks_like_bearer(s) {
        *s = REDACTED.to_owned();
        1
    } else {
        0
    }
}

fn scrub_value(v: &mut Value) -> usize {
    match v {
        Value::String(s) => scrub_string(s),
        Value::Array(items) => items.iter_mut().map(scrub_value).sum(),
        Value::Object(map) => {
            let mut n = 0;
            if map.keys().any(|k| looks_like_bearer(k)) {
                let old = std::mem::take(map);
                for (mut k, item) in old {
                    n += scrub_string(&mut k);
                    map.insert(k, item);
                }
            }
            n + map.values_mut().map(scrub_value).sum::<usize>()
        }
        _ => 0,
    }
}

// ---------------------------------------------------------------------------------------------
// Keys and checkpoints
// ---------------------------------------------------------------------------------------------

/// Public keys that may sign checkpoints, by `kid`.
pub type AuditKeys = HashMap<String, VerifyingKey>;

/// The Ed25519 key a writer signs its checkpoints with, and its id.
pub struct AuditSigner {
    kid: String,
    key: ed25519_dalek::SigningKey,
    jwks: JwkSet,
}

impl std::fmt::Debug for AuditSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditSigner").field("kid", &self.kid).finish_non_exhaustive()
    }
}

impl AuditSigner {
    /// A new random key and its PKCS#8 PEM (as [`crate::token::SigningKey::generate`]).
    pub fn generate(kid: &str) -> Result<(AuditSigner, String), AuditError> {
        let (_, pem) = crate::token::SigningKey::generate(kid).map_err(|e| AuditError::Key(e.to_string()))?;
        Ok((AuditSigner::from_pem(kid, pem.as_bytes())?, pem))
    }

    /// Reads a PKCS#8 PEM Ed25519 private key (the format of the token keys).
    pub fn from_pem(kid: &str, pem: &[u8]) -> Result<AuditSigner, AuditError> {
        let jwks = crate::token::SigningKey::from_pem(kid, pem).map_err(|e| AuditError::Key(e.to_string()))?.jwks();
        let text = std::str::from_utf8(pem).map_err(|e| AuditError::Key(e.to_string()))?;
        let key = ed25519_dalek::SigningKey::from_pkcs8_pem(text).map_err(|e| AuditError::Key(e.to_string()))?;
        Ok(AuditSigner { kid: kid.to_owned(), key, jwks })
    }

    /// Loads the key at `path`, or creates it there (mode 0600), as the token keys are.
    pub fn load_or_create(path: &Path, kid: &str) -> Result<AuditSigner, AuditError> {
        crate::token::SigningKey::load_or_create(path, kid).map_err(|e| AuditError::Key(e.to_string()))?;
        let pem = std::fs::read(path).map_err(|e| AuditError::Key(format!("{}: {e}", path.display())))?;
        AuditSigner::from_pem(kid, &pem)
    }

    /// The key id.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public half as a JWKS document with one key (what [`keys_from_jwks`] reads).
    pub fn jwks(&self) -> JwkSet {
        self.jwks.clone()
    }

    /// The public half, for [`verify`].
    pub fn keys(&self) -> AuditKeys {
        HashMap::from([(self.kid.clone(), self.key.verifying_key())])
    }

    fn sign(&self, writer: &str, seq: u64, hash: &str, time_ms: u64) -> Result<Checkpoint, AuditError> {
        let message = checkpoint_message(writer, seq, hash, time_ms)
            .ok_or_else(|| AuditError::Corrupt(format!("record {seq} has a malformed hash")))?;
        let signature = hex::encode(self.key.sign(&message).to_bytes());
        Ok(Checkpoint {
            writer: writer.to_owned(),
            seq,
            hash: hash.to_owned(),
            time_ms,
            kid: self.kid.clone(),
            signature,
        })
    }
}

/// Every Ed25519 key with a `kid` in `jwks` (other keys are skipped).
pub fn keys_from_jwks(jwks: &JwkSet) -> Result<AuditKeys, AuditError> {
    let mut keys = AuditKeys::new();
    for jwk in &jwks.keys {
        let (Some(kid), AlgorithmParameters::OctetKeyPair(okp)) = (&jwk.common.key_id, &jwk.algorithm) else {
            continue;
        };
        if okp.curve != EllipticCurve::Ed25519 {
            continue;
        }
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(okp.x.trim_end_matches('='))
            .map_err(|e| AuditError::Key(format!("key {kid}: {e}")))?;
        let bytes: [u8; 32] =
            bytes.try_into().map_err(|_| AuditError::Key(format!("key {kid}: not a 32-byte Ed25519 key")))?;
        let key = VerifyingKey::from_bytes(&bytes).map_err(|e| AuditError::Key(format!("key {kid}: {e}")))?;
        keys.insert(kid.clone(), key);
    }
    Ok(keys)
}

/// [`keys_from_jwks`] of a JWKS document's text (a file written from `GET /v1/audit/keys`).
pub fn keys_from_jwks_text(text: &str) -> Result<AuditKeys, AuditError> {
    let jwks: JwkSet = serde_json::from_str(text).map_err(|e| AuditError::Key(format!("not a JWKS document: {e}")))?;
    keys_from_jwks(&jwks)
}

/// A signed statement that record `seq` of `writer`'s log has `hash`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The log's writer.
    pub writer: String,
    /// The record it names.
    pub seq: u64,
    /// That record's hash.
    pub hash: String,
    /// When it was signed, Unix ms.
    pub time_ms: u64,
    /// The signing key's id.
    pub kid: String,
    /// Ed25519 signature over the checkpoint message, hex.
    pub signature: String,
}

/// The signed message, or `None` when `hash` is not 64 hex digits.
fn checkpoint_message(writer: &str, seq: u64, hash: &str, time_ms: u64) -> Option<Vec<u8>> {
    let hash: [u8; 32] = hex::decode(hash).ok()?.try_into().ok()?;
    let writer_len = u32::try_from(writer.len()).ok()?;
    let mut m = Vec::with_capacity(CHECKPOINT_DOMAIN.len() + 4 + writer.len() + 8 + 32 + 8);
    m.extend_from_slice(CHECKPOINT_DOMAIN);
    m.extend_from_slice(&writer_len.to_be_bytes());
    m.extend_from_slice(writer.as_bytes());
    m.extend_from_slice(&seq.to_be_bytes());
    m.extend_from_slice(&hash);
    m.extend_from_slice(&time_ms.to_be_bytes());
    Some(m)
}

impl Checkpoint {
    /// Why the signature does not hold under `keys`, if it does not.
    fn check_signature(&self, keys: &AuditKeys) -> Result<(), String> {
        let key = keys.get(&self.kid).ok_or_else(|| format!("it is signed with an unknown key {:?}", self.kid))?;
        let message = checkpoint_message(&self.writer, self.seq, &self.hash, self.time_ms)
            .ok_or_else(|| "its hash is not 64 hex digits".to_owned())?;
        let bytes: [u8; 64] = hex::decode(&self.signature)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| "its signature is not 128 hex digits".to_owned())?;
        key.verify_strict(&message, &ed25519_dalek::Signature::from_bytes(&bytes))
            .map_err(|_| format!("its signature does not verify under key {:?}", self.kid))
    }
}

/// When a writer signs a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointPolicy {
    /// After this many records since the last checkpoint. Default: 1000.
    pub every_records: u64,
    /// At the first append this long after the last checkpoint, ms. Default: 60 000.
    pub every_ms: u64,
}

impl Default for CheckpointPolicy {
    fn default() -> Self {
        CheckpointPolicy { every_records: 1000, every_ms: 60_000 }
    }
}

// ---------------------------------------------------------------------------------------------
// The log
// ---------------------------------------------------------------------------------------------

/// One writer's audit log. Cloning is cheap; clones share one connection.
#[derive(Clone)]
pub struct AuditLog {
    inner: Arc<Inner>,
}

struct Inner {
    /// One connection: appends are serialized here, and across processes by SQLite's write
    /// lock (each append is an `IMMEDIATE` transaction that reads the chain head).
    conn: Mutex<Connection>,
    /// The one writer of this chain.
    writer: String,
    /// Signs checkpoints; without it the chain alone protects the trail.
    signer: Option<AuditSigner>,
    /// When to sign.
    policy: CheckpointPolicy,
    /// For messages.
    path: PathBuf,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("path", &self.inner.path)
            .field("writer", &self.inner.writer)
            .field("signer", &self.inner.signer)
            .field("policy", &self.inner.policy)
            .finish()
    }
}

/// What a query selects: every given condition holds (none given: every record). As a URL
/// query (`GET /v1/audit?job=…&since=…`), fields take the names `token`, `owner`, `file`,
/// `job`, `function`, `event`, `since`, `until`, `limit`; unknown names are refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditFilter {
    /// Records about this token `jti`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Records about this owner.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Records naming this storage path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Records about this job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// Records about this function (name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// Records about this storage event.
    #[serde(rename = "event", skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    /// From this time on, Unix ms, inclusive.
    #[serde(rename = "since", skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
    /// Before this time, Unix ms, exclusive.
    #[serde(rename = "until", skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<u64>,
    /// At most this many (the first, in `seq` order).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).unwrap_or(0)
}

fn to_db(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn from_db(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn valid_writer(writer: &str) -> bool {
    !writer.is_empty()
        && writer.len() <= 64
        && writer.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Runs `f` in a transaction: the caller's, if `conn` is inside one, else an `IMMEDIATE` one
/// of its own (committed when `f` succeeds, rolled back otherwise).
fn in_transaction<T>(conn: &Connection, f: impl FnOnce(&Connection) -> Result<T, AuditError>) -> Result<T, AuditError> {
    if !conn.is_autocommit() {
        return f(conn);
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    match f(conn) {
        Ok(v) => {
            conn.execute_batch("COMMIT")?;
            Ok(v)
        }
        Err(e) => {
            // The error that matters is `e`; a failed rollback leaves nothing committed either.
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// The audit schema version of the database: `None` when it has no `audit_meta` table.
fn schema_version(conn: &Connection) -> Result<Option<i64>, AuditError> {
    let has_meta: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'audit_meta')",
        [],
        |r| r.get(0),
    )?;
    if !has_meta {
        return Ok(None);
    }
    let text: Option<String> =
        conn.query_row("SELECT value FROM audit_meta WHERE key = 'schema_version'", [], |r| r.get(0)).optional()?;
    match text {
        None => Ok(Some(0)),
        Some(t) => t.parse().map(Some).map_err(|_| AuditError::NotALog(format!("audit schema version {t:?}"))),
    }
}

/// Creates or migrates the audit tables of `conn`'s database to [`SCHEMA_VERSION`] and makes
/// `writer` the writer of its chain (refusing another writer's). Runs in the caller's
/// transaction if there is one, else in one of its own; the host's own tables and `PRAGMA
/// user_version` are not touched. Idempotent: services call it at every open.
pub fn install(conn: &Connection, writer: &str) -> Result<(), AuditError> {
    if !valid_writer(writer) {
        return Err(AuditError::BadWriter(writer.to_owned()));
    }
    in_transaction(conn, |tx| {
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS audit_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
        )?;
        let found = schema_version(tx)?.unwrap_or(0);
        if found > SCHEMA_VERSION {
            return Err(AuditError::SchemaTooNew { found, supported: SCHEMA_VERSION });
        }
        for (version, step) in MIGRATIONS.iter().enumerate().skip(usize::try_from(found).unwrap_or(0)) {
            tx.execute_batch(step)?;
            tracing::info!(from = version, to = version + 1, "audit tables migrated");
        }
        if found != SCHEMA_VERSION {
            tx.execute(
                "INSERT OR REPLACE INTO audit_meta (key, value) VALUES ('schema_version', ?1)",
                [SCHEMA_VERSION.to_string()],
            )?;
        }
        match writer_of(tx)? {
            Some(found) if found != writer => Err(AuditError::WrongWriter { found, expected: writer.to_owned() }),
            Some(_) => Ok(()),
            None => {
                tx.execute("INSERT INTO audit_meta (key, value) VALUES ('writer', ?1)", [writer])?;
                Ok(())
            }
        }
    })
}

/// The writer named in `audit_meta`.
fn writer_of(conn: &Connection) -> Result<Option<String>, AuditError> {
    Ok(conn
        .prepare_cached("SELECT value FROM audit_meta WHERE key = 'writer'")?
        .query_row([], |r| r.get(0))
        .optional()?)
}

/// Appends `draft` as the next record of the chain in `tx`'s database (see [`install`]):
/// redacts bearer credentials, reads the head, numbers, times and chains the record, all inside
/// `tx`, so the record commits (or rolls back) with whatever else `tx` does. Signs no
/// checkpoint: the owner of the key calls [`checkpoint_in`] (e.g. on a timer).
pub fn append_in(tx: &rusqlite::Transaction<'_>, draft: AuditDraft) -> Result<AuditRecord, AuditError> {
    let writer = writer_of(tx)?.ok_or_else(|| AuditError::NotALog("no writer in audit_meta (not installed)".into()))?;
    append_to(tx, &writer, draft, None)
}

/// The one append: inside the open transaction on `tx`; with `signer`, signs a checkpoint of
/// the new record when `policy` says one is due.
fn append_to(
    tx: &Connection,
    writer: &str,
    mut draft: AuditDraft,
    signer: Option<(&AuditSigner, CheckpointPolicy)>,
) -> Result<AuditRecord, AuditError> {
    let redacted = draft.scrub();
    if redacted > 0 {
        tracing::warn!(kind = %draft.kind, redacted, "bearer credentials redacted from an audit record");
    }
    let head: Option<(i64, String, i64)> = tx
        .prepare_cached("SELECT seq, hash, time_ms FROM audit_records ORDER BY seq DESC LIMIT 1")?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let (seq, prev_hash, time_ms) = match head {
        Some((seq, hash, time)) => (from_db(seq) + 1, hash, now_ms().max(from_db(time))),
        None => (1, GENESIS_HASH.to_owned(), now_ms()),
    };
    let mut record = AuditRecord {
        format: RECORD_FORMAT,
        seq,
        time_ms,
        writer: writer.to_owned(),
        kind: draft.kind,
        actor: draft.actor,
        subject: draft.subject,
        detail: draft.detail,
        prev_hash,
        hash: String::new(),
    };
    // The members are encoded once; the hashed text (without `hash`) and the stored text (with
    // it) are the same members, in the same sorted order, one apart.
    let (hashed, json) = encode_record(&mut record)?;
    debug_assert_eq!(hashed.len() + record.hash.len() + ",\"hash\":\"\"".len(), json.len());
    let s = &record.subject;
    tx.prepare_cached(
        "INSERT INTO audit_records (seq, time_ms, kind, job, token_jti, owner, function, digest, event_id, hash, json)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    )?
    .execute(params![
        to_db(seq),
        to_db(time_ms),
        record.kind.as_str(),
        s.job,
        s.token_jti,
        s.owner,
        s.function,
        s.digest,
        s.event_id,
        record.hash,
        json
    ])?;
    if !s.paths.is_empty() {
        let mut insert_path =
            tx.prepare_cached("INSERT OR IGNORE INTO audit_record_paths (path, seq) VALUES (?1, ?2)")?;
        for p in &s.paths {
            insert_path.execute(params![p, to_db(seq)])?;
        }
    }
    if let Some((signer, policy)) = signer
        && checkpoint_due(tx, policy, seq, time_ms, false)?
    {
        insert_checkpoint(tx, signer, writer, seq, &record.hash, time_ms)?;
    }
    Ok(record)
}

/// Whether record `seq` (at `time_ms`) should be checkpointed: by count, by time, or
/// (`force`) whenever it is not yet.
fn checkpoint_due(
    tx: &Connection,
    policy: CheckpointPolicy,
    seq: u64,
    time_ms: u64,
    force: bool,
) -> Result<bool, AuditError> {
    let last: Option<(i64, i64)> = tx
        .prepare_cached("SELECT seq, time_ms FROM audit_checkpoints ORDER BY seq DESC LIMIT 1")?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let (last_seq, last_ms) = match last {
        Some((s, t)) => (from_db(s), from_db(t)),
        None => {
            let first: Option<i64> =
                tx.query_row("SELECT time_ms FROM audit_records WHERE seq = 1", [], |r| r.get(0)).optional()?;
            (0, first.map_or(time_ms, from_db))
        }
    };
    if seq <= last_seq {
        return Ok(false);
    }
    let every_records = policy.every_records.max(1);
    Ok(force || seq - last_seq >= every_records || time_ms.saturating_sub(last_ms) >= policy.every_ms)
}

fn insert_checkpoint(
    tx: &Connection,
    signer: &AuditSigner,
    writer: &str,
    seq: u64,
    hash: &str,
    time_ms: u64,
) -> Result<Checkpoint, AuditError> {
    let cp = signer.sign(writer, seq, hash, time_ms)?;
    let json = serde_json::to_value(&cp).map(|v| canonical_json(&v)).map_err(|e| AuditError::Corrupt(e.to_string()))?;
    tx.execute(
        "INSERT INTO audit_checkpoints (seq, time_ms, json) VALUES (?1, ?2, ?3)",
        params![to_db(seq), to_db(time_ms), json],
    )?;
    Ok(cp)
}

/// Signs a checkpoint of the head of the chain in `conn`'s database with `signer`, when
/// `policy` says one is due or (`force`) whenever the head has none yet; `None` when nothing
/// was signed (no record, or not due). Runs in the caller's transaction if there is one, else
/// in one of its own.
pub fn checkpoint_in(
    conn: &Connection,
    signer: &AuditSigner,
    policy: CheckpointPolicy,
    force: bool,
) -> Result<Option<Checkpoint>, AuditError> {
    in_transaction(conn, |tx| {
        let writer = writer_of(tx)?.ok_or_else(|| AuditError::NotALog("no writer in audit_meta".into()))?;
        checkpoint_head(tx, signer, &writer, policy, force)
    })
}

fn checkpoint_head(
    tx: &Connection,
    signer: &AuditSigner,
    writer: &str,
    policy: CheckpointPolicy,
    force: bool,
) -> Result<Option<Checkpoint>, AuditError> {
    let Some((seq, hash)) = head_in(tx)? else { return Ok(None) };
    let time_ms = now_ms();
    if !checkpoint_due(tx, policy, seq, time_ms, force)? {
        return Ok(None);
    }
    insert_checkpoint(tx, signer, writer, seq, &hash, time_ms).map(Some)
}

/// The head of the chain in `conn`'s database: the last record's seq and hash.
pub fn head_in(conn: &Connection) -> Result<Option<(u64, String)>, AuditError> {
    let head: Option<(i64, String)> = conn
        .prepare_cached("SELECT seq, hash FROM audit_records ORDER BY seq DESC LIMIT 1")?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    Ok(head.map(|(s, h)| (from_db(s), h)))
}

/// The checkpoints in `conn`'s database, in seq order.
pub fn checkpoints_in(conn: &Connection) -> Result<Vec<Checkpoint>, AuditError> {
    let mut stmt = conn.prepare("SELECT json FROM audit_checkpoints ORDER BY seq")?;
    let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
    rows.map(|text| serde_json::from_str(&text?).map_err(|e| AuditError::Corrupt(e.to_string()))).collect()
}

impl AuditLog {
    /// Opens (creating if needed) `writer`'s log at `path`, a file of its own (WAL,
    /// `synchronous=FULL`; [`install`]ed). With `signer`, checkpoints are signed per `policy`.
    pub fn open(
        path: &Path,
        writer: &str,
        signer: Option<AuditSigner>,
        policy: CheckpointPolicy,
    ) -> Result<AuditLog, AuditError> {
        if !valid_writer(writer) {
            return Err(AuditError::BadWriter(writer.to_owned()));
        }
        crate::store::prepare_private_db(path).map_err(|e| AuditError::NotALog(format!("{}: {e}", path.display())))?;
        let conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        install(&conn, writer)?;
        let policy = CheckpointPolicy { every_records: policy.every_records.max(1), ..policy };
        Ok(AuditLog {
            inner: Arc::new(Inner {
                conn: Mutex::new(conn),
                writer: writer.to_owned(),
                signer,
                policy,
                path: path.to_owned(),
            }),
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave SQLite inconsistent (transactions roll back).
        self.inner.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The writer's name.
    pub fn writer(&self) -> &str {
        &self.inner.writer
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Appends `draft` as the next record: numbers, times and chains it in one transaction
    /// (the head is read inside it), signs a checkpoint when one is due, and returns the record
    /// once it is on disk. Bearer credentials in the draft are redacted first.
    pub fn append(&self, draft: AuditDraft) -> Result<AuditRecord, AuditError> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let signer = self.inner.signer.as_ref().map(|s| (s, self.inner.policy));
        let record = append_to(&tx, &self.inner.writer, draft, signer)?;
        tx.commit()?;
        Ok(record)
    }

    /// Signs a checkpoint of the head now, unless it has one (or there is no key or no record).
    /// Services call it at shutdown, and on a timer so that a quiet log's tail is signed too.
    pub fn checkpoint_now(&self) -> Result<Option<Checkpoint>, AuditError> {
        self.checkpoint(true)
    }

    /// Signs a checkpoint of the head if the policy says one is due.
    pub fn checkpoint_if_due(&self) -> Result<Option<Checkpoint>, AuditError> {
        self.checkpoint(false)
    }

    fn checkpoint(&self, force: bool) -> Result<Option<Checkpoint>, AuditError> {
        let Some(signer) = &self.inner.signer else { return Ok(None) };
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let cp = checkpoint_head(&tx, signer, &self.inner.writer, self.inner.policy, force)?;
        tx.commit()?;
        Ok(cp)
    }

    /// The head: the last record's seq and hash.
    pub fn head(&self) -> Result<Option<(u64, String)>, AuditError> {
        head_in(&self.conn())
    }

    /// The checkpoints, in seq order.
    pub fn checkpoints(&self) -> Result<Vec<Checkpoint>, AuditError> {
        checkpoints_in(&self.conn())
    }

    /// The records `filter` selects, in seq order (from the indexed columns; [`verify`] is what
    /// vouches for the records themselves).
    pub fn query(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>, AuditError> {
        query_in(&self.conn(), filter)
    }
}

/// [`AuditLog::query`] on any database file that holds the audit tables, read-only (the CLI's
/// lineage queries; the scheduler's `GET /v1/audit` on its queue).
pub fn query(path: &Path, filter: &AuditFilter) -> Result<Vec<AuditRecord>, AuditError> {
    let conn = open_read_only(path)?;
    query_in(&conn, filter)
}

/// [`query`] on an open connection.
pub fn query_in(conn: &Connection, filter: &AuditFilter) -> Result<Vec<AuditRecord>, AuditError> {
    let mut sql = String::from("SELECT json FROM audit_records WHERE 1 = 1");
    let mut args: Vec<rusqlite::types::Value> = Vec::new();
    let mut text = |sql: &mut String, column: &str, value: &Option<String>| {
        if let Some(v) = value {
            args.push(v.clone().into());
            sql.push_str(&format!(" AND {column} = ?{}", args.len()));
        }
    };
    text(&mut sql, "token_jti", &filter.token);
    text(&mut sql, "owner", &filter.owner);
    text(&mut sql, "job", &filter.job);
    text(&mut sql, "function", &filter.function);
    text(&mut sql, "event_id", &filter.event_id);
    if let Some(path) = &filter.file {
        args.push(path.clone().into());
        sql.push_str(&format!(" AND seq IN (SELECT seq FROM audit_record_paths WHERE path = ?{})", args.len()));
    }
    if let Some(t) = filter.since_ms {
        args.push(to_db(t).into());
        sql.push_str(&format!(" AND time_ms >= ?{}", args.len()));
    }
    if let Some(t) = filter.until_ms {
        args.push(to_db(t).into());
        sql.push_str(&format!(" AND time_ms < ?{}", args.len()));
    }
    sql.push_str(" ORDER BY seq");
    if let Some(limit) = filter.limit {
        args.push(to_db(limit).into());
        sql.push_str(&format!(" LIMIT ?{}", args.len()));
    }
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt.query_map(rusqlite::params_from_iter(args), |r| r.get::<_, String>(0))?;
    rows.map(|text| serde_json::from_str(&text?).map_err(|e| AuditError::Corrupt(e.to_string()))).collect()
}

fn open_read_only(path: &Path) -> Result<Connection, AuditError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    match schema_version(&conn)? {
        None | Some(0) => Err(AuditError::NotALog(format!("{}: no audit tables", path.display()))),
        Some(found) if found > SCHEMA_VERSION => Err(AuditError::SchemaTooNew { found, supported: SCHEMA_VERSION }),
        Some(_) => Ok(conn),
    }
}

// ---------------------------------------------------------------------------------------------
// Verification
// ---------------------------------------------------------------------------------------------

/// What is wrong with a trail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// The record's contents do not match its hash, it does not parse, or it was rewritten with
    /// recomputed hashes (caught by the next record's link or a signed checkpoint).
    Altered,
    /// Records are missing from the middle of the chain.
    Removed,
    /// The record stored at this seq belongs later in the chain.
    Reordered,
    /// A record that is not part of the chain was put into it.
    Inserted,
    /// Records at the end were removed: a signed checkpoint names a record that is gone.
    Truncated,
    /// A checkpoint does not parse, names an unknown key, or its signature does not verify.
    BadCheckpoint,
}

/// The first problem of a trail, in chain order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// The seq it is at: the first record (or checkpoint) affected.
    pub seq: u64,
    /// What kind of problem.
    pub what: ProblemKind,
    /// One sentence naming it, e.g. "record 42 was altered: its hash does not match its contents".
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The answer of [`verify`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    /// Rows in the records table.
    pub records: u64,
    /// Rows in the checkpoints table.
    pub checkpoints: u64,
    /// The last seq of the chain as far as it was read (all of it when there is no problem).
    pub last_seq: u64,
    /// The last seq covered by a valid checkpoint; records after it are protected by the
    /// chain only (removing them or rewriting them all is not detectable until a later
    /// checkpoint exists).
    pub last_checkpoint_seq: Option<u64>,
    /// `None`: the trail is intact.
    pub first_problem: Option<Problem>,
}

impl VerifyReport {
    /// Whether no problem was found.
    pub fn ok(&self) -> bool {
        self.first_problem.is_none()
    }
}

/// What verification needs of one stored record.
struct Facts {
    seq: u64,
    writer: String,
    prev_hash: String,
    stored_hash: String,
    computed_hash: String,
}

/// Parses a stored record's text and recomputes its hash, or says why it cannot.
fn facts_of(text: Option<&str>) -> Result<Facts, String> {
    let text = text.ok_or("its stored JSON is not text")?;
    let mut value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let obj = value.as_object_mut().ok_or("not a JSON object")?;
    let stored_hash = match obj.remove("hash") {
        Some(Value::String(h)) => h,
        _ => return Err("no hash".into()),
    };
    let computed_hash = content_hash(&value);
    if let Some(obj) = value.as_object_mut() {
        obj.insert("hash".into(), Value::String(stored_hash.clone()));
    }
    let record: AuditRecord = serde_json::from_value(value).map_err(|e| format!("not a record: {e}"))?;
    if record.format != RECORD_FORMAT {
        return Err(format!("unknown record format {}", record.format));
    }
    Ok(Facts { seq: record.seq, writer: record.writer, prev_hash: record.prev_hash, stored_hash, computed_hash })
}

fn text_of<'a>(v: ValueRef<'a>) -> Option<&'a str> {
    match v {
        ValueRef::Text(t) => std::str::from_utf8(t).ok(),
        _ => None,
    }
}

/// The previous record of the chain walk.
struct Link {
    /// Its `seq` column.
    row: i64,
    /// Its own seq.
    seq: u64,
    /// Its (recomputed, verified) hash.
    hash: String,
}

fn problem(seq: u64, what: ProblemKind, message: String) -> Problem {
    Problem { seq, what, message }
}

/// Checks the whole trail at `path`: every record's hash, seq contiguity and links, every
/// checkpoint's signature (under `keys`, by `kid`) and that it names the record it says; reads
/// only the stored JSON texts. Returns the first problem in chain order; an `Err` only when the
/// file cannot be read as an audit log at all.
pub fn verify(path: &Path, keys: &AuditKeys) -> Result<VerifyReport, AuditError> {
    let conn = open_read_only(path)?;
    // One snapshot for all reads, even while the writer appends.
    let tx = conn.unchecked_transaction()?;
    let records: i64 = tx.query_row("SELECT COUNT(*) FROM audit_records", [], |r| r.get(0))?;
    let checkpoints: i64 = tx.query_row("SELECT COUNT(*) FROM audit_checkpoints", [], |r| r.get(0))?;

    // Checkpoints first: the valid ones are compared with the chain as it is walked.
    let mut good: BTreeMap<u64, Checkpoint> = BTreeMap::new();
    let mut bad_checkpoint: Option<Problem> = None;
    {
        let mut stmt = tx.prepare("SELECT seq, json FROM audit_checkpoints ORDER BY seq")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let at = from_db(row.get::<_, i64>(0)?);
            let parsed = text_of(row.get_ref(1)?)
                .ok_or_else(|| "its stored JSON is not text".to_owned())
                .and_then(|t| serde_json::from_str::<Checkpoint>(t).map_err(|e| format!("it does not parse: {e}")))
                .and_then(|cp| {
                    if cp.seq != at {
                        return Err(format!("it is stored as seq {at} but names record {}", cp.seq));
                    }
                    cp.check_signature(keys).map(|()| cp)
                });
            match parsed {
                Ok(cp) => {
                    good.insert(cp.seq, cp);
                }
                Err(why) => {
                    bad_checkpoint = Some(problem(
                        at,
                        ProblemKind::BadCheckpoint,
                        format!("the checkpoint at record {at} is invalid: {why}"),
                    ));
                    break;
                }
            }
        }
    }
    // Only checkpoints before the first bad one count.
    let (chain_problem, last_seq, last_checkpoint_seq) = walk_chain(&tx, &good)?;
    let first_problem = match (chain_problem, bad_checkpoint) {
        (Some(c), Some(b)) => Some(if b.seq < c.seq { b } else { c }),
        (c, b) => c.or(b),
    };
    Ok(VerifyReport {
        records: from_db(records),
        checkpoints: from_db(checkpoints),
        last_seq,
        last_checkpoint_seq,
        first_problem,
    })
}

/// Walks the records in `seq` column order; returns the first problem, the last seq read and
/// the last checkpoint that matched.
fn walk_chain(
    tx: &Connection,
    checkpoints: &BTreeMap<u64, Checkpoint>,
) -> Result<(Option<Problem>, u64, Option<u64>), AuditError> {
    use ProblemKind::*;
    let mut stmt = tx.prepare("SELECT seq, json FROM audit_records ORDER BY seq")?;
    let mut rows = stmt.query([])?;
    let mut prev: Option<Link> = None;
    let mut last_cp: Option<u64> = None;
    while let Some(row) = rows.next()? {
        let row_seq: i64 = row.get(0)?;
        let expected_seq = prev.as_ref().map_or(1, |p| p.seq + 1);
        let expected_prev = prev.as_ref().map_or(GENESIS_HASH, |p| p.hash.as_str());
        // Where to point when the record's own seq cannot be trusted.
        let at = u64::try_from(row_seq).ok().filter(|s| *s >= 1).unwrap_or(expected_seq);
        let last = prev.as_ref().map_or(0, |p| p.seq);
        let facts = match facts_of(text_of(row.get_ref(1)?)) {
            Ok(f) => f,
            Err(why) => {
                let msg = format!("record {at} was altered: it is not a valid audit record ({why})");
                return Ok((Some(problem(at, Altered, msg)), last, last_cp));
            }
        };
        if facts.computed_hash != facts.stored_hash {
            let msg = format!("record {at} was altered: its hash does not match its contents");
            return Ok((Some(problem(at, Altered, msg)), last, last_cp));
        }
        if facts.prev_hash != expected_prev {
            let p = classify_break(tx, row_seq, &facts, prev.as_ref(), expected_seq, last_cp)?;
            return Ok((Some(p), last, last_cp));
        }
        if facts.seq != expected_seq {
            let msg = format!(
                "record {expected_seq} was altered: the record stored there follows record {last} but says it is \
                 record {} (its hash was recomputed)",
                facts.seq
            );
            return Ok((Some(problem(expected_seq, Altered, msg)), last, last_cp));
        }
        if row_seq != to_db(expected_seq) {
            let msg = format!("record {expected_seq} was altered: it is stored as seq {row_seq}");
            return Ok((Some(problem(expected_seq, Altered, msg)), last, last_cp));
        }
        if let Some(cp) = checkpoints.get(&facts.seq) {
            if cp.writer != facts.writer {
                let msg = format!(
                    "the checkpoint at record {} is invalid: it names writer {:?}, the record {:?}",
                    facts.seq, cp.writer, facts.writer
                );
                return Ok((Some(problem(facts.seq, BadCheckpoint, msg)), last, last_cp));
            }
            if cp.hash != facts.computed_hash {
                let from = last_cp.map_or(1, |s| s + 1);
                let msg = format!(
                    "record {} was altered: it does not match the signed checkpoint at record {} (records {from} to {} \
                     were rewritten with recomputed hashes)",
                    facts.seq, facts.seq, facts.seq
                );
                return Ok((Some(problem(facts.seq, Altered, msg)), last, last_cp));
            }
            last_cp = Some(facts.seq);
        }
        prev = Some(Link { row: row_seq, seq: facts.seq, hash: facts.computed_hash });
    }
    let last = prev.as_ref().map_or(0, |p| p.seq);
    if let Some((cp_seq, _)) = checkpoints.range(last + 1..).next() {
        let msg = format!(
            "records from {} on were removed: the signed checkpoint at record {cp_seq} names a record that is not in \
             the log",
            last + 1
        );
        return Ok((Some(problem(last + 1, Truncated, msg)), last, last_cp));
    }
    Ok((None, last, last_cp))
}

/// Names what broke the link from the record stored at `row_seq` to the previous one.
fn classify_break(
    tx: &Connection,
    row_seq: i64,
    facts: &Facts,
    prev: Option<&Link>,
    expected_seq: u64,
    last_checkpoint: Option<u64>,
) -> Result<Problem, AuditError> {
    use ProblemKind::*;
    let s = facts.seq;
    if let Some(p) = prev
        && facts.computed_hash == p.hash
    {
        let at = u64::try_from(row_seq).unwrap_or(expected_seq);
        let msg = format!("record {at} was inserted: it is a copy of record {}", p.seq);
        return Ok(problem(at, Inserted, msg));
    }
    match find_by_hash(tx, &facts.prev_hash)? {
        Some((found_row, found_seq)) if found_row > row_seq => {
            let msg = format!(
                "records were reordered at seq {expected_seq}: the record stored there is record {s}, which follows \
                 record {found_seq}, stored later (as seq {found_row})"
            );
            Ok(problem(expected_seq, Reordered, msg))
        }
        Some((found_row, found_seq)) if prev.is_some_and(|p| found_row < p.row) => {
            let first: Option<i64> =
                tx.query_row("SELECT MIN(seq) FROM audit_records WHERE seq > ?1", [found_row], |r| r.get(0))?;
            let first = first.and_then(|f| u64::try_from(f).ok()).unwrap_or(expected_seq);
            let msg = format!(
                "record {first} was inserted: record {s} (stored as seq {row_seq}) follows record {found_seq}, which \
                 is stored before it (as seq {found_row})"
            );
            Ok(problem(first, Inserted, msg))
        }
        _ if s > expected_seq => {
            let msg = if s - 1 > expected_seq {
                format!(
                    "records {expected_seq} to {} were removed: record {s} follows a record that is not in the log",
                    s - 1
                )
            } else {
                format!("record {expected_seq} was removed: record {s} follows a record that is not in the log")
            };
            Ok(problem(expected_seq, Removed, msg))
        }
        _ if s == expected_seq && expected_seq > 1 && last_checkpoint == Some(expected_seq - 1) => {
            let msg = format!(
                "record {s} was altered: it does not follow record {}, which a signed checkpoint vouches for",
                s - 1
            );
            Ok(problem(s, Altered, msg))
        }
        _ if s == expected_seq && expected_seq > 1 => {
            // Either record s-1 was rewritten (hash recomputed) or record s's link was: name the
            // earlier one.
            let before = expected_seq - 1;
            let msg = format!(
                "record {before} was altered (its hash recomputed), or record {s} was: record {s} follows a \
                 different record {before}"
            );
            Ok(problem(before, Altered, msg))
        }
        _ if expected_seq == 1 => {
            let msg = "record 1 was altered: it does not start the chain (its previous hash is not the genesis hash)";
            Ok(problem(1, Altered, msg.to_owned()))
        }
        _ => {
            let msg = format!(
                "record {expected_seq} was altered: the record stored there (record {s}) does not follow record {}",
                expected_seq - 1
            );
            Ok(problem(expected_seq, Altered, msg))
        }
    }
}

/// The `(seq column, seq)` of the first intact record whose hash is `hash`.
fn find_by_hash(tx: &Connection, hash: &str) -> Result<Option<(i64, u64)>, AuditError> {
    let mut stmt = tx.prepare("SELECT seq, json FROM audit_records ORDER BY seq")?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        if let Ok(f) = facts_of(text_of(row.get_ref(1)?))
            && f.computed_hash == f.stored_hash
            && f.computed_hash == hash
        {
            return Ok(Some((row.get(0)?, f.seq)));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Digest;

    const TRIGGERS: &str = "DROP TRIGGER audit_records_append_only_u; DROP TRIGGER audit_records_append_only_d;
         DROP TRIGGER audit_record_paths_append_only_u; DROP TRIGGER audit_record_paths_append_only_d;
         DROP TRIGGER audit_checkpoints_append_only_u; DROP TRIGGER audit_checkpoints_append_only_d;";

    fn draft(i: u64) -> AuditDraft {
        let owner = if i.is_multiple_of(2) { "alice" } else { "bob" };
        let subject = Subject {
            job: Some(format!("job-{}", i / 3)),
            token_jti: Some(format!("jti-{}", i / 3)),
            owner: Some(owner.into()),
            function: Some("checksum".into()),
            digest: Some(Digest::of(b"m").as_str().to_owned()),
            event_id: Some(format!("ev-{}", i / 3)),
            paths: vec![format!("/data/raw/{}.dat", i / 3)],
        };
        match i % 3 {
            0 => AuditDraft::job_accepted(subject, &Resources::default(), None),
            1 => AuditDraft::job_dispatched(subject, "ep-1", "s-1", 1),
            _ => AuditDraft::job_finished(
                subject,
                "ep-1",
                None,
                &[OutputFile { path: format!("/data/out/{}.sum", i / 3), size: i, sha256: "ab".repeat(32) }],
                &crate::proto::Outcome::Exited { exit_code: 0 },
                &Usage::default(),
            ),
        }
    }

    /// A closed log of `n` records, a checkpoint every `every` records; its file and keys.
    pub(super) fn sample(dir: &Path, n: u64, every: u64) -> (PathBuf, AuditKeys) {
        let path = dir.join("trail.sqlite");
        let (signer, _) = AuditSigner::generate("audit-1").expect("keygen");
        let keys = signer.keys();
        let policy = CheckpointPolicy { every_records: every, every_ms: u64::MAX };
        let log = AuditLog::open(&path, "gateway", Some(signer), policy).expect("open");
        for i in 0..n {
            log.append(draft(i)).expect("append");
        }
        drop(log); // the last connection checkpoints the WAL into the file
        (path, keys)
    }

    /// A copy of `src`, tampered with by `f` through raw SQL.
    pub(super) fn tampered(src: &Path, name: &str, f: impl FnOnce(&Connection)) -> PathBuf {
        let dst = src.with_file_name(format!("{name}.sqlite"));
        std::fs::copy(src, &dst).expect("copy");
        let conn = Connection::open(&dst).expect("open copy");
        conn.execute_batch(TRIGGERS).expect("drop triggers");
        f(&conn);
        dst
    }

    fn stored(conn: &Connection, seq: i64) -> Value {
        let text: String =
            conn.query_row("SELECT json FROM audit_records WHERE seq = ?1", [seq], |r| r.get(0)).expect("row");
        serde_json::from_str(&text).expect("json")
    }

    fn store(conn: &Connection, seq: i64, v: &Value) {
        conn.execute("UPDATE audit_records SET json = ?2 WHERE seq = ?1", params![seq, canonical_json(v)])
            .expect("update");
    }

    /// What an attacker who knows the format does: recompute the hash.
    fn rehash(v: &mut Value) {
        let mut without = v.clone();
        without.as_object_mut().expect("object").remove("hash");
        v["hash"] = Value::String(content_hash(&without));
    }

    fn first_problem(path: &Path, keys: &AuditKeys) -> Problem {
        let report = verify(path, keys).expect("verify");
        report.first_problem.clone().unwrap_or_else(|| panic!("no problem found in {report:?}"))
    }

    #[track_caller]
    fn assert_problem(p: &Problem, seq: u64, what: ProblemKind, says: &str) {
        assert_eq!((p.seq, p.what), (seq, what), "{p:?}");
        assert!(p.message.contains(says), "{:?} does not say {says:?}", p.message);
    }

    #[test]
    fn a_clean_log_verifies() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, keys) = sample(dir.path(), 25, 10);
        let report = verify(&path, &keys).expect("verify");
        assert_eq!(
            report,
            VerifyReport {
                records: 25,
                checkpoints: 2,
                last_seq: 25,
                last_checkpoint_seq: Some(20),
                first_problem: None
            }
        );
        let all = query(&path, &AuditFilter::default()).expect("query");
        assert_eq!(all.iter().map(|r| r.seq).collect::<Vec<_>>(), (1..=25).collect::<Vec<_>>());
        assert_eq!(all[0].prev_hash, GENESIS_HASH);
        for pair in all.windows(2) {
            assert_eq!(pair[1].prev_hash, pair[0].hash);
            assert!(pair[1].time_ms >= pair[0].time_ms);
        }
        for r in &all {
            assert_eq!(r.compute_hash().expect("hash"), r.hash);
        }
        // The JWKS route gives the same keys.
        let (signer, _) = AuditSigner::generate("k").expect("keygen");
        assert_eq!(keys_from_jwks(&signer.jwks()).expect("jwks"), signer.keys());
    }

    #[test]
    fn an_altered_record_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, keys) = sample(dir.path(), 25, 10);
        let copy = tampered(&path, "altered", |c| {
            let mut v = stored(c, 7);
            v["subject"]["owner"] = "mallory".into();
            store(c, 7, &v);
        });
        assert_problem(
            &first_problem(&copy, &keys),
            7,
            ProblemKind::Altered,
            "record 7 was altered: its hash does not match its contents",
        );

        // With its hash recomputed, the next record's link names it.
        let copy = tampered(&path, "altered-rehashed", |c| {
            let mut v = stored(c, 7);
            v["detail"]["attempt"] = 2.into();
            rehash(&mut v);
            store(c, 7, &v);
        });
        assert_problem(&first_problem(&copy, &keys), 7, ProblemKind::Altered, "record 8 follows a different record 7");

        // A broken link right after a signed checkpoint names the later record.
        let copy = tampered(&path, "relinked", |c| {
            let mut v = stored(c, 21);
            v["prev_hash"] = "ab".repeat(32).into();
            rehash(&mut v);
            store(c, 21, &v);
        });
        assert_problem(
            &first_problem(&copy, &keys),
            21,
            ProblemKind::Altered,
            "record 21 was altered: it does not follow record 20, which a signed checkpoint vouches for",
        );

        // A whole rewritten tail (every hash recomputed) is caught by the next signed checkpoint.
        let copy = tampered(&path, "rewritten", |c| {
            let mut prev = stored(c, 12)["hash"].clone();
            for seq in 13..=25 {
                let mut v = stored(c, seq);
                if seq == 13 {
                    v["subject"]["owner"] = "mallory".into();
                }
                v["prev_hash"] = prev;
                rehash(&mut v);
                prev = v["hash"].clone();
                store(c, seq, &v);
            }
        });
        assert_problem(
            &first_problem(&copy, &keys),
            20,
            ProblemKind::Altered,
            "does not match the signed checkpoint at record 20 (records 11 to 20",
        );

        // Unreadable text is an alteration too.
        let copy = tampered(&path, "garbled", |c| {
            c.execute("UPDATE audit_records SET json = substr(json, 1, 40) WHERE seq = 3", []).expect("update");
        });
        assert_problem(
            &first_problem(&copy, &keys),
            3,
            ProblemKind::Altered,
            "record 3 was altered: it is not a valid",
        );
    }

    #[test]
    fn a_removed_record_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, keys) = sample(dir.path(), 25, 10);
        let copy = tampered(&path, "removed", |c| {
            c.execute("DELETE FROM audit_records WHERE seq = 12", []).expect("delete");
        });
        assert_problem(&first_problem(&copy, &keys), 12, ProblemKind::Removed, "record 12 was removed");

        let copy = tampered(&path, "removed-three", |c| {
            c.execute("DELETE FROM audit_records WHERE seq BETWEEN 12 AND 14", []).expect("delete");
        });
        assert_problem(&first_problem(&copy, &keys), 12, ProblemKind::Removed, "records 12 to 14 were removed");

        // Renumbering the rows to close the gap changes nothing.
        let copy = tampered(&path, "removed-renumbered", |c| {
            c.execute("DELETE FROM audit_records WHERE seq = 1", []).expect("delete");
            c.execute("UPDATE audit_records SET seq = -(seq - 1)", []).expect("shift");
            c.execute("UPDATE audit_records SET seq = -seq", []).expect("shift");
        });
        assert_problem(&first_problem(&copy, &keys), 1, ProblemKind::Removed, "record 1 was removed");
    }

    #[test]
    fn reordered_records_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, keys) = sample(dir.path(), 25, 10);
        // Swap the seqs of two adjacent rows.
        let copy = tampered(&path, "swapped", |c| {
            c.execute_batch(
                "UPDATE audit_records SET seq = -5 WHERE seq = 5; UPDATE audit_records SET seq = 5 WHERE seq = 6;
                 UPDATE audit_records SET seq = 6 WHERE seq = -5;",
            )
            .expect("swap");
        });
        assert_problem(&first_problem(&copy, &keys), 5, ProblemKind::Reordered, "records were reordered at seq 5");

        // Swap the contents of two distant rows.
        let copy = tampered(&path, "swapped-far", |c| {
            let (a, b) = (stored(c, 15), stored(c, 18));
            store(c, 15, &b);
            store(c, 18, &a);
        });
        assert_problem(
            &first_problem(&copy, &keys),
            15,
            ProblemKind::Reordered,
            "the record stored there is record 18",
        );
    }

    #[test]
    fn a_truncated_tail_after_a_checkpoint_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, keys) = sample(dir.path(), 25, 10);
        let copy = tampered(&path, "truncated", |c| {
            c.execute("DELETE FROM audit_records WHERE seq >= 19", []).expect("delete");
        });
        assert_problem(
            &first_problem(&copy, &keys),
            19,
            ProblemKind::Truncated,
            "records from 19 on were removed: the signed checkpoint at record 20",
        );

        // The limit, stated: records after the last checkpoint are protected by the chain only.
        let copy = tampered(&path, "truncated-unsigned-tail", |c| {
            c.execute("DELETE FROM audit_records WHERE seq > 20", []).expect("delete");
        });
        let report = verify(&copy, &keys).expect("verify");
        assert!(report.ok(), "{report:?}");
        assert_eq!((report.last_seq, report.last_checkpoint_seq), (20, Some(20)));
    }

    #[test]
    fn forged_and_changed_checkpoints_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, keys) = sample(dir.path(), 25, 10);
        let cp_at = |c: &Connection, seq: i64| -> Checkpoint {
            let text: String =
                c.query_row("SELECT json FROM audit_checkpoints WHERE seq = ?1", [seq], |r| r.get(0)).expect("cp");
            serde_json::from_str(&text).expect("json")
        };
        let put = |c: &Connection, cp: &Checkpoint| {
            let text = canonical_json(&serde_json::to_value(cp).expect("json"));
            c.execute("UPDATE audit_checkpoints SET json = ?2 WHERE seq = ?1", params![to_db(cp.seq), text])
                .expect("put");
        };

        // Signed by another key that claims the same kid.
        let copy = tampered(&path, "forged", |c| {
            let cp = cp_at(c, 10);
            let (forger, _) = AuditSigner::generate("audit-1").expect("keygen");
            put(c, &forger.sign(&cp.writer, cp.seq, &cp.hash, cp.time_ms).expect("sign"));
        });
        assert_problem(
            &first_problem(&copy, &keys),
            10,
            ProblemKind::BadCheckpoint,
            "its signature does not verify under key \"audit-1\"",
        );

        let copy = tampered(&path, "unknown-kid", |c| {
            let mut cp = cp_at(c, 10);
            cp.kid = "other".into();
            put(c, &cp);
        });
        assert_problem(&first_problem(&copy, &keys), 10, ProblemKind::BadCheckpoint, "unknown key \"other\"");

        // The hash changed to another record's.
        let copy = tampered(&path, "cp-hash", |c| {
            let mut cp = cp_at(c, 20);
            cp.hash = stored(c, 19)["hash"].as_str().expect("hash").to_owned();
            put(c, &cp);
        });
        assert_problem(
            &first_problem(&copy, &keys),
            20,
            ProblemKind::BadCheckpoint,
            "the checkpoint at record 20 is invalid: its signature does not verify",
        );

        // The first problem in chain order wins: a bad checkpoint at 10 before an altered record 15.
        let copy = tampered(&path, "both", |c| {
            let mut cp = cp_at(c, 10);
            cp.signature = "00".repeat(64);
            put(c, &cp);
            c.execute("UPDATE audit_records SET json = 'x' WHERE seq = 15", []).expect("update");
        });
        assert_problem(&first_problem(&copy, &keys), 10, ProblemKind::BadCheckpoint, "record 10 is invalid");
    }

    #[test]
    fn an_inserted_record_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, keys) = sample(dir.path(), 25, 10);
        // A well-formed record, hashed and linked to record 7, put in as 8; the rest moved up.
        let copy = tampered(&path, "inserted", |c| {
            c.execute("UPDATE audit_records SET seq = -(seq + 1) WHERE seq >= 8", []).expect("shift");
            c.execute("UPDATE audit_records SET seq = -seq WHERE seq < 0", []).expect("shift");
            let mut v = stored(c, 7);
            v["seq"] = 8.into();
            v["prev_hash"] = v["hash"].clone();
            v["subject"]["owner"] = "mallory".into();
            rehash(&mut v);
            c.execute(
                "INSERT INTO audit_records (seq, time_ms, kind, hash, json) VALUES (8, 0, 'job.accepted', '', ?1)",
                [canonical_json(&v)],
            )
            .expect("insert");
        });
        assert_problem(&first_problem(&copy, &keys), 8, ProblemKind::Inserted, "record 8 was inserted");

        // A copy of a record right after it.
        let copy = tampered(&path, "duplicated", |c| {
            c.execute("UPDATE audit_records SET seq = -(seq + 1) WHERE seq >= 4", []).expect("shift");
            c.execute("UPDATE audit_records SET seq = -seq WHERE seq < 0", []).expect("shift");
            let v = stored(c, 3);
            c.execute(
                "INSERT INTO audit_records (seq, time_ms, kind, hash, json) VALUES (4, 0, 'job.accepted', '', ?1)",
                [canonical_json(&v)],
            )
            .expect("insert");
        });
        assert_problem(&first_problem(&copy, &keys), 4, ProblemKind::Inserted, "it is a copy of record 3");

        // A made-up record at the end that does not follow the head.
        let copy = tampered(&path, "appended", |c| {
            let mut v = stored(c, 25);
            v["seq"] = 26.into();
            v["prev_hash"] = "ab".repeat(32).into();
            rehash(&mut v);
            c.execute(
                "INSERT INTO audit_records (seq, time_ms, kind, hash, json) VALUES (26, 0, 'job.accepted', '', ?1)",
                [canonical_json(&v)],
            )
            .expect("insert");
        });
        assert_problem(
            &first_problem(&copy, &keys),
            25,
            ProblemKind::Altered,
            "record 25 was altered (its hash recomputed), or record 26 was",
        );
    }

    #[test]
    fn canonical_encoding_is_pinned() {
        // Changing this hash means every stored trail stops verifying: do not, without a new
        // RECORD_FORMAT and a verifier that still reads format 1.
        let record = AuditRecord {
            format: 1,
            seq: 42,
            time_ms: 1_700_000_000_000,
            writer: "gateway".into(),
            kind: AuditKind::Other("output.written".into()),
            actor: Some("ep-1".into()),
            subject: Subject {
                job: Some("job-1".into()),
                owner: Some("alice".into()),
                paths: vec!["/data/out/a.sum".into()],
                ..Subject::default()
            },
            detail: serde_json::json!({"z": [1, "é\n\u{1}"], "a": {"y": true, "b": null}, "B": -3}),
            prev_hash: "11".repeat(32),
            hash: String::new(),
        };
        let mut without = serde_json::to_value(&record).expect("json");
        without.as_object_mut().expect("object").remove("hash");
        assert_eq!(
            canonical_json(&without),
            concat!(
                r#"{"actor":"ep-1","detail":{"B":-3,"a":{"b":null,"y":true},"z":[1,"é\n\u0001"]},"format":1,"#,
                r#""kind":"output.written","#,
                r#""prev_hash":"1111111111111111111111111111111111111111111111111111111111111111","#,
                r#""seq":42,"subject":{"digest":null,"event_id":null,"function":null,"job":"job-1","owner":"alice","#,
                r#""paths":["/data/out/a.sum"],"token_jti":null},"time_ms":1700000000000,"writer":"gateway"}"#
            )
        );
        assert_eq!(
            record.compute_hash().expect("hash"),
            "49c0df357a99cc536cf29e0b491e7bda1a94470822683bc365e283a94ebeaa1c"
        );
    }

    #[test]
    fn canonical_json_sorts_members_at_every_depth() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"d":[{"y":1,"x":2}],"c":3},"_":0,"B":2}"#).expect("json");
        let b: Value = serde_json::from_str(r#"{"B":2,"_":0,"a":{"c":3,"d":[{"x":2,"y":1}]},"b":1}"#).expect("json");
        let text = canonical_json(&a);
        assert_eq!(text, r#"{"B":2,"_":0,"a":{"c":3,"d":[{"x":2,"y":1}]},"b":1}"#);
        assert_eq!(text, canonical_json(&b));
        // The stored text is its own canonical form.
        let record = AuditRecord { hash: "00".into(), ..serde_json::from_value(stored_example()).expect("record") };
        let stored_text = record.to_stored_json().expect("json");
        assert_eq!(canonical_json(&serde_json::from_str(&stored_text).expect("json")), stored_text);
    }

    fn stored_example() -> Value {
        serde_json::json!({
            "format": 1, "seq": 1, "time_ms": 5, "writer": "w", "kind": "some.future.kind", "actor": null,
            "subject": {}, "detail": {"k": [1, 2]}, "prev_hash": GENESIS_HASH, "hash": ""
        })
    }

    #[test]
    fn unknown_kinds_round_trip() {
        let record: AuditRecord = serde_json::from_value(stored_example()).expect("record");
        assert_eq!(record.kind, AuditKind::Other("some.future.kind".into()));
        assert_eq!(serde_json::to_value(&record).expect("json")["kind"], "some.future.kind");
        for kind in AuditKind::KNOWN {
            assert_eq!(AuditKind::from(kind.as_str().to_owned()), kind);
        }
    }

    #[test]
    fn bearer_credentials_never_reach_the_trail() {
        let key = crate::macaroon::RootKey::derive(b"storage secret");
        let caveats = vec!["path:/data/raw/a.dat".to_owned(), "activity:DOWNLOAD".to_owned()];
        let bearer = crate::macaroon::mint(&key, "storage", "mac-id-123", &caveats).expect("mint");
        assert!(looks_like_bearer(&bearer));
        // The cheap pre-check lets every base64 spelling through to the parser.
        let mut standard = bearer.replace('-', "+").replace('_', "/");
        standard.push_str(&"=".repeat((4 - standard.len() % 4) % 4));
        assert!(looks_like_bearer(&standard));

        // The helper keeps identifier and caveats only, and refuses a bearer given as either.
        let facts = MacaroonFacts::from_bearer("read", &bearer).expect("facts");
        assert_eq!(facts, MacaroonFacts { role: "read".into(), identifier: "mac-id-123".into(), caveats });
        assert!(matches!(MacaroonFacts::new("read", &bearer, vec![]), Err(AuditError::Secret(_))));
        assert!(matches!(
            MacaroonFacts::new("read", "id", vec![format!("Bearer {bearer}")]),
            Err(AuditError::Secret(_))
        ));

        let (signer, _) = crate::token::SigningKey::generate("k").expect("keygen");
        let jwt = signer.sign(&serde_json::json!({"sub": "alice"})).expect("sign");
        assert!(looks_like_bearer(&jwt));

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("trail.sqlite");
        let log = AuditLog::open(&path, "gateway", None, CheckpointPolicy::default()).expect("open");
        let obtained = log
            .append(AuditDraft::macaroons_obtained(Subject { job: Some("j".into()), ..Subject::default() }, &[facts]))
            .expect("append");
        assert_eq!(obtained.subject.paths, ["/data/raw/a.dat"]);
        // A careless caller: bearers in the actor, a subject field, a detail value and a key.
        let careless = AuditDraft::admin_action(
            &format!("Bearer {jwt}"),
            "debug",
            Subject { owner: Some(jwt.clone()), ..Subject::default() },
            serde_json::json!({ "macaroon": bearer, "nested": [{ jwt.clone(): 1 }] }),
        );
        let record = log.append(careless).expect("append");
        let text = record.to_stored_json().expect("json");
        assert!(!text.contains(&bearer) && !text.contains(&jwt), "{text}");
        assert_eq!(text.matches(REDACTED).count(), 4, "{text}");
        drop(log);
        let mut bytes = std::fs::read(&path).expect("read");
        bytes.extend(std::fs::read(path.with_extension("sqlite-wal")).unwrap_or_default());
        for secret in [&bearer, &jwt] {
            assert!(!bytes.windows(secret.len()).any(|w| w == secret.as_bytes()), "a bearer reached the file");
        }
        assert!(verify(&path, &AuditKeys::new()).expect("verify").ok());
    }

    #[test]
    fn ordinary_strings_are_not_taken_for_bearers() {
        let ordinary = [
            "/data/raw/run-000123/detector-A/chunk-0000000042.dat".to_owned(),
            Digest::of(b"x").as_str().to_owned(),
            Digest::of(b"x").hex().to_owned(),
            uuid::Uuid::new_v4().to_string(),
            "dcache-billing:write:0000ABCDEF0123456789/door-session-1".to_owned(),
            "before:2030-01-01T00:00:00.000Z".to_owned(),
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".to_owned(),
            "eyJ0aGlzIjoibm90In0.a-jwt.at-all".to_owned(),
            "alice@example.org".to_owned(),
        ];
        for s in &ordinary {
            assert!(!looks_like_bearer(s), "{s} taken for a bearer");
        }
        for i in 0..200u32 {
            let hex = hex::encode(Sha256::digest(i.to_be_bytes()));
            assert!(!looks_like_bearer(&hex), "{hex} taken for a bearer");
        }
    }

    #[test]
    fn concurrent_appends_stay_one_chain() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("trail.sqlite");
        let (signer, pem) = AuditSigner::generate("audit-1").expect("keygen");
        let keys = signer.keys();
        let policy = CheckpointPolicy { every_records: 7, every_ms: u64::MAX };
        // Two handles on the file, as two processes would have; four threads each.
        let a = AuditLog::open(&path, "scheduler", Some(signer), policy).expect("open a");
        let b = AuditLog::open(
            &path,
            "scheduler",
            Some(AuditSigner::from_pem("audit-1", pem.as_bytes()).expect("pem")),
            policy,
        )
        .expect("open b");
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let log = if t % 2 == 0 { a.clone() } else { b.clone() };
                s.spawn(move || {
                    for i in 0..40 {
                        log.append(draft(t * 1000 + i)).expect("append");
                    }
                });
            }
        });
        drop((a, b));
        let report = verify(&path, &keys).expect("verify");
        assert!(report.ok(), "{report:?}");
        assert_eq!((report.records, report.last_seq), (320, 320));
        assert_eq!(report.checkpoints, 320 / 7);
    }

    #[test]
    fn garbage_rows_never_panic() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, keys) = sample(dir.path(), 12, 4);
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        fn random_json(next: &mut dyn FnMut() -> u64, depth: u32) -> Value {
            match next() % if depth > 3 { 6 } else { 8 } {
                0 => Value::Null,
                1 => Value::Bool(next().is_multiple_of(2)),
                2 => Value::from(next() as i64),
                3 => serde_json::Number::from_f64(f64::from_bits(next())).map_or(Value::Null, Value::Number),
                4 => Value::String((0..next() % 70).map(|_| char::from((next() % 95) as u8 + 32)).collect()),
                5 => Value::from(next()),
                6 => Value::Array((0..next() % 4).map(|_| random_json(next, depth + 1)).collect()),
                _ => {
                    let fields = ["seq", "hash", "prev_hash", "format", "writer", "kind", "subject", "detail", "x"];
                    let mut m = Map::new();
                    for _ in 0..next() % 10 {
                        m.insert(fields[(next() % 9) as usize].into(), random_json(next, depth + 1));
                    }
                    Value::Object(m)
                }
            }
        }
        let fields = ["seq", "hash", "prev_hash", "format", "writer", "kind", "subject", "detail", "time_ms", "actor"];
        let mut found = 0;
        for round in 0..150 {
            let copy = tampered(&path, &format!("fuzz-{}", round % 4), |c| {
                for _ in 0..1 + next() % 3 {
                    let seq = (next() % 14) as i64;
                    let table = if next() % 4 == 0 { "audit_checkpoints" } else { "audit_records" };
                    let text: Option<rusqlite::types::Value> = c
                        .query_row(&format!("SELECT json FROM {table} WHERE seq = ?1"), [seq], |r| r.get(0))
                        .optional()
                        .expect("read");
                    let text = match text {
                        Some(rusqlite::types::Value::Text(t)) => t,
                        _ => "{}".into(),
                    };
                    let new: rusqlite::types::Value = match next() % 7 {
                        0 => {
                            let mut bytes = text.into_bytes();
                            if !bytes.is_empty() {
                                let i = (next() as usize) % bytes.len();
                                bytes[i] = (next() % 256) as u8;
                            }
                            String::from_utf8_lossy(&bytes).into_owned().into()
                        }
                        1 => text[..(next() as usize) % (text.len() + 1)].to_owned().into(),
                        2 => canonical_json(&random_json(&mut next, 0)).into(),
                        3 => {
                            let mut v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                            if let Some(o) = v.as_object_mut() {
                                o.insert(fields[(next() % 10) as usize].into(), random_json(&mut next, 2));
                            }
                            canonical_json(&v).into()
                        }
                        4 => rusqlite::types::Value::Blob(vec![0xff, 0, 1]),
                        5 => rusqlite::types::Value::Integer(next() as i64),
                        _ => "[".repeat(10_000).into(),
                    };
                    let moved = [-1, 0, i64::MAX, i64::MIN, 3][(next() % 5) as usize];
                    if next() % 5 == 0 {
                        let _ = c.execute(&format!("UPDATE {table} SET seq = ?2 WHERE seq = ?1"), params![seq, moved]);
                    } else if next() % 3 == 0 {
                        let sql = if table == "audit_records" {
                            "INSERT OR REPLACE INTO audit_records (seq, time_ms, kind, hash, json) VALUES (?1, 0, '', '', ?2)"
                        } else {
                            "INSERT OR REPLACE INTO audit_checkpoints (seq, time_ms, json) VALUES (?1, 0, ?2)"
                        };
                        let _ = c.execute(sql, params![seq, new]);
                    } else {
                        let _ = c.execute(&format!("UPDATE {table} SET json = ?2 WHERE seq = ?1"), params![seq, new]);
                    }
                }
            });
            let report = verify(&copy, &keys).expect("a damaged trail is a report, not an error");
            if let Some(p) = &report.first_problem {
                assert!(!p.message.is_empty());
                found += 1;
            }
            std::fs::remove_file(&copy).expect("remove");
        }
        assert!(found > 75, "only {found} of 150 damaged copies had a problem");
    }

    #[test]
    fn damaged_files_are_errors_not_panics() {
        let dir = tempfile::tempdir().expect("tempdir");
        let keys = AuditKeys::new();
        assert!(verify(&dir.path().join("missing.sqlite"), &keys).is_err());
        let junk = dir.path().join("junk.sqlite");
        std::fs::write(&junk, b"SQLite format 3\0 but not really, and then some garbage ......").expect("write");
        assert!(verify(&junk, &keys).is_err());
        let empty = dir.path().join("empty.sqlite");
        Connection::open(&empty).expect("create").execute_batch("CREATE TABLE t (x)").expect("table");
        assert!(matches!(verify(&empty, &keys), Err(AuditError::NotALog(_))));
        let (path, _) = sample(dir.path(), 3, 10);
        let dropped = tampered(&path, "dropped", |c| c.execute_batch("DROP TABLE audit_records").expect("drop"));
        assert!(matches!(verify(&dropped, &keys), Err(AuditError::Db(_))));
    }

    #[test]
    fn queries_select_by_subject_and_time() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, _) = sample(dir.path(), 12, 100);
        let seqs = |f: AuditFilter| -> Vec<u64> { query(&path, &f).expect("query").iter().map(|r| r.seq).collect() };
        assert_eq!(seqs(AuditFilter { job: Some("job-1".into()), ..AuditFilter::default() }), [4, 5, 6]);
        assert_eq!(seqs(AuditFilter { token: Some("jti-2".into()), ..AuditFilter::default() }), [7, 8, 9]);
        assert_eq!(seqs(AuditFilter { owner: Some("alice".into()), ..AuditFilter::default() }), [1, 3, 5, 7, 9, 11]);
        assert_eq!(
            seqs(AuditFilter { owner: Some("alice".into()), job: Some("job-1".into()), ..AuditFilter::default() }),
            [5]
        );
        assert_eq!(seqs(AuditFilter { file: Some("/data/raw/3.dat".into()), ..AuditFilter::default() }), [10, 11, 12]);
        assert_eq!(seqs(AuditFilter { file: Some("/data/out/3.sum".into()), ..AuditFilter::default() }), [12]);
        assert_eq!(
            seqs(AuditFilter { function: Some("checksum".into()), limit: Some(2), ..AuditFilter::default() }),
            [1, 2]
        );
        assert_eq!(seqs(AuditFilter { event_id: Some("ev-0".into()), ..AuditFilter::default() }), [1, 2, 3]);
        let all = query(&path, &AuditFilter::default()).expect("query");
        let t = all[5].time_ms;
        let window = seqs(AuditFilter { since_ms: Some(t), until_ms: Some(t + 1), ..AuditFilter::default() });
        assert!(window.contains(&6) && window.iter().all(|s| all[(*s - 1) as usize].time_ms == t), "{window:?}");
        assert!(seqs(AuditFilter { until_ms: Some(all[0].time_ms), ..AuditFilter::default() }).is_empty());
        assert!(seqs(AuditFilter { owner: Some("nobody".into()), ..AuditFilter::default() }).is_empty());
    }

    #[test]
    fn reopening_continues_the_chain_and_refuses_another_writer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, keys) = sample(dir.path(), 5, 100);
        assert!(matches!(
            AuditLog::open(&path, "scheduler", None, CheckpointPolicy::default()),
            Err(AuditError::WrongWriter { .. })
        ));
        assert!(matches!(
            AuditLog::open(&path, "gate way", None, CheckpointPolicy::default()),
            Err(AuditError::BadWriter(_))
        ));
        let log = AuditLog::open(&path, "gateway", None, CheckpointPolicy::default()).expect("reopen");
        let (head, head_hash) = log.head().expect("head").expect("some");
        let record = log.append(draft(5)).expect("append");
        assert_eq!((record.seq, &record.prev_hash), (head + 1, &head_hash));
        // The triggers keep the code from rewriting history.
        let conn = Connection::open(&path).expect("open");
        assert!(conn.execute("UPDATE audit_records SET json = '{}' WHERE seq = 1", []).is_err());
        assert!(conn.execute("DELETE FROM audit_records WHERE seq = 6", []).is_err());
        assert!(conn.execute("DELETE FROM audit_record_paths", []).is_err());
        // Verifying a log that is open for appends.
        assert!(verify(&path, &keys).expect("verify").ok());
        drop((conn, log));
    }

    #[test]
    fn checkpoints_by_count_time_and_on_demand() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("trail.sqlite");
        let (signer, _) = AuditSigner::generate("audit-1").expect("keygen");
        let keys = keys_from_jwks(&signer.jwks()).expect("keys");
        let log = AuditLog::open(&path, "gateway", Some(signer), CheckpointPolicy::default()).expect("open");
        assert_eq!(log.checkpoint_now().expect("empty"), None);
        for i in 0..3 {
            log.append(draft(i)).expect("append");
        }
        assert_eq!(log.checkpoint_if_due().expect("not due"), None);
        let cp = log.checkpoint_now().expect("now").expect("signed");
        assert_eq!((cp.seq, cp.writer.as_str(), cp.kid.as_str()), (3, "gateway", "audit-1"));
        assert_eq!(log.checkpoint_now().expect("again"), None);
        drop(log);
        // Time-based: every append past `every_ms` signs.
        let policy = CheckpointPolicy { every_records: 1000, every_ms: 0 };
        let log = AuditLog::open(&path, "gateway", Some(AuditSigner::generate("audit-2").expect("keygen").0), policy)
            .expect("open");
        log.append(draft(3)).expect("append");
        assert_eq!(
            log.checkpoints().expect("list").iter().map(|c| (c.seq, c.kid.as_str())).collect::<Vec<_>>(),
            [(3, "audit-1"), (4, "audit-2")]
        );
        drop(log);
        // audit-2 is not among the keys given.
        assert_problem(&first_problem(&path, &keys), 4, ProblemKind::BadCheckpoint, "unknown key \"audit-2\"");
    }

    #[test]
    fn a_log_inside_another_database_commits_and_rolls_back_with_its_host() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("host.sqlite");
        let mut conn = Connection::open(&path).expect("open");
        conn.execute_batch("CREATE TABLE jobs (id TEXT PRIMARY KEY); PRAGMA user_version = 7;").expect("host");
        install(&conn, "scheduler").expect("install");
        install(&conn, "scheduler").expect("install again is a no-op");
        assert!(matches!(install(&conn, "gateway"), Err(AuditError::WrongWriter { .. })));
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).expect("version");
        assert_eq!(version, 7, "the host's user_version is its own");

        // A decision and its record commit together ...
        let tx = conn.transaction().expect("tx");
        tx.execute("INSERT INTO jobs (id) VALUES ('job-0')", []).expect("decision");
        let first = append_in(&tx, draft(0)).expect("append");
        tx.commit().expect("commit");
        // ... or neither does.
        let tx = conn.transaction().expect("tx");
        tx.execute("INSERT INTO jobs (id) VALUES ('job-1')", []).expect("decision");
        append_in(&tx, draft(1)).expect("append");
        drop(tx);
        let jobs: i64 = conn.query_row("SELECT COUNT(*) FROM jobs", [], |r| r.get(0)).expect("count");
        assert_eq!(jobs, 1);
        assert_eq!(head_in(&conn).expect("head"), Some((1, first.hash.clone())));

        let (signer, _) = AuditSigner::generate("audit-1").expect("keygen");
        let policy = CheckpointPolicy { every_records: 2, every_ms: u64::MAX };
        assert_eq!(checkpoint_in(&conn, &signer, policy, false).expect("not due"), None);
        let tx = conn.transaction().expect("tx");
        let second = append_in(&tx, draft(1)).expect("append");
        // Inside the caller's transaction too.
        let cp = checkpoint_in(&tx, &signer, policy, false).expect("due").expect("signed");
        tx.commit().expect("commit");
        assert_eq!((cp.seq, cp.hash.as_str(), cp.writer.as_str()), (2, second.hash.as_str(), "scheduler"));
        assert_eq!(checkpoints_in(&conn).expect("list"), [cp]);
        drop(conn);

        // verify and query read the host's file.
        let report = verify(&path, &signer.keys()).expect("verify");
        assert_eq!((report.records, report.checkpoints, report.last_checkpoint_seq), (2, 1, Some(2)));
        assert!(report.ok(), "{report:?}");
        let job1 = query(&path, &AuditFilter { job: Some("job-0".into()), ..AuditFilter::default() }).expect("q");
        assert_eq!(job1.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 2]);
        // An AuditLog on the same file continues the chain.
        let log = AuditLog::open(&path, "scheduler", None, CheckpointPolicy::default()).expect("open");
        assert_eq!(log.append(draft(2)).expect("append").prev_hash, second.hash);
    }

    #[test]
    fn filters_have_url_names_and_refuse_unknown_ones() {
        let f =
            AuditFilter { event_id: Some("ev".into()), since_ms: Some(5), limit: Some(2), ..AuditFilter::default() };
        let v = serde_json::to_value(&f).expect("json");
        assert_eq!(v, serde_json::json!({"event": "ev", "since": 5, "limit": 2}));
        assert_eq!(serde_json::from_value::<AuditFilter>(v).expect("back"), f);
        assert!(serde_json::from_value::<AuditFilter>(serde_json::json!({"jobs": "x"})).is_err());
    }

    #[test]
    fn drafts_take_extra_detail() {
        let d = AuditDraft::job_released(Subject::default(), "fixed").with_detail("n", 1.into());
        assert_eq!(d.detail, serde_json::json!({"reason": "fixed", "n": 1}));
        let d = AuditDraft::new(AuditKind::AdminAction, Subject::default(), "x".into()).with_detail("n", 1.into());
        assert_eq!(d.detail, serde_json::json!({"detail": "x", "n": 1}));
        let d = AuditDraft::new(AuditKind::AdminAction, Subject::default(), Value::Null).with_detail("n", 1.into());
        assert_eq!(d.detail, serde_json::json!({"n": 1}));
    }

    /// By hand: `cargo test -p htfaas-functions --release audit::tests::append_rate -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, not a test"]
    fn append_rate() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("trail.sqlite");
        let (signer, _) = AuditSigner::generate("audit-1").expect("keygen");
        let log = AuditLog::open(&path, "gateway", Some(signer), CheckpointPolicy::default()).expect("open");
        let n = 3000;
        let start = std::time::Instant::now();
        for i in 0..n {
            log.append(draft(i)).expect("append");
        }
        let elapsed = start.elapsed();
        drop(log);
        let verify_start = std::time::Instant::now();
        assert!(verify(&path, &AuditKeys::new()).is_ok());
        println!(
            "{{\"appends\":{n},\"append_per_s\":{:.0},\"verify_per_s\":{:.0}}}",
            n as f64 / elapsed.as_secs_f64(),
            n as f64 / verify_start.elapsed().as_secs_f64()
        );
    }

    #[test]
    fn encoding_each_member_once_matches_the_canonical_json_of_the_record() {
        let odd = "tab\there \"quoted\" back\\slash \u{1} \u{7f} é 😀";
        let mut drafts: Vec<AuditDraft> = (0..9).map(draft).collect();
        drafts.push(
            AuditDraft::new(
                AuditKind::Other(odd.into()),
                Subject { owner: Some(odd.into()), ..Subject::default() },
                odd.into(),
            )
            .with_actor(odd)
            .with_detail(odd, serde_json::json!({"z": 1.5, "a": [null, true, -3, {"y": odd, "b": u64::MAX}]})),
        );
        drafts.push(AuditDraft::new(AuditKind::JobHeld, Subject::default(), Value::Null));
        for (i, d) in drafts.into_iter().enumerate() {
            let mut record = AuditRecord {
                format: RECORD_FORMAT,
                seq: i as u64 + 1,
                time_ms: 1_700_000_000_000 + i as u64,
                writer: "scheduler".into(),
                kind: d.kind,
                actor: d.actor,
                subject: d.subject,
                detail: d.detail,
                prev_hash: GENESIS_HASH.into(),
                hash: String::new(),
            };
            let (hashed, stored) = encode_record(&mut record).expect("encode");
            let mut value = serde_json::to_value(&record).expect("value");
            assert_eq!(stored, canonical_json(&value), "record {i}");
            value.as_object_mut().expect("object").remove("hash");
            assert_eq!(hashed, canonical_json(&value), "record {i}");
            assert_eq!(record.hash, content_hash(&value), "record {i}");
            assert_eq!(record.hash, record.compute_hash().expect("hash"), "record {i}");
        }
    }

    /// By hand: `cargo test -p htfaas-functions --release audit::tests::append_cost -- --ignored --nocapture`.
    /// Where the time of one scheduler-like record goes (µs per record), and what a commit costs
    /// with one or three records in it.
    #[test]
    #[ignore = "a measurement, not a test"]
    fn append_cost() {
        fn sched_draft(i: u64) -> AuditDraft {
            let subject = Subject {
                job: Some(format!("0190a1b2-c3d4-7e5f-8a9b-{:012x}", i)),
                token_jti: Some(format!("01J9ZB3Q7T4V2XKQ8M5N6P7R{:02}", i % 100)),
                owner: Some("alice".into()),
                function: Some("checksum".into()),
                digest: Some(Digest::of(b"m").as_str().to_owned()),
                event_id: Some(format!("ev-0190a1b2-c3d4-7e5f-{:012x}", i)),
                paths: vec![format!("/data/raw/{}.dat", i)],
            };
            let ep = "ep-0190a1b2-c3d4-7e5f-8a9b";
            let usage = Usage {
                wall_ms: 12,
                cpu_ms: 3,
                peak_memory_bytes: 1 << 20,
                bytes_in: 1024,
                bytes_out: 32,
                instructions: Some(123456),
            };
            match i % 3 {
                0 => AuditDraft::job_accepted(subject, &Resources::default(), None).with_detail(
                    "input",
                    serde_json::json!({"path": "/data/raw/x.dat", "url": "http://127.0.0.1:9000/data/raw/x.dat"}),
                ),
                1 => AuditDraft::job_dispatched(subject, ep, "sess-0190a1b2-c3d4-7e5f-8a9b", 1),
                _ => AuditDraft::job_finished(
                    subject,
                    ep,
                    Some(("/data/raw/x.dat", 1024)),
                    &[OutputFile { path: format!("/data/out/{i}.sum"), size: 32, sha256: "ab".repeat(32) }],
                    &crate::proto::Outcome::Exited { exit_code: 0 },
                    &usage,
                ),
            }
        }
        let n = 20_000u64;
        let drafts: Vec<AuditDraft> = (0..n).map(sched_draft).collect();
        let t = std::time::Instant::now();
        let mut scrubbed = drafts.clone();
        let clone_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        let t = std::time::Instant::now();
        for d in &mut scrubbed {
            d.scrub();
        }
        let scrub_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        let t = std::time::Instant::now();
        for (i, d) in scrubbed.iter().enumerate() {
            let r = AuditRecord {
                format: 1,
                seq: i as u64,
                time_ms: 1,
                writer: "scheduler".into(),
                kind: d.kind.clone(),
                actor: d.actor.clone(),
                subject: d.subject.clone(),
                detail: d.detail.clone(),
                prev_hash: GENESIS_HASH.into(),
                hash: String::new(),
            };
            let mut r = r;
            std::hint::black_box(encode_record(&mut r).expect("encode"));
        }
        let encode_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        // The former way: one `Value` of the whole record, encoded twice.
        let t = std::time::Instant::now();
        for (i, d) in scrubbed.iter().enumerate() {
            let r = AuditRecord {
                format: 1,
                seq: i as u64,
                time_ms: 1,
                writer: "scheduler".into(),
                kind: d.kind.clone(),
                actor: d.actor.clone(),
                subject: d.subject.clone(),
                detail: d.detail.clone(),
                prev_hash: GENESIS_HASH.into(),
                hash: String::new(),
            };
            let mut value = serde_json::to_value(&r).expect("value");
            value.as_object_mut().expect("object").remove("hash");
            let h = content_hash(&value);
            value.as_object_mut().expect("object").insert("hash".into(), Value::String(h));
            std::hint::black_box(canonical_json(&value));
        }
        let encode_twice_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        let t = std::time::Instant::now();
        let mut parsed = 0;
        for d in &drafts {
            for s in
                [&d.subject.job, &d.subject.token_jti, &d.subject.digest, &d.subject.event_id].into_iter().flatten()
            {
                parsed += usize::from(crate::macaroon::identifier(s).is_ok());
            }
        }
        let parse_always_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        std::hint::black_box(parsed);
        let dir = tempfile::tempdir().expect("tempdir");
        let mut conn = Connection::open(dir.path().join("q.sqlite")).expect("open");
        conn.pragma_update(None, "journal_mode", "WAL").expect("wal");
        conn.pragma_update(None, "synchronous", "OFF").expect("sync");
        install(&conn, "scheduler").expect("install");
        let tx = conn.transaction().expect("tx");
        let t = std::time::Instant::now();
        for d in drafts.iter().cloned() {
            append_in(&tx, d).expect("append");
        }
        let append_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        tx.commit().expect("commit");
        conn.pragma_update(None, "synchronous", "FULL").expect("sync");
        let mut commit = |per_tx: u64| {
            let rounds = 200u64;
            let t = std::time::Instant::now();
            for r in 0..rounds {
                let tx = conn.transaction().expect("tx");
                tx.execute("CREATE TABLE IF NOT EXISTS host (x)", []).expect("host");
                tx.execute("INSERT INTO host (x) VALUES (?1)", [r as i64]).expect("host");
                for i in 0..per_tx {
                    append_in(&tx, drafts[(r * 5 + 2 + i) as usize % drafts.len()].clone()).expect("append");
                }
                tx.commit().expect("commit");
            }
            t.elapsed().as_secs_f64() * 1e6 / rounds as f64
        };
        let (c0, c1, c3) = (commit(0), commit(1), commit(3));
        println!(
            "{{\"clone_us\":{clone_us:.2},\"scrub_us\":{scrub_us:.2},\"parse_4_subject_fields_us\":{parse_always_us:.2},\"encode_us\":{encode_us:.2},\"encode_twice_us\":{encode_twice_us:.2},\"append_in_us\":{append_us:.2},\"tx_full_0_us\":{c0:.0},\"tx_full_1_us\":{c1:.0},\"tx_full_3_us\":{c3:.0}}}"
        );
    }
}
