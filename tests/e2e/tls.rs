//! A stack whose every HTTP hop is TLS (tokens travel over the gateway's API, so it
//! serves HTTPS like the scheduler; the built-in storage too, as a dCache door on `https://`):
//! the CLI's client, the gateway's calls to the storage and the scheduler, the EP's attach
//! (WSS), its module download from the gateway and its file transfers all verify the stack's
//! CA. What an untrusted or plain-text peer gets is in `attacks::servers`.

use htfaas_functions::proto::JobState;
use htfaas_tests::{adler32_hex, guest_wasm, start_stack_with, wait_for};
use sha2::Digest as _;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tls_on_every_listener_an_upload_runs_its_function_over_https_and_wss() {
    let (_dir, stack) = start_stack_with(|o| o.tls = true).await;
    let info = stack.info().clone();
    for url in [&info.gateway_url, &info.scheduler_url, &info.storage_url] {
        assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    }
    assert!(info.ca_file.as_deref().is_some_and(std::path::Path::exists), "{:?}", info.ca_file);
    let client = stack.client().expect("client");

    // The demo: module upload and registration (gateway), file upload (storage), the EP's
    // module download (gateway) and input and output transfers (storage), attach (WSS).
    let (output, _) = htfaas::stack::demo(&client, &guest_wasm("checksum"), LIMIT).await.expect("demo over TLS");
    let out: serde_json::Value = serde_json::from_str(&output).expect("output is JSON");
    let name = out["file"].as_str().expect("file name").to_owned();
    let input = client.get_bytes(&format!("/data/raw/{name}")).await.expect("get").expect("input exists");
    assert_eq!(out["sha256"], hex::encode(sha2::Sha256::digest(&input)));
    assert_eq!(out["adler32"], adler32_hex(&input));

    // The output is stored before the EP reports its job: wait for the report's commit.
    let jobs = wait_for("the job's report", LIMIT, || async {
        let jobs = client.jobs().await.ok()?;
        jobs.iter().any(|j| j.state.is_final()).then_some(jobs)
    })
    .await;
    assert_eq!(jobs.len(), 1, "{jobs:#?}");
    assert_eq!(jobs[0].state, JobState::Completed, "{:#?}", jobs[0]);
    // The EP attached over WSS and is the one that ran it.
    let eps = client.eps().await.expect("eps");
    assert!(eps.iter().any(|e| e.name == "ep-local-1" && e.session.is_some()), "{eps:#?}");
}
