//! The audit trail's tests: records, drafts, the log and queries; the index in [`index`], the
//! verifier's in [`tamper`].

mod index;
mod tamper;

use super::draft::*;
use super::record::*;
use super::sign::*;
use super::store::*;
use super::verify::*;
use super::*;
use crate::digest::Digest;
use crate::store::db_int as to_db;
use rusqlite::{Connection, OptionalExtension as _, params};
use serde_json::{Map, Value};
use sha2::{Digest as _, Sha256};
use std::path::{Path, PathBuf};

const TRIGGERS: &str = "DROP TRIGGER audit_records_append_only_u; DROP TRIGGER audit_records_append_only_d;
     DROP TRIGGER audit_record_paths_append_only_u; DROP TRIGGER audit_record_paths_append_only_d;
     DROP TRIGGER audit_checkpoints_append_only_u; DROP TRIGGER audit_checkpoints_append_only_d;";

/// A wire value (an output file, an outcome, usage) from its JSON. The trail knows no wire
/// type; its tests build realistic drafts with the kind constructors of [`crate::audit_kinds`],
/// which take them.
fn wire<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("a wire value")
}

fn draft(i: u64) -> AuditDraft {
    let owner = if (i / 3).is_multiple_of(2) { "alice" } else { "bob" };
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
        0 => AuditDraft::job_accepted(subject, &Default::default(), None),
        1 => AuditDraft::job_dispatched(subject, "ep-1", "s-1", 1),
        _ => AuditDraft::job_finished(
            subject,
            "ep-1",
            None,
            &[wire(
                serde_json::json!({"path": format!("/data/out/{}.sum", i / 3), "size": i, "sha256": "ab".repeat(32)}),
            )],
            &[],
            &wire(serde_json::json!({"kind": "exited", "exit_code": 0})),
            &Default::default(),
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
    conn.execute("UPDATE audit_records SET json = ?2 WHERE seq = ?1", params![seq, canonical_json(v)]).expect("update");
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
    assert!(matches!(MacaroonFacts::new("read", "id", vec![format!("Bearer {bearer}")]), Err(AuditError::Secret(_))));

    let (signer, _) = crate::token::SigningKey::generate("k").expect("keygen");
    let jwt = signer.sign(&serde_json::json!({"sub": "alice"})).expect("sign");
    assert!(looks_like_bearer(&jwt));

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("trail.sqlite");
    let log = AuditLog::open(&path, "gateway", None, CheckpointPolicy::default()).expect("open");
    let obtained = log
        .append(AuditDraft::macaroons_obtained(
            Subject { job: Some("j".into()), ..Subject::default() },
            &[facts],
            &["/data/raw/a.dat"],
        ))
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
fn queries_select_by_subject_and_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, _) = sample(dir.path(), 12, 100);
    let seqs = |f: AuditFilter| -> Vec<u64> { query(&path, &f).expect("query").iter().map(|r| r.seq).collect() };
    assert_eq!(seqs(AuditFilter { job: Some("job-1".into()), ..AuditFilter::default() }), [4, 5, 6]);
    assert_eq!(seqs(AuditFilter { token: Some("jti-2".into()), ..AuditFilter::default() }), [7, 8, 9]);
    assert_eq!(seqs(AuditFilter { owner: Some("alice".into()), ..AuditFilter::default() }), [1, 2, 3, 7, 8, 9]);
    assert_eq!(
        seqs(AuditFilter { owner: Some("alice".into()), job: Some("job-2".into()), ..AuditFilter::default() }),
        [7, 8, 9]
    );
    assert!(
        seqs(AuditFilter { owner: Some("alice".into()), job: Some("job-1".into()), ..AuditFilter::default() })
            .is_empty()
    );
    assert_eq!(seqs(AuditFilter { file: Some("/data/raw/3.dat".into()), ..AuditFilter::default() }), [10, 11, 12]);
    // An output names the job that wrote it, and with it the job's every record.
    assert_eq!(seqs(AuditFilter { file: Some("/data/out/3.sum".into()), ..AuditFilter::default() }), [10, 11, 12]);
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
    let f = AuditFilter { event_id: Some("ev".into()), since_ms: Some(5), limit: Some(2), ..AuditFilter::default() };
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

/// The event of a run on no file names no path: its records' subjects keep none.
#[test]
fn a_subjects_empty_path_is_dropped() {
    let subject = Subject { job: Some("j".into()), paths: vec![String::new(), "/out/a".into()], ..Subject::default() };
    let d = AuditDraft::job_accepted(subject, &crate::resources::Resources::new(1, 1, 1), None);
    assert_eq!(d.subject.paths, ["/out/a"]);
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
        let usage = wire(serde_json::json!({
            "wall_ms": 12,
            "cpu_ms": 3,
            "peak_memory_bytes": 1 << 20,
            "bytes_in": 1024,
            "bytes_out": 32,
            "instructions": 123456,
        }));
        match i % 3 {
            0 => AuditDraft::job_accepted(subject, &Default::default(), None).with_detail(
                "input",
                serde_json::json!({"path": "/data/raw/x.dat", "url": "http://127.0.0.1:9000/data/raw/x.dat"}),
            ),
            1 => AuditDraft::job_dispatched(subject, ep, "sess-0190a1b2-c3d4-7e5f-8a9b", 1),
            _ => AuditDraft::job_finished(
                subject,
                ep,
                Some(("/data/raw/x.dat", 1024, None)),
                &[wire(
                    serde_json::json!({"path": format!("/data/out/{i}.sum"), "size": 32, "sha256": "ab".repeat(32)}),
                )],
                &[],
                &wire(serde_json::json!({"kind": "exited", "exit_code": 0})),
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
        for s in [&d.subject.job, &d.subject.token_jti, &d.subject.digest, &d.subject.event_id].into_iter().flatten() {
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

/// A trail of the first schema (with its index by time) is brought to the current one at open:
/// the index is gone, the records and their chain are as they were, and time ranges still
/// select by time.
#[test]
fn a_first_schema_trail_loses_its_time_index_and_keeps_its_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("old.sqlite");
    let conn = Connection::open(&path).expect("open");
    conn.execute_batch(
        "CREATE TABLE audit_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
         INSERT INTO audit_meta VALUES ('schema_version', '1'), ('writer', 'gateway');",
    )
    .expect("meta");
    conn.execute_batch(MIGRATIONS[0]).expect("first schema");
    for i in 0..6 {
        append_in(&conn, draft(i)).expect("append");
    }
    let index = |c: &Connection| -> bool {
        c.query_row("SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'audit_records_by_time')", [], |r| {
            r.get(0)
        })
        .expect("master")
    };
    assert!(index(&conn));
    drop(conn);
    let log = AuditLog::open(&path, "gateway", None, CheckpointPolicy::default()).expect("migrate");
    drop(log);
    let conn = Connection::open(&path).expect("reopen");
    assert!(!index(&conn), "the index by time is dropped");
    let version: String =
        conn.query_row("SELECT value FROM audit_meta WHERE key = 'schema_version'", [], |r| r.get(0)).expect("v");
    assert_eq!(version, SCHEMA_VERSION.to_string());
    let all = query(&path, &AuditFilter::default()).expect("query");
    assert_eq!(all.len(), 6);
    let t = all[3].time_ms;
    let since = query(&path, &AuditFilter { since_ms: Some(t), ..AuditFilter::default() }).expect("since");
    assert!(since.iter().all(|r| r.time_ms >= t) && since.iter().any(|r| r.seq == 4), "{since:?}");
    assert!(verify(&path, &AuditKeys::new()).expect("verify").ok());
}
