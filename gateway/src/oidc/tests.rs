//! The verifier against a provider faked inside this unit test (its discovery document and
//! JWKS served on loopback, tokens signed with a fixed RSA test key): every refusal the
//! module promises. The real provider's tokens are the e2e identity test's.

use super::*;
use jsonwebtoken::{EncodingKey, Header};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};

const KEY_PEM: &[u8] = include_bytes!("test-rsa.pem");
const PUB_PEM: &[u8] = include_bytes!("test-rsa.pub.pem");
const JWK: &str = include_str!("test-rsa.jwk.json");
const AUD: &str = "https://htfaas.example";

/// What the fake provider's JWKS endpoint does.
const SERVE: u8 = 0;
const HANG: u8 = 1;
const GARBAGE: u8 = 2;

struct Provider {
    issuer: String,
    jwks_fetches: Arc<AtomicU32>,
    mode: Arc<AtomicU8>,
    /// The kid the JWKS names the key with.
    kid: Arc<std::sync::Mutex<String>>,
}

async fn provider() -> Provider {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let issuer = format!("http://{}", listener.local_addr().expect("addr"));
    let jwks_fetches = Arc::new(AtomicU32::new(0));
    let mode = Arc::new(AtomicU8::new(SERVE));
    let kid = Arc::new(std::sync::Mutex::new("k1".to_owned()));
    let discovery = serde_json::json!({ "issuer": issuer, "jwks_uri": format!("{issuer}/jwks") });
    let (fetches, m, k) = (jwks_fetches.clone(), mode.clone(), kid.clone());
    let app = axum::Router::new()
        .route("/.well-known/openid-configuration", axum::routing::get(move || async move { axum::Json(discovery) }))
        .route(
            "/jwks",
            axum::routing::get(move || {
                let (fetches, m, k) = (fetches.clone(), m.clone(), k.clone());
                async move {
                    fetches.fetch_add(1, Ordering::SeqCst);
                    match m.load(Ordering::SeqCst) {
                        HANG => {
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                            String::new()
                        }
                        GARBAGE => "{\"keys\": [{\"kty\": \"RSA\", \"n\": 7".to_owned(),
                        _ => {
                            let mut jwk: serde_json::Value = serde_json::from_str(JWK).expect("jwk");
                            jwk["kid"] = serde_json::Value::String(k.lock().expect("kid").clone());
                            serde_json::json!({ "keys": [jwk] }).to_string()
                        }
                    }
                }
            }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await });
    Provider { issuer, jwks_fetches, mode, kid }
}

fn oidc(issuer: &str) -> Oidc {
    let config = IssuerConfig {
        issuer: issuer.into(),
        audience: AUD.into(),
        algorithms: default_algorithms(),
        group_claims: default_group_claims(),
        jwks_uri: None,
    };
    Oidc::new(vec![config], crate::clients::http_client().expect("client")).expect("oidc")
}

fn claims(issuer: &str) -> serde_json::Value {
    let now = htfaas_functions::time::now_s();
    serde_json::json!({
        "iss": issuer, "sub": "alice-cli", "aud": AUD, "iat": now, "exp": now + 600,
        "jti": "j1", "groups": ["/desy/cms"], "scope": "compute.create storage.read:/data"
    })
}

fn sign(claims: &serde_json::Value, kid: Option<&str>) -> String {
    let mut header = Header::new(Algorithm::RS256);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, &EncodingKey::from_rsa_pem(KEY_PEM).expect("key")).expect("sign")
}

fn b64(v: &serde_json::Value) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
}

#[tokio::test]
async fn a_token_of_the_provider_verifies_with_its_identity_and_scopes() {
    let p = provider().await;
    let v = oidc(&p.issuer).verify(&sign(&claims(&p.issuer), Some("k1"))).await.expect("verified");
    assert_eq!(v.identity.sub, "alice-cli");
    assert_eq!(v.identity.groups, ["/desy/cms"]);
    assert_eq!(v.jti.as_deref(), Some("j1"));
    assert_eq!(v.scopes, Some(vec!["compute.create".to_owned(), "storage.read:/data".to_owned()]));
}

#[tokio::test]
async fn each_broken_claim_is_refused_by_name() {
    let p = provider().await;
    let o = oidc(&p.issuer);
    let now = htfaas_functions::time::now_s();
    let with = |key: &str, value: serde_json::Value| {
        let mut c = claims(&p.issuer);
        c[key] = value;
        c
    };
    let without = |key: &str| {
        let mut c = claims(&p.issuer);
        c.as_object_mut().expect("object").remove(key);
        c
    };
    let cases = [
        (with("aud", "https://elsewhere.example".into()), "audience"),
        (with("exp", (now - 3600).into()), "expired"),
        (with("nbf", (now + 3600).into()), "not valid yet"),
        (with("iat", (now + 3600).into()), "future"),
        (without("exp"), "exp"),
        (without("sub"), "sub"),
        (with("scope", serde_json::json!(["compute.create"])), "scope"),
    ];
    for (c, says) in cases {
        let err = o.verify(&sign(&c, Some("k1"))).await.expect_err(&c.to_string());
        assert!(err.to_string().contains(says), "{c}: {err}");
    }
    // An issuer nobody listed: refused before any key is fetched for it.
    let err = o.verify(&sign(&claims("https://idp.evil.example"), Some("k1"))).await.expect_err("unlisted");
    assert!(matches!(err, OidcError::NotOurs(_)), "{err}");
    assert!(o.claims_issuer(&sign(&claims("https://idp.evil.example"), None)).is_none());
    assert_eq!(o.claims_issuer(&sign(&claims(&p.issuer), None)), Some(p.issuer.as_str()));
    // A signature of another key (the payload changed after signing).
    let good = sign(&claims(&p.issuer), Some("k1"));
    let parts: Vec<&str> = good.split('.').collect();
    let forged = format!("{}.{}.{}", parts[0], b64(&with("sub", "mallory".into())), parts[2]);
    let err = o.verify(&forged).await.expect_err("forged");
    assert!(err.to_string().contains("bad signature"), "{err}");
}

#[tokio::test]
async fn none_and_an_hmac_token_keyed_with_the_public_key_are_refused() {
    let p = provider().await;
    let o = oidc(&p.issuer);
    let c = claims(&p.issuer);
    let none = format!("{}.{}.", b64(&serde_json::json!({"alg": "none", "kid": "k1"})), b64(&c));
    let err = o.verify(&none).await.expect_err("none");
    assert!(err.to_string().contains("`none` is never accepted"), "{err}");
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("k1".into());
    let hmac = jsonwebtoken::encode(&header, &c, &EncodingKey::from_secret(PUB_PEM)).expect("sign");
    let err = o.verify(&hmac).await.expect_err("hs256");
    assert!(err.to_string().contains("shared-secret"), "{err}");
    // And an issuer configured to accept HS256 does not start.
    let config = IssuerConfig {
        issuer: p.issuer.clone(),
        audience: AUD.into(),
        algorithms: vec!["HS256".into()],
        group_claims: vec![],
        jwks_uri: None,
    };
    assert!(Oidc::new(vec![config], crate::clients::http_client().expect("client")).is_err());
    // An ES256 token against the RSA key: the algorithm does not fit the key.
    let es = format!("{}.{}.AAAA", b64(&serde_json::json!({"alg": "ES256", "kid": "k1"})), b64(&c));
    assert!(o.verify(&es).await.is_err());
}

#[tokio::test]
async fn an_unknown_kid_refetches_once_per_interval_and_a_rotation_is_picked_up() {
    let p = provider().await;
    let o = oidc(&p.issuer);
    o.verify(&sign(&claims(&p.issuer), Some("k1"))).await.expect("k1");
    assert_eq!(p.jwks_fetches.load(Ordering::SeqCst), 1);
    // A storm of tokens naming a kid the provider does not have: one fetch at most.
    for i in 0..50 {
        let err = o.verify(&sign(&claims(&p.issuer), Some(&format!("nope-{i}")))).await.expect_err("unknown kid");
        assert!(err.to_string().contains("no key"), "{err}");
    }
    assert_eq!(p.jwks_fetches.load(Ordering::SeqCst), 1, "within the refetch interval: no fetch");
    // Rotation: the provider now names its key k2; once the interval has passed, one fetch finds it.
    *p.kid.lock().expect("kid") = "k2".into();
    o.issuers[&p.issuer].keys.write().expect("keys").attempted =
        Some(Instant::now() - Duration::from_secs(REFETCH_MIN_S));
    o.verify(&sign(&claims(&p.issuer), Some("k2"))).await.expect("k2 after rotation");
    assert_eq!(p.jwks_fetches.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_hanging_or_garbage_jwks_refuses_within_the_timeout_and_keeps_held_keys() {
    let p = provider().await;
    let o = oidc(&p.issuer);
    p.mode.store(GARBAGE, Ordering::SeqCst);
    let err = o.verify(&sign(&claims(&p.issuer), Some("k1"))).await.expect_err("garbage");
    assert!(err.to_string().contains("no key"), "{err}");
    // Keys that were fetched stay in use when a later fetch hangs.
    p.mode.store(SERVE, Ordering::SeqCst);
    o.issuers[&p.issuer].keys.write().expect("keys").attempted = None;
    o.verify(&sign(&claims(&p.issuer), Some("k1"))).await.expect("served");
    p.mode.store(HANG, Ordering::SeqCst);
    o.issuers[&p.issuer].keys.write().expect("keys").attempted = None;
    // The fetch gives up after FETCH_TIMEOUT (a hang here would hang the test).
    let err = o.verify(&sign(&claims(&p.issuer), Some("k-new"))).await.expect_err("hang");
    assert!(err.to_string().contains("no key"), "{err}");
    o.verify(&sign(&claims(&p.issuer), Some("k1"))).await.expect("k1 still held");
}

#[test]
fn issuers_off_loopback_must_use_https() {
    for (url, ok) in [
        ("https://login.example.org/realms/x", true),
        ("http://127.0.0.1:8080", true),
        ("http://[::1]:8080", true),
        ("http://login.example.org", false),
        ("ftp://login.example.org", false),
        ("not a url", false),
    ] {
        assert_eq!(check_url(url).is_ok(), ok, "{url}");
    }
}
