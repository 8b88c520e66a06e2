//! Tests of the job table's shape (schema 10): the counts by state the triggers keep, the
//! migration that takes a version-9 file there, and the query plans of the reads that must
//! not grow with the number of jobs ever run (and the pages of ended jobs they serve).

use super::jobs::{FIRED_PATH, OVERDUE, ended_sql, of_trace_sql, unfinished_sql, waiting_of_owner_sql};
use super::revocations::live_credentials_sql;
use super::runs::RUNNING_IN_SESSION;
use super::schema::{LIVE, MIGRATIONS, trace_id_of};
use super::*;
use crate::testing::{LOSS, new_job, ok, request};
use htfaas_functions::proto::{JobReport, Outcome, RevocationTarget, Usage};
use rusqlite::{Connection, params};
use std::collections::BTreeMap;

/// The counts `job_counts` holds, against the jobs counted one by one (states at 0 left out).
async fn assert_counts_match_jobs(q: &Queue) -> BTreeMap<String, i64> {
    let (kept, counted) = q
        .call(|c| {
            let read = |sql: &str| -> rusqlite::Result<BTreeMap<String, i64>> {
                c.prepare(sql)?.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect()
            };
            Ok((
                read("SELECT state, n FROM job_counts WHERE n != 0")?,
                read("SELECT state, COUNT(*) FROM jobs GROUP BY state")?,
            ))
        })
        .await
        .expect("counts");
    assert_eq!(kept, counted);
    kept
}

/// A store file at `path` brought to the older `version` by the migrations alone, as a build
/// of that version left it.
fn store_at_version(path: &std::path::Path, version: usize) -> Connection {
    let conn = Connection::open(path).expect("create");
    for step in &MIGRATIONS[..version] {
        conn.execute_batch(step).expect("step");
    }
    conn.pragma_update(None, "user_version", version as i64).expect("version");
    conn
}

fn report(id: &str, outcome: Outcome) -> JobReport {
    JobReport {
        input_sha256: None,
        job_id: id.into(),
        outcome,
        usage: Usage { wall_ms: 10, ..Usage::default() },
        outputs: vec![],
        log: String::new(),
        refs: Vec::new(),
        checkpoint: None,
    }
}

#[tokio::test]
async fn the_counts_by_state_follow_every_change_of_a_jobs_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("q.db");
    let q = Queue::open(&path).expect("open");
    let mut ids = Vec::new();
    for i in 0..6 {
        ids.push(q.submit(new_job(&format!("k{i}"), &format!("t{i}"), 1)).await.expect("submit").job_id);
    }
    // A dedupe hit writes no job and counts none.
    q.submit(new_job("k0", "t9", 1)).await.expect("dedupe");
    assert_eq!(assert_counts_match_jobs(&q).await, BTreeMap::from([("idle".into(), 6)]));

    q.mark_running(ids[..4].to_vec(), "ep1".into(), "s1".into(), ok).await.expect("mark");
    q.finish("s1".into(), report(&ids[0], Outcome::Exited { exit_code: 0 }), LOSS).await.expect("finish");
    q.finish("s1".into(), report(&ids[1], Outcome::Exited { exit_code: 3 }), LOSS).await.expect("fail");
    q.act(ids[4].clone(), Action::Hold, "wait".into()).await.expect("hold");
    q.act(ids[5].clone(), Action::Remove, "no".into()).await.expect("remove");
    let counts = assert_counts_match_jobs(&q).await;
    let expected =
        [("completed", 1), ("failed", 1), ("held", 1), ("removed", 1), ("running", 2)].map(|(s, n)| (s.into(), n));
    assert_eq!(counts, BTreeMap::from(expected));

    // A lost session sends its running jobs back; a release and a revocation move others.
    q.lose_session("s1".into(), LOSS, "gone".into()).await.expect("lose");
    q.act(ids[4].clone(), Action::Release, "go".into()).await.expect("release");
    q.record_revocation(RevocationTarget::Jti("t2".into()), "leak".into(), "admin".into(), vec![])
        .await
        .expect("revoke");
    let counts = assert_counts_match_jobs(&q).await;
    let expected = [("completed", 1), ("failed", 1), ("idle", 2), ("removed", 2)].map(|(s, n)| (s.into(), n));
    assert_eq!(counts, BTreeMap::from(expected));
    drop(q);
    // Reopening (which requeues what was running) keeps them right.
    let q = Queue::open(&path).expect("reopen");
    assert_eq!(assert_counts_match_jobs(&q).await.values().sum::<i64>(), 6);
}

#[tokio::test]
async fn a_version_9_store_gains_its_plain_columns_and_counts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v9.db");
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    {
        let conn = store_at_version(&path, 9);
        let mut traced = request("k1");
        traced.event.trace = Some(traceparent.into());
        let rows = [
            ("a", "k1", "completed", serde_json::to_string(&traced).expect("json")),
            ("b", "k2", "idle", serde_json::to_string(&request("k2")).expect("json")),
            ("c", "k3", "idle", "{not json".to_owned()),
        ];
        for (id, key, state, request) in rows {
            conn.execute(
                "INSERT INTO jobs (id, owner, dedupe_key, state, token_jti, request, cpus, memory_mb, runtime_s, \
                 submitted_at_ms, finished_at_ms) VALUES (?1, 'alice', ?2, ?3, ?1, ?4, 1, 64, 60, 5, 6)",
                params![id, key, state, request],
            )
            .expect("v9 row");
        }
    }
    let q = Queue::open(&path).expect("open and migrate");
    type Columns = (String, Option<String>, Option<String>, Option<String>, Option<String>, Option<String>, String);
    let columns: Vec<Columns> = q
        .call(|c| {
            let mut stmt = c.prepare(
                "SELECT id, function_name, function_digest, event_id, input_path, trace_id, request \
                 FROM jobs JOIN job_requests USING (seq) ORDER BY id",
            )?;
            let rows = stmt
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?)))?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
        .await
        .expect("columns");
    let some = |s: &str| Some(s.to_owned());
    let digest = request("k1").function.digest.to_string();
    let named = |key: &str, trace: Option<String>| {
        (some("checksum"), Some(digest.clone()), some(key), some("/data/raw/a"), trace)
    };
    let got: Vec<_> =
        columns.iter().map(|c| (c.1.clone(), c.2.clone(), c.3.clone(), c.4.clone(), c.5.clone())).collect();
    assert_eq!(
        got,
        [named("k1", some("0af7651916cd43dd8448eb211c80319c")), named("k2", None), (None, None, None, None, None)]
    );
    // Each request moved whole to `job_requests`, the unparsable one too.
    assert_eq!(columns[2].6, "{not json");
    assert!(columns[0].6.contains(traceparent) && columns[1].6.contains("\"k2\""), "{columns:?}");
    // The job's records name what the columns hold (the unparsable one only the job).
    let subjects = q
        .call(|c| Ok((super::trail::job_subject(c, "a")?, super::trail::job_subject(c, "c")?)))
        .await
        .expect("subjects");
    let (a, c) = (subjects.0.expect("a"), subjects.1.expect("c"));
    assert_eq!(
        (a.function.as_deref(), a.event_id.as_deref(), a.paths.as_slice()),
        (Some("checksum"), Some("k1"), &["/data/raw/a".to_owned()][..])
    );
    assert_eq!(a.digest, Some(digest.clone()));
    assert_eq!((c.function, c.digest, c.event_id, c.paths), (None, None, None, vec![]));
    let counts = assert_counts_match_jobs(&q).await;
    assert_eq!(counts, BTreeMap::from([("completed".into(), 1), ("idle".into(), 2)]));
    let traced = q.list_by_trace("0af7651916cd43dd8448eb211c80319c".into(), 10).await.expect("trace");
    assert_eq!(traced.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), ["a"]);
    let fired = q.fired_paths("alice".into(), "checksum".into(), vec!["/data/raw/a".into(), "/x".into()]).await;
    assert_eq!(fired.expect("fired"), ["/data/raw/a"]);
    // A job submitted now writes the same columns the migration derived.
    let mut j = new_job("k4", "t4", 1);
    j.request.event.trace = Some(traceparent.into());
    let id = q.submit(j).await.expect("submit").job_id;
    let traced = q.list_by_trace(trace_id_of(traceparent), 10).await.expect("trace");
    assert_eq!(traced.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), ["a", id.as_str()]);
}

#[tokio::test]
async fn a_version_11_store_keeps_its_attempts_and_token_uses_keyed_without_rowids() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v11.db");
    {
        let conn = store_at_version(&path, 11);
        conn.execute(
            "INSERT INTO jobs (id, owner, dedupe_key, state, token_jti, cpus, memory_mb, runtime_s, \
             submitted_at_ms, finished_at_ms, attempts) VALUES ('a', 'alice', 'k1', 'completed', 't1', 1, 64, 60, 5, 9, 2)",
            [],
        )
        .expect("v11 job");
        conn.execute_batch(
            "INSERT INTO job_requests (seq, request) VALUES (1, '{}');
             INSERT INTO attempts (job_id, n, ep, ep_session, started_at_ms, ended_at_ms, outcome, reason)
                 VALUES ('a', 1, 'ep1', 's1', 6, 7, 'lost', 'cut'), ('a', 2, 'ep2', 's2', 8, 9, 'completed', '');
             INSERT INTO token_uses (jti, uses, exp) VALUES ('t1', 3, 100);",
        )
        .expect("v11 rows");
    }
    let q = Queue::open(&path).expect("open and migrate");
    let without_rowid = q
        .call(|c| {
            let keyed = |table: &str| -> rusqlite::Result<bool> {
                let sql: String =
                    c.query_row("SELECT sql FROM sqlite_master WHERE name = ?1", params![table], |r| r.get(0))?;
                Ok(sql.ends_with("WITHOUT ROWID"))
            };
            Ok((keyed("attempts")?, keyed("token_uses")?))
        })
        .await
        .expect("schema");
    assert_eq!(without_rowid, (true, true));
    let history = q.history("a".into()).await.expect("history");
    let kept: Vec<_> = history.iter().map(|a| (a.n, a.ep.as_str(), a.outcome.as_str())).collect();
    assert_eq!(kept, [(1, "ep1", "lost"), (2, "ep2", "completed")]);
    assert_eq!(q.uses("t1".into()).await.expect("uses"), 3);
    // Both are written as before: a use counted, an attempt opened and ended.
    let id = q.submit(new_job("k2", "t1", 5)).await.expect("submit").job_id;
    assert_eq!(q.uses("t1".into()).await.expect("uses"), 4);
    q.mark_running(vec![id.clone()], "ep3".into(), "s3".into(), ok).await.expect("mark");
    q.finish("s3".into(), report(&id, Outcome::Exited { exit_code: 0 }), LOSS).await.expect("finish");
    let history = q.history(id).await.expect("history");
    let kept: Vec<_> =
        history.iter().map(|a| (a.n, a.ep.as_str(), a.outcome.as_str(), a.ended_at_ms.is_some())).collect();
    assert_eq!(kept, [(1, "ep3", "completed", true)]);
}

#[tokio::test]
async fn a_version_12_store_finds_overdue_jobs_without_an_index_by_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v12.db");
    drop(store_at_version(&path, 12));
    let q = Queue::open(&path).expect("open and migrate");
    let left: i64 = q
        .call(|c| {
            Ok(c.query_row("SELECT COUNT(*) FROM sqlite_master WHERE name = 'jobs_running_by_start'", [], |r| {
                r.get(0)
            })?)
        })
        .await
        .expect("schema");
    assert_eq!(left, 0);
    let id = q.submit(new_job("k1", "t1", 1)).await.expect("submit").job_id;
    let other = q.submit(new_job("k2", "t2", 1)).await.expect("submit").job_id;
    q.mark_running(vec![id.clone(), other], "ep1".into(), "s1".into(), ok).await.expect("mark");
    // Started its run time and 20 s ago, 10 s past the 10 s grace; the other job just started.
    let runtime_ms = new_job("k1", "t1", 1).request.resources.runtime_s * 1000;
    q.call_writing({
        let id = id.clone();
        move |c| {
            Ok(c.execute(
                "UPDATE jobs SET started_at_ms = started_at_ms - ?2 WHERE id = ?1",
                params![id, runtime_ms as i64 + 20_000],
            )?)
        }
    })
    .await
    .expect("backdate");
    let overdue = q.remove_overdue(now_ms(), 10_000).await.expect("overdue");
    assert_eq!(overdue, [(id, "s1".to_owned())]);
}

#[tokio::test]
async fn the_reads_that_must_scale_seek_in_small_indexes_not_the_table() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = Queue::open(&dir.path().join("q.db")).expect("open");
    let plans = q
        .call(|c| {
            let queries = [
                (waiting_of_owner_sql(), "jobs_live_by_owner"),
                (unfinished_sql(), "jobs_live_by_owner"),
                (live_credentials_sql(), "jobs_live_by_owner"),
                (RUNNING_IN_SESSION.to_owned(), "jobs_running_by_session"),
                (OVERDUE.to_owned(), "jobs_running_by_"),
                (of_trace_sql(), "jobs_by_trace"),
                (FIRED_PATH.to_owned(), "jobs_by_function_path"),
                (ended_sql(), "jobs_final_by_time"),
            ];
            let mut out = Vec::new();
            for (sql, index) in queries {
                let mut stmt = c.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
                let n = stmt.parameter_count();
                let nulls = vec![rusqlite::types::Null; n];
                let plan: Vec<String> =
                    stmt.query_map(rusqlite::params_from_iter(nulls), |r| r.get(3))?.collect::<Result<_, _>>()?;
                out.push((sql, index, plan));
            }
            Ok(out)
        })
        .await
        .expect("plans");
    for (sql, index, plan) in plans {
        let shown = plan.join("; ");
        assert!(shown.contains(index), "{sql}\n  plan: {shown}\n  expected index {index}");
        // A scan of the whole table reads every job ever run.
        assert!(plan.iter().all(|step| !step.starts_with("SCAN jobs") || step.contains(" USING ")), "{sql}: {shown}");
    }
    assert!(waiting_of_owner_sql().contains(LIVE) && unfinished_sql().contains(LIVE));
}

#[tokio::test]
async fn ended_jobs_come_by_end_time_in_pages_that_never_skip_or_repeat_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = Queue::open(&dir.path().join("q.db")).expect("open");
    let mut ids = Vec::new();
    for i in 0..6 {
        ids.push(q.submit(new_job(&format!("k{i}"), &format!("t{i}"), 1)).await.expect("submit").job_id);
    }
    // The last one stays idle: never listed.
    let ran: Vec<String> = ids[..5].to_vec();
    let marked = q.mark_running(ran.clone(), "ep1".into(), "s1".into(), ok).await.expect("mark");
    assert_eq!(marked.assigned.len(), 5);
    for id in &ran {
        let done = report(id, Outcome::Exited { exit_code: 0 });
        q.finish("s1".into(), done, LOSS).await.expect("finish").expect("was running");
    }
    // End times: three jobs share one millisecond (pages of 2 split them), one ends past the window.
    let ends = [1_000i64, 2_000, 2_000, 2_000, 9_000];
    // Set beside the queue's own connections, as another writer of the file would.
    let c = rusqlite::Connection::open(dir.path().join("q.db")).expect("open the file");
    for (id, end) in ran.iter().zip(ends) {
        c.execute("UPDATE jobs SET finished_at_ms = ?2 WHERE id = ?1", rusqlite::params![id, end]).expect("end time");
    }
    let (mut since, mut after, mut got) = (1_000u64, None::<String>, Vec::new());
    loop {
        let page = q.list_ended(since, 5_000, after.clone(), 2).await.expect("page");
        let full = page.len() == 2;
        if let Some(last) = page.last() {
            since = last.finished_at_ms.expect("ended");
            after = Some(last.id.clone());
        }
        got.extend(page);
        if !full {
            break;
        }
    }
    let mut want: Vec<(u64, String)> =
        ran[..4].iter().cloned().zip([1_000u64, 2_000, 2_000, 2_000]).map(|(id, t)| (t, id)).collect();
    want.sort();
    let seen: Vec<(u64, String)> = got.iter().map(|j| (j.finished_at_ms.expect("ended"), j.id.clone())).collect();
    assert_eq!(seen, want, "each job of the window once, by end time then id");
    assert!(q.list_ended(9_001, 10_000, None, 10).await.expect("empty").is_empty());
}
