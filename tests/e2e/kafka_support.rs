//! A real Kafka-protocol broker for the tests: `tansu` (crates.io; installed once per machine by
//! `scripts/install-deps.sh` into `~/.cargo/bin`), on 127.0.0.1, SQLite storage in a directory
//! of the test's, stopped (and restartable on the same port and data) by the test, with SASL
//! logins required if asked (`--authentication`: SCRAM users made with `tansu user create`);
//! a TLS-terminating proxy in front of it ([`TlsProxy`]: tansu 0.6 takes `--cert`/`--key` but
//! never wraps its connections in TLS), which tansu advertises so that every client connection
//! goes through it; and the client side, with librdkafka (`rdkafka`) as the bridge: topics
//! made, dCache billing records produced, the group's committed offsets read and set.
//!
//! Recipe and pitfalls: `shared/reference/kafka-recipe/` (start in an empty directory, no
//! auto-created topics, `sqlite://` rather than `memory://`).

use htfaas_bridges::kafka::{SaslMechanism, Security, SecurityProtocol, Settings};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The tansu binary: `HTFAAS_TANSU`, else `tansu` on PATH, else `~/.cargo/bin/tansu`.
pub fn tansu_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HTFAAS_TANSU") {
        return Some(PathBuf::from(p));
    }
    let on_path = Command::new("sh").args(["-c", "command -v tansu"]).output().ok()?;
    if on_path.status.success() {
        let p = String::from_utf8_lossy(&on_path.stdout).trim().to_owned();
        if !p.is_empty() {
            return Some(PathBuf::from(p));
        }
    }
    let home = std::env::var_os("HOME")?;
    let p = Path::new(&home).join(".cargo/bin/tansu");
    p.exists().then_some(p)
}

/// Whether a Kafka test can run: tansu found. Panics under CI when it is not; else prints a
/// notice naming `test`, which the caller then skips.
pub fn tansu_installed(test: &str) -> Option<PathBuf> {
    let found = tansu_binary();
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "tansu is not installed but CI is set: run scripts/install-deps.sh (cargo install tansu)"
        );
        eprintln!(
            "NOTICE: tansu (a Kafka-protocol broker) is not installed; skipping {test} (scripts/install-deps.sh)"
        );
    }
    found
}

/// A running tansu broker.
pub struct Tansu {
    binary: PathBuf,
    dir: PathBuf,
    port: u16,
    /// The port clients are told to use (a [`TlsProxy`]'s), if not `port`.
    advertised: u16,
    /// `--authentication`: SASL logins required.
    authentication: bool,
    child: Option<Child>,
}

impl Tansu {
    /// Starts tansu on a free loopback port, storing in `dir` (made if missing).
    pub fn start(binary: &Path, dir: &Path) -> Tansu {
        let port = htfaas::nats::free_port().expect("a free port");
        Tansu::start_behind(binary, dir, port, port)
    }

    /// [`Tansu::start`] on `port`, telling clients to connect to `advertised` (a proxy's port).
    pub fn start_behind(binary: &Path, dir: &Path, port: u16, advertised: u16) -> Tansu {
        std::fs::create_dir_all(dir).expect("the broker's directory");
        let mut t = Tansu {
            binary: binary.to_owned(),
            dir: dir.to_owned(),
            port,
            advertised,
            authentication: false,
            child: None,
        };
        t.spawn();
        t
    }

    /// `host:port` for a client (through the proxy when there is one).
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.advertised)
    }

    fn spawn(&mut self) {
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let advertised = format!("tcp://127.0.0.1:{}", self.advertised);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("broker.log"))
            .expect("the broker's log");
        let mut cmd = Command::new(&self.binary);
        cmd.args(["broker", "--cluster-id", "htfaas-test", "--listener-url", &url])
            .args(["--advertised-listener-url", &advertised])
            .args(["--storage-engine", "sqlite://tansu.db"]);
        if self.authentication {
            cmd.arg("--authentication");
        }
        let child = cmd
            // It reads `.env` and these from the environment: only the flags count.
            .env_remove("STORAGE_ENGINE")
            .env_remove("LISTENER_URL")
            .env_remove("ADVERTISED_LISTENER_URL")
            .env_remove("CLUSTER_ID")
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start tansu");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "tansu did not open port {} (see {}/broker.log)",
                self.port,
                self.dir.display()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Makes a SCRAM user (`tansu user create`, through the broker's own port; before
    /// [`Tansu::require_logins`], which would refuse the unauthenticated request).
    pub fn create_user(&self, name: &str, password: &str, mechanism: SaslMechanism) {
        let mechanism = match mechanism {
            SaslMechanism::ScramSha256 => "scram256",
            SaslMechanism::ScramSha512 => "scram512",
            SaslMechanism::Plain => panic!("tansu keeps SCRAM users only"),
        };
        let out = Command::new(&self.binary)
            .args(["user", "create", "--broker", &format!("tcp://127.0.0.1:{}", self.port)])
            .args(["--mechanism", mechanism, name, password])
            .output()
            .expect("run tansu user create");
        assert!(out.status.success(), "tansu user create: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Restarts the broker requiring SASL logins from then on.
    pub fn require_logins(&mut self) {
        self.authentication = true;
        self.restart();
    }

    /// Kills the broker (SIGKILL: no goodbye to its clients).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port with the same data.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A throwaway CA (rcgen), written to `dir`, and the server certificates it signs.
pub struct Pki {
    /// The CA certificate, PEM, for a client's `ca_file`.
    pub ca_file: PathBuf,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Pki {
    /// A CA named `name`, its certificate in `dir/<name>.pem`.
    pub fn new(dir: &Path, name: &str) -> Pki {
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name.push(rcgen::DnType::CommonName, name);
        let ca_cert = ca.self_signed(&ca_key).expect("CA cert");
        std::fs::create_dir_all(dir).expect("the PKI's directory");
        let ca_file = dir.join(format!("{name}.pem"));
        std::fs::write(&ca_file, ca_cert.pem()).expect("write the CA");
        Pki { ca_file, issuer: rcgen::Issuer::new(ca, ca_key) }
    }

    /// A server's TLS configuration with a certificate this CA signed for `names`.
    pub fn server(&self, names: &[&str]) -> Arc<rustls::ServerConfig> {
        let key = rcgen::KeyPair::generate().expect("server key");
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let cert = rcgen::CertificateParams::new(names)
            .expect("server params")
            .signed_by(&key, &self.issuer)
            .expect("server cert");
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .expect("server TLS config");
        Arc::new(config)
    }
}

/// A TLS-terminating TCP proxy on 127.0.0.1 in front of a plaintext port, as a site's TLS
/// listener would be: each connection's TLS is taken off and its bytes go to `upstream`.
pub struct TlsProxy {
    /// The proxy's port.
    pub port: u16,
    /// TLS handshakes completed.
    pub handshakes: Arc<AtomicU64>,
    /// TLS handshakes the client broke off or failed (a client that does not trust the
    /// certificate).
    pub refused: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsProxy {
    /// Listens on a free port with `tls`; connects each client to 127.0.0.1:`upstream` (which
    /// may start later).
    pub async fn start(tls: Arc<rustls::ServerConfig>, upstream: u16) -> TlsProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let port = listener.local_addr().expect("address").port();
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let (handshakes, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let counts = (handshakes.clone(), refused.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { continue };
                let (acceptor, counts) = (acceptor.clone(), counts.clone());
                tokio::spawn(async move {
                    let mut tls = match acceptor.accept(client).await {
                        Ok(tls) => tls,
                        // A client that does not trust the certificate gives up here.
                        Err(_) => {
                            counts.1.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                    };
                    counts.0.fetch_add(1, Ordering::Relaxed);
                    let Ok(mut broker) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else { return };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut broker).await;
                });
            }
        });
        TlsProxy { port, handshakes, refused, task }
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How a test's Kafka client reaches the broker: as the bridge does.
#[derive(Clone)]
pub struct Access {
    /// `host:port`.
    pub bootstrap: String,
    /// TLS and SASL (the password in `password`, not a file).
    pub security: Security,
    /// The SASL password.
    pub password: Option<String>,
}

impl Access {
    /// Plain TCP to `broker`.
    pub fn plain(broker: &Tansu) -> Access {
        Access { bootstrap: broker.bootstrap(), security: Security::default(), password: None }
    }

    fn config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap).set("security.protocol", self.security.protocol.as_str());
        if let Some(ca) = &self.security.ca_file {
            c.set("ssl.ca.location", ca.to_string_lossy());
        }
        if self.security.protocol == SecurityProtocol::SaslSsl
            || self.security.protocol == SecurityProtocol::SaslPlaintext
        {
            c.set("sasl.mechanism", self.security.sasl_mechanism.expect("a mechanism").as_str())
                .set("sasl.username", self.security.sasl_username.as_deref().expect("a user"))
                .set("sasl.password", self.password.as_deref().expect("a password"));
        }
        c
    }
}

/// Creates `topic` with `partitions` partitions and returns a producer to it.
pub async fn create_topic(access: &Access, topic: &str, partitions: i32) -> Producer {
    let admin: AdminClient<DefaultClientContext> = access.config().create().expect("admin client");
    let made = admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("create the topic");
    for r in made {
        r.expect("the topic is made");
    }
    Producer::new(access, topic, "none")
}

/// A producer to one topic (`acks=all`, idempotent), with a compression codec.
pub struct Producer {
    topic: String,
    producer: FutureProducer,
}

impl Producer {
    /// `compression`: librdkafka's `compression.type` (`none`, `gzip`, `snappy`, `lz4`, `zstd`).
    pub fn new(access: &Access, topic: &str, compression: &str) -> Producer {
        let producer = access
            .config()
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("compression.type", compression)
            .create()
            .expect("producer");
        Producer { topic: topic.to_owned(), producer }
    }

    /// Produces one record with `value` to `partition`; returns its offset.
    pub async fn produce(&self, partition: i32, value: &[u8]) -> i64 {
        self.produce_with(partition, value, None, &[]).await
    }

    /// [`Producer::produce`] with a key and headers.
    pub async fn produce_with(
        &self,
        partition: i32,
        value: &[u8],
        key: Option<&[u8]>,
        headers: &[(&str, &[u8])],
    ) -> i64 {
        let mut h = OwnedHeaders::new();
        for (name, value) in headers {
            h = h.insert(Header { key: name, value: Some(*value) });
        }
        let mut record = FutureRecord::<[u8], [u8]>::to(&self.topic).partition(partition).payload(value).headers(h);
        if let Some(k) = key {
            record = record.key(k);
        }
        let delivered = self.producer.send(record, Duration::from_secs(30)).await.map_err(|(e, _)| e).expect("produce");
        delivered.offset
    }

    /// Produces `values`, pipelined, to `partition`.
    pub async fn produce_many(&self, partition: i32, values: &[Vec<u8>]) {
        let mut sent = Vec::with_capacity(values.len());
        for v in values {
            let record = FutureRecord::<(), [u8]>::to(&self.topic).partition(partition).payload(v.as_slice());
            sent.push(self.producer.send_result(record).map_err(|(e, _)| e).expect("queued"));
        }
        for s in sent {
            s.await.expect("delivery").map_err(|(e, _)| e).expect("delivered");
        }
    }
}

/// The offsets `group` committed for `topic`'s `partitions`, read from Kafka (OffsetFetch, by a
/// client that does not join the group): partition → next offset, absent when none.
pub async fn committed(access: &Access, group: &str, topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
    let config = access.config().set("group.id", group).clone();
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let c: BaseConsumer = config.create().expect("consumer");
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(&topic, p);
        }
        let got = c.committed_offsets(tpl, Duration::from_secs(10)).expect("the committed offsets");
        got.elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(n) => Some((e.partition(), n)),
                _ => None,
            })
            .collect()
    })
    .await
    .expect("join")
}

/// Sets `group`'s committed offset of each of `partitions` of `topic` to `offset`, through
/// Kafka (the group must have no member).
pub async fn set_committed(access: &Access, group: &str, topic: &str, partitions: &[i32], offset: i64) {
    let config = access.config().set("group.id", group).set("enable.auto.commit", "false").clone();
    let (topic, partitions) = (topic.to_owned(), partitions.to_vec());
    tokio::task::spawn_blocking(move || {
        let c: BaseConsumer = config.create().expect("consumer");
        let mut tpl = TopicPartitionList::new();
        for p in partitions {
            tpl.add_partition_offset(&topic, p, Offset::Offset(offset)).expect("offset");
        }
        c.commit(&tpl, CommitMode::Sync).expect("commit to the group");
    })
    .await
    .expect("join")
}

/// The bridge's settings for a broker reached through `access`.
pub fn apply(access: &Access, settings: &mut Settings, password_file: Option<PathBuf>) {
    settings.brokers = vec![access.bootstrap.clone()];
    settings.security = access.security.clone();
    settings.security.sasl_password_file = password_file;
}

/// A pool's successful `transfer` write of `path`, as dCache's serializer writes it
/// (`shared/reference/dcache.md` §1.3), as the `n`th upload: each `n` is another event.
pub fn transfer(path: &str, n: u64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "version": "1.0", "msgType": "transfer", "date": "2026-03-14T10:15:30.123+01:00", "queuingTime": 0,
        "cellName": "pool-a-1", "cellType": "pool", "cellDomain": "pool-aDomain",
        "meanWriteBandwidth": 1.18E8, "writeIdle": "PT0.012S", "writeActive": "PT0.9S", "localEndpoint": "192.0.2.21:20123",
        "status": {"code": 0, "msg": ""}, "session": format!("pool:pool-a-1@pool-aDomain:1773479730123-{n}"),
        "subject": ["UidPrincipal[1000]", "GidPrincipal[1000,primary]", "UserNamePrincipal[alice]", "Origin[198.51.100.7]"],
        "pnfsid": format!("0000C9B4E7A1F2D34E5C{n:016X}"), "billingPath": path, "transferPath": path,
        "fileSize": 5, "storageInfo": "exp:raw@osm", "transferSize": 5, "transferTime": 912, "isWrite": "write",
        "protocolInfo": {"protocol": "Http", "versionMajor": 1, "versionMinor": 1, "transferTag": "", "port": 51514, "host": "198.51.100.7"},
        "initiator": format!("door:webdav-1@webdavDomain:kafka-test-{n}"), "isP2p": false,
    }))
    .expect("json")
}
