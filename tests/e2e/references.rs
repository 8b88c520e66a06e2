//! Reference inputs on the real stack: a calibration function whose manifest names a constants
//! file (`inputs.ref`) runs on an upload with the constants under `/input/ref/…` (its output is
//! the native kernel's with the same constants, byte for byte), and the output's lineage names
//! both files it read, each with the sha256 it read. The next run on the same EP takes the
//! constants from the EP's cache (the storage names their sha256), and a run after they
//! changed reads the new ones. A reference outside the owner's read namespace is refused at
//! registration, and again at a firing once its grant is revoked.

use crate::examples::kernel;
use crate::metrics::{Scrape, scrape};
use htfaas::stack::demo_manifest;
use htfaas_functions::namespace::Right;
use htfaas_functions::proto::{DeadLetterKind, LineageRelation, RerunVerdict};
use htfaas_functions::{FunctionManifest, Resources};
use htfaas_tests::{guest_wasm, start_stack, wait_for};
use sha2::Digest as _;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);
const GAINS: &str = "/data/calib/gains-v3.txt";

fn calibration(module: htfaas_functions::Digest, owner: &str, dir: &str, gains: &str) -> FunctionManifest {
    let mut m = demo_manifest(module);
    m.name = format!("calib-{owner}");
    m.owner = owner.into();
    m.trigger.path = format!("{dir}runs/**");
    m.outputs.dir = format!("{dir}calibrated/");
    m.args = vec!["--gains".into(), format!("/input/ref{gains}")];
    m.inputs.refs = vec![gains.into()];
    m.resources = Resources::new(1, 256, 60);
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calibration_reads_its_constants_file_and_its_lineage_names_both_files() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let module = client.upload_module(std::fs::read(guest_wasm("calibrate")).expect("wasm")).await.expect("upload");
    let gains = [(2.0f32, 0.0f32, 0.0f32), (1.5, 1.0e-5, 0.0), (1.0, 0.0, 0.0), (0.5, 0.0, -1.0e-9)];
    let text: String = gains.iter().map(|(a, b, c)| format!("{a} {b} {c}\n")).collect();
    client.put_bytes(text.clone().into_bytes(), GAINS).await.expect("constants");
    client.register(&calibration(module.clone(), htfaas::stack::USER, "/data/", GAINS)).await.expect("register");

    let samples = kernel::synthesize(1024, gains.len(), 42);
    client.put_bytes(kernel::to_le_bytes(&samples), "/data/runs/run42.f32").await.expect("upload");
    let out = "/data/calibrated/run42.f32.calib.json";
    let got = wait_for(out, LIMIT, || async { client.get_bytes(out).await.ok().flatten() }).await;
    let native = kernel::calibrate_with(&samples, &gains, 4).expect("valid input");
    assert_eq!(String::from_utf8(got).expect("UTF-8"), kernel::to_json("run42.f32", &native), "the constants read");
    assert_ne!(native, kernel::calibrate(&samples, gains.len(), 4).expect("valid"), "they change the result");

    let lineage = client.lineage(out).await.expect("lineage");
    let step = lineage.steps.iter().find(|s| s.relation == LineageRelation::Wrote).expect("the writing job");
    assert_eq!(step.input.as_deref(), Some("/data/runs/run42.f32"));
    let sha256 = hex::encode(sha2::Sha256::digest(text.as_bytes()));
    assert_eq!(step.refs.len(), 1, "{step:#?}");
    assert_eq!((step.refs[0].path.as_str(), step.refs[0].sha256.as_str()), (GAINS, sha256.as_str()));
    // The constants file's own lineage finds the run that read it.
    let read = client.lineage(GAINS).await.expect("lineage of the constants");
    assert!(read.steps.iter().any(|s| s.job == step.job && s.relation == LineageRelation::Read), "{read:#?}");

    // The next run on this EP links the constants from its cache: the storage named their
    // sha256 to the job's own macaroon, and the EP kept those bytes from the first run.
    let http = htfaas_gateway::http_client().expect("http");
    let ep = stack.ep_metrics_url().expect("the stack's EP serves metrics");
    let files = |s: &Scrape, from: &str| s.get("htfaas_ep_reference_files_total", &[("from", from)]);
    let before = scrape(&http, &ep, None).await;
    assert_eq!((files(&before, "cache"), files(&before, "storage")), (0.0, 1.0), "the first run downloaded them");
    let again = kernel::synthesize(1024, gains.len(), 43);
    client.put_bytes(kernel::to_le_bytes(&again), "/data/runs/run43.f32").await.expect("upload");
    let out43 = "/data/calibrated/run43.f32.calib.json";
    let got = wait_for(out43, LIMIT, || async { client.get_bytes(out43).await.ok().flatten() }).await;
    let expected = kernel::calibrate_with(&again, &gains, 4).expect("valid input");
    assert_eq!(String::from_utf8(got).expect("UTF-8"), kernel::to_json("run43.f32", &expected), "the same constants");
    let after = scrape(&http, &ep, None).await;
    assert_eq!((files(&after, "cache"), files(&after, "storage")), (1.0, 1.0), "from the cache, not downloaded");

    // `audit rerun` re-derives the output with the very constants the run read ...
    let rerun = client.rerun(out).await.expect("re-run");
    let (verdict, job) = client.rerun_verdict(&rerun, LIMIT).await.expect("verdict");
    assert_eq!(verdict, RerunVerdict::Identical, "{job:#?}");
    // Once they changed, a run reads the new ones (the storage names other bytes) ...
    client.put_bytes(b"9 0 0\n9 0 0\n9 0 0\n9 0 0\n".to_vec(), GAINS).await.expect("new constants");
    let changed = [(9.0f32, 0.0f32, 0.0f32); 4];
    client.put_bytes(kernel::to_le_bytes(&again), "/data/runs/run44.f32").await.expect("upload");
    let out44 = "/data/calibrated/run44.f32.calib.json";
    let got = wait_for(out44, LIMIT, || async { client.get_bytes(out44).await.ok().flatten() }).await;
    let expected = kernel::calibrate_with(&again, &changed, 4).expect("valid input");
    assert_eq!(String::from_utf8(got).expect("UTF-8"), kernel::to_json("run44.f32", &expected), "the new constants");
    // ... and a re-run of the first output runs nothing and says so.
    let rerun = client.rerun(out).await.expect("re-run on new constants");
    let (verdict, job) = client.rerun_verdict(&rerun, LIMIT).await.expect("verdict");
    match verdict {
        RerunVerdict::InputChanged { reason } => {
            assert!(reason.contains(&sha256) && reason.contains(GAINS), "{reason}")
        }
        v => panic!("expected the changed constants to be caught, got {v:?}: {job:#?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_outside_the_owners_read_namespace_is_refused_at_registration_and_at_a_firing() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let module = client.upload_module(std::fs::read(guest_wasm("calibrate")).expect("wasm")).await.expect("upload");
    for right in [Right::Read, Right::Write] {
        client.grant("carol", right, "/data/carol/").await.expect("grant");
    }
    // alice's constants, outside carol's namespace: refused, naming the reference.
    let refused = client
        .register(&calibration(module.clone(), "carol", "/data/carol/", GAINS))
        .await
        .expect_err("another owner's constants");
    assert!(format!("{refused:#}").contains("reference input /data/calib/gains-v3.txt is outside"), "{refused:#}");

    // Her own, granted apart, then taken back: the firing is refused, not run without them.
    client.grant("carol", Right::Read, "/refs/carol/").await.expect("grant");
    client.register(&calibration(module, "carol", "/data/carol/", "/refs/carol/g.txt")).await.expect("register");
    client.revoke_grant("carol", Right::Read, "/refs/carol/").await.expect("revoke");
    client.put_bytes(vec![0; 256], "/data/carol/runs/r.f32").await.expect("upload");
    let entry = wait_for("the refused firing's dead letter", LIMIT, || async {
        client
            .dead_letters(None, None, false)
            .await
            .ok()?
            .into_iter()
            .find(|e| e.event.path == "/data/carol/runs/r.f32")
    })
    .await;
    assert_eq!(entry.kind, DeadLetterKind::Refused);
    assert!(
        entry.reason.contains("reference input /refs/carol/g.txt is outside the read namespace of carol"),
        "{entry:?}"
    );
    let jobs = client.jobs().await.expect("jobs");
    assert!(jobs.iter().all(|j| j.event.path != "/data/carol/runs/r.f32"), "no job: {jobs:#?}");
}
