//! A key for tokens a service mints for itself and alone verifies, such as the gateway's
//! renewal grants: `HS256` (HMAC-SHA256) under a secret derived from the service's Ed25519
//! signing key ([`SigningKey::mac_key`]). Nobody else verifies such a token, so a public-key
//! signature buys nothing, and an Ed25519 signature cost the gateway about 3 % of its CPU per
//! job in the throughput bench; no new key file either: the secret follows the signing key.
//!
//! Its `kid` is the signing key's with `#<purpose>` after it, and a [`Verifier`] binds each
//! `kid` to one algorithm: a MAC'd token never passes where only the Ed25519 key is trusted
//! (the scheduler's submit check knows no such `kid`), nor an `HS256` header under the Ed25519
//! `kid` (the classic confusion of a public key used as an HMAC secret).
//!
//! Must not know: wire messages, the audit trail, HTTP (`axum`).

use super::{SigningKey, TokenError, Verifier};
use base64::Engine as _;
use hmac::{Hmac, Mac as _};
use jsonwebtoken::{Algorithm, DecodingKey, Header};
use serde::Serialize;
use sha2::Sha256;

/// An `HS256` key derived from a signing key for one purpose.
pub struct MacKey {
    kid: String,
    /// HMAC-SHA256(signing key seed, the purpose's label); never shown.
    secret: [u8; 32],
    /// The base64url JOSE header, `{"typ":"JWT","alg":"HS256","kid":…}`, and its `.`.
    header: String,
}

impl std::fmt::Debug for MacKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MacKey").field("kid", &self.kid).finish_non_exhaustive()
    }
}

impl SigningKey {
    /// The `HS256` key of `purpose` derived from this key: the same for every process holding
    /// this key (replicas of one service), another for each purpose and for each signing key.
    pub fn mac_key(&self, purpose: &str) -> Result<MacKey, TokenError> {
        let mut mac = <Hmac<Sha256>>::new_from_slice(&self.key.to_bytes())
            .map_err(|e| TokenError::Key(format!("derive the {purpose} key: {e}")))?;
        mac.update(b"htfaas token MAC key: ");
        mac.update(purpose.as_bytes());
        let secret: [u8; 32] = mac.finalize().into_bytes().into();
        let kid = format!("{}#{purpose}", self.kid);
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some(kid.clone());
        let header = serde_json::to_vec(&header).map_err(|e| TokenError::Key(format!("encode the header: {e}")))?;
        let header = format!("{}.", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(header));
        Ok(MacKey { kid, secret, header })
    }
}

impl MacKey {
    /// The key id tokens under this key carry.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// `claims` as a JWS compact token with `alg: HS256` and this key's `kid` (RFC 7515).
    pub fn sign<C: Serialize>(&self, claims: &C) -> Result<String, TokenError> {
        let b64 = &base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let claims = serde_json::to_vec(claims).map_err(|e| TokenError::Key(format!("encode the claims: {e}")))?;
        let mut token = String::with_capacity(self.header.len() + claims.len() * 4 / 3 + 48);
        token.push_str(&self.header);
        b64.encode_string(&claims, &mut token);
        let mut mac =
            <Hmac<Sha256>>::new_from_slice(&self.secret).map_err(|e| TokenError::Key(format!("sign: {e}")))?;
        mac.update(token.as_bytes());
        let tag = mac.finalize().into_bytes();
        token.push('.');
        b64.encode_string(tag, &mut token);
        Ok(token)
    }
}

impl Verifier {
    /// Trusts `key` too, for `HS256` tokens under its `kid` only.
    pub fn trust_mac(&mut self, key: &MacKey) {
        self.keys.insert(key.kid.clone(), (DecodingKey::from_secret(&key.secret), Algorithm::HS256));
    }
}

#[cfg(test)]
mod tests {
    use super::super::{RENEW_AUDIENCE, SUBMIT_AUDIENCE, now_s};
    use super::*;

    fn claims(aud: &str) -> serde_json::Value {
        let now = now_s();
        serde_json::json!({"iss": "gw", "sub": "alice", "aud": aud, "iat": now, "exp": now + 60, "jti": "j-1"})
    }

    fn grants(key: &SigningKey) -> Verifier {
        let mut v = Verifier::new("gw", RENEW_AUDIENCE, &key.jwks()).expect("verifier");
        v.trust_mac(&key.mac_key("renew").expect("mac key"));
        v
    }

    /// What the MAC key signs is what `jsonwebtoken` makes of the same claims, and it verifies
    /// against the key it was derived from, as does a grant signed with the Ed25519 key (one an
    /// older gateway minted, still valid).
    #[test]
    fn a_macd_token_verifies_as_does_one_the_signing_key_signed() {
        let (key, _) = SigningKey::generate("gw-1").expect("key");
        let mac = key.mac_key("renew").expect("mac key");
        assert_eq!(mac.kid(), "gw-1#renew");
        let token = mac.sign(&claims(RENEW_AUDIENCE)).expect("sign");
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some("gw-1#renew".into());
        let theirs = jsonwebtoken::encode(
            &header,
            &claims(RENEW_AUDIENCE),
            &jsonwebtoken::EncodingKey::from_secret(&mac.secret),
        )
        .expect("encode");
        assert_eq!(token.split('.').next(), theirs.split('.').next(), "the same header");
        let v = grants(&key);
        let got: serde_json::Value = v.verify(&token).expect("its own MAC'd grant");
        assert_eq!(got["jti"], "j-1");
        let signed = key.sign(&claims(RENEW_AUDIENCE)).expect("sign");
        let _: serde_json::Value = v.verify(&signed).expect("an Ed25519 grant");
        assert!(!format!("{mac:?}").contains(&format!("{:?}", mac.secret)), "the secret is never shown");
    }

    /// Refusals: a grant MAC'd under another key of the same `kid` (another site's gateway),
    /// under another purpose, or with its claims changed; a MAC'd token where only the Ed25519
    /// key is trusted (the scheduler's submit check); an `HS256` token under the Ed25519 `kid`
    /// with the public key as its secret; an `EdDSA` header under the MAC `kid`.
    #[test]
    fn a_macd_token_is_refused_under_any_other_key_kid_or_algorithm() {
        let (key, _) = SigningKey::generate("gw-1").expect("key");
        let v = grants(&key);
        let (other, _) = SigningKey::generate("gw-1").expect("another key, the same kid");
        let foreign = other.mac_key("renew").expect("mac").sign(&claims(RENEW_AUDIENCE)).expect("sign");
        assert!(v.verify::<serde_json::Value>(&foreign).is_err(), "another key's grant");
        let purpose = key.mac_key("other").expect("mac").sign(&claims(RENEW_AUDIENCE)).expect("sign");
        assert!(matches!(v.verify::<serde_json::Value>(&purpose), Err(TokenError::UnknownKey(_))), "another purpose");
        let mac = key.mac_key("renew").expect("mac");
        let token = mac.sign(&claims(RENEW_AUDIENCE)).expect("sign");
        let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
        let mut widened = claims(RENEW_AUDIENCE);
        widened["sub"] = "mallory".into();
        parts[1] = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(widened.to_string());
        assert!(v.verify::<serde_json::Value>(&parts.join(".")).is_err(), "changed claims");

        let submit = Verifier::new("gw", SUBMIT_AUDIENCE, &key.jwks()).expect("the scheduler's verifier");
        let as_submit = mac.sign(&claims(SUBMIT_AUDIENCE)).expect("sign");
        assert!(matches!(submit.verify::<serde_json::Value>(&as_submit), Err(TokenError::UnknownKey(_))));

        let public = key.jwks().keys[0].clone();
        let x = match &public.algorithm {
            jsonwebtoken::jwk::AlgorithmParameters::OctetKeyPair(p) => p.x.clone(),
            other => panic!("not an OKP key: {other:?}"),
        };
        let mut confused = Header::new(Algorithm::HS256);
        confused.kid = Some("gw-1".into());
        for secret in [x.as_bytes().to_vec(), base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(&x).expect("x")] {
            let forged = jsonwebtoken::encode(
                &confused,
                &claims(RENEW_AUDIENCE),
                &jsonwebtoken::EncodingKey::from_secret(&secret),
            )
            .expect("encode");
            assert!(v.verify::<serde_json::Value>(&forged).is_err(), "HS256 under the Ed25519 kid");
        }
        let mut swapped = Header::new(Algorithm::EdDSA);
        swapped.kid = Some("gw-1#renew".into());
        let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
        parts[0] = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(&swapped).expect("json"));
        assert!(v.verify::<serde_json::Value>(&parts.join(".")).is_err(), "EdDSA under the MAC kid");
    }
}
