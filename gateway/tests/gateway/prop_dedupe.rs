//! Property tests of the exactly-once keys against hostile input.
//!
//! Three keys stand between one storage event and a second job:
//! - the event's identity, [`StorageEvent::id`], derived by the gateway's parsers
//!   (`sources::dcache::decide`, `sources::cloudevents::decide`);
//! - the firing table's key `(event_key, function, digest)` (`firing::event_key`: the id, with
//!   `#replay:<id>` for a replay);
//! - the scheduler's `<event id>#<function>@<digest>[#replay:<id>]`
//!   (`ingest::scheduler_dedupe_key`).
//!
//! Properties: the identity is a function of the occurrence only (the same dCache message
//! delivered again, from another NATS sequence, with its keys in another order, with null or
//! unknown keys, gives the same id; the pool's `transfer` and the door's `request` of one
//! upload agree), distinct occurrences get distinct ids, and distinct triples never share a
//! key, whatever characters an event id holds (`#`, `@`, `/`, `#replay:`…).
//!
//! Three of them found collisions, each now fixed and kept with its counterexample: an event
//! id ending in `#replay:<id>` took a replay's key (the replay now comes first in the key); a
//! `/` in a CloudEvent's id or a billing pnfsid made two occurrences one identity (both are
//! now percent-escaped in the identity).

use htfaas_functions::event::StorageEvent;
use htfaas_functions::manifest::{FunctionManifest, Outputs, Resources, Trigger};
use htfaas_functions::sources::{Decision, SourcePolicy, decide};
use htfaas_functions::{Digest, FunctionRecord};
use htfaas_gateway::firing::{Firings, event_key};
use htfaas_gateway::jobs::scheduler_dedupe_key;
use proptest::prelude::*;
use serde_json::{Value, json};

const BILLING: &str = "storage.dcache.billing";
const CE_SUBJECT: &str = "storage.cloudevents.lab";

fn all_types() -> SourcePolicy {
    SourcePolicy {
        dcache_msg_types: ["transfer", "request", "remove", "store", "restore", "hit"].map(str::to_owned).to_vec(),
        cloudevents: true,
    }
}

fn fire(subject: &str, body: &[u8], message_id: &str) -> StorageEvent {
    match decide(subject, None, body, message_id, &all_types()) {
        Ok(Decision::Fire(e)) => *e,
        other => panic!("expected an event from {}, got {other:?}", String::from_utf8_lossy(body)),
    }
}

fn function(name: &str, module: &[u8]) -> FunctionRecord {
    FunctionRecord {
        schema: 1,
        version: 1,
        registered_at: 0,
        manifest: FunctionManifest {
            runtime: Default::default(),
            command: Vec::new(),
            handler: false,
            retry: None,
            name: name.into(),
            owner: "alice".into(),
            module: Digest::of(module),
            trigger: Trigger::on_path("/data/**"),
            resources: Resources::default(),
            outputs: Outputs::into_dir(format!("/out/{name}/")),
            args: vec![],
            env: vec![],
            annex: None,
            class: None,
            limits: Default::default(),
            group: None,
            secrets: Default::default(),
            webhook: None,
            max_concurrent: None,
            inputs: Default::default(),
            vacate_s: None,
            checkpoint: None,
        },
    }
}

/// One upload as dCache reports it: the pool's `transfer` and the door's `request`.
#[derive(Debug, Clone)]
struct Upload {
    pnfsid: String,
    door_session: String,
    pool_session: String,
    path: String,
    size: u64,
    write: bool,
}

impl Upload {
    fn transfer(&self) -> Vec<(&'static str, Value)> {
        vec![
            ("version", json!("1.0")),
            ("msgType", json!("transfer")),
            ("date", json!("2026-03-14T10:15:30.123+01:00")),
            ("cellName", json!("pool-a-1")),
            ("cellType", json!("pool")),
            ("cellDomain", json!("pool-aDomain")),
            ("status", json!({"code": 0, "msg": ""})),
            ("session", json!(self.pool_session)),
            ("subject", json!(["UidPrincipal[1000]", "UserNamePrincipal[alice]"])),
            ("pnfsid", json!(self.pnfsid)),
            ("billingPath", json!(self.path)),
            ("transferPath", json!(self.path)),
            ("fileSize", json!(self.size)),
            ("storageInfo", json!("exp:raw@osm")),
            ("isWrite", json!(if self.write { "write" } else { "read" })),
            ("initiator", json!(self.door_session)),
            ("isP2p", json!(false)),
        ]
    }

    fn request(&self) -> Vec<(&'static str, Value)> {
        vec![
            ("VERSION", json!("1.0")),
            ("msgType", json!("request")),
            ("date", json!("2026-03-14T10:15:30.200+01:00")),
            ("cellName", json!("webdav-1")),
            ("cellType", json!("door")),
            ("cellDomain", json!("webdavDomain")),
            ("status", json!({"code": 0, "msg": ""})),
            ("session", json!(self.door_session)),
            ("owner", json!("alice")),
            ("pnfsid", json!(self.pnfsid)),
            ("billingPath", json!(self.path)),
            ("fileSize", json!(self.size)),
            (
                "moverInfo",
                json!({"msgType": "transfer", "status": {"code": 0}, "session": self.pool_session,
                       "isWrite": if self.write { "write" } else { "read" }, "isP2p": false,
                       "transferPath": self.path}),
            ),
        ]
    }
}

/// The JSON object with its keys in the order of `order` (a permutation seed), plus `extra`
/// keys dCache may add or leave null.
fn render(fields: &[(&str, Value)], order: &[usize], extra: &[(&str, Value)]) -> Vec<u8> {
    let mut items: Vec<String> =
        fields.iter().chain(extra).map(|(k, v)| format!("{}:{v}", Value::String((*k).to_owned()))).collect();
    // A Fisher–Yates shuffle driven by the generated indices.
    for (i, r) in order.iter().enumerate().take(items.len()) {
        let j = i + r % (items.len() - i);
        items.swap(i, j);
    }
    format!("{{{}}}", items.join(",")).into_bytes()
}

fn pnfsid() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(&b"0123456789ABCDEF"[..]), 36)
        .prop_map(|b| String::from_utf8(b).expect("hex is ASCII"))
}

/// Any string, with the separators the keys use over-represented.
fn hostile() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            prop::sample::select(&["#", "@", "/", ":", "#replay:", "sha256:", "a", "door:webdav-1@webdavDomain:"][..])
                .prop_map(str::to_owned),
            any::<char>().prop_map(String::from),
        ],
        1..8,
    )
    .prop_map(|parts| parts.concat())
}

fn session() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u64..1_000_000).prop_map(|n| format!("door:webdav-1@webdavDomain:{n}")),
        hostile().prop_filter("non-empty", |s| !s.is_empty()),
    ]
}

fn upload() -> impl Strategy<Value = Upload> {
    (
        pnfsid(),
        session(),
        session(),
        prop::collection::vec(prop::sample::select(&["data", "raw", "run42.h5", "é"][..]), 1..4),
        any::<u64>(),
        any::<bool>(),
    )
        .prop_map(|(pnfsid, door_session, pool_session, segs, size, write)| Upload {
            pnfsid,
            door_session,
            pool_session,
            path: format!("/{}", segs.join("/")),
            size: size >> 1,
            write,
        })
}

/// Keys dCache may add, or send as null, that say nothing about the occurrence.
fn extras() -> impl Strategy<Value = Vec<(&'static str, Value)>> {
    prop::collection::vec(
        prop::sample::select(vec![
            ("transferTime", json!(912)),
            ("queuingTime", json!(0)),
            ("localEndpoint", json!("192.0.2.21:20123")),
            ("protocolInfo", json!({"protocol": "Http", "port": 51514})),
            ("meanWriteBandwidth", json!(1.18e8)),
            ("client", Value::Null),
            ("transaction", Value::Null),
        ]),
        0..4,
    )
    .prop_map(|mut v| {
        v.sort_by_key(|(k, _)| *k);
        v.dedup_by_key(|(k, _)| *k);
        v
    })
}

fn digest() -> impl Strategy<Value = Digest> {
    any::<[u8; 8]>().prop_map(|b| Digest::of(&b))
}

/// A valid function name: `[a-z0-9][a-z0-9_-]{0,62}`.
fn name() -> impl Strategy<Value = String> {
    (prop::sample::select(&b"abz09"[..]), prop::collection::vec(prop::sample::select(&b"az09_-"[..]), 0..6))
        .prop_map(|(first, rest)| std::iter::once(first).chain(rest).map(char::from).collect())
}

/// A replay id as `replay::check_replay_id` admits: 1–64 of `[A-Za-z0-9_-]`.
fn replay_id() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(&b"rR09_-x"[..]), 1..10)
        .prop_map(|b| String::from_utf8(b).expect("ASCII"))
}

fn event_with_id(id: &str) -> StorageEvent {
    let mut e = fire(BILLING, &render(&sample_upload().transfer(), &[], &[]), "nats-seq-1");
    e.id = id.to_owned();
    e
}

fn sample_upload() -> Upload {
    Upload {
        pnfsid: "0000C9B4E7A1F2D34E5C8B1A9F0E7D6C5B4A".into(),
        door_session: "door:webdav-1@webdavDomain:1773479729001".into(),
        pool_session: "pool:pool-a-1@pool-aDomain:1773479730123-4711".into(),
        path: "/data/incoming/run42.h5".into(),
        size: 104_857_600,
        write: true,
    }
}

/// Inverts `scheduler_dedupe_key` for valid names, digests and replay ids: proof that it is
/// injective (a left inverse exists), whatever the event id holds.
fn decode_scheduler_key(key: &str) -> Option<(String, String, String, Option<String>)> {
    let valid_replay =
        |r: &str| !r.is_empty() && r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    let (rest, replay) = match key.rsplit_once("#replay:") {
        Some((rest, r)) if valid_replay(r) => (rest, Some(r.to_owned())),
        _ => (key, None),
    };
    let (id_name, digest) = rest.rsplit_once('@')?;
    let (id, name) = id_name.rsplit_once('#')?;
    Some((id.to_owned(), name.to_owned(), digest.to_owned(), replay))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The same message delivered again (another NATS sequence, keys in another order, null
    /// and unknown keys added) has the same identity, and so the same keys.
    #[test]
    fn a_redelivered_message_keeps_its_keys(
        u in upload(),
        order1 in prop::collection::vec(any::<usize>(), 24),
        order2 in prop::collection::vec(any::<usize>(), 24),
        extra in extras(),
        seq in 2u64..1_000_000,
        f in name(),
        d in digest(),
    ) {
        let f = FunctionRecord { manifest: FunctionManifest { module: d, ..function(&f, b"").manifest }, ..function(&f, b"") };
        for msg in [u.transfer(), u.request()] {
            let a = fire(BILLING, &render(&msg, &order1, &[]), "nats-seq-1");
            let b = fire(BILLING, &render(&msg, &order2, &extra), &format!("nats-seq-{seq}"));
            prop_assert_eq!(&a.id, &b.id);
            prop_assert_eq!(event_key(&a, None), event_key(&b, None));
            prop_assert_eq!(scheduler_dedupe_key(&a, &f, None), scheduler_dedupe_key(&b, &f, None));
            prop_assert_eq!(scheduler_dedupe_key(&a, &f, Some("r1")), scheduler_dedupe_key(&b, &f, Some("r1")));
        }
    }

    /// The pool's `transfer` and the door's `request` of one upload are one occurrence.
    #[test]
    fn the_transfer_and_the_door_request_share_an_id(u in upload(), order in prop::collection::vec(any::<usize>(), 24)) {
        let t = fire(BILLING, &render(&u.transfer(), &order, &[]), "nats-seq-1");
        let r = fire(BILLING, &render(&u.request(), &order, &[]), "nats-seq-2");
        prop_assert_eq!(&t.id, &r.id);
        prop_assert_eq!(t.kind, r.kind);
        prop_assert!(t.id.starts_with("dcache-billing:"));
    }

    /// Another file (pnfsid), another upload of it (door session), or a read instead of a
    /// write is another occurrence. The pool's own session does not matter.
    #[test]
    fn distinct_transfers_get_distinct_ids(u in upload(), v in upload()) {
        let a = fire(BILLING, &render(&u.transfer(), &[], &[]), "nats-seq-1");
        let b = fire(BILLING, &render(&v.transfer(), &[], &[]), "nats-seq-1");
        let same = (&u.pnfsid, &u.door_session, u.write) == (&v.pnfsid, &v.door_session, v.write);
        prop_assert_eq!(a.id == b.id, same, "{} vs {}", a.id, b.id);
        let pool_only = Upload { pool_session: v.pool_session.clone(), ..u.clone() };
        let c = fire(BILLING, &render(&pool_only.transfer(), &[], &[]), "nats-seq-9");
        prop_assert_eq!(&a.id, &c.id);
    }

    /// The scheduler's key is injective over (event id, function, digest, replay), whatever
    /// the event id holds: it decodes back to its parts.
    #[test]
    fn scheduler_keys_decode_to_their_parts(
        id in hostile(), f in name(), d in digest(), replay in prop::option::of(replay_id()),
    ) {
        let e = event_with_id(&id);
        let rec = FunctionRecord { manifest: FunctionManifest { module: d.clone(), ..function(&f, b"").manifest }, ..function(&f, b"") };
        let key = scheduler_dedupe_key(&e, &rec, replay.as_deref());
        prop_assert_eq!(decode_scheduler_key(&key), Some((id, f, d.as_str().to_owned(), replay)));
    }

    /// Adversarial pairs: one event id that embeds another triple's whole key (or its prefix
    /// up to a separator) never makes the two keys equal.
    #[test]
    fn scheduler_keys_of_embedded_ids_differ(
        id in hostile(), f in name(), g in name(), d in digest(), e2 in digest(),
        replay in prop::option::of(replay_id()), cut in any::<prop::sample::Index>(),
    ) {
        let rec = |n: &str, d: &Digest| FunctionRecord { manifest: FunctionManifest { module: d.clone(), ..function(n, b"").manifest }, ..function(n, b"") };
        let k1 = scheduler_dedupe_key(&event_with_id(&id), &rec(&f, &d), replay.as_deref());
        let seps: Vec<usize> = k1.match_indices(['#', '@']).map(|(i, _)| i).collect();
        let mut ids = vec![k1.clone()];
        if !seps.is_empty() {
            ids.push(k1[..seps[cut.index(seps.len())]].to_owned());
        }
        for id2 in ids {
            for r2 in [None, Some("r1"), replay.as_deref()] {
                let k2 = scheduler_dedupe_key(&event_with_id(&id2), &rec(&g, &e2), r2);
                let same = (id2 == id, &g, &e2, r2) == (true, &f, &d, replay.as_deref());
                prop_assert_eq!(k1 == k2, same, "{} / {}", k1, k2);
            }
        }
    }

    /// CloudEvents: the same (source, id) delivered again, from another sequence or in binary
    /// instead of structured mode, keeps its identity.
    #[test]
    fn a_redelivered_cloudevent_keeps_its_identity(source in hostile(), id in hostile(), seq in 2u64..1000) {
        let body = json!({"specversion": "1.0", "id": id, "source": source, "type": "org.example.closed",
                          "subject": "/data/raw/run42.h5", "data": {"kind": "write"}});
        let body = serde_json::to_vec(&body).expect("serializes");
        let a = fire(CE_SUBJECT, &body, "nats-seq-1");
        let b = fire(CE_SUBJECT, &body, &format!("nats-seq-{seq}"));
        prop_assert_eq!(&a.id, &b.id);
    }
}

proptest! {
    // The counterexamples are in the docs; do not write a regressions file next to the test.
    #![proptest_config(ProptestConfig { cases: 2048, failure_persistence: None, ..ProptestConfig::default() })]

    /// The firing table's event key is injective over (event id, replay), even for an event id
    /// that itself ends in `#replay:<id>` (a CloudEvent with id `42#replay:nightly` once took
    /// the key of the replay `nightly` of event `42`; see
    /// `a_hostile_event_id_does_not_take_a_replays_firing` for the whole path).
    #[test]
    fn firing_event_keys_are_injective(id in hostile(), r in replay_id(), id2 in hostile(), r2 in prop::option::of(replay_id())) {
        let k1 = event_key(&event_with_id(&id), Some(&r));
        for id2 in [id2, format!("{id}#replay:{r}")] {
            let k2 = event_key(&event_with_id(&id2), r2.as_deref());
            prop_assert_eq!(k1 == k2, id2 == id && r2.as_deref() == Some(&r), "{} / {}", k1, k2);
        }
    }

    /// Distinct CloudEvents (source, id) pairs get distinct identities, though a URI source
    /// always holds a `/` and an id may: (`https://lab.example/daq`, `7`) and
    /// (`https://lab.example`, `daq/7`) were both `cloudevents:https://lab.example/daq/7`.
    #[test]
    fn distinct_cloudevents_get_distinct_identities(s1 in hostile(), i1 in hostile(), s2 in hostile(), i2 in hostile()) {
        let ce = |s: &str, i: &str| {
            let v = json!({"specversion": "1.0", "id": i, "source": s, "type": "t", "subject": "/data/x"});
            fire(CE_SUBJECT, &serde_json::to_vec(&v).expect("serializes"), "nats-seq-1").id
        };
        let (a, b) = (ce(&s1, &i1), ce(&s2, &i2));
        prop_assert_eq!(a == b, (&s1, &i1) == (&s2, &i2), "{} / {}", a, b);
        // The constructed counterexample.
        prop_assert_ne!(ce("https://lab.example/daq", "7"), ce("https://lab.example", "daq/7"));
    }

    /// Distinct (pnfsid, door session) pairs of billing messages get distinct identities, even
    /// with a `/` in the pnfsid (pnfsid `A/B`, session `C` and pnfsid `A`, session `B/C` were
    /// one identity).
    #[test]
    fn distinct_pnfsids_get_distinct_identities(p1 in hostile(), s1 in session(), p2 in hostile(), s2 in session()) {
        let id = |p: &str, s: &str| {
            let u = Upload { pnfsid: p.to_owned(), door_session: s.to_owned(), ..sample_upload() };
            fire(BILLING, &render(&u.transfer(), &[], &[]), "nats-seq-1").id
        };
        prop_assert_eq!(id(&p1, &s1) == id(&p2, &s2), (&p1, &s1) == (&p2, &s2));
        prop_assert_ne!(id("A/B", "C"), id("A", "B/C"));
    }
}

/// Finding 1 end to end: a CloudEvent whose id ends in `#replay:nightly`, fired before the
/// replay `nightly` of the genuine event, no longer takes the replay's place in the firing table.
#[test]
fn a_hostile_event_id_does_not_take_a_replays_firing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let firings = Firings::open(&dir.path().join("firings.sqlite"), 3600, 16).expect("opens");
    let ce = |id: &str| {
        let v = json!({"specversion": "1.0", "id": id, "source": "s", "type": "t", "subject": "/data/x"});
        fire(CE_SUBJECT, &serde_json::to_vec(&v).expect("serializes"), "nats-seq-1")
    };
    let f = [function("f", b"module")];
    let hostile = firings.insert(&ce("42#replay:nightly"), &f, None, 1).expect("inserts");
    assert_eq!(hostile.queued, 1);
    let replay = firings.insert(&ce("42"), &f, Some("nightly"), 2).expect("inserts");
    assert_eq!((replay.queued, replay.deduplicated), (1, 0), "the replay of event 42 was dropped as a duplicate");
}
