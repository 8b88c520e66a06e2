//! The loop guard through the whole stack: a file written by a job carries its
//! provenance (the storage names the write macaroon in the billing `subject`, and the gateway
//! knows which job it obtained that macaroon for), so it never fires a function of its own chain
//! again, while a chain to another function runs and is recorded in the job's event.
//!
//! `a` fires on everything under `/data/`, `b` on `a`'s outputs, `c` on `b`'s outputs; each
//! writes checksums into its own directory. One upload must run exactly `a`, then `b` (caused
//! by `a`), then `c` (caused by `b`, chain `a, b`): `a` matches the outputs of `b` and `c` too,
//! and only the guard keeps it from running on them (they are outside `a`'s own output
//! directory, so the older directory rule does not).

use htfaas::stack::demo_manifest;
use htfaas_functions::manifest::Trigger;
use htfaas_functions::proto::{JobRecord, JobState};
use htfaas_tests::{start_stack, upload_checksum, wait_for};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_functions_runs_once_each_and_never_loops_back() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let digest = upload_checksum(&client).await;
    for (name, rule, out) in [
        ("a", r#"path glob "/data/**""#, "/data/a/"),
        ("b", r#"path glob "/data/a/**""#, "/data/b/"),
        ("c", r#"path glob "/data/b/**""#, "/data/c/"),
    ] {
        let mut m = demo_manifest(digest.clone());
        m.name = name.into();
        m.trigger = Trigger::on_rule(rule);
        m.outputs.dir = out.into();
        client.register(&m).await.expect("register");
    }

    client.put_bytes(b"the first file".to_vec(), "/data/in/x.dat").await.expect("put");
    // `c`'s output is the last file of the chain; its event is the last one to decide.
    wait_for("c's output", LIMIT, || async {
        client.get_bytes("/data/c/x.dat.checksums.json.checksums.json.checksums.json").await.expect("get")
    })
    .await;
    // Every upload (the input and three outputs) has been decided and nothing is pending.
    wait_for("the gateway to decide the four uploads", LIMIT, || async {
        let s = client.stats().await.ok()?;
        (s.events_received >= 4 && s.firings_pending == 0).then_some(())
    })
    .await;
    let jobs: Vec<JobRecord> = wait_for("three completed jobs", LIMIT, || async {
        let jobs = client.jobs().await.ok()?;
        (jobs.len() >= 3 && jobs.iter().all(|j| j.state == JobState::Completed)).then_some(jobs)
    })
    .await;
    let mut ran: Vec<(String, String)> = jobs.iter().map(|j| (j.function.clone(), j.event.path.clone())).collect();
    ran.sort();
    assert_eq!(
        ran,
        [
            ("a".to_owned(), "/data/in/x.dat".to_owned()),
            ("b".to_owned(), "/data/a/x.dat.checksums.json".to_owned()),
            ("c".to_owned(), "/data/b/x.dat.checksums.json.checksums.json".to_owned()),
        ],
        "a never ran on b's or c's output: {jobs:#?}"
    );

    let job = |f: &str| jobs.iter().find(|j| j.function == f).expect("job");
    assert_eq!(job("a").event.caused_by, None, "the upload was a user's");
    let by_a = job("b").event.caused_by.clone().expect("b's event was caused by a's job");
    assert_eq!((by_a.function.as_str(), by_a.chain.as_slice()), ("a", ["a".to_owned()].as_slice()));
    assert_eq!(by_a.event_id, job("a").event.id);
    assert_eq!(by_a.digest, digest);
    let by_b = job("c").event.caused_by.clone().expect("c's event was caused by b's job");
    assert_eq!(by_b.function, "b");
    assert_eq!(by_b.chain, ["a", "b"]);
    assert_eq!(by_b.event_id, job("b").event.id);
    stack.stop().await.expect("clean stop");
}
