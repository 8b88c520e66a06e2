//! Fuzz target: token verification, `htfaas_functions::token::Verifier`, for submit, attach
//! and API tokens: the input is the token text.
//!
//! The verifiers trust one real Ed25519 key (kid `fuzz`). Seeds include tokens signed by that
//! key that must still fail (expired, another audience, another issuer, not valid before 2100)
//! and well-formed tokens signed by another key under the same kid, so that every check is
//! reached. **No input may verify**: the fuzzer holds no valid token, so an `Ok` is a forgery
//! (the target panics with the token).
#![no_main]

use base64::Engine as _;
use ed25519_dalek::Verifier as _;
use htfaas_functions::token::{
    API_AUDIENCE, ATTACH_AUDIENCE, AttachClaims, SUBMIT_AUDIENCE, SigningKey, SubmitClaims, Verifier,
};
use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;

/// PKCS#8 v1 prefix of an Ed25519 private key.
const PKCS8_PREFIX: [u8; 16] =
    [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];
/// The trusted key's seed (fixed, so that the seed corpus holds tokens it signed).
pub const TRUSTED_SEED: [u8; 32] = [7; 32];
/// Issuer the verifiers trust.
pub const ISSUER: &str = "htfaas-fuzz";

fn pem(seed: [u8; 32]) -> String {
    let mut der = PKCS8_PREFIX.to_vec();
    der.extend_from_slice(&seed);
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    format!("-----BEGIN PRIVATE KEY-----\n{b64}\n-----END PRIVATE KEY-----\n")
}

struct Verifiers {
    submit: Verifier,
    attach: Verifier,
    api: Verifier,
}

static VERIFIERS: LazyLock<Verifiers> = LazyLock::new(|| {
    let key = SigningKey::from_pem("fuzz", pem(TRUSTED_SEED).as_bytes()).expect("a fixed valid key");
    let jwks = key.jwks();
    let v = |aud| Verifier::new(ISSUER, aud, &jwks).expect("a verifier");
    Verifiers { submit: v(SUBMIT_AUDIENCE), attach: v(ATTACH_AUDIENCE), api: v(API_AUDIENCE) }
});

/// Whether `token`'s signature really is the trusted key's over its first two parts.
fn signed_by_trusted_key(token: &str) -> bool {
    let Some((input, sig)) = token.rsplit_once('.') else { return false };
    let Ok(sig) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(sig) else { return false };
    let Ok(sig) = ed25519_dalek::Signature::from_slice(&sig) else { return false };
    let key = ed25519_dalek::SigningKey::from_bytes(&TRUSTED_SEED).verifying_key();
    key.verify(input.as_bytes(), &sig).is_ok()
}

fn refuse<T: std::fmt::Debug>(what: &str, token: &str, r: Result<T, htfaas_functions::token::TokenError>) {
    if let Ok(claims) = r {
        panic!(
            "fuzz input verified as {what} token (signature by the trusted key: {}): {token:?} → {claims:?}",
            signed_by_trusted_key(token)
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let token = String::from_utf8_lossy(data);
    let v = &*VERIFIERS;
    refuse("a submit", &token, v.submit.verify::<SubmitClaims>(&token));
    refuse("an attach", &token, v.attach.verify::<AttachClaims>(&token));
    refuse("an API", &token, v.api.verify_api(&token));
    refuse("a raw", &token, v.submit.verify::<serde_json::Value>(&token));
});
