//! The scheduler with TLS on its listener: HTTPS submit and WSS attach with a throwaway CA made
//! here (rcgen, a certificate for the IP 127.0.0.1), and what happens to clients that do not
//! speak TLS, do not trust the certificate, or never finish a handshake.

use futures_util::{SinkExt as _, StreamExt as _};
use htfaas_functions::macaroon::{RootKey, inspect, mint};
use htfaas_functions::proto::{
    EpMsg, EventRef, FunctionRef, Hello, InputSpec, JobRecord, JobReport, JobState, Outcome, OutputSpec, SchedulerMsg,
    SubmitRequest, SubmitResponse, Usage,
};
use htfaas_functions::serve::tls::HANDSHAKE_TIMEOUT;
use htfaas_functions::token::{SUBMIT_AUDIENCE, SigningKey, SubmitClaims, new_jti, now_s, write_jwks};
use htfaas_functions::{Digest, Resources};
use htfaas_scheduler::{Config, TrustedIssuer, mint_attach_token};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;

const ADMIN: &str = "admin-token-0123456789";
const GW: &str = "test-gateway";
const NAME: &str = "tls-scheduler";
const WAIT: Duration = Duration::from_secs(10);

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A throwaway CA and a certificate it signed for 127.0.0.1, written to `dir`.
struct Pki {
    ca_pem: String,
    cert_file: PathBuf,
    key_file: PathBuf,
}

impl Pki {
    fn new(dir: &Path) -> Pki {
        Pki::named(dir, "htfaas test CA")
    }

    fn named(dir: &Path, ca_name: &str) -> Pki {
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name.push(rcgen::DnType::CommonName, ca_name);
        let ca_cert = ca.self_signed(&ca_key).expect("CA cert");
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().expect("server key");
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .expect("server params")
            .signed_by(&key, &issuer)
            .expect("server cert");
        let (cert_file, key_file) = (dir.join("tls-cert.pem"), dir.join("tls-key.pem"));
        std::fs::write(&cert_file, cert.pem()).expect("write cert");
        std::fs::write(&key_file, key.serialize_pem()).expect("write key");
        Pki { ca_pem: ca_cert.pem(), cert_file, key_file }
    }

    /// A rustls client that trusts only this CA.
    fn client_config(&self) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(self.ca_pem.as_bytes()).expect("CA PEM")).expect("CA");
        Arc::new(rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth())
    }
}

/// A running scheduler, with TLS or without.
struct Server {
    url: String,
    shutdown: CancellationToken,
    join: tokio::task::JoinHandle<anyhow::Result<()>>,
    http: reqwest::Client,
    gw: SigningKey,
    attach_token: String,
}

impl Server {
    async fn start(dir: &Path, pki: Option<&Pki>) -> Server {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (gw, _) = SigningKey::generate("gw-1").expect("keygen");
        write_jwks(&dir.join("gw.jwks"), &gw.jwks()).expect("jwks");
        let config = Config {
            listen: "127.0.0.1:0".parse().expect("addr"),
            db_path: dir.join("queue.sqlite"),
            name: NAME.into(),
            attach_key_file: dir.join("attach.pem"),
            submit_issuers: vec![TrustedIssuer { issuer: GW.into(), jwks_file: dir.join("gw.jwks") }],
            admin_token: ADMIN.into(),
            tls_cert_file: pki.map(|p| p.cert_file.clone()),
            tls_key_file: pki.map(|p| p.key_file.clone()),
            max_idle_jobs_per_owner: None,
            max_running_jobs_per_owner: None,
            storage_origins: vec!["https://storage.invalid".into()],
            module_stores: vec!["https://registry.invalid".into()],
            ..htfaas_scheduler::Config::new(String::new(), Vec::new())
        };
        let settings = config.resolve().await.expect("resolve");
        assert_eq!(settings.tls(), pki.is_some());
        let url = settings.url();
        let attach_token = mint_attach_token(settings.attach_key(), NAME, "site", None, None, 300).expect("mint");
        let shutdown = CancellationToken::new();
        let join = tokio::spawn(htfaas_scheduler::run(settings, shutdown.clone()));
        let mut http = reqwest::Client::builder().timeout(WAIT);
        if let Some(pki) = pki {
            http = http.tls_certs_only([reqwest::Certificate::from_pem(pki.ca_pem.as_bytes()).expect("CA")]);
        }
        Server { url, shutdown, join, http: http.build().expect("client"), gw, attach_token }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(20), self.join)
            .await
            .expect("scheduler stops in time")
            .expect("task joins")
            .expect("run returns Ok");
    }

    fn attach_url(&self) -> String {
        self.url.replacen("https://", "wss://", 1).replacen("http://", "ws://", 1) + "/v1/ep/attach"
    }

    /// Dials `/v1/ep/attach` with the attach token, TLS through `tls` (if any).
    async fn attach(&self, url: &str, tls: Option<Arc<rustls::ClientConfig>>) -> Result<Ws, tungstenite::Error> {
        let mut req = url.into_client_request()?;
        req.headers_mut().insert("authorization", format!("Bearer {}", self.attach_token).parse().expect("header"));
        let connecting = tokio_tungstenite::connect_async_tls_with_config(req, None, false, tls.map(Connector::Rustls));
        tokio::time::timeout(WAIT, connecting).await.expect("attach answered").map(|(ws, _)| ws)
    }

    /// Submits a job under dedupe key `key`, asking for its macaroons to be bound to its EP.
    async fn submit(&self, key: &str) -> String {
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
                digest: Digest::of(b"module"),
                module_url: format!("https://registry.invalid/v1/modules/{}", Digest::of(b"module")),
                native: None,
            },
            resources: Resources::new(1, 256, 60),
            input: Some(InputSpec::new("https://storage.invalid/in/a.dat", "a.dat", mac("activity:DOWNLOAD"))),
            output: OutputSpec {
                url: "https://storage.invalid/out/".into(),
                macaroon: mac("activity:UPLOAD"),
                on_failure: Default::default(),
            },
            args: vec![],
            env: vec![],
            event: EventRef::new("test", key, "/in/a.dat"),
            dedupe_key: key.into(),
            annex: None,
            bind_ep_address: true,
            class: None,
            limits: Default::default(),
            secrets: Default::default(),
            renewal: None,
            max_concurrent: None,
            refs: Vec::new(),
            checkpoint: None,
        };
        let resp = self.http.post(format!("{}/v1/jobs", self.url)).bearer_auth(token).json(&req).send().await;
        let resp = resp.expect("submit answered");
        assert_eq!(resp.status(), reqwest::StatusCode::CREATED);
        resp.json::<SubmitResponse>().await.expect("SubmitResponse").job_id
    }

    async fn job(&self, id: &str) -> JobRecord {
        let resp = self.http.get(format!("{}/v1/jobs/{id}", self.url)).bearer_auth(ADMIN).send().await;
        resp.expect("answered").json().await.expect("JobRecord")
    }
}

async fn next_msg(ws: &mut Ws) -> SchedulerMsg {
    loop {
        let frame = tokio::time::timeout(WAIT, ws.next()).await.expect("message in time");
        match frame.expect("stream open").expect("frame") {
            Message::Text(t) => return serde_json::from_str(t.as_str()).expect("SchedulerMsg"),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("unexpected frame {other:?}"),
        }
    }
}

async fn send(ws: &mut Ws, msg: &EpMsg) {
    ws.send(Message::text(serde_json::to_string(msg).expect("encode"))).await.expect("send");
}

/// Says hello and waits for Welcome.
async fn hello(ws: &mut Ws, name: &str) {
    let slots = Resources::new(2, 4096, 3600);
    send(
        ws,
        &EpMsg::Hello(Hello {
            name: name.into(),
            slots,
            protocol: 1,
            annex: None,
            labels: Default::default(),
            prefetch: None,
            runtimes: vec![htfaas_functions::manifest::RuntimeKind::Wasm],
            images: Vec::new(),
            renews_attach: false,
        }),
    )
    .await;
    assert!(matches!(next_msg(ws).await, SchedulerMsg::Welcome { .. }));
}

#[tokio::test]
async fn https_submit_and_wss_attach_run_a_job() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path());
    let server = Server::start(dir.path(), Some(&pki)).await;
    assert!(server.url.starts_with("https://127.0.0.1:"), "{}", server.url);

    let job = server.submit("e1").await;
    let mut ep = server.attach(&server.attach_url(), Some(pki.client_config())).await.expect("wss attach");
    hello(&mut ep, "ep-tls").await;
    match next_msg(&mut ep).await {
        SchedulerMsg::Assign(a) => {
            assert_eq!(a.job_id, job);
            // The TLS listener hands the attach route the EP's address too.
            for m in [&a.input.as_ref().expect("an input").macaroon, &a.output.macaroon] {
                let caveats = inspect(m).expect("parses");
                assert_eq!(caveats.last().map(String::as_str), Some("ip:127.0.0.1"), "{caveats:?}");
            }
        }
        other => panic!("want assign, got {other:?}"),
    }
    let report = JobReport {
        input_sha256: None,
        job_id: job.clone(),
        outcome: Outcome::Exited { exit_code: 0 },
        usage: Usage::default(),
        outputs: vec![],
        log: String::new(),
        refs: Vec::new(),
        checkpoint: None,
    };
    send(&mut ep, &EpMsg::Finished(report)).await;
    let start = Instant::now();
    while server.job(&job).await.state != JobState::Completed {
        assert!(start.elapsed() < WAIT, "job not completed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ep.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn clients_without_tls_or_without_the_ca_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path());
    let server = Server::start(dir.path(), Some(&pki)).await;
    let plain_url = server.url.replacen("https://", "http://", 1);

    // Plain WebSocket and plain HTTP: the listener reads their first bytes as a broken TLS
    // record and drops the connection, so neither gets any HTTP answer.
    let ws = server.attach(&format!("{}/v1/ep/attach", plain_url.replacen("http://", "ws://", 1)), None).await;
    match ws {
        Err(tungstenite::Error::Http(resp)) => panic!("plain ws got an HTTP answer: {}", resp.status()),
        Err(e) => eprintln!("plain ws: {e}"),
        Ok(_) => panic!("plain ws attached to the TLS listener"),
    }
    let plain = reqwest::Client::builder().timeout(WAIT).build().expect("client");
    let e = plain.get(format!("{plain_url}/v1/jobs")).bearer_auth(ADMIN).send().await.expect_err("plain HTTP");
    eprintln!("plain http: {e:#}");

    // TLS with a CA that did not sign the certificate: the client refuses the server.
    let other = tempfile::tempdir().expect("tempdir");
    let stranger = Pki::named(other.path(), "some other CA");
    match server.attach(&server.attach_url(), Some(stranger.client_config())).await {
        Err(tungstenite::Error::Io(e)) => {
            let inner = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
            assert!(
                matches!(inner, Some(rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer))),
                "{e}"
            );
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("attached without trusting the certificate"),
    }

    // None of it hurt the listener.
    let mut ep = server.attach(&server.attach_url(), Some(pki.client_config())).await.expect("wss attach");
    hello(&mut ep, "ep-after").await;
    ep.close(None).await.expect("close");
    server.stop().await;
}

#[tokio::test]
async fn a_client_that_never_handshakes_does_not_hold_up_an_attach() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path());
    let server = Server::start(dir.path(), Some(&pki)).await;
    let addr = server.url.trim_start_matches("https://").to_owned();

    // Two silent TCP clients, and one that sends the start of a ClientHello and stops.
    let _silent1 = TcpStream::connect(&addr).await.expect("connect");
    let _silent2 = TcpStream::connect(&addr).await.expect("connect");
    let mut partial = TcpStream::connect(&addr).await.expect("connect");
    partial.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).await.expect("write");

    let started = Instant::now();
    let mut ep = server.attach(&server.attach_url(), Some(pki.client_config())).await.expect("wss attach");
    hello(&mut ep, "ep-1").await;
    let took = started.elapsed();
    assert!(took < HANDSHAKE_TIMEOUT / 2, "attach took {took:?} behind stalled handshakes");
    eprintln!("attach + welcome behind 3 stalled handshakes: {took:?}");
    ep.close(None).await.expect("close");
    drop(partial);
    server.stop().await;
}

/// Time to dial, handshake and upgrade `/v1/ep/attach`, TLS against plain; printed, not asserted.
#[tokio::test]
async fn attach_handshake_cost_tls_against_plain() {
    const N: usize = 20;
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path());
    let plain_dir = tempfile::tempdir().expect("tempdir");
    let tls = Server::start(dir.path(), Some(&pki)).await;
    let plain = Server::start(plain_dir.path(), None).await;
    assert!(plain.url.starts_with("http://"));
    let client = pki.client_config();
    for (what, server, config) in [("ws", &plain, None), ("wss", &tls, Some(client))] {
        let mut times = Vec::with_capacity(N);
        for _ in 0..N {
            let started = Instant::now();
            let mut ws = server.attach(&server.attach_url(), config.clone()).await.expect("attach");
            times.push(started.elapsed());
            ws.close(None).await.expect("close");
        }
        times.sort();
        eprintln!("{what} attach (TCP + TLS + upgrade), {N} dials: median {:?}, max {:?}", times[N / 2], times[N - 1]);
    }
    tls.stop().await;
    plain.stop().await;
}

#[test]
fn tls_config_keys_are_read_and_default_to_none() {
    let c: Config = serde_json::from_str(
        r#"{"submit_issuers": [], "admin_token": "0123456789abcdef",
            "tls_cert_file": "/etc/htfaas/cert.pem", "tls_key_file": "/etc/htfaas/key.pem"}"#,
    )
    .expect("parses");
    assert_eq!(c.tls_cert_file.as_deref(), Some(Path::new("/etc/htfaas/cert.pem")));
    assert_eq!(c.tls_key_file.as_deref(), Some(Path::new("/etc/htfaas/key.pem")));
}
