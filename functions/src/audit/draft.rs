//! Drafts: what callers hand to an append ([`AuditDraft`]), the facts of a macaroon worth
//! keeping ([`MacaroonFacts`]), and the redaction of bearer credentials ([`looks_like_bearer`]).
//! The constructor of each record kind is in [`crate::audit_kinds`].
//!
//! Must not know: SQLite, numbering and chaining (the store's), the wire types.

use super::AuditError;
#[cfg(feature = "db")]
use super::REDACTED;
use super::record::{AuditKind, Subject};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A record before the log numbers, times and chains it. Build it with the constructor of its
/// kind; each documents what goes into `detail`. No constructor takes a credential.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditDraft {
    pub(super) kind: AuditKind,
    pub(super) actor: Option<String>,
    pub(super) subject: Subject,
    pub(super) detail: Value,
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
        // One parse for both (a job's two macaroons were each parsed twice here).
        let (identifier, caveats) =
            crate::macaroon::describe(bearer).map_err(|e| AuditError::Macaroon(e.to_string()))?;
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

impl AuditDraft {
    /// Any kind, with free-form `detail`. Prefer the typed constructors; bearer credentials
    /// anywhere in the draft are redacted when it is appended. An empty path (the event of a
    /// run on no file names none) is dropped from the subject: a query by file never finds it.
    pub fn new(kind: AuditKind, mut subject: Subject, detail: Value) -> AuditDraft {
        subject.paths.retain(|p| !p.is_empty());
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

    #[cfg(feature = "db")]
    /// Replaces every bearer credential in the draft by [`REDACTED`]; returns how many.
    pub(super) fn scrub(&mut self) -> usize {
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

#[cfg(feature = "db")]
fn scrub_string(s: &mut String) -> usize {
    if looks_like_bearer(s) {
        *s = REDACTED.to_owned();
        1
    } else {
        0
    }
}

#[cfg(feature = "db")]
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
