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
//! `time_ms`, `kind`, the subject fields and `hash` as columns, the subject's indexed for
//! queries; a time range is found as a range of `seq` by bisection, times never decreasing), `audit_record_paths` (`path`, `seq`) and `audit_checkpoints` (`seq`, `time_ms`,
//! JSON text). Triggers refuse `UPDATE` and `DELETE` on the last three, so a bug cannot
//! rewrite history; they do not stop someone with the file, which is what the chain and the
//! signatures are for. [`fn@verify`] and [`fn@query`] work on any file that holds the tables (a
//! standalone log or, say, the scheduler's queue); [`fn@verify`] reads only the JSON texts and
//! never trusts the copied columns.
//!
//! One database holds one chain, of one writer (`audit_meta`'s `writer`).
//!
//! Calls block on disk; async callers clone the [`AuditLog`] (a cheap handle) into
//! `spawn_blocking`.

#[cfg(feature = "db")]
pub mod anchor;
mod draft;
#[cfg(feature = "db")]
mod query;
mod record;
mod sign;
#[cfg(feature = "db")]
mod store;
#[cfg(all(test, feature = "db"))]
mod tests;
#[cfg(feature = "db")]
mod verify;

pub use draft::{AuditDraft, MacaroonFacts, looks_like_bearer};
#[cfg(feature = "db")]
pub use query::{AuditFilter, query, query_in};
pub use record::{AuditKind, AuditRecord, Subject, canonical_json};
pub use sign::{AuditKeys, AuditSigner, Checkpoint, CheckpointPolicy, keys_from_jwks, keys_from_jwks_text};
#[cfg(feature = "db")]
use store::open_read_only;
#[cfg(feature = "db")]
pub use store::{AuditLog, MIGRATIONS, SCHEMA_VERSION, append_in, checkpoint_in, checkpoints_in, head_in, install};
#[cfg(feature = "db")]
pub use verify::{Problem, ProblemKind, VerifyReport, verify};

/// The SQLite binding of [`install`], [`append_in`] and [`checkpoint_in`], for callers that
/// must name its types (the same version as this crate's).
#[cfg(feature = "db")]
pub use rusqlite;

/// The record format this build writes and verifies.
pub const RECORD_FORMAT: u32 = 1;
/// `prev_hash` of record 1.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// What a bearer credential found in a draft is replaced by.
pub const REDACTED: &str = "[redacted: bearer credential]";

/// Why an audit call failed. A damaged trail is not an error of [`fn@verify`]: it is its answer.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// SQLite failed, or the file is not a database (shown in the message, not returned as
    /// the source).
    #[cfg(feature = "db")]
    #[error("audit log database: {0}")]
    Db(rusqlite::Error),
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
    /// A stored record did not parse (queries; [`fn@verify`] reports it as a problem instead).
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

#[cfg(feature = "db")]
impl From<rusqlite::Error> for AuditError {
    fn from(e: rusqlite::Error) -> AuditError {
        AuditError::Db(e)
    }
}
