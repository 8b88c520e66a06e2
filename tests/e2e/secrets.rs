//! Function configuration and secrets, on the real stack: an env value is part of
//! the manifest; a secret's value reaches the guest's environment and nothing else — not the
//! API's answers, not either audit trail, not the registry's or the scheduler's or the firing
//! table's database files; a run waits until its secrets have values; setting them again
//! rotates them. Another owner can neither read nor set them: `attacks::tenancy`.

use htfaas_functions::audit::AuditFilter;
use htfaas_functions::proto::JobState;
use htfaas_tests::{guest_wasm, start_stack, wait_for};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);
const SECRET: &str = "s3cr3t-hunter2-b7f1";
const ROTATED: &str = "r0tated-9c2e-secret";

/// Every byte of the files under `dir` whose names end in one of `suffixes`, concatenated.
fn file_bytes(dir: &Path, suffixes: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read dir").flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else if suffixes.iter().any(|s| p.to_string_lossy().ends_with(s)) {
                out.extend(std::fs::read(&p).unwrap_or_default());
            }
        }
    }
    out
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_reaches_the_guest_and_nothing_else_and_rotates() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let probe = client.upload_module(std::fs::read(guest_wasm("sandbox-probe")).expect("wasm")).await.expect("up");
    let mut manifest = htfaas::stack::demo_manifest(probe);
    manifest.name = "probe".into();
    manifest.outputs.dir = "/data/probe-out/".into();
    manifest.args = vec!["env:DB_PASSWORD".into(), "env:GREETING".into()];
    manifest.env = vec![("GREETING".into(), "hello".into())];
    manifest.secrets = vec!["DB_PASSWORD".into()];
    client.register(&manifest).await.expect("register");

    // No value yet: the firing waits (retried), no job is made.
    let before = client.stats().await.expect("stats").transient_failures;
    client.put_bytes(b"one".to_vec(), "/data/raw/one.dat").await.expect("upload");
    wait_for("the firing to wait for its secret", LIMIT, || async {
        (client.stats().await.ok()?.transient_failures > before).then_some(())
    })
    .await;
    assert!(client.jobs().await.expect("jobs").is_empty(), "a job was made without its secret");

    let set = |value: &str| BTreeMap::from([("DB_PASSWORD".to_owned(), value.to_owned())]);
    assert_eq!(client.set_function_secrets("probe", &set(SECRET)).await.expect("set"), ["DB_PASSWORD"]);
    let read = |name: &'static str, file: &'static str| {
        let client = client.clone();
        async move {
            wait_for(&format!("{name}'s {file}"), LIMIT, || async {
                let done = client
                    .jobs()
                    .await
                    .ok()?
                    .into_iter()
                    .any(|j| j.event.path == format!("/data/raw/{name}.dat") && j.state == JobState::Completed);
                if !done {
                    return None;
                }
                client.get_bytes(&format!("/data/probe-out/{file}")).await.ok()?
            })
            .await
        }
    };
    // The waiting firing runs once the value is there.
    assert_eq!(read("one", "env-DB_PASSWORD.txt").await, SECRET.as_bytes());
    assert_eq!(read("one", "env-GREETING.txt").await, b"hello");

    // The value is nowhere else.
    let mut answers = Vec::new();
    answers.push(serde_json::to_string(&client.function_statuses().await.expect("functions")).expect("json"));
    answers.push(serde_json::to_string(&client.function_versions("probe").await.expect("versions")).expect("json"));
    answers.push(serde_json::to_string(&client.jobs().await.expect("jobs")).expect("json"));
    answers.push(serde_json::to_string(&client.function_secret_names("probe").await.expect("names")).expect("json"));
    answers
        .push(serde_json::to_string(&client.audit_both(&AuditFilter::default()).await.expect("audit")).expect("json"));
    for a in &answers {
        assert!(!a.contains(SECRET), "an answer holds the secret: {a}");
    }
    assert!(answers[3].contains("DB_PASSWORD"), "the names are shown: {}", answers[3]);
    let files = file_bytes(dir.path(), &[".sqlite", ".sqlite-wal", ".sqlite-shm", ".json"]);
    assert!(files.len() > 10_000, "the databases were read ({} bytes)", files.len());
    assert!(!contains(&files, SECRET), "a database or state file holds the secret in plain text");

    // Rotated: the next run sees the new value.
    client.set_function_secrets("probe", &set(ROTATED)).await.expect("rotate");
    client.put_bytes(b"two".to_vec(), "/data/raw/two.dat").await.expect("upload");
    wait_for("the rotated value", LIMIT, || async {
        let bytes = read("two", "env-DB_PASSWORD.txt").await;
        (bytes == ROTATED.as_bytes()).then_some(())
    })
    .await;
    stack.stop().await.expect("stop");
}
