//! Checkpoint signing: the writer's Ed25519 key ([`AuditSigner`]), the verifiers' keys
//! ([`AuditKeys`], read from JWKS), the signed [`Checkpoint`] and when one is due
//! ([`CheckpointPolicy`]).
//!
//! Must not know: SQLite, the record chain, the wire types.

use super::AuditError;
use base64::Engine as _;
#[cfg(feature = "db")]
use ed25519_dalek::Signer as _;
use ed25519_dalek::VerifyingKey;
use ed25519_dalek::pkcs8::DecodePrivateKey as _;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

#[cfg(feature = "db")]
/// Domain separation of checkpoint signatures.
const CHECKPOINT_DOMAIN: &[u8] = b"htfaas-audit-checkpoint-v1\0";

/// Public keys that may sign checkpoints, by `kid`.
pub type AuditKeys = HashMap<String, VerifyingKey>;

/// The Ed25519 key a writer signs its checkpoints with, and its id.
pub struct AuditSigner {
    kid: String,
    key: ed25519_dalek::SigningKey,
    jwks: JwkSet,
}

impl std::fmt::Debug for AuditSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditSigner").field("kid", &self.kid).finish_non_exhaustive()
    }
}

impl AuditSigner {
    /// A new random key and its PKCS#8 PEM (as [`crate::token::SigningKey::generate`]).
    pub fn generate(kid: &str) -> Result<(AuditSigner, String), AuditError> {
        let (_, pem) = crate::token::SigningKey::generate(kid).map_err(|e| AuditError::Key(e.to_string()))?;
        Ok((AuditSigner::from_pem(kid, pem.as_bytes())?, pem))
    }

    /// Reads a PKCS#8 PEM Ed25519 private key (the format of the token keys).
    pub fn from_pem(kid: &str, pem: &[u8]) -> Result<AuditSigner, AuditError> {
        let jwks = crate::token::SigningKey::from_pem(kid, pem).map_err(|e| AuditError::Key(e.to_string()))?.jwks();
        let text = std::str::from_utf8(pem).map_err(|e| AuditError::Key(e.to_string()))?;
        let key = ed25519_dalek::SigningKey::from_pkcs8_pem(text).map_err(|e| AuditError::Key(e.to_string()))?;
        Ok(AuditSigner { kid: kid.to_owned(), key, jwks })
    }

    /// Loads the key at `path`, or creates it there (mode 0600), as the token keys are.
    pub fn load_or_create(path: &Path, kid: &str) -> Result<AuditSigner, AuditError> {
        crate::token::SigningKey::load_or_create(path, kid).map_err(|e| AuditError::Key(e.to_string()))?;
        let pem = std::fs::read(path).map_err(|e| AuditError::Key(format!("{}: {e}", path.display())))?;
        AuditSigner::from_pem(kid, &pem)
    }

    /// The key id.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public half as a JWKS document with one key (what [`keys_from_jwks`] reads).
    pub fn jwks(&self) -> JwkSet {
        self.jwks.clone()
    }

    /// The public half, for [`fn@super::verify`].
    pub fn keys(&self) -> AuditKeys {
        HashMap::from([(self.kid.clone(), self.key.verifying_key())])
    }

    #[cfg(feature = "db")]
    pub(super) fn sign(&self, writer: &str, seq: u64, hash: &str, time_ms: u64) -> Result<Checkpoint, AuditError> {
        let message = checkpoint_message(writer, seq, hash, time_ms)
            .ok_or_else(|| AuditError::Corrupt(format!("record {seq} has a malformed hash")))?;
        let signature = hex::encode(self.key.sign(&message).to_bytes());
        Ok(Checkpoint {
            writer: writer.to_owned(),
            seq,
            hash: hash.to_owned(),
            time_ms,
            kid: self.kid.clone(),
            signature,
        })
    }
}

/// Every Ed25519 key with a `kid` in `jwks` (other keys are skipped).
pub fn keys_from_jwks(jwks: &JwkSet) -> Result<AuditKeys, AuditError> {
    let mut keys = AuditKeys::new();
    for jwk in &jwks.keys {
        let (Some(kid), AlgorithmParameters::OctetKeyPair(okp)) = (&jwk.common.key_id, &jwk.algorithm) else {
            continue;
        };
        if okp.curve != EllipticCurve::Ed25519 {
            continue;
        }
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(okp.x.trim_end_matches('='))
            .map_err(|e| AuditError::Key(format!("key {kid}: {e}")))?;
        let bytes: [u8; 32] =
            bytes.try_into().map_err(|_| AuditError::Key(format!("key {kid}: not a 32-byte Ed25519 key")))?;
        let key = VerifyingKey::from_bytes(&bytes).map_err(|e| AuditError::Key(format!("key {kid}: {e}")))?;
        keys.insert(kid.clone(), key);
    }
    Ok(keys)
}

/// [`keys_from_jwks`] of a JWKS document's text (a file written from `GET /v1/audit/keys`).
pub fn keys_from_jwks_text(text: &str) -> Result<AuditKeys, AuditError> {
    let jwks: JwkSet = serde_json::from_str(text).map_err(|e| AuditError::Key(format!("not a JWKS document: {e}")))?;
    keys_from_jwks(&jwks)
}

/// A signed statement that record `seq` of `writer`'s log has `hash`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The log's writer.
    pub writer: String,
    /// The record it names.
    pub seq: u64,
    /// That record's hash.
    pub hash: String,
    /// When it was signed, Unix ms.
    pub time_ms: u64,
    /// The signing key's id.
    pub kid: String,
    /// Ed25519 signature over the checkpoint message, hex.
    pub signature: String,
}

#[cfg(feature = "db")]
/// The signed message, or `None` when `hash` is not 64 hex digits.
fn checkpoint_message(writer: &str, seq: u64, hash: &str, time_ms: u64) -> Option<Vec<u8>> {
    let hash: [u8; 32] = hex::decode(hash).ok()?.try_into().ok()?;
    let writer_len = u32::try_from(writer.len()).ok()?;
    let mut m = Vec::with_capacity(CHECKPOINT_DOMAIN.len() + 4 + writer.len() + 8 + 32 + 8);
    m.extend_from_slice(CHECKPOINT_DOMAIN);
    m.extend_from_slice(&writer_len.to_be_bytes());
    m.extend_from_slice(writer.as_bytes());
    m.extend_from_slice(&seq.to_be_bytes());
    m.extend_from_slice(&hash);
    m.extend_from_slice(&time_ms.to_be_bytes());
    Some(m)
}

#[cfg(feature = "db")]
/// Why a checkpoint's signature does not hold ([`Checkpoint::check_signature`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum SignatureError {
    /// No key of the set has the checkpoint's `kid`.
    #[error("it is signed with an unknown key {0:?}")]
    UnknownKey(String),
    /// The checkpoint's `hash` is not 64 hex digits.
    #[error("its hash is not 64 hex digits")]
    BadHash,
    /// The checkpoint's `signature` is not 128 hex digits.
    #[error("its signature is not 128 hex digits")]
    BadEncoding,
    /// The signature does not verify under the key named `kid`.
    #[error("its signature does not verify under key {0:?}")]
    DoesNotVerify(String),
}

impl Checkpoint {
    #[cfg(feature = "db")]
    /// Why the signature does not hold under `keys`, if it does not.
    pub(super) fn check_signature(&self, keys: &AuditKeys) -> Result<(), SignatureError> {
        let key = keys.get(&self.kid).ok_or_else(|| SignatureError::UnknownKey(self.kid.clone()))?;
        let message =
            checkpoint_message(&self.writer, self.seq, &self.hash, self.time_ms).ok_or(SignatureError::BadHash)?;
        let bytes: [u8; 64] =
            hex::decode(&self.signature).ok().and_then(|b| b.try_into().ok()).ok_or(SignatureError::BadEncoding)?;
        key.verify_strict(&message, &ed25519_dalek::Signature::from_bytes(&bytes))
            .map_err(|_| SignatureError::DoesNotVerify(self.kid.clone()))
    }
}

/// When a writer signs a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointPolicy {
    /// After this many records since the last checkpoint. Default: 1000.
    pub every_records: u64,
    /// At the first append this long after the last checkpoint, ms. Default: 60 000.
    pub every_ms: u64,
}

impl Default for CheckpointPolicy {
    fn default() -> Self {
        CheckpointPolicy { every_records: 1000, every_ms: 60_000 }
    }
}
