//! Lineage through both audit trails on the real stack: `a` runs on uploads, `b` on
//! `a`'s outputs. The lineage of `b`'s output leads back: `b`'s job ← the event about `a`'s
//! output (caused by `a`'s job) ← `a`'s job ← the upload event and the rule that matched it,
//! with both jobs' token `jti`s, module digests and macaroon identifiers. A token's records
//! are everything it allowed and what it did. Both trails verify, online and as a copy.

use htfaas::stack::demo_manifest;
use htfaas_functions::audit::AuditFilter;
use htfaas_functions::manifest::Trigger;
use htfaas_functions::proto::{JobRecord, JobState, LineageRelation, LineageStep};
use htfaas_tests::{start_stack, upload_checksum, wait_for};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);
const UPLOAD: &str = "/data/in/x.dat";
const A_OUT: &str = "/data/a/x.dat.checksums.json";
const B_OUT: &str = "/data/b/x.dat.checksums.json.checksums.json";

fn kinds(step: &LineageStep) -> Vec<(&str, &str)> {
    step.records.iter().map(|r| (r.writer.as_str(), r.kind.as_str())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_written_files_lineage_leads_back_to_the_upload_the_rules_and_the_tokens() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let digest = upload_checksum(&client).await;
    let rule_a = r#"path glob "/data/in/**""#;
    let rule_b = r#"path glob "/data/a/**""#;
    for (name, rule, out) in [("a", rule_a, "/data/a/"), ("b", rule_b, "/data/b/")] {
        let mut m = demo_manifest(digest.clone());
        m.name = name.into();
        m.trigger = Trigger::on_rule(rule);
        m.outputs.dir = out.into();
        client.register(&m).await.expect("register");
    }
    client.put_bytes(b"lineage".to_vec(), UPLOAD).await.expect("put");
    wait_for("b's output", LIMIT, || async { client.get_bytes(B_OUT).await.expect("get") }).await;
    let jobs: Vec<JobRecord> = wait_for("two completed jobs", LIMIT, || async {
        let jobs = client.jobs().await.ok()?;
        (jobs.len() == 2 && jobs.iter().all(|j| j.state == JobState::Completed)).then_some(jobs)
    })
    .await;
    let job = |f: &str| jobs.iter().find(|j| j.function == f).expect("job").clone();
    let (a, b) = (job("a"), job("b"));
    assert_ne!(a.token_jti, b.token_jti);

    let lineage = client.lineage(B_OUT).await.expect("lineage");
    assert_eq!(lineage.file, B_OUT);
    assert!(!lineage.truncated);
    assert_eq!(lineage.steps.len(), 2, "{lineage:#?}");
    let (sb, sa) = (&lineage.steps[0], &lineage.steps[1]);

    // b's job wrote the file; it ran on the event about a's output, which a's job caused.
    assert_eq!((sb.depth, sb.relation, sb.file.as_str()), (0, LineageRelation::Wrote, B_OUT));
    assert_eq!(sb.job, b.id);
    assert_eq!(sb.function.as_deref(), Some("b"));
    assert_eq!(sb.digest.as_deref(), Some(digest.as_str()));
    assert_eq!(sb.token_jti.as_deref(), Some(b.token_jti.as_str()));
    assert_eq!(sb.event_id.as_deref(), Some(b.event.id.as_str()));
    assert_eq!(sb.input.as_deref(), Some(A_OUT));
    assert_eq!(sb.outputs, [B_OUT]);
    assert_eq!(sb.rule.as_deref(), Some(rule_b));
    let cause = sb.caused_by.clone().expect("b's event names a's job");
    assert_eq!((cause.function.as_str(), cause.event_id.as_str()), ("a", a.event.id.as_str()));
    assert_eq!(cause.digest, digest);
    assert_eq!(sb.macaroons.len(), 2, "read and write: {sb:#?}");

    // a's job wrote b's input; it ran on the upload, matched by a's rule.
    assert_eq!((sa.depth, sa.relation, sa.file.as_str()), (1, LineageRelation::Wrote, A_OUT));
    assert_eq!(sa.job, a.id);
    assert_eq!(sa.function.as_deref(), Some("a"));
    assert_eq!(sa.digest.as_deref(), Some(digest.as_str()));
    assert_eq!(sa.token_jti.as_deref(), Some(a.token_jti.as_str()));
    assert_eq!(sa.event_id.as_deref(), Some(a.event.id.as_str()));
    assert_eq!(sa.input.as_deref(), Some(UPLOAD));
    assert_eq!(sa.outputs, [A_OUT]);
    assert_eq!(sa.rule.as_deref(), Some(rule_a));
    assert_eq!(sa.caused_by, None, "the upload was a user's");
    assert_eq!(sa.macaroons.len(), 2);
    assert!(sa.macaroons.iter().all(|m| !sb.macaroons.contains(m)), "each job has its own macaroons");

    // Each step holds both trails' records of its job, the gateway's first.
    for (step, job) in [(sb, &b), (sa, &a)] {
        let k = kinds(step);
        for expected in [
            ("gateway", "event.matched"),
            ("gateway", "token.minted"),
            ("gateway", "macaroons.obtained"),
            ("scheduler", "job.accepted"),
            ("scheduler", "job.dispatched"),
            ("scheduler", "job.finished"),
        ] {
            assert!(k.contains(&expected), "{expected:?} missing from {k:?}");
        }
        assert_eq!(
            &k[..3],
            [("gateway", "event.matched"), ("gateway", "token.minted"), ("gateway", "macaroons.obtained")]
        );
        let matched = step.records.iter().find(|r| r.kind.as_str() == "event.matched").expect("matched");
        assert_eq!(matched.detail["event"]["path"], job.event.path.as_str());
        let minted = step.records.iter().find(|r| r.kind.as_str() == "token.minted").expect("minted");
        assert_eq!(minted.detail["jobs"], 1);
        assert_eq!(minted.subject.token_jti.as_deref(), Some(job.token_jti.as_str()));
    }
    // The upload of a's output names the write macaroon the gateway obtained for a's job.
    let b_event = sb.records.iter().find(|r| r.kind.as_str() == "event.matched").expect("b's event");
    let a_write = sa.records.iter().find(|r| r.kind.as_str() == "macaroons.obtained").expect("a's macaroons");
    let a_write_id = a_write.detail["macaroons"]
        .as_array()
        .expect("list")
        .iter()
        .find(|m| m["role"] == "write")
        .expect("write macaroon")["identifier"]
        .clone();
    assert_eq!(b_event.detail["event"]["macaroon"], a_write_id);

    // The upload itself: only a read it.
    let upload = client.lineage(UPLOAD).await.expect("lineage of the upload");
    let read: Vec<_> = upload.steps.iter().map(|s| (s.relation, s.job.as_str())).collect();
    assert_eq!(read, [(LineageRelation::Read, a.id.as_str())]);

    // Everything a's token allowed and what it did, from both trails.
    let by_token = AuditFilter { token: Some(a.token_jti.clone()), ..AuditFilter::default() };
    let records = client.audit_both(&by_token).await.expect("audit --token");
    let k: Vec<(&str, &str)> = records.iter().map(|r| (r.writer.as_str(), r.kind.as_str())).collect();
    assert_eq!(
        k,
        [
            ("gateway", "token.minted"),
            ("gateway", "macaroons.obtained"),
            ("scheduler", "job.accepted"),
            ("scheduler", "job.dispatched"),
            ("scheduler", "job.finished"),
        ],
        "{records:#?}"
    );
    let finished = &records[4];
    assert_eq!(finished.detail["outputs"][0]["path"], A_OUT);
    let text = serde_json::to_string(&records).expect("json");
    assert!(!text.contains("eyJ"), "no JWT in any record");

    // Both trails verify online; the gateway's copy verifies offline with the published keys.
    let g = client.audit_verify_gateway().await.expect("verify gateway");
    assert!(g.ok() && g.records >= 7, "{g:?}");
    assert!(client.audit_verify().await.expect("verify scheduler").ok());
    let keys = dir.path().join("audit-keys.json");
    std::fs::write(&keys, client.audit_keys().await.expect("keys").to_string()).expect("write keys");
    stack.stop().await.expect("clean stop");
    let db = dir.path().join("gateway/firings.sqlite");
    let copy = dir.path().join("gateway-copy.sqlite");
    std::fs::copy(&db, &copy).expect("copy");
    if let Ok(wal) = std::fs::read(db.with_extension("sqlite-wal")) {
        std::fs::write(copy.with_extension("sqlite-wal"), wal).expect("copy the WAL");
    }
    let report = htfaas::client::verify_trail_file(&copy, &keys).expect("verify the copy");
    assert!(report.ok(), "{report:?}");
    assert_eq!(report.last_checkpoint_seq, Some(report.last_seq), "signed at shutdown: {report:?}");
}
