//! In-process tests of the scheduler: a real server on 127.0.0.1:0 with a temporary store, a
//! gateway-like issuer key made here, reqwest as the submitter and tokio-tungstenite as the EP.

use base64::Engine as _;
use futures_util::{SinkExt as _, StreamExt as _};
use htfaas_functions::macaroon::{RootKey, authenticate, inspect, mint};
use htfaas_functions::proto::{
    Account, EpMsg, EventRef, FunctionRef, HOLD_CODE_BY_ADMIN, Hello, InputSpec, JobAction, JobAssignment, JobRecord,
    JobReport, JobState, Outcome, OutputFile, OutputSpec, Revocation, RevocationTarget, RevokeRequest, SchedulerMsg,
    SubmitRequest, SubmitResponse, Usage,
};
use htfaas_functions::token::{
    ATTACH_AUDIENCE, AttachClaims, SUBMIT_AUDIENCE, SigningKey, SubmitClaims, new_jti, now_s, write_jwks,
};
use htfaas_functions::{Digest, Resources};
use htfaas_scheduler::dispatch::{MACAROON_GRACE_S, utc_timestamp};
use htfaas_scheduler::queue::Queue;
use htfaas_scheduler::{ATTACH_KID, Config, OwnerLimits, TrustedIssuer, mint_attach_token};
use reqwest::StatusCode;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;

const ADMIN: &str = "admin-token-0123456789";
const GW: &str = "test-gateway";
const GW_KID: &str = "gw-1";
const NAME: &str = "test-scheduler";
const WAIT: Duration = Duration::from_secs(10);
const STORAGE_SECRET: &[u8] = b"scheduler-test-storage-root";
/// The storage origin the test scheduler trusts: every job's input and output are there.
const STORAGE: &str = "http://storage.invalid";
/// The module store the test scheduler trusts: modules are at `{MODULES}/v1/modules/<digest>`.
const MODULES: &str = "http://registry.invalid";

/// Issue 18: URLs a submitter chose, and a malicious EP's reports, refused.
#[path = "scheduler/attacks.rs"]
mod attacks;
/// The audit trail: what each decision records, queries, verification.
#[path = "scheduler/audit.rs"]
mod audit;
/// Faults without a crash (issue 9): the storage away, an EP gone mid-job, a full disk.
#[path = "scheduler/faults.rs"]
mod faults;
/// Fair share, quotas, classes, requirements, leases, retries, drains: the site policy.
#[path = "scheduler/policy.rs"]
mod policy;

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A running scheduler.
struct Server {
    addr: SocketAddr,
    shutdown: CancellationToken,
    join: tokio::task::JoinHandle<anyhow::Result<()>>,
    http: reqwest::Client,
}

impl Server {
    async fn start(dir: &Path) -> Server {
        Server::start_with(dir, OwnerLimits::default()).await
    }

    async fn start_with(dir: &Path, limits: OwnerLimits) -> Server {
        Server::start_configured(dir, |c| {
            c.max_idle_jobs_per_owner = limits.max_idle;
            c.max_running_jobs_per_owner = limits.max_running;
        })
        .await
    }

    /// Starts with the test defaults, then what `configure` changes.
    async fn start_configured(dir: &Path, configure: impl FnOnce(&mut Config)) -> Server {
        Server::start_with_queue(dir, configure).await.0
    }

    /// [`Server::start_configured`], with a handle on the store it runs on.
    async fn start_with_queue(dir: &Path, configure: impl FnOnce(&mut Config)) -> (Server, Queue) {
        let mut config = Config {
            listen: "127.0.0.1:0".parse().expect("addr"),
            db_path: dir.join("queue.sqlite"),
            name: NAME.into(),
            attach_key_file: dir.join("attach.pem"),
            // A departed EP's job runs again at once unless a test asks for a backoff.
            retry_backoff_s: 0,
            storage_origins: vec![STORAGE.into()],
            module_stores: vec![MODULES.into()],
            ..Config::new(ADMIN.into(), vec![TrustedIssuer { issuer: GW.into(), jwks_file: dir.join("gw.jwks") }])
        };
        configure(&mut config);
        let settings = config.resolve().await.expect("resolve");
        let queue = settings.queue();
        let addr = settings.local_addr();
        let shutdown = CancellationToken::new();
        let join = tokio::spawn(htfaas_scheduler::run(settings, shutdown.clone()));
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder().timeout(WAIT).build().expect("client");
        (Server { addr, shutdown, join, http }, queue)
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(20), self.join)
            .await
            .expect("scheduler stops in time")
            .expect("task joins")
            .expect("run returns Ok");
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn submit_raw(&self, token: Option<&str>, body: &impl serde::Serialize) -> (StatusCode, Value) {
        let mut req = self.http.post(self.url("/v1/jobs")).json(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.expect("submit answered");
        let status = resp.status();
        (status, resp.json().await.expect("JSON body"))
    }

    async fn submit(&self, token: &str, body: &SubmitRequest) -> SubmitResponse {
        let (status, v) = self.submit_raw(Some(token), body).await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        serde_json::from_value(v).expect("SubmitResponse")
    }

    async fn get(&self, path: &str, admin: Option<&str>) -> (StatusCode, Value) {
        let mut req = self.http.get(self.url(path));
        if let Some(t) = admin {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.expect("answered");
        let status = resp.status();
        let text = resp.text().await.expect("body");
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    async fn job(&self, id: &str) -> JobRecord {
        let (status, v) = self.get(&format!("/v1/jobs/{id}"), Some(ADMIN)).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        serde_json::from_value(v).expect("JobRecord")
    }

    async fn wait_for_state(&self, id: &str, state: JobState) -> JobRecord {
        let start = Instant::now();
        loop {
            let job = self.job(id).await;
            if job.state == state {
                return job;
            }
            assert!(start.elapsed() < WAIT, "job {id} stayed {:?}, wanted {state:?}", job.state);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn post(&self, path: &str, bearer: Option<&str>, body: Option<&Value>) -> (StatusCode, Value) {
        let mut req = self.http.post(self.url(path));
        if let Some(t) = bearer {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.expect("answered");
        let status = resp.status();
        (status, resp.json().await.expect("JSON body"))
    }

    async fn preflight(&self, token: &str) -> (StatusCode, Value) {
        self.post("/v1/preflight", Some(token), None).await
    }

    async fn revoke(&self, target: RevocationTarget, reason: &str) -> Revocation {
        let req = RevokeRequest { target, reason: reason.into() };
        let body = serde_json::to_value(&req).expect("json");
        let (status, v) = self.post("/v1/revocations", Some(ADMIN), Some(&body)).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        serde_json::from_value(v).expect("Revocation")
    }

    /// `POST /v1/jobs/{id}/{verb}` as the admin, with `reason`.
    async fn act_raw(&self, id: &str, verb: &str, reason: &str) -> (StatusCode, Value) {
        let body = serde_json::to_value(JobAction { reason: reason.into() }).expect("json");
        self.post(&format!("/v1/jobs/{id}/{verb}"), Some(ADMIN), Some(&body)).await
    }

    /// A job action that must succeed; returns the updated job.
    async fn act(&self, id: &str, verb: &str, reason: &str) -> JobRecord {
        let (status, v) = self.act_raw(id, verb, reason).await;
        assert_eq!(status, StatusCode::OK, "{verb} {id}: {v}");
        serde_json::from_value(v).expect("JobRecord")
    }

    async fn attach(&self, token: Option<&str>) -> Result<Ws, tungstenite::Error> {
        let mut req = format!("ws://{}/v1/ep/attach", self.addr).into_client_request()?;
        if let Some(t) = token {
            req.headers_mut().insert("authorization", format!("Bearer {t}").parse().expect("header"));
        }
        tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(req))
            .await
            .expect("attach answered")
            .map(|(ws, _)| ws)
    }
}

/// Test fixture: a temporary directory with the gateway's keys.
struct Fixture {
    dir: tempfile::TempDir,
    gw: SigningKey,
    digest: Digest,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let (gw, _) = SigningKey::generate(GW_KID).expect("keygen");
        write_jwks(&dir.path().join("gw.jwks"), &gw.jwks()).expect("write jwks");
        Fixture { dir, gw, digest: Digest::of(b"module") }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().to_owned()
    }

    fn claims(&self, sub: &str) -> SubmitClaims {
        SubmitClaims {
            iss: GW.into(),
            sub: sub.into(),
            aud: SUBMIT_AUDIENCE.into(),
            exp: now_s() + 300,
            iat: now_s(),
            jti: new_jti(),
            jobs: 1,
            cpus: 2,
            memory_mb: 1024,
            runtime_s: 600,
            function: Some(self.digest.clone()),
            group: None,
        }
    }

    fn token(&self, sub: &str) -> String {
        self.gw.sign(&self.claims(sub)).expect("sign")
    }

    fn request(&self, key: &str) -> SubmitRequest {
        SubmitRequest {
            function: FunctionRef {
                name: "checksum".into(),
                version: 3,
                digest: self.digest.clone(),
                module_url: format!("{MODULES}/v1/modules/{}", self.digest),
            },
            resources: Resources::new(2, 256, 60),
            input: InputSpec {
                url: "http://storage.invalid/data/raw/a.dat".into(),
                name: "a.dat".into(),
                macaroon: storage_macaroon(&["activity:DOWNLOAD", "path:/data/raw/a.dat"]),
            },
            output: OutputSpec {
                url: "http://storage.invalid/data/out/".into(),
                macaroon: storage_macaroon(&["activity:UPLOAD,DELETE", "path:/data/out"]),
            },
            args: vec!["--fast".into()],
            env: vec![("MODE".into(), "x".into())],
            event: EventRef::new("dcache", format!("{key}/s1"), "/data/raw/a.dat"),
            dedupe_key: key.into(),
            annex: None,
            bind_ep_address: false,
            class: None,
            limits: Default::default(),
        }
    }

    fn attach_key(&self) -> SigningKey {
        SigningKey::load_or_create(&self.dir.path().join("attach.pem"), ATTACH_KID).expect("attach key")
    }

    fn attach_token(&self, owner: Option<&str>) -> String {
        mint_attach_token(&self.attach_key(), NAME, "site", owner.map(str::to_owned), None, 300).expect("mint")
    }

    fn annex_token(&self, annex: Option<&str>) -> String {
        mint_attach_token(&self.attach_key(), NAME, "site", None, annex.map(str::to_owned), 300).expect("mint")
    }

    /// A site EP's attach token and its claims.
    fn attach_token_with_claims(&self, ttl_s: u64) -> (String, AttachClaims) {
        let token = mint_attach_token(&self.attach_key(), NAME, "site", None, None, ttl_s).expect("mint");
        let payload = token.split('.').nth(1).expect("payload");
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).expect("base64");
        (token, serde_json::from_slice(&bytes).expect("claims"))
    }
}

/// A macaroon as the storage would mint it.
fn storage_macaroon(caveats: &[&str]) -> String {
    let caveats: Vec<String> = caveats.iter().map(|c| (*c).to_owned()).collect();
    mint(&RootKey::derive(STORAGE_SECRET), "storage.invalid", "id-1", &caveats).expect("mint")
}

fn error_of(v: &Value) -> &str {
    v["error"].as_str().unwrap_or_else(|| panic!("no ApiError in {v}"))
}

async fn next_text(ws: &mut Ws) -> String {
    loop {
        let frame = tokio::time::timeout(WAIT, ws.next()).await.expect("message in time");
        match frame.expect("stream open").expect("frame") {
            Message::Text(t) => return t.as_str().to_owned(),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("unexpected frame {other:?}"),
        }
    }
}

async fn next_json(ws: &mut Ws) -> Value {
    serde_json::from_str(&next_text(ws).await).expect("JSON message")
}

/// Asserts no message arrives for a while.
async fn expect_silence(ws: &mut Ws, d: Duration) {
    if let Ok(frame) = tokio::time::timeout(d, ws.next()).await {
        panic!("expected silence, got {frame:?}");
    }
}

async fn send(ws: &mut Ws, msg: &EpMsg) {
    ws.send(Message::text(serde_json::to_string(msg).expect("encode"))).await.expect("send");
}

/// Says hello and returns the session id from Welcome.
async fn hello(ws: &mut Ws, name: &str, cpus: u32) -> String {
    hello_annex(ws, name, cpus, None).await
}

fn hello_msg(name: &str, cpus: u32, annex: Option<&str>) -> EpMsg {
    EpMsg::Hello(Hello {
        name: name.into(),
        slots: Resources::new(cpus, 4096, 3600),
        protocol: 1,
        annex: annex.map(str::to_owned),
        labels: Default::default(),
    })
}

/// Says hello (naming `annex`) and returns the session id from Welcome.
async fn hello_annex(ws: &mut Ws, name: &str, cpus: u32, annex: Option<&str>) -> String {
    send(ws, &hello_msg(name, cpus, annex)).await;
    let welcome = next_json(ws).await;
    assert_eq!(welcome["type"], "welcome", "{welcome}");
    welcome["ep_id"].as_str().expect("ep_id").to_owned()
}

/// Waits for an Assign and returns its job id, checking it carries no owner.
async fn expect_assign(ws: &mut Ws, owner: &str) -> String {
    let text = next_text(ws).await;
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(v["type"], "assign", "{v}");
    assert!(!text.contains("owner"), "assignment names an owner: {text}");
    assert!(!text.contains(owner), "assignment leaks the owner {owner:?}: {text}");
    v["job_id"].as_str().expect("job_id").to_owned()
}

/// Waits for the next message, which must be an Assign, and returns it whole.
async fn expect_assignment(ws: &mut Ws) -> JobAssignment {
    match serde_json::from_str::<SchedulerMsg>(&next_text(ws).await).expect("SchedulerMsg") {
        SchedulerMsg::Assign(a) => a,
        other => panic!("expected an assign, got {other:?}"),
    }
}

/// Waits for a close frame (skipping nothing else) and returns its code and reason.
async fn expect_close(ws: &mut Ws) -> (u16, String) {
    loop {
        let frame = tokio::time::timeout(WAIT, ws.next()).await.expect("close in time");
        match frame {
            Some(Ok(Message::Close(Some(f)))) => return (u16::from(f.code), f.reason.as_str().to_owned()),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            other => panic!("expected a close frame, got {other:?}"),
        }
    }
}

fn report(job_id: &str, outcome: Outcome, usage: Usage) -> EpMsg {
    EpMsg::Finished(JobReport {
        job_id: job_id.into(),
        outcome,
        usage,
        outputs: vec![OutputFile { path: "/data/out/a.sum".into(), size: 64, sha256: "ab".repeat(32) }],
        log: "done\n".into(),
    })
}

async fn assert_attach_refused(server: &Server, token: Option<&str>, what: &str) {
    assert_attach_refused_with(server, token, 401, "attach token", what).await;
}

async fn assert_attach_refused_with(server: &Server, token: Option<&str>, status: u16, message: &str, what: &str) {
    match server.attach(token).await {
        Err(tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status(), status, "{what}");
            let body = resp.body().as_deref().map(String::from_utf8_lossy).unwrap_or_default().into_owned();
            assert!(body.contains(message), "{what}: {body}");
        }
        Err(e) => panic!("{what}: unexpected error {e}"),
        Ok(_) => panic!("{what}: attach accepted"),
    }
}

#[tokio::test]
async fn submit_checks_tokens_limits_and_requests() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;

    // A good token: 201, listed idle with owner = sub.
    let token = fx.token("alice");
    let first = server.submit(&token, &fx.request("e1")).await;
    assert!(first.created);
    let (status, list) = server.get("/v1/jobs", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let list: Vec<JobRecord> = serde_json::from_value(list).expect("records");
    assert_eq!(list.len(), 1);
    assert_eq!((list[0].id.as_str(), list[0].owner.as_str()), (first.job_id.as_str(), "alice"));
    assert_eq!(list[0].state, JobState::Idle);
    assert_eq!((list[0].function.as_str(), list[0].version), ("checksum", 3));
    assert_eq!(list[0].input, "http://storage.invalid/data/raw/a.dat");
    assert!(!serde_json::to_string(&list).expect("json").contains("macaroon"));

    // The same token again (another event): used up.
    let (status, v) = server.submit_raw(Some(&token), &fx.request("e2")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(error_of(&v), "token already used (1 of 1 jobs)");

    // The same dedupe key with a fresh token: the first job, not a new one, token not consumed.
    let fresh = fx.token("alice");
    let (status, v) = server.submit_raw(Some(&fresh), &fx.request("e1")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let again: SubmitResponse = serde_json::from_value(v).expect("SubmitResponse");
    assert_eq!((again.job_id.as_str(), again.created), (first.job_id.as_str(), false));
    assert!(server.submit(&fresh, &fx.request("e3")).await.created, "dedupe hit did not consume the token");

    // Tokens that must not verify.
    let mut expired = fx.claims("alice");
    expired.exp = now_s() - 120;
    let mut wrong_aud = fx.claims("alice");
    wrong_aud.aud = ATTACH_AUDIENCE.into();
    let mut untrusted = fx.claims("alice");
    untrusted.iss = "someone-else".into();
    let (forger, _) = SigningKey::generate(GW_KID).expect("keygen");
    let (other_kid, _) = SigningKey::generate("gw-2").expect("keygen");
    let good = fx.token("alice");
    let mut widened = fx.claims("alice");
    widened.cpus = 64;
    let payload =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(&widened).expect("claims json"));
    let parts: Vec<&str> = good.split('.').collect();
    let tampered = format!("{}.{payload}.{}", parts[0], parts[2]);
    let cases = [
        (fx.gw.sign(&expired).expect("sign"), "expired"),
        (fx.gw.sign(&wrong_aud).expect("sign"), "audience"),
        (fx.gw.sign(&untrusted).expect("sign"), "untrusted issuer"),
        (forger.sign(&fx.claims("alice")).expect("sign"), "signature"),
        (other_kid.sign(&fx.claims("alice")).expect("sign"), "unknown signing key"),
        (tampered, "signature"),
        ("not-a-jwt".into(), "malformed"),
    ];
    for (bad, expected) in &cases {
        let (status, v) = server.submit_raw(Some(bad), &fx.request("bad")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{expected}: {v}");
        assert!(error_of(&v).contains(expected), "{expected}: {v}");
    }
    let (status, v) = server.submit_raw(None, &fx.request("bad")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(error_of(&v).contains("missing bearer"), "{v}");

    // Over the token's limits: 403 naming the limit.
    let limited = |f: &dyn Fn(&mut SubmitClaims)| {
        let mut c = fx.claims("alice");
        c.cpus = 1;
        f(&mut c);
        fx.gw.sign(&c).expect("sign")
    };
    let over = [
        (limited(&|_| {}), "cpus 2 exceeds the token's limit of 1"),
        (limited(&|c| (c.cpus, c.memory_mb) = (2, 128)), "memory_mb 256 exceeds the token's limit of 128"),
        (limited(&|c| (c.cpus, c.runtime_s) = (2, 30)), "runtime_s 60 exceeds the token's limit of 30"),
        (limited(&|c| (c.cpus, c.function) = (2, Some(Digest::of(b"other")))), "function digest"),
    ];
    for (t, expected) in &over {
        let (status, v) = server.submit_raw(Some(t), &fx.request("over")).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{expected}: {v}");
        assert!(error_of(&v).contains(expected), "{expected}: {v}");
    }

    // Bad requests: 400.
    let mut bad_name = fx.request("bad-name");
    bad_name.input.name = "../x".into();
    let mut bad_out = fx.request("bad-out");
    bad_out.output.url = "http://storage.invalid/data/out".into();
    let mut bad_key = fx.request("");
    bad_key.dedupe_key.clear();
    for (req, expected) in [(bad_name, "input.name"), (bad_out, "output.url"), (bad_key, "dedupe_key")] {
        let (status, v) = server.submit_raw(Some(&fx.token("alice")), &req).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{expected}: {v}");
        assert!(error_of(&v).contains(expected), "{expected}: {v}");
    }
    let (status, v) = server.submit_raw(Some(&fx.token("alice")), &serde_json::json!({"nope": 1})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error_of(&v).contains("invalid request body"), "{v}");

    let huge = serde_json::json!({ "x": "a".repeat(300 * 1024) });
    let (status, v) = server.submit_raw(Some(&fx.token("alice")), &huge).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert!(error_of(&v).contains("request body"), "{v}");
    let (status, v) = server.get("/v1/nope", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(error_of(&v).contains("no such endpoint"), "{v}");

    // Admin endpoints.
    for path in ["/v1/jobs", "/v1/accounting"] {
        let (status, v) = server.get(path, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}: {v}");
        assert!(error_of(&v).contains("missing admin"), "{v}");
        let (status, v) = server.get(path, Some("admin-token-0123456788")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}: {v}");
        assert!(error_of(&v).contains("invalid admin token"), "{v}");
    }
    let (status, v) = server.get("/v1/jobs?limit=1", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v.as_array().map(Vec::len), Some(1));
    let (status, v) = server.get("/v1/jobs?limit=x", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let (status, v) = server.get("/v1/jobs/no-such-job", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a job record is for admins: {v}");
    let (status, v) = server.get("/v1/jobs/no-such-job", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(error_of(&v).contains("not found"));
    let (status, _) = server.get("/healthz", None).await;
    assert_eq!(status, StatusCode::OK);

    server.stop().await;
}

#[tokio::test]
async fn an_attached_ep_runs_a_job_and_its_owner_is_charged() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;

    // Refused before the upgrade.
    let (forger, _) = SigningKey::generate(ATTACH_KID).expect("keygen");
    let forged = mint_attach_token(&forger, NAME, "site", None, None, 300).expect("mint");
    let expired = fx
        .attach_key()
        .sign(&AttachClaims {
            iss: NAME.into(),
            sub: "site".into(),
            aud: ATTACH_AUDIENCE.into(),
            exp: now_s() - 120,
            iat: now_s() - 400,
            jti: new_jti(),
            owner: None,
            annex: None,
        })
        .expect("sign");
    let mut wrong_aud = fx.claims("site");
    wrong_aud.iss = NAME.into();
    let wrong_aud = fx.attach_key().sign(&wrong_aud).expect("sign");
    assert_attach_refused(&server, None, "no token").await;
    assert_attach_refused(&server, Some(&forged), "forged").await;
    assert_attach_refused(&server, Some(&expired), "expired").await;
    assert_attach_refused(&server, Some(&wrong_aud), "wrong audience").await;
    assert_attach_refused(&server, Some(&fx.token("alice")), "a submit token").await;

    let job = server.submit(&fx.token("alice"), &fx.request("e1")).await.job_id;
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-1", 4).await;
    assert_eq!(expect_assign(&mut ep, "alice").await, job);
    let running = server.job(&job).await;
    assert_eq!((running.state, running.ep.as_deref()), (JobState::Running, Some("ep-1")));

    // Noise is ignored: a report for a job not running here, garbage, a second hello.
    send(&mut ep, &report("not-a-job", Outcome::Exited { exit_code: 0 }, Usage::default())).await;
    ep.send(Message::text("{garbage")).await.expect("send");
    ep.send(Message::binary(vec![1, 2, 3])).await.expect("send");
    send(
        &mut ep,
        &EpMsg::Hello(Hello {
            name: "x".into(),
            slots: Resources::default(),
            protocol: 1,
            annex: None,
            labels: Default::default(),
        }),
    )
    .await;

    let usage = Usage {
        wall_ms: 3000,
        cpu_ms: 2500,
        peak_memory_bytes: 1 << 20,
        bytes_in: 1000,
        bytes_out: 64,
        instructions: None,
    };
    send(&mut ep, &report(&job, Outcome::Exited { exit_code: 0 }, usage)).await;
    let done = server.wait_for_state(&job, JobState::Completed).await;
    assert_eq!(done.usage, Some(usage));
    assert_eq!(done.exit_code, Some(0));
    assert_eq!(done.outputs.len(), 1);
    assert!(done.finished_at_ms.is_some() && done.started_at_ms.is_some());
    let (status, log) = server.get(&format!("/v1/jobs/{job}/log"), Some(ADMIN)).await;
    assert_eq!((status, log["log"].as_str()), (StatusCode::OK, Some("done\n")));
    let (status, _) = server.get("/v1/jobs/nope/log", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = server.get(&format!("/v1/jobs/{job}/log"), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // A second, failing job on the same session (which survived the noise).
    let job2 = server.submit(&fx.token("alice"), &fx.request("e2")).await.job_id;
    assert_eq!(expect_assign(&mut ep, "alice").await, job2);
    let usage2 =
        Usage { wall_ms: 1000, cpu_ms: 500, peak_memory_bytes: 0, bytes_in: 10, bytes_out: 0, instructions: None };
    send(&mut ep, &report(&job2, Outcome::Trapped { message: "unreachable".into() }, usage2)).await;
    let failed = server.wait_for_state(&job2, JobState::Failed).await;
    assert_eq!(failed.reason, "trapped: unreachable");
    // A duplicate report changes nothing.
    send(&mut ep, &report(&job2, Outcome::Exited { exit_code: 0 }, usage2)).await;

    let (status, v) = server.get("/v1/accounting", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let accounts: Vec<Account> = serde_json::from_value(v).expect("accounts");
    assert_eq!(accounts.len(), 1);
    let a = &accounts[0];
    assert_eq!((a.owner.as_str(), a.jobs_completed, a.jobs_failed), ("alice", 1, 1));
    assert!((a.core_seconds - 8.0).abs() < 1e-9, "2 cpus × (3 s + 1 s): {a:?}");
    assert!((a.cpu_seconds - 3.0).abs() < 1e-9, "{a:?}");
    assert!((a.wall_seconds - 4.0).abs() < 1e-9, "{a:?}");
    assert_eq!((a.bytes_in, a.bytes_out), (1010, 64));

    ep.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn an_owner_restricted_ep_gets_only_its_owners_jobs() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let bobs = server.submit(&fx.token("bob"), &fx.request("b1")).await.job_id;
    let alices = server.submit(&fx.token("alice"), &fx.request("a1")).await.job_id;

    let mut mine = server.attach(Some(&fx.attach_token(Some("alice")))).await.expect("attach");
    hello(&mut mine, "alices-ep", 8).await;
    assert_eq!(expect_assign(&mut mine, "alice").await, alices);
    expect_silence(&mut mine, Duration::from_millis(300)).await;
    assert_eq!(server.job(&bobs).await.state, JobState::Idle);

    let mut site = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut site, "site-ep", 8).await;
    assert_eq!(expect_assign(&mut site, "bob").await, bobs);

    mine.close(None).await.expect("close");
    site.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn a_departed_eps_job_runs_again_elsewhere() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let job = server.submit(&fx.token("alice"), &fx.request("e1")).await.job_id;

    let mut first = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut first, "ep-1", 2).await;
    assert_eq!(expect_assign(&mut first, "alice").await, job);
    drop(first);
    let idle = server.wait_for_state(&job, JobState::Idle).await;
    assert_eq!(idle.ep, None);

    let mut second = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut second, "ep-2", 2).await;
    assert_eq!(expect_assign(&mut second, "alice").await, job);
    send(&mut second, &report(&job, Outcome::Exited { exit_code: 0 }, Usage::default())).await;
    let done = server.wait_for_state(&job, JobState::Completed).await;
    assert_eq!(done.ep.as_deref(), Some("ep-2"));

    second.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn an_ep_gets_no_more_than_its_slots() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let mut jobs = Vec::new();
    for i in 0..3 {
        jobs.push(server.submit(&fx.token("alice"), &fx.request(&format!("e{i}"))).await.job_id);
    }
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-4-cores", 4).await;
    let a = expect_assign(&mut ep, "alice").await;
    let b = expect_assign(&mut ep, "alice").await;
    assert_eq!(vec![a.clone(), b], jobs[..2].to_vec(), "oldest first");
    expect_silence(&mut ep, Duration::from_millis(300)).await;
    send(&mut ep, &report(&a, Outcome::Exited { exit_code: 0 }, Usage::default())).await;
    assert_eq!(expect_assign(&mut ep, "alice").await, jobs[2]);
    ep.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn queued_jobs_survive_a_restart() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let job = server.submit(&fx.token("alice"), &fx.request("e1")).await.job_id;
    server.stop().await;

    let server = Server::start(&fx.path()).await;
    assert_eq!(server.job(&job).await.state, JobState::Idle);
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-1", 2).await;
    assert_eq!(expect_assign(&mut ep, "alice").await, job);
    // Stopping with the job running puts it back to idle, durably.
    server.stop().await;
    let server = Server::start(&fx.path()).await;
    assert_eq!(server.job(&job).await.state, JobState::Idle);
    server.stop().await;
}

#[tokio::test]
async fn annex_jobs_run_only_on_their_annexs_eps() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let mut claims = fx.claims("alice");
    claims.group = Some("physics".into());
    let mut annex_req = fx.request("gpu-1");
    annex_req.annex = Some("gpu".into());
    let annex_job = server.submit(&fx.gw.sign(&claims).expect("sign"), &annex_req).await.job_id;
    let rec = server.job(&annex_job).await;
    assert_eq!(
        (rec.token_issuer.as_str(), rec.group.as_deref(), rec.annex.as_deref()),
        (GW, Some("physics"), Some("gpu"))
    );
    let mut bad = fx.request("bad-annex");
    bad.annex = Some("GPU!".into());
    let (status, v) = server.submit_raw(Some(&fx.token("alice")), &bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(error_of(&v).contains("annex"), "{v}");

    // A site EP gets the plain job, never the annex job.
    let mut site = server.attach(Some(&fx.annex_token(None))).await.expect("attach");
    hello(&mut site, "site-ep", 8).await;
    expect_silence(&mut site, Duration::from_millis(300)).await;
    let plain = server.submit(&fx.token("alice"), &fx.request("plain-1")).await.job_id;
    assert_eq!(expect_assign(&mut site, "alice").await, plain);
    site.close(None).await.expect("close");

    // Another annex's EP gets nothing; the annex's own EP (whose Hello need not repeat the
    // annex) gets the annex job and no plain job.
    let mut other = server.attach(Some(&fx.annex_token(Some("other")))).await.expect("attach");
    hello_annex(&mut other, "other-ep", 8, Some("other")).await;
    let mut gpu = server.attach(Some(&fx.annex_token(Some("gpu")))).await.expect("attach");
    hello(&mut gpu, "gpu-ep", 8).await;
    assert_eq!(expect_assign(&mut gpu, "alice").await, annex_job);
    let plain2 = server.submit(&fx.token("alice"), &fx.request("plain-2")).await.job_id;
    expect_silence(&mut gpu, Duration::from_millis(300)).await;
    expect_silence(&mut other, Duration::from_millis(10)).await;
    assert_eq!(server.job(&plain2).await.state, JobState::Idle);

    // A Hello naming another annex than the token's is refused at once.
    let cases = [
        (Some("gpu"), r#"annex mismatch: the attach token is for annex "gpu", the EP asked for "cpu""#),
        (None, r#"annex mismatch: the attach token is for no annex, the EP asked for "cpu""#),
    ];
    for (token_annex, expected) in cases {
        let mut ws = server.attach(Some(&fx.annex_token(token_annex))).await.expect("attach");
        send(&mut ws, &hello_msg("wrong-annex", 8, Some("cpu"))).await;
        assert_eq!(expect_close(&mut ws).await, (4403, expected.to_owned()));
    }
    assert_eq!(server.job(&plain2).await.state, JobState::Idle, "a refused session took no job");

    other.close(None).await.expect("close");
    gpu.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn assignments_carry_macaroons_attenuated_to_the_jobs_lifetime() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let req = fx.request("e1");
    let job = server.submit(&fx.token("alice"), &req).await.job_id;
    let runtime = req.resources.runtime_s;
    let root = RootKey::derive(STORAGE_SECRET);

    let t0 = htfaas_functions::token::now_s();
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-1", 2).await;
    let a = expect_assignment(&mut ep).await;
    let t1 = htfaas_functions::token::now_s();
    assert_eq!(a.job_id, job);
    let earliest = format!("before:{}", utc_timestamp(t0 + runtime + MACAROON_GRACE_S));
    let latest = format!("before:{}", utc_timestamp(t1 + runtime + MACAROON_GRACE_S));
    for (sent, stored) in [(&a.input.macaroon, &req.input.macaroon), (&a.output.macaroon, &req.output.macaroon)] {
        let original = inspect(stored).expect("stored macaroon parses");
        let caveats = inspect(sent).expect("sent macaroon parses");
        assert_eq!(caveats.len(), original.len() + 1, "{caveats:?}");
        assert!(!caveats.iter().any(|c| c.starts_with("ip:")), "not asked to bind, yet bound: {caveats:?}");
        assert_eq!(caveats[..original.len()], original[..]);
        let before = &caveats[original.len()];
        assert!(
            before.as_str() >= earliest.as_str() && before.as_str() <= latest.as_str(),
            "{before} not in [{earliest}, {latest}]"
        );
        let verified = authenticate(sent, &root).expect("the storage's root key still verifies the chain");
        assert_eq!(verified.caveats, caveats);
    }

    // The stored macaroons are unchanged: the job run again gets one `before:`, not two.
    drop(ep);
    server.wait_for_state(&job, JobState::Idle).await;
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-2", 2).await;
    let again = expect_assignment(&mut ep).await;
    let caveats = inspect(&again.input.macaroon).expect("parses");
    assert_eq!(caveats.iter().filter(|c| c.starts_with("before:")).count(), 1, "{caveats:?}");
    send(&mut ep, &report(&job, Outcome::Exited { exit_code: 0 }, Usage::default())).await;
    server.wait_for_state(&job, JobState::Completed).await;

    // A macaroon that does not parse fails its job at once; nothing is sent.
    let mut broken = fx.request("e2");
    broken.output.macaroon = "not-a-macaroon".into();
    let bad = server.submit(&fx.token("alice"), &broken).await.job_id;
    let failed = server.wait_for_state(&bad, JobState::Failed).await;
    assert!(failed.reason.starts_with("macaroon could not be attenuated: "), "{}", failed.reason);
    expect_silence(&mut ep, Duration::from_millis(300)).await;

    ep.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn assignments_bind_macaroons_to_the_eps_address_when_the_job_asks() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let root = RootKey::derive(STORAGE_SECRET);
    let mut req = fx.request("bound");
    req.bind_ep_address = true;
    let job = server.submit(&fx.token("alice"), &req).await.job_id;

    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-1", 2).await;
    let a = expect_assignment(&mut ep).await;
    assert_eq!(a.job_id, job);
    for (sent, stored) in [(&a.input.macaroon, &req.input.macaroon), (&a.output.macaroon, &req.output.macaroon)] {
        let original = inspect(stored).expect("stored macaroon parses");
        let caveats = inspect(sent).expect("sent macaroon parses");
        // The stored caveats, then the deadline, then the address this EP attached from.
        assert_eq!(caveats[..original.len()], original[..]);
        let added: Vec<&str> = caveats[original.len()..].iter().map(String::as_str).collect();
        assert!(matches!(added[..], [before, "ip:127.0.0.1"] if before.starts_with("before:")), "{caveats:?}");
        let verified = authenticate(sent, &root).expect("the storage's root key still verifies the chain");
        assert_eq!(verified.caveats, caveats);
    }
    send(&mut ep, &report(&job, Outcome::Exited { exit_code: 0 }, Usage::default())).await;
    server.wait_for_state(&job, JobState::Completed).await;

    // A job that does not ask gets no `ip:` caveat from the same EP.
    let unbound = server.submit(&fx.token("alice"), &fx.request("unbound")).await.job_id;
    let a = expect_assignment(&mut ep).await;
    assert_eq!(a.job_id, unbound);
    for m in [&a.input.macaroon, &a.output.macaroon] {
        let caveats = inspect(m).expect("parses");
        assert!(!caveats.iter().any(|c| c.starts_with("ip:")), "{caveats:?}");
        assert!(caveats.last().is_some_and(|c| c.starts_with("before:")), "{caveats:?}");
    }

    ep.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn revoking_a_submit_token_refuses_it_everywhere_and_removes_its_jobs() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let mut claims = fx.claims("alice");
    claims.jobs = 3;
    let token = fx.gw.sign(&claims).expect("sign");

    let (status, v) = server.preflight(&token).await;
    assert_eq!((status, v["remaining"].as_u64()), (StatusCode::OK, Some(3)), "{v}");
    let job = server.submit(&token, &fx.request("e1")).await.job_id;
    let (status, v) = server.preflight(&token).await;
    assert_eq!((status, v["remaining"].as_u64()), (StatusCode::OK, Some(2)), "preflight used nothing: {v}");
    let single = fx.token("bob");
    let bobs = server.submit(&single, &fx.request("b1")).await.job_id;
    let (status, v) = server.preflight(&single).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{v}");
    assert_eq!(error_of(&v), "token already used (1 of 1 jobs)");
    let (status, v) = server.preflight("not-a-jwt").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{v}");

    // Only an admin may revoke, and only with a sound request.
    let leaked = serde_json::json!({"target": {"kind": "jti", "value": claims.jti}, "reason": "leaked"});
    let (status, v) = server.post("/v1/revocations", None, Some(&leaked)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{v}");
    let (status, _) = server.post("/v1/revocations", Some(&token), Some(&leaked)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let invalid = [
        (serde_json::json!({"target": {"kind": "jti", "value": ""}, "reason": "r"}), "value"),
        (serde_json::json!({"target": {"kind": "owner", "value": "x".repeat(257)}, "reason": "r"}), "value"),
        (serde_json::json!({"target": {"kind": "issuer", "value": GW}, "reason": "r".repeat(1025)}), "reason"),
        (serde_json::json!({"target": {"kind": "user", "value": "x"}, "reason": "r"}), "invalid revocation"),
    ];
    for (body, expected) in &invalid {
        let (status, v) = server.post("/v1/revocations", Some(ADMIN), Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert!(error_of(&v).contains(expected), "{body}: {v}");
    }
    let (_, v) = server.get("/v1/revocations", Some(ADMIN)).await;
    assert_eq!(v, serde_json::json!([]), "refused requests record nothing");

    let r = server.revoke(RevocationTarget::Jti(claims.jti.clone()), "leaked").await;
    assert_eq!((r.removed_jobs, r.stopped_jobs, r.closed_eps), (vec![job.clone()], vec![], vec![]));
    assert_eq!((r.by.as_str(), r.reason.as_str()), ("admin", "leaked"));
    let removed = server.job(&job).await;
    assert_eq!((removed.state, removed.reason.as_str()), (JobState::Removed, "token revoked: leaked"));
    assert_eq!(server.job(&bobs).await.state, JobState::Idle);
    for (status, v) in [server.submit_raw(Some(&token), &fx.request("e2")).await, server.preflight(&token).await] {
        assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
        assert_eq!(error_of(&v), "token revoked: leaked");
    }
    let (status, v) = server.get("/v1/revocations", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{v}");

    // Recorded: it survives a restart.
    server.stop().await;
    let server = Server::start(&fx.path()).await;
    let (status, v) = server.submit_raw(Some(&token), &fx.request("e3")).await;
    assert_eq!((status, error_of(&v)), (StatusCode::FORBIDDEN, "token revoked: leaked"));

    // An issuer: every token it signed, and every idle job they made.
    let r = server.revoke(RevocationTarget::Issuer(GW.into()), "gateway key compromised").await;
    assert_eq!(r.removed_jobs, vec![bobs.clone()]);
    let (status, v) = server.submit_raw(Some(&fx.token("carol")), &fx.request("c1")).await;
    assert_eq!((status, error_of(&v)), (StatusCode::FORBIDDEN, "token revoked: gateway key compromised"));
    let (_, v) = server.get("/v1/revocations", Some(ADMIN)).await;
    let all: Vec<Revocation> = serde_json::from_value(v).expect("revocations");
    let targets: Vec<_> = all.iter().map(|r| r.target.clone()).collect();
    assert_eq!(targets, vec![RevocationTarget::Jti(claims.jti), RevocationTarget::Issuer(GW.into())]);
    assert_eq!(all[1].removed_jobs, vec![bobs]);
    server.stop().await;
}

#[tokio::test]
async fn revoking_an_owner_stops_their_running_jobs_and_closes_their_eps() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let mut site = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut site, "site-ep", 2).await;
    let on_site = server.submit(&fx.token("alice"), &fx.request("a1")).await.job_id;
    assert_eq!(expect_assign(&mut site, "alice").await, on_site);
    let mut alices = server.attach(Some(&fx.attach_token(Some("alice")))).await.expect("attach");
    let alices_id = hello(&mut alices, "alices-ep", 2).await;
    let on_alices = server.submit(&fx.token("alice"), &fx.request("a2")).await.job_id;
    assert_eq!(expect_assign(&mut alices, "alice").await, on_alices);
    let queued = server.submit(&fx.token("alice"), &fx.request("a3")).await.job_id;

    let mut r = server.revoke(RevocationTarget::Owner("alice".into()), "account closed").await;
    r.stopped_jobs.sort();
    let mut stopped = vec![on_site.clone(), on_alices.clone()];
    stopped.sort();
    assert_eq!((r.removed_jobs, r.stopped_jobs, r.closed_eps), (vec![queued.clone()], stopped, vec![alices_id]));
    let cancel =
        |id: &str| serde_json::json!({"type": "cancel", "job_id": id, "reason": "token revoked: account closed"});
    assert_eq!(next_json(&mut site).await, cancel(&on_site));
    assert_eq!(next_json(&mut alices).await, cancel(&on_alices));
    assert_eq!(expect_close(&mut alices).await, (4403, "attach token revoked: account closed".to_owned()));
    for id in [&on_site, &on_alices, &queued] {
        let rec = server.job(id).await;
        assert_eq!((rec.state, rec.reason.as_str()), (JobState::Removed, "token revoked: account closed"), "{id}");
    }

    // The stopped job keeps its room on the site EP until the EP reports; the report is charged
    // but changes nothing else.
    let bobs = server.submit(&fx.token("bob"), &fx.request("b1")).await.job_id;
    expect_silence(&mut site, Duration::from_millis(300)).await;
    let usage = Usage { wall_ms: 2000, cpu_ms: 100, ..Usage::default() };
    let cancelled = Outcome::Cancelled { reason: "token revoked: account closed".into() };
    send(&mut site, &report(&on_site, cancelled, usage)).await;
    assert_eq!(expect_assign(&mut site, "bob").await, bobs);
    let rec = server.job(&on_site).await;
    assert_eq!((rec.state, rec.usage), (JobState::Removed, Some(usage)));
    let (_, v) = server.get("/v1/accounting", Some(ADMIN)).await;
    let accounts: Vec<Account> = serde_json::from_value(v).expect("accounts");
    let alice = accounts.iter().find(|a| a.owner == "alice").expect("alice charged");
    assert_eq!((alice.jobs_completed, alice.jobs_failed), (0, 0));
    assert!((alice.core_seconds - 4.0).abs() < 1e-9, "2 cpus × 2 s: {alice:?}");

    let refused = "attach token revoked: account closed";
    assert_attach_refused_with(&server, Some(&fx.attach_token(Some("alice"))), 403, refused, "alice's EP").await;
    let (status, v) = server.submit_raw(Some(&fx.token("alice")), &fx.request("a4")).await;
    assert_eq!((status, error_of(&v)), (StatusCode::FORBIDDEN, "token revoked: account closed"));

    site.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn revoking_an_eps_attach_token_closes_it_and_its_jobs_run_elsewhere() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let (token, claims) = fx.attach_token_with_claims(300);
    let mut ep = server.attach(Some(&token)).await.expect("attach");
    let ep_id = hello(&mut ep, "ep-1", 2).await;
    let job = server.submit(&fx.token("alice"), &fx.request("e1")).await.job_id;
    assert_eq!(expect_assign(&mut ep, "alice").await, job);

    let r = server.revoke(RevocationTarget::Jti(claims.jti), "stolen laptop").await;
    assert_eq!((r.removed_jobs, r.stopped_jobs, r.closed_eps), (vec![], vec![], vec![ep_id]));
    assert_eq!(expect_close(&mut ep).await, (4403, "attach token revoked: stolen laptop".to_owned()));
    server.wait_for_state(&job, JobState::Idle).await;
    assert_attach_refused_with(&server, Some(&token), 403, "attach token revoked: stolen laptop", "revoked").await;

    let mut other = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut other, "ep-2", 2).await;
    assert_eq!(expect_assign(&mut other, "alice").await, job);
    other.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn a_session_is_closed_when_its_attach_token_expires() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let job = server.submit(&fx.token("alice"), &fx.request("e1")).await.job_id;
    let (token, claims) = fx.attach_token_with_claims(2);
    let mut ep = server.attach(Some(&token)).await.expect("attach");
    hello(&mut ep, "short-lived", 2).await;
    assert_eq!(expect_assign(&mut ep, "alice").await, job);
    assert_eq!(expect_close(&mut ep).await, (4401, "attach token expired".to_owned()));
    let now = htfaas_functions::token::now_s();
    assert!(now >= claims.exp, "closed at {now}, before exp {}", claims.exp);
    assert!(now <= claims.exp + 2, "closed at {now}, long after exp {}", claims.exp);
    server.wait_for_state(&job, JobState::Idle).await;
    server.stop().await;
}

/// Measures submit latency (commit with synchronous=FULL included). Run with `--ignored --nocapture`.
#[tokio::test]
#[ignore = "measurement, not a check"]
async fn submit_latency() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let n = 300;
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let t = fx.token("alice");
        let req = fx.request(&format!("e{i}"));
        let start = Instant::now();
        server.submit(&t, &req).await;
        times.push(start.elapsed());
    }
    times.sort();
    println!(
        "submit latency over {n}: p50 {:?}, p90 {:?}, p99 {:?}",
        times[n / 2],
        times[n * 9 / 10],
        times[n * 99 / 100]
    );
    server.stop().await;
}

/// A request for one core, so that a 1-cpu EP has room for exactly one such job.
fn one_cpu(fx: &Fixture, key: &str) -> SubmitRequest {
    let mut r = fx.request(key);
    r.resources.cpus = 1;
    r
}

fn cancel_msg(id: &str, reason: &str) -> Value {
    serde_json::json!({"type": "cancel", "job_id": id, "reason": reason})
}

#[tokio::test]
async fn the_idle_limit_refuses_new_jobs_with_429_and_keeps_the_token_unused() {
    let fx = Fixture::new();
    let limits = OwnerLimits { max_idle: Some(2), max_running: None };
    let server = Server::start_with(&fx.path(), limits).await;
    let first = server.submit(&fx.token("alice"), &fx.request("e1")).await.job_id;
    server.submit(&fx.token("alice"), &fx.request("e2")).await;

    // A third one is refused, transiently, and the single-use token is not spent.
    let token = fx.token("alice");
    let (status, v) = server.submit_raw(Some(&token), &fx.request("e3")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(error_of(&v), "owner alice has 2 idle jobs, the limit is 2; try again later");
    assert_eq!(server.preflight(&token).await, (StatusCode::OK, serde_json::json!({"remaining": 1})));
    // A dedupe hit is answered as before; other owners are not limited by alice's queue.
    let (status, v) = server.submit_raw(Some(&fx.token("alice")), &fx.request("e1")).await;
    assert_eq!(
        (status, v["job_id"].as_str(), v["created"].as_bool()),
        (StatusCode::OK, Some(first.as_str()), Some(false))
    );
    server.submit(&fx.token("bob"), &fx.request("b1")).await;

    // Once one of alice's jobs runs, the same token passes.
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-2-cores", 2).await;
    assert_eq!(expect_assign(&mut ep, "alice").await, first);
    server.submit(&token, &fx.request("e3")).await;
    let (status, v) = server.submit_raw(Some(&token), &fx.request("e4")).await;
    assert_eq!((status, error_of(&v)), (StatusCode::UNAUTHORIZED, "token already used (1 of 1 jobs)"));

    ep.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn the_running_limit_holds_back_one_owner_while_others_run() {
    let fx = Fixture::new();
    let limits = OwnerLimits { max_idle: None, max_running: Some(1) };
    let server = Server::start_with(&fx.path(), limits).await;
    let mut alices = Vec::new();
    for i in 0..3 {
        alices.push(server.submit(&fx.token("alice"), &one_cpu(&fx, &format!("a{i}"))).await.job_id);
    }
    let bobs = server.submit(&fx.token("bob"), &one_cpu(&fx, "b1")).await.job_id;

    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-4-cores", 4).await;
    let mut started = vec![expect_assign(&mut ep, "alice").await, expect_assign(&mut ep, "bob").await];
    started.sort();
    let mut expected = vec![alices[0].clone(), bobs.clone()];
    expected.sort();
    assert_eq!(started, expected, "one of alice's (the oldest) and bob's, though four cores are free");
    expect_silence(&mut ep, Duration::from_millis(300)).await;
    for id in &alices[1..] {
        assert_eq!(server.job(id).await.state, JobState::Idle);
    }

    // Alice's ends: her next one starts, and only that one.
    send(&mut ep, &report(&alices[0], Outcome::Exited { exit_code: 0 }, Usage::default())).await;
    assert_eq!(expect_assign(&mut ep, "alice").await, alices[1]);
    expect_silence(&mut ep, Duration::from_millis(300)).await;
    assert_eq!(server.job(&alices[2]).await.state, JobState::Idle);

    ep.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn a_held_idle_job_is_not_dispatched_until_released() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let job = server.submit(&fx.token("alice"), &fx.request("h1")).await.job_id;
    let held = server.act(&job, "hold", "input looks wrong").await;
    assert_eq!(
        (held.state, held.reason.as_str(), held.hold_code),
        (JobState::Held, "input looks wrong", Some(HOLD_CODE_BY_ADMIN))
    );
    let (status, v) = server.act_raw(&job, "hold", "again").await;
    assert_eq!((status, error_of(&v)), (StatusCode::CONFLICT, format!("job {job} is already held").as_str()));

    // A free EP does not get it while it is held.
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-1", 4).await;
    expect_silence(&mut ep, Duration::from_millis(300)).await;
    assert_eq!(server.job(&job).await.state, JobState::Held);

    let released = server.act(&job, "release", "checked").await;
    assert_eq!((released.state, released.reason.as_str(), released.hold_code), (JobState::Idle, "", None));
    assert_eq!(expect_assign(&mut ep, "alice").await, job);
    let (status, v) = server.act_raw(&job, "release", "again").await;
    assert_eq!(
        (status, error_of(&v)),
        (StatusCode::CONFLICT, format!("job {job} is running; only held jobs can be released").as_str())
    );

    ep.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn holding_a_running_job_stops_it_and_frees_its_ep_when_it_reports() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-1-cpu", 1).await;
    let first = server.submit(&fx.token("alice"), &one_cpu(&fx, "r1")).await.job_id;
    assert_eq!(expect_assign(&mut ep, "alice").await, first);

    let held = server.act(&first, "hold", "storage maintenance").await;
    assert_eq!(
        (held.state, held.reason.as_str(), held.hold_code),
        (JobState::Held, "storage maintenance", Some(HOLD_CODE_BY_ADMIN))
    );
    assert_eq!(next_json(&mut ep).await, cancel_msg(&first, "storage maintenance"));

    // Its core stays reserved until the EP reports the stop; then the next job gets it.
    let second = server.submit(&fx.token("bob"), &one_cpu(&fx, "r2")).await.job_id;
    expect_silence(&mut ep, Duration::from_millis(300)).await;
    let usage = Usage { wall_ms: 3000, cpu_ms: 100, ..Usage::default() };
    send(&mut ep, &report(&first, Outcome::Cancelled { reason: "storage maintenance".into() }, usage)).await;
    assert_eq!(expect_assign(&mut ep, "bob").await, second);
    let rec = server.job(&first).await;
    assert_eq!((rec.state, rec.reason.as_str(), rec.hold_code), (JobState::Held, "storage maintenance", Some(1)));
    assert_eq!(rec.usage, Some(usage));
    let (_, v) = server.get("/v1/accounting", Some(ADMIN)).await;
    let accounts: Vec<Account> = serde_json::from_value(v).expect("accounts");
    let alice = accounts.iter().find(|a| a.owner == "alice").expect("alice charged");
    assert_eq!((alice.jobs_completed, alice.jobs_failed), (0, 0));
    assert!((alice.core_seconds - 3.0).abs() < 1e-9, "1 cpu × 3 s: {alice:?}");

    // Released, it runs again once the core is free.
    let released = server.act(&first, "release", "maintenance over").await;
    assert_eq!((released.state, released.ep, released.usage), (JobState::Idle, None, None));
    expect_silence(&mut ep, Duration::from_millis(300)).await;
    send(&mut ep, &report(&second, Outcome::Exited { exit_code: 0 }, Usage::default())).await;
    assert_eq!(expect_assign(&mut ep, "alice").await, first);
    send(&mut ep, &report(&first, Outcome::Exited { exit_code: 0 }, Usage::default())).await;
    server.wait_for_state(&first, JobState::Completed).await;

    ep.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn removing_idle_running_and_held_jobs() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-1-cpu", 1).await;
    let running = server.submit(&fx.token("alice"), &one_cpu(&fx, "m1")).await.job_id;
    assert_eq!(expect_assign(&mut ep, "alice").await, running);
    let idle = server.submit(&fx.token("alice"), &one_cpu(&fx, "m2")).await.job_id;
    let held = server.submit(&fx.token("alice"), &one_cpu(&fx, "m3")).await.job_id;
    server.act(&held, "hold", "later").await;

    let rec = server.act(&idle, "remove", "duplicate upload").await;
    assert_eq!((rec.state, rec.reason.as_str()), (JobState::Removed, "removed by admin: duplicate upload"));
    let rec = server.act(&held, "remove", "not needed").await;
    assert_eq!(
        (rec.state, rec.reason.as_str(), rec.hold_code),
        (JobState::Removed, "removed by admin: not needed", None)
    );
    let rec = server.act(&running, "remove", "runaway").await;
    assert_eq!((rec.state, rec.reason.as_str()), (JobState::Removed, "removed by admin: runaway"));
    assert_eq!(next_json(&mut ep).await, cancel_msg(&running, "removed by admin: runaway"));
    assert!(server.job(&running).await.finished_at_ms.is_some());

    // Nothing is left to do to a removed job.
    for (verb, only) in [
        ("hold", "only idle or running jobs can be held"),
        ("release", "only held jobs can be released"),
        ("remove", "only idle, running or held jobs can be removed"),
    ] {
        let (status, v) = server.act_raw(&running, verb, "again").await;
        assert_eq!(
            (status, error_of(&v)),
            (StatusCode::CONFLICT, format!("job {running} is removed; {only}").as_str())
        );
    }

    // The stop's report is charged and frees the core; the removed job stays removed.
    let next = server.submit(&fx.token("bob"), &one_cpu(&fx, "m4")).await.job_id;
    expect_silence(&mut ep, Duration::from_millis(300)).await;
    let usage = Usage { wall_ms: 1000, ..Usage::default() };
    send(&mut ep, &report(&running, Outcome::Cancelled { reason: "removed by admin: runaway".into() }, usage)).await;
    assert_eq!(expect_assign(&mut ep, "bob").await, next);
    let rec = server.job(&running).await;
    assert_eq!((rec.state, rec.usage), (JobState::Removed, Some(usage)));

    ep.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn job_actions_check_the_admin_the_reason_the_job_and_its_state() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let job = server.submit(&fx.token("alice"), &fx.request("c1")).await.job_id;
    let body = serde_json::json!({"reason": "r"});
    let path = format!("/v1/jobs/{job}/hold");
    for (bearer, what) in [(None, "no token"), (Some("wrong"), "wrong token"), (Some(&*fx.token("alice")), "submit")] {
        let (status, v) = server.post(&path, bearer, Some(&body)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {v}");
    }
    for verb in ["hold", "release", "remove"] {
        let (status, v) = server.act_raw("no-such-job", verb, "r").await;
        assert_eq!((status, error_of(&v)), (StatusCode::NOT_FOUND, "job \"no-such-job\" not found"), "{verb}");
    }
    for bad in [
        serde_json::json!({"reason": ""}),
        serde_json::json!({"reason": "a\nb"}),
        serde_json::json!({"reason": "x".repeat(1025)}),
        serde_json::json!({"reason": "r", "extra": 1}),
        serde_json::json!({}),
    ] {
        let (status, v) = server.post(&path, Some(ADMIN), Some(&bad)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {v}");
    }
    let (status, v) = server.post(&path, Some(ADMIN), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "no body: {v}");
    assert_eq!(server.job(&job).await.state, JobState::Idle, "nothing refused changed the job");
    let (status, v) = server.act_raw(&job, "release", "r").await;
    assert_eq!(
        (status, error_of(&v)),
        (StatusCode::CONFLICT, format!("job {job} is idle; only held jobs can be released").as_str())
    );

    // A completed job can be neither held nor removed.
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    hello(&mut ep, "ep-1", 2).await;
    assert_eq!(expect_assign(&mut ep, "alice").await, job);
    send(&mut ep, &report(&job, Outcome::Exited { exit_code: 0 }, Usage::default())).await;
    server.wait_for_state(&job, JobState::Completed).await;
    let (status, v) = server.act_raw(&job, "hold", "r").await;
    assert_eq!(
        (status, error_of(&v)),
        (StatusCode::CONFLICT, format!("job {job} is completed; only idle or running jobs can be held").as_str())
    );
    let (status, _) = server.act_raw(&job, "remove", "r").await;
    assert_eq!(status, StatusCode::CONFLICT);

    ep.close(None).await.expect("close");
    server.stop().await;
}
