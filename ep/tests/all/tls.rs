//! The EP over TLS, against the real scheduler serving HTTPS/WSS and a storage serving HTTPS,
//! both with a certificate for 127.0.0.1 from a throwaway CA made here (rcgen): with
//! `tls_ca_file` the EP attaches over `wss://`, runs a job and moves its data over `https://`;
//! without it, the EP keeps re-dialling and says the certificate is not trusted; a bad
//! `tls_ca_file` fails `resolve`.

use crate::common::guest_bytes;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, put};
use htfaas_ep::Config;
use htfaas_functions::macaroon::{RootKey, mint};
use htfaas_functions::proto::{
    EventRef, FunctionRef, InputSpec, JobRecord, JobState, OutputSpec, SubmitRequest, SubmitResponse,
};
use htfaas_functions::serve::tls::{TlsListener, server_config};
use htfaas_functions::token::{SUBMIT_AUDIENCE, SigningKey, SubmitClaims, new_jti, now_s, write_jwks};
use htfaas_functions::{Digest, Resources};
use htfaas_scheduler::{TrustedIssuer, mint_attach_token};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const ADMIN: &str = "admin-token-0123456789";
const GW: &str = "test-gateway";
const NAME: &str = "tls-scheduler";
const WAIT: Duration = Duration::from_secs(30);

/// A throwaway CA and a certificate it signed for 127.0.0.1, written to `dir`.
struct Pki {
    ca_file: PathBuf,
    ca_pem: String,
    cert_file: PathBuf,
    key_file: PathBuf,
}

impl Pki {
    fn new(dir: &Path) -> Pki {
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name.push(rcgen::DnType::CommonName, "htfaas EP test CA");
        let ca_cert = ca.self_signed(&ca_key).expect("CA cert");
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().expect("server key");
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .expect("server params")
            .signed_by(&key, &issuer)
            .expect("server cert");
        let pki = Pki {
            ca_file: dir.join("ca.pem"),
            ca_pem: ca_cert.pem(),
            cert_file: dir.join("tls-cert.pem"),
            key_file: dir.join("tls-key.pem"),
        };
        std::fs::write(&pki.ca_file, &pki.ca_pem).expect("write CA");
        std::fs::write(&pki.cert_file, cert.pem()).expect("write cert");
        std::fs::write(&pki.key_file, key.serialize_pem()).expect("write key");
        pki
    }

    /// An HTTPS client trusting only this CA.
    fn http(&self) -> reqwest::Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca = reqwest::Certificate::from_pem(self.ca_pem.as_bytes()).expect("CA");
        reqwest::Client::builder().timeout(WAIT).tls_certs_only([ca]).build().expect("client")
    }
}

/// Outputs PUT to the storage, by name: (Authorization, body).
type Puts = Arc<Mutex<HashMap<String, (String, Bytes)>>>;

/// A storage on HTTPS that is also the module store: `GET /v1/modules/{digest}` (the checksum
/// module), `GET /in/wiki.txt` (`Wikipedia`), `PUT /out/{name}`.
async fn https_storage(pki: &Pki, module: Vec<u8>, stop: CancellationToken) -> (String, Puts) {
    async fn output(State(puts): State<Puts>, UrlPath(name): UrlPath<String>, h: HeaderMap, body: Bytes) -> StatusCode {
        let auth = h.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        puts.lock().expect("lock").insert(name, (auth, body));
        StatusCode::CREATED
    }
    let puts = Puts::default();
    let app = Router::new()
        .route("/v1/modules/{digest}", get(move || async move { module }))
        .route("/in/wiki.txt", get(|| async { "Wikipedia" }))
        .route("/out/{name}", put(output))
        .with_state(puts.clone());
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("https://{}", tcp.local_addr().expect("addr"));
    let listener = TlsListener::new(tcp, server_config(&pki.cert_file, &pki.key_file).expect("TLS config"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await;
    });
    (base, puts)
}

/// The real scheduler, serving HTTPS/WSS.
struct Scheduler {
    url: String,
    http: reqwest::Client,
    gw: SigningKey,
    attach_token: String,
    shutdown: CancellationToken,
    join: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Scheduler {
    /// Trusting jobs' URLs only on `storage` (which is also the module store).
    async fn start(dir: &Path, pki: &Pki, storage: &str) -> Scheduler {
        let (gw, _) = SigningKey::generate("gw-1").expect("keygen");
        write_jwks(&dir.join("gw.jwks"), &gw.jwks()).expect("jwks");
        let settings = htfaas_scheduler::Config {
            listen: "127.0.0.1:0".parse().expect("addr"),
            db_path: dir.join("queue.sqlite"),
            name: NAME.into(),
            attach_key_file: dir.join("attach.pem"),
            submit_issuers: vec![TrustedIssuer { issuer: GW.into(), jwks_file: dir.join("gw.jwks") }],
            admin_token: ADMIN.into(),
            tls_cert_file: Some(pki.cert_file.clone()),
            tls_key_file: Some(pki.key_file.clone()),
            max_idle_jobs_per_owner: None,
            max_running_jobs_per_owner: None,
            // Jobs name only this storage, which also serves the modules.
            storage_origins: vec![storage.to_owned()],
            module_stores: vec![storage.to_owned()],
            ..htfaas_scheduler::Config::new(String::new(), Vec::new())
        }
        .resolve()
        .await
        .expect("scheduler resolves");
        let url = settings.url();
        assert!(url.starts_with("https://"), "{url}");
        let attach_token = mint_attach_token(settings.attach_key(), NAME, "site", None, None, 300).expect("mint");
        let shutdown = CancellationToken::new();
        let join = tokio::spawn(htfaas_scheduler::run(settings, shutdown.clone()));
        Scheduler { url, http: pki.http(), gw, attach_token, shutdown, join }
    }

    /// Submits a checksum job over `{storage}/in/wiki.txt`; returns its id.
    async fn submit(&self, storage: &str, digest: Digest) -> String {
        let claims = SubmitClaims {
            iss: GW.into(),
            sub: "alice".into(),
            aud: SUBMIT_AUDIENCE.into(),
            exp: now_s() + 300,
            iat: now_s(),
            jti: new_jti(),
            jobs: 1,
            cpus: 1,
            memory_mb: 512,
            runtime_s: 600,
            function: None,
            group: None,
        };
        let token = self.gw.sign(&claims).expect("sign");
        let mac = |c: &str| mint(&RootKey::derive(b"storage-secret"), "storage", "id", &[c.to_owned()]).expect("mint");
        let req = SubmitRequest {
            retry: None,
            function: FunctionRef {
                name: "checksum".into(),
                version: 1,
                module_url: format!("{storage}/v1/modules/{digest}"),
                digest,
                native: None,
            },
            resources: Resources::new(1, 256, 60),
            input: Some(InputSpec::new(format!("{storage}/in/wiki.txt"), "wiki.txt", mac("activity:DOWNLOAD"))),
            output: OutputSpec {
                url: format!("{storage}/out/"),
                macaroon: mac("activity:UPLOAD"),
                on_failure: Default::default(),
            },
            args: vec![],
            env: vec![],
            event: EventRef::new("test", "e1", "/in/wiki.txt"),
            dedupe_key: "e1".into(),
            annex: None,
            bind_ep_address: false,
            class: None,
            limits: Default::default(),
            secrets: Default::default(),
            renewal: None,
            max_concurrent: None,
            refs: Vec::new(),
            checkpoint: None,
        };
        let resp = self.http.post(format!("{}/v1/jobs", self.url)).bearer_auth(token).json(&req).send().await;
        let resp = resp.expect("submit over https");
        assert_eq!(resp.status(), reqwest::StatusCode::CREATED);
        resp.json::<SubmitResponse>().await.expect("SubmitResponse").job_id
    }

    async fn job(&self, id: &str) -> JobRecord {
        let resp = self.http.get(format!("{}/v1/jobs/{id}", self.url)).bearer_auth(ADMIN).send().await;
        resp.expect("answered").json().await.expect("JobRecord")
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let done = tokio::time::timeout(WAIT, self.join).await.expect("scheduler stops in time");
        done.expect("scheduler task").expect("scheduler run ok");
    }
}

fn ep_config(scheduler: &Scheduler, work: &Path, tls_ca_file: Option<PathBuf>) -> Config {
    Config {
        max_output_files: 8,
        max_output_bytes: 1 << 20,
        tls_ca_file,
        ..Config::for_test("ep-tls", scheduler.url.clone(), scheduler.attach_token.clone(), work)
    }
}

#[tokio::test]
async fn an_ep_with_the_ca_runs_a_job_over_wss_and_https() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path());
    let module = guest_bytes("checksum");
    let digest = Digest::of(&module);
    let stop_storage = CancellationToken::new();
    let (storage, puts) = https_storage(&pki, module, stop_storage.clone()).await;
    let scheduler = Scheduler::start(dir.path(), &pki, &storage).await;
    let job = scheduler.submit(&storage, digest).await;

    let work = tempfile::tempdir().expect("tempdir");
    let settings = ep_config(&scheduler, work.path(), Some(pki.ca_file.clone())).resolve().await.expect("EP resolves");
    assert!(settings.attach_url.starts_with("wss://127.0.0.1:"), "{}", settings.attach_url);
    let shutdown = CancellationToken::new();
    let ep = tokio::spawn(htfaas_ep::run(settings, shutdown.clone()));

    let started = Instant::now();
    let done = loop {
        let record = scheduler.job(&job).await;
        if matches!(record.state, JobState::Completed | JobState::Failed) {
            break record;
        }
        assert!(started.elapsed() < WAIT, "job still {:?}", record.state);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(done.state, JobState::Completed, "{}", done.reason);
    assert_eq!(done.ep.as_deref(), Some("ep-tls"));
    assert_eq!(done.outputs.len(), 1, "{:?}", done.outputs);
    {
        let puts = puts.lock().expect("lock");
        let (auth, body) = puts.get("wiki.txt.checksums.json").expect("output PUT over https");
        assert!(auth.starts_with("Bearer "), "{auth}");
        let v: serde_json::Value = serde_json::from_slice(body).expect("json");
        assert_eq!(v["adler32"], "11e60398");
    }

    shutdown.cancel();
    let ended = tokio::time::timeout(WAIT, ep).await.expect("EP stops in time");
    ended.expect("EP task").expect("EP run ok");
    scheduler.stop().await;
    stop_storage.cancel();
}

/// Log lines written by the EP, captured for one test.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn count(&self, needle: &str) -> usize {
        String::from_utf8_lossy(&self.0.lock().expect("lock")).matches(needle).count()
    }
}

/// An EP that does not trust the scheduler's certificate is not attached, keeps re-dialling
/// with backoff (an untrusted certificate is not the scheduler's word, so never final), says
/// why, and stops cleanly on shutdown.
#[tokio::test]
async fn an_ep_without_the_ca_keeps_retrying_and_says_the_certificate_is_not_trusted() {
    // The EP's tasks run on this test's one thread, so a thread-local subscriber sees them.
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path());
    let scheduler = Scheduler::start(dir.path(), &pki, "https://storage.invalid").await;
    let job = scheduler.submit("https://storage.invalid", Digest::of(b"module")).await;

    let work = tempfile::tempdir().expect("tempdir");
    let settings = ep_config(&scheduler, work.path(), None).resolve().await.expect("EP resolves");
    let shutdown = CancellationToken::new();
    let ep = tokio::spawn(htfaas_ep::run(settings, shutdown.clone()));

    let needle = "the scheduler's TLS certificate is not trusted";
    let started = Instant::now();
    while logs.count(needle) < 3 {
        assert!(!ep.is_finished(), "the EP ended: {}", String::from_utf8_lossy(&logs.0.lock().expect("lock")));
        assert!(started.elapsed() < WAIT, "fewer than 3 refused dials logged");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(logs.count("UnknownIssuer") >= 3);
    assert_eq!(scheduler.job(&job).await.state, JobState::Idle, "no EP attached, so the job waits");
    assert!(!ep.is_finished(), "still re-dialling");

    shutdown.cancel();
    let ended = tokio::time::timeout(WAIT, ep).await.expect("EP stops in time");
    ended.expect("EP task, no panic").expect("EP run ok");
    scheduler.stop().await;
}

#[tokio::test]
async fn a_bad_tls_ca_file_fails_resolve_clearly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path());
    let config = |ca: Option<PathBuf>| Config {
        log_limit_bytes: 1024,
        max_output_files: 1,
        max_output_bytes: 1,
        tls_ca_file: ca,
        ..Config::for_test("ep", "https://127.0.0.1:1", "t", dir.path().join("work"))
    };
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).expect("write");
        p
    };
    let key = std::fs::read_to_string(&pki.key_file).expect("key");
    let cases = [
        (dir.path().join("missing.pem"), "tls_ca_file: read "),
        (write("empty.pem", ""), "holds no PEM certificate"),
        (write("key-only.pem", &key), "holds no PEM certificate"),
        (write("base64.pem", "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n"), "parse "),
        (
            write("not-der.pem", "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n"),
            "certificate 1 is not a usable CA certificate",
        ),
    ];
    for (path, want) in cases {
        let e = config(Some(path.clone())).resolve().await.expect_err("bad CA file refused");
        let text = format!("{e:#}");
        assert!(text.starts_with("tls_ca_file: ") && text.contains(want), "{}: {text}", path.display());
        assert!(text.contains(&path.display().to_string()), "names the file: {text}");
    }
    // A good one resolves, for wss:// and for ws:// (where it serves HTTPS transfers only).
    let ok = config(Some(pki.ca_file.clone())).resolve().await.expect("good CA");
    assert!(ok.attach_url.starts_with("wss://"));
    let mut plain = config(Some(pki.ca_file.clone()));
    plain.scheduler_url = "http://127.0.0.1:1".into();
    assert!(plain.resolve().await.expect("good CA").attach_url.starts_with("ws://"));
}
