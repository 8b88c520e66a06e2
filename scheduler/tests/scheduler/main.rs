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

/// Admin job actions: hold, release, remove.
mod actions;
/// Attach tokens renewed over a session, and the refusals.
mod attach_renewal;
/// Attacks: URLs a submitter chose, and a malicious EP's reports, refused.
mod attacks;
/// The audit trail: what each decision records, queries, verification.
mod audit;
/// Attached EPs running jobs: restrictions, annexes, slots, macaroons, expiry.
mod eps;
/// Faults without a crash: the storage away, an EP gone mid-job, a full disk.
mod faults;
/// Fair share, quotas, classes, requirements, leases, retries, drains: the site policy.
mod policy;
/// The prefetch window and its hand-backs.
mod prefetch;
/// Revocations of submit tokens, owners and attach tokens.
mod revocations;
/// Submission: tokens, limits and requests; the idle limit.
mod submit;
/// HTTPS and WSS on the scheduler's listener (a server of its own, with a test PKI).
mod tls;

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
            retry: None,
            function: FunctionRef {
                name: "checksum".into(),
                version: 3,
                digest: self.digest.clone(),
                module_url: format!("{MODULES}/v1/modules/{}", self.digest),
                native: None,
            },
            resources: Resources::new(2, 256, 60),
            input: Some(InputSpec::new(
                "http://storage.invalid/data/raw/a.dat",
                "a.dat",
                storage_macaroon(&["activity:DOWNLOAD", "path:/data/raw/a.dat"]),
            )),
            output: OutputSpec {
                url: "http://storage.invalid/data/out/".into(),
                macaroon: storage_macaroon(&["activity:UPLOAD,DELETE", "path:/data/out"]),
                on_failure: Default::default(),
            },
            args: vec!["--fast".into()],
            env: vec![("MODE".into(), "x".into())],
            event: EventRef::new("dcache", format!("{key}/s1"), "/data/raw/a.dat"),
            dedupe_key: key.into(),
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
        prefetch: None,
        runtimes: vec![htfaas_functions::manifest::RuntimeKind::Wasm],
        images: Vec::new(),
        renews_attach: false,
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
    // Macaroons are base64 of random signatures: "bob" may occur in one by chance.
    let mut bare = v.clone();
    for part in ["input", "output"] {
        bare[part]["macaroon"] = Value::Null;
    }
    let bare = bare.to_string();
    assert!(!bare.contains(owner), "assignment leaks the owner {owner:?}: {text}");
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
        // What the EP read, recorded with the run.
        input_sha256: Some("cd".repeat(32)),
        job_id: job_id.into(),
        outcome,
        usage,
        outputs: vec![OutputFile { path: "/data/out/a.sum".into(), size: 64, sha256: "ab".repeat(32) }],
        log: "done\n".into(),
        refs: Vec::new(),
        checkpoint: None,
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

fn one_cpu(fx: &Fixture, key: &str) -> SubmitRequest {
    let mut r = fx.request(key);
    r.resources.cpus = 1;
    r
}

/// The Cancel a hold sends (the job may run again: its checkpoint is kept).
fn cancel_msg(id: &str, reason: &str) -> Value {
    serde_json::json!({"type": "cancel", "job_id": id, "reason": reason})
}

/// The Cancel a removal sends (the job ends: its checkpoint goes).
fn ending_cancel_msg(id: &str, reason: &str) -> Value {
    serde_json::json!({"type": "cancel", "job_id": id, "reason": reason, "ends": true})
}
