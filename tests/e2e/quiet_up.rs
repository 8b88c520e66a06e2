//! `htfaas up` as a new developer first runs it: the real binary prints a short
//! status — `ready`, where, where the logs are, the demo's output, `running` — and no log line;
//! each component's log is in a file of its own under the stack directory, which `htfaas logs`
//! shows.

use htfaas_tests::{guest_wasm, htfaas_binary};
use std::time::Duration;
use tokio::io::AsyncBufReadExt as _;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_prints_a_short_status_and_writes_each_components_log_to_its_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stack_dir = dir.path().join("stack");
    let nats = htfaas::nats::find_binary().expect("nats-server (scripts/install-deps.sh)");
    let mut up = tokio::process::Command::new(htfaas_binary())
        .args(["up", "--demo", "--dir"])
        .arg(&stack_dir)
        .arg("--demo-wasm")
        .arg(guest_wasm("checksum"))
        .arg("--nats-server")
        .arg(&nats)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start htfaas up");
    let mut lines = tokio::io::BufReader::new(up.stdout.take().expect("stdout")).lines();
    let mut printed = Vec::new();
    tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.next_line().await.expect("read stdout") {
            let done = line.starts_with("running");
            printed.push(line);
            if done {
                break;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("`htfaas up --demo` did not reach `running`: {printed:#?}"));
    let stdout = printed.join("\n");
    assert!(printed.first().is_some_and(|l| l == "ready"), "{stdout}");
    assert!(stdout.contains("output after") && stdout.contains("\"sha256\""), "the demo's output: {stdout}");
    assert!(stdout.contains(&format!("logs in {}", stack_dir.join("logs").display())), "{stdout}");
    assert!(printed.len() < 20, "a short status, not a log: {stdout}");
    assert!(!stdout.contains(" INFO "), "log lines on stdout: {stdout}");

    // SIGTERM: it stops; nothing was logged to the terminal meanwhile.
    let pid = up.id().expect("pid").to_string();
    let _ = tokio::process::Command::new("kill").args(["-TERM", &pid]).status().await;
    let out = tokio::time::timeout(Duration::from_secs(60), up.wait_with_output()).await.expect("stops").expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains(" INFO "), "log lines on stderr: {stderr}");

    // Each component's log is in its file.
    for (name, line) in
        [("gateway", "gateway ready"), ("scheduler", "htfaas_scheduler"), ("ep", "htfaas_ep"), ("storage", "storage")]
    {
        let text = std::fs::read_to_string(stack_dir.join(format!("logs/{name}.log"))).expect("a log file");
        assert!(text.contains(line), "{name}.log lacks {line:?}:\n{text}");
        for (other, prefix) in [("gateway", "htfaas_gateway"), ("scheduler", "htfaas_scheduler"), ("ep", "htfaas_ep")] {
            assert!(other == name || !text.contains(prefix), "{name}.log holds {other}'s lines");
        }
    }
    let shown = tokio::process::Command::new(htfaas_binary())
        .args(["logs", "gateway", "--dir"])
        .arg(&stack_dir)
        .output()
        .await
        .expect("htfaas logs");
    assert!(shown.status.success() && String::from_utf8_lossy(&shown.stdout).contains("gateway ready"));
    let bad = tokio::process::Command::new(htfaas_binary())
        .args(["logs", "nope", "--dir"])
        .arg(&stack_dir)
        .output()
        .await
        .expect("htfaas logs");
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("one of storage, scheduler"));
}
