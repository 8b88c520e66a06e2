//! Storage events as their sources send them: a message's subject, headers and bytes in, a
//! decision out. The gateway's ingest decides with it, and the bridges route with it.
//!
//! Every source is normalized into one [`StorageEvent`] (see `crate::event`), with
//! the producer's identity kept for audit:
//!
//! - [`dcache`]: dCache billing messages (Kafka → NATS, or the built-in storage) on
//!   [`EVENTS_SUBJECT`] or on a path subject (`storage.dcache.billing.path.<dir>._`,
//!   [`crate::proto::path_subject`]), whose directory must be its path's
//!   ([`EventError::SubjectPath`]: a publisher cannot route an event to another directory's
//!   readers): every `msgType` (`transfer`, `request`, `remove`, `store`, `restore`,
//!   `hit`; `warning` is never an event) with its quirks (`shared/reference/dcache.md` §1);
//! - [`cloudevents`]: CloudEvents 1.0 on `storage.cloudevents.<producer>`
//!   ([`CLOUDEVENTS_SUBJECT_PREFIX`]), in structured and binary mode: those of htfaas's bridges
//!   (type `org.htfaas.storage.<source>.<msg_type>`, data a `BridgedEvent`) and any other
//!   producer's.
//!
//! The site chooses which sources and which dCache types become events ([`SourcePolicy`]).
//! Outcomes: *fire* (match triggers), *ignore* (well-formed, never an event: a failed
//! operation, a pool-to-pool copy, no usable path, a type the site did not enable, a path in a
//! quarantine directory — `.quarantine`, where failed runs' outputs go) or
//! *malformed* ([`EventError`]). Ignored and malformed messages are acked and counted, never
//! retried. Nothing here panics on bytes from the network.
//!
//! [`binding`]: which paths each subject may speak for; [`decide_bound`] refuses an event
//! outside them ([`EventError::OutOfBounds`]).

pub mod binding;
pub mod cloudevents;
pub mod dcache;

use crate::event::StorageEvent;
use crate::manifest::is_clean_abs_path;
use crate::on_failure::is_quarantined;
use crate::proto::{CLOUDEVENTS_SUBJECT_PREFIX, EVENTS_SUBJECT, is_path_subject, path_subject};
use serde::Deserialize;

/// What to do with a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// A storage event: match triggers.
    Fire(Box<StorageEvent>),
    /// A valid message that is no event; the reason is for logs and counters.
    Ignore(&'static str),
    /// A valid message of a type the site did not enable ([`SourcePolicy`]); names the type,
    /// e.g. `dcache-billing remove`.
    NotEnabled(String),
}

/// Why a message is malformed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EventError {
    /// Not JSON, a field of the wrong type, a required field missing.
    #[error("not a dCache billing message: {0}")]
    Billing(String),
    /// Not a CloudEvent 1.0, or a bridge's event whose data is not a `BridgedEvent`.
    #[error("bad CloudEvent: {0}")]
    CloudEvent(String),
    /// The path is not a clean absolute file path.
    #[error("bad path {0:?}: not a clean absolute file path")]
    BadPath(String),
    /// No source reads this subject.
    #[error("no event source reads subject {0:?}")]
    Subject(String),
    /// A billing message on a path subject that is not its path's: the publisher routed it to
    /// the readers of another directory. Malformed: counted, acked, never fired.
    #[error("subject {subject} does not carry the directory of {path} (its subject is {expected})")]
    SubjectPath {
        /// The subject it came on.
        subject: String,
        /// The path it names.
        path: String,
        /// The path's own subject.
        expected: String,
    },
    /// A well-formed event for a path its subject may not speak for ([`binding`]).
    #[error("subject {subject} may not speak for {path} ({why})")]
    OutOfBounds {
        /// The subject it came on.
        subject: String,
        /// The path it names.
        path: String,
        /// `no source_paths rule names the subject` or `outside the subject's paths`.
        why: &'static str,
    },
}

/// Which sources, and which of their message types, become events: the site's choice.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourcePolicy {
    /// dCache billing `msgType`s that become events: any of `transfer` (pool: a write or a
    /// read), `request` (door: the same transfer seen by the door; fires once with `transfer`,
    /// same event id), `remove` (door: a namespace delete; pool: one replica dropped), `store`,
    /// `restore`, `hit`. Others are acked and counted as not enabled. Default: `["transfer"]`.
    #[serde(default = "default_dcache_msg_types")]
    pub dcache_msg_types: Vec<String>,
    /// Whether CloudEvents (htfaas's bridges and any other producer) become events.
    /// Default: true.
    #[serde(default = "default_true")]
    pub cloudevents: bool,
}

fn default_dcache_msg_types() -> Vec<String> {
    vec!["transfer".into()]
}
fn default_true() -> bool {
    true
}

impl Default for SourcePolicy {
    fn default() -> Self {
        SourcePolicy { dcache_msg_types: default_dcache_msg_types(), cloudevents: true }
    }
}

impl SourcePolicy {
    /// Refuses type names no source knows (a typo would silently fire nothing).
    pub fn validate(&self) -> Result<(), PolicyInvalid> {
        match self.dcache_msg_types.iter().find(|t| !dcache::MSG_TYPES.contains(&t.as_str())) {
            Some(t) => Err(PolicyInvalid::UnknownDcacheType(t.clone())),
            None => Ok(()),
        }
    }

    /// Whether the dCache billing `msgType` `t` becomes an event.
    pub fn enables_dcache(&self, t: &str) -> bool {
        self.dcache_msg_types.iter().any(|e| e == t)
    }
}

/// Why a [`SourcePolicy`] is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyInvalid {
    /// A dCache billing type that never fires (a typo would silently fire nothing).
    #[error("sources.dcache_msg_types: {0:?} is not a dCache billing type that can fire (one of {types})", types = dcache::MSG_TYPES.join(", "))]
    UnknownDcacheType(String),
}

/// The site's [`SourcePolicy`] now: read once per message ([`PolicyCell::current`]), replaced
/// whole ([`PolicyCell::replace`]), so each message is decided under one policy.
#[derive(Debug)]
pub struct PolicyCell(std::sync::RwLock<std::sync::Arc<SourcePolicy>>);

impl PolicyCell {
    /// A cell holding `policy`, as it is (the gateway validates it when its configuration is
    /// resolved).
    pub fn new(policy: SourcePolicy) -> PolicyCell {
        PolicyCell(std::sync::RwLock::new(std::sync::Arc::new(policy)))
    }

    /// The policy now.
    pub fn current(&self) -> std::sync::Arc<SourcePolicy> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the policy for the messages that follow, once it is valid.
    pub fn replace(&self, policy: SourcePolicy) -> Result<(), PolicyInvalid> {
        policy.validate()?;
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = std::sync::Arc::new(policy);
        Ok(())
    }
}

/// Which parser reads a subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubjectSource {
    /// [`EVENTS_SUBJECT`] or a path subject: dCache billing JSON.
    DcacheBilling,
    /// `storage.cloudevents.<producer>`.
    Cloudevents,
}

impl SubjectSource {
    /// The parser of `subject`, if any.
    pub fn of(subject: &str) -> Option<SubjectSource> {
        if subject == EVENTS_SUBJECT || is_path_subject(subject) {
            return Some(SubjectSource::DcacheBilling);
        }
        let producer = subject.strip_prefix(CLOUDEVENTS_SUBJECT_PREFIX)?.strip_prefix('.')?;
        (!producer.is_empty()).then_some(SubjectSource::Cloudevents)
    }
}

/// Decides what a message means. `message_id` names where it was read from (the JetStream
/// sequence, `nats-seq-<n>`): kept in the event's source for audit, and its identity of last
/// resort when the message carries none. An event whose path lies in a quarantine directory
/// ([`is_quarantined`]) or a re-run's scratch directory is ignored.
pub fn decide(
    subject: &str,
    headers: Option<&async_nats::HeaderMap>,
    payload: &[u8],
    message_id: &str,
    policy: &SourcePolicy,
) -> Result<Decision, EventError> {
    let mut decision = decide_source(subject, headers, payload, message_id, policy)?;
    // The message's own `traceparent` header, when the event does not bring one.
    if let Decision::Fire(event) = &mut decision
        && event.traceparent.is_none()
    {
        event.traceparent = cloudevents::valid_traceparent(cloudevents::header(headers, crate::trace::HEADER));
    }
    // A failed run's quarantined outputs never fire a function, whoever speaks of them.
    if let Decision::Fire(event) = &decision
        && is_quarantined(&event.path)
    {
        return Ok(Decision::Ignore("a quarantined output (a failed run's)"));
    }
    // Nor does a re-run's output: it is a check of a file that fired its functions already.
    if let Decision::Fire(event) = &decision
        && crate::proto::rerun::in_scratch(&event.path)
    {
        return Ok(Decision::Ignore("a re-run's output (a reproducibility check)"));
    }
    Ok(decision)
}

/// [`decide`] by the subject's source, before the quarantine check.
fn decide_source(
    subject: &str,
    headers: Option<&async_nats::HeaderMap>,
    payload: &[u8],
    message_id: &str,
    policy: &SourcePolicy,
) -> Result<Decision, EventError> {
    match SubjectSource::of(subject) {
        Some(SubjectSource::DcacheBilling) => {
            let decision = dcache::decide(payload, message_id, policy)?;
            if let Decision::Fire(event) = &decision
                && is_path_subject(subject)
            {
                let expected = path_subject(&event.path);
                if expected != subject {
                    return Err(EventError::SubjectPath {
                        subject: subject.to_owned(),
                        path: event.path.clone(),
                        expected,
                    });
                }
            }
            Ok(decision)
        }
        Some(SubjectSource::Cloudevents) => cloudevents::decide(headers, payload, message_id, policy),
        None => Err(EventError::Subject(subject.to_owned())),
    }
}

/// [`decide`], then refuses an event whose path `subject` may not speak for under `bindings`
/// ([`EventError::OutOfBounds`]). What the ingest and replays decide with. A path subject is
/// bound as [`EVENTS_SUBJECT`]: the same publisher (the storage) publishes both, and the path
/// subject only names the directory [`decide`] has checked.
pub fn decide_bound(
    subject: &str,
    headers: Option<&async_nats::HeaderMap>,
    payload: &[u8],
    message_id: &str,
    policy: &SourcePolicy,
    bindings: &binding::Bindings,
) -> Result<Decision, EventError> {
    let decision = decide(subject, headers, payload, message_id, policy)?;
    if let Decision::Fire(event) = &decision
        && let Err(refusal) =
            bindings.check(if is_path_subject(subject) { EVENTS_SUBJECT } else { subject }, &event.path)
    {
        let why = match refusal {
            binding::Refusal::Unbound => "no source_paths rule names the subject",
            binding::Refusal::Outside => "outside the subject's paths",
        };
        return Err(EventError::OutOfBounds { subject: subject.to_owned(), path: event.path.clone(), why });
    }
    Ok(decision)
}

/// `path` if it is a clean absolute file path (not `/`, not ending in `/`).
/// A producer's part of an event identity made safe to join with `/`: `%` and `/` are
/// percent-escaped, so `<source>/<id part>` splits back at its last `/` and no two distinct
/// (source, id) pairs share an identity. Ids without either character are unchanged.
fn id_part(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains(['%', '/']) {
        std::borrow::Cow::Owned(s.replace('%', "%25").replace('/', "%2F"))
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

fn checked_path(path: &str) -> Result<String, EventError> {
    if is_clean_abs_path(path) && !path.ends_with('/') {
        Ok(path.to_owned())
    } else {
        Err(EventError::BadPath(path.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_pick_their_parser_and_unknown_ones_are_malformed() {
        assert_eq!(SubjectSource::of("storage.dcache.billing"), Some(SubjectSource::DcacheBilling));
        assert_eq!(SubjectSource::of("storage.cloudevents.xrootd-notify"), Some(SubjectSource::Cloudevents));
        assert_eq!(SubjectSource::of("storage.cloudevents.a.b"), Some(SubjectSource::Cloudevents));
        assert_eq!(SubjectSource::of("storage.cloudevents"), None);
        assert_eq!(SubjectSource::of("storage.cloudevents."), None);
        assert_eq!(SubjectSource::of("storage.cloudeventsx.a"), None);
        assert_eq!(SubjectSource::of("storage.dcache.billing.path._"), Some(SubjectSource::DcacheBilling));
        assert_eq!(SubjectSource::of("storage.dcache.billing.x"), None);
        let p = SourcePolicy::default();
        assert_eq!(decide("other.subject", None, b"{}", "s", &p), Err(EventError::Subject("other.subject".into())));
    }

    #[test]
    fn the_policy_defaults_to_transfers_and_cloudevents_and_refuses_unknown_types() {
        let p: SourcePolicy = serde_json::from_str("{}").expect("parses");
        assert_eq!(p, SourcePolicy::default());
        assert_eq!(p.dcache_msg_types, vec!["transfer".to_owned()]);
        assert!(p.cloudevents && p.validate().is_ok());
        let all: SourcePolicy = serde_json::from_value(serde_json::json!({
            "dcache_msg_types": ["transfer", "request", "remove", "store", "restore", "hit"], "cloudevents": false
        }))
        .expect("parses");
        assert!(all.validate().is_ok());
        for bad in ["warning", "Transfer", "delete", ""] {
            let p = SourcePolicy { dcache_msg_types: vec![bad.into()], cloudevents: true };
            let e = p.validate().expect_err("refused");
            assert!(e.to_string().starts_with(&format!("sources.dcache_msg_types: {bad:?} is not")), "{e}");
        }
        assert!(serde_json::from_str::<SourcePolicy>(r#"{"dcache_types":[]}"#).is_err(), "typo refused");
    }

    /// An event naming a path in a quarantine directory or a re-run's scratch
    /// directory fires nothing, from any source (a publisher may say anything); a name that only
    /// looks like one fires as usual.
    #[test]
    fn a_quarantined_path_is_ignored_whoever_publishes_it() {
        let p = SourcePolicy::default();
        let billing = |path: &str| {
            serde_json::to_vec(&serde_json::json!({
                "msgType": "transfer", "isWrite": "write", "isP2p": false, "status": {"code": 0, "msg": ""},
                "cellName": "pool-a", "cellDomain": "poolDomain", "transferPath": path, "pnfsid": "0000BEEF",
                "session": "s1", "fileSize": 10,
            }))
            .expect("json")
        };
        // And a re-run's scratch directory likewise.
        for quarantined in ["/data/out/.quarantine/job-1/partial.txt", "/data/out/.rerun/job-1.ab/x.sum"] {
            for subject in [EVENTS_SUBJECT.to_owned(), path_subject(quarantined)] {
                let d = decide(&subject, None, &billing(quarantined), "s", &p).expect("well-formed");
                assert!(matches!(d, Decision::Ignore(_)), "{subject}: {d:?}");
            }
            let ce = serde_json::to_vec(&serde_json::json!({
                "specversion": "1.0", "id": "e1", "source": "forger", "type": "com.example.created",
                "subject": quarantined,
            }))
            .expect("json");
            let d = decide("storage.cloudevents.forger", None, &ce, "s", &p);
            assert!(matches!(d, Ok(Decision::Ignore(_))), "{d:?}");
        }
        for lookalike in ["/data/out/.quarantined/partial.txt", "/data/out/.reruns/x.sum"] {
            let d = decide(EVENTS_SUBJECT, None, &billing(lookalike), "s", &p).expect("well-formed");
            assert!(matches!(d, Decision::Fire(_)), "{d:?}");
        }
    }

    /// A billing message on a path subject fires only when the subject is its path's
    /// own; one routed to another directory's lane is malformed, whatever its bytes say.
    #[test]
    fn a_path_subject_must_be_its_paths_own() {
        let p = SourcePolicy::default();
        let body = |path: &str| {
            serde_json::to_vec(&serde_json::json!({
                "msgType": "transfer", "isWrite": "write", "isP2p": false, "status": {"code": 0, "msg": ""},
                "cellName": "pool-a", "cellDomain": "poolDomain", "transferPath": path, "pnfsid": "0000BEEF",
                "session": "s1", "fileSize": 10,
            }))
            .expect("json")
        };
        let own = path_subject("/data/bob/in.dat");
        assert!(matches!(decide(&own, None, &body("/data/bob/in.dat"), "s", &p), Ok(Decision::Fire(_))));
        let e = decide(&own, None, &body("/data/alice/x.dat"), "s", &p).expect_err("lies about its directory");
        assert_eq!(
            e.to_string(),
            "subject storage.dcache.billing.path.data.bob._ does not carry the directory of /data/alice/x.dat \
             (its subject is storage.dcache.billing.path.data.alice._)"
        );
        // A deeper path under the subject's directory is a lie too: the subject names the file's own.
        assert!(decide(&own, None, &body("/data/bob/sub/in.dat"), "s", &p).is_err());
        // The plain subject speaks for any path (the default lane; bindings bound it).
        assert!(matches!(decide(EVENTS_SUBJECT, None, &body("/data/alice/x.dat"), "s", &p), Ok(Decision::Fire(_))));
        // A path subject is bound as the billing subject.
        let rules = binding::Bindings::new(Some(vec![binding::SourcePaths {
            subject: EVENTS_SUBJECT.into(),
            paths: vec!["/data/".into()],
        }]))
        .expect("valid");
        assert!(decide_bound(&own, None, &body("/data/bob/in.dat"), "s", &p, &rules).is_ok());
        let outside = path_subject("/site/x");
        assert!(matches!(
            decide_bound(&outside, None, &body("/site/x"), "s", &p, &rules),
            Err(EventError::OutOfBounds { .. })
        ));
    }
}
