//! `htfaas bridge xrootd-notify|dcache-sse|dcache-kafka`: a storage system's own event channel
//! to NATS ([`htfaas_bridges`]); `dcache-kafka` needs the binary's `kafka` feature. Must not
//! know: the stack (a bridge runs at the site).

use super::signals::on_signals;
use clap::Subcommand;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum BridgeCommand {
    /// Read XRootD `ofs.notify` lines and publish them as CloudEvents on
    /// `storage.cloudevents.xrootd-notify` (JetStream; the gateway creates the stream).
    ///
    /// Program mode: `ofs.notify closew create rm mv |/usr/bin/htfaas bridge xrootd-notify --nats URL`;
    /// FIFO mode: `ofs.notify closew create rm mv >PATH` and `--fifo PATH`. Recommended with
    /// `ofs.notifymsg closew $TID closew $LFN $FSIZE` (the size of written files).
    XrootdNotify {
        /// NATS server URL, e.g. nats://127.0.0.1:4222.
        #[arg(long = "nats")]
        nats: String,
        /// File holding the bridge's NATS nkey user seed (`SU…`); the server lets it publish
        /// on `storage.cloudevents.xrootd-notify` only. Default: connect without a credential.
        #[arg(long)]
        nats_nkey_seed_file: Option<PathBuf>,
        /// Read the FIFO of `ofs.notify … >PATH` (created by xrootd) instead of stdin.
        #[arg(long)]
        fifo: Option<PathBuf>,
        /// Put this in front of every XRootD path (LFN) to make the site's storage path.
        #[arg(long, default_value = "")]
        path_prefix: String,
        /// The XRootD host named in the events' source (xrootd://HOST). Default: this host's name.
        #[arg(long)]
        source_host: Option<String>,
    },
    /// Follow a dCache frontend's SSE storage events (inotify) and publish them as CloudEvents on
    /// `storage.cloudevents.dcache-sse` (JetStream; the gateway creates the stream).
    ///
    /// Resumes with `Last-Event-ID` from its state file, which also keeps the channel and its
    /// watches across restarts; lost events (EVENT_LOSS, IN_Q_OVERFLOW, a lost channel) are
    /// published as `org.htfaas.storage.dcache-sse.event-loss` markers.
    DcacheSse {
        /// Frontend REST base URL, e.g. https://dcache.example.org:3880/api/v1.
        #[arg(long)]
        frontend: String,
        /// Absolute path to watch (repeatable). Watches are not recursive unless --recursive.
        #[arg(long = "watch", required = true)]
        watch: Vec<String>,
        /// inotify flags, comma-separated. Default: IN_CLOSE_WRITE,IN_MOVED_TO,IN_CREATE,IN_DELETE.
        #[arg(long, value_delimiter = ',')]
        flags: Vec<String>,
        /// Also watch directories created or moved in below the watched paths.
        #[arg(long)]
        recursive: bool,
        /// File holding a bearer token (OIDC or macaroon); re-read at each request.
        #[arg(long, required_unless_present = "user", conflicts_with = "user")]
        token_file: Option<PathBuf>,
        /// dCache user for HTTP Basic (with --secret-file).
        #[arg(long, requires = "secret_file")]
        user: Option<String>,
        /// File holding the password of --user.
        #[arg(long, requires = "user")]
        secret_file: Option<PathBuf>,
        /// Extra trusted CA certificate(s), PEM.
        #[arg(long)]
        ca: Option<PathBuf>,
        /// State file (channel, watches, last published event id).
        #[arg(long)]
        state: PathBuf,
        /// NATS server URL.
        #[arg(long = "nats", default_value = "nats://127.0.0.1:4222")]
        nats: String,
        /// File holding the bridge's NATS nkey user seed (`SU…`); the server lets it publish
        /// on `storage.cloudevents.dcache-sse` only. Default: connect without a credential.
        #[arg(long)]
        nats_nkey_seed_file: Option<PathBuf>,
    },
    /// Read dCache's billing messages from its Kafka topic and publish each, unchanged, on NATS
    /// JetStream where the gateway reads dCache billing: on the file's path subject
    /// (`storage.dcache.billing.path.<dir>._`), or on `storage.dcache.billing` when it names no
    /// usable path; malformed records are counted and skipped.
    ///
    /// Point dCache's Kafka producer at the brokers (`dcache.enable.kafka=true`, or since 11.2
    /// `dcache.billing.enable.kafka=true`; `dcache.kafka.bootstrap-servers`, topic
    /// `dcache.kafka.topic`, default `billing`). The bridge is a member of the Kafka consumer
    /// group --group and commits each partition's offset to it after JetStream acknowledged the
    /// records before it: a restart resumes there, and bridges in one group share the partitions.
    DcacheKafka {
        /// Kafka bootstrap brokers, host:port, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        brokers: Vec<String>,
        /// The billing topic (dCache's `dcache.kafka.topic`).
        #[arg(long, default_value = "billing")]
        topic: String,
        /// The Kafka consumer group ([A-Za-z0-9._-]): bridges in one group share the partitions;
        /// a bridge in another group reads the whole topic again.
        #[arg(long, alias = "consumer", default_value = "htfaas")]
        group: String,
        /// Where a partition the group has no offset for starts: `latest` (events from now on)
        /// or `earliest` (everything Kafka still keeps).
        #[arg(long, default_value = "latest", value_parser = ["latest", "earliest"])]
        start: String,
        /// How to reach the brokers.
        #[arg(long, default_value = "plaintext", value_parser = ["plaintext", "ssl", "sasl_plaintext", "sasl_ssl"])]
        security_protocol: String,
        /// CA certificate(s), PEM, that signed the brokers' certificates (ssl, sasl_ssl).
        /// Default: the system's CAs.
        #[arg(long)]
        ca_file: Option<PathBuf>,
        /// SASL mechanism (sasl_plaintext, sasl_ssl).
        #[arg(long, value_parser = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])]
        sasl_mechanism: Option<String>,
        /// SASL user name (sasl_plaintext, sasl_ssl).
        #[arg(long)]
        sasl_username: Option<String>,
        /// File holding the SASL password, one line, read at start (sasl_plaintext, sasl_ssl).
        #[arg(long)]
        sasl_password_file: Option<PathBuf>,
        /// NATS server URL.
        #[arg(long = "nats", default_value = "nats://127.0.0.1:4222")]
        nats: String,
        /// File holding the bridge's NATS nkey user seed (`SU…`); the server lets it publish
        /// billing messages only. Default: connect without a credential.
        #[arg(long)]
        nats_nkey_seed_file: Option<PathBuf>,
    },
}

/// `htfaas bridge …`.
pub async fn run(command: BridgeCommand) -> anyhow::Result<()> {
    match command {
        BridgeCommand::XrootdNotify { nats, nats_nkey_seed_file, fifo, path_prefix, source_host } => {
            use htfaas_bridges::xrootd::{Input, Settings, run};
            let mut settings = Settings::new(nats, fifo.map_or(Input::Stdin, Input::Fifo));
            settings.nats_credential = nats_seed(nats_nkey_seed_file.as_deref())?;
            settings.path_prefix = path_prefix;
            if let Some(host) = source_host {
                settings.source_host = host;
            }
            run(settings, on_signals()).await.map(|_| ())
        }
        BridgeCommand::DcacheSse {
            frontend,
            watch,
            flags,
            recursive,
            token_file,
            user,
            secret_file,
            ca,
            state,
            nats,
            nats_nkey_seed_file,
        } => {
            use htfaas_bridges::sse;
            let auth = match (token_file, user, secret_file) {
                (Some(token_file), None, None) => sse::Auth::Bearer { token_file },
                (None, Some(user), Some(secret_file)) => sse::Auth::Basic { user, secret_file },
                _ => anyhow::bail!("give either --token-file or --user with --secret-file"),
            };
            let mut settings = sse::Settings::new(&frontend, auth, watch, state, &nats);
            if !flags.is_empty() {
                settings.flags = flags;
            }
            settings.recursive = recursive;
            settings.ca_file = ca;
            settings.nats_credential = nats_seed(nats_nkey_seed_file.as_deref())?;
            sse::run(settings, on_signals()).await
        }
        #[cfg(not(feature = "kafka"))]
        BridgeCommand::DcacheKafka { .. } => anyhow::bail!(
            "this htfaas was built without the dCache Kafka bridge (librdkafka): build it with \
             `cargo build --features kafka`"
        ),
        #[cfg(feature = "kafka")]
        BridgeCommand::DcacheKafka {
            brokers,
            topic,
            group,
            start,
            security_protocol,
            ca_file,
            sasl_mechanism,
            sasl_username,
            sasl_password_file,
            nats,
            nats_nkey_seed_file,
        } => {
            use htfaas_bridges::kafka::{Security, Settings, StartAt, run};
            let mut settings = Settings::new(brokers, nats);
            settings.topic = topic;
            settings.group = group;
            settings.start = if start == "earliest" { StartAt::Earliest } else { StartAt::Latest };
            settings.security = Security {
                protocol: security_protocol.parse()?,
                ca_file,
                sasl_mechanism: sasl_mechanism.as_deref().map(str::parse).transpose()?,
                sasl_username,
                sasl_password_file,
            };
            settings.nats_credential = nats_seed(nats_nkey_seed_file.as_deref())?;
            run(settings, on_signals()).await.map(|_| ())
        }
    }
}

/// The NATS credential whose seed `file` holds, if one is given.
fn nats_seed(file: Option<&std::path::Path>) -> anyhow::Result<Option<htfaas_functions::nats::NatsCredential>> {
    Ok(file.map(htfaas_functions::nats::NatsCredential::from_seed_file).transpose()?)
}
