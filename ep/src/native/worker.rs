//! A native **handler**: one sandbox, started once, that serves one run after another. It is
//! the same sandbox as a run's (`super::spawn`: namespaces, seccomp, its own control group
//! and anonymous uid), bound to directories of its own (`<dir>/input`, `<dir>/output`) that
//! each run is staged into and taken out of.
//!
//! **The contract.** argv is the function's command alone. For each run the worker reads one
//! request, a line of JSON on its stdin:
//! `{"input": "/input/NAME", "args": [..], "output": "/output"}`; `/input` then holds that one
//! file and `/output` is empty. It answers with one line of JSON on descriptor 3
//! ([`super::REPLY_FD`]): `{"exit_code": N}`, 0 for success, as a run's exit status. What it
//! writes to stdout and stderr between the request and the answer is that run's log. Anything else (no answer
//! within the run time, an answer that is not that line, an exit) ends the worker; the run's
//! outcome says which.
//!
//! **Usage** is the control group's across the run: its CPU time, and its peak memory (reset
//! at each request on v1; on v2 the worker's peak since it started).
//!
//! Must not know: jobs, the pool, the link, the network.

use super::cgroup::{Group, Usage};
use super::uids::UidLease;
use super::{End, MAX_LOG_BYTES, NativeError, NativeRun, Spawned};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Longest answer line taken.
const MAX_ANSWER_BYTES: usize = 4096;
/// How long a worker that closed its answer pipe has to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(1);

/// What a worker is started with.
#[derive(Debug)]
pub struct WorkerSpec<'a> {
    /// The unpacked image: the sandbox's read-only `/`.
    pub root: &'a Path,
    /// argv: the command.
    pub argv: &'a [String],
    /// The environment (the function's `env` and secrets), fixed for the worker's life.
    pub env: &'a [(String, String)],
    /// Size of its `/tmp`, bytes.
    pub tmp_bytes: u64,
    /// Its control group's limits.
    pub limits: super::cgroup::Limits,
    /// Device nodes bound into it (GPUs lent to it), as for a run.
    pub devices: &'a [PathBuf],
}

/// One request to a worker.
#[derive(Debug)]
pub struct Request<'a> {
    /// The run's input file on the host; linked (or copied) into the worker's `/input`.
    pub input: &'a Path,
    /// Its name there (one clean path segment).
    pub name: &'a str,
    /// The run's arguments.
    pub args: &'a [String],
    /// Wall time from the request to the answer before the worker is killed.
    pub run_time: Duration,
}

/// What one request did.
#[derive(Debug, Clone)]
pub struct Served {
    /// How the run ended: [`End::Exited`] with the answer's `exit_code`, or how the worker did.
    pub end: End,
    /// Whether the worker answered and may serve again.
    pub healthy: bool,
    /// What the group used during the run.
    pub usage: Usage,
    /// Wall time from the request to the answer, ms.
    pub wall_ms: u64,
    /// The first [`MAX_LOG_BYTES`] of its stdout and stderr during the run.
    pub stdout: Vec<u8>,
    /// Likewise.
    pub stderr: Vec<u8>,
}

/// A running handler. Dropping it kills every process of its group and removes its
/// directories (blocking: drop it off the async threads, [`Worker::retire`]).
#[derive(Debug)]
pub struct Worker {
    child: tokio::process::Child,
    group: Option<Group>,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::process::ChildStdout,
    stderr: tokio::process::ChildStderr,
    answers: tokio::net::unix::pipe::Receiver,
    dir: PathBuf,
    uid: UidLease,
    served: u64,
}

/// The parts of a started process a worker needs.
fn parts(
    mut s: Spawned,
) -> std::io::Result<(
    tokio::process::Child,
    Group,
    tokio::process::ChildStdin,
    tokio::process::ChildStdout,
    tokio::process::ChildStderr,
    tokio::net::unix::pipe::Receiver,
)> {
    let missing = |what: &str| std::io::Error::other(format!("the handler's {what} is not piped"));
    let stdin = s.child.stdin.take().ok_or_else(|| missing("stdin"))?;
    let stdout = s.child.stdout.take().ok_or_else(|| missing("stdout"))?;
    let stderr = s.child.stderr.take().ok_or_else(|| missing("stderr"))?;
    let answers = s.replies.take().ok_or_else(|| missing("answer pipe"))?;
    let answers = tokio::net::unix::pipe::Receiver::from_owned_fd(std::os::fd::OwnedFd::from(answers))?;
    Ok((s.child, s.group, stdin, stdout, stderr, answers))
}

impl Worker {
    /// Starts a worker with `bwrap` as `uid` in group `name` under `backend` (its directories
    /// bound through `stage`, [`super::STAGE`]), its own made under `dir` (which must not
    /// exist): `input` (root's, 0755) and `output` (the uid's, 0700).
    pub fn start(
        bwrap: &Path,
        backend: &super::cgroup::Backend,
        stage: &Path,
        name: &str,
        dir: PathBuf,
        uid: UidLease,
        spec: &WorkerSpec<'_>,
    ) -> Result<Worker, NativeError> {
        use std::os::unix::fs::PermissionsExt as _;
        let (input, output) = (dir.join("input"), dir.join("output"));
        std::fs::create_dir(&dir)?;
        let made = (|| {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
            std::fs::create_dir(&input)?;
            std::fs::set_permissions(&input, std::fs::Permissions::from_mode(0o755))?;
            std::fs::create_dir(&output)?;
            std::os::unix::fs::chown(&output, Some(uid.uid()), Some(uid.uid()))?;
            std::fs::set_permissions(&output, std::fs::Permissions::from_mode(0o700))
        })();
        let run = NativeRun {
            root: spec.root,
            input_dir: &input,
            output_dir: &output,
            checkpoint_dir: None,
            argv: spec.argv,
            env: spec.env,
            uid: uid.uid(),
            tmp_bytes: spec.tmp_bytes,
            limits: spec.limits,
            run_time: Duration::MAX,
            // A worker is killed, never vacated (crate::native_job::run_handler says why).
            vacate: Duration::ZERO,
            devices: spec.devices,
        };
        let started =
            made.map_err(NativeError::from).and_then(|()| super::spawn(bwrap, backend, stage, name, &run, true));
        let spawned = match started.and_then(|s| parts(s).map_err(NativeError::from)) {
            Ok(parts) => parts,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let (child, group, stdin, stdout, stderr, answers) = spawned;
        Ok(Worker { child, group: Some(group), stdin, stdout, stderr, answers, dir, uid, served: 0 })
    }

    /// The host directory bound at the worker's `/output`.
    pub fn output_dir(&self) -> PathBuf {
        self.dir.join("output")
    }

    /// Runs served so far.
    pub fn served(&self) -> u64 {
        self.served
    }

    /// The anonymous uid it runs as.
    pub fn uid(&self) -> u32 {
        self.uid.uid()
    }

    /// Whether its process still runs.
    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// What its group used since it started.
    pub fn usage(&self) -> Usage {
        self.group.as_ref().map(Group::usage).unwrap_or_default()
    }

    /// Serves `req`: stages its input, sends the request, and waits for the answer, the run
    /// time, `stop`, or the worker's end. `Err` only when staging failed (the worker is then
    /// not asked, and may serve again).
    pub async fn serve(
        &mut self,
        req: &Request<'_>,
        stop: impl std::future::Future<Output = ()>,
    ) -> std::io::Result<Served> {
        self.drain_logs().await;
        let (dir, input, name) = (self.dir.clone(), req.input.to_owned(), req.name.to_owned());
        tokio::task::spawn_blocking(move || stage(&dir, &input, &name)).await.map_err(std::io::Error::other)??;
        if let Some(group) = &self.group {
            group.reset_peak();
        }
        let before = self.usage();
        let started = Instant::now();
        let line = request_line(req);
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        let waited = {
            let answer = async {
                self.stdin.write_all(line.as_bytes()).await?;
                self.stdin.flush().await?;
                read_answer(&mut self.answers, &mut self.stdout, &mut self.stderr, &mut stdout, &mut stderr).await
            };
            tokio::select! {
                answered = tokio::time::timeout(req.run_time, answer) => match answered {
                    Ok(Ok(answer)) => Waited::Answer(answer),
                    Ok(Err(_)) => Waited::Closed,
                    Err(_) => Waited::TimeExceeded,
                },
                () = stop => Waited::Stopped,
            }
        };
        self.served += 1;
        let wall_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let (end, healthy) = match waited {
            Waited::Answer(Got::Line(bytes)) => match parse_answer(&bytes) {
                Ok(code) => (End::Exited(code), true),
                Err(why) => (End::Broken(why), false),
            },
            Waited::Answer(Got::Bad(why)) => (End::Broken(why), false),
            Waited::Answer(Got::End) | Waited::Closed => (self.ended().await, false),
            Waited::TimeExceeded => (End::TimeExceeded, false),
            Waited::Stopped => (End::Stopped, false),
        };
        if healthy {
            // What it wrote before it answered is still in the pipes; what it writes later is
            // the next run's (or dropped before it).
            drain_into(&mut self.stdout, &mut stdout).await;
            drain_into(&mut self.stderr, &mut stderr).await;
        }
        let after = self.usage();
        let end = match end {
            End::Exited(_) | End::Broken(_) if after.oom_killed && !before.oom_killed => End::MemoryExceeded,
            end => end,
        };
        let usage = Usage {
            cpu_ms: after.cpu_ms.saturating_sub(before.cpu_ms),
            peak_memory_bytes: after.peak_memory_bytes,
            oom_killed: after.oom_killed && !before.oom_killed,
        };
        Ok(Served { end, healthy, usage, wall_ms, stdout, stderr })
    }

    /// Moves what the last run left in `/output` into `into` (the run's own output directory).
    pub async fn take_outputs(&self, into: &Path) -> std::io::Result<()> {
        let (from, into) = (self.output_dir(), into.to_owned());
        tokio::task::spawn_blocking(move || {
            for entry in std::fs::read_dir(&from)? {
                let entry = entry?;
                std::fs::rename(entry.path(), into.join(entry.file_name()))?;
            }
            Ok(())
        })
        .await
        .map_err(std::io::Error::other)?
    }

    /// Kills it and removes its directories, off the async threads.
    pub async fn retire(self) {
        let _ = tokio::task::spawn_blocking(move || drop(self)).await;
    }

    /// How a worker that closed its answer pipe ended: its exit status, or killed after
    /// [`EXIT_GRACE`].
    async fn ended(&mut self) -> End {
        use std::os::unix::process::ExitStatusExt as _;
        match tokio::time::timeout(EXIT_GRACE, self.child.wait()).await {
            Ok(Ok(status)) => match (status.code(), status.signal()) {
                (Some(0), _) => End::Broken("the handler exited (status 0) before it answered".into()),
                (Some(code), _) => End::Exited(code),
                (None, signal) => End::Signalled(signal.unwrap_or(0)),
            },
            Ok(Err(e)) => End::Broken(format!("the handler's status: {e}")),
            Err(_) => End::Broken("the handler closed its answer pipe (descriptor 3) and went on".into()),
        }
    }

    /// Drops what it wrote between runs.
    async fn drain_logs(&mut self) {
        let mut dropped = Vec::new();
        drain_into(&mut self.stdout, &mut dropped).await;
        dropped.clear();
        drain_into(&mut self.stderr, &mut dropped).await;
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        if let Some(group) = self.group.take() {
            drop(group);
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.dir.display(), "cannot remove a handler's directory: {e}");
        }
    }
}

/// How the wait for an answer ended.
enum Waited {
    /// What came on the answer pipe.
    Answer(Got),
    /// Writing the request failed: the worker is gone.
    Closed,
    TimeExceeded,
    Stopped,
}

/// The request line of `req`, newline included.
fn request_line(req: &Request<'_>) -> String {
    let line = serde_json::json!({ "input": format!("/input/{}", req.name), "args": req.args, "output": "/output" });
    format!("{line}\n")
}

/// The `exit_code` of an answer line, or why it is none.
fn parse_answer(line: &[u8]) -> Result<i32, String> {
    #[derive(serde::Deserialize)]
    struct Answer {
        exit_code: i32,
    }
    serde_json::from_slice::<Answer>(line).map(|a| a.exit_code).map_err(|e| {
        let shown = String::from_utf8_lossy(&line[..line.len().min(120)]).into_owned();
        format!("the handler answered {shown:?}, not {{\"exit_code\": N}}: {e}")
    })
}

/// Empties `/input` and `/output` of the worker in `dir` and links (or copies) `input` into
/// `/input/<name>`, readable by all.
fn stage(dir: &Path, input: &Path, name: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    for sub in ["input", "output"] {
        for entry in std::fs::read_dir(dir.join(sub))? {
            let path = entry?.path();
            match std::fs::symlink_metadata(&path)?.is_dir() {
                true => std::fs::remove_dir_all(&path)?,
                false => std::fs::remove_file(&path)?,
            }
        }
    }
    let to = dir.join("input").join(name);
    if std::fs::hard_link(input, &to).is_err() {
        std::fs::copy(input, &to)?;
    }
    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o644))
}

/// What came on the answer pipe.
enum Got {
    /// One line, without its newline.
    Line(Vec<u8>),
    /// The pipe's end.
    End,
    /// No answer: why.
    Bad(String),
}

/// Reads until a whole line arrives on `answers` (or the pipe ends), keeping the
/// first [`MAX_LOG_BYTES`] of what comes on `out` and `err` meanwhile. Cancel-safe up to the
/// bytes of a partial line, which a worker that is then killed never completes anyway.
async fn read_answer(
    answers: &mut tokio::net::unix::pipe::Receiver,
    out: &mut tokio::process::ChildStdout,
    err: &mut tokio::process::ChildStderr,
    out_kept: &mut Vec<u8>,
    err_kept: &mut Vec<u8>,
) -> std::io::Result<Got> {
    let mut line = Vec::new();
    let (mut out_buf, mut err_buf, mut buf) = ([0u8; 8192], [0u8; 8192], [0u8; 512]);
    let (mut out_open, mut err_open) = (true, true);
    loop {
        tokio::select! {
            // The logs first: what the worker wrote before it answered is then read before
            // the answer is.
            biased;
            n = out.read(&mut out_buf), if out_open => match n {
                Ok(n) if n > 0 => keep(out_kept, &out_buf[..n]),
                _ => out_open = false,
            },
            n = err.read(&mut err_buf), if err_open => match n {
                Ok(n) if n > 0 => keep(err_kept, &err_buf[..n]),
                _ => err_open = false,
            },
            n = answers.read(&mut buf) => {
                let n = n?;
                if n == 0 {
                    return Ok(Got::End);
                }
                line.extend_from_slice(&buf[..n]);
                if let Some(end) = line.iter().position(|b| *b == b'\n') {
                    if end + 1 < line.len() {
                        return Ok(Got::Bad("the handler answered more than one line to one request".into()));
                    }
                    line.truncate(end);
                    return Ok(Got::Line(line));
                }
                if line.len() > MAX_ANSWER_BYTES {
                    return Ok(Got::Bad(format!("the handler's answer is longer than {MAX_ANSWER_BYTES} bytes")));
                }
            }
        }
    }
}

/// What `pipe` holds now, without waiting, into `kept` (bounded).
async fn drain_into(pipe: &mut (impl tokio::io::AsyncRead + Unpin), kept: &mut Vec<u8>) {
    let mut buf = [0u8; 8192];
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::ZERO, pipe.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        keep(kept, &buf[..n]);
    }
}

fn keep(kept: &mut Vec<u8>, bytes: &[u8]) {
    let room = MAX_LOG_BYTES.saturating_sub(kept.len());
    kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
}

#[cfg(test)]
mod tests;
