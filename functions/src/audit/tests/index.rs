//! The trail's index: a job's later records, and a token's later records of no job, index only
//! what the first indexed, and every query still selects them.

use super::*;

/// Record `seq`'s indexed columns: job, token, owner, function, event.
fn indexed_columns(conn: &Connection, seq: i64) -> [Option<String>; 5] {
    conn.query_row("SELECT job, token_jti, owner, function, event_id FROM audit_records WHERE seq = ?1", [seq], |r| {
        Ok([r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?])
    })
    .expect("row")
}

/// The paths record `seq` is indexed under, sorted.
fn indexed_paths(conn: &Connection, seq: i64) -> Vec<String> {
    let mut stmt = conn.prepare("SELECT path FROM audit_record_paths WHERE seq = ?1 ORDER BY path").expect("prepare");
    stmt.query_map([seq], |r| r.get(0)).expect("query").collect::<Result<_, _>>().expect("paths")
}

/// A job's later records index only what its first does not: their copied columns are empty
/// where the first names the same, no path row repeats the first's, and every query still
/// selects them; a record that names something else is indexed as usual.
#[test]
fn a_jobs_later_records_index_only_what_is_new_and_are_still_found() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, _) = sample(dir.path(), 6, 100);
    let log = AuditLog::open(&path, "gateway", None, CheckpointPolicy::default()).expect("reopen");
    // A seventh record for job-0 that names another token (a renewal's, say) and a new path.
    let mut other = draft(1);
    other.subject.token_jti = Some("jti-renewed".into());
    other.subject.paths.push("/data/out/0.extra".into());
    log.append(other).expect("append");
    // An eighth that names another owner (none of htfaas's writers does): indexed, and never
    // among alice's records, nor alice's among its owner's.
    let mut foreign = draft(2);
    foreign.subject.owner = Some("mallory".into());
    log.append(foreign).expect("append");
    drop(log);
    let conn = Connection::open(&path).expect("open");
    let columns = |seq| indexed_columns(&conn, seq);
    let paths = |seq| indexed_paths(&conn, seq);
    let some = |s: &str| Some(s.to_owned());
    assert_eq!(columns(1), [some("job-0"), some("jti-0"), some("alice"), some("checksum"), some("ev-0")]);
    assert_eq!(columns(2), [some("job-0"), None, None, None, None], "all said by the job's first record");
    assert_eq!(paths(1), ["/data/raw/0.dat"]);
    assert!(paths(2).is_empty());
    assert_eq!(paths(3), ["/data/out/0.sum"], "the output is new; the input is the first record's");
    assert_eq!(columns(7), [some("job-0"), some("jti-renewed"), None, None, None], "a new token is indexed");
    assert_eq!(paths(7), ["/data/out/0.extra"]);
    // The JSON the verifier reads is whole.
    assert_eq!(stored(&conn, 2)["subject"]["owner"], "alice");
    let seqs = |f: AuditFilter| -> Vec<u64> { query(&path, &f).expect("query").iter().map(|r| r.seq).collect() };
    for f in [
        AuditFilter { owner: Some("alice".into()), ..AuditFilter::default() },
        AuditFilter { token: Some("jti-0".into()), ..AuditFilter::default() },
        AuditFilter { token: Some("jti-renewed".into()), ..AuditFilter::default() },
        AuditFilter { event_id: Some("ev-0".into()), ..AuditFilter::default() },
        AuditFilter { function: Some("checksum".into()), job: Some("job-0".into()), ..AuditFilter::default() },
        AuditFilter { file: Some("/data/raw/0.dat".into()), ..AuditFilter::default() },
        AuditFilter { file: Some("/data/out/0.extra".into()), ..AuditFilter::default() },
    ] {
        let want: &[u64] = if f.owner.is_some() { &[1, 2, 3, 7] } else { &[1, 2, 3, 7, 8] };
        assert_eq!(seqs(f.clone()), want, "{f:?}");
    }
    assert_eq!(seqs(AuditFilter { owner: Some("bob".into()), ..AuditFilter::default() }), [4, 5, 6]);
    assert_eq!(seqs(AuditFilter { owner: Some("mallory".into()), ..AuditFilter::default() }), [8]);
    assert_eq!(columns(8)[2], some("mallory"));
}

/// Records of no job are grouped by their token as a job's are by the job (the gateway's
/// `token.minted` and `macaroons.obtained` of a job not yet named): the second indexes only
/// what the first does not, and every query still selects both; a record of no job and no
/// token, or of another token, is indexed whole and never selected through the group.
#[test]
fn a_tokens_later_records_of_no_job_index_only_what_is_new_and_are_still_found() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("trail.sqlite");
    let log = AuditLog::open(&path, "gateway", None, CheckpointPolicy::default()).expect("open");
    let subject = |token: Option<&str>, event: &str, paths: &[&str]| Subject {
        token_jti: token.map(str::to_owned),
        owner: Some("alice".into()),
        function: Some("checksum".into()),
        digest: Some(Digest::of(b"m").as_str().to_owned()),
        event_id: Some(event.into()),
        paths: paths.iter().map(|p| (*p).to_owned()).collect(),
        ..Subject::default()
    };
    let record = |s: Subject| AuditDraft::admin_action("gw", "test", s, serde_json::json!({}));
    log.append(record(subject(None, "ev-0", &["/data/raw/0.dat"]))).expect("matched"); // 1
    log.append(record(subject(Some("jti-0"), "ev-0", &["/data/raw/0.dat"]))).expect("minted"); // 2
    log.append(record(subject(Some("jti-0"), "ev-0", &["/data/raw/0.dat", "/data/out/"]))).expect("obtained"); // 3
    log.append(record(subject(Some("jti-1"), "ev-1", &["/data/raw/1.dat"]))).expect("other token"); // 4
    drop(log);
    let conn = Connection::open(&path).expect("open");
    let columns = |seq| indexed_columns(&conn, seq);
    let paths = |seq| indexed_paths(&conn, seq);
    let some = |s: &str| Some(s.to_owned());
    assert_eq!(columns(1), [None, None, some("alice"), some("checksum"), some("ev-0")], "no token: whole");
    assert_eq!(columns(2), [None, some("jti-0"), some("alice"), some("checksum"), some("ev-0")]);
    assert_eq!(columns(3), [None, some("jti-0"), None, None, None], "all but its token said by the first");
    assert_eq!(paths(3), ["/data/out/"], "the input is the first record's");
    assert_eq!(columns(4)[2], some("alice"), "another token's first record is indexed whole");
    assert_eq!(stored(&conn, 3)["subject"]["event_id"], "ev-0", "the JSON the verifier reads is whole");
    let seqs = |f: AuditFilter| -> Vec<u64> { query(&path, &f).expect("query").iter().map(|r| r.seq).collect() };
    for (f, want) in [
        (AuditFilter { owner: Some("alice".into()), ..AuditFilter::default() }, &[1, 2, 3, 4][..]),
        (AuditFilter { event_id: Some("ev-0".into()), ..AuditFilter::default() }, &[1, 2, 3]),
        (AuditFilter { function: Some("checksum".into()), ..AuditFilter::default() }, &[1, 2, 3, 4]),
        (AuditFilter { token: Some("jti-0".into()), ..AuditFilter::default() }, &[2, 3]),
        (AuditFilter { file: Some("/data/raw/0.dat".into()), ..AuditFilter::default() }, &[1, 2, 3]),
        // The token's other record too, as a job's records are selected by any one's path.
        (AuditFilter { file: Some("/data/out/".into()), ..AuditFilter::default() }, &[2, 3]),
        (AuditFilter { event_id: Some("ev-1".into()), ..AuditFilter::default() }, &[4]),
    ] {
        assert_eq!(seqs(f.clone()), want, "{f:?}");
    }
    assert!(verify(&path, &AuditKeys::new()).expect("verify").ok());
}
