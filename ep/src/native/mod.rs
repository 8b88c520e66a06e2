//! Native guests: one command in an unpacked image ([`image`]), confined by bubblewrap,
//! limited and measured by a control group of its own; [`host`] is what the EP set up at start
//! (`crate::native_job` runs a job's command here).
//!
//! **Why bubblewrap.** It makes every namespace new (user, pid, network with `lo` only, ipc,
//! uts, mount, cgroup), binds a read-only root and the job's two directories, sets
//! `no_new_privs` and installs a seccomp program ([`seccomp`]: the calls a batch job never
//! needs fail), in one small audited binary that Debian ships;
//! crun refuses hybrid cgroup hosts such as ours, and a namespace builder of our own would
//! repeat bubblewrap's careful ordering. It runs **unprivileged**: the EP drops to a per-job
//! anonymous uid/gid before it executes `bwrap`, so the guest is that uid outside the sandbox
//! too (its files on the host are that uid's; it holds no capability there), and the kernel's
//! user namespaces make the sandbox. The image, `/input` and `/output` reach bwrap through the
//! [`STAGE`], bound there in a mount namespace of the job's own: the uid needs no right on the
//! EP's own paths, and inside the sandbox no host path exists but those three.
//!
//! **Limits.** [`cgroup`]: memory, pids, cpu quota = the job's cores, and usage read back (CPU
//! time, peak memory, an OOM kill). The run time is the EP's: past it the whole group is
//! killed, double-forked daemons in new sessions included, and whatever is left when the
//! command exits is killed too.
//!
//! **Vacate time** ([`NativeRun::vacate`], HTCondor's habit): a run asked to stop gets SIGTERM
//! first, every process of its group but the outer bwrap ([`cgroup::Group::term_all`]), and
//! SIGKILL of the whole group once the vacate time has passed without it exiting, or at its
//! run time, whichever is first. A run reaching its run time gets the SIGTERM the vacate time
//! before it: the vacate time is counted inside the run time, never added to it. [`Ran::vacate`]
//! says what it did with the SIGTERM. A stop that must not wait ([`Stop::Kill`]: an output past
//! its bound) kills at once.
//!
//! Must not know: jobs, the link, the network (but its absence inside).

pub mod cgroup;
pub mod handlers;
pub mod host;
pub mod image;
pub mod seccomp;
pub mod uids;
pub mod worker;

use std::path::Path;
use std::path::PathBuf;
use std::time::Duration;

/// The bubblewrap binary, unless the EP's config names another.
pub const BWRAP: &str = "/usr/bin/bwrap";
/// Most bytes of a guest's stdout (and of its stderr) kept.
pub const MAX_LOG_BYTES: usize = 64 * 1024;

/// One native run.
#[derive(Debug, Clone)]
pub struct NativeRun<'a> {
    /// The unpacked image: the sandbox's read-only `/`.
    pub root: &'a Path,
    /// The host directory bound read-only at `/input` (holding the job's one file).
    pub input_dir: &'a Path,
    /// The host directory bound writable at `/output`, owned by `uid`.
    pub output_dir: &'a Path,
    /// The host directory bound writable at `/checkpoint`, owned by `uid`, for a job that keeps
    /// checkpoints; none: no `/checkpoint` (the image's empty mount point stays).
    pub checkpoint_dir: Option<&'a Path>,
    /// argv: the command, then its arguments.
    pub argv: &'a [String],
    /// The environment: only these (the manifest's `env` and secrets), and `PATH`.
    pub env: &'a [(String, String)],
    /// The per-job anonymous identity, inside and outside the sandbox: never 0.
    pub uid: u32,
    /// Size of the sandbox's `/tmp` (a tmpfs), bytes.
    pub tmp_bytes: u64,
    /// Limits of its control group.
    pub limits: cgroup::Limits,
    /// Wall time before the whole group is killed.
    pub run_time: Duration,
    /// Time between SIGTERM and SIGKILL, counted inside `run_time` (zero: killed at once).
    pub vacate: Duration,
    /// Device nodes bound into the sandbox at their own paths (a GPU assigned to the job), at
    /// most [`MAX_DEVICES`]; nothing else of the host's `/dev` is there.
    pub devices: &'a [PathBuf],
}

/// Most devices one run is given.
pub const MAX_DEVICES: usize = 64;

/// How a native run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The command exited with this status.
    Exited(i32),
    /// Killed by this signal, not by us.
    Signalled(i32),
    /// The kernel's OOM killer struck: the memory limit.
    MemoryExceeded,
    /// Killed at the run time.
    TimeExceeded,
    /// Killed because the caller said stop (a cancel, an output past its bound).
    Stopped,
    /// A handler ([`worker`]) broke its contract: it answered what is no answer, or ended
    /// without one; the message says which.
    Broken(String),
}

/// How the caller asks a run to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGTERM, then SIGKILL after the vacate time (a cancel, the EP leaving).
    Vacate,
    /// SIGKILL now: more time would let it do more of what it is stopped for (an output past
    /// its bound).
    Kill,
}

/// What a run sent SIGTERM did within its vacate time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vacated {
    /// Its command exited by itself.
    Exited {
        /// Its exit status.
        code: i32,
        /// How long after the SIGTERM.
        after: Duration,
    },
    /// Its command was ended by a signal (SIGTERM itself when it does not catch it).
    Signalled {
        /// The signal.
        signal: i32,
        /// How long after the SIGTERM.
        after: Duration,
    },
    /// Still running when the vacate time (or the run time) ran out: its whole group was killed.
    Killed {
        /// How long after the SIGTERM.
        after: Duration,
    },
}

impl std::fmt::Display for Vacated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = |d: &Duration| d.as_secs_f64();
        match self {
            Vacated::Exited { code, after } => write!(f, "exited with status {code} {:.1} s after SIGTERM", s(after)),
            Vacated::Signalled { signal, after } => {
                write!(f, "ended by signal {signal} {:.1} s after SIGTERM", s(after))
            }
            Vacated::Killed { after } => {
                write!(f, "ignored SIGTERM for the {:.1} s vacate time; killed with its whole cgroup", s(after))
            }
        }
    }
}

/// What a native run did.
#[derive(Debug, Clone)]
pub struct Ran {
    /// How it ended.
    pub end: End,
    /// When it was sent SIGTERM (a stop, or its run time's approach): what it did then.
    pub vacate: Option<Vacated>,
    /// What its group used.
    pub usage: cgroup::Usage,
    /// Wall time, ms.
    pub wall_ms: u64,
    /// The first [`MAX_LOG_BYTES`] of its stdout and stderr.
    pub stdout: Vec<u8>,
    /// Likewise.
    pub stderr: Vec<u8>,
}

/// Why a native run could not start (a guest's own failure is an [`End`]).
#[derive(Debug, thiserror::Error)]
pub enum NativeError {
    /// The run asks for something the EP never does.
    #[error("native run refused: {0}")]
    Refused(String),
    /// The control group or the process could not be made.
    #[error("native run: {0}")]
    Io(#[from] std::io::Error),
}

/// Where the job's three directories appear for bwrap: `<stage>/root`, `<stage>/input` and
/// `<stage>/output`, empty directories (root's, 0755) that the EP binds the image and the
/// job's directories onto in a mount namespace of the job's own, before it drops to the job's
/// uid. So bwrap, running as that uid, reaches them whatever the rights on the EP's own paths
/// (its work directory stays 0700), and no other process sees those binds.
pub const STAGE: &str = "/run/htfaas-sandbox";

/// The `bwrap` arguments of `run` (without the program itself): the sandbox built from the
/// staged directories under `stage` ([`STAGE`]), the seccomp program read from the inherited
/// descriptor `seccomp_fd`.
pub fn bwrap_args(run: &NativeRun<'_>, stage: &Path, seccomp_fd: i32) -> Vec<String> {
    let p = |name: &str| stage.join(name).display().to_string();
    let mut a: Vec<String> = [
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--seccomp",
        &seccomp_fd.to_string(),
        "--ro-bind",
        &p("root"),
        "/",
        "--ro-bind",
        &p("input"),
        "/input",
        "--bind",
        &p("output"),
        "/output",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        &run.tmp_bytes.to_string(),
        "--tmpfs",
        "/tmp",
        "--uid",
        &run.uid.to_string(),
        "--gid",
        &run.uid.to_string(),
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/local/bin:/usr/bin:/bin",
        "--setenv",
        "HOME",
        "/tmp",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    if run.checkpoint_dir.is_some() {
        a.extend(["--bind".into(), p("checkpoint"), "/checkpoint".into()]);
    }
    for (i, device) in run.devices.iter().enumerate() {
        a.extend(["--dev-bind".into(), p(&format!("dev-{i}")), device.display().to_string()]);
    }
    for (k, v) in run.env {
        a.extend(["--setenv".into(), k.clone(), v.clone()]);
    }
    a.push("--".into());
    a.extend(run.argv.iter().cloned());
    a
}

/// Makes the empty stage under `stage` (root's, 0755), once per EP: the four directories and
/// [`MAX_DEVICES`] empty files that devices are bound onto (`dev-<i>`).
pub fn make_stage(stage: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    for d in [stage.to_owned(), stage.join("root"), stage.join("input"), stage.join("output"), stage.join("checkpoint")]
    {
        std::fs::create_dir_all(&d)?;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))?;
    }
    for i in 0..MAX_DEVICES {
        let f = stage.join(format!("dev-{i}"));
        if !f.is_file() {
            std::fs::write(&f, b"")?;
        }
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644))?;
    }
    Ok(())
}

/// `path` as a C string for a call between fork and exec.
fn c_path(path: &Path) -> std::io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt as _;
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{}: NUL in path", path.display())))
}

/// A sandbox started by [`spawn`]: bwrap's process (its stdout and stderr piped, its stdin
/// piped for a handler and empty otherwise), its control group, and for a handler the reading
/// end of the pipe that is its descriptor 3.
pub(crate) struct Spawned {
    pub(crate) child: tokio::process::Child,
    pub(crate) group: cgroup::Group,
    pub(crate) replies: Option<std::io::PipeReader>,
}

/// The guest's descriptor that a handler answers on.
pub const REPLY_FD: i32 = 3;

/// Starts `run` as group `name` under `backend`, with `bwrap`: the checks, the group, the
/// seccomp program, the stage binds and the drop to the run's uid (see
/// [`stage_and_drop_privileges`]). A `handler` also gets a pipe on stdin and one at
/// [`REPLY_FD`].
pub(crate) fn spawn(
    bwrap: &Path,
    backend: &cgroup::Backend,
    stage: &Path,
    name: &str,
    run: &NativeRun<'_>,
    handler: bool,
) -> Result<Spawned, NativeError> {
    use std::os::unix::io::AsRawFd as _;
    if run.uid == 0 {
        return Err(NativeError::Refused("a native guest never runs as uid 0".into()));
    }
    if run.argv.is_empty() {
        return Err(NativeError::Refused("no command".into()));
    }
    if run.devices.len() > MAX_DEVICES {
        return Err(NativeError::Refused(format!("more than {MAX_DEVICES} devices")));
    }
    let mut pairs = vec![
        (c_path(run.root)?, c_path(&stage.join("root"))?),
        (c_path(run.input_dir)?, c_path(&stage.join("input"))?),
        (c_path(run.output_dir)?, c_path(&stage.join("output"))?),
    ];
    if let Some(dir) = run.checkpoint_dir {
        pairs.push((c_path(dir)?, c_path(&stage.join("checkpoint"))?));
    }
    for (i, device) in run.devices.iter().enumerate() {
        pairs.push((c_path(device)?, c_path(&stage.join(format!("dev-{i}")))?));
    }
    let binds = Binds { pairs, slash: c_path(Path::new("/"))? };
    let group = backend.create(name, run.limits)?;
    // Opened before the fork: the child only writes to them (async-signal-safe).
    let procs: Vec<std::fs::File> = group
        .procs_files()
        .iter()
        .map(|f| std::fs::OpenOptions::new().write(true).open(f))
        .collect::<Result<_, _>>()?;
    let fds: Vec<i32> = procs.iter().map(|f| f.as_raw_fd()).collect();
    let uid = run.uid;
    // The seccomp program goes through a pipe: it is far smaller than a pipe's buffer, so it
    // is written whole and the writer closed before bwrap starts, and bwrap reads it to the
    // end. Both ends are close-on-exec; only the child, between fork and exec, clears that
    // flag on the reader, so no other process the EP starts inherits it.
    let (seccomp_reader, mut seccomp_writer) = std::io::pipe()?;
    std::io::Write::write_all(&mut seccomp_writer, &seccomp::program())?;
    drop(seccomp_writer);
    // Both inherited descriptors sit at 10 or above, so moving the reply pipe's writer to
    // REPLY_FD in the child never lands on the seccomp program's.
    let seccomp_reader = above_ten(seccomp_reader)?;
    let seccomp_fd = seccomp_reader.as_raw_fd();
    let replies = if handler { Some(std::io::pipe()?) } else { None };
    let (replies, reply_writer) = match replies {
        Some((reader, writer)) => (Some(reader), Some(above_ten(writer)?)),
        None => (None, None),
    };
    let reply_fd = reply_writer.as_ref().map(|w| w.as_raw_fd());
    let mut cmd = tokio::process::Command::new(bwrap);
    cmd.args(bwrap_args(run, stage, seccomp_fd))
        .env_clear()
        .stdin(if handler { std::process::Stdio::piped() } else { std::process::Stdio::null() })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    stage_and_drop_privileges(&mut cmd, binds, fds, uid, seccomp_fd, reply_fd);
    let spawned = cmd.spawn();
    drop((procs, seccomp_reader, reply_writer));
    match spawned {
        Ok(child) => Ok(Spawned { child, group, replies }),
        Err(e) => {
            drop(group);
            Err(e.into())
        }
    }
}

/// `fd` moved to a descriptor numbered 10 or above (close-on-exec, as it was).
fn above_ten<F: std::os::fd::AsRawFd + From<std::os::fd::OwnedFd>>(fd: F) -> std::io::Result<F> {
    use std::os::fd::FromRawFd as _;
    #[allow(unsafe_code)]
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) on a descriptor `fd` owns; the new one is owned here.
    let moved = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
    if moved < 0 {
        return Err(std::io::Error::last_os_error());
    }
    #[allow(unsafe_code)]
    // SAFETY: `moved` is a fresh descriptor nothing else owns.
    let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(moved) };
    Ok(F::from(owned))
}

/// Runs `run` as job `name` under `backend`, with `bwrap`, until it ends, its run time passes
/// ([`End::TimeExceeded`]) or `stop` completes ([`End::Stopped`]); either way every process of
/// its control group is killed before this returns. Both ends by time and by a [`Stop::Vacate`]
/// send SIGTERM first and wait up to the vacate time (see the module's doc).
pub async fn run(
    bwrap: &Path,
    backend: &cgroup::Backend,
    stage: &Path,
    name: &str,
    run: &NativeRun<'_>,
    stop: impl std::future::Future<Output = Stop>,
) -> Result<Ran, NativeError> {
    let started = tokio::time::Instant::now();
    let Spawned { mut child, group, .. } = spawn(bwrap, backend, stage, name, run, false)?;
    let stdout_task = tokio::spawn(read_bounded(child.stdout.take()));
    let stderr_task = tokio::spawn(read_bounded(child.stderr.take()));
    let deadline = started.checked_add(run.run_time).unwrap_or_else(far_future);
    // SIGTERM the vacate time before the run time, when that leaves any run time at all.
    let vacate = if run.vacate < run.run_time { run.vacate } else { Duration::ZERO };
    let term_at = deadline.checked_sub(vacate).unwrap_or(started);
    let outer = child.id().and_then(|id| i32::try_from(id).ok());
    let (waited, vacated) = {
        let mut wait = std::pin::pin!(child.wait());
        let asked = tokio::select! {
            status = &mut wait => Err(Waited::Exited(status)),
            () = tokio::time::sleep_until(term_at) => Ok((Waited::TimeExceeded, vacate)),
            how = stop => Ok((Waited::Stopped, if how == Stop::Vacate { vacate } else { Duration::ZERO })),
        };
        match asked {
            Err(exited) => (exited, None),
            Ok((why, vacate)) if vacate.is_zero() => (why, None),
            Ok((why, vacate)) => {
                let termed = tokio::time::Instant::now();
                let reached = group.term_all(outer);
                tracing::info!(group = name, processes = reached, ?vacate, "SIGTERM sent; waiting for the vacate time");
                let until = termed.checked_add(vacate).unwrap_or(deadline).min(deadline);
                let vacated = tokio::select! {
                    status = &mut wait => match status {
                        Ok(status) => exit_after(status, termed.elapsed()),
                        Err(_) => Vacated::Killed { after: termed.elapsed() },
                    },
                    () = tokio::time::sleep_until(until) => Vacated::Killed { after: termed.elapsed() },
                };
                (why, Some(vacated))
            }
        }
    };
    // Whatever is left (a daemon the command left behind, or all of it past the run time or
    // on a stop), off the async threads: killing waits until the group is empty.
    let (group, usage) = tokio::task::spawn_blocking(move || {
        group.kill_all();
        let usage = group.usage();
        (group, usage)
    })
    .await
    .map_err(std::io::Error::other)?;
    let wall_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let end = match waited {
        Waited::TimeExceeded => End::TimeExceeded,
        Waited::Stopped => End::Stopped,
        Waited::Exited(status) => {
            use std::os::unix::process::ExitStatusExt as _;
            let status = status?;
            if usage.oom_killed {
                End::MemoryExceeded
            } else if let Some(code) = status.code() {
                End::Exited(code)
            } else {
                End::Signalled(status.signal().unwrap_or(0))
            }
        }
    };
    if !matches!(end, End::Exited(_) | End::Signalled(_) | End::MemoryExceeded) {
        let _ = child.kill().await;
    }
    let stdout = stdout_task.await.unwrap_or_default();
    let stderr = stderr_task.await.unwrap_or_default();
    let _ = tokio::task::spawn_blocking(move || drop(group)).await;
    Ok(Ran { end, vacate: vacated, usage, wall_ms, stdout, stderr })
}

/// What a command that ended `after` its SIGTERM with `status` did.
fn exit_after(status: std::process::ExitStatus, after: Duration) -> Vacated {
    use std::os::unix::process::ExitStatusExt as _;
    match status.code() {
        Some(code) => Vacated::Exited { code, after },
        None => Vacated::Signalled { signal: status.signal().unwrap_or(0), after },
    }
}

/// An instant no run reaches (a run time too long to add to now).
fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)
}

/// How the wait for the command ended.
enum Waited {
    Exited(std::io::Result<std::process::ExitStatus>),
    TimeExceeded,
    Stopped,
}

/// The host paths bound onto the stage, prepared before the fork.
struct Binds {
    /// (host path, stage path): the image, the input and the output directory onto
    /// `<stage>/root`, `<stage>/input`, `<stage>/output`, then each device onto `<stage>/dev-<i>`.
    pairs: Vec<(std::ffi::CString, std::ffi::CString)>,
    /// `/`.
    slash: std::ffi::CString,
}

/// Between fork and exec, the child (still root) takes a mount namespace of its own, private
/// (nothing it mounts reaches the host's), binds the image and the job's directories onto the
/// stage, joins the job's control group (writes "0", itself, to each `cgroup.procs` in `fds`),
/// lets no descriptor but stdio, `inherit` and (for a handler) `reply` as [`REPLY_FD`] survive
/// the exec, drops every supplementary
/// group, takes `uid` as its ids, and asks to be killed with its parent.
///
/// bwrap hands the command every descriptor it got, so one the EP itself inherited without
/// close-on-exec (from whatever started it) would otherwise reach the guest; marking them all
/// close-on-exec, rather than closing them, keeps the one std uses to report a failed exec.
#[allow(unsafe_code)]
fn stage_and_drop_privileges(
    cmd: &mut tokio::process::Command,
    binds: Binds,
    fds: Vec<i32>,
    uid: u32,
    inherit: i32,
    reply: Option<i32>,
) {
    // SAFETY: only async-signal-safe calls (unshare, mount, write, close_range, fcntl,
    // setgroups, setgid, setuid, prctl) on values prepared before the fork; no allocation.
    unsafe {
        cmd.pre_exec(move || {
            let fail = || Err(std::io::Error::last_os_error());
            if libc::unshare(libc::CLONE_NEWNS) != 0
                || libc::mount(
                    std::ptr::null(),
                    binds.slash.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
            {
                return fail();
            }
            for (source, target) in &binds.pairs {
                let flags = libc::MS_BIND | libc::MS_REC;
                if libc::mount(source.as_ptr(), target.as_ptr(), std::ptr::null(), flags, std::ptr::null()) != 0 {
                    return fail();
                }
            }
            let (first, last, cloexec) = (3 as libc::c_uint, libc::c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC);
            if libc::syscall(libc::SYS_close_range, first, last, cloexec) != 0
                || libc::fcntl(inherit, libc::F_SETFD, 0) != 0
            {
                return fail();
            }
            // Into the cgroups first, while every descriptor is still the one opened for it: a
            // `cgroup.procs` file the parent happened to open as descriptor 3 would otherwise be
            // replaced by the answer pipe below, the "0" meant for the cgroup would reach the
            // handler's answers and the guest would run outside its limits.
            for fd in &fds {
                if libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                    return fail();
                }
            }
            // dup2 leaves the copy without close-on-exec: the handler's answer pipe survives.
            if let Some(reply) = reply
                && libc::dup2(reply, REPLY_FD) != REPLY_FD
            {
                return fail();
            }
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(uid) != 0
                || libc::setuid(uid) != 0
                || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0
            {
                return fail();
            }
            Ok(())
        });
    }
}

/// The first [`MAX_LOG_BYTES`] of what `pipe` gives until it ends; the rest is read and dropped,
/// so a guest never blocks on a full pipe.
async fn read_bounded(pipe: Option<impl tokio::io::AsyncRead + Unpin>) -> Vec<u8> {
    use tokio::io::AsyncReadExt as _;
    let mut kept = Vec::new();
    let Some(mut pipe) = pipe else { return kept };
    let mut buf = [0u8; 8192];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let room = MAX_LOG_BYTES.saturating_sub(kept.len());
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
    kept
}

/// The images' root directories unpacked for tests: a static busybox and the mount points a
/// read-only root needs.
#[cfg(test)]
pub(crate) fn busybox_image(dir: &Path) -> Option<PathBuf> {
    let busybox = Path::new("/usr/bin/busybox");
    if !busybox.is_file() || !Path::new(BWRAP).is_file() {
        return None;
    }
    let root = dir.join("root");
    for d in ["bin", "input", "output", "checkpoint", "tmp", "proc", "dev"] {
        std::fs::create_dir_all(root.join(d)).ok()?;
    }
    std::fs::copy(busybox, root.join("bin/busybox")).ok()?;
    for applet in ["sh", "cat", "echo", "sleep", "id", "ls", "dd", "ifconfig", "yes", "head", "mv", "wc"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).ok()?;
    }
    Some(root)
}

#[cfg(test)]
mod tests;
