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

use std::hint::black_box;
use std::time::{Duration, Instant};

use htfaas_functions::Digest;
use htfaas_functions::token::{SUBMIT_AUDIENCE, SigningKey, SubmitClaims, TokenError, Verifier, new_jti, now_s};
use jsonwebtoken::jwk::JwkSet;

/// Untimed calls before measuring (caches, branch predictors, lazy statics, allocator).
const WARMUP: Duration = Duration::from_millis(200);
/// Measuring stops after this long (once `MIN_SAMPLES` are in) ...
const BUDGET: Duration = Duration::from_millis(1000);
/// ... or after this many samples.
const MAX_SAMPLES: usize = 10_000;
const MIN_SAMPLES: usize = 100;
/// A sample lasts at least about this long, so the clock's own cost stays below 1%.
const MIN_SAMPLE_NS: u128 = 5_000;

struct Harness {
    timed: bool,
    filters: Vec<String>,
}

impl Harness {
    fn from_args() -> Harness {
        let args: Vec<String> = std::env::args().skip(1).collect();
        Harness {
            timed: args.iter().any(|a| a == "--bench"),
            filters: args.into_iter().filter(|a| !a.starts_with('-')).collect(),
        }
    }

    /// Times `f` and prints one JSON line; in smoke mode calls it once.
    fn run<T>(&self, name: &str, mut f: impl FnMut() -> T) {
        if !self.filters.is_empty() && !self.filters.iter().any(|p| name.contains(p.as_str())) {
            return;
        }
        if !self.timed {
            black_box(f());
            println!("{name}: ok (smoke; run `cargo bench` to time)");
            return;
        }
        let start = Instant::now();
        let mut calls: u128 = 0;
        while calls < 10 || start.elapsed() < WARMUP {
            black_box(f());
            calls += 1;
        }
        let per_call = (start.elapsed().as_nanos() / calls).max(1);
        let batch = MIN_SAMPLE_NS.div_ceil(per_call).clamp(1, 100_000) as u32;

        let mut samples = Vec::with_capacity(MAX_SAMPLES);
        let t0 = Instant::now();
        while samples.len() < MAX_SAMPLES && (samples.len() < MIN_SAMPLES || t0.elapsed() < BUDGET) {
            let s = Instant::now();
            for _ in 0..batch {
                black_box(f());
            }
            samples.push(s.elapsed().as_nanos() as f64 / f64::from(batch) / 1000.0);
        }
        samples.sort_by(f64::total_cmp);
        let pct = |p: f64| {
            // Nearest rank.
            let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
            let us = samples[rank.clamp(1, samples.len()) - 1];
            format!("{us:.3}")
        };
        // Keys in a fixed order for people; it is JSON for tools.
        let name = serde_json::Value::from(name);
        let (p50, p90, p99, n) = (pct(50.0), pct(90.0), pct(99.0), samples.len());
        println!(r#"{{"bench":{name},"unit":"us","p50":{p50},"p90":{p90},"p99":{p99},"n":{n},"batch":{batch}}}"#);
    }
}

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
