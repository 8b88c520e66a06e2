//! Every hop refuses what it must, on the running stack: the storage refuses macaroons that
//! are tampered, used for another file or activity, or forged; the scheduler refuses forged,
//! expired, replayed and wrong-audience submit tokens; EPs cannot attach without a valid
//! attach token.

use base64::Engine as _;
use htfaas_functions::proto::{EventRef, FunctionRef, InputSpec, OutputSpec, SubmitRequest};
use htfaas_functions::token::{ATTACH_AUDIENCE, SUBMIT_AUDIENCE, SigningKey, SubmitClaims, new_jti, now_s};
use htfaas_functions::{Digest, Resources};
use htfaas_tests::{request_macaroon as macaroon, stack_secret as secret, start_stack};
use reqwest::StatusCode;

/// A fresh client per request: no connection state carries over between checks.
fn http() -> reqwest::Client {
    htfaas_gateway::http_client().expect("client")
}

async fn status(req: reqwest::RequestBuilder) -> StatusCode {
    req.send().await.expect("request").status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_refuses_tampered_misused_and_traversing_macaroons() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let storage = stack.info().storage_url.clone();
    client.put_bytes(b"a".to_vec(), "/data/raw/a.dat").await.expect("put a");
    client.put_bytes(b"b".to_vec(), "/data/raw/b.dat").await.expect("put b");
    let gw = secret(dir.path(), "gateway_storage_secret");

    // Only an issuing user gets macaroons.
    let r = macaroon(&storage, "alice", &secret(dir.path(), "user_secret"), &["activity:DOWNLOAD"]).await;
    assert!(r.status().is_client_error(), "alice may not issue: {}", r.status());
    let r = macaroon(&storage, "gateway", "wrong", &["activity:DOWNLOAD"]).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);

    let reply: serde_json::Value = macaroon(&storage, "gateway", &gw, &["activity:DOWNLOAD", "path:/data/raw/a.dat"])
        .await
        .json()
        .await
        .expect("json");
    let read = reply["macaroon"].as_str().expect("macaroon").to_owned();
    assert!(!read.contains('='), "dCache form: base64url without padding");

    assert_eq!(status(http().get(format!("{storage}/data/raw/a.dat")).bearer_auth(&read)).await, StatusCode::OK);
    assert_eq!(status(http().get(format!("{storage}/data/raw/a.dat?authz={read}"))).await, StatusCode::OK);
    assert_eq!(status(http().get(format!("{storage}/data/raw/b.dat")).bearer_auth(&read)).await, StatusCode::FORBIDDEN);
    assert_eq!(
        status(http().put(format!("{storage}/data/raw/a.dat")).bearer_auth(&read).body("x")).await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(status(http().get(format!("{storage}/data/raw/a.dat"))).await, StatusCode::UNAUTHORIZED);

    // Flip one bit of the signature (the last bytes of a V1 macaroon).
    let mut raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(&read).expect("base64url");
    let n = raw.len();
    raw[n - 3] ^= 1;
    let tampered = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw);
    assert_eq!(
        status(http().get(format!("{storage}/data/raw/a.dat")).bearer_auth(&tampered)).await,
        StatusCode::UNAUTHORIZED
    );

    // A write macaroon for the output directory writes there and nowhere else.
    let reply: serde_json::Value =
        macaroon(&storage, "gateway", &gw, &["activity:UPLOAD,DELETE", "path:/data/checksums/"])
            .await
            .json()
            .await
            .expect("json");
    let write = reply["macaroon"].as_str().expect("macaroon").to_owned();
    let put = |path: &str| http().put(format!("{storage}{path}")).bearer_auth(&write).body("out");
    assert!(status(put("/data/checksums/x.json")).await.is_success());
    assert_eq!(status(put("/data/raw/x.json")).await, StatusCode::FORBIDDEN);
    assert_eq!(status(put("/data/checksumsx/x.json")).await, StatusCode::FORBIDDEN);
    // The URL parser resolves `%2e%2e` before sending, so this lands as /data/raw/evil (403);
    // raw-socket traversal (400) is covered by storage/tests/http.rs.
    assert!(status(put("/data/checksums/%2e%2e/raw/evil")).await.is_client_error());
    assert_eq!(client.get_bytes("/data/raw/evil").await.expect("get"), None);
    stack.stop().await.expect("clean stop");
}

/// A job on the stack's storage and module store (the only URLs its scheduler lets a job name).
fn request(digest: Digest, info: &htfaas::client::StackInfo) -> SubmitRequest {
    let (storage, gateway) = (&info.storage_url, &info.gateway_url);
    SubmitRequest {
        retry: None,
        function: FunctionRef {
            name: "f".into(),
            version: 1,
            module_url: format!("{gateway}/v1/modules/{digest}"),
            digest,
            native: None,
        },
        resources: Resources::new(1, 64, 10),
        input: Some(InputSpec::new(format!("{storage}/data/raw/a"), "a", "m")),
        output: OutputSpec {
            url: format!("{storage}/data/out/"),
            macaroon: "m".into(),
            on_failure: Default::default(),
        },
        args: vec![],
        env: vec![],
        event: EventRef::new("test", new_jti(), "/data/raw/a"),
        dedupe_key: new_jti(),
        annex: None,
        bind_ep_address: false,
        class: None,
        limits: Default::default(),
        secrets: Default::default(),
        renewal: None,
        max_concurrent: None,
        refs: Vec::new(),
        checkpoint: None,
    }
}

fn claims(digest: &Digest) -> SubmitClaims {
    SubmitClaims {
        iss: "htfaas-gateway".into(),
        sub: "mallory".into(),
        aud: SUBMIT_AUDIENCE.into(),
        exp: now_s() + 60,
        iat: now_s(),
        jti: new_jti(),
        jobs: 1,
        cpus: 1,
        memory_mb: 64,
        runtime_s: 10,
        function: Some(digest.clone()),
        group: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_refuses_forged_expired_replayed_and_misdirected_submit_tokens() {
    let (dir, stack) = start_stack().await;
    let jobs = format!("{}/v1/jobs", stack.info().scheduler_url);
    let real = SigningKey::load_or_create(&dir.path().join("gateway/submit.pem"), "gateway-1").expect("gateway key");
    let (forger, _) = SigningKey::generate("gateway-1").expect("keygen");
    let digest = Digest::of(b"module");
    let info = stack.info().clone();
    let submit = |token: String| http().post(&jobs).bearer_auth(token).json(&request(digest.clone(), &info)).send();

    let forged = forger.sign(&claims(&digest)).expect("sign");
    assert_eq!(submit(forged).await.expect("send").status(), StatusCode::UNAUTHORIZED);

    let mut expired = claims(&digest);
    expired.exp = now_s() - 600;
    assert_eq!(submit(real.sign(&expired).expect("sign")).await.expect("send").status(), StatusCode::UNAUTHORIZED);

    let mut wrong_aud = claims(&digest);
    wrong_aud.aud = ATTACH_AUDIENCE.into();
    assert_eq!(submit(real.sign(&wrong_aud).expect("sign")).await.expect("send").status(), StatusCode::UNAUTHORIZED);

    let mut wider = claims(&digest);
    wider.cpus = 0;
    let r = submit(real.sign(&wider).expect("sign")).await.expect("send");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(r.text().await.expect("body").contains("cpus"));

    let good = real.sign(&claims(&digest)).expect("sign");
    assert_eq!(submit(good.clone()).await.expect("send").status(), StatusCode::CREATED);
    let replay = submit(good).await.expect("send");
    assert_eq!(replay.status(), StatusCode::UNAUTHORIZED);
    assert!(replay.text().await.expect("body").contains("already used"));
    stack.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eps_cannot_attach_without_a_valid_attach_token() {
    let (dir, stack) = start_stack().await;
    let url = format!("{}/v1/ep/attach", stack.info().scheduler_url);
    let upgrade = || {
        http()
            .get(&url)
            .header("Connection", "Upgrade")
            .header("Upgrade", "websocket")
            .header("Sec-WebSocket-Version", "13")
            .header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
    };
    assert_eq!(status(upgrade()).await, StatusCode::UNAUTHORIZED);
    let (forger, _) = SigningKey::generate("attach-1").expect("keygen");
    let forged =
        htfaas_scheduler::mint_attach_token(&forger, "htfaas-scheduler", "site", None, None, 60).expect("mint");
    assert_eq!(status(upgrade().bearer_auth(forged)).await, StatusCode::UNAUTHORIZED);
    // A submit token is not an attach token, even from the scheduler's own key.
    let attach_key = SigningKey::load_or_create(&dir.path().join("scheduler/attach.pem"), "attach-1").expect("key");
    let mut c = claims(&Digest::of(b"m"));
    c.iss = "htfaas-scheduler".into();
    assert_eq!(status(upgrade().bearer_auth(attach_key.sign(&c).expect("sign"))).await, StatusCode::UNAUTHORIZED);
    // Issued two minutes ago for a minute: expired by more than the clock-skew leeway.
    let now = htfaas_functions::token::now_s();
    let expired = htfaas_functions::token::AttachClaims {
        iss: "htfaas-scheduler".into(),
        sub: "site".into(),
        aud: htfaas_functions::token::ATTACH_AUDIENCE.into(),
        iat: now - 120,
        exp: now - 60,
        jti: htfaas_functions::token::new_jti(),
        owner: None,
        annex: None,
    };
    const { assert!(60 > htfaas_functions::token::LEEWAY_S, "past the leeway") };
    let expired = attach_key.sign(&expired).expect("sign");
    assert_eq!(status(upgrade().bearer_auth(expired)).await, StatusCode::UNAUTHORIZED);
    stack.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_api_refuses_without_the_admin_token_and_serves_modules_only_by_digest() {
    let (_dir, stack) = start_stack().await;
    let gw = stack.info().gateway_url.clone();
    let wasm = b"\0asm\x01\0\0\0".to_vec();
    assert_eq!(status(http().post(format!("{gw}/v1/modules")).body(wasm.clone())).await, StatusCode::UNAUTHORIZED);
    assert_eq!(
        status(http().post(format!("{gw}/v1/modules")).bearer_auth("not-the-token").body(wasm.clone())).await,
        StatusCode::UNAUTHORIZED
    );
    for path in ["/v1/functions", "/v1/jobs", "/v1/accounting", "/v1/stats"] {
        assert_eq!(status(http().get(format!("{gw}{path}"))).await, StatusCode::UNAUTHORIZED, "{path}");
    }
    let manifest = htfaas::stack::demo_manifest(Digest::of(&wasm));
    assert_eq!(status(http().post(format!("{gw}/v1/functions")).json(&manifest)).await, StatusCode::UNAUTHORIZED);

    // Modules are public but content-addressed: only a well-formed digest is looked up.
    let client = stack.client().expect("client");
    let digest = client.upload_module(wasm.clone()).await.expect("upload");
    let body = http().get(format!("{gw}/v1/modules/{digest}")).send().await.expect("get").bytes().await.expect("body");
    assert_eq!(body.to_vec(), wasm);
    for bad in ["sha256:..%2F..%2Fsecrets.json", "registry.sqlite", "sha256:ABC"] {
        assert_eq!(status(http().get(format!("{gw}/v1/modules/{bad}"))).await, StatusCode::BAD_REQUEST, "{bad}");
    }
    // Not a module at all, and a manifest naming a module never uploaded.
    let r = client.upload_module(b"#!/bin/sh".to_vec()).await;
    assert!(r.expect_err("refused").to_string().contains("not a WebAssembly module"));
    let r = client.register(&htfaas::stack::demo_manifest(Digest::of(b"never uploaded"))).await;
    assert!(r.expect_err("refused").to_string().contains("upload it first"));
    stack.stop().await.expect("clean stop");
}
