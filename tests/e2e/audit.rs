//! The audit trail on the real stack: an upload's job leaves its records in the scheduler's
//! store (accepted, dispatched, finished with the input read and the outputs written), found by the input's
//! path and by the job; the trail verifies online and, copied, offline; a record altered in a
//! copy is named by the offline verify, and a tail cut off with its checkpoints by the verify
//! against a head recorded elsewhere.

use htfaas::client::verify_trail_file;
use htfaas_functions::audit::rusqlite::Connection;
use htfaas_functions::audit::{AuditFilter, ProblemKind};
use htfaas_functions::proto::JobState;
use htfaas_tests::{guest_wasm, start_stack};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);
const EXPECTED: [&str; 3] = ["job.accepted", "job.dispatched", "job.finished"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_processed_files_lineage_is_in_the_trail_and_a_tampered_copy_is_caught() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    htfaas::stack::demo(&client, &guest_wasm("checksum"), LIMIT).await.expect("demo path");
    // The output is stored before the EP reports the job's end: wait for the end to be recorded.
    let job = htfaas_tests::wait_for("a completed job", LIMIT, || async {
        client.jobs().await.ok()?.into_iter().find(|j| j.state == JobState::Completed)
    })
    .await;
    let job = &job;
    let input = job.event.path.clone();

    let by_file = client.audit(&AuditFilter { file: Some(input.clone()), ..AuditFilter::default() }).await.expect("q");
    let kinds: Vec<&str> = by_file.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(kinds, EXPECTED, "{by_file:#?}");
    let by_job = client.audit(&AuditFilter { job: Some(job.id.clone()), ..AuditFilter::default() }).await.expect("q");
    assert_eq!(by_job, by_file);
    for r in &by_job {
        assert_eq!(r.subject.token_jti.as_deref(), Some(job.token_jti.as_str()), "{r:?}");
        assert_eq!(r.subject.owner.as_deref(), Some("alice"), "{r:?}");
    }
    let written = &by_job[2];
    assert_eq!(written.detail["outputs"][0]["path"], job.outputs[0].path.as_str());
    assert_eq!(written.detail["outputs"][0]["sha256"], job.outputs[0].sha256.as_str());
    assert_eq!(written.actor.as_deref(), Some("ep-local-1"));
    // The output leads back to the job that wrote it (the job's every record goes with it), its
    // token and its input.
    let by_output =
        client.audit(&AuditFilter { file: Some(job.outputs[0].path.clone()), ..AuditFilter::default() }).await;
    assert_eq!(by_output.expect("q"), by_job);

    let report = client.audit_verify().await.expect("verify");
    assert!(report.ok() && report.records >= 3, "{report:?}");
    let keys = dir.path().join("audit-keys.json");
    std::fs::write(&keys, client.audit_keys().await.expect("keys").to_string()).expect("write keys");
    let input_read = by_job[2].seq;
    assert_eq!(by_job[2].detail["input"]["path"], input.as_str());
    stack.stop().await.expect("clean stop");

    // A copy of the scheduler's store verifies offline, signed to its last record at shutdown.
    let store = dir.path().join("scheduler/jobs.sqlite");
    let copy = dir.path().join("copy.sqlite");
    std::fs::copy(&store, &copy).expect("copy the store");
    if let Ok(wal) = std::fs::read(store.with_extension("sqlite-wal")) {
        std::fs::write(copy.with_extension("sqlite-wal"), wal).expect("copy the WAL");
    }
    let clean = verify_trail_file(&copy, &keys).expect("verify the copy");
    assert!(clean.ok(), "{clean:?}");
    assert_eq!(clean.last_checkpoint_seq, Some(clean.last_seq), "{clean:?}");

    // The tail cut off together with its checkpoints: every record and checkpoint
    // left is valid, so the copy verifies on its own; the head recorded elsewhere catches it.
    let head = htfaas_functions::audit::anchor::head(&copy).expect("head").expect("a record");
    let cut = dir.path().join("cut.sqlite");
    std::fs::copy(&copy, &cut).expect("copy");
    let keep = i64::try_from(input_read).expect("seq") - 1;
    {
        let conn = Connection::open(&cut).expect("open the cut copy");
        conn.execute_batch(
            "DROP TRIGGER audit_records_append_only_d; DROP TRIGGER audit_record_paths_append_only_d;
             DROP TRIGGER audit_checkpoints_append_only_d;",
        )
        .expect("drop the guards");
        conn.execute("DELETE FROM audit_records WHERE seq > ?1", [keep]).expect("cut the records");
        conn.execute("DELETE FROM audit_record_paths WHERE seq > ?1", [keep]).expect("cut their paths");
        conn.execute("DELETE FROM audit_checkpoints WHERE seq > ?1", [keep]).expect("cut the checkpoints");
    }
    assert!(verify_trail_file(&cut, &keys).expect("verify the cut copy").ok(), "verify alone cannot see a cut");
    let anchored = htfaas::client::verify_trail_file_with_head(&cut, &keys, Some(&head)).expect("verify with head");
    let problem = anchored.first_problem.expect("the cut is caught");
    assert_eq!(problem.what, ProblemKind::Truncated, "{problem:?}");
    assert!(problem.message.contains("removed from its end"), "{problem:?}");
    assert!(htfaas::client::verify_trail_file_with_head(&copy, &keys, Some(&head)).expect("verify").ok());

    // Raw SQL on the copy: the finished record now claims fewer bytes read.
    {
        let conn = Connection::open(&copy).expect("open the copy");
        conn.execute_batch("DROP TRIGGER audit_records_append_only_u").expect("drop the guard");
        let seq = i64::try_from(input_read).expect("seq");
        let text: String =
            conn.query_row("SELECT json FROM audit_records WHERE seq = ?1", [seq], |r| r.get(0)).expect("record");
        let mut v: serde_json::Value = serde_json::from_str(&text).expect("json");
        v["detail"]["input"]["bytes"] = 1.into();
        conn.execute("UPDATE audit_records SET json = ?2 WHERE seq = ?1", (seq, v.to_string())).expect("alter");
    }
    let tampered = verify_trail_file(&copy, &keys).expect("verify the tampered copy");
    let problem = tampered.first_problem.expect("the alteration is caught");
    assert_eq!((problem.seq, problem.what), (input_read, ProblemKind::Altered), "{problem:?}");
    assert!(problem.message.contains(&format!("record {input_read} was altered")), "{problem:?}");
}
