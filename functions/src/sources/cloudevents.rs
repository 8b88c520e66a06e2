//! CloudEvents 1.0 on NATS → [`StorageEvent`], in both modes of the NATS protocol binding:
//!
//! - **structured**: the body is the event as JSON (`content-type:
//!   application/cloudevents+json`, or any JSON object with `specversion`);
//! - **binary**: the attributes are headers (`ce-specversion`, `ce-id`, `ce-source`, `ce-type`,
//!   optional `ce-subject`, `ce-time`; `content-type` is `datacontenttype`), the body is `data`.
//!
//! `specversion` must be `1.0`; `id`, `source` and `type` are required. Two families of types:
//!
//! - **htfaas bridges**: type `org.htfaas.storage.<source>.<msg_type>` ([`CE_TYPE_PREFIX`]),
//!   `<source>` `xrootd-notify` or `dcache-sse`, `data` a [`BridgedEvent`] whose path must be a
//!   clean absolute file path (else malformed).
//! - **any other producer** (source kind `cloudevents`): a storage event names its file in
//!   `data.path`, else in `subject`; a CloudEvent with neither is ignored. Optional `data`
//!   fields: `kind` (an event kind name, `write`, `remove`, …; anything else is `other`),
//!   `size` (bytes), `owner`, `storage_class`. `msg_type` is the CloudEvent `type`. E.g.
//!   `{"specversion":"1.0","id":"42","source":"//lab.example/daq","type":"org.example.daq.closed",
//!   "subject":"/data/run42.h5","data":{"kind":"write","size":1024}}`.
//!
//! Identity: `<source kind>:<CloudEvent source>/<CloudEvent id>` (the spec makes `source` + `id`
//! unique per occurrence); the producer is the CloudEvent `source`, the time its `time`.

use super::{Decision, EventError, SourcePolicy, checked_path, id_part};
use crate::event::{BridgedEvent, CE_TYPE_PREFIX, EventKind, EventSource, SourceKind, StorageEvent};
use serde_json::{Map, Value};

/// A CloudEvent's context attributes and data, whichever mode it came in.
#[derive(Debug, Clone, PartialEq)]
struct Attributes {
    id: String,
    source: String,
    ty: String,
    subject: Option<String>,
    time: Option<String>,
    data: Option<Value>,
    /// The distributed-tracing extension, when it parses (a malformed one is ignored: it is
    /// only a label).
    traceparent: Option<String>,
}

/// Decides what a CloudEvent means under `policy`.
pub fn decide(
    headers: Option<&async_nats::HeaderMap>,
    payload: &[u8],
    message_id: &str,
    policy: &SourcePolicy,
) -> Result<Decision, EventError> {
    if !policy.cloudevents {
        return Ok(Decision::NotEnabled(SourceKind::Cloudevents.as_str().to_owned()));
    }
    let ce = match header(headers, "ce-specversion") {
        Some(_) => binary(headers, payload)?,
        None => structured(headers, payload)?,
    };
    match ce.ty.strip_prefix(CE_TYPE_PREFIX).map(str::to_owned) {
        Some(rest) => bridged(&rest, ce, message_id),
        None => generic(ce, message_id),
    }
}

fn bad(msg: impl Into<String>) -> EventError {
    EventError::CloudEvent(msg.into())
}

/// The value of header `name`, case-insensitively (NATS keeps header names as sent).
pub(super) fn header<'a>(headers: Option<&'a async_nats::HeaderMap>, name: &str) -> Option<&'a str> {
    let (_, values) = headers?.iter().find(|(k, _)| AsRef::<str>::as_ref(k).eq_ignore_ascii_case(name))?;
    values.first().map(|v| v.as_str())
}

fn check_specversion(v: &str) -> Result<(), EventError> {
    if v == "1.0" { Ok(()) } else { Err(bad(format!("specversion {v:?} is not \"1.0\""))) }
}

/// Whether a media type is JSON (`application/json`, `…+json`, `text/json`).
fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    essence == "application/json" || essence == "text/json" || essence.ends_with("+json")
}

fn binary(headers: Option<&async_nats::HeaderMap>, payload: &[u8]) -> Result<Attributes, EventError> {
    let get = |name: &str| header(headers, name).map(str::to_owned);
    let required = |name: &str| {
        get(name)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| bad(format!("binary mode without the required header {name}")))
    };
    check_specversion(&required("ce-specversion")?)?;
    let (id, source, ty) = (required("ce-id")?, required("ce-source")?, required("ce-type")?);
    let data = match get("content-type") {
        _ if payload.is_empty() => None,
        Some(ct) if !is_json(&ct) => None, // opaque bytes: nothing htfaas reads
        _ => Some(serde_json::from_slice(payload).map_err(|e| bad(format!("data is not JSON: {e}")))?),
    };
    let traceparent = valid_traceparent(get("ce-traceparent").as_deref());
    Ok(Attributes { id, source, ty, subject: get("ce-subject"), time: get("ce-time"), data, traceparent })
}

fn structured(headers: Option<&async_nats::HeaderMap>, payload: &[u8]) -> Result<Attributes, EventError> {
    let declared = header(headers, "content-type").map(|ct| ct.trim().to_ascii_lowercase());
    if declared.as_deref().is_some_and(|ct| ct.starts_with("application/cloudevents-batch")) {
        return Err(bad("batch mode is not supported: publish one event per message"));
    }
    let value: Value = serde_json::from_slice(payload).map_err(|e| {
        bad(format!("no ce-specversion header, and the body is not a structured CloudEvent (JSON): {e}"))
    })?;
    let Value::Object(mut obj) = value else {
        return Err(bad("no ce-specversion header, and the body is not a JSON object"));
    };
    let specversion = optional(&obj, "specversion")?
        .ok_or_else(|| bad("no ce-specversion header, and no specversion in the body: not a CloudEvent"))?;
    check_specversion(&specversion)?;
    let required = |name: &str| {
        optional(&obj, name)?.filter(|v| !v.is_empty()).ok_or_else(|| bad(format!("missing required attribute {name}")))
    };
    let (id, source, ty) = (required("id")?, required("source")?, required("type")?);
    let (subject, time) = (optional(&obj, "subject")?, optional(&obj, "time")?);
    let traceparent = valid_traceparent(optional(&obj, "traceparent").ok().flatten().as_deref());
    Ok(Attributes { id, source, ty, subject, time, data: obj.remove("data"), traceparent })
}

/// `value` when it is a `traceparent` that parses, in its canonical form.
pub(super) fn valid_traceparent(value: Option<&str>) -> Option<String> {
    value.and_then(|v| crate::trace::TraceParent::parse(v).ok()).map(|t| t.to_string())
}

/// A string attribute; absent or null is `None`, another type is malformed.
fn optional(obj: &Map<String, Value>, name: &str) -> Result<Option<String>, EventError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(bad(format!("attribute {name} is not a string"))),
    }
}

/// An htfaas bridge's event: `rest` is `<source>.<msg_type>`.
fn bridged(rest: &str, ce: Attributes, message_id: &str) -> Result<Decision, EventError> {
    let source = rest.split_once('.').map_or(rest, |(s, _)| s);
    let kind = [SourceKind::XrootdNotify, SourceKind::DcacheSse]
        .into_iter()
        .find(|k| k.as_str() == source)
        .ok_or_else(|| bad(format!("type {:?} names no htfaas bridge (xrootd-notify, dcache-sse)", ce.ty)))?;
    let data = ce.data.ok_or_else(|| bad(format!("type {:?} without data", ce.ty)))?;
    let b: BridgedEvent = serde_json::from_value(data).map_err(|e| bad(format!("data is not a BridgedEvent: {e}")))?;
    Ok(Decision::Fire(Box::new(StorageEvent {
        id: format!("{}:{}/{}", kind.as_str(), ce.source, id_part(&ce.id)),
        source: EventSource { kind, producer: ce.source, message: Some(message_id.to_owned()) },
        kind: b.kind,
        msg_type: b.msg_type,
        path: checked_path(&b.path)?,
        size: b.size,
        storage_class: None,
        owner: b.owner,
        macaroon: None,
        time: ce.time,
        traceparent: ce.traceparent,
    })))
}

/// Any other producer's event (see the module docs for what is read).
fn generic(ce: Attributes, message_id: &str) -> Result<Decision, EventError> {
    let empty = Map::new();
    let data = match &ce.data {
        Some(Value::Object(o)) => o,
        _ => &empty,
    };
    let field = |name: &str| optional(data, name).map_err(|_| bad(format!("data.{name} is not a string")));
    let path = match field("path")?.or(ce.subject.clone()) {
        Some(p) => checked_path(&p)?,
        None => return Ok(Decision::Ignore("a CloudEvent that names no file (no data.path, no subject)")),
    };
    let kind =
        field("kind")?.and_then(|k| EventKind::ALL.into_iter().find(|e| e.as_str() == k)).unwrap_or(EventKind::Other);
    let size = match data.get("size") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| bad("data.size is not a non-negative integer"))?),
    };
    Ok(Decision::Fire(Box::new(StorageEvent {
        id: format!("{}:{}/{}", SourceKind::Cloudevents.as_str(), ce.source, id_part(&ce.id)),
        source: EventSource {
            kind: SourceKind::Cloudevents,
            producer: ce.source,
            message: Some(message_id.to_owned()),
        },
        kind,
        msg_type: ce.ty,
        path,
        size,
        storage_class: field("storage_class")?,
        owner: field("owner")?,
        macaroon: None,
        time: ce.time,
        traceparent: ce.traceparent,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const BRIDGED: &str = r#"{"specversion":"1.0","id":"7","source":"xrootd://data01.example.org:1094",
      "type":"org.htfaas.storage.xrootd-notify.closew","time":"2026-03-14T10:15:30Z",
      "datacontenttype":"application/json",
      "data":{"kind":"write","msg_type":"closew","path":"/store/in/run17.dat","size":12,"owner":"alice"}}"#;

    const GENERIC: &str = r#"{"specversion":"1.0","id":"42","source":"//lab.example/daq","type":"org.example.daq.closed",
      "subject":"/data/raw/run42.h5","data":{"kind":"write","size":1024,"owner":"bob","storage_class":"exp:raw"}}"#;

    fn headers(pairs: &[(&str, &str)]) -> async_nats::HeaderMap {
        let mut h = async_nats::HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, *v);
        }
        h
    }

    fn policy() -> SourcePolicy {
        SourcePolicy::default()
    }

    fn fire(h: Option<&async_nats::HeaderMap>, body: &[u8]) -> StorageEvent {
        match decide(h, body, "nats-seq-3", &policy()) {
            Ok(Decision::Fire(e)) => *e,
            other => panic!("expected an event, got {other:?}"),
        }
    }

    fn error(h: Option<&async_nats::HeaderMap>, body: &[u8]) -> String {
        match decide(h, body, "nats-seq-3", &policy()) {
            Err(e) => e.to_string(),
            other => panic!("expected malformed, got {other:?}"),
        }
    }

    #[test]
    fn a_bridge_event_in_structured_mode_fires_its_bridged_event() {
        let e = fire(None, BRIDGED.as_bytes());
        assert_eq!(
            e,
            StorageEvent {
                source: EventSource {
                    kind: SourceKind::XrootdNotify,
                    producer: "xrootd://data01.example.org:1094".into(),
                    message: Some("nats-seq-3".into()),
                },
                kind: EventKind::Write,
                msg_type: "closew".into(),
                path: "/store/in/run17.dat".into(),
                size: Some(12),
                storage_class: None,
                owner: Some("alice".into()),
                macaroon: None,
                id: "xrootd-notify:xrootd://data01.example.org:1094/7".into(),
                time: Some("2026-03-14T10:15:30Z".into()),
                traceparent: None,
            }
        );
        // The same with the content-type header.
        let h = headers(&[("content-type", "application/cloudevents+json; charset=utf-8")]);
        assert_eq!(fire(Some(&h), BRIDGED.as_bytes()), e);
        // dCache SSE through its bridge.
        let sse = BRIDGED.replace("xrootd-notify.closew", "dcache-sse.IN_CLOSE_WRITE");
        assert_eq!(fire(None, sse.as_bytes()).source.kind, SourceKind::DcacheSse);
    }

    #[test]
    fn a_generic_event_names_its_file_in_subject_or_data() {
        let e = fire(None, GENERIC.as_bytes());
        assert_eq!(
            (e.kind, e.msg_type.as_str(), e.path.as_str()),
            (EventKind::Write, "org.example.daq.closed", "/data/raw/run42.h5")
        );
        assert_eq!(
            (e.size, e.owner.as_deref(), e.storage_class.as_deref()),
            (Some(1024), Some("bob"), Some("exp:raw"))
        );
        assert_eq!(e.id, "cloudevents://lab.example/daq/42");
        assert_eq!((e.source.kind, e.source.producer.as_str()), (SourceKind::Cloudevents, "//lab.example/daq"));
        let mut v: Value = serde_json::from_str(GENERIC).expect("json");
        v["data"] = json!({"path": "/data/raw/other.h5", "kind": "closed"});
        let e = fire(None, &serde_json::to_vec(&v).expect("json"));
        assert_eq!((e.path.as_str(), e.kind), ("/data/raw/other.h5", EventKind::Other), "data.path wins; unknown kind");
        v.as_object_mut().expect("obj").remove("data");
        v.as_object_mut().expect("obj").remove("subject");
        let d = decide(None, &serde_json::to_vec(&v).expect("json"), "s", &policy());
        assert_eq!(d, Ok(Decision::Ignore("a CloudEvent that names no file (no data.path, no subject)")));
    }

    #[test]
    fn binary_mode_reads_the_attributes_from_headers() {
        let h = headers(&[
            ("ce-specversion", "1.0"),
            ("ce-id", "b-1"),
            ("ce-source", "//lab.example/daq"),
            ("ce-type", "org.example.daq.closed"),
            ("ce-subject", "/data/raw/bin.dat"),
            ("ce-time", "2026-03-14T10:15:30Z"),
            ("content-type", "application/json"),
        ]);
        let e = fire(Some(&h), br#"{"kind":"write","size":5}"#);
        assert_eq!((e.path.as_str(), e.kind, e.size), ("/data/raw/bin.dat", EventKind::Write, Some(5)));
        assert_eq!(
            (e.id.as_str(), e.time.as_deref()),
            ("cloudevents://lab.example/daq/b-1", Some("2026-03-14T10:15:30Z"))
        );
        // Header names in another case; opaque data.
        let h = headers(&[
            ("Ce-Specversion", "1.0"),
            ("CE-ID", "b-2"),
            ("ce-source", "s"),
            ("ce-type", "t"),
            ("ce-subject", "/data/raw/x"),
            ("content-type", "application/octet-stream"),
        ]);
        let e = fire(Some(&h), b"\x00\x01 not json");
        assert_eq!((e.path.as_str(), e.kind, e.id.as_str()), ("/data/raw/x", EventKind::Other, "cloudevents:s/b-2"));
        // A bridge's event in binary mode.
        let h = headers(&[
            ("ce-specversion", "1.0"),
            ("ce-id", "9"),
            ("ce-source", "xrootd://h"),
            ("ce-type", "org.htfaas.storage.xrootd-notify.rm"),
        ]);
        let e = fire(Some(&h), br#"{"kind":"remove","msg_type":"rm","path":"/store/a"}"#);
        assert_eq!(
            (e.kind, e.source.kind, e.id.as_str()),
            (EventKind::Remove, SourceKind::XrootdNotify, "xrootd-notify:xrootd://h/9")
        );
    }

    #[test]
    fn missing_or_bad_attributes_are_malformed_with_a_clear_message() {
        for attr in ["id", "source", "type"] {
            let mut v: Value = serde_json::from_str(GENERIC).expect("json");
            v.as_object_mut().expect("obj").remove(attr);
            assert_eq!(
                error(None, &serde_json::to_vec(&v).expect("json")),
                format!("bad CloudEvent: missing required attribute {attr}")
            );
        }
        let old = GENERIC.replace(r#""specversion":"1.0""#, r#""specversion":"0.3""#);
        assert_eq!(error(None, old.as_bytes()), "bad CloudEvent: specversion \"0.3\" is not \"1.0\"");
        let none = GENERIC.replace(r#""specversion":"1.0","#, "");
        assert_eq!(
            error(None, none.as_bytes()),
            "bad CloudEvent: no ce-specversion header, and no specversion in the body: not a CloudEvent"
        );
        assert_eq!(error(None, br#"{"specversion":1}"#), "bad CloudEvent: attribute specversion is not a string");
        let h = headers(&[("ce-specversion", "1.0"), ("ce-id", "1"), ("ce-type", "t")]);
        assert_eq!(error(Some(&h), b""), "bad CloudEvent: binary mode without the required header ce-source");
        let h = headers(&[("ce-specversion", "1.0"), ("ce-id", "1"), ("ce-source", "s"), ("ce-type", "t")]);
        assert!(error(Some(&h), b"{not json").starts_with("bad CloudEvent: data is not JSON"));
        let h = headers(&[("content-type", "application/cloudevents-batch+json")]);
        assert_eq!(
            error(Some(&h), b"[]"),
            "bad CloudEvent: batch mode is not supported: publish one event per message"
        );
        // Bridge events: unknown bridge, no data, data that is not a BridgedEvent, a bad path.
        let unknown = BRIDGED.replace("xrootd-notify.closew", "ftp.closew");
        assert!(error(None, unknown.as_bytes()).contains("names no htfaas bridge"));
        let mut v: Value = serde_json::from_str(BRIDGED).expect("json");
        v["data"]["extra"] = json!(1);
        assert!(
            error(None, &serde_json::to_vec(&v).expect("json"))
                .starts_with("bad CloudEvent: data is not a BridgedEvent")
        );
        v.as_object_mut().expect("obj").remove("data");
        assert!(error(None, &serde_json::to_vec(&v).expect("json")).ends_with("without data"));
        let escape = BRIDGED.replace("/store/in/run17.dat", "/store/../etc/passwd");
        assert_eq!(error(None, escape.as_bytes()), "bad path \"/store/../etc/passwd\": not a clean absolute file path");
        let relative = GENERIC.replace("/data/raw/run42.h5", "data/raw/run42.h5");
        assert!(error(None, relative.as_bytes()).starts_with("bad path"));
        let mut v: Value = serde_json::from_str(GENERIC).expect("json");
        v["data"]["size"] = json!(-1);
        assert_eq!(
            error(None, &serde_json::to_vec(&v).expect("json")),
            "bad CloudEvent: data.size is not a non-negative integer"
        );
        for garbage in [&b""[..], b"{", b"[]", b"null", b"\xff"] {
            assert!(error(None, garbage).starts_with("bad CloudEvent"), "{garbage:?}");
        }
    }

    #[test]
    fn a_site_can_turn_cloudevents_off() {
        let off = SourcePolicy { cloudevents: false, ..SourcePolicy::default() };
        assert_eq!(decide(None, GENERIC.as_bytes(), "s", &off), Ok(Decision::NotEnabled("cloudevents".into())));
    }

    #[test]
    fn truncated_and_mangled_events_never_panic() {
        let p = policy();
        let h = headers(&[
            ("ce-specversion", "1.0"),
            ("ce-id", "1"),
            ("ce-source", "s"),
            ("ce-type", "org.htfaas.storage.dcache-sse.x"),
        ]);
        for fixture in [BRIDGED, GENERIC] {
            let bytes = fixture.as_bytes();
            for cut in 0..bytes.len() {
                for h in [None, Some(&h)] {
                    let _ = decide(h, &bytes[..cut], "s", &p);
                    let mut flipped = bytes.to_vec();
                    flipped[cut] ^= 0x55;
                    let _ = decide(h, &flipped, "s", &p);
                }
            }
        }
    }
}
