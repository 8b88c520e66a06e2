//! Configuration: [`Config`] as read from a file, resolved once into ready [`Settings`]
//! (listener bound, store open, keys loaded, TLS certificate and key read when configured).

use crate::queue::Queue;
use anyhow::Context as _;
use htfaas_functions::token::{ATTACH_AUDIENCE, SUBMIT_AUDIENCE, SigningKey, Verifier};
use serde::Deserialize;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// Key id of the scheduler's attach-token key.
pub const ATTACH_KID: &str = "attach-1";
/// Shortest admin token accepted, bytes.
pub const MIN_ADMIN_TOKEN_BYTES: usize = 16;

/// Scheduler configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// HTTP address (submit, attach, admin). Tests use `127.0.0.1:0`. Default: `127.0.0.1:8090`.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// SQLite file of the job queue (WAL, `synchronous=FULL`). Default: `scheduler.sqlite`.
    #[serde(default = "default_db_path")]
    pub db_path: PathBuf,
    /// Issuer of attach tokens (their `iss`). Default: `htfaas-scheduler`.
    #[serde(default = "default_name")]
    pub name: String,
    /// Ed25519 PKCS#8 PEM key that signs attach tokens (kid `attach-1`); created (mode 0600)
    /// if absent. Default: `attach-key.pem`.
    #[serde(default = "default_attach_key_file")]
    pub attach_key_file: PathBuf,
    /// Issuers whose submit tokens are accepted. No default; empty means no one can submit.
    pub submit_issuers: Vec<TrustedIssuer>,
    /// Bearer token of the admin endpoints (`GET /v1/jobs`, `GET /v1/accounting`); at least
    /// 16 bytes. No default.
    pub admin_token: String,
    /// TLS certificate chain, PEM (leaf first, then intermediates). With `tls_key_file`, the
    /// listener serves HTTPS and WSS only (clients use `https://`, EPs dial `wss://`); both or
    /// neither. Default: none (plain HTTP).
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    /// Private key of `tls_cert_file`, PEM (PKCS#8, PKCS#1 or SEC1). Default: none.
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
}

/// An issuer of submit tokens and where its public keys are.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustedIssuer {
    /// The tokens' `iss`. No default.
    pub issuer: String,
    /// JWKS document with its public keys. No default.
    pub jwks_file: PathBuf,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8090))
}
fn default_db_path() -> PathBuf {
    PathBuf::from("scheduler.sqlite")
}
fn default_name() -> String {
    "htfaas-scheduler".into()
}
fn default_attach_key_file() -> PathBuf {
    PathBuf::from("attach-key.pem")
}

/// Everything [`crate::run`] needs, ready to use.
pub struct Settings {
    pub(crate) listener: tokio::net::TcpListener,
    pub(crate) local_addr: SocketAddr,
    pub(crate) queue: Queue,
    pub(crate) name: String,
    pub(crate) attach_key: SigningKey,
    pub(crate) attach_verifier: Verifier,
    pub(crate) submit_verifiers: HashMap<String, Verifier>,
    pub(crate) admin_token: String,
    /// Set when the listener serves TLS ([`Config::tls_cert_file`]).
    pub(crate) tls: Option<Arc<rustls::ServerConfig>>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("local_addr", &self.local_addr)
            .field("name", &self.name)
            .field("attach_key", &self.attach_key)
            .field("submit_issuers", &self.submit_verifiers.keys().collect::<Vec<_>>())
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// The address the listener is bound to (the real port when configured with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The base URL clients reach the listener at: `https://addr` with TLS, `http://addr`
    /// without (an EP turns it into `wss://…` or `ws://…`).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.local_addr)
    }

    /// Whether the listener serves TLS.
    pub fn tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The issuer name of attach tokens.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The key that signs attach tokens, for [`crate::mint_attach_token`].
    pub fn attach_key(&self) -> &SigningKey {
        &self.attach_key
    }
}

impl Config {
    /// Checks the configuration, reads the TLS certificate and key (if set), loads (or
    /// creates) the attach key, reads the issuers' key sets, opens the store and binds the
    /// listener.
    pub async fn resolve(self) -> anyhow::Result<Settings> {
        anyhow::ensure!(!self.name.is_empty(), "name must not be empty");
        anyhow::ensure!(
            self.admin_token.len() >= MIN_ADMIN_TOKEN_BYTES,
            "admin_token must be at least {MIN_ADMIN_TOKEN_BYTES} bytes"
        );
        let tls = match (&self.tls_cert_file, &self.tls_key_file) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some(crate::tls::server_config(cert, key)?),
            _ => anyhow::bail!("tls_cert_file and tls_key_file must be set together"),
        };
        let attach_key = SigningKey::load_or_create(&self.attach_key_file, ATTACH_KID)
            .with_context(|| format!("load attach key {}", self.attach_key_file.display()))?;
        let attach_verifier = Verifier::new(&self.name, ATTACH_AUDIENCE, &attach_key.jwks())
            .context("build the attach-token verifier")?;
        let mut submit_verifiers = HashMap::new();
        for t in &self.submit_issuers {
            let v = Verifier::from_jwks_file(&t.issuer, SUBMIT_AUDIENCE, &t.jwks_file)
                .with_context(|| format!("load the keys of submit issuer {:?}", t.issuer))?;
            anyhow::ensure!(
                submit_verifiers.insert(t.issuer.clone(), v).is_none(),
                "issuer {:?} listed twice",
                t.issuer
            );
        }
        if submit_verifiers.is_empty() {
            tracing::warn!("no submit issuer is trusted: every submit will be refused");
        }
        let db_path = self.db_path.clone();
        let queue = tokio::task::spawn_blocking(move || Queue::open(&db_path))
            .await
            .context("open the job store")?
            .with_context(|| format!("open the job store {}", self.db_path.display()))?;
        let listener =
            tokio::net::TcpListener::bind(self.listen).await.with_context(|| format!("bind {}", self.listen))?;
        let local_addr = listener.local_addr().context("read the bound address")?;
        Ok(Settings {
            listener,
            local_addr,
            queue,
            name: self.name,
            attach_key,
            attach_verifier,
            submit_verifiers,
            admin_token: self.admin_token,
            tls,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_refused_and_defaults_apply() {
        let c: Config =
            serde_json::from_str(r#"{"submit_issuers": [], "admin_token": "0123456789abcdef"}"#).expect("parses");
        assert_eq!(c.name, "htfaas-scheduler");
        assert_eq!(c.listen, default_listen());
        assert!(serde_json::from_str::<Config>(r#"{"submit_issuers": [], "admin_token": "x", "lisen": "1"}"#).is_err());
        assert_eq!((c.tls_cert_file, c.tls_key_file), (None, None));
    }

    #[tokio::test]
    async fn tls_files_go_together() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (cert, key) in [(Some("c.pem"), None), (None, Some("k.pem"))] {
            let c = Config {
                listen: "127.0.0.1:0".parse().expect("addr"),
                db_path: dir.path().join("q.sqlite"),
                name: "s".into(),
                attach_key_file: dir.path().join("attach.pem"),
                submit_issuers: vec![],
                admin_token: "0123456789abcdef".into(),
                tls_cert_file: cert.map(|c| dir.path().join(c)),
                tls_key_file: key.map(|k| dir.path().join(k)),
            };
            let e = c.resolve().await.expect_err("one TLS file alone");
            assert_eq!(e.to_string(), "tls_cert_file and tls_key_file must be set together");
        }
    }
}
