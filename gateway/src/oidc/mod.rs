//! Bearer tokens of the site's OIDC provider(s): JWTs from the issuers listed in the gateway's
//! configuration ([`IssuerConfig`]), verified against each issuer's published keys.
//!
//! - **Which issuer**: the token's `iss`, read before any check, picks the configuration; an
//!   issuer not listed is refused. Nothing else is trusted from the unverified token.
//! - **Keys**: discovered from `<issuer>/.well-known/openid-configuration` (whose `issuer`
//!   must be the configured one, exactly) then its `jwks_uri`, and cached. A `kid` the cache
//!   lacks makes one fetch of the keys (a key rotation), at most every [`REFETCH_MIN_S`]
//!   seconds per issuer and one at a time, so unknown `kid`s cannot make a fetch storm; keys
//!   older than [`KEYS_MAX_AGE_S`] are fetched again at the next token, the old ones kept if
//!   that fails. Each fetch is bounded: [`FETCH_TIMEOUT`], [`MAX_DOCUMENT_BYTES`].
//! - **Algorithms**: only asymmetric ones, and only those the issuer's configuration lists
//!   (default: RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA). `none` and the
//!   HMAC algorithms are refused before any key is looked at (an HS256 token "signed" with the
//!   issuer's public key is the classic confusion). A key whose JWK names an `alg` is used only
//!   for that one, and a key marked for encryption (`use: enc`) never.
//! - **Claims**: `iss`, `aud` (the issuer's configured audience), `exp` and `sub` required;
//!   `nbf` and `iat` honoured; [`LEEWAY_S`] of clock skew.
//! - **WLCG scopes**: a token with a `scope` claim carries its scopes to the caller
//!   ([`Verified::scopes`]), which the API checks route by route; one without is limited only
//!   by what its identity is mapped to.
//!
//! What the verified identity becomes (owner, groups, grants) is [`crate::identities`]'s
//! to say. Must not know: the identity map, the registry, routes.

use base64::Engine;
use htfaas_functions::identity_map::Identity;
use jsonwebtoken::jwk::{Jwk, JwkSet, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// Clock skew allowed on `exp`, `nbf` and `iat`, seconds.
pub const LEEWAY_S: u64 = 60;
/// Least time between two fetches of one issuer's keys, seconds.
pub const REFETCH_MIN_S: u64 = 30;
/// Keys older than this are fetched again at the next token, seconds.
pub const KEYS_MAX_AGE_S: u64 = 3600;
/// Longest a discovery or JWKS fetch may take.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest discovery document or JWKS read, bytes.
pub const MAX_DOCUMENT_BYTES: usize = 256 * 1024;
/// Longest token looked at, bytes.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// One trusted issuer, as the gateway's configuration lists it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssuerConfig {
    /// The issuer, exactly as its tokens' `iss` and its discovery document's `issuer`
    /// (`https://…`; `http://` only on a loopback address, for tests).
    pub issuer: String,
    /// The audience its tokens must name for this gateway (`aud`).
    pub audience: String,
    /// Signature algorithms accepted from it. Default: every asymmetric one jsonwebtoken
    /// verifies (see the module).
    #[serde(default = "default_algorithms")]
    pub algorithms: Vec<String>,
    /// Claims that hold the identity's groups or entitlements, in order. Default: `groups`,
    /// `wlcg.groups`, `eduperson_entitlement`.
    #[serde(default = "default_group_claims")]
    pub group_claims: Vec<String>,
    /// The JWKS URL, when the issuer publishes no discovery document. Default: discovered.
    #[serde(default)]
    pub jwks_uri: Option<String>,
}

fn default_algorithms() -> Vec<String> {
    ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA"].map(String::from).to_vec()
}

fn default_group_claims() -> Vec<String> {
    ["groups", "wlcg.groups", "eduperson_entitlement"].map(String::from).to_vec()
}

/// Why a token or an issuer's configuration was refused. The message names the failed check.
#[derive(Debug, thiserror::Error)]
pub enum OidcError {
    /// The configuration of an issuer is wrong.
    #[error("OIDC issuer {issuer:?}: {reason}")]
    Config {
        /// The issuer.
        issuer: String,
        /// Why.
        reason: String,
    },
    /// Not a JWT of a listed issuer.
    #[error("not a token of a trusted issuer: {0}")]
    NotOurs(String),
    /// A trusted issuer's token failed a check.
    #[error("OIDC token refused: {0}")]
    Refused(String),
    /// The issuer's keys could not be read (and none cached fits).
    #[error("OIDC keys of {issuer}: {reason}")]
    Keys {
        /// The issuer.
        issuer: String,
        /// Why.
        reason: String,
    },
}

fn refused(reason: impl Into<String>) -> OidcError {
    OidcError::Refused(reason.into())
}

/// A token that verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Who it is.
    pub identity: Identity,
    /// Its `jti`, when it has one.
    pub jti: Option<String>,
    /// Its expiry, Unix seconds.
    pub exp: u64,
    /// Its WLCG scopes (`scope`, space-separated), when it has the claim.
    pub scopes: Option<Vec<String>>,
}

/// The verifier of every configured issuer.
#[derive(Debug)]
pub struct Oidc {
    http: reqwest::Client,
    issuers: HashMap<String, Issuer>,
}

#[derive(Debug)]
struct Issuer {
    config: IssuerConfig,
    algorithms: Vec<Algorithm>,
    keys: RwLock<Keys>,
    /// One fetch at a time.
    fetching: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Keys {
    by_kid: HashMap<String, Key>,
    /// Keys without a `kid` (used only when the token names none and exactly one fits).
    unnamed: Vec<Key>,
    fetched: Option<Instant>,
    attempted: Option<Instant>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys").field("kids", &self.by_kid.keys().collect::<Vec<_>>()).finish_non_exhaustive()
    }
}

#[derive(Clone)]
struct Key {
    key: DecodingKey,
    /// The JWK's own `alg`, when it names one.
    alg: Option<Algorithm>,
}

impl Oidc {
    /// The verifier of `issuers`, fetching keys with `http`. Refuses a configuration that
    /// lists an issuer twice, an `http://` issuer off loopback, or a symmetric algorithm.
    pub fn new(issuers: Vec<IssuerConfig>, http: reqwest::Client) -> Result<Oidc, OidcError> {
        let mut map = HashMap::new();
        for config in issuers {
            let bad = |reason: String| OidcError::Config { issuer: config.issuer.clone(), reason };
            check_url(&config.issuer).map_err(bad)?;
            if let Some(uri) = &config.jwks_uri {
                check_url(uri).map_err(|e| bad(format!("jwks_uri: {e}")))?;
            }
            if config.audience.is_empty() {
                return Err(bad("audience is empty: name this gateway's audience".into()));
            }
            let mut algorithms = Vec::new();
            for name in &config.algorithms {
                algorithms.push(asymmetric(name).map_err(bad)?);
            }
            if algorithms.is_empty() {
                return Err(bad("no algorithm accepted".into()));
            }
            let issuer = Issuer { config, algorithms, keys: RwLock::default(), fetching: tokio::sync::Mutex::new(()) };
            if map.insert(issuer.config.issuer.clone(), issuer).is_some() {
                return Err(OidcError::Config { issuer: String::new(), reason: "an issuer is listed twice".into() });
            }
        }
        Ok(Oidc { http, issuers: map })
    }

    /// The configured issuer a token claims to come from (its unverified `iss`), if any: the
    /// API then verifies it as an OIDC token, not as one of the gateway's own.
    pub fn claims_issuer(&self, token: &str) -> Option<&str> {
        let iss = unverified_iss(token).ok()?;
        self.issuers.get_key_value(iss.as_str()).map(|(k, _)| k.as_str())
    }

    /// The configuration of `issuer`.
    pub fn issuer_config(&self, issuer: &str) -> Option<&IssuerConfig> {
        self.issuers.get(issuer).map(|i| &i.config)
    }

    /// Verifies `token` (see the module for every check).
    pub async fn verify(&self, token: &str) -> Result<Verified, OidcError> {
        let iss = unverified_iss(token)?;
        let issuer =
            self.issuers.get(&iss).ok_or_else(|| OidcError::NotOurs(format!("issuer {iss:?} is not trusted")))?;
        let (alg, kid) = header_of(token)?;
        if !issuer.algorithms.contains(&alg) {
            return Err(refused(format!("algorithm {alg:?} is not accepted from {iss}")));
        }
        let key = self.key_for(issuer, kid.as_deref(), alg).await?;
        let mut validation = Validation::new(alg);
        validation.set_issuer(&[&issuer.config.issuer]);
        validation.set_audience(&[&issuer.config.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.leeway = LEEWAY_S;
        validation.validate_nbf = true;
        let claims = jsonwebtoken::decode::<serde_json::Value>(token, &key, &validation)
            .map_err(|e| refused(jwt_error(&e, &issuer.config)))?
            .claims;
        let now = htfaas_functions::time::now_s();
        if let Some(iat) = claims.get("iat").and_then(serde_json::Value::as_u64)
            && iat > now.saturating_add(LEEWAY_S)
        {
            return Err(refused("issued in the future (iat)"));
        }
        let identity =
            Identity::from_claims(&claims, &issuer.config.group_claims).map_err(|e| refused(e.to_string()))?;
        let exp = claims.get("exp").and_then(serde_json::Value::as_u64).unwrap_or(now);
        let jti = claims.get("jti").and_then(serde_json::Value::as_str).map(str::to_owned);
        let scopes = match claims.get("scope") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(s)) => Some(s.split_whitespace().map(str::to_owned).collect()),
            Some(_) => return Err(refused("`scope` is not a space-separated string")),
        };
        Ok(Verified { identity, jti, exp, scopes })
    }

    /// The key `kid` names (or the one key that fits, without a `kid`), fetching the keys
    /// when it is unknown or they are old, within the fetch rules of the module.
    async fn key_for(&self, issuer: &Issuer, kid: Option<&str>, alg: Algorithm) -> Result<DecodingKey, OidcError> {
        let stale = {
            let keys = issuer.keys.read().unwrap_or_else(|p| p.into_inner());
            keys.fetched.is_none_or(|at| at.elapsed() >= Duration::from_secs(KEYS_MAX_AGE_S))
        };
        if !stale && let Some(key) = lookup(issuer, kid, alg)? {
            return Ok(key);
        }
        self.refresh(issuer).await;
        lookup(issuer, kid, alg)?.ok_or_else(|| match kid {
            Some(kid) => refused(format!("no key {kid:?} among {}'s keys", issuer.config.issuer)),
            None => refused(format!("the token names no kid and not exactly one key of {} fits", issuer.config.issuer)),
        })
    }

    /// Fetches the issuer's keys unless a fetch happened within [`REFETCH_MIN_S`]; a failed
    /// fetch keeps the keys held and is logged.
    async fn refresh(&self, issuer: &Issuer) {
        let _one = issuer.fetching.lock().await;
        {
            let mut keys = issuer.keys.write().unwrap_or_else(|p| p.into_inner());
            if keys.attempted.is_some_and(|at| at.elapsed() < Duration::from_secs(REFETCH_MIN_S)) {
                return;
            }
            keys.attempted = Some(Instant::now());
        }
        match self.fetch_keys(&issuer.config).await {
            Ok(set) => {
                let mut fresh =
                    Keys { fetched: Some(Instant::now()), attempted: Some(Instant::now()), ..Keys::default() };
                for jwk in &set.keys {
                    match usable(jwk) {
                        Ok(Some(key)) => match &jwk.common.key_id {
                            Some(kid) => {
                                fresh.by_kid.insert(kid.clone(), key);
                            }
                            None => fresh.unnamed.push(key),
                        },
                        Ok(None) => {}
                        Err(e) => tracing::warn!(issuer = %issuer.config.issuer, "a key of the JWKS is skipped: {e}"),
                    }
                }
                tracing::info!(issuer = %issuer.config.issuer, keys = fresh.by_kid.len() + fresh.unnamed.len(), "OIDC keys fetched");
                *issuer.keys.write().unwrap_or_else(|p| p.into_inner()) = fresh;
            }
            Err(e) => {
                tracing::warn!(issuer = %issuer.config.issuer, "cannot fetch the OIDC keys, keeping those held: {e}")
            }
        }
    }

    async fn fetch_keys(&self, config: &IssuerConfig) -> Result<JwkSet, OidcError> {
        let keys_err = |reason: String| OidcError::Keys { issuer: config.issuer.clone(), reason };
        let jwks_uri = match &config.jwks_uri {
            Some(uri) => uri.clone(),
            None => {
                let url = format!("{}/.well-known/openid-configuration", config.issuer.trim_end_matches('/'));
                let doc: serde_json::Value = self.get_json(&url).await.map_err(keys_err)?;
                let named = doc.get("issuer").and_then(serde_json::Value::as_str).unwrap_or_default();
                if named != config.issuer {
                    return Err(keys_err(format!("the discovery document names issuer {named:?}")));
                }
                let uri = doc.get("jwks_uri").and_then(serde_json::Value::as_str).unwrap_or_default().to_owned();
                check_url(&uri).map_err(|e| keys_err(format!("jwks_uri {uri:?}: {e}")))?;
                uri
            }
        };
        let set: serde_json::Value = self.get_json(&jwks_uri).await.map_err(keys_err)?;
        serde_json::from_value(set).map_err(|e| keys_err(format!("{jwks_uri}: not a JWKS: {e}")))
    }

    /// GETs `url` as JSON, within [`FETCH_TIMEOUT`] and [`MAX_DOCUMENT_BYTES`].
    async fn get_json(&self, url: &str) -> Result<serde_json::Value, String> {
        let fetch = async {
            let mut resp = self.http.get(url).send().await.map_err(|e| format!("{url}: {e}"))?;
            if !resp.status().is_success() {
                return Err(format!("{url} answered {}", resp.status()));
            }
            let mut body = Vec::new();
            while let Some(chunk) = resp.chunk().await.map_err(|e| format!("{url}: {e}"))? {
                if body.len() + chunk.len() > MAX_DOCUMENT_BYTES {
                    return Err(format!("{url}: larger than {MAX_DOCUMENT_BYTES} bytes"));
                }
                body.extend_from_slice(&chunk);
            }
            serde_json::from_slice(&body).map_err(|e| format!("{url}: not JSON: {e}"))
        };
        tokio::time::timeout(FETCH_TIMEOUT, fetch)
            .await
            .map_err(|_| format!("{url}: no answer within {} s", FETCH_TIMEOUT.as_secs()))?
    }
}

fn lookup(issuer: &Issuer, kid: Option<&str>, alg: Algorithm) -> Result<Option<DecodingKey>, OidcError> {
    let keys = issuer.keys.read().unwrap_or_else(|p| p.into_inner());
    let key = match kid {
        Some(kid) => keys.by_kid.get(kid).cloned(),
        None => {
            let fits: Vec<&Key> =
                keys.by_kid.values().chain(&keys.unnamed).filter(|k| k.alg.is_none_or(|a| a == alg)).collect();
            if fits.len() == 1 { fits.first().map(|k| (*k).clone()) } else { None }
        }
    };
    match key {
        Some(Key { alg: Some(named), .. }) if named != alg => {
            Err(refused(format!("the key is for {named:?}, the token says {alg:?}")))
        }
        Some(k) => Ok(Some(k.key)),
        None => Ok(None),
    }
}

/// The key of `jwk` if it is one to verify signatures with (`Ok(None)` for an encryption key).
fn usable(jwk: &Jwk) -> Result<Option<Key>, String> {
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
        return Ok(None);
    }
    let alg = match &jwk.common.key_algorithm {
        Some(a) => {
            let name = serde_json::to_value(a).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
            match asymmetric(&name) {
                Ok(alg) => Some(alg),
                // An encryption algorithm (RSA-OAEP, …) or a symmetric one: not a signing key.
                Err(_) => return Ok(None),
            }
        }
        None => None,
    };
    let key = DecodingKey::from_jwk(jwk).map_err(|e| e.to_string())?;
    Ok(Some(Key { key, alg }))
}

/// `name` as an asymmetric signature algorithm; `none` and HMAC refused.
fn asymmetric(name: &str) -> Result<Algorithm, String> {
    if name.eq_ignore_ascii_case("none") {
        return Err("algorithm `none` is never accepted".into());
    }
    if name.to_ascii_uppercase().starts_with("HS") {
        return Err(format!(
            "{name} is a shared-secret algorithm: an issuer's tokens are verified with its public keys"
        ));
    }
    Algorithm::from_str(name).map_err(|_| format!("unknown algorithm {name:?}"))
}

/// The header's algorithm (asymmetric) and `kid`, read with messages of our own for `none`
/// and HMAC (jsonwebtoken would only say it does not know `none`).
fn header_of(token: &str) -> Result<(Algorithm, Option<String>), OidcError> {
    let part = token.split('.').next().unwrap_or_default();
    let header: serde_json::Value = decode_part(part).map_err(|e| refused(format!("header: {e}")))?;
    let alg = header.get("alg").and_then(serde_json::Value::as_str).ok_or_else(|| refused("header: no `alg`"))?;
    let alg = asymmetric(alg).map_err(refused)?;
    let kid = match header.get("kid") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(k)) => Some(k.clone()),
        Some(_) => return Err(refused("header: `kid` is not a string")),
    };
    Ok((alg, kid))
}

/// The claims of a JWT, **unverified**: only to pick the issuer whose keys verify it, or to
/// show what a token says (`htfaas map test --token`).
pub fn unverified_claims(token: &str) -> Result<serde_json::Value, OidcError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(OidcError::NotOurs(format!("longer than {MAX_TOKEN_BYTES} bytes")));
    }
    let mut parts = token.split('.');
    let (Some(_), Some(payload), Some(_), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(OidcError::NotOurs("not a JWT (three dot-separated parts)".into()));
    };
    decode_part(payload).map_err(OidcError::NotOurs)
}

/// The `iss` of a token, unverified.
fn unverified_iss(token: &str) -> Result<String, OidcError> {
    unverified_claims(token)?
        .get("iss")
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| OidcError::NotOurs("no `iss` claim".into()))
}

fn decode_part(part: &str) -> Result<serde_json::Value, String> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part.trim_end_matches('='))
        .map_err(|e| format!("not base64url: {e}"))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("not JSON: {e}"))
}

/// An issuer or JWKS URL: `https://`, or `http://` on a loopback address (a test's provider).
fn check_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    match parsed.scheme() {
        "https" => Ok(()),
        "http" => {
            let loopback = match parsed.host() {
                Some(url::Host::Ipv4(a)) => a.is_loopback(),
                Some(url::Host::Ipv6(a)) => a.is_loopback(),
                Some(url::Host::Domain(d)) => d == "localhost",
                None => false,
            };
            if loopback { Ok(()) } else { Err(format!("{url:?}: http:// only on a loopback address; use https://")) }
        }
        other => Err(format!("{url:?}: scheme {other} (https://)")),
    }
}

/// A jsonwebtoken failure in words an admin reading a refusal understands.
fn jwt_error(e: &jsonwebtoken::errors::Error, config: &IssuerConfig) -> String {
    use jsonwebtoken::errors::ErrorKind as K;
    match e.kind() {
        K::ExpiredSignature => "expired (exp)".into(),
        K::ImmatureSignature => "not valid yet (nbf)".into(),
        K::InvalidAudience => format!("audience (aud) is not {:?}", config.audience),
        K::InvalidIssuer => "issuer (iss) mismatch".into(),
        K::InvalidSignature => "bad signature".into(),
        K::MissingRequiredClaim(c) => format!("no `{c}` claim"),
        K::InvalidAlgorithm => "the key does not fit the token's algorithm".into(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests;
