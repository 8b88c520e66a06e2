//! dCache billing messages → [`StorageEvent`] (`shared/reference/dcache.md` §1).
//!
//! | `msgType` | from | event kind |
//! |---|---|---|
//! | `transfer` | pool | `isWrite` `"write"` → `write`, `"read"` → `read`; `isP2p` ignored |
//! | `request` | door | `moverInfo.isWrite` `"write"` → `write`, `"read"` → `read`; no `moverInfo` ignored |
//! | `remove` | door | `remove` (a namespace delete) |
//! | `remove` | pool (`cellType` `pool`) | `replica-remove` (one replica dropped; the file stays) |
//! | `store` / `restore` | pool | `store` / `restore` (tape) |
//! | `hit` | pool | `hit` (size from the lower-case `filesize`) |
//! | `warning` | any | never an event |
//!
//! Quirks handled: door messages say `VERSION` (upper case), null keys are absent, key order is
//! arbitrary; a status code other than 0 is a failed operation (ignored); the path is
//! `transferPath` (else `moverInfo.transferPath`, else `billingPath`), and a message whose only
//! path is `"Unknown"` or NFS's `parent:[<pnfsid>]/<name>` is ignored, not malformed; the
//! storage class is the `<class>` of `storageInfo` `<class>@<hsm>`; the owner is the
//! `UserNamePrincipal[…]` of `subject`, else the door's `owner`; the producer is
//! `cellName@cellDomain`.
//!
//! **Identity** (`StorageEvent::id`): `dcache-billing:<kind>:<pnfsid>/<key>`, where `<key>`
//! is the *door's* transaction: a pool `transfer`'s `initiator`, which is the `session` of the
//! door's `request` for the same transfer, so a site that enables both gets one event id (and
//! one job) per upload; other messages use their `session` (else `transaction`). A message
//! with none (`hit`) is keyed by `<cellName@cellDomain>@<date>`, so the copies of one message
//! (dCache 11.2's billing producer next to the pool's) still agree; a message with no
//! `pnfsid` is keyed by where it was read from (`message_id`). The kind is part of the id: a
//! write and a later remove of one file are two occurrences.

use super::{Decision, EventError, SourcePolicy, checked_path};
use crate::event::{EventKind, EventSource, SourceKind, StorageEvent};
use serde::Deserialize;

/// The `msgType`s a site can enable ([`SourcePolicy::dcache_msg_types`]).
pub const MSG_TYPES: [&str; 6] = ["transfer", "request", "remove", "store", "restore", "hit"];

/// What the gateway reads of any billing message. Every key is optional (dCache omits nulls);
/// unknown keys are ignored. Deserialize-only: `crate::proto::TransferMessage` is
/// what the built-in storage writes.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BillingMessage {
    msg_type: Option<String>,
    date: Option<String>,
    cell_name: Option<String>,
    cell_type: Option<String>,
    cell_domain: Option<String>,
    status: Option<Status>,
    /// The sender's transaction: the pool's for `transfer`, the door's for `request`/`remove`.
    session: Option<String>,
    /// Pool `remove`, `store`, `restore`: the transaction id.
    transaction: Option<String>,
    /// Pool `transfer`: the door's transaction id (= the door `request`'s `session`).
    initiator: Option<String>,
    subject: Option<Vec<String>>,
    /// Door messages: DN or user name.
    owner: Option<String>,
    pnfsid: Option<String>,
    billing_path: Option<String>,
    transfer_path: Option<String>,
    file_size: Option<i64>,
    /// `hit` spells it in lower case.
    #[serde(rename = "filesize")]
    filesize_lower: Option<i64>,
    storage_info: Option<String>,
    is_write: Option<String>,
    is_p2p: Option<bool>,
    /// Door `request`: the pool's `transfer`, minus the file's keys.
    mover_info: Option<MoverInfo>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MoverInfo {
    status: Option<Status>,
    is_write: Option<String>,
    is_p2p: Option<bool>,
    transfer_path: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Status {
    code: i64,
}

impl Status {
    fn failed(s: Option<&Status>) -> bool {
        s.is_some_and(|s| s.code != 0)
    }
}

/// Decides what a billing message means under `policy`.
pub fn decide(payload: &[u8], message_id: &str, policy: &SourcePolicy) -> Result<Decision, EventError> {
    let m: BillingMessage = serde_json::from_slice(payload).map_err(|e| EventError::Billing(e.to_string()))?;
    let msg_type = m.msg_type.as_deref().ok_or_else(|| EventError::Billing("no msgType".into()))?;
    if msg_type == "warning" {
        return Ok(Decision::Ignore("a dCache warning"));
    }
    if !MSG_TYPES.contains(&msg_type) {
        return Ok(Decision::Ignore("an unknown dCache msgType"));
    }
    if !policy.enables_dcache(msg_type) {
        return Ok(Decision::NotEnabled(format!("{} {msg_type}", SourceKind::DcacheBilling.as_str())));
    }
    match &m.status {
        Some(s) if s.code == 0 => {}
        Some(_) => return Ok(Decision::Ignore("a failed operation (status code not 0)")),
        None => return Ok(Decision::Ignore("no status")),
    }
    // The kind, and the door's transaction when the message knows it.
    let (kind, door_session) = match msg_type {
        "transfer" => {
            if m.is_p2p == Some(true) {
                return Ok(Decision::Ignore("a pool-to-pool copy"));
            }
            (read_or_write(m.is_write.as_deref(), "isWrite")?, m.initiator.as_deref())
        }
        "request" => {
            let Some(mover) = &m.mover_info else {
                return Ok(Decision::Ignore("a door request that moved no data (no moverInfo)"));
            };
            if mover.is_p2p == Some(true) {
                return Ok(Decision::Ignore("a pool-to-pool copy"));
            }
            if Status::failed(mover.status.as_ref()) {
                return Ok(Decision::Ignore("a failed operation (status code not 0)"));
            }
            (read_or_write(mover.is_write.as_deref(), "moverInfo.isWrite")?, m.session.as_deref())
        }
        "remove" if m.cell_type.as_deref() == Some("pool") => (EventKind::ReplicaRemove, None),
        "remove" => (EventKind::Remove, m.session.as_deref()),
        "store" => (EventKind::Store, None),
        "restore" => (EventKind::Restore, None),
        _ => (EventKind::Hit, None),
    };
    let path = match path_of(&m)? {
        Ok(p) => p,
        Err(why) => return Ok(Decision::Ignore(why)),
    };
    let producer = match (&m.cell_name, &m.cell_domain) {
        (Some(c), Some(d)) => format!("{c}@{d}"),
        (Some(c), None) => c.clone(),
        _ => "unknown".to_owned(),
    };
    let key = nonempty(door_session)
        .or(nonempty(m.session.as_deref()))
        .or(nonempty(m.transaction.as_deref()))
        .map(str::to_owned)
        .or_else(|| m.date.as_ref().map(|d| format!("{producer}@{d}")));
    let occurrence = match (nonempty(m.pnfsid.as_deref()), key) {
        (Some(p), Some(k)) => format!("{}/{k}", super::id_part(p)),
        (Some(p), None) => format!("{}/{message_id}", super::id_part(p)),
        (None, _) => message_id.to_owned(),
    };
    let size = if kind == EventKind::Hit { m.filesize_lower.or(m.file_size) } else { m.file_size };
    let owner = m
        .subject
        .iter()
        .flatten()
        .find_map(|p| p.strip_prefix("UserNamePrincipal[")?.strip_suffix(']'))
        .map(str::to_owned)
        .or(m.owner.clone())
        .filter(|o| !o.is_empty());
    let macaroon = m
        .subject
        .iter()
        .flatten()
        .find_map(|p| p.strip_prefix("MacaroonPrincipal[")?.strip_suffix(']'))
        .filter(|id| !id.is_empty())
        .map(str::to_owned);
    let storage_class = m
        .storage_info
        .as_deref()
        .map(|s| s.rsplit_once('@').map_or(s, |(class, _hsm)| class))
        .filter(|c| !c.is_empty())
        .map(str::to_owned);
    Ok(Decision::Fire(Box::new(StorageEvent {
        id: format!("{}:{}:{occurrence}", SourceKind::DcacheBilling.as_str(), kind.as_str()),
        source: EventSource { kind: SourceKind::DcacheBilling, producer, message: Some(message_id.to_owned()) },
        kind,
        msg_type: msg_type.to_owned(),
        path,
        size: size.and_then(|s| u64::try_from(s).ok()),
        storage_class,
        owner,
        macaroon,
        time: m.date,
        traceparent: None,
    })))
}

fn read_or_write(v: Option<&str>, field: &str) -> Result<EventKind, EventError> {
    match v {
        Some("write") => Ok(EventKind::Write),
        Some("read") => Ok(EventKind::Read),
        _ => Err(EventError::Billing(format!("{field} is neither \"write\" nor \"read\""))),
    }
}

fn nonempty(s: Option<&str>) -> Option<&str> {
    s.filter(|s| !s.is_empty())
}

/// The path: `Ok(Ok(path))`, `Ok(Err(why))` when the message names no usable path (dCache's
/// `"Unknown"`, NFS's `parent:[…]/name`), `Err` when it names none at all or a bad one.
fn path_of(m: &BillingMessage) -> Result<Result<String, &'static str>, EventError> {
    let mover_path = m.mover_info.as_ref().and_then(|mi| mi.transfer_path.as_deref());
    let candidates = [m.transfer_path.as_deref(), mover_path, m.billing_path.as_deref()];
    if candidates.iter().all(Option::is_none) {
        return Err(EventError::Billing("no transferPath or billingPath".into()));
    }
    let usable =
        candidates.into_iter().flatten().find(|p| !p.is_empty() && *p != "Unknown" && !p.starts_with("parent:"));
    match usable {
        Some(p) => checked_path(p).map(Ok),
        None => Ok(Err("no usable path (\"Unknown\", or NFS's parent:[<pnfsid>]/<name>)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const PNFSID: &str = "0000C9B4E7A1F2D34E5C8B1A9F0E7D6C5B4A";
    const DOOR_SESSION: &str = "door:webdav-1@webdavDomain:1773479729001";

    /// §1.3 `transfer`: an upload finished on a pool.
    const TRANSFER: &str = r#"{"version":"1.0","msgType":"transfer","date":"2026-03-14T10:15:30.123+01:00","queuingTime":0,
 "cellName":"pool-a-1","cellType":"pool","cellDomain":"pool-aDomain",
 "meanWriteBandwidth":1.18E8,"writeIdle":"PT0.012S","writeActive":"PT0.9S","localEndpoint":"192.0.2.21:20123",
 "status":{"code":0,"msg":""},"session":"pool:pool-a-1@pool-aDomain:1773479730123-4711",
 "subject":["UidPrincipal[1000]","GidPrincipal[1000,primary]","UserNamePrincipal[alice]","Origin[198.51.100.7]"],
 "pnfsid":"0000C9B4E7A1F2D34E5C8B1A9F0E7D6C5B4A","billingPath":"/data/incoming/run42.h5",
 "transferPath":"/data/incoming/run42.h5","fileSize":104857600,"storageInfo":"exp:raw@osm",
 "transferSize":104857600,"transferTime":912,"isWrite":"write",
 "protocolInfo":{"protocol":"Http","versionMajor":1,"versionMinor":1,"transferTag":"","port":51514,"host":"198.51.100.7"},
 "initiator":"door:webdav-1@webdavDomain:1773479729001","isP2p":false}"#;

    /// §1.3 `request`: the door's view of the same upload (upper-case `VERSION`).
    const REQUEST: &str = r#"{"VERSION":"1.0","msgType":"request","date":"2026-03-14T10:15:30.200+01:00","queuingTime":0,
 "cellName":"webdav-1","cellType":"door","cellDomain":"webdavDomain","status":{"code":0,"msg":""},
 "session":"door:webdav-1@webdavDomain:1773479729001","sessionDuration":1320,
 "transferPath":"/data/incoming/run42.h5","subject":["UidPrincipal[1000]","GidPrincipal[1000,primary]","UserNamePrincipal[alice]","Origin[198.51.100.7]"],
 "client":"198.51.100.7","clientChain":"198.51.100.7","mappedUID":1000,"mappedGID":1000,"owner":"alice",
 "pnfsid":"0000C9B4E7A1F2D34E5C8B1A9F0E7D6C5B4A","billingPath":"/data/incoming/run42.h5","fileSize":104857600,
 "storageInfo":"exp:raw@osm",
 "moverInfo":{"version":"1.0","msgType":"transfer","date":"…","queuingTime":0,"cellName":"pool-a-1","cellType":"pool",
   "cellDomain":"pool-aDomain","status":{"code":0,"msg":""},"session":"pool:pool-a-1@pool-aDomain:1773479730123-4711",
   "transferSize":104857600,"transferTime":912,"isWrite":"write","protocolInfo":{"…":"…"},"isP2p":false,
   "transferPath":"/data/incoming/run42.h5"}}"#;

    /// §1.3 door `remove` (a WebDAV DELETE); no `UserNamePrincipal`, so the door's `owner`.
    const DOOR_REMOVE: &str = r#"{"VERSION":"1.0","msgType":"remove","cellType":"door","cellName":"webdav-1","cellDomain":"webdavDomain","date":"2026-03-14T11:00:00.000+01:00",
 "queuingTime":0,"status":{"code":0,"msg":""},"session":"door:webdav-1@webdavDomain:1773483600000","sessionDuration":12,
 "transferPath":"/data/incoming/run42.h5","billingPath":"/data/incoming/run42.h5","pnfsid":"0000C9B4E7A1F2D34E5C8B1A9F0E7D6C5B4A","fileSize":104857600,
 "subject":["UidPrincipal[1000]","Origin[198.51.100.7]"],"client":"198.51.100.7","clientChain":"unknown","mappedUID":1000,"mappedGID":1000,"owner":"alice"}"#;

    /// Built from §1.2: NFS's namespace-layer `remove` (only through the 11.2 billing producer).
    const NFS_REMOVE: &str = r#"{"VERSION":"1.0","msgType":"remove","cellType":"door","cellName":"nfs-1","cellDomain":"nfsDomain","date":"2026-03-14T11:00:00.000+01:00",
 "queuingTime":0,"status":{"code":0,"msg":""},"session":"door:nfs-1@nfsDomain:1773483600001","billingPath":"parent:[0000AB12CD34EF56AB12CD34EF56AB12CD34]/run42.h5",
 "pnfsid":"0000C9B4E7A1F2D34E5C8B1A9F0E7D6C5B4A","fileSize":0,"subject":["UidPrincipal[1000]"],"mappedUID":1000,"mappedGID":1000}"#;

    /// Built from §1.2: pool `remove` (one replica; `subject` is root, `msg` the reason).
    const POOL_REMOVE: &str = r#"{"version":"1.0","msgType":"remove","date":"2026-03-14T12:00:00.000+01:00","queuingTime":0,
 "transaction":"pool:pool-a-1@pool-aDomain:1773486000000-9","cellName":"pool-a-1","cellType":"pool","cellDomain":"pool-aDomain",
 "status":{"code":0,"msg":"sweeper"},"session":"pool:pool-a-1@pool-aDomain:1773486000000-9","subject":["UidPrincipal[0]","GidPrincipal[0,primary]"],
 "pnfsid":"0000C9B4E7A1F2D34E5C8B1A9F0E7D6C5B4A","billingPath":"/data/incoming/run42.h5","fileSize":104857600,"storageInfo":"exp:raw@osm"}"#;

    /// §1.3 `store` (flushed to tape).
    const STORE: &str = r#"{"version":"1.0","msgType":"store","date":"2026-03-14T10:20:00.000+01:00","queuingTime":12,"transaction":"pool:pool-a-1@pool-aDomain:1773479999000-1","session":"pool:pool-a-1@pool-aDomain:1773479999000-1",
 "cellName":"pool-a-1","cellType":"pool","cellDomain":"pool-aDomain","status":{"code":0,"msg":""},
 "hsm":{"type":"osm","instance":"osm","provider":"script"},"locations":["osm://osm/?store=exp&group=raw&bfid=…"],
 "pnfsid":"0000C9B4E7A1F2D34E5C8B1A9F0E7D6C5B4A","billingPath":"/data/incoming/run42.h5","fileSize":104857600,"storageInfo":"exp:raw@osm","transferTime":5400}"#;

    /// Built from §1.2: `restore` (staged from tape), no `transferPath`.
    const RESTORE: &str = r#"{"version":"1.0","msgType":"restore","date":"2026-03-15T08:00:00.000+01:00","queuingTime":3,"transaction":"pool:pool-b-2@pool-bDomain:1773558000000-3","session":"pool:pool-b-2@pool-bDomain:1773558000000-3",
 "cellName":"pool-b-2","cellType":"pool","cellDomain":"pool-bDomain","status":{"code":0,"msg":""},
 "hsm":{"type":"osm","instance":"osm","provider":"script"},"locations":[],
 "pnfsid":"0000C9B4E7A1F2D34E5C8B1A9F0E7D6C5B4A","billingPath":"/data/incoming/run42.h5","fileSize":104857600,"storageInfo":"exp:raw@osm","transferTime":81000}"#;

    /// Built from §1.2: `hit` (lower-case `filesize`, no session).
    const HIT: &str = r#"{"version":"1.0","msgType":"hit","date":"2026-03-15T09:00:00.000+01:00","cellName":"pool-b-2","cellType":"pool","cellDomain":"pool-bDomain",
 "status":{"code":0,"msg":""},"pnfsid":"0000C9B4E7A1F2D34E5C8B1A9F0E7D6C5B4A","filesize":104857600,"billingPath":"/data/incoming/run42.h5",
 "protocol":"Http-1.1:198.51.100.7:0:webdav-1:webdavDomain:/data/incoming/run42.h5","cached":true,"storageInfo":"exp:raw@osm"}"#;

    /// Built from §1.2: `warning`.
    const WARNING: &str = r#"{"version":"1.0","msgType":"warning","date":"2026-03-15T09:00:00.000+01:00","cellName":"PnfsManager","cellType":"PnfsManager","cellDomain":"namespaceDomain","status":{"code":10001,"msg":"checksum mismatch"}}"#;

    const FIXTURES: [&str; 9] = [TRANSFER, REQUEST, DOOR_REMOVE, NFS_REMOVE, POOL_REMOVE, STORE, RESTORE, HIT, WARNING];

    fn all_types() -> SourcePolicy {
        SourcePolicy { dcache_msg_types: MSG_TYPES.map(str::to_owned).to_vec(), cloudevents: true }
    }

    fn fire(json: &str) -> StorageEvent {
        fire_bytes(json.as_bytes())
    }

    fn fire_bytes(bytes: &[u8]) -> StorageEvent {
        match decide(bytes, "nats-seq-7", &all_types()) {
            Ok(Decision::Fire(e)) => *e,
            other => panic!("expected an event, got {other:?}"),
        }
    }

    fn ignored(bytes: &[u8]) -> Decision {
        decide(bytes, "nats-seq-7", &all_types()).expect("well-formed")
    }

    fn with(json: &str, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> Vec<u8> {
        let mut v: Value = serde_json::from_str(json).expect("fixture parses");
        edit(v.as_object_mut().expect("an object"));
        serde_json::to_vec(&v).expect("serializes")
    }

    #[test]
    fn a_pool_transfer_write_fires_with_every_field() {
        let e = fire(TRANSFER);
        assert_eq!(
            e,
            StorageEvent {
                source: EventSource {
                    kind: SourceKind::DcacheBilling,
                    producer: "pool-a-1@pool-aDomain".into(),
                    message: Some("nats-seq-7".into()),
                },
                kind: EventKind::Write,
                msg_type: "transfer".into(),
                path: "/data/incoming/run42.h5".into(),
                size: Some(104_857_600),
                storage_class: Some("exp:raw".into()),
                owner: Some("alice".into()),
                macaroon: None,
                id: format!("dcache-billing:write:{PNFSID}/{DOOR_SESSION}"),
                time: Some("2026-03-14T10:15:30.123+01:00".into()),
                traceparent: None,
            }
        );
    }

    #[test]
    fn a_write_made_with_a_macaroon_names_it_for_the_loop_guard() {
        assert_eq!(fire(TRANSFER).macaroon, None);
        let with = TRANSFER.replacen(r#""subject":["#, r#""subject":["MacaroonPrincipal[b5c1e0a2]","#, 1);
        assert_ne!(with, TRANSFER, "the fixture has a subject");
        assert_eq!(fire(&with).macaroon.as_deref(), Some("b5c1e0a2"));
        let empty = TRANSFER.replacen(r#""subject":["#, r#""subject":["MacaroonPrincipal[]","#, 1);
        assert_eq!(fire(&empty).macaroon, None);
    }

    #[test]
    fn the_transfer_and_the_door_request_of_one_upload_have_one_id() {
        let (t, r) = (fire(TRANSFER), fire(REQUEST));
        assert_eq!(t.id, r.id, "they dedupe to one job");
        assert_eq!((r.kind, r.msg_type.as_str()), (EventKind::Write, "request"));
        assert_eq!(r.source.producer, "webdav-1@webdavDomain");
        assert_eq!(
            (r.path.as_str(), r.size, r.owner.as_deref()),
            ("/data/incoming/run42.h5", Some(104_857_600), Some("alice"))
        );
        assert_eq!(r.storage_class.as_deref(), Some("exp:raw"));
        // And for a download: both are a read, again with one id, not the write's.
        let tr = fire_bytes(&with(TRANSFER, |o| drop(o.insert("isWrite".into(), json!("read")))));
        let rr = fire_bytes(&with(REQUEST, |o| o["moverInfo"]["isWrite"] = json!("read")));
        assert_eq!((tr.kind, rr.kind), (EventKind::Read, EventKind::Read));
        assert_eq!(tr.id, rr.id);
        assert_ne!(tr.id, t.id);
        // A second upload (another door session) is another occurrence.
        let again = fire_bytes(&with(TRANSFER, |o| drop(o.insert("initiator".into(), json!("door:webdav-1@x:2")))));
        assert_ne!(again.id, t.id);
    }

    #[test]
    fn removes_from_a_door_and_from_a_pool_are_different_kinds() {
        let d = fire(DOOR_REMOVE);
        assert_eq!((d.kind, d.msg_type.as_str(), d.owner.as_deref()), (EventKind::Remove, "remove", Some("alice")));
        assert_eq!(d.id, format!("dcache-billing:remove:{PNFSID}/door:webdav-1@webdavDomain:1773483600000"));
        assert_eq!(d.storage_class, None, "absent key");
        let p = fire(POOL_REMOVE);
        assert_eq!((p.kind, p.owner.as_deref()), (EventKind::ReplicaRemove, None));
        assert_eq!(p.id, format!("dcache-billing:replica-remove:{PNFSID}/pool:pool-a-1@pool-aDomain:1773486000000-9"));
        assert_eq!(p.path, "/data/incoming/run42.h5", "billingPath when there is no transferPath");
        // NFS's remove names the file by its parent's pnfsid: no usable path.
        assert_eq!(
            ignored(NFS_REMOVE.as_bytes()),
            Decision::Ignore("no usable path (\"Unknown\", or NFS's parent:[<pnfsid>]/<name>)")
        );
    }

    #[test]
    fn store_restore_and_hit_fire_their_kinds() {
        let s = fire(STORE);
        assert_eq!(
            (s.kind, s.size, s.storage_class.as_deref()),
            (EventKind::Store, Some(104_857_600), Some("exp:raw"))
        );
        assert_eq!(s.id, format!("dcache-billing:store:{PNFSID}/pool:pool-a-1@pool-aDomain:1773479999000-1"));
        let r = fire(RESTORE);
        assert_eq!((r.kind, r.source.producer.as_str()), (EventKind::Restore, "pool-b-2@pool-bDomain"));
        let r2 = fire_bytes(&with(RESTORE, |o| drop(o.remove("session"))));
        assert_eq!(r2.id, r.id, "transaction when there is no session");
        let h = fire(HIT);
        assert_eq!((h.kind, h.size), (EventKind::Hit, Some(104_857_600)), "lower-case filesize");
        assert_eq!(h.id, format!("dcache-billing:hit:{PNFSID}/pool-b-2@pool-bDomain@2026-03-15T09:00:00.000+01:00"));
        assert_eq!(ignored(WARNING.as_bytes()), Decision::Ignore("a dCache warning"));
    }

    #[test]
    fn failures_p2p_and_moverless_requests_are_ignored() {
        let failed = Decision::Ignore("a failed operation (status code not 0)");
        for fixture in [TRANSFER, REQUEST, DOOR_REMOVE, POOL_REMOVE, STORE, RESTORE, HIT] {
            let b = with(fixture, |o| drop(o.insert("status".into(), json!({"code": 666, "msg": "no space"}))));
            assert_eq!(ignored(&b), failed, "{fixture}");
        }
        let b = with(REQUEST, |o| o["moverInfo"]["status"] = json!({"code": 1, "msg": "x"}));
        assert_eq!(ignored(&b), failed);
        let p2p = Decision::Ignore("a pool-to-pool copy");
        assert_eq!(ignored(&with(TRANSFER, |o| drop(o.insert("isP2p".into(), json!(true))))), p2p);
        assert_eq!(ignored(&with(REQUEST, |o| o["moverInfo"]["isP2p"] = json!(true))), p2p);
        let b = with(REQUEST, |o| drop(o.remove("moverInfo")));
        assert_eq!(ignored(&b), Decision::Ignore("a door request that moved no data (no moverInfo)"));
        assert_eq!(ignored(&with(TRANSFER, |o| drop(o.remove("status")))), Decision::Ignore("no status"));
        let b = with(TRANSFER, |o| drop(o.insert("msgType".into(), json!("check"))));
        assert_eq!(ignored(&b), Decision::Ignore("an unknown dCache msgType"));
    }

    #[test]
    fn types_the_site_did_not_enable_are_not_events() {
        let only_transfer = SourcePolicy::default();
        assert!(matches!(decide(TRANSFER.as_bytes(), "s", &only_transfer), Ok(Decision::Fire(_))));
        for (fixture, t) in [(REQUEST, "request"), (DOOR_REMOVE, "remove"), (STORE, "store"), (HIT, "hit")] {
            assert_eq!(
                decide(fixture.as_bytes(), "s", &only_transfer),
                Ok(Decision::NotEnabled(format!("dcache-billing {t}")))
            );
        }
        // Even a failed one: the site's choice comes first.
        let failed = with(REQUEST, |o| drop(o.insert("status".into(), json!({"code": 1}))));
        assert_eq!(decide(&failed, "s", &only_transfer), Ok(Decision::NotEnabled("dcache-billing request".into())));
    }

    #[test]
    fn paths_prefer_transfer_path_and_unknown_is_no_path() {
        let renamed = with(TRANSFER, |o| drop(o.insert("billingPath".into(), json!("/data/old-name.h5"))));
        assert_eq!(fire_bytes(&renamed).path, "/data/incoming/run42.h5");
        let unknown = with(TRANSFER, |o| {
            o.remove("transferPath");
            o.insert("billingPath".into(), json!("Unknown"));
        });
        assert!(matches!(ignored(&unknown), Decision::Ignore(why) if why.starts_with("no usable path")));
        // A door request without a top-level transferPath: the mover's.
        let b = with(REQUEST, |o| {
            o.remove("transferPath");
            o.insert("billingPath".into(), json!("Unknown"));
        });
        assert_eq!(fire_bytes(&b).path, "/data/incoming/run42.h5");
        let none = with(TRANSFER, |o| {
            o.remove("transferPath");
            o.remove("billingPath");
        });
        assert_eq!(decide(&none, "s", &all_types()), Err(EventError::Billing("no transferPath or billingPath".into())));
        for bad in ["/data/../etc/passwd", "relative/x", "/data//x", "/data/dir/", "/"] {
            let b = with(TRANSFER, |o| drop(o.insert("transferPath".into(), json!(bad))));
            assert_eq!(decide(&b, "s", &all_types()), Err(EventError::BadPath(bad.into())), "{bad}");
        }
    }

    #[test]
    fn identities_fall_back_to_the_pool_session_then_the_message() {
        let b = with(TRANSFER, |o| drop(o.remove("initiator")));
        assert_eq!(
            fire_bytes(&b).id,
            format!("dcache-billing:write:{PNFSID}/pool:pool-a-1@pool-aDomain:1773479730123-4711")
        );
        let b = with(TRANSFER, |o| {
            o.remove("initiator");
            o.remove("session");
            o.remove("date");
        });
        assert_eq!(fire_bytes(&b).id, format!("dcache-billing:write:{PNFSID}/nats-seq-7"));
        let b = with(TRANSFER, |o| drop(o.remove("pnfsid")));
        assert_eq!(fire_bytes(&b).id, "dcache-billing:write:nats-seq-7");
        // The door's owner when the subject names no user; key order and null keys don't matter.
        let b = with(REQUEST, |o| {
            o.insert("subject".into(), json!(["UidPrincipal[1000]"]));
            o.insert("owner".into(), json!("/C=DE/O=GermanGrid/CN=Alice"));
            o.insert("storageInfo".into(), Value::Null);
        });
        let e = fire_bytes(&b);
        assert_eq!((e.owner.as_deref(), e.storage_class), (Some("/C=DE/O=GermanGrid/CN=Alice"), None));
        let b = with(TRANSFER, |o| drop(o.insert("fileSize".into(), json!(-1))));
        assert_eq!(fire_bytes(&b).size, None, "a negative size is unknown");
    }

    #[test]
    fn garbage_is_malformed() {
        let p = all_types();
        for bytes in [&b"{not json"[..], b"[1,2]", b"", b"null", b"\xff\xfe", b"{}"] {
            assert!(matches!(decide(bytes, "s", &p), Err(EventError::Billing(_))), "{bytes:?}");
        }
        let wrong: [(&str, Value); 5] = [
            ("isWrite", json!(true)),
            ("isWrite", json!("both")),
            ("fileSize", json!("big")),
            ("subject", json!("alice")),
            ("status", json!({"msg": "no code"})),
        ];
        for (k, v) in wrong {
            let b = with(TRANSFER, |o| drop(o.insert(k.into(), v.clone())));
            assert!(matches!(decide(&b, "s", &p), Err(EventError::Billing(_))), "{k}: {v}");
        }
        let b = with(REQUEST, |o| o["moverInfo"]["isWrite"] = json!(null));
        assert_eq!(
            decide(&b, "s", &p),
            Err(EventError::Billing("moverInfo.isWrite is neither \"write\" nor \"read\"".into()))
        );
    }

    #[test]
    fn truncated_and_mangled_fixtures_never_panic() {
        let p = all_types();
        for fixture in FIXTURES {
            let bytes = fixture.as_bytes();
            for cut in 0..bytes.len() {
                let _ = decide(&bytes[..cut], "s", &p);
                let mut flipped = bytes.to_vec();
                flipped[cut] ^= 0x55;
                let _ = decide(&flipped, "s", &p);
            }
        }
    }
}
