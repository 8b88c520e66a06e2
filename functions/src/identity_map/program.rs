//! A rule's mapping program: a site that maps identities through its own registry (LDAP, a
//! user database) names a program instead of an owner template. It is run with the identity
//! as JSON on its standard input (`{"issuer", "sub", "groups", "rule", "captures"}`; nothing
//! of it in its arguments or environment) and must print, within its timeout,
//! `{"owner": "…", "groups": ["…"]}` or `{"refuse": "why"}`.
//!
//! Bounded: [`DEFAULT_TIMEOUT`] (the rule may say up to [`MAX_TIMEOUT`]), then it is killed;
//! [`MAX_OUTPUT_BYTES`] of output; an empty environment but `PATH`. Whatever it answers is
//! checked as a template's result is (a valid name, never `admin`).
//!
//! Must not know: tokens, the gateway.

use serde::Deserialize;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a program may take when its rule says nothing.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest a rule may give its program.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(10);
/// The most a program may print, bytes.
pub const MAX_OUTPUT_BYTES: u64 = 64 * 1024;

/// What a program answers.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Answer {
    #[serde(default)]
    pub(crate) owner: Option<String>,
    #[serde(default)]
    pub(crate) groups: Vec<String>,
    #[serde(default)]
    pub(crate) refuse: Option<String>,
}

/// Runs `command` with `input` on its standard input; its answer, or why there is none.
pub(crate) fn ask(command: &[String], timeout: Duration, input: &[u8]) -> Result<Answer, String> {
    let out = run(command, timeout, input)?;
    serde_json::from_slice(&out).map_err(|e| {
        let shown: String = String::from_utf8_lossy(&out).chars().take(80).collect();
        format!("the mapping program's answer is not {{\"owner\", \"groups\"}} or {{\"refuse\"}} JSON ({e}): {shown:?}")
    })
}

fn run(command: &[String], timeout: Duration, input: &[u8]) -> Result<Vec<u8>, String> {
    let (program, args) = command.split_first().ok_or("the mapping program is empty")?;
    let mut child = Command::new(program)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the mapping program {program:?}: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A program that does not read its input may close it first: that is its business.
        let _ = stdin.write_all(input);
    }
    let stdout = child.stdout.take().ok_or("no pipe to the mapping program")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let read = stdout.take(MAX_OUTPUT_BYTES + 1).read_to_end(&mut buf).map(|_| buf);
        let _ = tx.send(read);
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("the mapping program did not answer within {} ms; killed", timeout.as_millis()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(format!("waiting for the mapping program: {e}")),
        }
    };
    // It exited; its output is read to the end unless something it started still holds it.
    // Too much output is said first: the program may have died of the pipe closed on it.
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
    let out = rx
        .recv_timeout(left)
        .map_err(|_| "the mapping program exited and left a process holding its output".to_owned())?
        .map_err(|e| format!("reading the mapping program's answer: {e}"))?;
    if out.len() as u64 > MAX_OUTPUT_BYTES {
        return Err(format!("the mapping program printed more than {MAX_OUTPUT_BYTES} bytes"));
    }
    if !status.success() {
        return Err(format!("the mapping program failed ({status})"));
    }
    Ok(out)
}
