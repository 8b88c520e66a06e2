//! How an htfaas component authenticates to NATS, and the one place every NATS client of htfaas
//! builds its connect options ([`connect_options`]).
//!
//! A credential is an nkey user seed (`SU…`, an Ed25519 seed): the component signs the
//! server's nonce with it, so the server holds only public keys and no secret crosses the wire.
//! Each credential has an inbox prefix of its own (`_INBOX.<public key>`): the replies to its
//! requests (JetStream PubAcks, API answers, pulled messages) arrive there, and the server lets
//! only that credential subscribe to it, so no client reads another's replies.
//!
//! What a credential may publish and subscribe to is the server's configuration (the local
//! stack writes it: `htfaas::nats`); this module knows no subject and decides no permission.
//! It never logs or prints a seed: [`NatsCredential`]'s `Debug` shows the public key only.

use std::path::{Path, PathBuf};

/// Why a credential could not be read.
#[derive(Debug, thiserror::Error)]
pub enum NatsAuthError {
    /// Not an nkey user seed.
    #[error("not an nkey user seed (`SU…`): {0}")]
    Seed(String),
    /// The seed file could not be read.
    #[error("read the nkey seed file {path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why (shown in the message, so not also returned as its source).
        error: std::io::Error,
    },
}

/// An nkey user credential: the seed (secret) and its public key (`U…`). Read from a config
/// as the seed string.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "String")]
pub struct NatsCredential {
    seed: String,
    public_key: String,
}

impl std::fmt::Debug for NatsCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsCredential").field("public_key", &self.public_key).finish_non_exhaustive()
    }
}

impl TryFrom<String> for NatsCredential {
    type Error = NatsAuthError;

    fn try_from(seed: String) -> Result<Self, Self::Error> {
        NatsCredential::from_seed(&seed)
    }
}

impl NatsCredential {
    /// A new random user credential.
    pub fn generate() -> NatsCredential {
        let pair = nkeys::KeyPair::new_user();
        let seed = pair.seed().expect("a freshly generated key pair has its seed");
        NatsCredential { seed, public_key: pair.public_key() }
    }

    /// The credential of the user seed `seed` (surrounding whitespace ignored).
    pub fn from_seed(seed: &str) -> Result<NatsCredential, NatsAuthError> {
        let seed = seed.trim();
        let pair = nkeys::KeyPair::from_seed(seed).map_err(|e| NatsAuthError::Seed(e.to_string()))?;
        if pair.key_pair_type() != nkeys::KeyPairType::User {
            return Err(NatsAuthError::Seed(format!("a seed of a {:?} key, not of a user", pair.key_pair_type())));
        }
        Ok(NatsCredential { seed: seed.to_owned(), public_key: pair.public_key() })
    }

    /// The credential whose seed is the content of `path` (as `nsc` and `nk` write it).
    pub fn from_seed_file(path: &Path) -> Result<NatsCredential, NatsAuthError> {
        let text =
            std::fs::read_to_string(path).map_err(|error| NatsAuthError::Read { path: path.to_owned(), error })?;
        NatsCredential::from_seed(&text)
    }

    /// The seed: a secret, for a config file of the component that owns it.
    pub fn seed(&self) -> &str {
        &self.seed
    }

    /// The public key (`U…`), which the server's configuration names.
    pub fn public_key(&self) -> &str {
        &self.public_key
    }

    /// Where replies to this credential's requests arrive: `_INBOX.<public key>`; its clients
    /// subscribe under it, and the server allows only this credential to.
    pub fn inbox_prefix(&self) -> String {
        format!("_INBOX.{}", self.public_key)
    }
}

/// Connect options named `name`, authenticating with `credential` (and using its inbox
/// prefix) when there is one; without, the client connects anonymously, which only a server
/// without authorization accepts. Callers add their own reconnect and event settings.
pub fn connect_options(name: &str, credential: Option<&NatsCredential>) -> async_nats::ConnectOptions {
    let options = async_nats::ConnectOptions::new().name(name);
    match credential {
        Some(c) => options.nkey(c.seed.clone()).custom_inbox_prefix(c.inbox_prefix()),
        None => options,
    }
}

/// The servers of a `nats_url` setting: one URL, or several separated by commas (the members
/// of a NATS cluster, e.g. `nats://10.0.0.1:4222,nats://10.0.0.2:4222`). A client connects to
/// any of them and, when that one goes, to another (and to those the cluster advertises).
pub fn servers(nats_url: &str) -> Result<Vec<async_nats::ServerAddr>, NatsUrlError> {
    let urls: Vec<&str> = nats_url.split(',').map(str::trim).filter(|u| !u.is_empty()).collect();
    if urls.is_empty() {
        return Err(NatsUrlError { url: nats_url.to_owned(), why: "no server named".into() });
    }
    urls.into_iter()
        .map(|u| u.parse().map_err(|e: std::io::Error| NatsUrlError { url: u.to_owned(), why: e.to_string() }))
        .collect()
}

/// A `nats_url` setting that names no usable server.
#[derive(Debug, thiserror::Error)]
#[error("NATS URL {url:?}: {why}")]
pub struct NatsUrlError {
    /// The URL (or the list) as given.
    pub url: String,
    /// What is wrong with it.
    pub why: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nats_url_names_one_server_or_a_comma_separated_cluster() {
        assert_eq!(servers("nats://127.0.0.1:4222").expect("one").len(), 1);
        let three = servers("nats://10.0.0.1:4222, nats://10.0.0.2:4222,nats://10.0.0.3:4222").expect("three");
        assert_eq!(three.len(), 3);
        assert_eq!(three[1].host(), "10.0.0.2");
        assert!(servers("").is_err());
        assert!(servers(" , ").is_err());
        let e = servers("nats://a:1,http://b:2").expect_err("wrong scheme").to_string();
        assert!(e.contains("http://b:2"), "{e}");
    }

    #[test]
    fn a_generated_seed_reads_back_and_debug_hides_it() {
        let c = NatsCredential::generate();
        assert!(c.seed().starts_with("SU") && c.public_key().starts_with('U'), "{c:?}");
        let again = NatsCredential::from_seed(&format!("{}\n", c.seed())).expect("reads back");
        assert_eq!(again, c);
        assert_eq!(c.inbox_prefix(), format!("_INBOX.{}", c.public_key()));
        let shown = format!("{c:?}");
        assert!(shown.contains(c.public_key()) && !shown.contains(c.seed()), "{shown}");
        let parsed: NatsCredential = serde_json::from_value(serde_json::json!(c.seed())).expect("from a config");
        assert_eq!(parsed, c);
    }

    #[test]
    fn a_non_user_seed_or_garbage_is_refused() {
        let account = nkeys::KeyPair::new_account().seed().expect("seed");
        let e = NatsCredential::from_seed(&account).expect_err("an account seed");
        assert!(e.to_string().contains("not of a user"), "{e}");
        for bad in ["", "SUxyz", "not a seed"] {
            assert!(NatsCredential::from_seed(bad).is_err(), "{bad:?}");
        }
        assert!(serde_json::from_value::<NatsCredential>(serde_json::json!("SUnope")).is_err());
    }
}
