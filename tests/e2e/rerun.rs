//! "Re-derive this file" on the real stack: `audit rerun` runs the function version
//! that wrote a file again on the same input bytes, into a scratch directory beside its outputs,
//! and compares. The checksum example comes out identical; the `hostile` guest's `stamp` (clock
//! and a random number) differs; after its input is overwritten, the re-run runs nothing and
//! says the input changed. The `htfaas audit rerun` command exits 0 only for identical files;
//! `--all --since` samples the outputs of recent jobs.
//! Who may re-derive what, and that re-runs fire nothing: `attacks::reruns`.

use crate::failures::{final_job, hostile};
use htfaas::stack::demo_manifest;
use htfaas_functions::proto::rerun::RERUN_SEGMENT;
use htfaas_functions::proto::{JobState, RerunVerdict};
use htfaas_tests::{htfaas_binary, start_stack, upload_checksum};
use sha2::{Digest as _, Sha256};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);
const INPUT: &str = "/data/raw/x.dat";
const SUM: &str = "/data/checksums/x.dat.checksums.json";
const STAMP_IN: &str = "/data/stamp/a.dat";
const STAMP: &str = "/data/stamp-out/stamp.json";

/// `htfaas audit rerun ARGS --dir DIR`: (success, stdout, stderr).
async fn cli(dir: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = tokio::process::Command::new(htfaas_binary())
        .args(["audit", "rerun"])
        .args(args)
        .arg("--dir")
        .arg(dir)
        .env_remove("HTFAAS_API_TOKEN")
        .env_remove("HTFAAS_PROFILE")
        .output()
        .await
        .expect("run htfaas audit rerun");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerun_confirms_a_checksum_output_and_catches_a_nondeterministic_guest_and_a_changed_input() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    client.register(&demo_manifest(upload_checksum(&client).await)).await.expect("register checksum");
    client.register(&hostile(&client, "stamp", &["stamp"]).await).await.expect("register stamp");
    let input = b"re-derive me".to_vec();
    client.put_bytes(input.clone(), INPUT).await.expect("put");
    client.put_bytes(b"stamp me".to_vec(), STAMP_IN).await.expect("put");
    let sum_job = final_job(&client, "checksum", INPUT).await;
    let stamp_job = final_job(&client, "stamp", STAMP_IN).await;
    assert_eq!((sum_job.state, stamp_job.state), (JobState::Completed, JobState::Completed), "{stamp_job:#?}");

    // The checksum's output comes out identical, from the same bytes, in a scratch directory.
    let rerun = client.rerun(SUM).await.expect("re-run the checksum");
    assert_eq!(
        (rerun.job.as_str(), rerun.function.as_str(), rerun.input.as_str()),
        (sum_job.id.as_str(), "checksum", INPUT)
    );
    assert_eq!((rerun.version, &rerun.digest), (sum_job.version, &sum_job.digest));
    assert_eq!(rerun.input_sha256, hex::encode(Sha256::digest(&input)), "the input's bytes as the job read them");
    assert_eq!(rerun.sha256, sum_job.outputs[0].sha256);
    assert!(rerun.scratch.starts_with(&format!("/data/checksums/{RERUN_SEGMENT}/")), "{}", rerun.scratch);
    assert_eq!(rerun.expected, format!("{}x.dat.checksums.json", rerun.scratch));
    let (verdict, job) = client.rerun_verdict(&rerun, LIMIT).await.expect("verdict");
    assert_eq!(verdict, RerunVerdict::Identical, "{job:#?}");
    assert_ne!(job.id, sum_job.id, "a job of its own");
    assert_eq!((job.owner.as_str(), job.event.source.as_str()), (sum_job.owner.as_str(), "rerun"));
    let original = client.get_bytes(SUM).await.expect("get").expect("the output");
    assert_eq!(client.get_bytes(&rerun.expected).await.expect("get"), Some(original), "the same bytes, side by side");
    let (ok, out, err) = cli(dir.path(), &["--file", SUM]).await;
    assert!(ok && out.starts_with("identical ") && out.contains(SUM), "{out}\n{err}");

    // The stamp differs on every run: the re-run says so, and the command fails.
    let rerun = client.rerun(STAMP).await.expect("re-run the stamp");
    let (verdict, job) = client.rerun_verdict(&rerun, LIMIT).await.expect("verdict");
    match verdict {
        RerunVerdict::Differs { sha256 } => assert_ne!(sha256, rerun.sha256),
        v => panic!("the stamp's re-run: {v:?} {job:#?}"),
    }
    let (ok, out, _) = cli(dir.path(), &["--file", STAMP]).await;
    assert!(!ok && out.starts_with("DIFFERS ") && out.contains(STAMP), "{out}");

    // Its input overwritten (the function disabled first, so nothing else runs on it): the
    // re-run reads other bytes and runs nothing.
    client.set_function_enabled("stamp", false).await.expect("disable");
    client.put_bytes(b"other bytes".to_vec(), STAMP_IN).await.expect("overwrite the input");
    let rerun = client.rerun(STAMP).await.expect("re-run on a changed input");
    let (verdict, job) = client.rerun_verdict(&rerun, LIMIT).await.expect("verdict");
    match verdict {
        RerunVerdict::InputChanged { reason } => assert!(reason.contains(&rerun.input_sha256), "{reason}"),
        v => panic!("a re-run on a changed input: {v:?} {job:#?}"),
    }
    assert_eq!(job.exit_code, None, "the guest did not run");

    // `--all --since`: both completed jobs' outputs, the re-runs' own left out; one is not
    // identical any more, so the command fails.
    let (ok, out, err) = cli(dir.path(), &["--all", "--since", "-1h", "--json"]).await;
    assert!(!ok, "{out}\n{err}");
    let checked: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let mut seen: Vec<(String, String)> = checked
        .as_array()
        .expect("a list")
        .iter()
        .map(|c| {
            (c["rerun"]["file"].as_str().unwrap_or("").into(), c["verdict"]["verdict"].as_str().unwrap_or("").into())
        })
        .collect();
    seen.sort();
    assert_eq!(seen, [(SUM.into(), "identical".into()), (STAMP.into(), "input_changed".into())], "{out}");
}
