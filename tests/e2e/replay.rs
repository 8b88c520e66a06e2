//! Replay and dry-run over recorded events, through the whole stack and its HTTP API
//! (`htfaas::client::Client`, as `htfaas events replay`, `htfaas fn test` and `htfaas fn
//! register --dry-run` use it): function `a` on `/data/raw/**` runs on some dCache transfer
//! writes (others do not match, one is malformed); then a dry run over the recorded events lists
//! exactly the (event, `a`) pairs that fired and starts nothing, and a limit cuts it with a point
//! to resume from; `fn test` says true and false for a matching and a non-matching event, given
//! (their bytes) or recorded (`seq`); a dry-run registration of `b` lists exactly the subset its
//! rule matches and registers nothing; a replay of `a` starts one new job per matching event, a
//! second replay (a fresh id) again, the same replay re-issued (same id) nothing, and the
//! original jobs stay as they were.

use htfaas::stack::demo_manifest;
use htfaas_functions::manifest::Trigger;
use htfaas_functions::proto::{
    EVENTS_SUBJECT, JobRecord, JobState, RegisterQuery, ReplayRequest, Report, TestRequest, TimeArg,
};
use htfaas_functions::{Digest, FunctionManifest};
use htfaas_tests::{start_stack, wait_for};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// A guest that ends at once, successfully, writing nothing (so no output event follows).
const NOOP_WAT: &str = r#"(module (memory (export "memory") 1) (func (export "_start")))"#;

/// The demo manifest renamed to `name`, with `trigger`, writing to `/out/<name>/`.
fn function(module: &Digest, name: &str, trigger: Trigger) -> FunctionManifest {
    let mut m = demo_manifest(module.clone());
    m.name = name.into();
    m.trigger = trigger;
    m.outputs.dir = format!("/out/{name}/");
    m
}

/// A successful dCache `transfer` write of `path` with `size` (its own door session, so its own
/// event id).
fn transfer_write(path: &str, size: u64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "version": "1.0", "msgType": "transfer", "isWrite": "write", "isP2p": false,
        "status": {"code": 0, "msg": ""}, "cellName": "pool-a", "cellDomain": "poolDomain",
        "transferPath": path, "pnfsid": "0000BEEF", "session": format!("session-{path}"), "fileSize": size,
    }))
    .expect("json")
}

/// Now, in Unix seconds.
fn now_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_secs()
}

/// `function`'s jobs, once `n` of them have finished.
async fn finished_jobs(client: &htfaas::client::Client, function: &str, n: usize) -> Vec<JobRecord> {
    wait_for(&format!("{n} finished jobs of {function}"), LIMIT, || async {
        let jobs: Vec<JobRecord> =
            client.jobs().await.expect("jobs").into_iter().filter(|j| j.function == function).collect();
        (jobs.len() >= n && jobs.iter().all(|j| matches!(j.state, JobState::Completed | JobState::Failed)))
            .then_some(jobs)
    })
    .await
}

/// The listed pairs as sorted (function, path).
fn pairs(report: &Report) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = report.pairs.iter().map(|p| (p.function.clone(), p.path.clone())).collect();
    pairs.sort();
    pairs
}

/// Each job's input path, sorted.
fn paths(jobs: &[JobRecord]) -> Vec<String> {
    let mut paths: Vec<String> = jobs.iter().map(|j| j.event.path.clone()).collect();
    paths.sort();
    paths
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_events_are_dry_run_tested_and_replayed() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    htfaas_tests::grant_out(&client).await;
    let noop = client.upload_module(wat::parse_str(NOOP_WAT).expect("wat")).await.expect("upload");
    client.register(&function(&noop, "a", Trigger::on_path("/data/raw/**"))).await.expect("register a");

    // The publishes are recorded after `since` (the stream's clock is this host's).
    let since_s = now_s() - 2;
    let matching = ["/data/raw/one.h5", "/data/raw/sub/three.h5", "/data/raw/two.dat"];
    let mut seq = std::collections::BTreeMap::new();
    let mut published = std::collections::BTreeMap::new();
    for (name, bytes) in [
        ("one", transfer_write("/data/raw/one.h5", 5000)),
        ("other", transfer_write("/data/other/x.h5", 5000)),
        ("two", transfer_write("/data/raw/two.dat", 10)),
        ("garbage", b"{not json".to_vec()),
        ("three", transfer_write("/data/raw/sub/three.h5", 3000)),
    ] {
        seq.insert(name, client.publish_event(EVENTS_SUBJECT, bytes.clone()).await.expect("publish"));
        published.insert(name, bytes);
    }
    let original = finished_jobs(&client, "a", 3).await;
    assert_eq!(paths(&original), matching, "{original:#?}");
    let a_pairs: Vec<(String, String)> = matching.iter().map(|p| ("a".to_owned(), p.to_string())).collect();

    // (1) A dry run over every function since before the publishes: exactly the matching
    // (event, a) pairs, the malformed message counted; nothing is started.
    let request = ReplayRequest {
        since: TimeArg::Unix(since_s),
        until: None,
        function: None,
        dry_run: true,
        limit: None,
        replay_id: None,
    };
    let stats_before = client.stats().await.expect("stats");
    let dry = client.replay(&request).await.expect("dry run");
    assert_eq!(pairs(&dry), a_pairs, "{dry:#?}");
    assert_eq!((dry.scanned, dry.parsed, dry.malformed, dry.matched, dry.fired), (5, 4, 1, 3, 0), "{dry:#?}");
    assert!(dry.dry_run && dry.replay_id.is_none() && dry.stopped.is_none(), "{dry:#?}");
    let one = dry.pairs.iter().find(|p| p.path == "/data/raw/one.h5").expect("one.h5 listed");
    assert_eq!((one.seq, one.kind.as_str(), one.msg_type.as_str(), one.version), (seq["one"], "write", "transfer", 1));
    let one_job = original.iter().find(|j| j.event.path == "/data/raw/one.h5").expect("one.h5 ran");
    assert_eq!(one.event_id, one_job.event.id, "the dry run names the event the job ran on");
    // A limit cuts the read, and says where to resume.
    let limited = ReplayRequest { limit: Some(2), ..request.clone() };
    let cut = client.replay(&limited).await.expect("cut");
    assert_eq!((cut.scanned, pairs(&cut)), (2, vec![a_pairs[0].clone()]), "{cut:#?}");
    assert!(cut.stopped.as_deref().is_some_and(|s| s.contains("limit of 2")), "{cut:#?}");
    let resume = cut.resume_since.clone().expect("a resume point");
    // Continuing from there (the last message read is read again) lists what the cut left out.
    let rest = client.replay(&ReplayRequest { since: TimeArg::Text(resume), ..request.clone() }).await.expect("rest");
    assert!(rest.stopped.is_none(), "{rest:#?}");
    for left_out in &a_pairs[1..] {
        assert!(pairs(&rest).contains(left_out), "{left_out:?} after the resume point: {rest:#?}");
    }
    // A dry run queues no firing (the only way a job starts), so none can start later either.
    let stats = client.stats().await.expect("stats");
    assert_eq!(
        (stats.firings_queued, stats.jobs_submitted),
        (stats_before.firings_queued, stats_before.jobs_submitted),
        "a dry run queues nothing"
    );
    assert_eq!(client.jobs().await.expect("jobs").len(), 3, "a dry run starts no job");

    // (2) `fn test` of a with a matching and a non-matching event: given (the bytes that were
    // recorded) and recorded (`seq`, as `htfaas fn test --seq`).
    let given = |name: &str| TestRequest {
        subject: None,
        headers: Default::default(),
        event: Some(serde_json::from_slice(&published[name]).unwrap_or_else(|_| serde_json::json!("{not json"))),
        seq: None,
    };
    let recorded =
        |name: &str| TestRequest { subject: None, headers: Default::default(), event: None, seq: Some(seq[name]) };
    for (form, request) in [("given", given("one")), ("recorded", recorded("one"))] {
        let yes = client.test_function("a", &request).await.expect("test one");
        assert_eq!(
            (yes.outcome.as_str(), yes.verdict.as_deref(), yes.fires),
            ("event", Some("true"), true),
            "{form}: {yes:#?}"
        );
        assert_eq!(yes.event.as_ref().map(|e| e.path.as_str()), Some("/data/raw/one.h5"), "{form}");
    }
    let yes = client.test_function("a", &recorded("one")).await.expect("test one by seq");
    let message = yes.event.and_then(|e| e.source.message);
    assert_eq!(message, Some(format!("nats-seq-{}", seq["one"])), "a recorded message is named by its sequence");
    for (form, request) in [("given", given("other")), ("recorded", recorded("other"))] {
        let no = client.test_function("a", &request).await.expect("test other");
        assert_eq!(
            (no.outcome.as_str(), no.verdict.as_deref(), no.fires),
            ("event", Some("false"), false),
            "{form}: {no:#?}"
        );
        assert_eq!(no.parts.iter().map(|p| p.verdict.as_str()).collect::<Vec<_>>(), ["false"], "{form}: {no:#?}");
    }
    for (form, request) in [("given", given("garbage")), ("recorded", recorded("garbage"))] {
        let bad = client.test_function("a", &request).await.expect("test garbage");
        assert_eq!(
            (bad.outcome.as_str(), bad.verdict.as_deref(), bad.fires),
            ("malformed", None, false),
            "{form}: {bad:#?}"
        );
    }
    let err = client.test_function("nope", &given("one")).await.expect_err("unknown function");
    assert!(format!("{err:#}").contains("404"), "{err:#}");
    let missing = TestRequest { seq: Some(seq["three"] + 1000), ..recorded("one") };
    let err = client.test_function("a", &missing).await.expect_err("no such recorded message");
    assert!(format!("{err:#}").contains("404"), "{err:#}");

    // (3) A dry-run registration of b, whose rule matches a subset: exactly that subset, and b
    // is not registered afterwards.
    let b = function(&noop, "b", Trigger::on_rule(r#"path prefix "/data/raw/" and name suffix ".h5""#));
    b.validate().expect("b is a valid manifest");
    let query = RegisterQuery { dry_run: true, since: Some(since_s.to_string()), until: None, limit: None };
    let b_dry = client.register_dry_run(&b, &query).await.expect("dry b");
    let b_pairs: Vec<(String, String)> =
        ["/data/raw/one.h5", "/data/raw/sub/three.h5"].iter().map(|p| ("b".to_owned(), p.to_string())).collect();
    assert_eq!(pairs(&b_dry), b_pairs, "{b_dry:#?}");
    assert!(b_dry.dry_run && b_dry.pairs.iter().all(|p| p.version == 0), "a candidate has no version: {b_dry:#?}");
    let names: Vec<String> =
        client.functions().await.expect("functions").into_iter().map(|f| f.manifest.name).collect();
    assert_eq!(names, ["a"], "b was not registered");

    // (4) A replay of a: one new job per matching event; a second replay (a fresh id) again; the
    // same replay re-issued (same id) nothing; the original jobs untouched.
    let replay_a = ReplayRequest { function: Some("a".into()), dry_run: false, ..request.clone() };
    let mut ids = Vec::new();
    for round in 1..=2usize {
        let report = client.replay(&replay_a).await.expect("replay");
        assert_eq!((report.matched, report.fired, report.failures), (3, 3, 0), "{report:#?}");
        assert!(!report.dry_run, "{report:#?}");
        let id = report.replay_id.clone().expect("a replay has an id");
        ids.push(id);
        assert!(report.pairs.iter().all(|p| p.fired == Some(true)), "{report:#?}");
        let jobs = finished_jobs(&client, "a", 3 * (round + 1)).await;
        assert_eq!(jobs.len(), 3 * (round + 1), "one new job per matching event: {jobs:#?}");
        let mut want: Vec<String> = matching.iter().flat_map(|p| vec![p.to_string(); round + 1]).collect();
        want.sort();
        assert_eq!(paths(&jobs), want);
    }
    assert_ne!(ids[0], ids[1], "each replay has a fresh id");
    let deduplicated = client.stats().await.expect("stats").jobs_deduplicated;
    let again = ReplayRequest { replay_id: Some(ids[1].clone()), ..replay_a.clone() };
    let report = client.replay(&again).await.expect("again");
    assert_eq!((report.matched, report.failures), (3, 0), "{report:#?}");
    assert_eq!(report.replay_id.as_deref(), Some(ids[1].as_str()));
    assert_eq!(
        client.stats().await.expect("stats").jobs_deduplicated,
        deduplicated + 3,
        "the same replay id finds its firings taken"
    );
    // The replay answers once its submits are answered: all three were found taken, so no job
    // can come of it later.
    let jobs = client.jobs().await.expect("jobs");
    assert_eq!(jobs.len(), 9, "re-issuing a replay starts nothing twice: {jobs:#?}");
    for job in &original {
        let now = jobs.iter().find(|j| j.id == job.id).expect("the original job is still there");
        assert_eq!((now.state, now.attempts, now.finished_at_ms), (job.state, job.attempts, job.finished_at_ms));
    }
    stack.stop().await.expect("clean stop");
}
