//! The store's sealing, across its files: what a reader of the file finds (nothing usable),
//! what dispatch hands out (the originals), what an older build's rows become when the store
//! opens, and what a writer of the file gains by moving a sealed request to another job
//! (nothing). The sealing itself is `crate::seal`'s.

use super::*;
use crate::testing::{new_job, request};
use htfaas_functions::store::Durability;
use rusqlite::{Connection, params};

/// Writes `request` as job `id`'s stored request, marked as an older build left it (not
/// sealed for its job), as a writer of the file could.
fn store_unsealed(path: &std::path::Path, id: &str, request: &str) {
    let conn = Connection::open(path).expect("open");
    conn.execute(
        "UPDATE job_requests SET request = ?2 WHERE seq = (SELECT seq FROM jobs WHERE id = ?1)",
        params![id, request],
    )
    .expect("write the request");
    conn.execute("UPDATE jobs SET sealed_for_job = 0 WHERE id = ?1", params![id]).expect("mark it unsealed");
}

/// A reader of the job store's file finds no usable macaroon (each is sealed
/// under the key beside it); dispatch still hands out the originals; a plain one written by
/// an older build is read as it is and sealed when the store next opens.
#[tokio::test]
async fn stored_macaroons_are_sealed_and_an_older_builds_plain_ones_are_sealed_at_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("q.db");
    let q = Queue::open(&path).expect("open");
    let job = new_job("k1", "t1", 2);
    let (read, write) =
        (job.request.input.as_ref().expect("an input").macaroon.clone(), job.request.output.macaroon.clone());
    let first = q.submit(job).await.expect("submit").job_id;
    let raw = || -> String {
        Connection::open(&path)
            .expect("a reader of the file")
            .query_row("SELECT group_concat(request, ' ') FROM job_requests", [], |r| r.get(0))
            .expect("requests")
    };
    let stored = raw();
    assert!(!stored.contains(&read) && !stored.contains(&write), "{stored}");
    assert!(stored.contains(crate::seal::PREFIX), "{stored}");
    let marked = q.mark_running(vec![first], "ep".into(), "s1".into(), |a, _| Ok(a)).await.expect("mark");
    assert_eq!(
        (&marked.assigned[0].input.as_ref().expect("an input").macaroon, &marked.assigned[0].output.macaroon),
        (&read, &write)
    );

    // An older build's row: the same request in plain.
    let second = q.submit(new_job("k2", "t2", 1)).await.expect("submit").job_id;
    let plain = serde_json::to_string(&request("k2")).expect("json");
    store_unsealed(&path, &second, &plain);
    assert!(raw().contains(&read), "the plain row is there");
    let reopened = Queue::open(&path).expect("reopen");
    assert!(!raw().contains(&read), "sealed at open: {}", raw());
    let marked = reopened.mark_running(vec![second], "ep".into(), "s2".into(), |a, _| Ok(a)).await.expect("mark");
    assert_eq!(marked.assigned[0].input.as_ref().expect("an input").macaroon, read);

    // An older build's row sealed without its job is sealed again for it at open.
    let unbound_id = q.submit(new_job("k4", "t4", 1)).await.expect("submit").job_id;
    let sealer = crate::seal::Sealer::load_or_create(&crate::seal::default_key_file(&path)).expect("key");
    let mut unbound = request("k4");
    unbound.input.as_mut().expect("an input").macaroon =
        sealer.seal("input", &unbound.input.as_ref().expect("an input").macaroon).expect("seal");
    unbound.output.macaroon = sealer.seal("output", &unbound.output.macaroon).expect("seal");
    store_unsealed(&path, &unbound_id, &serde_json::to_string(&unbound).expect("json"));
    let reopened = Queue::open(&path).expect("reopen");
    let marked = reopened.mark_running(vec![unbound_id], "ep".into(), "s4".into(), |a, _| Ok(a)).await.expect("mark");
    assert_eq!(marked.assigned[0].input.as_ref().expect("an input").macaroon, read, "rebound and opened");

    // A job's sealed request moved to another job (a writer of the file giving its own job
    // someone else's macaroons and secrets) does not open: the job fails at dispatch.
    let victim = q.submit(new_job("k5", "t5", 1)).await.expect("submit").job_id;
    let thief = q.submit(new_job("k6", "t6", 1)).await.expect("submit").job_id;
    let conn = Connection::open(&path).expect("open");
    conn.execute(
        "UPDATE job_requests SET request = (SELECT request FROM jobs JOIN job_requests USING (seq) WHERE id = ?1) \
         WHERE seq = (SELECT seq FROM jobs WHERE id = ?2)",
        params![victim, thief],
    )
    .expect("move");
    let reopened = Queue::open(&path).expect("reopen");
    let marked = reopened.mark_running(vec![thief], "ep".into(), "s5".into(), |a, _| Ok(a)).await.expect("mark");
    assert!(marked.assigned.is_empty(), "a moved request opened: {:?}", marked.assigned);

    // Another key opens nothing: the job fails at dispatch, naming why.
    let third = q.submit(new_job("k3", "t3", 1)).await.expect("submit").job_id;
    std::fs::write(dir.path().join("other.key"), hex::encode([9u8; 32])).expect("key");
    let wrong = Queue::open_sealed(&path, Durability::Fsync, &dir.path().join("other.key")).expect("open");
    let marked = wrong.mark_running(vec![third], "ep".into(), "s3".into(), |a, _| Ok(a)).await.expect("mark");
    assert!(marked.assigned.is_empty(), "{:?}", marked.assigned);
}
