//! One Kafka record → the NATS message the bridge publishes, or why it is malformed.
//!
//! The subject is decided by the gateway's own billing parser ([`htfaas_functions::sources::dcache::decide`],
//! with every `msgType` enabled so that the path is found whatever the site fires on): a
//! message that names its file's path goes on that path's subject
//! ([`htfaas_functions::proto::path_subject`]), exactly the subject the gateway checks the
//! payload against, so the owners' lanes read Kafka-fed events as they read the built-in
//! storage's; a well-formed message with no usable path, or no event at all (a failed
//! transfer, a warning), goes on the plain billing subject (the default lane, which decides it
//! as before); a record the parser refuses is malformed and never published. The payload is
//! the record's value, unchanged; the record's key and headers are dropped (a producer chooses
//! neither the subject nor the `Nats-Msg-Id`).
//!
//! Must not know: the Kafka client, NATS connections, offsets.

use htfaas_functions::proto::{EVENTS_SUBJECT, path_subject};
use htfaas_functions::sources::dcache::{self, MSG_TYPES};
use htfaas_functions::sources::{Decision, EventError, SourcePolicy};

/// The largest record value the bridge publishes. A dCache billing message is ~1–2 KiB; a
/// NATS server's default payload limit is 1 MiB.
pub const MAX_RECORD_BYTES: usize = 64 * 1024;

/// Where one record goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routed {
    /// The NATS subject: a path subject, or [`EVENTS_SUBJECT`].
    pub subject: String,
    /// Whether the subject is [`EVENTS_SUBJECT`] (no usable path, or no event).
    pub plain: bool,
}

/// Why a record is skipped.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// A null value (a tombstone): dCache never sends one.
    #[error("the record has no value")]
    NoValue,
    /// Larger than [`MAX_RECORD_BYTES`].
    #[error("the record's value is {0} bytes, more than the {MAX_RECORD_BYTES} allowed")]
    TooLarge(usize),
    /// The billing parser refused it (not JSON, no `msgType`, a bad path, …).
    #[error(transparent)]
    Billing(#[from] EventError),
    /// A fetch at this offset kept failing to decode (a corrupt batch, or a compression this
    /// build cannot read): the record was stepped over.
    #[error("the batch holding this record could not be decoded: {0}")]
    Undecodable(String),
}

/// The `Nats-Msg-Id` of the record at `offset` of `topic`'s `partition`: fixed by where the
/// record is, so every publish of it (a retry, a re-read after a restart) is the same message
/// to JetStream's duplicate window.
pub fn message_id(topic: &str, partition: i32, offset: i64) -> String {
    format!("kafka:{topic}:{partition}:{offset}")
}

/// Where the record with `value` goes ([`Routed`]), or why it is skipped.
pub fn route(value: Option<&[u8]>) -> Result<Routed, RecordError> {
    let value = value.ok_or(RecordError::NoValue)?;
    if value.len() > MAX_RECORD_BYTES {
        return Err(RecordError::TooLarge(value.len()));
    }
    let every_type = SourcePolicy { dcache_msg_types: MSG_TYPES.map(str::to_owned).to_vec(), cloudevents: false };
    // The message id only names an event that carries no pnfsid; the gateway decides again
    // with its own (the JetStream sequence), so nothing of this one is kept.
    Ok(match dcache::decide(value, "kafka", &every_type)? {
        Decision::Fire(event) => Routed { subject: path_subject(&event.path), plain: false },
        Decision::Ignore(_) | Decision::NotEnabled(_) => Routed { subject: EVENTS_SUBJECT.to_owned(), plain: true },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transfer(path: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "version": "1.0", "msgType": "transfer", "isWrite": "write", "isP2p": false,
            "status": {"code": 0, "msg": ""}, "cellName": "pool-a-1", "cellType": "pool", "cellDomain": "poolDomain",
            "session": "pool:pool-a-1@poolDomain:1-1", "initiator": "door:webdav-1@webdavDomain:1",
            "transferPath": path, "billingPath": path, "pnfsid": "0000C9B4E7A1F2D34E5C8B1A9F0E7D6C5B4A",
            "fileSize": 5, "subject": ["UserNamePrincipal[alice]"],
        }))
        .expect("json")
    }

    #[test]
    fn a_message_with_a_path_goes_on_its_directorys_subject() {
        let r = route(Some(&transfer("/data/alice/run 1/f.h5"))).expect("routed");
        assert_eq!(r, Routed { subject: "storage.dcache.billing.path.data.alice.run%201._".into(), plain: false });
        // Whatever the type: a door remove (not fired by default) still names its directory.
        let remove = br#"{"VERSION":"1.0","msgType":"remove","cellType":"door","status":{"code":0},
            "session":"door:w@d:1","transferPath":"/data/bob/x","pnfsid":"0000AA"}"#;
        assert_eq!(route(Some(remove)).expect("routed").subject, "storage.dcache.billing.path.data.bob._");
    }

    #[test]
    fn no_usable_path_or_no_event_goes_on_the_plain_subject() {
        let nfs = br#"{"VERSION":"1.0","msgType":"remove","cellType":"door","status":{"code":0},
            "session":"door:nfs@d:1","billingPath":"parent:[0000AB]/run42.h5","pnfsid":"0000AA"}"#;
        let unknown =
            br#"{"version":"1.0","msgType":"restore","status":{"code":0},"billingPath":"Unknown","pnfsid":"0000AA"}"#;
        let failed = br#"{"msgType":"transfer","status":{"code":666,"msg":"no space"},"isWrite":"write","transferPath":"/data/x"}"#;
        let warning = br#"{"version":"1.0","msgType":"warning","status":{"code":10001,"msg":"checksum"}}"#;
        let other = br#"{"msgType":"something-new","status":{"code":0}}"#;
        for m in [&nfs[..], unknown, failed, warning, other] {
            let r = route(Some(m)).expect("routed");
            assert_eq!(r, Routed { subject: EVENTS_SUBJECT.into(), plain: true }, "{}", String::from_utf8_lossy(m));
        }
    }

    #[test]
    fn malformed_records_are_refused_with_their_reason() {
        assert_eq!(route(None), Err(RecordError::NoValue));
        let big = vec![b' '; MAX_RECORD_BYTES + 1];
        assert_eq!(route(Some(&big)), Err(RecordError::TooLarge(MAX_RECORD_BYTES + 1)));
        for bad in [
            &b"not json"[..],
            b"{}",
            b"[1,2]",
            b"\xff\xfe",
            br#"{"msgType":"transfer","status":{"code":0},"isWrite":"write"}"#,
        ] {
            assert!(matches!(route(Some(bad)), Err(RecordError::Billing(_))), "{}", String::from_utf8_lossy(bad));
        }
        // A path that is not clean: refused, never turned into some other directory's subject.
        for path in ["/data/../etc/passwd", "data/x", "/data//x", "/data/./x"] {
            let e = route(Some(&transfer(path))).expect_err(path);
            assert!(matches!(e, RecordError::Billing(EventError::BadPath(_))), "{path}: {e:?}");
        }
        assert_eq!(
            RecordError::TooLarge(70_000).to_string(),
            "the record's value is 70000 bytes, more than the 65536 allowed"
        );
    }

    #[test]
    fn message_ids_name_the_records_place() {
        assert_eq!(message_id("billing", 2, 41), "kafka:billing:2:41");
        assert_ne!(message_id("billing", 1, 23), message_id("billing", 12, 3));
    }
}
