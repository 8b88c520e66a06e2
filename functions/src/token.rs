//! Submit tokens and attach tokens: JWTs signed with Ed25519 (`EdDSA`), with a `kid` so that
//! keys rotate through a JWKS document.
//!
//! - A **submit token** says "the bearer may submit `jobs` jobs of at most these resources,
//!   optionally of this function". The gateway mints one per job; the scheduler verifies it
//!   and counts its uses per `jti`.
//! - An **attach token** lets an EP dial the scheduler; the scheduler mints it with its own key.
//! - An **API token** ([`ApiClaims`]) lets a person or a service call the gateway's HTTP API
//!   with a [`Scope`]: `developer` (the functions and jobs of its `sub`) or `admin`
//!   (everything). The gateway mints and verifies it with its submit-token key; its audience
//!   ([`API_AUDIENCE`]) differs from the submit audience, so neither kind passes for the other.
//!
//! - A **renewal grant** ([`RenewClaims`]) lets the scheduler ask the gateway for
//!   fresh macaroons of one job; the gateway mints and verifies it alone, so it is MAC'd
//!   (`HS256`) under a key derived from its submit-token key ([`MacKey`], in `mac`).
//!
//! The algorithm is taken from our key set, never from the token header.

mod mac;
pub use mac::MacKey;

use crate::digest::Digest;
use base64::Engine as _;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// Audience of submit tokens: the scheduler's submit endpoint.
pub const SUBMIT_AUDIENCE: &str = "htfaas-scheduler";
/// Audience of attach tokens: the scheduler's EP endpoint.
pub const ATTACH_AUDIENCE: &str = "htfaas-scheduler/attach";
/// Audience of API tokens: the gateway's HTTP API. Distinct from [`SUBMIT_AUDIENCE`], so an API
/// token is no submit token and a submit token no API token.
pub const API_AUDIENCE: &str = "htfaas-api";
/// Audience of renewal grants ([`RenewClaims`]): the gateway's renewal route. Distinct from
/// every other audience, so a grant is no submit, attach or API token, and none of those a grant.
pub const RENEW_AUDIENCE: &str = "htfaas-gateway/renew";
/// Clock skew allowed between components, seconds: a token whose `exp` passed less than this
/// long ago, or whose `nbf` or `iat` lies less than this far in the future (its issuer's clock
/// runs ahead), is accepted; past it, refused as [`TokenError::Expired`] or
/// [`TokenError::NotYetValid`].
pub const LEEWAY_S: u64 = 5;

/// Claims of a submit token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitClaims {
    /// Issuer (the gateway's name).
    pub iss: String,
    /// The owner every job submitted with it is accounted to.
    pub sub: String,
    /// [`SUBMIT_AUDIENCE`].
    pub aud: String,
    /// Expiry, Unix seconds.
    pub exp: u64,
    /// Issued at, Unix seconds.
    pub iat: u64,
    /// Unique id; the scheduler counts uses per `jti`.
    pub jti: String,
    /// How many jobs it may submit. 1 for a triggered job.
    pub jobs: u32,
    /// Most cores one job may ask for.
    pub cpus: u32,
    /// Most memory one job may ask for, MiB.
    pub memory_mb: u64,
    /// Longest run time one job may ask for, seconds.
    pub runtime_s: u64,
    /// When set, the only function the token may run: its `FunctionRef::bound_digest` (the
    /// module's digest; a native function's image and command together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<Digest>,
    /// When set, the accounting group its jobs are charged to (within the owner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// Claims of a renewal grant: the gateway signs one per job, with its submit-token
/// key, and only the gateway verifies it ([`RENEW_AUDIENCE`]). It lets its bearer (the
/// scheduler, which keeps it sealed) ask the gateway for fresh macaroons for exactly this input
/// file and output directory, as long as neither the token nor its owner is revoked and the
/// owner's namespace still allows both.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewClaims {
    /// Issuer (the gateway's name).
    pub iss: String,
    /// The job's owner: its submit token's `sub`.
    pub sub: String,
    /// [`RENEW_AUDIENCE`].
    pub aud: String,
    /// Expiry, Unix seconds: past any time the job could still be running.
    pub exp: u64,
    /// Issued at, Unix seconds.
    pub iat: u64,
    /// The job's submit token's `jti`: a revocation of it revokes the grant.
    pub jti: String,
    /// The function's registered name.
    pub function: String,
    /// Its version.
    pub version: u32,
    /// Its module's digest.
    pub digest: Digest,
    /// The storage path of the input file; none for a job without an input (a run on no
    /// file), which is renewed its write macaroon alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// The storage path of the output directory.
    pub output: String,
    /// The storage URL of the job's checkpoint area, for a job that keeps checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// The job's reference files, for a job that reads some: the digest of their storage URLs
    /// in order ([`crate::proto::refs_digest`]), so that a renewal names exactly them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refs: Option<Digest>,
}

/// Claims of an attach token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachClaims {
    /// Issuer (the scheduler's name).
    pub iss: String,
    /// Who the EP belongs to: `site` for a site EP, otherwise an owner.
    pub sub: String,
    /// [`ATTACH_AUDIENCE`].
    pub aud: String,
    /// Expiry, Unix seconds.
    pub exp: u64,
    /// Issued at, Unix seconds.
    pub iat: u64,
    /// Unique id.
    pub jti: String,
    /// When set, the EP runs only this owner's jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// When set, the EP runs only jobs that ask for this annex, and those run nowhere else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annex: Option<String>,
}

/// What an API token allows at the gateway's HTTP API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// The functions, jobs, accounting rows and audit records of the token's `sub`.
    Developer,
    /// Every route: other owners, EPs, priorities, revocations, replays, statistics.
    Admin,
}

impl Scope {
    /// The name used in tokens and in the OpenAPI document.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Developer => "developer",
            Scope::Admin => "admin",
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Scope {
    type Err = UnknownScope;
    fn from_str(s: &str) -> Result<Scope, UnknownScope> {
        match s {
            "developer" => Ok(Scope::Developer),
            "admin" => Ok(Scope::Admin),
            other => Err(UnknownScope(other.to_owned())),
        }
    }
}

/// A scope name other than `developer` and `admin`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown scope {0:?} (developer, admin)")]
pub struct UnknownScope(pub String);

/// Claims of an API token: who calls the gateway's HTTP API, and with which [`Scope`].
/// An unknown `scope` string makes the whole token fail to decode (refused as invalid).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiClaims {
    /// Issuer (the gateway's name).
    pub iss: String,
    /// The owner the caller acts as: a developer sees and changes only what this owner owns.
    pub sub: String,
    /// [`API_AUDIENCE`].
    pub aud: String,
    /// What it allows.
    pub scope: Scope,
    /// Issued at, Unix seconds.
    pub iat: u64,
    /// Expiry, Unix seconds.
    pub exp: u64,
    /// Unique id; a revocation may name it.
    pub jti: String,
}

impl ApiClaims {
    /// Claims for `sub` with `scope`, issued now by `iss`, valid for `ttl_s` seconds.
    pub fn new(iss: &str, sub: &str, scope: Scope, ttl_s: u64) -> ApiClaims {
        let now = now_s();
        ApiClaims {
            iss: iss.to_owned(),
            sub: sub.to_owned(),
            aud: API_AUDIENCE.to_owned(),
            scope,
            iat: now,
            exp: now.saturating_add(ttl_s),
            jti: new_jti(),
        }
    }
}

/// Why a token was refused. The message names the failed check.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// Not a JWT, or its parts do not decode.
    #[error("malformed token: {0}")]
    Malformed(String),
    /// `kid` missing or not in the key set.
    #[error("unknown signing key {0:?}")]
    UnknownKey(Option<String>),
    /// Signature does not verify.
    #[error("invalid signature")]
    InvalidSignature,
    /// Past `exp` (plus leeway).
    #[error("token expired")]
    Expired,
    /// Before `nbf` (minus leeway).
    #[error("token not yet valid")]
    NotYetValid,
    /// `aud` is not ours.
    #[error("wrong audience")]
    WrongAudience,
    /// `iss` is not trusted.
    #[error("wrong issuer")]
    WrongIssuer,
    /// Any other validation failure (e.g. a required claim missing, wrong algorithm).
    #[error("invalid token: {0}")]
    Invalid(String),
    /// Key material could not be read or made.
    #[error("key: {0}")]
    Key(String),
}

impl From<jsonwebtoken::errors::Error> for TokenError {
    fn from(e: jsonwebtoken::errors::Error) -> Self {
        use jsonwebtoken::errors::ErrorKind as K;
        match e.kind() {
            K::InvalidSignature => TokenError::InvalidSignature,
            K::ExpiredSignature => TokenError::Expired,
            K::ImmatureSignature => TokenError::NotYetValid,
            K::InvalidAudience => TokenError::WrongAudience,
            K::InvalidIssuer => TokenError::WrongIssuer,
            K::InvalidToken | K::Base64(_) | K::Json(_) | K::Utf8(_) => TokenError::Malformed(e.to_string()),
            _ => TokenError::Invalid(e.to_string()),
        }
    }
}

/// The token of an `Authorization` header value of the `Bearer` scheme (RFC 6750; the scheme
/// name is case-insensitive), trimmed; `None` for another scheme or an empty token. The one
/// parser of bearer headers every server uses.
pub fn bearer(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.trim_start().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Whether two secrets (tokens, MACs, digests of secrets) are equal, in time that does not
/// depend on where they differ (`subtle`); unequal lengths are unequal at once (a length is no
/// secret). The one comparison of secrets every crate uses.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq as _;
    bool::from(a.ct_eq(b))
}

/// Seconds since the Unix epoch (defined in [`crate::time`], named here as it always was).
pub use crate::time::now_s;

/// A fresh token id: a UUIDv7, 48 bits of Unix milliseconds then 74 random bits, so that ids
/// minted one after another sort together and the indexes keyed by them (single-use counts,
/// audit records) grow at one end instead of dirtying a random page per insert.
pub fn new_jti() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// Eight random hex digits, to make an id unique beside a name it carries (a rerun's scratch
/// directory, a replay). Not a token id's head: that is its time.
pub fn random_tag() -> String {
    format!("{:08x}", uuid::Uuid::new_v4().as_u128() as u32)
}

/// An Ed25519 signing key with its id.
///
/// Signs with the key held expanded ([`ed25519_dalek::SigningKey`]) and the token's header
/// encoded once: `jsonwebtoken::encode` derived the public key from the private one again on
/// every call (a second scalar multiplication per token), which was half of the gateway's
/// signing time, and signing two tokens per job was a seventh of its CPU.
pub struct SigningKey {
    kid: String,
    key: ed25519_dalek::SigningKey,
    /// The base64url JOSE header, `{"typ":"JWT","alg":"EdDSA","kid":…}`, and its `.`.
    header: String,
    public: Jwk,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey").field("kid", &self.kid).finish_non_exhaustive()
    }
}

/// PKCS#8 v1 prefix of an Ed25519 private key (as `openssl genpkey -algorithm ed25519` writes it).
const ED25519_PKCS8_PREFIX: [u8; 16] =
    [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];

impl SigningKey {
    /// A new random key; returns it and its PKCS#8 PEM for storing.
    pub fn generate(kid: &str) -> Result<(SigningKey, String), TokenError> {
        let seed = ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng).to_bytes();
        let mut der = ED25519_PKCS8_PREFIX.to_vec();
        der.extend_from_slice(&seed);
        let b64 = base64::engine::general_purpose::STANDARD.encode(&der);
        let pem = format!("-----BEGIN PRIVATE KEY-----\n{b64}\n-----END PRIVATE KEY-----\n");
        Ok((SigningKey::from_pem(kid, pem.as_bytes())?, pem))
    }

    /// Reads a PKCS#8 PEM Ed25519 private key.
    pub fn from_pem(kid: &str, pem: &[u8]) -> Result<SigningKey, TokenError> {
        use ed25519_dalek::pkcs8::DecodePrivateKey as _;
        let encoding = EncodingKey::from_ed_pem(pem).map_err(|e| TokenError::Key(e.to_string()))?;
        let mut public =
            Jwk::from_encoding_key(&encoding, Algorithm::EdDSA).map_err(|e| TokenError::Key(e.to_string()))?;
        public.common.key_id = Some(kid.to_owned());
        let text = std::str::from_utf8(pem).map_err(|e| TokenError::Key(format!("the key's PEM: {e}")))?;
        let key = ed25519_dalek::SigningKey::from_pkcs8_pem(text).map_err(|e| TokenError::Key(e.to_string()))?;
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(kid.to_owned());
        let header = serde_json::to_vec(&header).map_err(|e| TokenError::Key(format!("encode the header: {e}")))?;
        let header = format!("{}.", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(header));
        Ok(SigningKey { kid: kid.to_owned(), key, header, public })
    }

    /// Loads the key at `path`, or creates it there (mode 0600) if absent.
    pub fn load_or_create(path: &Path, kid: &str) -> Result<SigningKey, TokenError> {
        match std::fs::read(path) {
            Ok(pem) => {
                // A key file an older build (or a person) left readable to others: 0600 now.
                if let Err(e) = crate::store::make_private(path) {
                    tracing::warn!(path = %path.display(), "failed to make the key file 0600: {e}");
                }
                SigningKey::from_pem(kid, &pem)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let (key, pem) = SigningKey::generate(kid)?;
                write_private(path, pem.as_bytes()).map_err(|e| TokenError::Key(format!("{}: {e}", path.display())))?;
                Ok(key)
            }
            Err(e) => Err(TokenError::Key(format!("{}: {e}", path.display()))),
        }
    }

    /// The key id.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public half, as a JWKS document with one key.
    pub fn jwks(&self) -> JwkSet {
        JwkSet { keys: vec![self.public.clone()] }
    }

    /// Signs `claims` with `alg: EdDSA` and this key's `kid`: a JWS compact token (RFC 7515,
    /// RFC 8037), exactly what `jsonwebtoken::encode` makes of them (Ed25519 is deterministic).
    pub fn sign<C: Serialize>(&self, claims: &C) -> Result<String, TokenError> {
        use ed25519_dalek::Signer as _;
        let b64 = &base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let claims = serde_json::to_vec(claims).map_err(|e| TokenError::Key(format!("encode the claims: {e}")))?;
        let mut token = String::with_capacity(self.header.len() + claims.len() * 4 / 3 + 90);
        token.push_str(&self.header);
        b64.encode_string(&claims, &mut token);
        let signature = self.key.sign(token.as_bytes());
        token.push('.');
        b64.encode_string(signature.to_bytes(), &mut token);
        Ok(token)
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::store::create_private_dir(dir)?;
    }
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Verifies tokens of one issuer for one audience against a set of public keys.
#[derive(Clone)]
pub struct Verifier {
    issuer: String,
    audience: String,
    keys: HashMap<String, (DecodingKey, Algorithm)>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("kids", &self.keys.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Verifier {
    /// Trusts every EdDSA key with a `kid` in `jwks`.
    pub fn new(issuer: &str, audience: &str, jwks: &JwkSet) -> Result<Verifier, TokenError> {
        let mut keys = HashMap::new();
        for jwk in &jwks.keys {
            let Some(kid) = jwk.common.key_id.clone() else { continue };
            let key = DecodingKey::from_jwk(jwk).map_err(|e| TokenError::Key(e.to_string()))?;
            keys.insert(kid, (key, Algorithm::EdDSA));
        }
        if keys.is_empty() {
            return Err(TokenError::Key("JWKS has no key with a kid".into()));
        }
        Ok(Verifier { issuer: issuer.to_owned(), audience: audience.to_owned(), keys })
    }

    /// [`Verifier::verify`] for an API token: the standard checks first (so that a submit
    /// token is refused for its audience), then the API claims (`scope` known).
    pub fn verify_api(&self, token: &str) -> Result<ApiClaims, TokenError> {
        let claims: serde_json::Value = self.verify(token)?;
        serde_json::from_value(claims).map_err(|e| TokenError::Invalid(format!("API token claims: {e}")))
    }

    /// Reads a JWKS document from `path` and trusts its keys.
    pub fn from_jwks_file(issuer: &str, audience: &str, path: &Path) -> Result<Verifier, TokenError> {
        let text = std::fs::read(path).map_err(|e| TokenError::Key(format!("{}: {e}", path.display())))?;
        let jwks: JwkSet =
            serde_json::from_slice(&text).map_err(|e| TokenError::Key(format!("{}: {e}", path.display())))?;
        Verifier::new(issuer, audience, &jwks)
    }

    /// Checks signature, `kid`, issuer, audience, expiry, `nbf` and `iat` (each with
    /// [`LEEWAY_S`] of clock skew: a token issued by a clock a little ahead is no token from
    /// the future), then decodes the claims. Use-counting (`jti`) is the caller's job.
    pub fn verify<C: DeserializeOwned>(&self, token: &str) -> Result<C, TokenError> {
        let header = jsonwebtoken::decode_header(token)?;
        let (key, alg) = header
            .kid
            .as_ref()
            .and_then(|kid| self.keys.get(kid))
            .ok_or_else(|| TokenError::UnknownKey(header.kid.clone()))?;
        let mut validation = Validation::new(*alg);
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.leeway = LEEWAY_S;
        // A token may say when it becomes valid; honour it when present.
        validation.validate_nbf = true;
        let claims = jsonwebtoken::decode::<serde_json::Value>(token, key, &validation)?.claims;
        // jsonwebtoken does not look at `iat`: one further ahead than the skew we allow is
        // refused as `nbf` would be.
        if let Some(iat) = claims.get("iat").and_then(serde_json::Value::as_u64)
            && iat > now_s().saturating_add(LEEWAY_S)
        {
            return Err(TokenError::NotYetValid);
        }
        serde_json::from_value(claims).map_err(|e| TokenError::Malformed(e.to_string()))
    }
}

/// Writes `jwks` as JSON to `path`, atomically: a verifier reading the file meanwhile (a
/// scheduler starting beside a gateway that starts too) reads the old keys or the new ones,
/// never a truncated file.
pub fn write_jwks(path: &Path, jwks: &JwkSet) -> std::io::Result<()> {
    let text = serde_json::to_vec_pretty(jwks).map_err(std::io::Error::other)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut partial = path.as_os_str().to_owned();
    partial.push(format!(".partial-{}", std::process::id()));
    let partial = std::path::PathBuf::from(partial);
    std::fs::write(&partial, text)?;
    std::fs::rename(&partial, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&partial);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jwks_file_is_replaced_whole_and_no_partial_file_is_left() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("keys/submit.jwks.json");
        let (first, _) = SigningKey::generate("first").expect("key");
        let (second, _) = SigningKey::generate("second").expect("key");
        write_jwks(&path, &first.jwks()).expect("write");
        write_jwks(&path, &second.jwks()).expect("write over");
        let read: JwkSet = serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("whole JSON");
        assert_eq!(read, second.jwks());
        let names: Vec<_> = std::fs::read_dir(path.parent().expect("dir"))
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("submit.jwks.json")], "only the file");
    }

    #[test]
    fn bearer_headers_are_read_one_way() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer  abc "), Some("abc"));
        assert_eq!(bearer("BEARER abc"), Some("abc"));
        assert_eq!(bearer("Bearer "), None);
        assert_eq!(bearer("Bearer"), None);
        assert_eq!(bearer("Basic YTpi"), None);
        assert_eq!(bearer("Bearerabc"), None);
    }

    fn claims(exp: u64) -> SubmitClaims {
        SubmitClaims {
            iss: "gw".into(),
            sub: "alice".into(),
            aud: SUBMIT_AUDIENCE.into(),
            exp,
            iat: now_s(),
            jti: new_jti(),
            jobs: 1,
            cpus: 1,
            memory_mb: 2048,
            runtime_s: 60,
            function: Some(Digest::of(b"m")),
            group: None,
        }
    }

    fn pair() -> (SigningKey, Verifier) {
        let (key, _) = SigningKey::generate("k1").expect("keygen");
        let verifier = Verifier::new("gw", SUBMIT_AUDIENCE, &key.jwks()).expect("verifier");
        (key, verifier)
    }

    #[test]
    fn a_signed_token_verifies_and_round_trips() {
        let (key, verifier) = pair();
        let c = claims(now_s() + 60);
        let token = key.sign(&c).expect("sign");
        assert_eq!(verifier.verify::<SubmitClaims>(&token).expect("verifies"), c);
    }

    /// The signer with the key held expanded makes byte for byte the token `jsonwebtoken`
    /// makes (Ed25519 signatures are deterministic), for a key read from its PEM.
    #[test]
    fn tokens_are_exactly_what_jsonwebtoken_signs() {
        let (_, pem) = SigningKey::generate("k1").expect("keygen");
        let key = SigningKey::from_pem("k1", pem.as_bytes()).expect("from pem");
        let encoding = EncodingKey::from_ed_pem(pem.as_bytes()).expect("encoding key");
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some("k1".into());
        for c in [claims(now_s() + 60), SubmitClaims { group: Some("physics".into()), ..claims(1) }] {
            let expected = jsonwebtoken::encode(&header, &c, &encoding).expect("encode");
            assert_eq!(key.sign(&c).expect("sign"), expected);
        }
    }

    #[test]
    fn refuses_expired_forged_tampered_and_wrong_audience() {
        let (key, verifier) = pair();
        let expired = key.sign(&claims(now_s() - LEEWAY_S - 10)).expect("sign");
        assert!(matches!(verifier.verify::<SubmitClaims>(&expired), Err(TokenError::Expired)));

        let (forger, _) = SigningKey::generate("k1").expect("keygen");
        let forged = forger.sign(&claims(now_s() + 60)).expect("sign");
        assert!(matches!(verifier.verify::<SubmitClaims>(&forged), Err(TokenError::InvalidSignature)));

        let (other_kid, _) = SigningKey::generate("k2").expect("keygen");
        let unknown = other_kid.sign(&claims(now_s() + 60)).expect("sign");
        assert!(matches!(verifier.verify::<SubmitClaims>(&unknown), Err(TokenError::UnknownKey(_))));

        let mut wrong_aud = claims(now_s() + 60);
        wrong_aud.aud = ATTACH_AUDIENCE.into();
        let wrong_aud = key.sign(&wrong_aud).expect("sign");
        assert!(matches!(verifier.verify::<SubmitClaims>(&wrong_aud), Err(TokenError::WrongAudience)));

        // Widen a claim in the payload, keep the signature.
        let token = key.sign(&claims(now_s() + 60)).expect("sign");
        let parts: Vec<&str> = token.split('.').collect();
        let mut widened = claims(now_s() + 60);
        widened.cpus = 64;
        let body = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &widened, &EncodingKey::from_secret(b"x"))
            .expect("encode");
        let payload = body.split('.').nth(1).expect("payload");
        let tampered = format!("{}.{}.{}", parts[0], payload, parts[2]);
        assert!(matches!(verifier.verify::<SubmitClaims>(&tampered), Err(TokenError::InvalidSignature)));

        // Algorithm confusion: an HS256 token naming our kid.
        let mut h = Header::new(Algorithm::HS256);
        h.kid = Some("k1".into());
        let hs = jsonwebtoken::encode(&h, &claims(now_s() + 60), &EncodingKey::from_secret(b"k1")).expect("encode");
        assert!(verifier.verify::<SubmitClaims>(&hs).is_err());

        assert!(matches!(verifier.verify::<SubmitClaims>("not.a.jwt"), Err(TokenError::Malformed(_))));
    }

    #[test]
    fn api_tokens_and_submit_tokens_do_not_pass_for_each_other() {
        let (key, submit_verifier) = pair();
        let api_verifier = Verifier::new("gw", API_AUDIENCE, &key.jwks()).expect("verifier");
        let api = ApiClaims::new("gw", "alice", Scope::Developer, 60);
        let api_token = key.sign(&api).expect("sign");
        assert_eq!(api_verifier.verify::<ApiClaims>(&api_token).expect("verifies"), api);
        // Same key, other audience: refused both ways.
        assert!(submit_verifier.verify::<SubmitClaims>(&api_token).is_err());
        let as_submit = submit_verifier.verify::<serde_json::Value>(&api_token);
        assert!(matches!(as_submit, Err(TokenError::WrongAudience)), "{as_submit:?}");
        let submit_token = key.sign(&claims(now_s() + 60)).expect("sign");
        assert!(matches!(api_verifier.verify_api(&submit_token), Err(TokenError::WrongAudience)));
        // Expired, forged.
        let mut expired = ApiClaims::new("gw", "alice", Scope::Admin, 0);
        expired.exp = now_s() - LEEWAY_S - 10;
        let expired = key.sign(&expired).expect("sign");
        assert!(matches!(api_verifier.verify_api(&expired), Err(TokenError::Expired)));
        let (forger, _) = SigningKey::generate("k1").expect("keygen");
        let forged = forger.sign(&ApiClaims::new("gw", "alice", Scope::Admin, 60)).expect("sign");
        assert!(matches!(api_verifier.verify_api(&forged), Err(TokenError::InvalidSignature)));
    }

    #[test]
    fn an_api_token_with_an_unknown_or_missing_scope_is_refused() {
        let (key, _) = pair();
        let verifier = Verifier::new("gw", API_AUDIENCE, &key.jwks()).expect("verifier");
        let submit = key.sign(&claims(now_s() + 60)).expect("sign");
        let mut claims = serde_json::to_value(ApiClaims::new("gw", "alice", Scope::Developer, 60)).expect("json");
        for scope in [serde_json::json!("root"), serde_json::json!("Admin"), serde_json::json!(["admin"])] {
            claims["scope"] = scope.clone();
            let token = key.sign(&claims).expect("sign");
            assert!(matches!(verifier.verify::<ApiClaims>(&token), Err(TokenError::Malformed(_))), "{scope}");
            let Err(TokenError::Invalid(message)) = verifier.verify_api(&token) else { panic!("{scope} accepted") };
            assert!(message.starts_with("API token claims: "), "{message}");
        }
        claims.as_object_mut().expect("object").remove("scope");
        let token = key.sign(&claims).expect("sign");
        assert!(verifier.verify::<ApiClaims>(&token).is_err());
        assert!(matches!(verifier.verify_api(&token), Err(TokenError::Invalid(_))));
        // A submit token of the same key: refused for its audience, before its claims are read.
        assert!(matches!(verifier.verify_api(&submit), Err(TokenError::WrongAudience)));
        assert_eq!("admin".parse::<Scope>(), Ok(Scope::Admin));
        assert!("root".parse::<Scope>().is_err());
    }

    #[test]
    fn keys_persist_and_reload() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("k.pem");
        let a = SigningKey::load_or_create(&path, "k").expect("create");
        let b = SigningKey::load_or_create(&path, "k").expect("load");
        assert_eq!(a.jwks(), b.jwks());
        let verifier = Verifier::new("gw", SUBMIT_AUDIENCE, &b.jwks()).expect("verifier");
        let token = a.sign(&claims(now_s() + 60)).expect("sign");
        assert!(verifier.verify::<SubmitClaims>(&token).is_ok());
    }

    #[test]
    fn refuses_alg_none_and_not_yet_valid_tokens() {
        let (key, verifier) = pair();
        // `alg: none` with our kid and an empty signature: the header does not even parse as a
        // token we accept.
        let b64 = |v: &serde_json::Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).expect("json"))
        };
        let header = b64(&serde_json::json!({"alg": "none", "typ": "JWT", "kid": "k1"}));
        let payload = b64(&serde_json::to_value(claims(now_s() + 60)).expect("json"));
        for token in [format!("{header}.{payload}."), format!("{header}.{payload}")] {
            assert!(verifier.verify::<SubmitClaims>(&token).is_err(), "alg none accepted: {token}");
        }

        #[derive(Serialize)]
        struct WithNbf {
            #[serde(flatten)]
            claims: SubmitClaims,
            nbf: u64,
        }
        let early = key.sign(&WithNbf { claims: claims(now_s() + 600), nbf: now_s() + 300 }).expect("sign");
        assert!(matches!(verifier.verify::<SubmitClaims>(&early), Err(TokenError::NotYetValid)));
        let ready = key.sign(&WithNbf { claims: claims(now_s() + 600), nbf: now_s() - 1 }).expect("sign");
        assert!(verifier.verify::<SubmitClaims>(&ready).is_ok());
    }

    /// Clocks differ by a few seconds between components. A
    /// token minted by a clock up to [`LEEWAY_S`] ahead (its `iat`, or its `nbf`, in the
    /// verifier's future) or checked by a clock up to [`LEEWAY_S`] ahead (its `exp` just past) is
    /// accepted; beyond the bound it is refused, naming why. Margins of 2 s keep the test off
    /// the second boundaries.
    #[test]
    fn clock_skew_within_the_leeway_is_accepted_and_beyond_it_refused_with_the_reason() {
        #[derive(Serialize)]
        struct WithNbf {
            #[serde(flatten)]
            claims: SubmitClaims,
            nbf: u64,
        }
        let (key, verifier) = pair();
        let verify = |c: &SubmitClaims| verifier.verify::<SubmitClaims>(&key.sign(c).expect("sign"));
        let issued_at = |iat: u64| SubmitClaims { iat, ..claims(iat + 300) };
        let within = LEEWAY_S - 2;
        let beyond = LEEWAY_S + 2;

        // The issuer's clock ahead: `iat` in the future.
        assert!(verify(&issued_at(now_s() + within)).is_ok(), "iat {within} s ahead, within the skew");
        assert!(matches!(verify(&issued_at(now_s() + beyond)), Err(TokenError::NotYetValid)));
        assert_eq!(TokenError::NotYetValid.to_string(), "token not yet valid");
        // ... or an explicit `nbf` in the future.
        for (nbf, ok) in [(now_s() + within, true), (now_s() + beyond, false)] {
            let token = key.sign(&WithNbf { claims: claims(now_s() + 600), nbf }).expect("sign");
            match verifier.verify::<SubmitClaims>(&token) {
                Ok(_) => assert!(ok, "nbf {beyond} s ahead accepted"),
                Err(TokenError::NotYetValid) => assert!(!ok, "nbf {within} s ahead refused"),
                Err(e) => panic!("nbf: {e}"),
            }
        }
        // The verifier's clock ahead: `exp` just past.
        let expired_by = |s: u64| SubmitClaims { iat: now_s() - 300, ..claims(now_s() - s) };
        assert!(verify(&expired_by(within)).is_ok(), "expired {within} s ago, within the skew");
        let Err(e) = verify(&expired_by(beyond)) else { panic!("expired {beyond} s ago accepted") };
        assert!(matches!(e, TokenError::Expired), "{e:?}");
        assert_eq!(e.to_string(), "token expired");

        // The same bound for API tokens, which the gateway verifies.
        let api = Verifier::new("gw", API_AUDIENCE, &key.jwks()).expect("verifier");
        let mut ahead = ApiClaims::new("gw", "alice", Scope::Developer, 600);
        ahead.iat = now_s() + within;
        assert!(api.verify_api(&key.sign(&ahead).expect("sign")).is_ok());
        ahead.iat = now_s() + beyond;
        assert!(matches!(api.verify_api(&key.sign(&ahead).expect("sign")), Err(TokenError::NotYetValid)));
    }
}
