//! Per-operation cost of submit tokens (`htfaas_functions::token`): signing, verification of a
//! valid token (the scheduler's hot path on every submit), refusal of a forged one, and building
//! a `Verifier` from a JWKS of two keys.
//!
//! `cargo bench -p htfaas-functions [--bench tokens] [-- FILTER]` prints one JSON line per figure:
//! `{"bench":..,"unit":"us","p50":..,"p90":..,"p99":..,"n":..,"batch":..}`, the per-operation
//! time in microseconds over `n` samples, each sample the mean of `batch` consecutive calls
//! (`batch` is 1 unless one call is shorter than a few microseconds). Without `--bench` (as
//! `cargo test --benches` runs it) each case runs once as a smoke test and nothing is timed.
//! No criterion on purpose: it would double the build on a 2-core box.

#[path = "support/harness.rs"]
mod harness;

use harness::Harness;
use std::hint::black_box;

use htfaas_functions::Digest;
use htfaas_functions::token::{SUBMIT_AUDIENCE, SigningKey, SubmitClaims, TokenError, Verifier, new_jti, now_s};
use jsonwebtoken::jwk::JwkSet;

/// Claims as the gateway mints them for one triggered job.
fn claims() -> SubmitClaims {
    let now = now_s();
    SubmitClaims {
        iss: "htfaas-gateway".into(),
        sub: "alice".into(),
        aud: SUBMIT_AUDIENCE.into(),
        exp: now + 3600,
        iat: now,
        jti: new_jti(),
        jobs: 1,
        cpus: 1,
        memory_mb: 2048,
        runtime_s: 600,
        function: Some(Digest::of(b"checksum.wasm")),
        group: None,
    }
}

fn main() {
    let h = Harness::from_args();

    let (key, _) = SigningKey::generate("gw-2025").expect("keygen");
    let (old, _) = SigningKey::generate("gw-2024").expect("keygen");
    // The scheduler trusts the current and the previous gateway key (rotation).
    let jwks = JwkSet { keys: key.jwks().keys.into_iter().chain(old.jwks().keys).collect() };
    let verifier = Verifier::new("htfaas-gateway", SUBMIT_AUDIENCE, &jwks).expect("verifier");

    let c = claims();
    let token = key.sign(&c).expect("sign");
    assert_eq!(verifier.verify::<SubmitClaims>(&token).expect("valid token verifies"), c);
    // Forged: another key claiming our kid, so the refusal costs a full signature check.
    let (forger, _) = SigningKey::generate("gw-2025").expect("keygen");
    let forged = forger.sign(&c).expect("sign");
    assert!(matches!(verifier.verify::<SubmitClaims>(&forged), Err(TokenError::InvalidSignature)));

    h.run("submit_token.sign", || key.sign(black_box(&c)).expect("sign"));
    h.run("submit_token.verify", || verifier.verify::<SubmitClaims>(black_box(&token)).expect("valid"));
    h.run("submit_token.verify_forged", || {
        verifier.verify::<SubmitClaims>(black_box(&forged)).expect_err("forged is refused")
    });
    h.run("verifier.new_jwks2", || {
        Verifier::new("htfaas-gateway", SUBMIT_AUDIENCE, black_box(&jwks)).expect("verifier")
    });
}
