//! The store's tests across its files (jobs, runs, accounts, revocations, migrations); the
//! writer's own tests and the refusal budget's are with their code, the fixtures in
//! `crate::testing`.

use super::schema::{MIGRATE_1_TO_2, SCHEMA_1};
use super::*;
use crate::revocation::Credential;
use crate::testing::{LOSS, new_job, ok, request};
use htfaas_functions::Resources;
use htfaas_functions::audit::{self, AuditSigner};
use htfaas_functions::proto::{Account, HOLD_CODE_STORAGE, JobReport, JobState, Outcome, RevocationTarget, Usage};
use rusqlite::{Connection, params};
use std::collections::HashMap;

#[tokio::test]
async fn the_idle_limit_refuses_new_jobs_without_using_the_token_and_holds_under_concurrency() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = Queue::open(&dir.path().join("q.db")).expect("open");
    let limited = |i: usize| NewJob { max_idle: Some(2), ..new_job(&format!("k{i}"), &format!("t{i}"), 1) };
    // Ten concurrent submits with ten single-use tokens: exactly two get in.
    let handles: Vec<_> = (0..10)
        .map(|i| {
            let (q, j) = (q.clone(), limited(i));
            tokio::spawn(async move { (i, q.submit(j).await) })
        })
        .collect();
    let mut created = Vec::new();
    for h in handles {
        match h.await.expect("joins") {
            (i, Ok(s)) => created.push((i, s.job_id)),
            (_, Err(e)) => {
                assert_eq!(e.to_string(), "owner alice has 2 idle jobs, the limit is 2; try again later")
            }
        }
    }
    assert_eq!(created.len(), 2);
    // Refused submits counted no use of their tokens.
    for i in 0..10 {
        let expected = u64::from(created.iter().any(|(c, _)| *c == i));
        assert_eq!(q.uses(format!("t{i}")).await.expect("uses"), expected, "t{i}");
    }
    // A dedupe hit is answered as before, even at the limit.
    let (i, id) = created[0].clone();
    assert_eq!(q.submit(limited(i)).await.expect("dedupe hit"), Submitted { job_id: id.clone(), created: false });
    // A held job still counts; a running one does not.
    let refused = created.iter().map(|(c, _)| *c).max().map_or(0, |m| m + 1);
    q.act(id.clone(), Action::Hold, "wait".into()).await.expect("hold");
    assert!(matches!(q.submit(limited(refused)).await, Err(QueueError::TooManyIdle { idle: 2, max: 2, .. })));
    q.act(id.clone(), Action::Release, "go".into()).await.expect("release");
    q.mark_running(vec![id], "ep1".into(), "s1".into(), ok).await.expect("mark");
    assert!(q.submit(limited(refused)).await.expect("room again").created);
    assert_eq!(q.uses(format!("t{refused}")).await.expect("uses"), 1);
}

fn pr(pool: Pool, room: Resources, free_cpus: u32) -> PoolRoom {
    PoolRoom { pool, room, free_cpus, native: false }
}

#[tokio::test]
async fn token_uses_are_counted_and_dedupe_does_not_consume() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = Queue::open(&dir.path().join("q.db")).expect("open");
    let a = q.submit(new_job("k1", "t1", 2)).await.expect("first");
    assert!(a.created);
    let again = q.submit(new_job("k1", "t1", 2)).await.expect("dedupe");
    assert_eq!(again, Submitted { job_id: a.job_id.clone(), created: false });
    assert!(q.submit(new_job("k2", "t1", 2)).await.expect("second use").created);
    let err = q.submit(new_job("k3", "t1", 2)).await.expect_err("third use");
    assert_eq!(err.to_string(), "token already used (2 of 2 jobs)");
    assert_eq!(q.list(10).await.expect("list").len(), 2);
}

#[tokio::test]
async fn finish_charges_the_owner_once_and_only_for_its_session() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = Queue::open(&dir.path().join("q.db")).expect("open");
    let id = q.submit(new_job("k1", "t1", 1)).await.expect("submit").job_id;
    let marked = q.mark_running(vec![id.clone()], "ep1".into(), "s1".into(), ok).await.expect("mark");
    assert_eq!(marked.assigned.len(), 1);
    let report = JobReport {
        input_sha256: None,
        job_id: id.clone(),
        outcome: Outcome::Exited { exit_code: 0 },
        usage: Usage {
            wall_ms: 2000,
            cpu_ms: 1500,
            peak_memory_bytes: 1,
            bytes_in: 10,
            bytes_out: 20,
            instructions: None,
            phases: Default::default(),
        },
        outputs: vec![],
        log: "x".repeat(MAX_LOG_BYTES + 10),
        refs: Vec::new(),
        checkpoint: None,
    };
    assert_eq!(q.finish("s2".into(), report.clone(), LOSS).await.expect("other session"), None);
    let f = q.finish("s1".into(), report.clone(), LOSS).await.expect("finish").expect("was running");
    assert_eq!(f.state, JobState::Completed);
    assert_eq!(q.finish("s1".into(), report, LOSS).await.expect("again"), None);
    let acc = q.accounts().await.expect("accounts");
    assert_eq!(acc.len(), 1);
    assert_eq!(acc[0].jobs_completed, 1);
    assert!((acc[0].core_seconds - 2.0).abs() < 1e-9);
    assert_eq!((acc[0].bytes_in, acc[0].bytes_out), (10, 20));
    // The records say the same; a second charge would show as a difference.
    let from_records = q.accounts_from_records().await.expect("from records");
    assert_eq!(from_records.len(), 1);
    assert_eq!(from_records[0].jobs_completed, 1);
    assert!((from_records[0].core_seconds - acc[0].core_seconds).abs() < 1e-9);
    assert_eq!((from_records[0].bytes_in, from_records[0].bytes_out), (10, 20));
}

#[tokio::test]
async fn jobs_that_fit_nowhere_do_not_fill_the_batch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = Queue::open(&dir.path().join("q.db")).expect("open");
    let mut big = new_job("big", "t1", 1);
    big.request.resources.cpus = 8;
    q.submit(big).await.expect("big");
    let small = q.submit(new_job("small", "t2", 1)).await.expect("small").job_id;
    let room = Resources::new(4, 1024, 3600);
    let site = Pool { annex: None, owner: None };
    let got = q
        .idle_candidates(vec![pr(site.clone(), room, 1)], vec![], vec![], HashMap::new(), now_ms())
        .await
        .expect("candidates");
    assert_eq!(got.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), vec![small.as_str()]);
    let alices = Pool { annex: None, owner: Some("alice".into()) };
    let by_owner = q
        .idle_candidates(vec![pr(alices, room, 1)], vec![], vec![], HashMap::new(), now_ms())
        .await
        .expect("candidates");
    assert_eq!(by_owner.len(), 1);
    let bobs = Pool { annex: None, owner: Some("bob".into()) };
    assert!(
        q.idle_candidates(vec![pr(bobs, room, 1)], vec![], vec![], HashMap::new(), now_ms())
            .await
            .expect("candidates")
            .is_empty()
    );
    // Owners at their running limit are not read at all.
    let skipped = q
        .idle_candidates(vec![pr(site.clone(), room, 10)], vec!["alice".into()], vec![], HashMap::new(), now_ms())
        .await
        .expect("candidates");
    assert!(skipped.is_empty());
    // Nor the jobs of a function at its max_concurrent: its limit is read with each job.
    let mut limited = new_job("limited", "t3", 1);
    limited.request.function.name = "slow".into();
    limited.request.max_concurrent = Some(2);
    let limited = q.submit(limited).await.expect("limited").job_id;
    let read =
        |skip: Vec<String>| q.idle_candidates(vec![pr(site.clone(), room, 10)], vec![], skip, HashMap::new(), now_ms());
    let all = read(vec![]).await.expect("candidates");
    let job = all.iter().find(|j| j.id == limited).expect("the limited job");
    assert_eq!(job.limit, Some(crate::queue::FunctionLimit { function: "slow".into(), max_concurrent: 2 }));
    let without = read(vec!["slow".into()]).await.expect("candidates");
    assert_eq!(without.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), vec![small.as_str()]);
}

#[tokio::test]
async fn annex_jobs_are_read_only_for_their_annexs_pool() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = Queue::open(&dir.path().join("q.db")).expect("open");
    // Many older annex jobs do not hide a plain one from a plain pool's batch.
    for i in 0..3 {
        let mut j = new_job(&format!("gpu{i}"), &format!("t{i}"), 1);
        j.request.annex = Some("gpu".into());
        q.submit(j).await.expect("annex job");
    }
    let plain = q.submit(new_job("plain", "tp", 1)).await.expect("plain").job_id;
    let room = Resources::new(4, 1024, 3600);
    let site = Pool { annex: None, owner: None };
    let got =
        q.idle_candidates(vec![pr(site, room, 1)], vec![], vec![], HashMap::new(), now_ms()).await.expect("candidates");
    assert_eq!(got.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), vec![plain.as_str()]);
    let gpu = Pool { annex: Some("gpu".into()), owner: None };
    let got =
        q.idle_candidates(vec![pr(gpu, room, 10)], vec![], vec![], HashMap::new(), now_ms()).await.expect("candidates");
    assert_eq!(got.len(), 3);
    assert!(got.iter().all(|j| j.annex.as_deref() == Some("gpu")));
}

#[tokio::test]
async fn a_job_that_prepare_refuses_fails_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = Queue::open(&dir.path().join("q.db")).expect("open");
    let id = q.submit(new_job("k1", "t1", 1)).await.expect("submit").job_id;
    let marked = q
        .mark_running(vec![id.clone()], "ep1".into(), "s1".into(), |_, _| Err("no, because".into()))
        .await
        .expect("mark");
    assert!(marked.assigned.is_empty());
    assert_eq!(marked.skipped, vec![id.clone()]);
    let rec = q.get(id).await.expect("get").expect("exists");
    assert_eq!((rec.state, rec.reason.as_str()), (JobState::Failed, "no, because"));
}

#[tokio::test]
async fn a_version_1_store_is_migrated_and_its_jobs_read_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v1.db");
    {
        let conn = Connection::open(&path).expect("create v1");
        conn.execute_batch(SCHEMA_1).expect("v1 schema");
        conn.pragma_update(None, "user_version", 1).expect("version");
        conn.execute(
            "INSERT INTO jobs (id, owner, dedupe_key, state, token_jti, request, cpus, memory_mb, runtime_s, \
             submitted_at_ms) VALUES ('old', 'alice', 'k', 'idle', 'jti-1', ?1, 1, 64, 60, 5)",
            params![serde_json::to_string(&request("k")).expect("json")],
        )
        .expect("v1 row");
    }
    let q = Queue::open(&path).expect("open and migrate");
    let version: i64 = q.call(|c| Ok(c.query_row("PRAGMA user_version", [], |r| r.get(0))?)).await.expect("v");
    assert_eq!(version, SCHEMA_VERSION);
    let rec = q.get("old".into()).await.expect("get").expect("kept");
    assert_eq!((rec.owner.as_str(), rec.token_jti.as_str(), rec.state), ("alice", "jti-1", JobState::Idle));
    assert_eq!((rec.token_issuer.as_str(), rec.group, rec.annex), ("", None, None));
    assert_eq!(q.revocations().await.expect("revocations table"), vec![]);
    // New columns are written and read from now on, and the old row is still revocable by owner.
    let mut j = new_job("k2", "t2", 1);
    (j.group, j.request.annex) = (Some("physics".into()), Some("gpu".into()));
    let id = q.submit(j).await.expect("submit").job_id;
    let rec = q.get(id).await.expect("get").expect("exists");
    assert_eq!(
        (rec.token_issuer.as_str(), rec.group.as_deref(), rec.annex.as_deref()),
        ("gw", Some("physics"), Some("gpu"))
    );
    let target = RevocationTarget::Owner("alice".into());
    let rec = q.record_revocation(target, "r".into(), "admin".into(), vec![]).await.expect("revoke");
    assert_eq!(rec.revocation.removed_jobs.len(), 2);
    drop(q);
    // Opening again is a no-op migration; a newer file is refused.
    let q = Queue::open(&path).expect("reopen");
    q.call_writing(|c| Ok(c.pragma_update(None, "user_version", SCHEMA_VERSION + 1)?)).await.expect("bump");
    drop(q);
    assert!(matches!(Queue::open(&path), Err(QueueError::SchemaTooNew { .. })));
}

#[tokio::test]
async fn a_revocation_removes_idle_and_running_jobs_and_refuses_the_token_durably() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("q.db");
    let q = Queue::open(&path).expect("open");
    let idle = q.submit(new_job("k1", "t1", 3)).await.expect("idle").job_id;
    let running = q.submit(new_job("k2", "t1", 3)).await.expect("running").job_id;
    let other = q.submit(new_job("k3", "t2", 1)).await.expect("other token").job_id;
    q.mark_running(vec![running.clone()], "ep1".into(), "s1".into(), ok).await.expect("mark");
    let target = RevocationTarget::Jti("t1".into());
    q.block(target.clone(), "leaked".into());
    let err = q.submit(new_job("k4", "t1", 3)).await.expect_err("revoked in memory");
    assert_eq!(err.to_string(), "token revoked: leaked");
    let rec = q.record_revocation(target, "leaked".into(), "admin".into(), vec!["s9".into()]).await.expect("rec");
    assert_eq!(rec.revocation.removed_jobs, vec![idle.clone()]);
    assert_eq!(rec.revocation.stopped_jobs, vec![running.clone()]);
    assert_eq!(rec.stopped, vec![(running.clone(), "s1".to_owned())]);
    for id in [&idle, &running] {
        let r = q.get(id.clone()).await.expect("get").expect("exists");
        assert_eq!((r.state, r.reason.as_str()), (JobState::Removed, "token revoked: leaked"));
    }
    assert_eq!(q.get(other).await.expect("get").expect("exists").state, JobState::Idle);

    // The late report of the stopped job is charged once, without changing it.
    let report = JobReport {
        input_sha256: None,
        job_id: running.clone(),
        outcome: Outcome::Cancelled { reason: "token revoked: leaked".into() },
        usage: Usage { wall_ms: 1000, ..Usage::default() },
        outputs: vec![],
        log: String::new(),
        refs: Vec::new(),
        checkpoint: None,
    };
    let f = q.finish("s1".into(), report.clone(), LOSS).await.expect("finish").expect("charged");
    assert_eq!(f.state, JobState::Removed);
    assert_eq!(q.finish("s1".into(), report, LOSS).await.expect("again"), None);
    let r = q.get(running).await.expect("get").expect("exists");
    assert_eq!((r.state, r.reason.as_str()), (JobState::Removed, "token revoked: leaked"));
    let acc = q.accounts().await.expect("accounts");
    assert_eq!((acc[0].jobs_completed, acc[0].jobs_failed), (0, 0));
    assert!((acc[0].core_seconds - 1.0).abs() < 1e-9);
    drop(q);

    let q = Queue::open(&path).expect("reopen");
    let all = q.revocations().await.expect("list");
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].closed_eps, vec!["s9".to_owned()]);
    let cred = Credential { jti: "t1".into(), owner: None, issuer: "x".into() };
    assert_eq!(q.revoked_reason(&cred).as_deref(), Some("leaked"));
}

#[tokio::test]
async fn a_version_2_store_gains_hold_codes_and_keeps_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v2.db");
    {
        let conn = Connection::open(&path).expect("create v2");
        conn.execute_batch(SCHEMA_1).expect("v1 schema");
        conn.execute_batch(MIGRATE_1_TO_2).expect("v2 step");
        conn.pragma_update(None, "user_version", 2).expect("version");
        conn.execute(
            "INSERT INTO jobs (id, owner, dedupe_key, state, token_jti, request, cpus, memory_mb, runtime_s, \
             submitted_at_ms, token_issuer) VALUES ('old', 'alice', 'k', 'idle', 'jti-1', ?1, 1, 64, 60, 5, 'gw')",
            params![serde_json::to_string(&request("k")).expect("json")],
        )
        .expect("v2 row");
    }
    let q = Queue::open(&path).expect("open and migrate");
    let version: i64 = q.call(|c| Ok(c.query_row("PRAGMA user_version", [], |r| r.get(0))?)).await.expect("v");
    assert_eq!(version, SCHEMA_VERSION);
    let rec = q.get("old".into()).await.expect("get").expect("kept");
    assert_eq!((rec.state, rec.hold_code, rec.token_issuer.as_str()), (JobState::Idle, None, "gw"));
    // Version 4's columns read as their defaults.
    assert_eq!((rec.attempts, rec.resources.gpus, rec.resources.disk_mb, rec.class), (0, 0, 0, None));
    assert!(q.history("old".into()).await.expect("history").is_empty());
    let held = q.act("old".into(), Action::Hold, "disk full".into()).await.expect("hold").record;
    assert_eq!((held.state, held.reason.as_str(), held.hold_code), (JobState::Held, "disk full", Some(1)));
    drop(q);
    let q = Queue::open(&path).expect("reopen");
    let rec = q.get("old".into()).await.expect("get").expect("kept");
    assert_eq!((rec.state, rec.reason.as_str(), rec.hold_code), (JobState::Held, "disk full", Some(1)));
}

#[tokio::test]
async fn held_jobs_are_not_matched_and_their_stopped_run_is_charged_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = Queue::open(&dir.path().join("q.db")).expect("open");
    let idle = q.submit(new_job("k1", "t1", 1)).await.expect("idle").job_id;
    let running = q.submit(new_job("k2", "t2", 1)).await.expect("running").job_id;
    q.mark_running(vec![running.clone()], "ep1".into(), "s1".into(), ok).await.expect("mark");

    let acted = q.act(idle.clone(), Action::Hold, "wait".into()).await.expect("hold idle");
    assert_eq!((acted.record.state, acted.stop), (JobState::Held, None));
    let acted = q.act(running.clone(), Action::Hold, "stop".into()).await.expect("hold running");
    assert_eq!((acted.record.state, acted.stop.as_deref()), (JobState::Held, Some("s1")));
    let room = Resources::new(4, 1024, 3600);
    let site = Pool { annex: None, owner: None };
    assert!(
        q.idle_candidates(vec![pr(site.clone(), room, 10)], vec![], vec![], HashMap::new(), now_ms())
            .await
            .expect("candidates")
            .is_empty()
    );
    let marked = q.mark_running(vec![idle.clone()], "ep1".into(), "s1".into(), ok).await.expect("mark");
    assert_eq!(marked.skipped, vec![idle.clone()]);
    let err = q.act(idle.clone(), Action::Hold, "again".into()).await.expect_err("held twice");
    assert_eq!(err.to_string(), format!("job {idle} is already held"));

    // The stopped run's report is charged, once, and the job stays held.
    let report = JobReport {
        input_sha256: None,
        job_id: running.clone(),
        outcome: Outcome::Cancelled { reason: "stop".into() },
        usage: Usage { wall_ms: 1000, ..Usage::default() },
        outputs: vec![],
        log: String::new(),
        refs: Vec::new(),
        checkpoint: None,
    };
    let f = q.finish("s1".into(), report.clone(), LOSS).await.expect("finish").expect("charged");
    assert_eq!(f.state, JobState::Held);
    assert_eq!(q.finish("s1".into(), report, LOSS).await.expect("again"), None);
    let rec = q.get(running.clone()).await.expect("get").expect("exists");
    assert_eq!((rec.state, rec.reason.as_str(), rec.hold_code), (JobState::Held, "stop", Some(1)));
    assert!((q.accounts().await.expect("accounts")[0].core_seconds - 1.0).abs() < 1e-9);

    // Released: idle again, the earlier attempt forgotten, matched again.
    let rec = q.act(running.clone(), Action::Release, "go".into()).await.expect("release").record;
    assert_eq!((rec.state, rec.reason.as_str(), rec.hold_code), (JobState::Idle, "", None));
    assert_eq!((rec.ep, rec.usage, rec.started_at_ms), (None, None, None));
    let got = q
        .idle_candidates(vec![pr(site, room, 10)], vec![], vec![], HashMap::new(), now_ms())
        .await
        .expect("candidates");
    assert_eq!(got.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), vec![running.as_str()]);
    let err = q.act(running.clone(), Action::Release, "go".into()).await.expect_err("not held");
    assert_eq!(err.to_string(), format!("job {running} is idle; only held jobs can be released"));

    // Removed from held; then nothing more is allowed; an unknown id is not found.
    let rec = q.act(idle.clone(), Action::Remove, "gone".into()).await.expect("remove").record;
    assert_eq!((rec.state, rec.reason.as_str(), rec.hold_code), (JobState::Removed, "removed by admin: gone", None));
    let err = q.act(idle.clone(), Action::Hold, "x".into()).await.expect_err("removed");
    assert_eq!(err.to_string(), format!("job {idle} is removed; only idle or running jobs can be held"));
    let err = q.act(idle.clone(), Action::Remove, "x".into()).await.expect_err("removed");
    assert_eq!(err.to_string(), format!("job {idle} is removed; only idle, running or held jobs can be removed"));
    assert!(matches!(q.act("nope".into(), Action::Remove, "x".into()).await, Err(QueueError::JobNotFound { .. })));
}

#[tokio::test]
async fn a_revocation_removes_held_jobs_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = Queue::open(&dir.path().join("q.db")).expect("open");
    let id = q.submit(new_job("k1", "t1", 1)).await.expect("submit").job_id;
    q.act(id.clone(), Action::Hold, "wait".into()).await.expect("hold");
    let rec = q.record_revocation(RevocationTarget::Jti("t1".into()), "leaked".into(), "admin".into(), vec![]);
    assert_eq!(rec.await.expect("revoke").revocation.removed_jobs, vec![id.clone()]);
    let r = q.get(id).await.expect("get").expect("exists");
    assert_eq!((r.state, r.reason.as_str(), r.hold_code), (JobState::Removed, "token revoked: leaked", None));
}

#[tokio::test]
async fn reopening_requeues_running_jobs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("q.db");
    let id = {
        let q = Queue::open(&path).expect("open");
        let id = q.submit(new_job("k1", "t1", 1)).await.expect("submit").job_id;
        q.mark_running(vec![id.clone()], "ep1".into(), "s1".into(), ok).await.expect("mark");
        id
    };
    let q = Queue::open(&path).expect("reopen");
    let rec = q.get(id).await.expect("get").expect("exists");
    assert_eq!(rec.state, JobState::Idle);
    assert_eq!(rec.ep, None);
}

/// Accounts as charged equal accounts recomputed from the attempts' records.
async fn assert_accounts_match_records(q: &Queue) -> Vec<Account> {
    let charged = q.accounts().await.expect("accounts");
    let recomputed = q.accounts_from_records().await.expect("from records");
    assert_eq!(charged.len(), recomputed.len(), "{charged:?} vs {recomputed:?}");
    for (a, b) in charged.iter().zip(&recomputed) {
        assert_eq!(
            (&a.owner, a.jobs_completed, a.jobs_failed, a.bytes_in, a.bytes_out),
            (&b.owner, b.jobs_completed, b.jobs_failed, b.bytes_in, b.bytes_out),
            "{a:?} vs {b:?}"
        );
        assert!((a.core_seconds - b.core_seconds).abs() < 1e-9, "{a:?} vs {b:?}");
        assert!((a.cpu_seconds - b.cpu_seconds).abs() < 1e-9, "{a:?} vs {b:?}");
        assert!((a.wall_seconds - b.wall_seconds).abs() < 1e-9, "{a:?} vs {b:?}");
    }
    charged
}

fn unavailable(id: &str, wall_ms: u64) -> JobReport {
    JobReport {
        input_sha256: None,
        job_id: id.into(),
        outcome: Outcome::StorageUnavailable {
            reason: "GET http://storage/data/raw/a: HTTP 503 Service Unavailable: down (gave up after 4 attempts)"
                .into(),
        },
        usage: Usage { wall_ms, bytes_in: 0, ..Usage::default() },
        outputs: vec![],
        log: "[htfaas-ep] storage down\n".into(),
        refs: Vec::new(),
        checkpoint: None,
    }
}

fn audit_kinds(conn: &Connection, job: &str, kind: &str) -> i64 {
    conn.query_row("SELECT COUNT(*) FROM audit_records WHERE job = ?1 AND kind = ?2", params![job, kind], |r| r.get(0))
        .expect("count")
}

// A storage outage costs the job an attempt, not its life.
#[tokio::test]
async fn a_storage_outage_requeues_the_job_with_backoff_then_holds_it_and_a_release_runs_it_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = Queue::open(&dir.path().join("q.db")).expect("open");
    let id = q.submit(new_job("k1", "t1", 1)).await.expect("submit").job_id;
    let loss = Loss::Ep { max_retries: 1, backoff_ms: 60_000 };

    // First attempt: the storage is down. The job is idle again, waiting out its backoff.
    q.mark_running(vec![id.clone()], "ep-a".into(), "s1".into(), ok).await.expect("mark");
    let before = now_ms();
    let f = q.finish("s1".into(), unavailable(&id, 2000), loss).await.expect("finish").expect("was running");
    assert_eq!(f, Finished { owner: "alice".into(), state: JobState::Idle });
    let job = q.get(id.clone()).await.expect("get").expect("kept");
    assert_eq!((job.state, job.hold_code, job.reason.as_str()), (JobState::Idle, None, ""));
    let (lost, not_before) = q.retry_state(id.clone()).await.expect("retry state");
    assert_eq!(lost, 1);
    assert!(not_before >= before + 60_000 && not_before <= now_ms() + 60_000, "{not_before}");
    let room = Resources::new(8, 4096, 3600);
    let idle = q.idle_candidates(
        vec![pr(Pool { annex: None, owner: None }, room, 8)],
        vec![],
        vec![],
        HashMap::new(),
        now_ms(),
    );
    assert!(idle.await.expect("candidates").is_empty(), "in backoff, not matched");
    let later = q.idle_candidates(
        vec![pr(Pool { annex: None, owner: None }, room, 8)],
        vec![],
        vec![],
        HashMap::new(),
        not_before,
    );
    assert_eq!(later.await.expect("candidates").len(), 1, "matched once the backoff is over");
    // The slot it held is charged; the job counts neither completed nor failed.
    let acc = assert_accounts_match_records(&q).await;
    assert_eq!((acc[0].jobs_completed, acc[0].jobs_failed), (0, 0));
    assert!((acc[0].core_seconds - 2.0).abs() < 1e-9);
    // A second copy of the report is not heard.
    assert_eq!(q.finish("s1".into(), unavailable(&id, 2000), loss).await.expect("again"), None);

    // Second attempt: still down, and past the retry limit: held with the storage's reason.
    q.mark_running(vec![id.clone()], "ep-b".into(), "s2".into(), ok).await.expect("mark");
    let f = q.finish("s2".into(), unavailable(&id, 1000), loss).await.expect("finish").expect("was running");
    assert_eq!(f.state, JobState::Held);
    let job = q.get(id.clone()).await.expect("get").expect("kept");
    assert_eq!((job.state, job.hold_code), (JobState::Held, Some(HOLD_CODE_STORAGE)));
    assert!(job.reason.starts_with("storage unavailable: GET http://storage/data/raw/a: HTTP 503"), "{}", job.reason);
    assert!(job.reason.ends_with("(on ep-b; lost 2 attempts, the retry limit is 1)"), "{}", job.reason);
    assert_eq!(q.finish("s2".into(), unavailable(&id, 1000), loss).await.expect("late"), None);
    let history = q.history(id.clone()).await.expect("history");
    let summary: Vec<(u32, &str, &str)> = history.iter().map(|a| (a.n, a.ep.as_str(), a.outcome.as_str())).collect();
    assert_eq!(summary, [(1, "ep-a", "storage-unavailable"), (2, "ep-b", "storage-unavailable")]);
    assert!(history.iter().all(|a| a.reason.starts_with("storage unavailable: GET ") && a.usage.is_some()));
    let acc = assert_accounts_match_records(&q).await;
    assert_eq!((acc[0].jobs_completed, acc[0].jobs_failed), (0, 0));
    assert!((acc[0].core_seconds - 3.0).abs() < 1e-9);
    // Each decision is in the trail: two reports, one hold with the storage's code.
    let (finished, held) = q
        .call({
            let id = id.clone();
            move |c| Ok((audit_kinds(c, &id, "job.finished"), audit_kinds(c, &id, "job.held")))
        })
        .await
        .expect("audit");
    assert_eq!((finished, held), (2, 1));
    let held_detail: String = q
        .call({
            let id = id.clone();
            move |c| {
                Ok(c.query_row("SELECT json FROM audit_records WHERE job = ?1 AND kind = 'job.held'", [id], |r| {
                    r.get(0)
                })?)
            }
        })
        .await
        .expect("record");
    assert!(held_detail.contains("\"hold_code\":13"), "{held_detail}");

    // Released, it runs again with a fresh budget and completes: counted once, all charged.
    q.act(id.clone(), Action::Release, "storage back".into()).await.expect("release");
    assert_eq!(q.retry_state(id.clone()).await.expect("retry state"), (0, 0));
    q.mark_running(vec![id.clone()], "ep-c".into(), "s3".into(), ok).await.expect("mark");
    let done = JobReport { outcome: Outcome::Exited { exit_code: 0 }, ..unavailable(&id, 4000) };
    let f = q.finish("s3".into(), done, loss).await.expect("finish").expect("was running");
    assert_eq!(f.state, JobState::Completed);
    let acc = assert_accounts_match_records(&q).await;
    assert_eq!((acc[0].jobs_completed, acc[0].jobs_failed), (1, 0));
    assert!((acc[0].core_seconds - 7.0).abs() < 1e-9);
    let report = audit::verify(q.path(), &AuditSigner::generate("k").expect("key").0.keys()).expect("verify");
    assert!(report.ok(), "{:?}", report.first_problem);
}

#[tokio::test]
async fn a_storage_refusal_still_fails_the_job_at_once_and_a_shutdown_counts_no_loss() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = Queue::open(&dir.path().join("q.db")).expect("open");
    let refused = q.submit(new_job("k1", "t1", 1)).await.expect("submit").job_id;
    let other = q.submit(new_job("k2", "t2", 1)).await.expect("submit").job_id;
    q.mark_running(vec![refused.clone(), other.clone()], "ep-a".into(), "s1".into(), ok).await.expect("mark");
    let loss = Loss::Ep { max_retries: 0, backoff_ms: 0 };
    let denied = JobReport {
        outcome: Outcome::InputFailed { reason: "GET http://storage/data/raw/a: HTTP 403 Forbidden".into() },
        ..unavailable(&refused, 500)
    };
    let f = q.finish("s1".into(), denied, loss).await.expect("finish").expect("was running");
    assert_eq!(f.state, JobState::Failed);
    let job = q.get(refused.clone()).await.expect("get").expect("kept");
    assert_eq!((job.state, job.hold_code), (JobState::Failed, None));
    assert_eq!(job.reason, "input failed: GET http://storage/data/raw/a: HTTP 403 Forbidden");
    // With the scheduler shutting down, an outage puts the job back without counting a loss.
    let f = q.finish("s1".into(), unavailable(&other, 500), Loss::Shutdown).await.expect("finish");
    assert_eq!(f.expect("was running").state, JobState::Idle);
    assert_eq!(q.retry_state(other).await.expect("retry state"), (0, 0));
    let acc = assert_accounts_match_records(&q).await;
    assert_eq!((acc[0].jobs_completed, acc[0].jobs_failed), (0, 1));
}

// A full disk refuses new work with a clear error and loses nothing accepted.
#[tokio::test]
async fn a_full_disk_refuses_submissions_keeps_every_accepted_job_and_heals_when_space_is_freed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = Queue::open(&dir.path().join("q.db")).expect("open");
    let pages = q.page_count().await.expect("pages");
    assert_eq!(q.set_max_page_count(Some(pages + 8)).await.expect("cap"), pages + 8);
    let mut accepted = Vec::new();
    let full = loop {
        let n = accepted.len();
        assert!(n < 10_000, "the capped store never filled");
        match q.submit(new_job(&format!("k{n}"), &format!("t{n}"), 1)).await {
            Ok(s) => accepted.push(s.job_id),
            Err(e) => break e,
        }
    };
    assert!(matches!(full, QueueError::DiskFull(_)), "{full:?}");
    assert!(full.to_string().starts_with("the scheduler's disk is full: "), "{full}");
    // Its HTTP answer (507, this message): crate::failure's tests.
    assert!(accepted.len() >= 2, "{}", accepted.len());
    // The refused job left nothing: no row, no token use; the writer goes on answering.
    let n = accepted.len();
    assert_eq!(q.uses(format!("t{n}")).await.expect("uses"), 0);
    assert!(q.submit(new_job(&format!("k{n}"), &format!("t{n}"), 1)).await.expect_err("still full").is_disk_full());
    let listed = q.list(100_000).await.expect("reads still work");
    assert_eq!(listed.len(), n);
    assert!(listed.iter().all(|j| j.state == JobState::Idle && accepted.contains(&j.id)));
    // Room again: the same submission passes, and every accepted job is dispatchable.
    q.set_max_page_count(None).await.expect("uncap");
    let again = q.submit(new_job(&format!("k{n}"), &format!("t{n}"), 1)).await.expect("accepted now");
    assert!(again.created);
    accepted.push(again.job_id);
    let marked = q.mark_running(accepted.clone(), "ep-a".into(), "s1".into(), ok).await.expect("mark");
    assert_eq!(marked.assigned.len(), accepted.len());
    assert!(marked.skipped.is_empty());
}

// A function's retry policy after guest failures.

fn with_policy(key: &str, retry: Option<htfaas_functions::manifest::RetryPolicy>) -> NewJob {
    let mut job = new_job(key, key, 1);
    job.request.retry = retry;
    job
}

fn policy(
    retries: u32,
    on: &[htfaas_functions::manifest::RetryOn],
    backoff_s: u64,
) -> htfaas_functions::manifest::RetryPolicy {
    htfaas_functions::manifest::RetryPolicy { retries, on: on.to_vec(), backoff_s }
}

fn ended(id: &str, outcome: Outcome, wall_ms: u64) -> JobReport {
    JobReport { outcome, ..unavailable(id, wall_ms) }
}

/// Runs `id` once on a fresh session and reports `outcome`; the job's state after.
async fn run_once(q: &Queue, id: &str, n: u32, outcome: Outcome) -> JobState {
    let session = format!("s-{id}-{n}");
    q.mark_running(vec![id.to_owned()], format!("ep-{n}"), session.clone(), ok).await.expect("mark");
    let f = q.finish(session, ended(id, outcome, 1000), LOSS).await.expect("finish").expect("was running");
    f.state
}

#[tokio::test]
async fn a_listed_guest_failure_runs_again_until_its_retries_are_used_then_fails_saying_how_often() {
    use htfaas_functions::manifest::RetryOn;
    let dir = tempfile::tempdir().expect("tempdir");
    let q = Queue::open(&dir.path().join("q.db")).expect("open");
    let id = q.submit(with_policy("k1", Some(policy(2, &[RetryOn::ExitNonzero], 10)))).await.expect("submit").job_id;
    let exit = || Outcome::Exited { exit_code: 3 };

    let before = now_ms();
    assert_eq!(run_once(&q, &id, 1, exit()).await, JobState::Idle);
    let (lost, not_before) = q.retry_state(id.clone()).await.expect("retry state");
    assert_eq!(lost, 0, "a guest failure is no lost attempt");
    assert!(not_before >= before + 10_000 && not_before <= now_ms() + 10_000, "first backoff: {not_before}");
    let room = Resources::new(8, 4096, 3600);
    let pools = || vec![pr(Pool { annex: None, owner: None }, room, 8)];
    assert!(
        q.idle_candidates(pools(), vec![], vec![], HashMap::new(), now_ms()).await.expect("idle").is_empty(),
        "backoff"
    );
    let job = q.get(id.clone()).await.expect("get").expect("kept");
    assert_eq!((job.state, job.exit_code, job.attempts), (JobState::Idle, Some(3), 1));

    let before = now_ms();
    assert_eq!(run_once(&q, &id, 2, exit()).await, JobState::Idle);
    let (_, not_before) = q.retry_state(id.clone()).await.expect("retry state");
    assert!(not_before >= before + 20_000, "the backoff doubles: {not_before}");
    assert_eq!(run_once(&q, &id, 3, exit()).await, JobState::Failed);
    let job = q.get(id.clone()).await.expect("get").expect("kept");
    assert_eq!(job.reason, "exited with status 3 (after 3 attempts; its retry policy allows 2 retries)");
    let history = q.history(id.clone()).await.expect("history");
    let summary: Vec<(u32, &str, &str)> =
        history.iter().map(|a| (a.n, a.outcome.as_str(), a.reason.as_str())).collect();
    assert_eq!(
        summary,
        [
            (1, "failed", "exited with status 3"),
            (2, "failed", "exited with status 3"),
            (3, "failed", "exited with status 3")
        ]
    );
    assert!(history.iter().all(|a| a.usage.is_some() && a.ended_at_ms.is_some()));
    // Every attempt charged, the job counted once, failed.
    let acc = assert_accounts_match_records(&q).await;
    assert_eq!((acc[0].jobs_completed, acc[0].jobs_failed), (0, 1));
    assert!((acc[0].core_seconds - 3.0).abs() < 1e-9, "{acc:?}");
    let finished = q
        .call({
            let id = id.clone();
            move |c| Ok(audit_kinds(c, &id, "job.finished"))
        })
        .await
        .expect("audit");
    assert_eq!(finished, 3, "each attempt's report is recorded");
    let report = audit::verify(q.path(), &AuditSigner::generate("k").expect("key").0.keys()).expect("verify");
    assert!(report.ok(), "{:?}", report.first_problem);
}

#[tokio::test]
async fn a_retry_that_succeeds_completes_the_job_counted_once() {
    use htfaas_functions::manifest::RetryOn;
    let dir = tempfile::tempdir().expect("tempdir");
    let q = Queue::open(&dir.path().join("q.db")).expect("open");
    let id = q.submit(with_policy("k1", Some(policy(2, &[RetryOn::Trap], 0)))).await.expect("submit").job_id;
    assert_eq!(run_once(&q, &id, 1, Outcome::Trapped { message: "unreachable".into() }).await, JobState::Idle);
    assert_eq!(run_once(&q, &id, 2, Outcome::Exited { exit_code: 0 }).await, JobState::Completed);
    let outcomes: Vec<String> = q.history(id).await.expect("history").into_iter().map(|a| a.outcome).collect();
    assert_eq!(outcomes, ["failed", "completed"]);
    let acc = assert_accounts_match_records(&q).await;
    assert_eq!((acc[0].jobs_completed, acc[0].jobs_failed), (1, 0));
}

#[tokio::test]
async fn an_unlisted_outcome_and_a_job_without_policy_fail_at_once() {
    use htfaas_functions::manifest::RetryOn;
    let dir = tempfile::tempdir().expect("tempdir");
    let q = Queue::open(&dir.path().join("q.db")).expect("open");
    // Listed: exit_nonzero; the guest traps instead, and a refused input is never retried.
    let trap = q.submit(with_policy("k1", Some(policy(3, &[RetryOn::ExitNonzero], 0)))).await.expect("s").job_id;
    assert_eq!(run_once(&q, &trap, 1, Outcome::Trapped { message: "oob".into() }).await, JobState::Failed);
    assert_eq!(q.get(trap.clone()).await.expect("get").expect("kept").reason, "trapped: oob");
    let all = q.submit(with_policy("k2", Some(policy(3, &RetryOn::ALL, 0)))).await.expect("s").job_id;
    let refused = Outcome::InputFailed { reason: "HTTP 403".into() };
    assert_eq!(run_once(&q, &all, 1, refused).await, JobState::Failed);
    // No policy: today's default, a guest failure is final...
    let none = q.submit(with_policy("k3", None)).await.expect("s").job_id;
    assert_eq!(run_once(&q, &none, 1, Outcome::Exited { exit_code: 1 }).await, JobState::Failed);
    assert_eq!(q.get(none.clone()).await.expect("get").expect("kept").reason, "exited with status 1");
    assert_eq!(q.history(none).await.expect("history").len(), 1);
    // ... and a storage outage is retried by the site's rule (a lost attempt).
    let outage = q.submit(with_policy("k4", None)).await.expect("s").job_id;
    let down = Outcome::StorageUnavailable { reason: "HTTP 503".into() };
    assert_eq!(run_once(&q, &outage, 1, down.clone()).await, JobState::Idle);
    assert_eq!(q.retry_state(outage).await.expect("retry").0, 1);
    // A policy that leaves storage_unavailable out fails at once on an outage; one that lists
    // it keeps the site's rule.
    let fast = q.submit(with_policy("k5", Some(policy(3, &[RetryOn::Trap], 0)))).await.expect("s").job_id;
    assert_eq!(run_once(&q, &fast, 1, down.clone()).await, JobState::Failed);
    assert_eq!(q.get(fast).await.expect("get").expect("kept").reason, "storage unavailable: HTTP 503");
    let listed = q.submit(with_policy("k6", Some(policy(0, &[RetryOn::StorageUnavailable], 0)))).await.expect("s");
    assert_eq!(run_once(&q, &listed.job_id, 1, down).await, JobState::Idle);
    let acc = assert_accounts_match_records(&q).await;
    assert_eq!((acc[0].jobs_completed, acc[0].jobs_failed), (0, 4));
}

#[tokio::test]
async fn the_site_caps_the_retries_a_policy_asks_for() {
    use htfaas_functions::manifest::RetryOn;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut q = Queue::open(&dir.path().join("q.db")).expect("open");
    q.set_max_guest_retries(1);
    let id = q.submit(with_policy("k1", Some(policy(5, &[RetryOn::TimeExceeded], 0)))).await.expect("s").job_id;
    let slow = || Outcome::TimeExceeded { limit_s: 1, vacate: None };
    assert_eq!(run_once(&q, &id, 1, slow()).await, JobState::Idle);
    assert_eq!(run_once(&q, &id, 2, slow()).await, JobState::Failed);
    let job = q.get(id.clone()).await.expect("get").expect("kept");
    assert_eq!(
        job.reason,
        "wall-time limit of 1 s exceeded (after 2 attempts; the site allows 1 of the 5 retries its policy asks for)"
    );
    // A site that allows none retries nothing.
    q.set_max_guest_retries(0);
    let none = q.submit(with_policy("k2", Some(policy(5, &[RetryOn::TimeExceeded], 0)))).await.expect("s").job_id;
    assert_eq!(run_once(&q, &none, 1, slow()).await, JobState::Failed);
    assert_accounts_match_records(&q).await;
}

// `events backfill`: which files a function has a job on, whatever its state.
#[tokio::test]
async fn fired_paths_are_the_owners_functions_inputs_in_any_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = Queue::open(&dir.path().join("q.db")).expect("open");
    let job = |key: &str, owner: &str, function: &str, path: &str| {
        let mut j = new_job(key, key, 1);
        j.owner = owner.into();
        j.request.function.name = function.into();
        j.request.event.path = path.into();
        j
    };
    for j in [
        job("k1", "alice", "sum", "/data/a"),
        job("k2", "alice", "other", "/data/b"),
        job("k3", "bob", "sum", "/data/c"),
    ] {
        assert!(q.submit(j).await.expect("submit").created);
    }
    let paths = ["/data/a", "/data/b", "/data/c", "/data/d"].map(String::from).to_vec();
    let fired = q.fired_paths("alice".into(), "sum".into(), paths.clone()).await.expect("query");
    assert_eq!(fired, ["/data/a"], "another function's and another owner's jobs are not this one's");
    let id = q.list(10).await.expect("list").into_iter().find(|j| j.event.path == "/data/a").expect("a").id;
    q.act(id, Action::Remove, "gone".into()).await.expect("remove");
    assert_eq!(q.fired_paths("alice".into(), "sum".into(), paths).await.expect("query"), ["/data/a"], "any state");
}
