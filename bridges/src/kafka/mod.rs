//! `htfaas bridge dcache-kafka`: dCache's billing messages from a Kafka topic to NATS JetStream,
//! where the gateway reads dCache billing messages.
//!
//! dCache sends its billing messages (`transfer`, `request`, `remove`, `store`, `restore`,
//! `hit`, `warning`; JSON, null key) to one Kafka topic, `billing` by default
//! (`dcache.kafka.topic`, `shared/reference/dcache.md` §1). The bridge consumes that topic as
//! a member of a Kafka **consumer group** and publishes each record's value unchanged:
//!
//! - on its file's **path subject** (`storage.dcache.billing.path.<dir>._`,
//!   [`htfaas_functions::proto::path_subject`]) when it names a usable path, as the built-in
//!   storage does, so the gateway's per-owner lanes read Kafka-fed events too; the path is the
//!   one the gateway's own parser finds ([`fn@route`]), so the gateway's check of subject against
//!   payload holds;
//! - on the plain billing subject (`storage.dcache.billing`, the default lane) when it names
//!   none (`"Unknown"`, NFS's `parent:[…]/name`) or is no event (a failed transfer, a warning);
//! - nowhere when it is malformed (not a billing message, a bad path, no value, over
//!   [`MAX_RECORD_BYTES`], a batch that does not decode): counted, logged, skipped; the next
//!   record is not held up.
//!
//! # Delivery: at least once into JetStream, exactly once per firing
//!
//! Each record's `Nats-Msg-Id` is `kafka:<topic>:<partition>:<offset>` ([`message_id`]). The
//! reader (`consume`) publishes records in the order the consumer hands them out, awaits their
//! PubAcks in that order (retrying a failed publish, same id, with backoff, as long as it
//! takes), and commits a partition's offset to the group only when every record before it is
//! acknowledged (or skipped as malformed). A crash or a rebalance between a PubAck and its
//! commit makes the next owner re-read and re-publish those records under the same ids:
//! JetStream's duplicate window (2 minutes on the events stream) drops them (`duplicates`
//! counts them), and beyond that window the gateway's firing key (event id × function ×
//! digest) does, so every (event, function version) still fires once.
//!
//! # The consumer group
//!
//! The bridge is a Kafka consumer (librdkafka through the `rdkafka` crate, its bundled C sources
//! built; Debian's librdkafka 2.0 cannot talk to current brokers) in the group
//! [`Settings::group`], with `enable.auto.commit` and `enable.auto.offset.store` off: offsets
//! reach the group only through the bridge's own commits (`client`). Several bridges in one
//! group share the topic's partitions; when one stops (it leaves the group) or dies (its
//! session times out, 45 s), the others take its partitions over from its last commits. Two
//! groups each read the whole topic.
//!
//! Rebalances are eager (`range,roundrobin`: all partitions revoked, then assigned). On a
//! revoke the bridge commits what was acknowledged in those partitions and forgets them, so a
//! PubAck arriving later commits nothing. A partition the group has no offset for starts at
//! [`Settings::start`] (default: the latest offset, events from now on), looked up and committed
//! at once at the assignment: a restart before the first record's commit resumes there rather
//! than skipping what came in between (`group`). A committed offset that has left Kafka's
//! retention, or lies past the end (the topic was recreated), is reset by librdkafka to the same
//! `start` end (`auto.offset.reset`) and logged. A topic recreated within the duplicate window
//! reuses offsets, and so message ids: such records are dropped as duplicates; wait two minutes
//! before feeding a recreated topic.
//!
//! librdkafka runs its own threads; the bridge only sees it through the message stream
//! (`StreamConsumer`, polled by one task) and the callbacks librdkafka makes while that task
//! polls (rebalance, commit results, statistics, errors; `group`): no async code runs on a C
//! thread, and no callback unwraps anything.
//!
//! Cost, measured on this project's 2-core machine (shared, load ~6): the `rdkafka-sys` build
//! script compiles librdkafka 2.12's C sources once per clean build, with TLS and SASL against
//! the system OpenSSL, zlib and libzstd (snappy and lz4 are librdkafka's own, so no further C
//! library is built): 111 CPU-s (99.5 user, 11.6 sys; 170 s wall), and 455 MB in the target
//! directory. The other new crates (`rdkafka`, the `-sys` probes of OpenSSL, zlib and zstd, and
//! `num_enum`'s proc-macro with its `toml_edit`) add about 30 s; the pure-Rust `rskafka` stack it
//! replaces (22 crates, no groups, no TLS/SASL wired) cost 154 CPU-s with its codecs. The binary
//! links `libssl.so.3`, `libcrypto.so.3`, `libz.so.1` and `libzstd.so.1` dynamically.
//!
//! # Transport: TLS and SASL
//!
//! [`Security`]: `plaintext` (default), `ssl` (TLS; the brokers' certificates are checked
//! against the system's CAs or [`Security::ca_file`], and their names against the address the
//! bridge connects to), `sasl_plaintext` and `sasl_ssl` (SASL `PLAIN`, `SCRAM-SHA-256` or
//! `SCRAM-SHA-512`, with [`Security::sasl_username`] and the password read at start from
//! [`Security::sasl_password_file`]: never on the command line, in the settings or in a log).
//! Tested against a real broker (`tests/e2e/attacks/kafka.rs`: tansu requiring SCRAM logins,
//! behind a test TLS proxy, since tansu 0.6 has no TLS listener of its own): `sasl_ssl` with the
//! site's CA reads and fires; a broker certificate another CA signed, or the site's CA signed for
//! another name, is refused (nothing read); a wrong password is refused; SCRAM-SHA-512 and
//! SCRAM-SHA-256. PLAIN and plain `ssl` are mapped (`client`'s unit tests) but not run against
//! a broker: tansu accepts any PLAIN password, and with logins required takes no connection
//! without one. No GSSAPI (Kerberos), no client certificates (mTLS), no OAUTHBEARER.
//!
//! # Faults
//!
//! Nothing read from Kafka panics the bridge. Broker down, a leader moving, a refused TLS
//! handshake or login: librdkafka retries (with its backoff), each error is counted
//! (`kafka_failures`; `tls_refused`, `login_refused`) and logged with librdkafka's reason at the
//! first and then at powers of two, and the bridge holds its place. NATS down, or no events stream yet (the gateway makes it): publishes are retried with
//! backoff (100 ms doubling to 5 s) and counted (`publish_failures`). A fatal consumer error
//! (librdkafka cannot go on) stops the bridge with an error (its service manager restarts it).
//!
//! # Counters
//!
//! [`Stats`]: received, published (of which on the plain subject, of which duplicates),
//! malformed, lag (records between each assigned partition's committed offset and its high
//! watermark, summed; from librdkafka's statistics every [`Settings::lag_interval`]),
//! partitions assigned, commits, publish failures and Kafka failures (of which TLS handshakes
//! and SASL logins refused); logged every [`Settings::stats_interval`] when they changed and at
//! the end, returned by [`run`], readable live through [`run_with_stats`].
//!
//! Here: the settings and the consumer's life (made, subscribed, read, closed); the reader is
//! `consume`, the group's callbacks `group`, the configuration `client`, the record's subject
//! `route`, the counts `stats`. Must not know: the gateway beyond its billing parser (it only
//! publishes on NATS).

use async_nats::jetstream;
use rdkafka::consumer::{Consumer, StreamConsumer};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

mod client;
mod consume;
mod group;
mod route;
mod stats;

pub use client::{CLIENT_ID, client_config, read_password};
pub use route::{MAX_RECORD_BYTES, RecordError, Routed, message_id, route};
pub use stats::*;

/// How long one publish waits for its PubAck before it is retried.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);
/// How long closing the consumer (the last commit, leaving the group) may take at shutdown.
pub const CLOSE_DEADLINE: Duration = Duration::from_secs(15);

/// Where a partition the group has no offset for starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartAt {
    /// The oldest record Kafka still keeps.
    Earliest,
    /// The next record produced: events from now on.
    #[default]
    Latest,
}

/// How the bridge reaches the brokers (`security.protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SecurityProtocol {
    /// Plain TCP.
    #[default]
    Plaintext,
    /// TLS.
    Ssl,
    /// SASL login over plain TCP.
    SaslPlaintext,
    /// SASL login over TLS.
    SaslSsl,
}

impl SecurityProtocol {
    /// librdkafka's (and Kafka's) name, lower case.
    pub fn as_str(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "plaintext",
            SecurityProtocol::Ssl => "ssl",
            SecurityProtocol::SaslPlaintext => "sasl_plaintext",
            SecurityProtocol::SaslSsl => "sasl_ssl",
        }
    }

    /// Whether the connection is TLS.
    pub fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    /// Whether the bridge logs in with SASL.
    pub fn sasl(self) -> bool {
        matches!(self, SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl)
    }
}

impl std::str::FromStr for SecurityProtocol {
    type Err = SettingsError;
    fn from_str(s: &str) -> Result<Self, SettingsError> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "plaintext" => SecurityProtocol::Plaintext,
            "ssl" => SecurityProtocol::Ssl,
            "sasl_plaintext" => SecurityProtocol::SaslPlaintext,
            "sasl_ssl" => SecurityProtocol::SaslSsl,
            _ => return Err(SettingsError::UnknownProtocol(s.to_owned())),
        })
    }
}

/// The SASL mechanism (`sasl.mechanism`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaslMechanism {
    /// `PLAIN`: the password itself goes to the broker (use it over TLS only).
    Plain,
    /// `SCRAM-SHA-256`.
    ScramSha256,
    /// `SCRAM-SHA-512`.
    ScramSha512,
}

impl SaslMechanism {
    /// Kafka's name.
    pub fn as_str(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

impl std::str::FromStr for SaslMechanism {
    type Err = SettingsError;
    fn from_str(s: &str) -> Result<Self, SettingsError> {
        Ok(match s.to_ascii_uppercase().as_str() {
            "PLAIN" => SaslMechanism::Plain,
            "SCRAM-SHA-256" => SaslMechanism::ScramSha256,
            "SCRAM-SHA-512" => SaslMechanism::ScramSha512,
            _ => return Err(SettingsError::UnknownMechanism(s.to_owned())),
        })
    }
}

/// The transport to the brokers and the bridge's Kafka credential.
#[derive(Debug, Clone, Default)]
pub struct Security {
    /// `--security-protocol`. Default: plaintext.
    pub protocol: SecurityProtocol,
    /// CA certificate(s), PEM, that signed the brokers' certificates (`--ca-file`); TLS
    /// protocols only. Default: the system's CAs.
    pub ca_file: Option<PathBuf>,
    /// `--sasl-mechanism`; SASL protocols only, and required there.
    pub sasl_mechanism: Option<SaslMechanism>,
    /// `--sasl-username`; SASL protocols only, and required there.
    pub sasl_username: Option<String>,
    /// File holding the SASL password (`--sasl-password-file`), read at start; SASL protocols
    /// only, and required there.
    pub sasl_password_file: Option<PathBuf>,
}

/// Settings the bridge refuses, each saying what to change.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// No bootstrap broker.
    #[error("no Kafka broker given")]
    NoBroker,
    /// A topic name Kafka would refuse.
    #[error("bad Kafka topic name {0:?} (1 to 249 of [A-Za-z0-9._-])")]
    Topic(String),
    /// A group name outside what the bridge accepts.
    #[error("bad consumer group name {0:?} (1 to 249 of [A-Za-z0-9._-])")]
    Group(String),
    /// Too small a fetch.
    #[error("fetch_max_bytes must be at least 1 KiB")]
    FetchMaxBytes,
    /// Not a protocol.
    #[error("unknown security protocol {0:?} (plaintext, ssl, sasl_plaintext or sasl_ssl)")]
    UnknownProtocol(String),
    /// Not a mechanism.
    #[error("unknown SASL mechanism {0:?} (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)")]
    UnknownMechanism(String),
    /// A SASL protocol without one of its settings.
    #[error("--security-protocol {protocol} needs {missing}")]
    SaslIncomplete {
        /// The protocol.
        protocol: &'static str,
        /// The missing flag.
        missing: &'static str,
    },
    /// A SASL setting with a protocol that does not log in.
    #[error("{given} is given but --security-protocol is {protocol}: SASL needs sasl_plaintext or sasl_ssl")]
    SaslWithoutSasl {
        /// The flag given.
        given: &'static str,
        /// The protocol.
        protocol: &'static str,
    },
    /// A CA with a protocol that is not TLS.
    #[error("--ca-file is given but --security-protocol is {0}: a CA is only used with ssl or sasl_ssl")]
    CaWithoutTls(&'static str),
    /// An empty user name.
    #[error("--sasl-username is empty")]
    EmptyUsername,
    /// The password file cannot be used (its content is never part of the message).
    #[error("the SASL password file {}: {why}", file.display())]
    PasswordFile {
        /// The file.
        file: PathBuf,
        /// Why not.
        why: String,
    },
    /// The CA file cannot be read.
    #[error("the CA file {}: {why}", file.display())]
    CaFile {
        /// The file.
        file: PathBuf,
        /// Why not.
        why: String,
    },
}

/// How the bridge runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Bootstrap brokers, `host:port` each (`--brokers`); the client learns the rest.
    pub brokers: Vec<String>,
    /// The billing topic (`--topic`). Default: `billing`, dCache's `dcache.kafka.topic`.
    pub topic: String,
    /// The Kafka consumer group (`--group`, or its old name `--consumer`): bridges in one group
    /// share the partitions; two groups each read everything. Default: `htfaas`.
    pub group: String,
    /// Where a partition the group has no offset for starts (`--start`). Default: latest.
    pub start: StartAt,
    /// TLS and SASL. Default: plaintext.
    pub security: Security,
    /// NATS server URL (`--nats`).
    pub nats_url: String,
    /// The bridge's NATS credential (`--nats-nkey-seed-file`): it publishes billing messages,
    /// like a storage. Default: none.
    pub nats_credential: Option<htfaas_functions::nats::NatsCredential>,
    /// Most bytes one fetch returns per partition (`max.partition.fetch.bytes`). Default: 1 MiB.
    pub fetch_max_bytes: usize,
    /// How long the broker holds a fetch open while it has nothing new (`fetch.wait.max.ms`).
    /// Default: 500 ms.
    pub fetch_wait: Duration,
    /// How often the partitions' high watermarks are read for the lag (librdkafka's
    /// `statistics.interval.ms`). Default: 5 s.
    pub lag_interval: Duration,
    /// How often the counts are logged (only when they changed). Default: 60 s.
    pub stats_interval: Duration,
}

impl Settings {
    /// The defaults, for a broker list and a NATS server.
    pub fn new(brokers: Vec<String>, nats_url: impl Into<String>) -> Settings {
        Settings {
            brokers,
            topic: "billing".into(),
            group: "htfaas".into(),
            start: StartAt::Latest,
            security: Security::default(),
            nats_url: nats_url.into(),
            nats_credential: None,
            fetch_max_bytes: 1 << 20,
            fetch_wait: Duration::from_millis(500),
            lag_interval: Duration::from_secs(5),
            stats_interval: Duration::from_secs(60),
        }
    }

    /// Checks the settings, the combinations of the security ones above all.
    pub fn validate(&self) -> Result<(), SettingsError> {
        let kafka_name = |s: &str| {
            !s.is_empty()
                && s.len() <= 249
                && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
                && s != "."
                && s != ".."
        };
        if self.brokers.is_empty() || self.brokers.iter().all(|b| b.trim().is_empty()) {
            return Err(SettingsError::NoBroker);
        }
        if !kafka_name(&self.topic) {
            return Err(SettingsError::Topic(self.topic.clone()));
        }
        if !kafka_name(&self.group) {
            return Err(SettingsError::Group(self.group.clone()));
        }
        if self.fetch_max_bytes < 1024 {
            return Err(SettingsError::FetchMaxBytes);
        }
        let s = &self.security;
        let protocol = s.protocol.as_str();
        if s.protocol.sasl() {
            let missing = if s.sasl_mechanism.is_none() {
                Some("--sasl-mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)")
            } else if s.sasl_username.is_none() {
                Some("--sasl-username")
            } else if s.sasl_password_file.is_none() {
                Some("--sasl-password-file")
            } else {
                None
            };
            if let Some(missing) = missing {
                return Err(SettingsError::SaslIncomplete { protocol, missing });
            }
            if s.sasl_username.as_deref().is_some_and(|u| u.trim().is_empty()) {
                return Err(SettingsError::EmptyUsername);
            }
        } else {
            let given = [
                (s.sasl_mechanism.is_some(), "--sasl-mechanism"),
                (s.sasl_username.is_some(), "--sasl-username"),
                (s.sasl_password_file.is_some(), "--sasl-password-file"),
            ];
            if let Some((_, given)) = given.into_iter().find(|(g, _)| *g) {
                return Err(SettingsError::SaslWithoutSasl { given, protocol });
            }
        }
        if s.ca_file.is_some() && !s.protocol.tls() {
            return Err(SettingsError::CaWithoutTls(protocol));
        }
        Ok(())
    }

    /// The validated settings as librdkafka's configuration: the CA file checked readable and
    /// the password read (errors name the file, never its content).
    fn resolve(&self) -> Result<rdkafka::ClientConfig, SettingsError> {
        self.validate()?;
        if let Some(ca) = &self.security.ca_file {
            std::fs::metadata(ca)
                .and_then(|_| std::fs::File::open(ca).map(drop))
                .map_err(|e| SettingsError::CaFile { file: ca.clone(), why: e.to_string() })?;
        }
        let password = match (&self.security.sasl_password_file, self.security.protocol.sasl()) {
            (Some(file), true) => Some(read_password(file)?),
            _ => None,
        };
        Ok(client_config(self, password.as_deref()))
    }
}

/// Runs the bridge until `shutdown`. Returns the counts.
pub async fn run(settings: Settings, shutdown: CancellationToken) -> anyhow::Result<StatsSnapshot> {
    run_with_stats(settings, Arc::new(Stats::default()), shutdown).await
}

/// [`run`], counting into `stats` (which the caller may read meanwhile).
pub async fn run_with_stats(
    settings: Settings,
    stats: Arc<Stats>,
    shutdown: CancellationToken,
) -> anyhow::Result<StatsSnapshot> {
    let config = settings.resolve()?;
    if settings.security.protocol == SecurityProtocol::SaslPlaintext
        && settings.security.sasl_mechanism == Some(SaslMechanism::Plain)
    {
        tracing::warn!("SASL PLAIN over plaintext: the password crosses the network in the clear; use sasl_ssl");
    }
    let client =
        crate::nats::connect_nats("htfaas-bridge-dcache-kafka", settings.nats_credential.as_ref(), &settings.nats_url)
            .await?;
    let js = jetstream::ContextBuilder::new().timeout(PUBLISH_TIMEOUT).build(client);
    let progress = Arc::new(group::Progress::default());
    let context = group::Group::new(settings.topic.clone(), settings.start, progress, stats.clone());
    let consumer: Arc<StreamConsumer<group::Group>> = Arc::new(
        config.create_with_context(context).map_err(|e| anyhow::anyhow!("cannot make the Kafka consumer: {e}"))?,
    );
    consumer
        .subscribe(&[settings.topic.as_str()])
        .map_err(|e| anyhow::anyhow!("cannot subscribe to the topic {}: {e}", settings.topic))?;
    tracing::info!(
        brokers = %settings.brokers.join(","),
        topic = %settings.topic,
        group = %settings.group,
        security = settings.security.protocol.as_str(),
        sasl_mechanism = settings.security.sasl_mechanism.map(SaslMechanism::as_str),
        sasl_username = settings.security.sasl_username.as_deref(),
        nats = %settings.nats_url,
        "dcache-kafka bridge starting"
    );
    let result = consume::run(&consumer, &js, &stats, settings.stats_interval, &shutdown).await;
    // Closing commits what was acknowledged (the revoke callback) and leaves the group, so
    // that the other members take the partitions over at once; it blocks, so not here.
    let closing = tokio::task::spawn_blocking(move || drop(consumer));
    if tokio::time::timeout(CLOSE_DEADLINE, closing).await.is_err() {
        tracing::warn!("the Kafka consumer did not close within {CLOSE_DEADLINE:?}; the group times its session out");
    }
    let end = stats.snapshot();
    log_stats("stopped", &end);
    result.map(|()| end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> Settings {
        Settings::new(vec!["127.0.0.1:9092".into()], "nats://127.0.0.1:4222")
    }

    fn refused(f: &dyn Fn(&mut Settings)) -> String {
        let mut s = ok();
        f(&mut s);
        s.validate().expect_err("refused").to_string()
    }

    #[test]
    fn settings_refuse_bad_names() {
        ok().validate().expect("defaults are valid");
        assert_eq!(refused(&|s| s.brokers.clear()), "no Kafka broker given");
        assert!(refused(&|s| s.topic = "a topic".into()).starts_with("bad Kafka topic name"));
        assert!(refused(&|s| s.topic = "..".into()).starts_with("bad Kafka topic name"));
        assert!(refused(&|s| s.group = "a>".into()).starts_with("bad consumer group name"));
        assert!(refused(&|s| s.group = String::new()).starts_with("bad consumer group name"));
        let mut dotted = ok();
        dotted.group = "site-a.htfaas_1".into();
        dotted.validate().expect("dots are fine in a group name");
    }

    #[test]
    fn security_combinations_are_checked_with_clear_errors() {
        let sasl = |s: &mut Settings| {
            s.security.protocol = SecurityProtocol::SaslSsl;
            s.security.sasl_mechanism = Some(SaslMechanism::ScramSha512);
            s.security.sasl_username = Some("htfaas".into());
            s.security.sasl_password_file = Some("/etc/htfaas/kafka.password".into());
        };
        let mut good = ok();
        sasl(&mut good);
        good.validate().expect("complete sasl_ssl");
        good.security.ca_file = Some("/etc/htfaas/ca.pem".into());
        good.validate().expect("with a CA");

        assert_eq!(
            refused(&|s| {
                sasl(s);
                s.security.sasl_mechanism = None;
            }),
            "--security-protocol sasl_ssl needs --sasl-mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)"
        );
        assert_eq!(
            refused(&|s| {
                sasl(s);
                s.security.sasl_username = None;
            }),
            "--security-protocol sasl_ssl needs --sasl-username"
        );
        assert_eq!(
            refused(&|s| {
                sasl(s);
                s.security.protocol = SecurityProtocol::SaslPlaintext;
                s.security.sasl_password_file = None;
            }),
            "--security-protocol sasl_plaintext needs --sasl-password-file"
        );
        assert_eq!(
            refused(&|s| {
                sasl(s);
                s.security.sasl_username = Some(" ".into());
            }),
            "--sasl-username is empty"
        );
        assert_eq!(
            refused(&|s| {
                sasl(s);
                s.security.protocol = SecurityProtocol::Ssl;
            }),
            "--sasl-mechanism is given but --security-protocol is ssl: SASL needs sasl_plaintext or sasl_ssl"
        );
        assert_eq!(
            refused(&|s| s.security.sasl_password_file = Some("p".into())),
            "--sasl-password-file is given but --security-protocol is plaintext: SASL needs sasl_plaintext or sasl_ssl"
        );
        assert_eq!(
            refused(&|s| s.security.ca_file = Some("ca.pem".into())),
            "--ca-file is given but --security-protocol is plaintext: a CA is only used with ssl or sasl_ssl"
        );
        assert_eq!(
            refused(&|s| {
                sasl(s);
                s.security.protocol = SecurityProtocol::SaslPlaintext;
                s.security.ca_file = Some("ca.pem".into());
            }),
            "--ca-file is given but --security-protocol is sasl_plaintext: a CA is only used with ssl or sasl_ssl"
        );
    }

    #[test]
    fn protocols_and_mechanisms_parse_by_their_kafka_names() {
        for p in [
            SecurityProtocol::Plaintext,
            SecurityProtocol::Ssl,
            SecurityProtocol::SaslPlaintext,
            SecurityProtocol::SaslSsl,
        ] {
            assert_eq!(p.as_str().parse::<SecurityProtocol>().expect("parses"), p);
            assert_eq!(p.as_str().to_uppercase().parse::<SecurityProtocol>().expect("any case"), p);
        }
        for m in [SaslMechanism::Plain, SaslMechanism::ScramSha256, SaslMechanism::ScramSha512] {
            assert_eq!(m.as_str().parse::<SaslMechanism>().expect("parses"), m);
        }
        assert_eq!(
            "tls".parse::<SecurityProtocol>().expect_err("no").to_string(),
            r#"unknown security protocol "tls" (plaintext, ssl, sasl_plaintext or sasl_ssl)"#
        );
        assert_eq!(
            "GSSAPI".parse::<SaslMechanism>().expect_err("not built").to_string(),
            r#"unknown SASL mechanism "GSSAPI" (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)"#
        );
    }

    #[test]
    fn resolving_reads_the_password_file_and_checks_the_ca_file() {
        let dir = tempfile::tempdir().expect("dir");
        let mut s = ok();
        s.security.protocol = SecurityProtocol::SaslSsl;
        s.security.sasl_mechanism = Some(SaslMechanism::ScramSha256);
        s.security.sasl_username = Some("htfaas".into());
        s.security.sasl_password_file = Some(dir.path().join("missing"));
        let e = s.resolve().expect_err("no password file").to_string();
        assert!(e.starts_with(&format!("the SASL password file {}/missing: ", dir.path().display())), "{e}");
        std::fs::write(dir.path().join("password"), "pw\n").expect("write");
        s.security.sasl_password_file = Some(dir.path().join("password"));
        assert_eq!(s.resolve().expect("resolves").get("sasl.password"), Some("pw"));
        s.security.ca_file = Some(dir.path().join("ca.pem"));
        let e = s.resolve().expect_err("no CA file").to_string();
        assert!(e.starts_with(&format!("the CA file {}/ca.pem: ", dir.path().display())), "{e}");
    }
}
