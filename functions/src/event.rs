//! Storage events as htfaas sees them, whatever produced them.
//!
//! Every source (dCache billing messages, dCache's SSE inotify channel through
//! `htfaas bridge dcache-sse`, XRootD `ofs.notify` through `htfaas bridge xrootd-notify`,
//! CloudEvents from anyone) is parsed by the gateway into one [`StorageEvent`]. Trigger rules
//! ([`crate::trigger`]) are evaluated on it, its [`StorageEvent::id`] is the event half of the
//! exactly-once key, and its [`EventSource`] is kept with every job it fires, for audit.
//!
//! The bridges publish CloudEvents whose `type` is one of the [`CE_TYPE_PREFIX`] types below and
//! whose `data` is a [`BridgedEvent`], so the gateway has two wire formats to read: dCache
//! billing JSON and CloudEvents.

use serde::{Deserialize, Serialize};

/// Prefix of the CloudEvents `type` of events htfaas's bridges publish:
/// `org.htfaas.storage.<source>.<msg_type>`, e.g. `org.htfaas.storage.xrootd.closew`.
pub const CE_TYPE_PREFIX: &str = "org.htfaas.storage.";

/// Which kind of producer an event came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SourceKind {
    /// A dCache billing message (Kafka → NATS, or htfaas's embedded storage).
    DcacheBilling,
    /// dCache's frontend SSE `inotify` channel, through `htfaas bridge dcache-sse`.
    DcacheSse,
    /// XRootD `ofs.notify`, through `htfaas bridge xrootd-notify`.
    XrootdNotify,
    /// Any other CloudEvents producer.
    Cloudevents,
    /// The gateway itself: a file found in the storage's namespace that never fired the function
    /// (`htfaas events backfill`). Never read from the bus.
    Backfill,
}

impl SourceKind {
    /// The name used in rules (`source == "xrootd-notify"`) and in audit records.
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::DcacheBilling => "dcache-billing",
            SourceKind::DcacheSse => "dcache-sse",
            SourceKind::XrootdNotify => "xrootd-notify",
            SourceKind::Cloudevents => "cloudevents",
            SourceKind::Backfill => "backfill",
        }
    }
}

/// Who produced an event, kept for audit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventSource {
    /// The kind of producer.
    pub kind: SourceKind,
    /// The producer's own identity: a dCache `cellName@cellDomain`, the CloudEvents `source`
    /// URI, the XRootD host the bridge reads, the dCache frontend channel URL.
    pub producer: String,
    /// Where the message was read from, when known: the JetStream stream sequence
    /// (`nats-seq-<n>`), the SSE event id, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// What happened to the file, whatever the source calls it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventKind {
    /// A write completed successfully (dCache `transfer` write, door `request` of an upload,
    /// XRootD `closew`, inotify `IN_CLOSE_WRITE` / `IN_MOVED_TO`): the file is whole.
    Write,
    /// A file was created (XRootD `create`, inotify `IN_CREATE`); its content may not be there yet.
    Create,
    /// A file was removed from the namespace (door `remove`, XRootD `rm`, inotify `IN_DELETE`).
    Remove,
    /// A file was read (dCache `transfer` read).
    Read,
    /// A file was flushed to tape (dCache `store`).
    Store,
    /// A file was staged from tape (dCache `restore`).
    Restore,
    /// A pool served a read from its cache (dCache `hit`).
    Hit,
    /// A replica was removed from one pool (dCache pool `remove`): the file still exists.
    ReplicaRemove,
    /// Anything else a source reports (`warning`, inotify `IN_ATTRIB`, a CloudEvents type
    /// htfaas does not know): visible to rules through `type`, never fired by default.
    Other,
}

impl EventKind {
    /// The name used in rules (`kind == "write"`).
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Write => "write",
            EventKind::Create => "create",
            EventKind::Remove => "remove",
            EventKind::Read => "read",
            EventKind::Store => "store",
            EventKind::Restore => "restore",
            EventKind::Hit => "hit",
            EventKind::ReplicaRemove => "replica-remove",
            EventKind::Other => "other",
        }
    }

    /// Every kind, for validating rule literals.
    pub const ALL: [EventKind; 9] = [
        EventKind::Write,
        EventKind::Create,
        EventKind::Remove,
        EventKind::Read,
        EventKind::Store,
        EventKind::Restore,
        EventKind::Hit,
        EventKind::ReplicaRemove,
        EventKind::Other,
    ];
}

/// One storage event, normalized. Only events whose operation succeeded become one: a failed
/// transfer is ignored by the parser, not passed on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageEvent {
    /// Who produced it.
    pub source: EventSource,
    /// What happened, normalized.
    pub kind: EventKind,
    /// The producer's own name for the message: dCache `msgType` (`transfer`, `request`,
    /// `remove`, `store`, `restore`, `hit`), XRootD notify event (`closew`, `create`, `rm`),
    /// inotify mask (`IN_CLOSE_WRITE`), or the CloudEvents `type`.
    pub msg_type: String,
    /// The file's storage path: absolute, clean (no `.`/`..`/empty segments), not ending in `/`.
    pub path: String,
    /// Size in bytes, when the source says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// dCache storage class (`exp:raw` of `storageInfo` `exp:raw@osm`), when the source says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<String>,
    /// The principal that caused it (dCache `UserNamePrincipal` or door `owner`, the XRootD
    /// client user, the CloudEvents producer's claim), when the source says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Identifier of the macaroon that authorized the operation (dCache's
    /// `MacaroonPrincipal[<id>]` in the billing `subject`), when the source says. A job's
    /// outputs are written with the write macaroon the gateway obtained for it, so this names
    /// the job that wrote the file: the loop guard's provenance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub macaroon: Option<String>,
    /// The occurrence's identity: the same for every copy of this event (redelivery, a
    /// duplicate from a second producer, a replay), different for another occurrence (a second
    /// upload of the same path). With a function's digest, the exactly-once key. Always
    /// prefixed by the source kind, e.g. `dcache-billing:write:<pnfsid>/<door session>`.
    pub id: String,
    /// When the producer says it happened (RFC 3339), when it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// The W3C `traceparent` the producer sent (a CloudEvent's distributed-tracing extension,
    /// or the NATS message's `traceparent` header), when it sent one that parses: the trace the
    /// event's jobs join. Only a label for `htfaas trace` and the logs: it grants nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

impl StorageEvent {
    /// The trace this event's jobs belong to: the producer's, or one derived from the
    /// event's identity (the same for every copy and replay of it).
    pub fn trace(&self) -> crate::trace::TraceParent {
        self.traceparent
            .as_deref()
            .and_then(|t| crate::trace::TraceParent::parse(t).ok())
            .unwrap_or_else(|| crate::trace::TraceParent::for_event(&self.id))
    }
}

/// The `data` of a CloudEvent published by an htfaas bridge (type
/// `org.htfaas.storage.<source>.<msg_type>`): the fields of a [`StorageEvent`] the bridge
/// knows. The CloudEvent's `source` becomes [`EventSource::producer`], its `id` the
/// occurrence's identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgedEvent {
    /// Normalized kind.
    pub kind: EventKind,
    /// The producer's own message type (`closew`, `IN_CLOSE_WRITE`, …).
    pub msg_type: String,
    /// Absolute storage path.
    pub path: String,
    /// Size in bytes, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// The principal, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// A CloudEvent (spec 1.0) in structured mode: the JSON the bridges publish, and what the
/// gateway reads from any producer (binary mode carries the same attributes as `ce-*` headers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CloudEvent {
    /// `"1.0"`.
    pub specversion: String,
    /// Unique per `source`: with it, the occurrence's identity.
    pub id: String,
    /// URI reference naming the producer.
    pub source: String,
    /// The event's type, e.g. `org.htfaas.storage.xrootd-notify.closew`.
    #[serde(rename = "type")]
    pub ty: String,
    /// The subject within the source (for storage: the path), when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// RFC 3339 time of the occurrence, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// Media type of `data`, e.g. `application/json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datacontenttype: Option<String>,
    /// The payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
    /// Extension attributes.
    #[serde(flatten)]
    pub extensions: std::collections::BTreeMap<String, serde_json::Value>,
}
