//! Configuration: [`Config`] as read from a file, resolved once into ready [`Settings`]
//! (bound listener, loaded secret and users, connected NATS).

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream;
use htfaas_functions::proto::{EVENTS_MAX_AGE_S, EVENTS_STREAM, EVENTS_SUBJECT, EVENTS_SUBJECTS, PATH_SUBJECTS};
use serde::Deserialize;

use crate::auth::Users;
use crate::macaroons::RootKey;
use htfaas_functions::store::Durability;

/// Storage endpoint configuration (a section of the htfaas config file).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// HTTP listen address. Default: `127.0.0.1:2880` (dCache's WebDAV port). Tests use `127.0.0.1:0`.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Root of the served namespace: URL path `/a/b` is `data_dir/a/b`. Required; created if absent.
    pub data_dir: PathBuf,
    /// Macaroon root secret: hex of at least 32 bytes. Required; created (32 random bytes, hex,
    /// mode 0600) if absent. The signing key is derived from it as libmacaroons does.
    pub secret_file: PathBuf,
    /// Users allowed to authenticate with HTTP Basic (JSON, see `crate::auth::Users`). Required.
    pub users_file: PathBuf,
    /// NATS server URL. Default: none. When set, every completed upload is published as a
    /// dCache `transfer` message on JetStream before the PUT is answered.
    #[serde(default)]
    pub nats_url: Option<String>,
    /// The storage's NATS credential: an nkey user seed (`SU…`), a secret. The server should let
    /// it publish the billing subject and look up (or create) the events stream only, and
    /// subscribe to its inbox (`_INBOX.<its public key>.>`) for the PubAcks. Default: none (a
    /// server without authorization).
    #[serde(default)]
    pub nats_nkey_seed: Option<htfaas_functions::nats::NatsCredential>,
    /// Replicas of the events stream when the storage is the first to make it (a NATS cluster
    /// keeps each message on this many servers). Default: 1.
    #[serde(default = "default_replicas")]
    pub events_stream_replicas: usize,
    /// Base URL put in macaroon responses' `uri`. Default: `http://<bound address>`
    /// (`https://…` with TLS).
    #[serde(default)]
    pub public_url: Option<String>,
    /// TLS certificate chain, PEM (leaf first, then intermediates). With `tls_key_file`, the
    /// storage serves HTTPS only: passwords, macaroons and files travel over it, as with a
    /// dCache WebDAV door on `https://`. Default: none (plain HTTP, for one host's loopback).
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    /// Private key of `tls_cert_file`, PEM (PKCS#8, PKCS#1 or SEC1). Default: none.
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
    /// Whether billing messages go on their file's path subject
    /// (`storage.dcache.billing.path.<dir>._`: the gateway reads each owner's on a lane of its
    /// own) rather than on `storage.dcache.billing` (as dCache's). The storage's NATS
    /// credential must be allowed to publish `storage.dcache.billing.path.>`. Default: true.
    #[serde(default = "default_true")]
    pub billing_path_subjects: bool,
    /// Cell name: `cellName` in billing messages and the macaroon location. Default: `htfaas-storage`.
    #[serde(default = "default_cell_name")]
    pub cell_name: String,
    /// Whether an upload is fsynced (file and directory) before the PUT is answered (`fsync`,
    /// the default) or only written (`log`: it survives a crash of this process, not of the
    /// machine). See [`Durability`].
    #[serde(default)]
    pub durability: Durability,
    /// The listener's header and body idle timeouts and connection cap. Default: see
    /// [`htfaas_functions::serve::Limits`] (an upload that sends nothing for 60 s fails; a
    /// slow one that keeps sending goes on).
    #[serde(default)]
    pub http: htfaas_functions::serve::Limits,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 2880))
}

fn default_true() -> bool {
    true
}

fn default_replicas() -> usize {
    1
}

fn default_cell_name() -> String {
    "htfaas-storage".into()
}

/// Everything [`crate::run`] needs, ready to use.
#[derive(Debug)]
pub struct Settings {
    pub(crate) listener: tokio::net::TcpListener,
    pub(crate) local_addr: SocketAddr,
    /// Canonical data directory.
    pub(crate) data_dir: PathBuf,
    pub(crate) key: RootKey,
    pub(crate) users: Users,
    /// JetStream context when NATS is configured.
    pub(crate) jetstream: Option<jetstream::Context>,
    /// Without trailing slash.
    pub(crate) public_url: String,
    pub(crate) cell_name: String,
    /// Publish on path subjects ([`Config::billing_path_subjects`], and the stream has them).
    pub(crate) billing_path_subjects: bool,
    pub(crate) durability: Durability,
    pub(crate) http: htfaas_functions::serve::Limits,
    /// Set when the storage serves HTTPS ([`Config::tls_cert_file`]).
    pub(crate) tls: Option<std::sync::Arc<rustls::ServerConfig>>,
}

impl Settings {
    /// The address the listener is bound to (the real port when `listen` had port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Config {
    /// Binds the listener, loads (or creates) the secret, loads the users, creates the data
    /// directory and, when `nats_url` is set, connects to NATS and ensures the events stream.
    pub async fn resolve(self) -> anyhow::Result<Settings> {
        if self.cell_name.is_empty() || self.cell_name.contains(char::is_whitespace) {
            anyhow::bail!("cell_name {:?} must be non-empty without whitespace", self.cell_name);
        }
        self.http.check()?;
        let tls = htfaas_functions::serve::tls::optional_server_config(
            self.tls_cert_file.as_deref(),
            self.tls_key_file.as_deref(),
        )?;
        htfaas_functions::store::create_private_dir(&self.data_dir)
            .with_context(|| format!("create data_dir {}", self.data_dir.display()))?;
        let data_dir = std::fs::canonicalize(&self.data_dir)
            .with_context(|| format!("resolve data_dir {}", self.data_dir.display()))?;
        let secret = load_or_create_secret(&self.secret_file)?;
        let key = RootKey::derive(&secret);
        let users = Users::load(&self.users_file)?;

        let (jetstream, billing_path_subjects) = match &self.nats_url {
            None => (None, self.billing_path_subjects),
            Some(url) => {
                let (js, stream_has_paths) =
                    connect_nats(url, self.nats_nkey_seed.as_ref(), &self.cell_name, self.events_stream_replicas)
                        .await?;
                if self.billing_path_subjects && !stream_has_paths {
                    tracing::warn!(
                        stream = EVENTS_STREAM,
                        "the events stream lacks {PATH_SUBJECTS} (made by an older gateway that has not started \
                         since): billing messages go on {EVENTS_SUBJECT} until the storage restarts"
                    );
                }
                (Some(js), self.billing_path_subjects && stream_has_paths)
            }
        };

        let listener =
            tokio::net::TcpListener::bind(self.listen).await.with_context(|| format!("bind {}", self.listen))?;
        let local_addr = listener.local_addr().context("read the bound address")?;
        let public_url = self
            .public_url
            .map(|u| u.trim_end_matches('/').to_owned())
            .unwrap_or_else(|| format!("{}://{local_addr}", if tls.is_some() { "https" } else { "http" }));
        tracing::info!(
            %local_addr,
            tls = tls.is_some(),
            data_dir = %data_dir.display(),
            nats = self.nats_url.is_some(),
            "storage configured"
        );
        Ok(Settings {
            listener,
            local_addr,
            data_dir,
            key,
            users,
            jetstream,
            public_url,
            cell_name: self.cell_name,
            billing_path_subjects,
            durability: self.durability,
            http: self.http,
            tls,
        })
    }
}

/// Connects, ensures the events stream; returns the context and whether the stream keeps the
/// path subjects (an older one, made before them, may not: the gateway widens it at its start,
/// and the storage may not change a stream).
async fn connect_nats(
    url: &str,
    credential: Option<&htfaas_functions::nats::NatsCredential>,
    cell_name: &str,
    replicas: usize,
) -> anyhow::Result<(jetstream::Context, bool)> {
    let client = htfaas_functions::nats::connect_options(cell_name, credential)
        .connect(htfaas_functions::nats::servers(url)?)
        .await
        .with_context(|| format!("connect to NATS at {url}"))?;
    let js = jetstream::new(client);
    let stream = js
        .get_or_create_stream(jetstream::stream::Config {
            name: EVENTS_STREAM.to_owned(),
            subjects: EVENTS_SUBJECTS.iter().map(|s| (*s).to_owned()).collect(),
            storage: jetstream::stream::StorageType::File,
            max_age: Duration::from_secs(EVENTS_MAX_AGE_S),
            num_replicas: replicas,
            ..Default::default()
        })
        .await
        .with_context(|| format!("ensure JetStream stream {EVENTS_STREAM}"))?;
    let has_paths = stream.cached_info().config.subjects.iter().any(|s| s == PATH_SUBJECTS);
    Ok((js, has_paths))
}

/// Reads the hex secret, or creates it (32 random bytes, hex, mode 0600) if the file is absent.
fn load_or_create_secret(path: &Path) -> anyhow::Result<Vec<u8>> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let secret =
                hex::decode(text.trim()).with_context(|| format!("secret_file {} must hold hex", path.display()))?;
            if secret.len() < 32 {
                anyhow::bail!("secret_file {} holds {} bytes; at least 32 needed", path.display(), secret.len());
            }
            warn_if_readable_by_others(path);
            Ok(secret)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                htfaas_functions::store::create_private_dir(parent)
                    .with_context(|| format!("create {}", parent.display()))?;
            }
            let secret: [u8; 32] = rand::random();
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt as _;
                opts.mode(0o600);
            }
            let mut f = opts.open(path).with_context(|| format!("create secret_file {}", path.display()))?;
            f.write_all(format!("{}\n", hex::encode(secret)).as_bytes())
                .and_then(|()| f.sync_all())
                .with_context(|| format!("write secret_file {}", path.display()))?;
            tracing::info!(path = %path.display(), "created a new macaroon root secret");
            Ok(secret.to_vec())
        }
        Err(e) => Err(e).with_context(|| format!("read secret_file {}", path.display())),
    }
}

fn warn_if_readable_by_others(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        if let Ok(meta) = std::fs::metadata(path)
            && meta.permissions().mode() & 0o077 != 0
        {
            tracing::warn!(path = %path.display(), "secret_file is readable by group or others; chmod 600 it");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_parses_with_defaults_and_refuses_unknown_fields() {
        let c: Config =
            serde_json::from_str(r#"{"data_dir":"/d","secret_file":"/s","users_file":"/u"}"#).expect("parses");
        assert_eq!(c.listen, default_listen());
        assert_eq!(c.cell_name, "htfaas-storage");
        assert!(c.nats_url.is_none() && c.public_url.is_none());
        let e = serde_json::from_str::<Config>(r#"{"data_dir":"/d","secret_file":"/s","users_file":"/u","x":1}"#)
            .expect_err("unknown field");
        assert!(e.to_string().contains("unknown field"), "{e}");
    }

    #[test]
    fn secret_is_created_0600_then_reloaded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("sub/secret");
        let a = load_or_create_secret(&p).expect("creates");
        assert_eq!(a.len(), 32);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&p).expect("exists").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert_eq!(load_or_create_secret(&p).expect("reloads"), a);
        std::fs::write(&p, "abcd").expect("writes");
        assert!(load_or_create_secret(&p).is_err(), "too short");
        std::fs::write(&p, "zz").expect("writes");
        assert!(load_or_create_secret(&p).is_err(), "not hex");
    }
}
