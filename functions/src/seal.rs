//! Sealing secrets a store keeps (the scheduler's jobs' macaroons and secrets, the registry's
//! function secrets): a reader of the database (a copied file, a backup, a read-only report
//! connection) must not be able to use them. Each value is stored as `sealed-v1:` +
//! base64url(nonce ‖ ChaCha20-Poly1305 ciphertext and tag) under a 256-bit key kept in a file of
//! its own (0600; by default next to the database, [`default_key_file`], and best kept apart:
//! another volume, not in the same backup). The associated data names the slot (`input`,
//! `output`, `secret:<function>:<name>`…), so a sealed value cannot be moved into another slot.
//!
//! A stored value without the prefix was written before sealing existed: [`Sealer::open`]
//! reads it as it is (the scheduler seals those of unfinished jobs when its store opens).
//!
//! This module knows nothing of SQL, jobs or the wire: strings in, strings out.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom as _, SystemRandom};
use std::path::{Path, PathBuf};

/// What marks a sealed value.
pub const PREFIX: &str = "sealed-v1:";

/// Why a value could not be sealed or opened.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// The key file could not be read, created or parsed.
    #[error("seal key {path}: {reason}")]
    Key {
        /// The key file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// A sealed value that does not open under this key (another key, another slot, or altered).
    #[error("a sealed {field} does not open with this seal key (another key or slot, or altered)")]
    Open {
        /// The slot (`input`, `output`, `secret:…`).
        field: String,
    },
    /// The system's random source failed.
    #[error("no randomness for a nonce")]
    Random,
}

/// The default key file of the database at `db`: `<db>.seal.key` beside it.
pub fn default_key_file(db: &Path) -> PathBuf {
    let mut name = db.file_name().map(|n| n.to_os_string()).unwrap_or_else(|| "jobs".into());
    name.push(".seal.key");
    db.with_file_name(name)
}

/// Seals and opens values under one key.
pub struct Sealer {
    key: LessSafeKey,
    random: SystemRandom,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer").finish_non_exhaustive()
    }
}

impl Sealer {
    /// The key in `path` (64 hex digits), created (32 random bytes, 0600, its directory 0700 if
    /// missing) when there is none. An existing file is tightened to 0600.
    pub fn load_or_create(path: &Path) -> Result<Sealer, SealError> {
        let err = |reason: String| SealError::Key { path: path.display().to_string(), reason };
        let bytes = match std::fs::read_to_string(path) {
            Ok(text) => {
                if let Err(e) = crate::store::make_private(path) {
                    tracing::warn!(path = %path.display(), "failed to make the seal key 0600: {e}");
                }
                let bytes = hex::decode(text.trim()).map_err(|e| err(format!("not hex: {e}")))?;
                <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| err("not 32 bytes".into()))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut key = [0u8; 32];
                SystemRandom::new().fill(&mut key).map_err(|_| SealError::Random)?;
                write_new_private(path, format!("{}\n", hex::encode(key)).as_bytes())
                    .map_err(|e| err(e.to_string()))?;
                tracing::info!(path = %path.display(), "created a new seal key");
                key
            }
            Err(e) => return Err(err(e.to_string())),
        };
        Ok(Sealer::from_key(&bytes))
    }

    /// A sealer with `key`.
    pub fn from_key(key: &[u8; 32]) -> Sealer {
        let key = UnboundKey::new(&CHACHA20_POLY1305, key).expect("a 32-byte key is ChaCha20-Poly1305's length");
        Sealer { key: LessSafeKey::new(key), random: SystemRandom::new() }
    }

    /// `plain` sealed for the slot `field`; an already sealed value is kept.
    pub fn seal(&self, field: &str, plain: &str) -> Result<String, SealError> {
        if plain.starts_with(PREFIX) {
            return Ok(plain.to_owned());
        }
        let mut nonce = [0u8; NONCE_LEN];
        self.random.fill(&mut nonce).map_err(|_| SealError::Random)?;
        let mut buf = plain.as_bytes().to_vec();
        self.key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(field.as_bytes()), &mut buf)
            .map_err(|_| SealError::Random)?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&buf);
        Ok(format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(out)))
    }

    /// The value in `stored` (sealed for `field`, or plain from before sealing).
    pub fn open(&self, field: &str, stored: &str) -> Result<String, SealError> {
        let Some(sealed) = stored.strip_prefix(PREFIX) else {
            return Ok(stored.to_owned());
        };
        let bad = || SealError::Open { field: field.to_owned() };
        let mut bytes = URL_SAFE_NO_PAD.decode(sealed).map_err(|_| bad())?;
        if bytes.len() < NONCE_LEN {
            return Err(bad());
        }
        let mut body = bytes.split_off(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(&bytes).map_err(|_| bad())?;
        let plain = self.key.open_in_place(nonce, Aad::from(field.as_bytes()), &mut body).map_err(|_| bad())?;
        String::from_utf8(plain.to_vec()).map_err(|_| bad())
    }
}

fn write_new_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::store::create_private_dir(dir)?;
    }
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_with_their_key_and_field_and_plain_ones_pass() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = default_key_file(&dir.path().join("jobs.sqlite"));
        assert!(path.ends_with("jobs.sqlite.seal.key"));
        let s = Sealer::load_or_create(&path).expect("create");
        let again = Sealer::load_or_create(&path).expect("load");
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777, 0o600);

        let sealed = s.seal("input", "MDAxY2xvY2F0aW9uIGh0ZmFhcwo").expect("seal");
        assert!(sealed.starts_with(PREFIX) && !sealed.contains("MDAxY2xvY2F0aW9u"), "{sealed}");
        assert_eq!(again.open("input", &sealed).expect("open"), "MDAxY2xvY2F0aW9uIGh0ZmFhcwo");
        assert_eq!(s.seal("input", &sealed).expect("kept"), sealed, "sealing twice is sealing once");
        assert_eq!(s.open("input", "plain-from-an-old-store").expect("plain"), "plain-from-an-old-store");

        let other = Sealer::from_key(&[7u8; 32]);
        assert_eq!(
            other.open("input", &sealed).map_err(|e| e.to_string()).expect_err("another key"),
            "a sealed input does not open with this seal key (another key or slot, or altered)"
        );
        assert!(s.open("output", &sealed).is_err(), "a read macaroon cannot move into the write slot");
        let mut altered = sealed.clone();
        altered.pop();
        altered.push(if sealed.ends_with('A') { 'B' } else { 'A' });
        assert!(s.open("input", &altered).is_err());
        assert!(s.open("input", &format!("{PREFIX}!!")).is_err());
        assert!(s.open("input", PREFIX).is_err());
    }
}
