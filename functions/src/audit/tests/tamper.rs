//! The verifier's tests: every kind of tampering is named, at the right record; damaged
//! files are errors, never panics.

use super::*;

#[test]
fn a_clean_log_verifies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, keys) = sample(dir.path(), 25, 10);
    let report = verify(&path, &keys).expect("verify");
    assert_eq!(
        report,
        VerifyReport { records: 25, checkpoints: 2, last_seq: 25, last_checkpoint_seq: Some(20), first_problem: None }
    );
    let all = query(&path, &AuditFilter::default()).expect("query");
    assert_eq!(all.iter().map(|r| r.seq).collect::<Vec<_>>(), (1..=25).collect::<Vec<_>>());
    assert_eq!(all[0].prev_hash, GENESIS_HASH);
    for pair in all.windows(2) {
        assert_eq!(pair[1].prev_hash, pair[0].hash);
        assert!(pair[1].time_ms >= pair[0].time_ms);
    }
    for r in &all {
        assert_eq!(r.compute_hash().expect("hash"), r.hash);
    }
    // The JWKS route gives the same keys.
    let (signer, _) = AuditSigner::generate("k").expect("keygen");
    assert_eq!(keys_from_jwks(&signer.jwks()).expect("jwks"), signer.keys());
}

#[test]
fn an_altered_record_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, keys) = sample(dir.path(), 25, 10);
    let copy = tampered(&path, "altered", |c| {
        let mut v = stored(c, 7);
        v["subject"]["owner"] = "mallory".into();
        store(c, 7, &v);
    });
    assert_problem(
        &first_problem(&copy, &keys),
        7,
        ProblemKind::Altered,
        "record 7 was altered: its hash does not match its contents",
    );

    // With its hash recomputed, the next record's link names it.
    let copy = tampered(&path, "altered-rehashed", |c| {
        let mut v = stored(c, 7);
        v["detail"]["attempt"] = 2.into();
        rehash(&mut v);
        store(c, 7, &v);
    });
    assert_problem(&first_problem(&copy, &keys), 7, ProblemKind::Altered, "record 8 follows a different record 7");

    // A broken link right after a signed checkpoint names the later record.
    let copy = tampered(&path, "relinked", |c| {
        let mut v = stored(c, 21);
        v["prev_hash"] = "ab".repeat(32).into();
        rehash(&mut v);
        store(c, 21, &v);
    });
    assert_problem(
        &first_problem(&copy, &keys),
        21,
        ProblemKind::Altered,
        "record 21 was altered: it does not follow record 20, which a signed checkpoint vouches for",
    );

    // A whole rewritten tail (every hash recomputed) is caught by the next signed checkpoint.
    let copy = tampered(&path, "rewritten", |c| {
        let mut prev = stored(c, 12)["hash"].clone();
        for seq in 13..=25 {
            let mut v = stored(c, seq);
            if seq == 13 {
                v["subject"]["owner"] = "mallory".into();
            }
            v["prev_hash"] = prev;
            rehash(&mut v);
            prev = v["hash"].clone();
            store(c, seq, &v);
        }
    });
    assert_problem(
        &first_problem(&copy, &keys),
        20,
        ProblemKind::Altered,
        "does not match the signed checkpoint at record 20 (records 11 to 20",
    );

    // Unreadable text is an alteration too.
    let copy = tampered(&path, "garbled", |c| {
        c.execute("UPDATE audit_records SET json = substr(json, 1, 40) WHERE seq = 3", []).expect("update");
    });
    assert_problem(&first_problem(&copy, &keys), 3, ProblemKind::Altered, "record 3 was altered: it is not a valid");
}

#[test]
fn a_removed_record_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, keys) = sample(dir.path(), 25, 10);
    let copy = tampered(&path, "removed", |c| {
        c.execute("DELETE FROM audit_records WHERE seq = 12", []).expect("delete");
    });
    assert_problem(&first_problem(&copy, &keys), 12, ProblemKind::Removed, "record 12 was removed");

    let copy = tampered(&path, "removed-three", |c| {
        c.execute("DELETE FROM audit_records WHERE seq BETWEEN 12 AND 14", []).expect("delete");
    });
    assert_problem(&first_problem(&copy, &keys), 12, ProblemKind::Removed, "records 12 to 14 were removed");

    // Renumbering the rows to close the gap changes nothing.
    let copy = tampered(&path, "removed-renumbered", |c| {
        c.execute("DELETE FROM audit_records WHERE seq = 1", []).expect("delete");
        c.execute("UPDATE audit_records SET seq = -(seq - 1)", []).expect("shift");
        c.execute("UPDATE audit_records SET seq = -seq", []).expect("shift");
    });
    assert_problem(&first_problem(&copy, &keys), 1, ProblemKind::Removed, "record 1 was removed");
}

#[test]
fn reordered_records_are_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, keys) = sample(dir.path(), 25, 10);
    // Swap the seqs of two adjacent rows.
    let copy = tampered(&path, "swapped", |c| {
        c.execute_batch(
            "UPDATE audit_records SET seq = -5 WHERE seq = 5; UPDATE audit_records SET seq = 5 WHERE seq = 6;
             UPDATE audit_records SET seq = 6 WHERE seq = -5;",
        )
        .expect("swap");
    });
    assert_problem(&first_problem(&copy, &keys), 5, ProblemKind::Reordered, "records were reordered at seq 5");

    // Swap the contents of two distant rows.
    let copy = tampered(&path, "swapped-far", |c| {
        let (a, b) = (stored(c, 15), stored(c, 18));
        store(c, 15, &b);
        store(c, 18, &a);
    });
    assert_problem(&first_problem(&copy, &keys), 15, ProblemKind::Reordered, "the record stored there is record 18");
}

#[test]
fn a_truncated_tail_after_a_checkpoint_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, keys) = sample(dir.path(), 25, 10);
    let copy = tampered(&path, "truncated", |c| {
        c.execute("DELETE FROM audit_records WHERE seq >= 19", []).expect("delete");
    });
    assert_problem(
        &first_problem(&copy, &keys),
        19,
        ProblemKind::Truncated,
        "records from 19 on were removed: the signed checkpoint at record 20",
    );

    // The limit, stated: records after the last checkpoint are protected by the chain only.
    let copy = tampered(&path, "truncated-unsigned-tail", |c| {
        c.execute("DELETE FROM audit_records WHERE seq > 20", []).expect("delete");
    });
    let report = verify(&copy, &keys).expect("verify");
    assert!(report.ok(), "{report:?}");
    assert_eq!((report.last_seq, report.last_checkpoint_seq), (20, Some(20)));
}

#[test]
fn forged_and_changed_checkpoints_are_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, keys) = sample(dir.path(), 25, 10);
    let cp_at = |c: &Connection, seq: i64| -> Checkpoint {
        let text: String =
            c.query_row("SELECT json FROM audit_checkpoints WHERE seq = ?1", [seq], |r| r.get(0)).expect("cp");
        serde_json::from_str(&text).expect("json")
    };
    let put = |c: &Connection, cp: &Checkpoint| {
        let text = canonical_json(&serde_json::to_value(cp).expect("json"));
        c.execute("UPDATE audit_checkpoints SET json = ?2 WHERE seq = ?1", params![to_db(cp.seq), text]).expect("put");
    };

    // Signed by another key that claims the same kid.
    let copy = tampered(&path, "forged", |c| {
        let cp = cp_at(c, 10);
        let (forger, _) = AuditSigner::generate("audit-1").expect("keygen");
        put(c, &forger.sign(&cp.writer, cp.seq, &cp.hash, cp.time_ms).expect("sign"));
    });
    assert_problem(
        &first_problem(&copy, &keys),
        10,
        ProblemKind::BadCheckpoint,
        "its signature does not verify under key \"audit-1\"",
    );

    let copy = tampered(&path, "unknown-kid", |c| {
        let mut cp = cp_at(c, 10);
        cp.kid = "other".into();
        put(c, &cp);
    });
    assert_problem(&first_problem(&copy, &keys), 10, ProblemKind::BadCheckpoint, "unknown key \"other\"");

    // The hash changed to another record's.
    let copy = tampered(&path, "cp-hash", |c| {
        let mut cp = cp_at(c, 20);
        cp.hash = stored(c, 19)["hash"].as_str().expect("hash").to_owned();
        put(c, &cp);
    });
    assert_problem(
        &first_problem(&copy, &keys),
        20,
        ProblemKind::BadCheckpoint,
        "the checkpoint at record 20 is invalid: its signature does not verify",
    );

    // The first problem in chain order wins: a bad checkpoint at 10 before an altered record 15.
    let copy = tampered(&path, "both", |c| {
        let mut cp = cp_at(c, 10);
        cp.signature = "00".repeat(64);
        put(c, &cp);
        c.execute("UPDATE audit_records SET json = 'x' WHERE seq = 15", []).expect("update");
    });
    assert_problem(&first_problem(&copy, &keys), 10, ProblemKind::BadCheckpoint, "record 10 is invalid");
}

#[test]
fn an_inserted_record_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, keys) = sample(dir.path(), 25, 10);
    // A well-formed record, hashed and linked to record 7, put in as 8; the rest moved up.
    let copy = tampered(&path, "inserted", |c| {
        c.execute("UPDATE audit_records SET seq = -(seq + 1) WHERE seq >= 8", []).expect("shift");
        c.execute("UPDATE audit_records SET seq = -seq WHERE seq < 0", []).expect("shift");
        let mut v = stored(c, 7);
        v["seq"] = 8.into();
        v["prev_hash"] = v["hash"].clone();
        v["subject"]["owner"] = "mallory".into();
        rehash(&mut v);
        c.execute(
            "INSERT INTO audit_records (seq, time_ms, kind, hash, json) VALUES (8, 0, 'job.accepted', '', ?1)",
            [canonical_json(&v)],
        )
        .expect("insert");
    });
    assert_problem(&first_problem(&copy, &keys), 8, ProblemKind::Inserted, "record 8 was inserted");

    // A copy of a record right after it.
    let copy = tampered(&path, "duplicated", |c| {
        c.execute("UPDATE audit_records SET seq = -(seq + 1) WHERE seq >= 4", []).expect("shift");
        c.execute("UPDATE audit_records SET seq = -seq WHERE seq < 0", []).expect("shift");
        let v = stored(c, 3);
        c.execute(
            "INSERT INTO audit_records (seq, time_ms, kind, hash, json) VALUES (4, 0, 'job.accepted', '', ?1)",
            [canonical_json(&v)],
        )
        .expect("insert");
    });
    assert_problem(&first_problem(&copy, &keys), 4, ProblemKind::Inserted, "it is a copy of record 3");

    // A made-up record at the end that does not follow the head.
    let copy = tampered(&path, "appended", |c| {
        let mut v = stored(c, 25);
        v["seq"] = 26.into();
        v["prev_hash"] = "ab".repeat(32).into();
        rehash(&mut v);
        c.execute(
            "INSERT INTO audit_records (seq, time_ms, kind, hash, json) VALUES (26, 0, 'job.accepted', '', ?1)",
            [canonical_json(&v)],
        )
        .expect("insert");
    });
    assert_problem(
        &first_problem(&copy, &keys),
        25,
        ProblemKind::Altered,
        "record 25 was altered (its hash recomputed), or record 26 was",
    );
}

#[test]
fn garbage_rows_never_panic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, keys) = sample(dir.path(), 12, 4);
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    fn random_json(next: &mut dyn FnMut() -> u64, depth: u32) -> Value {
        match next() % if depth > 3 { 6 } else { 8 } {
            0 => Value::Null,
            1 => Value::Bool(next().is_multiple_of(2)),
            2 => Value::from(next() as i64),
            3 => serde_json::Number::from_f64(f64::from_bits(next())).map_or(Value::Null, Value::Number),
            4 => Value::String((0..next() % 70).map(|_| char::from((next() % 95) as u8 + 32)).collect()),
            5 => Value::from(next()),
            6 => Value::Array((0..next() % 4).map(|_| random_json(next, depth + 1)).collect()),
            _ => {
                let fields = ["seq", "hash", "prev_hash", "format", "writer", "kind", "subject", "detail", "x"];
                let mut m = Map::new();
                for _ in 0..next() % 10 {
                    m.insert(fields[(next() % 9) as usize].into(), random_json(next, depth + 1));
                }
                Value::Object(m)
            }
        }
    }
    let fields = ["seq", "hash", "prev_hash", "format", "writer", "kind", "subject", "detail", "time_ms", "actor"];
    let mut found = 0;
    for round in 0..150 {
        let copy = tampered(&path, &format!("fuzz-{}", round % 4), |c| {
            for _ in 0..1 + next() % 3 {
                let seq = (next() % 14) as i64;
                let table = if next() % 4 == 0 { "audit_checkpoints" } else { "audit_records" };
                let text: Option<rusqlite::types::Value> = c
                    .query_row(&format!("SELECT json FROM {table} WHERE seq = ?1"), [seq], |r| r.get(0))
                    .optional()
                    .expect("read");
                let text = match text {
                    Some(rusqlite::types::Value::Text(t)) => t,
                    _ => "{}".into(),
                };
                let new: rusqlite::types::Value = match next() % 7 {
                    0 => {
                        let mut bytes = text.into_bytes();
                        if !bytes.is_empty() {
                            let i = (next() as usize) % bytes.len();
                            bytes[i] = (next() % 256) as u8;
                        }
                        String::from_utf8_lossy(&bytes).into_owned().into()
                    }
                    1 => text[..(next() as usize) % (text.len() + 1)].to_owned().into(),
                    2 => canonical_json(&random_json(&mut next, 0)).into(),
                    3 => {
                        let mut v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                        if let Some(o) = v.as_object_mut() {
                            o.insert(fields[(next() % 10) as usize].into(), random_json(&mut next, 2));
                        }
                        canonical_json(&v).into()
                    }
                    4 => rusqlite::types::Value::Blob(vec![0xff, 0, 1]),
                    5 => rusqlite::types::Value::Integer(next() as i64),
                    _ => "[".repeat(10_000).into(),
                };
                let moved = [-1, 0, i64::MAX, i64::MIN, 3][(next() % 5) as usize];
                if next() % 5 == 0 {
                    let _ = c.execute(&format!("UPDATE {table} SET seq = ?2 WHERE seq = ?1"), params![seq, moved]);
                } else if next() % 3 == 0 {
                    let sql = if table == "audit_records" {
                        "INSERT OR REPLACE INTO audit_records (seq, time_ms, kind, hash, json) VALUES (?1, 0, '', '', ?2)"
                    } else {
                        "INSERT OR REPLACE INTO audit_checkpoints (seq, time_ms, json) VALUES (?1, 0, ?2)"
                    };
                    let _ = c.execute(sql, params![seq, new]);
                } else {
                    let _ = c.execute(&format!("UPDATE {table} SET json = ?2 WHERE seq = ?1"), params![seq, new]);
                }
            }
        });
        let report = verify(&copy, &keys).expect("a damaged trail is a report, not an error");
        if let Some(p) = &report.first_problem {
            assert!(!p.message.is_empty());
            found += 1;
        }
        std::fs::remove_file(&copy).expect("remove");
    }
    assert!(found > 75, "only {found} of 150 damaged copies had a problem");
}

#[test]
fn damaged_files_are_errors_not_panics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let keys = AuditKeys::new();
    assert!(verify(&dir.path().join("missing.sqlite"), &keys).is_err());
    let junk = dir.path().join("junk.sqlite");
    std::fs::write(&junk, b"SQLite format 3\0 but not really, and then some garbage ......").expect("write");
    assert!(verify(&junk, &keys).is_err());
    let empty = dir.path().join("empty.sqlite");
    Connection::open(&empty).expect("create").execute_batch("CREATE TABLE t (x)").expect("table");
    assert!(matches!(verify(&empty, &keys), Err(AuditError::NotALog(_))));
    let (path, _) = sample(dir.path(), 3, 10);
    let dropped = tampered(&path, "dropped", |c| c.execute_batch("DROP TABLE audit_records").expect("drop"));
    assert!(matches!(verify(&dropped, &keys), Err(AuditError::Db(_))));
}
