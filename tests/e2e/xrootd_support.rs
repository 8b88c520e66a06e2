//! A real XRootD for the end-to-end tests (Debian `xrootd-server` 5.5.x with XrdHttp +
//! XrdMacaroons), started by `scripts/xrootd/start.sh` on a free 127.0.0.1 port in a fresh
//! temporary directory and killed (by pid) when dropped, also when a test panics.
//!
//! Two flavours: plain ([`Xrootd::start`]: the issuer may read, list, insert and write), and with
//! storage events ([`Xrootd::start_with_notify`]: `scripts/xrootd/notify-fifo.cfg`, i.e.
//! `ofs.notify … >STATE/notify.fifo` and `ofs.notifymsg closew $TID closew $LFN $FSIZE`).
//! The served namespace is `all.export /` over `oss.localroot DATA`: the URL path `/x`, the
//! notify `$LFN` `/x` and the file `DATA/x` are one and the same.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A running xrootd, killed (by pid) when dropped.
pub struct Xrootd {
    /// xrootd's own pid (start.sh execs it).
    pub pid: u32,
    /// When that process started ([`start_time`]): the drop signals only that very process.
    started: Option<u64>,
    /// One port for xroot://, http:// and https:// on 127.0.0.1.
    pub port: u16,
    /// The served namespace root (`oss.localroot`).
    pub data: PathBuf,
    /// The state dir: `etc/`, logs, and `notify.fifo` when started with notify.
    pub state: PathBuf,
    /// `state/etc`: the throwaway CA (`ca.pem`) and the issuer's `client.pem`/`client.key`.
    pub etc: PathBuf,
    /// Removed after the process is gone (fields drop after `Drop::drop`).
    _dir: tempfile::TempDir,
}

impl Xrootd {
    /// Starts a plain xrootd, with `prepare` run on the data dir first.
    pub fn start(prepare: impl Fn(&Path)) -> Xrootd {
        Xrootd::start_with(prepare, &[])
    }

    /// Starts xrootd with `ofs.notify … >STATE/notify.fifo` (`scripts/xrootd/notify-fifo.cfg`);
    /// with `issuer_may_delete`, under `scripts/xrootd/authdb-delete` (never for macaroon
    /// tests: see that file).
    pub fn start_with_notify(prepare: impl Fn(&Path), issuer_may_delete: bool) -> Xrootd {
        let mut env = vec![("HTFAAS_XRD_EXTRA_CFG", scripts().join("notify-fifo.cfg"))];
        if issuer_may_delete {
            env.push(("HTFAAS_XRD_AUTHDB", scripts().join("authdb-delete")));
        }
        Xrootd::start_with(prepare, &env)
    }

    fn start_with(prepare: impl Fn(&Path), env: &[(&str, PathBuf)]) -> Xrootd {
        let mut last_err = String::new();
        // A port free now may be taken before xrootd binds it: try a few.
        for _ in 0..3 {
            let dir = tempfile::tempdir().expect("temp dir");
            // User xrootd must traverse it (mktemp gives 0700).
            set_mode(dir.path(), 0o755);
            let data = dir.path().join("data");
            std::fs::create_dir_all(&data).expect("data dir");
            prepare(&data);
            let port = htfaas::nats::free_port().expect("a free port");
            let started = Instant::now();
            let mut cmd = Command::new("bash");
            cmd.arg(scripts().join("start.sh")).arg(port.to_string()).arg(&data);
            for (k, v) in env {
                cmd.env(k, v);
            }
            let out = cmd.output().expect("run scripts/xrootd/start.sh");
            let stderr = String::from_utf8_lossy(&out.stderr);
            if !stderr.trim().is_empty() {
                eprintln!("start.sh: {}", stderr.trim());
            }
            if out.status.success() {
                let pid = String::from_utf8_lossy(&out.stdout).trim().parse().expect("start.sh prints the pid");
                eprintln!("xrootd: pid {pid} on 127.0.0.1:{port}, answered after {:?}", started.elapsed());
                let state = dir.path().join("data.state");
                let etc = state.join("etc");
                let started = start_time(pid);
                return Xrootd { pid, started, port, data, state, etc, _dir: dir };
            }
            last_err = stderr.into_owned();
        }
        panic!("xrootd did not start: {last_err}");
    }

    /// `http://127.0.0.1:PORT<path>`.
    pub fn http(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// `https://127.0.0.1:PORT<path>`.
    pub fn https(&self, path: &str) -> String {
        format!("{}{path}", self.https_base())
    }

    /// `https://127.0.0.1:PORT`: the storage URL a gateway or an EP uses.
    pub fn https_base(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The FIFO of `ofs.notify` (only with [`Xrootd::start_with_notify`]).
    pub fn notify_fifo(&self) -> PathBuf {
        self.state.join("notify.fifo")
    }

    /// An HTTPS client authenticated as the issuer (the gridmapped client certificate), with
    /// title-case header names (XrdHttp 5.5 wants `Content-Length` spelled so on a PUT).
    pub fn issuer(&self) -> reqwest::Client {
        htfaas_gateway::storage_http_client(
            Some(&self.etc.join("ca.pem")),
            Some(&self.etc.join("client.pem")),
            Some(&self.etc.join("client.key")),
        )
        .expect("issuer client")
    }
}

impl Drop for Xrootd {
    fn drop(&mut self) {
        // xrootd is not our child: once it exited, init reaped it and its pid may be another
        // process's by now (pids wrap on a busy machine). Only the very process started here,
        // told by its start time, is signalled.
        let ours = || self.started.is_some() && start_time(self.pid) == self.started && alive(self.pid);
        if !ours() {
            return;
        }
        let pid = self.pid.to_string();
        let _ = Command::new("kill").arg(&pid).status();
        let deadline = Instant::now() + Duration::from_secs(3);
        while ours() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if ours() {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
        }
    }
}

/// When process `pid` started (clock ticks after boot: field 22 of `/proc/<pid>/stat`), which
/// tells it from a later process that got the same pid; `None` when there is no such process.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    // `rest` starts at field 3 (the state).
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn scripts() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/xrootd")
}

/// Whether `pid` runs (a zombie, waiting for init to reap it, does not count).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Whether an XRootD test can run: `xrootd` on PATH. Panics under CI when it is not; else
/// prints a notice naming `test`, which the caller then skips.
pub fn xrootd_installed(test: &str) -> bool {
    let found = Command::new("sh").args(["-c", "command -v xrootd"]).output().is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "xrootd is not installed but CI is set: run scripts/install-deps.sh (apt: xrootd-server xrootd-server-plugins)"
        );
        eprintln!("NOTICE: xrootd is not installed; skipping {test} (scripts/install-deps.sh installs it)");
    }
    found
}
