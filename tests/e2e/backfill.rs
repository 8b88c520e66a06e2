//! Back-fill on the real stack: files that landed while no function was there to
//! fire (their events never read by the owner's lane: lost to the function) are found by listing the
//! storage (WebDAV `PROPFIND`, the built-in storage) and fired once each. A dry run lists them
//! and starts nothing; files younger than the minimum age are left; a file the function already
//! fired on, and a file its trigger does not fire on, are left; a second back-fill fires nothing.
//! Who may back-fill what: `attacks::backfill`.

use crate::failures::final_job;
use htfaas::stack::demo_manifest;
use htfaas_functions::manifest::Trigger;
use htfaas_functions::proto::{BackfillReport, BackfillRequest, JobState};
use htfaas_tests::{htfaas_binary, start_stack, upload_checksum};

const PREFIX: &str = "/data/raw/lost/";
const LOST: [&str; 3] = ["/data/raw/lost/a.dat", "/data/raw/lost/sub/b.dat", "/data/raw/lost/c.txt"];
const LIVE: &str = "/data/raw/lost/d.dat";

fn request(dry_run: bool, min_age_s: Option<u64>) -> BackfillRequest {
    BackfillRequest { function: "checksum".into(), prefix: PREFIX.into(), dry_run, min_age_s }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_fires_once_on_each_file_that_never_fired_the_function() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let digest = upload_checksum(&client).await;
    // Three files land while nothing is registered: their events are in the stream once the
    // uploads are answered, and the owner's lane, made at the registration, starts after them
    // (`gateway::lanes`): lost to the function.
    for path in LOST {
        client.put_bytes(path.as_bytes().to_vec(), path).await.expect("put");
    }
    let mut m = demo_manifest(digest);
    m.trigger = Trigger::on_rule(r#"path glob "/data/raw/**" and path suffix ".dat""#);
    client.register(&m).await.expect("register");
    client.put_bytes(b"live".to_vec(), LIVE).await.expect("put");
    assert_eq!(final_job(&client, "checksum", LIVE).await.state, JobState::Completed);

    // With the default minimum age, every file is too recent.
    let r = client.backfill(&request(true, None)).await.expect("dry run");
    assert_eq!((r.listed, r.matched, r.already, r.too_recent, r.fired_count), (4, 3, 1, 2, 0), "{r:#?}");

    // A dry run lists what would fire and starts nothing.
    let r = client.backfill(&request(true, Some(0))).await.expect("dry run");
    assert!(r.dry_run && !r.truncated);
    let mut fired = r.fired.clone();
    fired.sort();
    assert_eq!(fired, [LOST[0], LOST[1]], "{r:#?}");
    assert_eq!((r.matched, r.already, r.fired_count), (3, 1, 2));
    let jobs = client.jobs().await.expect("jobs");
    assert_eq!(jobs.len(), 1, "only the live file's job: {jobs:#?}");

    // The back-fill, through the command: each lost .dat file fires once.
    let out = tokio::process::Command::new(htfaas_binary())
        .args(["events", "backfill", "--function", "checksum", "--prefix", PREFIX, "--min-age", "0", "--json", "--dir"])
        .arg(dir.path())
        .env_remove("HTFAAS_API_TOKEN")
        .output()
        .await
        .expect("run htfaas events backfill");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: BackfillReport = serde_json::from_slice(&out.stdout).expect("a report");
    assert_eq!((r.dry_run, r.fired_count, r.already), (false, 2, 1), "{r:#?}");
    for path in [LOST[0], LOST[1]] {
        let job = final_job(&client, "checksum", path).await;
        assert_eq!(job.state, JobState::Completed, "{job:#?}");
        assert_eq!(job.event.source, "backfill:htfaas");
        let name = path.rsplit('/').next().unwrap_or_default();
        let out = client.get_bytes(&format!("/data/checksums/{name}.checksums.json")).await.expect("get");
        assert!(out.is_some(), "{path}'s output");
    }

    // Again: everything fired already; no job more.
    let r = client.backfill(&request(false, Some(0))).await.expect("again");
    assert_eq!((r.matched, r.already, r.fired_count), (3, 3, 0), "{r:#?}");
    let jobs = client.jobs().await.expect("jobs");
    assert_eq!(jobs.len(), 3, "{jobs:#?}");
    let audit = client
        .audit_both(&htfaas_functions::audit::AuditFilter { function: Some("checksum".into()), ..Default::default() })
        .await
        .expect("audit");
    let backfills = audit.iter().filter(|r| r.detail.get("action").and_then(|a| a.as_str()) == Some("events.backfill"));
    assert_eq!(backfills.count(), 2, "both back-fills recorded");
}
