//! A real Kafka-protocol broker for the tests: `tansu` (crates.io; installed once per machine by
//! `scripts/install-deps.sh` into `~/.cargo/bin`), on 127.0.0.1, SQLite storage in a directory
//! of the test's, stopped (and restartable on the same port and data) by the test; and the
//! producer side: topics made and dCache billing records produced with `rskafka`.
//!
//! Recipe and pitfalls: `shared/reference/kafka-recipe/` (start in an empty directory, no
//! auto-created topics, `sqlite://` rather than `memory://`).

use rskafka::client::partition::{Compression, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::Record;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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
    child: Option<Child>,
}

impl Tansu {
    /// Starts tansu on a free loopback port, storing in `dir` (made if missing).
    pub fn start(binary: &Path, dir: &Path) -> Tansu {
        std::fs::create_dir_all(dir).expect("the broker's directory");
        let port = htfaas::nats::free_port().expect("a free port");
        let mut t = Tansu { binary: binary.to_owned(), dir: dir.to_owned(), port, child: None };
        t.spawn();
        t
    }

    /// `host:port` for a client.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) {
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("broker.log"))
            .expect("the broker's log");
        let child = Command::new(&self.binary)
            .args(["broker", "--cluster-id", "htfaas-test", "--listener-url", &url, "--advertised-listener-url", &url])
            .args(["--storage-engine", "sqlite://tansu.db"])
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

/// A Kafka client of the test's (the producer side).
pub async fn client(bootstrap: &str) -> Client {
    ClientBuilder::new(vec![bootstrap.to_owned()])
        .client_id("htfaas-test-producer")
        .build()
        .await
        .expect("connect to tansu")
}

/// Creates `topic` with `partitions` partitions and returns a producer for each.
pub async fn create_topic(client: &Client, topic: &str, partitions: i32) -> Vec<PartitionClient> {
    client
        .controller_client()
        .expect("controller")
        .create_topic(topic, partitions, 1, 5_000)
        .await
        .expect("create the topic");
    let mut out = Vec::new();
    for p in 0..partitions {
        out.push(client.partition_client(topic, p, UnknownTopicHandling::Retry).await.expect("partition client"));
    }
    out
}

/// Produces one record with `value` (and, if given, a key and headers); returns its offset.
pub async fn produce(partition: &PartitionClient, value: &[u8]) -> i64 {
    produce_record(partition, record(value)).await
}

/// Produces `record`; returns its offset.
pub async fn produce_record(partition: &PartitionClient, record: Record) -> i64 {
    let offsets = partition.produce(vec![record], Compression::NoCompression).await.expect("produce");
    offsets.first().copied().expect("one offset")
}

/// A record with `value`, no key, no headers, as dCache sends.
pub fn record(value: &[u8]) -> Record {
    Record { key: None, value: Some(value.to_vec()), headers: Default::default(), timestamp: now() }
}

/// Now, as a record's timestamp (milliseconds).
fn now() -> rskafka::chrono::DateTime<rskafka::chrono::Utc> {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    rskafka::chrono::DateTime::from_timestamp_millis(i64::try_from(ms).unwrap_or(0)).unwrap_or_default()
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
