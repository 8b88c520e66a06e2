//! The storage-event conversation: the NATS stream and subjects that carry storage events,
//! dCache's billing message ([`TransferMessage`]), and how a job names the event that caused it
//! ([`EventRef`], [`Cause`]).
//!
//! Path subjects (fair ingest): a publisher that knows the file's path publishes its
//! billing message on [`path_subject`]`(path)`, `storage.dcache.billing.path.<c1>.….<cn>._`,
//! which carries the file's directory (each component one NATS token, [`encode_token`]) and
//! ends in the terminator token `_`. A namespace directory's filter ([`path_filter`]) is then
//! `storage.dcache.billing.path.<c1>.….<ck>.>`: it matches exactly the subjects of the files
//! under that directory, so the gateway can read each owner's events on a consumer of its own
//! (a *lane*) instead of behind every other owner's backlog. The terminator gives a file in `/`
//! a subject too (`storage.dcache.billing.path._`) and lets one `>` filter per directory cover
//! both its files and its subdirectories' (a `>` needs one token at least).
//!
//! Must not know: trigger rules, jobs beyond their provenance, the audit trail.

use crate::digest::Digest;
use serde::{Deserialize, Serialize};

/// NATS subject on which dCache billing messages arrive without their path in the subject (a
/// dCache's billing via a bridge; our storage when told to).
pub const EVENTS_SUBJECT: &str = "storage.dcache.billing";
/// Subjects CloudEvents arrive on: `storage.cloudevents.<producer>`. The bridges publish on
/// `storage.cloudevents.xrootd-notify` and `storage.cloudevents.dcache-sse`.
pub const CLOUDEVENTS_SUBJECT_PREFIX: &str = "storage.cloudevents";
/// Every CloudEvents subject.
pub const CLOUDEVENTS_SUBJECTS: &str = "storage.cloudevents.>";
/// The first tokens of a path subject ([`path_subject`]).
pub const PATH_SUBJECT_PREFIX: &str = "storage.dcache.billing.path";
/// Every path subject: billing messages that carry their file's directory ([`path_subject`]).
pub const PATH_SUBJECTS: &str = "storage.dcache.billing.path.>";
/// The last token of every path subject.
pub const PATH_SUBJECT_END: &str = "_";
/// Most directory components a path subject carries; a deeper file's subject stops there
/// (still under every shorter directory's filter, see [`path_subject`]).
pub const PATH_SUBJECT_MAX_COMPONENTS: usize = 16;
/// Longest path subject, bytes (the terminator included); components that would make it
/// longer are left off, as beyond [`PATH_SUBJECT_MAX_COMPONENTS`].
pub const PATH_SUBJECT_MAX_LEN: usize = 512;
/// Every subject the events stream keeps and the gateway reads events from: dCache billing
/// messages (plain and path subjects) and CloudEvents (`storage.cloudevents.<producer>`).
pub const EVENTS_SUBJECTS: [&str; 3] = [EVENTS_SUBJECT, PATH_SUBJECTS, CLOUDEVENTS_SUBJECTS];
/// What the gateway's default lane reads: the subjects that do not say whose event it is
/// (every owner's functions fire on them). Path subjects are read by the owners' lanes.
pub const DEFAULT_LANE_SUBJECTS: [&str; 2] = [EVENTS_SUBJECT, CLOUDEVENTS_SUBJECTS];
/// One core-NATS subscription to every billing subject, plain and path ones
/// (`storage.dcache.billing` and `storage.dcache.billing.path.>`): nothing else is published
/// under `storage.dcache.`. For listeners (tests, benches) that wait for the storage's messages.
pub const BILLING_SUBSCRIPTION: &str = "storage.dcache.>";
/// JetStream stream that stores [`EVENTS_SUBJECTS`]. File storage, limits retention, 7 days. The
/// gateway makes it (or widens an older one), and so does the built-in storage, with the same
/// subjects, so either may start first.
/// Named for its first source; kept so that deployed streams (and their unread events) stay:
/// the gateway adds the subjects a stream made before lacks at start.
pub const EVENTS_STREAM: &str = "DCACHE_BILLING";
/// How long the stream keeps events.
pub const EVENTS_MAX_AGE_S: u64 = 7 * 24 * 3600;

/// One path component as one NATS token: ASCII letters, digits and the printable ASCII
/// punctuation other than `.`, `*`, `>` and `%` stand for themselves; every other byte of its
/// UTF-8 (those four, whitespace, control characters, DEL, non-ASCII) is `%XX` (upper-case
/// hex). The empty component is `%` alone, which no other component encodes to. Injective, and
/// never empty, so a token is always valid and two directories never share a subject.
pub fn encode_token(component: &str) -> String {
    crate::percent::directory_token(component)
}

/// The encoded tokens of the directory components of `dir` (`/a/b/` or `/a/b`: every
/// component; empty ones kept), at most [`PATH_SUBJECT_MAX_COMPONENTS`] and as many as fit in
/// [`PATH_SUBJECT_MAX_LEN`]. Deterministic per prefix: two directories that share their first
/// `k` components share their first `k` tokens, so a deep file's subject stops where its
/// directory's filter stops.
fn dir_tokens<'a>(components: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut tokens = Vec::new();
    // `<prefix>.` + `_` at the end.
    let mut len = PATH_SUBJECT_PREFIX.len() + 1 + PATH_SUBJECT_END.len();
    for c in components.take(PATH_SUBJECT_MAX_COMPONENTS) {
        let t = encode_token(c);
        if len + t.len() + 1 > PATH_SUBJECT_MAX_LEN {
            break;
        }
        len += t.len() + 1;
        tokens.push(t);
    }
    tokens
}

/// The components of the directories a path's file lies in: `/a/b/f` → `a`, `b`. A path that
/// does not start with `/` has none (the gateway refuses such a path anyway).
fn dir_components(path: &str) -> impl Iterator<Item = &str> {
    // `/f` has no directory component; `//f` has one, empty.
    let dir = path.strip_prefix('/').and_then(|rest| rest.rsplit_once('/')).map(|(dir, _)| dir);
    dir.into_iter().flat_map(|d| d.split('/'))
}

/// The path subject of the file `path` (a clean absolute path): its directory's components
/// ([`encode_token`], at most [`PATH_SUBJECT_MAX_COMPONENTS`], at most
/// [`PATH_SUBJECT_MAX_LEN`] bytes), then `_`. `/data/alice/run 1/f.h5` →
/// `storage.dcache.billing.path.data.alice.run%201._`; `/f` → `storage.dcache.billing.path._`.
pub fn path_subject(path: &str) -> String {
    let mut subject = String::from(PATH_SUBJECT_PREFIX);
    for t in dir_tokens(dir_components(path)) {
        subject.push('.');
        subject.push_str(&t);
    }
    subject.push('.');
    subject.push_str(PATH_SUBJECT_END);
    subject
}

/// Whether `subject` is a path subject (starts with [`PATH_SUBJECT_PREFIX`] and a dot).
pub fn is_path_subject(subject: &str) -> bool {
    subject.strip_prefix(PATH_SUBJECT_PREFIX).is_some_and(|rest| rest.starts_with('.'))
}

/// The filter of the namespace directory `dir` (clean, absolute, ending in `/`): the subjects
/// of every file under it, `storage.dcache.billing.path.<its components>.>`. For a directory
/// deeper than a subject holds, the filter stops where subjects stop: it then also matches
/// files of sibling directories that agree up to there (never fewer than those under `dir`).
pub fn path_filter(dir: &str) -> String {
    // `/` has no component; `/a/` one; `//` one, empty.
    let inner = dir.strip_prefix('/').unwrap_or(dir);
    let inner = (!inner.is_empty()).then(|| inner.strip_suffix('/').unwrap_or(inner));
    let components = inner.into_iter().flat_map(|d| d.split('/'));
    let mut filter = String::from(PATH_SUBJECT_PREFIX);
    for t in dir_tokens(components) {
        filter.push('.');
        filter.push_str(&t);
    }
    filter.push_str(".>");
    filter
}

/// The filters of a set of namespace directories, for one JetStream consumer: one
/// [`path_filter`] each, without those another covers (a consumer's filters may not overlap),
/// sorted. Empty for no directory (a consumer without filters would read everything: never
/// make one from an empty set).
pub fn path_filters<'a>(dirs: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut filters: Vec<String> = dirs.into_iter().map(path_filter).collect();
    filters.sort();
    filters.dedup();
    // `p.>` covers `q.>` when q's tokens start with p's: q = p's stem + `.` + more.
    let stems: Vec<String> = filters.iter().map(|f| f.trim_end_matches('>').to_owned()).collect();
    filters.retain(|f| {
        let stem = f.trim_end_matches('>');
        !stems.iter().any(|other| other != stem && stem.starts_with(other.as_str()))
    });
    filters
}

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
    /// The W3C `traceparent` of the gateway's firing span: the event's own trace (a
    /// CloudEvent's `traceparent`, a NATS header) or one derived from its id
    /// (`trace::TraceParent::for_event`). The scheduler's and the EP's spans are its children.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// When the gateway took the event in (Unix ms): the job's wait in the gateway is its
    /// submission minus this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen_at_ms: Option<u64>,
    /// The span id (16 hex digits) of the producer's span the event came with, when it came
    /// with a `traceparent` that parses: the gateway's span is its child, so a collector draws
    /// htfaas's spans under the producer's. Only a label: it grants nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer_span: Option<String>,
}

impl EventRef {
    /// An event that no earlier job caused, with no trace.
    pub fn new(source: impl Into<String>, id: impl Into<String>, path: impl Into<String>) -> EventRef {
        EventRef {
            source: source.into(),
            id: id.into(),
            path: path.into(),
            caused_by: None,
            trace: None,
            seen_at_ms: None,
            producer_span: None,
        }
    }

    /// The trace this job's event belongs to: its `trace`, parsed, or (for a job submitted
    /// by an older release, or by a token bearer) none.
    pub fn trace_parent(&self) -> Option<crate::trace::TraceParent> {
        self.trace.as_deref().and_then(|t| crate::trace::TraceParent::parse(t).ok())
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
    /// The W3C `traceparent` of the gateway's span of that job: what its output fires joins
    /// the first event's trace under it. Absent from older records (a new trace then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// NATS subject matching: `*` one token, a final `>` one token or more.
    fn matches(filter: &str, subject: &str) -> bool {
        let mut s = subject.split('.');
        for f in filter.split('.') {
            match (f, s.next()) {
                (">", Some(_)) => return true,
                (_, None) => return false,
                ("*", Some(_)) => {}
                (f, Some(t)) if f == t => {}
                _ => return false,
            }
        }
        s.next().is_none()
    }

    /// A valid NATS token for publishing: non-empty, printable ASCII, no `.`, no wildcard.
    fn valid_token(t: &str) -> bool {
        !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic() && b != b'.') && t != "*" && t != ">"
    }

    #[test]
    fn path_subjects_carry_the_directory_escaped() {
        assert_eq!(path_subject("/data/alice/f.h5"), "storage.dcache.billing.path.data.alice._");
        assert_eq!(path_subject("/f"), "storage.dcache.billing.path._");
        assert_eq!(
            path_subject("/a b/c.d/*/>/%/\u{7}/é/x"),
            "storage.dcache.billing.path.a%20b.c%2Ed.%2A.%3E.%25.%07.%C3%A9._"
        );
        assert_eq!(path_subject("/a//b/x"), "storage.dcache.billing.path.a.%.b._", "an empty component");
        assert_eq!(path_subject("/_/x"), "storage.dcache.billing.path._._");
        assert_eq!(path_filter("/"), "storage.dcache.billing.path.>");
        assert_eq!(path_filter("/data/alice/"), "storage.dcache.billing.path.data.alice.>");
        assert!(is_path_subject("storage.dcache.billing.path._") && !is_path_subject("storage.dcache.billing"));
        assert!(!is_path_subject("storage.dcache.billing.pathx._"));
        // Deep or long directories stop at the bound, the same way for a file and its directory.
        let deep: String = (0..40).map(|i| format!("/d{i}")).collect();
        let subject = path_subject(&format!("{deep}/f"));
        assert_eq!(subject.split('.').count(), 4 + PATH_SUBJECT_MAX_COMPONENTS + 1);
        assert!(matches(&path_filter(&format!("{deep}/")), &subject));
        let long = format!("/{}/{}/f", "x".repeat(300), "y".repeat(300));
        assert!(path_subject(&long).len() <= PATH_SUBJECT_MAX_LEN);
        assert_eq!(path_subject(&long), format!("storage.dcache.billing.path.{}._", "x".repeat(300)));
        assert!(matches(&path_filter(&format!("/{}/{}/", "x".repeat(300), "y".repeat(300))), &path_subject(&long)));
    }

    #[test]
    fn a_consumers_filters_never_overlap() {
        let f = path_filters(["/data/alice/", "/data/", "/data/alice/x/", "/other/", "/data/"]);
        assert_eq!(f, ["storage.dcache.billing.path.data.>", "storage.dcache.billing.path.other.>"]);
        let f = path_filters(["/data/al/", "/data/alice/"]);
        assert_eq!(f, ["storage.dcache.billing.path.data.al.>", "storage.dcache.billing.path.data.alice.>"]);
        assert_eq!(path_filters(["/", "/data/"]), ["storage.dcache.billing.path.>"]);
        assert!(path_filters([]).is_empty());
    }

    fn component() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z_]{1,3}",
            "[ .*>%_\\-a\\t\\n\\x00\\x7f]{0,3}",
            any::<String>().prop_map(|s| s.chars().filter(|c| *c != '/').take(4).collect()),
        ]
    }

    proptest! {
        /// Every token is a valid NATS token, and a directory's filter matches exactly the
        /// subjects of the paths under it (within the depth a subject holds).
        #[test]
        fn a_directory_filter_matches_exactly_the_files_under_it(
            file in prop::collection::vec(component(), 0..6),
            dir in prop::collection::vec(component(), 0..4),
        ) {
            let path = format!("/{}", file.iter().map(String::as_str).chain(["f"]).collect::<Vec<_>>().join("/"));
            let subject = path_subject(&path);
            prop_assert!(subject.len() <= PATH_SUBJECT_MAX_LEN);
            for t in subject.split('.') {
                prop_assert!(valid_token(t), "{t:?} in {subject:?}");
            }
            let dir_path = format!("/{}", dir.iter().map(|c| format!("{c}/")).collect::<String>());
            let under = file.len() >= dir.len() && file[..dir.len()] == dir[..];
            prop_assert_eq!(matches(&path_filter(&dir_path), &subject), under, "{} ~ {}", dir_path, path);
            // The dir of a file matches its own file; the file's own directory too.
            let own = format!("/{}", file.iter().map(|c| format!("{c}/")).collect::<String>());
            prop_assert!(matches(&path_filter(&own), &subject));
        }

        #[test]
        fn tokens_are_injective(a in component(), b in component()) {
            prop_assert_eq!(encode_token(&a) == encode_token(&b), a == b);
        }
    }
}
