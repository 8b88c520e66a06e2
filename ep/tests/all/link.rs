//! The EP through its public API against a fake scheduler (WebSocket) and fake storage (HTTP),
//! both an in-test axum server on 127.0.0.1:0.

use crate::common::{digest, guest_bytes};
use axum::Router;
use axum::body::Bytes;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, put};
use htfaas_ep::Config;
use htfaas_functions::proto::{
    EpMsg, FunctionRef, InputSpec, JobAssignment, JobReport, Outcome, OutputSpec, SchedulerMsg,
};
use htfaas_functions::{Digest, Resources};
use sha2::Digest as _;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const ATTACH: &str = "attach-token-xyz";
const READ_MAC: &str = "read-macaroon-abc";
const WRITE_MAC: &str = "write-macaroon-def";
const WAIT: Duration = Duration::from_secs(30);

/// What the server tells the test about one WebSocket connection.
struct Conn {
    to_ep: mpsc::UnboundedSender<Option<String>>, // Some(text) = send, None = drop the socket
    from_ep: mpsc::UnboundedReceiver<EpMsg>,
}

impl Conn {
    fn send(&self, msg: &SchedulerMsg) {
        self.to_ep.send(Some(serde_json::to_string(msg).expect("json"))).expect("conn alive");
    }
    fn send_raw(&self, text: &str) {
        self.to_ep.send(Some(text.to_owned())).expect("conn alive");
    }
    fn drop_socket(&self) {
        let _ = self.to_ep.send(None);
    }
    async fn recv(&mut self) -> EpMsg {
        tokio::time::timeout(WAIT, self.from_ep.recv()).await.expect("EP message in time").expect("conn open")
    }
    async fn hello_welcome(&mut self) {
        match self.recv().await {
            EpMsg::Hello(h) => {
                assert_eq!(h.name, "ep-test");
                assert_eq!(h.protocol, 1);
                assert_eq!(h.slots.cpus, 2);
            }
            other => panic!("want hello, got {other:?}"),
        }
        self.send(&SchedulerMsg::Welcome { ep_id: "ep-1".into() });
    }
    async fn finished(&mut self) -> JobReport {
        match self.recv().await {
            EpMsg::Finished(r) => r,
            other => panic!("want finished, got {other:?}"),
        }
    }
}

#[derive(Default)]
struct Seen {
    input_auth: Vec<String>,
    puts: HashMap<String, (String, Option<String>, Bytes)>, // name -> (auth, content-length, body)
    module_gets: usize,
}

#[derive(Clone)]
struct Fake {
    conns: mpsc::UnboundedSender<Conn>,
    seen: Arc<Mutex<Seen>>,
    modules: Arc<HashMap<String, Vec<u8>>>,
}

fn auth(h: &HeaderMap) -> String {
    h.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
}

async fn attach(State(f): State<Fake>, headers: HeaderMap, ws: WebSocketUpgrade) -> Response {
    if auth(&headers) != format!("Bearer {ATTACH}") {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    ws.on_upgrade(move |socket| serve_ws(socket, f)).into_response()
}

async fn serve_ws(mut socket: WebSocket, f: Fake) {
    let (to_ep, mut cmds) = mpsc::unbounded_channel();
    let (from_tx, from_ep) = mpsc::unbounded_channel();
    if f.conns.send(Conn { to_ep, from_ep }).is_err() {
        return;
    }
    loop {
        tokio::select! {
            cmd = cmds.recv() => match cmd {
                Some(Some(text)) => if socket.send(Message::Text(text.into())).await.is_err() { return },
                _ => return, // drop the socket without a close frame
            },
            msg = socket.recv() => match msg {
                Some(Ok(Message::Text(t))) => {
                    let m: EpMsg = serde_json::from_str(t.as_str()).expect("EP sends valid EpMsg");
                    let _ = from_tx.send(m);
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            },
        }
    }
}

async fn module(State(f): State<Fake>, Path(name): Path<String>) -> Response {
    f.seen.lock().expect("lock").module_gets += 1;
    match f.modules.get(&name) {
        Some(b) => b.clone().into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn input(State(f): State<Fake>, Path(name): Path<String>, headers: HeaderMap) -> Response {
    let a = auth(&headers);
    f.seen.lock().expect("lock").input_auth.push(a.clone());
    if a != format!("Bearer {READ_MAC}") {
        return (StatusCode::FORBIDDEN, "macaroon refused").into_response();
    }
    match name.as_str() {
        "wiki.txt" => b"Wikipedia".to_vec().into_response(),
        _ => (StatusCode::NOT_FOUND, "no such file").into_response(),
    }
}

async fn output(State(f): State<Fake>, Path(name): Path<String>, headers: HeaderMap, body: Bytes) -> Response {
    let len = headers.get("content-length").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let a = auth(&headers);
    let ok = a == format!("Bearer {WRITE_MAC}");
    f.seen.lock().expect("lock").puts.insert(name, (a, len, body));
    if ok { StatusCode::CREATED.into_response() } else { StatusCode::FORBIDDEN.into_response() }
}

struct Harness {
    base: String,
    conns: mpsc::UnboundedReceiver<Conn>,
    seen: Arc<Mutex<Seen>>,
    shutdown: CancellationToken,
    ep: tokio::task::JoinHandle<anyhow::Result<()>>,
    _work: tempfile::TempDir,
    checksum: Digest,
}

impl Harness {
    async fn start() -> Harness {
        let checksum = guest_bytes("checksum");
        let checksum_digest = digest(&checksum);
        let modules = Arc::new(HashMap::from([("checksum".to_owned(), checksum)]));
        let (conns_tx, conns) = mpsc::unbounded_channel();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let fake = Fake { conns: conns_tx, seen: seen.clone(), modules };
        let app = Router::new()
            .route("/v1/ep/attach", any(attach))
            .route("/modules/{name}", get(module))
            .route("/storage/in/{name}", get(input))
            .route("/storage/out/{name}", put(output))
            .with_state(fake);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });

        let work = tempfile::tempdir().expect("tempdir");
        let config = Config {
            name: "ep-test".into(),
            scheduler_url: base.clone(),
            attach_token: ATTACH.into(),
            slots: Resources { cpus: 2, memory_mb: 512, runtime_s: 60 },
            work_dir: work.path().to_owned(),
            log_limit_bytes: 64 * 1024,
            max_output_files: 64,
            max_output_bytes: 1 << 30,
            lifetime_s: None,
            idle_shutdown_s: None,
        };
        let mut settings = config.resolve().await.expect("resolves");
        settings.drain_timeout = Duration::from_secs(10);
        let shutdown = CancellationToken::new();
        let ep = tokio::spawn(htfaas_ep::run(settings, shutdown.clone()));
        Harness { base, conns, seen, shutdown, ep, _work: work, checksum: checksum_digest }
    }

    async fn conn(&mut self) -> Conn {
        tokio::time::timeout(WAIT, self.conns.recv()).await.expect("EP connects in time").expect("server up")
    }

    fn job(&self, id: &str, input: &str) -> JobAssignment {
        JobAssignment {
            job_id: id.into(),
            function: FunctionRef {
                name: "checksum".into(),
                version: 1,
                digest: self.checksum.clone(),
                module_url: format!("{}/modules/checksum", self.base),
            },
            resources: Resources { cpus: 1, memory_mb: 64, runtime_s: 30 },
            input: InputSpec {
                url: format!("{}/storage/in/{input}", self.base),
                name: input.into(),
                macaroon: READ_MAC.into(),
            },
            output: OutputSpec { url: format!("{}/storage/out/", self.base), macaroon: WRITE_MAC.into() },
            args: vec![],
            env: vec![],
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let done = tokio::time::timeout(WAIT, self.ep).await.expect("EP stops in time");
        done.expect("EP task").expect("EP run ok");
    }
}

#[tokio::test]
async fn assign_runs_checksum_end_to_end() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    c.send_raw("this is not json"); // counted and ignored
    c.send_raw(r#"{"type":"assign","job_id":"half"}"#);
    c.send(&SchedulerMsg::Assign(h.job("job-1", "wiki.txt")));
    let r = c.finished().await;
    assert_eq!(r.job_id, "job-1");
    assert_eq!(r.outcome, Outcome::Exited { exit_code: 0 }, "log: {}", r.log);
    assert_eq!(r.usage.bytes_in, 9);
    assert!(r.log.contains("checksum: wiki.txt: 9 bytes"), "{}", r.log);
    assert_eq!(r.outputs.len(), 1);
    let out = &r.outputs[0];
    assert_eq!(out.path, "/storage/out/wiki.txt.checksums.json");
    {
        let seen = h.seen.lock().expect("lock");
        assert_eq!(seen.input_auth, [format!("Bearer {READ_MAC}")]);
        let (auth, len, body) = seen.puts.get("wiki.txt.checksums.json").expect("PUT seen");
        assert_eq!(auth, &format!("Bearer {WRITE_MAC}"));
        assert_eq!(len.as_deref(), Some(body.len().to_string().as_str()));
        assert_eq!(out.size, body.len() as u64);
        assert_eq!(r.usage.bytes_out, body.len() as u64);
        assert_eq!(out.sha256, hex::encode(sha2::Sha256::digest(body)));
        let v: serde_json::Value = serde_json::from_slice(body).expect("json");
        assert_eq!(v["adler32"], "11e60398");
    }
    eprintln!("job-1 usage: {:?}", r.usage);

    // Second job, same module: served from the in-memory cache (no second GET).
    c.send(&SchedulerMsg::Assign(h.job("job-2", "wiki.txt")));
    let r2 = c.finished().await;
    assert_eq!(r2.outcome, Outcome::Exited { exit_code: 0 });
    assert_eq!(h.seen.lock().expect("lock").module_gets, 1);
    eprintln!("job-2 usage (module cached): {:?}", r2.usage);
    h.stop().await;
}

#[tokio::test]
async fn failures_become_outcomes() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    c.hello_welcome().await;

    // Digest mismatch: the bytes served are checksum.wasm, the job names other bytes.
    let mut bad = h.job("bad-digest", "wiki.txt");
    bad.function.digest = digest(b"something else");
    c.send(&SchedulerMsg::Assign(bad));
    let r = c.finished().await;
    match &r.outcome {
        Outcome::ModuleFailed { reason } => assert!(reason.contains("digest mismatch"), "{reason}"),
        other => panic!("want ModuleFailed, got {other:?}"),
    }

    // Wrong read macaroon: 403 with the body in the reason, never the macaroon.
    let mut j = h.job("bad-mac", "wiki.txt");
    j.input.macaroon = "wrong".into();
    c.send(&SchedulerMsg::Assign(j));
    let r = c.finished().await;
    match &r.outcome {
        Outcome::InputFailed { reason } => {
            assert!(reason.contains("403") && reason.contains("macaroon refused"), "{reason}");
            assert!(!reason.contains("wrong"));
        }
        other => panic!("want InputFailed, got {other:?}"),
    }

    // An input name that is not one path segment.
    let mut j = h.job("bad-name", "wiki.txt");
    j.input.name = "../wiki.txt".into();
    c.send(&SchedulerMsg::Assign(j));
    assert!(matches!(c.finished().await.outcome, Outcome::InputFailed { .. }));

    // Output refused: the write macaroon is wrong.
    let mut j = h.job("bad-out", "wiki.txt");
    j.output.macaroon = "nope".into();
    c.send(&SchedulerMsg::Assign(j));
    let r = c.finished().await;
    match &r.outcome {
        Outcome::OutputFailed { reason } => assert!(reason.contains("403"), "{reason}"),
        other => panic!("want OutputFailed, got {other:?}"),
    }
    h.stop().await;
}

#[tokio::test]
async fn reconnects_and_delivers_reports_of_jobs_that_ended_while_disconnected() {
    let mut h = Harness::start().await;

    // First connection: assign, then drop the socket before the job can report.
    let mut c1 = h.conn().await;
    c1.hello_welcome().await;
    c1.send(&SchedulerMsg::Assign(h.job("job-x", "wiki.txt")));
    c1.drop_socket();

    // The EP dials again; its first words are hello, then the report of job-x.
    let mut c2 = h.conn().await;
    c2.hello_welcome().await;
    let r = c2.finished().await;
    assert_eq!(r.job_id, "job-x");
    assert_eq!(r.outcome, Outcome::Exited { exit_code: 0 }, "{}", r.log);

    // And the new connection serves assignments.
    c2.send(&SchedulerMsg::Assign(h.job("job-y", "wiki.txt")));
    assert_eq!(c2.finished().await.job_id, "job-y");
    h.stop().await;
}

#[tokio::test]
async fn refused_attach_is_retried_and_shutdown_stops_the_loop() {
    let work = tempfile::tempdir().expect("tempdir");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let hits = Arc::new(Mutex::new(0usize));
    let h2 = hits.clone();
    let app = Router::new().route(
        "/v1/ep/attach",
        any(move || {
            let hits = h2.clone();
            async move {
                *hits.lock().expect("lock") += 1;
                StatusCode::UNAUTHORIZED
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    let config = Config {
        name: "ep-test".into(),
        scheduler_url: base,
        attach_token: "bad".into(),
        slots: Resources::default(),
        work_dir: work.path().to_owned(),
        log_limit_bytes: 1024,
        max_output_files: 1,
        max_output_bytes: 1,
        lifetime_s: None,
        idle_shutdown_s: None,
    };
    let settings = config.resolve().await.expect("resolves");
    let shutdown = CancellationToken::new();
    let ep = tokio::spawn(htfaas_ep::run(settings, shutdown.clone()));
    // Backoff 100, 200, 400 ms…: at least 3 dials within 1.5 s, and not a busy loop.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let n = *hits.lock().expect("lock");
    assert!((3..=6).contains(&n), "{n} dials in 1.5 s");
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), ep).await.expect("stops").expect("task").expect("ok");
}
