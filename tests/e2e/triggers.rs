//! Trigger rules through the whole stack: overlapping rules each fire once on one
//! dCache `transfer` write (fan-out: one job per function); rules with `size >`, `path suffix`
//! and `not` start nothing for an event they refuse, nor when the size they test is unknown;
//! a bad rule is refused at registration over the HTTP API, pointing at its column.

use htfaas::stack::demo_manifest;
use htfaas_functions::FunctionManifest;
use htfaas_functions::manifest::{RateLimit, Trigger};
use htfaas_functions::proto::{EVENTS_SUBJECT, JobState};
use htfaas_tests::{start_stack, wait_for};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// A guest that ends at once, successfully.
const NOOP_WAT: &str = r#"(module (memory (export "memory") 1) (func (export "_start")))"#;

/// The demo manifest renamed to `name`, with `trigger`, writing to `/out/<name>/`.
fn function(module: &htfaas_functions::Digest, name: &str, trigger: Trigger) -> FunctionManifest {
    let mut m = demo_manifest(module.clone());
    m.name = name.into();
    m.trigger = trigger;
    m.outputs.dir = format!("/out/{name}/");
    m
}

/// A successful dCache `transfer` write of `path`, with `size` as its `fileSize` when given.
fn transfer_write(path: &str, size: Option<u64>) -> Vec<u8> {
    let mut v = serde_json::json!({
        "version": "1.0", "msgType": "transfer", "isWrite": "write", "isP2p": false,
        "status": {"code": 0, "msg": ""}, "cellName": "pool-a", "cellDomain": "poolDomain",
        "transferPath": path, "pnfsid": "0000BEEF", "session": format!("session-{path}"),
    });
    if let Some(size) = size {
        v["fileSize"] = size.into();
    }
    serde_json::to_vec(&v).expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_rules_each_fire_once_and_refused_events_start_nothing() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    htfaas_tests::grant_out(&client).await;
    let noop = client.upload_module(wat::parse_str(NOOP_WAT).expect("wat")).await.expect("upload");
    // Overlapping: both `hdf5` and `raw` are true for a large .h5 file under /data/run/.
    let hdf5 =
        function(&noop, "hdf5", Trigger::on_rule(r#"path prefix "/data/" and path suffix ".h5" and size > 1kB"#));
    let mut raw = function(
        &noop,
        "raw",
        Trigger { rule: Some(r#"not name glob "*.tmp""#.into()), ..Trigger::on_path("/data/run/**") },
    );
    // Kept and enforced by the gateway's firing dispatcher: the rate is far above this test's
    // load, and the debounce makes each of `raw`'s firings wait 10 s (one write per path here,
    // so none is superseded).
    raw.trigger.rate = Some(RateLimit { per_s: 50.0, burst: 5 });
    raw.trigger.debounce_s = Some(10);
    let root = function(&noop, "root", Trigger::on_rule(r#"path prefix "/data/" and path suffix ".root""#));
    for m in [&hdf5, &raw, &root] {
        client.register(m).await.expect("register");
    }
    let stored = client.functions().await.expect("functions");
    let stored_raw = stored.iter().find(|f| f.manifest.name == "raw").expect("raw is registered");
    assert_eq!(stored_raw.manifest.trigger, raw.trigger);

    // One upload (the storage publishes its dCache transfer message): one job per matching
    // function, and none for `root`.
    client.put_bytes(vec![7; 2000], "/data/run/a.h5").await.expect("put");
    // Refused events, in order after it:
    for bytes in [
        // `raw`: `not name glob "*.tmp"` is false; `hdf5`: `path suffix ".h5"` is false.
        transfer_write("/data/run/b.tmp", Some(5000)),
        // `hdf5`: `size > 1kB` is false; `raw`: outside its path glob.
        transfer_write("/data/elsewhere/c.h5", Some(10)),
        // `hdf5`: the size is unknown, so `size > 1kB` is undefined, which does not fire.
        transfer_write("/data/elsewhere/d.h5", None),
    ] {
        client.publish_event(EVENTS_SUBJECT, bytes).await.expect("publish");
    }
    // Then another matching upload: once its jobs exist, the events before it were decided.
    client.put_bytes(vec![8; 3000], "/data/run/z.h5").await.expect("put");

    let jobs = wait_for("four finished jobs", LIMIT, || async {
        let jobs = client.jobs().await.expect("jobs");
        (jobs.len() >= 4 && jobs.iter().all(|j| matches!(j.state, JobState::Completed | JobState::Failed)))
            .then_some(jobs)
    })
    .await;
    let mut fired: Vec<(String, String)> = jobs.iter().map(|j| (j.function.clone(), j.event.path.clone())).collect();
    fired.sort();
    assert_eq!(
        fired,
        [
            ("hdf5".to_owned(), "/data/run/a.h5".to_owned()),
            ("hdf5".to_owned(), "/data/run/z.h5".to_owned()),
            ("raw".to_owned(), "/data/run/a.h5".to_owned()),
            ("raw".to_owned(), "/data/run/z.h5".to_owned()),
        ],
        "{jobs:#?}"
    );
    assert!(jobs.iter().all(|j| j.state == JobState::Completed), "{jobs:#?}");
    let stats = client.stats().await.expect("stats");
    assert_eq!(stats.jobs_submitted, 4, "{stats:?}");
    assert!(stats.events_unmatched >= 3, "the three refused events: {stats:?}");
    stack.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_rule_is_refused_at_registration_with_its_column() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    htfaas_tests::grant_out(&client).await;
    let noop = client.upload_module(wat::parse_str(NOOP_WAT).expect("wat")).await.expect("upload");

    let bad = function(&noop, "bad", Trigger::on_rule(r#"path glob and size > 1"#));
    let err = client.register(&bad).await.expect_err("a bad rule is refused");
    let err = format!("{err:#}");
    assert!(err.contains("400"), "{err}");
    assert!(
        err.contains(r#"invalid manifest: trigger.rule: at column 11: expected a string after "glob", found "and""#),
        "{err}"
    );
    for (trigger, want) in [
        (Trigger::on_rule(r#"kind == "upload""#), r#"trigger.rule: at column 9: "upload" is not a kind"#),
        (Trigger::on_rule("size > 1 and (size < 5"), r#"trigger.rule: at column 23: expected ")""#),
        (Trigger::on_path(""), "trigger: needs a path glob, a rule, or both"),
        (Trigger { rate: Some(RateLimit { per_s: 0.0, burst: 1 }), ..Trigger::on_path("/data/**") }, "trigger.rate"),
    ] {
        let err = client.register(&function(&noop, "bad", trigger)).await.expect_err("refused");
        let err = format!("{err:#}");
        assert!(err.contains("400") && err.contains(want), "{want}: {err}");
    }
    assert!(client.functions().await.expect("functions").is_empty(), "nothing was registered");
    // A good rule is accepted.
    client
        .register(&function(&noop, "good", Trigger::on_rule(r#"path prefix "/data/" and name suffix ".h5""#)))
        .await
        .expect("register");
    stack.stop().await.expect("clean stop");
}
