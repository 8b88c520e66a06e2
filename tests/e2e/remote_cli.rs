//! The CLI against a remote site, as the real `htfaas` binary runs it: `login` with
//! a gateway URL, an API token and the site's CA saves a profile (after checking it); `whoami`,
//! `fn register`, `put` and `get` then work with no stack directory at all. Files go through
//! macaroons the gateway obtains for the caller's namespace (no storage password on the
//! client); another owner's file is refused. The stack serves TLS, so the CA is exercised too.

use htfaas_functions::token::Scope;
use htfaas_tests::{guest_wasm, htfaas_cli, start_stack_with, wait_for};
use std::path::Path;
use std::process::Output;
use std::time::Duration;

fn api_token(stack_dir: &Path, sub: &str) -> String {
    htfaas_tests::api_token(stack_dir, sub, Scope::Developer)
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_developer_logs_in_to_a_remote_gateway_and_registers_fires_and_fetches_with_a_profile() {
    let (dir, stack) = start_stack_with(|o| o.tls = true).await;
    let info = stack.info().clone();
    let ca = info.ca_file.clone().expect("the stack's CA");
    let home = tempfile::tempdir().expect("home");
    let h = home.path();
    std::fs::write(h.join("alice.token"), api_token(dir.path(), "alice")).expect("token file");
    std::fs::write(h.join("mallory.token"), api_token(dir.path(), "mallory")).expect("token file");

    // Without the CA the gateway is not trusted, and nothing is saved.
    let out = htfaas_cli(h, &["login", "--gateway", &info.gateway_url, "--token-file", "alice.token"]).await;
    assert!(!out.status.success(), "logged in without the CA");
    assert!(!h.join("config/profiles/default.json").exists());
    let ca = ca.to_str().expect("UTF-8");
    let said =
        ok(&htfaas_cli(h, &["login", "--gateway", &info.gateway_url, "--token-file", "alice.token", "--ca-file", ca])
            .await);
    assert!(said.contains("as alice (developer)"), "{said}");
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(h.join("config/profiles/default.json")).expect("profile").permissions().mode();
    assert_eq!(mode & 0o077, 0, "the profile holds a token: {mode:o}");
    assert!(ok(&htfaas_cli(h, &["whoami"]).await).starts_with("alice (developer)"));

    // Register, upload, fire, fetch: all through the gateway.
    let wasm = guest_wasm("checksum");
    let wasm = wasm.to_str().expect("UTF-8");
    ok(&htfaas_cli(
        h,
        &["fn", "register", "sums", "--wasm", wasm, "--trigger", "/data/raw/**", "--outputs", "/data/sums/"],
    )
    .await);
    std::fs::write(h.join("in.dat"), b"remote bytes").expect("input");
    ok(&htfaas_cli(h, &["put", "in.dat", "/data/raw/remote.dat"]).await);
    let client = stack.client().expect("client");
    wait_for("the remote upload's job", Duration::from_secs(60), || async {
        client
            .jobs()
            .await
            .ok()?
            .into_iter()
            .find(|j| j.event.path == "/data/raw/remote.dat" && j.state == htfaas_functions::proto::JobState::Completed)
    })
    .await;
    let sums = ok(&htfaas_cli(h, &["get", "/data/sums/remote.dat.checksums.json"]).await);
    assert!(sums.contains("\"size\":12"), "{sums}");
    let listed = ok(&htfaas_cli(h, &["fn", "list"]).await);
    assert!(listed.contains("sums"), "{listed}");

    // Another owner's profile: its credential is refused outside its namespace (it has none).
    ok(&htfaas_cli(
        h,
        &["login", "--gateway", &info.gateway_url, "--token-file", "mallory.token", "--ca-file", ca, "--profile", "m"],
    )
    .await);
    let out = htfaas_cli(h, &["get", "--profile", "m", "/data/sums/remote.dat.checksums.json"]).await;
    assert!(!out.status.success(), "mallory read alice's file");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("403") && err.contains("outside the read namespace of mallory"), "{err}");
    let out = htfaas_cli(h, &["put", "--profile", "m", "in.dat", "/data/raw/mallory.dat"]).await;
    assert!(!out.status.success(), "mallory wrote into alice's namespace");
    stack.stop().await.expect("stop");
}
