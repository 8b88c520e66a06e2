//! A fake scheduler (WebSocket) and fake storage (HTTP) in one in-test axum server on
//! 127.0.0.1:0, and a [`Harness`] that starts an EP against them through its public API.
//!
//! Modules served: `checksum` (the example guest), and WAT guests for timing: `spin-writer`
//! (creates `/output/partial.txt`, then loops forever), `sleep-2s`, `sleep-4s` and `sleep-60s`
//! (one relative-clock `poll_oneoff`, then exit 0), and the example `hostile` guest as a preview
//! 1 module (`hostile`) and a preview 2 component (`hostile-p2`). Storage routes: `/storage/in/wiki.txt`, a slow
//! endless input `/storage/slow/{name}`, a redirect to another host `/storage/redirect/{name}`, outputs `/storage/out/{name}` and a PUT that never
//! answers, `/storage/hang-out/{name}`, and jobs' checkpoint areas `/storage/ckpt/{job}/{file}` (and `/storage/ckpt/{job}/`)
//! (GET, PUT, DELETE with [`CKPT_MAC`], each recorded in [`Seen::checkpoint_requests`]).

use crate::common::{digest, guest_bytes};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::Method;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, put};
use htfaas_ep::Config;
use htfaas_functions::proto::{
    EpMsg, FunctionRef, Hello, InputSpec, JobAssignment, JobReport, OutputSpec, Prefetch, SchedulerMsg, decode_frame,
};
use htfaas_functions::{Digest, Resources};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub const ATTACH: &str = "attach-token-xyz";
/// The attach token the fake scheduler hands out on a renewal; it attaches too.
pub const RENEWED_ATTACH: &str = "attach-token-renewed";
pub const READ_MAC: &str = "read-macaroon-abc";
pub const WRITE_MAC: &str = "write-macaroon-def";
/// The macaroon of every job's checkpoint area.
pub const CKPT_MAC: &str = "checkpoint-macaroon-ghi";
pub const WAIT: Duration = Duration::from_secs(30);
/// Bytes the slow input sends at once, before trickling.
pub const SLOW_FIRST_CHUNK: usize = 4096;

/// Creates `/output/partial.txt` (preopen fd 4) with `half done\n`, then spins forever.
const SPIN_WRITER: &str = r#"(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 100) "partial.txt")
  (data (i32.const 200) "half done\n")
  (func (export "_start")
    (if (call $open (i32.const 4) (i32.const 0) (i32.const 100) (i32.const 11) (i32.const 1)
                    (i64.const 64) (i64.const 0) (i32.const 0) (i32.const 16))
      (then unreachable))
    (i32.store (i32.const 0) (i32.const 200))
    (i32.store (i32.const 4) (i32.const 10))
    (drop (call $w (i32.load (i32.const 16)) (i32.const 0) (i32.const 1) (i32.const 8)))
    (loop br 0)))"#;

/// A guest that sleeps `secs` seconds in one `poll_oneoff` (relative monotonic clock), then exits 0.
pub fn sleep_wat(secs: u64) -> String {
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (i32.store8 (i32.const 8) (i32.const 0))
    (i32.store (i32.const 16) (i32.const 1))
    (i64.store (i32.const 24) (i64.const {ns}))
    (if (call $poll (i32.const 0) (i32.const 64) (i32.const 1) (i32.const 128)) (then unreachable))))"#,
        ns = secs * 1_000_000_000
    )
}

/// A command to the fake scheduler's side of one connection.
enum Cmd {
    Text(String),
    Close(u16, String),
    /// Drop the socket without a close frame.
    Drop,
}

/// What the server tells the test about one WebSocket connection.
pub struct Conn {
    to_ep: mpsc::UnboundedSender<Cmd>,
    from_ep: mpsc::UnboundedReceiver<EpMsg>,
}

impl Conn {
    pub fn send(&self, msg: &SchedulerMsg) {
        self.to_ep.send(Cmd::Text(serde_json::to_string(msg).expect("json"))).expect("conn alive");
    }
    pub fn send_raw(&self, text: &str) {
        self.to_ep.send(Cmd::Text(text.to_owned())).expect("conn alive");
    }
    pub fn close(&self, code: u16, reason: &str) {
        let _ = self.to_ep.send(Cmd::Close(code, reason.to_owned()));
    }
    pub fn drop_socket(&self) {
        let _ = self.to_ep.send(Cmd::Drop);
    }
    pub async fn recv(&mut self) -> EpMsg {
        tokio::time::timeout(WAIT, self.from_ep.recv()).await.expect("EP message in time").expect("conn open")
    }
    /// Receives `Hello`, checks the harness EP's fields, answers `Welcome`; returns the hello.
    pub async fn hello_welcome(&mut self) -> Hello {
        let hello = match self.recv().await {
            EpMsg::Hello(h) => h,
            other => panic!("want hello, got {other:?}"),
        };
        assert_eq!(hello.name, "ep-test");
        assert_eq!(hello.protocol, 1);
        assert_eq!(hello.slots.cpus, 2);
        self.send(&SchedulerMsg::Welcome { ep_id: "ep-1".into(), prefetch: None, attach: None });
        hello
    }
    /// Receives `Hello` (which must ask for prefetch), answers `Welcome` granting `grant`;
    /// returns the hello.
    pub async fn hello_welcome_prefetch(&mut self, grant: Prefetch) -> Hello {
        let hello = match self.recv().await {
            EpMsg::Hello(h) => h,
            other => panic!("want hello, got {other:?}"),
        };
        assert!(hello.prefetch.is_some(), "the EP speaks the prefetch extension");
        self.send(&SchedulerMsg::Welcome { ep_id: "ep-1".into(), prefetch: Some(grant), attach: None });
        hello
    }
    /// The next message, or `None` once the EP closed the connection (bounded by [`WAIT`]).
    pub async fn recv_or_closed(&mut self) -> Option<EpMsg> {
        tokio::time::timeout(WAIT, self.from_ep.recv()).await.expect("EP message or close in time")
    }
    pub async fn finished(&mut self) -> JobReport {
        match self.recv().await {
            EpMsg::Finished(r) => r,
            other => panic!("want finished, got {other:?}"),
        }
    }
}

#[derive(Default)]
pub struct Seen {
    pub input_auth: Vec<String>,
    /// The `Authorization` of every attach accepted, in order.
    pub attach_auth: Vec<String>,
    pub puts: HashMap<String, (String, Option<String>, Bytes)>, // name -> (auth, content-length, body)
    pub module_gets: usize,
    /// GETs of the slow input, and PUTs of the output that never answers.
    pub slow_gets: usize,
    pub hang_puts: usize,
    /// The checkpoint areas' files: `{job}/{file}` -> bytes.
    pub checkpoints: HashMap<String, Bytes>,
    /// Every request to a checkpoint area, in order: (method, `{job}/{file}`, answer status).
    pub checkpoint_requests: Vec<(String, String, u16)>,
}

#[derive(Clone)]
struct Fake {
    conns: mpsc::UnboundedSender<Conn>,
    seen: Arc<Mutex<Seen>>,
    modules: Arc<HashMap<String, Vec<u8>>>,
    /// Set when the slow input's body is dropped: its client went away.
    slow_dropped: Arc<AtomicBool>,
}

fn auth(h: &HeaderMap) -> String {
    h.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
}

async fn attach(State(f): State<Fake>, headers: HeaderMap, ws: WebSocketUpgrade) -> Response {
    let bearer = auth(&headers);
    if bearer != format!("Bearer {ATTACH}") && bearer != format!("Bearer {RENEWED_ATTACH}") {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    f.seen.lock().expect("lock").attach_auth.push(bearer);
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
                Some(Cmd::Text(text)) => if socket.send(Message::Text(text.into())).await.is_err() { return },
                Some(Cmd::Close(code, reason)) => {
                    let _ = socket.send(Message::Close(Some(CloseFrame { code, reason: reason.into() }))).await;
                    return;
                }
                Some(Cmd::Drop) | None => return,
            },
            msg = socket.recv() => match msg {
                Some(Ok(Message::Text(t))) => {
                    // One message, or an array of them within the prefetch extension.
                    let all: Vec<EpMsg> = decode_frame(t.as_str(), true).expect("EP sends valid EpMsg");
                    for m in all {
                        let _ = from_tx.send(m);
                    }
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

/// Sets its flag when dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// [`SLOW_FIRST_CHUNK`] bytes, then one byte every 100 ms for ten minutes.
async fn slow_input(State(f): State<Fake>) -> Response {
    f.seen.lock().expect("lock").slow_gets += 1;
    let flag = DropFlag(f.slow_dropped.clone());
    let stream = futures_util::stream::unfold((flag, 0u32), |(flag, i)| async move {
        if i >= 6000 {
            return None;
        }
        let chunk = if i == 0 {
            Bytes::from(vec![b'a'; SLOW_FIRST_CHUNK])
        } else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Bytes::from_static(b"b")
        };
        Some((Ok::<_, std::io::Error>(chunk), (flag, i + 1)))
    });
    Body::from_stream(stream).into_response()
}

async fn output(State(f): State<Fake>, Path(name): Path<String>, headers: HeaderMap, body: Bytes) -> Response {
    let len = headers.get("content-length").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let a = auth(&headers);
    let ok = a == format!("Bearer {WRITE_MAC}");
    f.seen.lock().expect("lock").puts.insert(name, (a, len, body));
    if ok { StatusCode::CREATED.into_response() } else { StatusCode::FORBIDDEN.into_response() }
}

/// A job's checkpoint area: GET (404 when nothing is stored), PUT (replaces), DELETE (404 when
/// nothing is stored); 403 without [`CKPT_MAC`].
async fn checkpoint(
    State(f): State<Fake>,
    method: Method,
    Path((job, file)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let key = format!("{job}/{file}");
    let mut seen = f.seen.lock().expect("lock");
    let (status, body) = if auth(&headers) != format!("Bearer {CKPT_MAC}") {
        (StatusCode::FORBIDDEN, Bytes::from_static(b"macaroon refused"))
    } else if method == Method::GET {
        match seen.checkpoints.get(&key) {
            Some(b) => (StatusCode::OK, b.clone()),
            None => (StatusCode::NOT_FOUND, Bytes::new()),
        }
    } else if method == Method::PUT {
        seen.checkpoints.insert(key.clone(), body);
        (StatusCode::CREATED, Bytes::new())
    } else if method == Method::DELETE {
        match seen.checkpoints.remove(&key) {
            Some(_) => (StatusCode::NO_CONTENT, Bytes::new()),
            None => (StatusCode::NOT_FOUND, Bytes::new()),
        }
    } else {
        (StatusCode::METHOD_NOT_ALLOWED, Bytes::new())
    };
    seen.checkpoint_requests.push((method.to_string(), key, status.as_u16()));
    (status, body).into_response()
}

/// A job's checkpoint area itself: DELETE removes it when it holds nothing (204), else 409;
/// 403 without [`CKPT_MAC`]. Recorded as `{job}/`.
async fn checkpoint_area(
    State(f): State<Fake>,
    method: Method,
    Path(job): Path<String>,
    headers: HeaderMap,
) -> Response {
    let key = format!("{job}/");
    let mut seen = f.seen.lock().expect("lock");
    let status = if auth(&headers) != format!("Bearer {CKPT_MAC}") {
        StatusCode::FORBIDDEN
    } else if method != Method::DELETE {
        StatusCode::METHOD_NOT_ALLOWED
    } else if seen.checkpoints.keys().any(|k| k.starts_with(&key)) {
        StatusCode::CONFLICT
    } else {
        StatusCode::NO_CONTENT
    };
    seen.checkpoint_requests.push((method.to_string(), key, status.as_u16()));
    status.into_response()
}

/// Redirects to another host (127.0.0.2, outside an EP's default origins).
async fn redirect_away(Path(name): Path<String>) -> Response {
    (StatusCode::TEMPORARY_REDIRECT, [("location", format!("http://127.0.0.2:9/latest/{name}"))]).into_response()
}

/// Takes the body, then answers only after ten minutes.
async fn hang_output(State(f): State<Fake>, _body: Bytes) -> Response {
    f.seen.lock().expect("lock").hang_puts += 1;
    tokio::time::sleep(Duration::from_secs(600)).await;
    StatusCode::CREATED.into_response()
}

pub struct Harness {
    pub base: String,
    conns: mpsc::UnboundedReceiver<Conn>,
    pub seen: Arc<Mutex<Seen>>,
    pub slow_dropped: Arc<AtomicBool>,
    /// Drains the EP (`run_with`'s drain token).
    pub shutdown: CancellationToken,
    /// Stops the EP at once (`run_with`'s stop token).
    pub stop_now: CancellationToken,
    pub ep: tokio::task::JoinHandle<anyhow::Result<()>>,
    pub work: tempfile::TempDir,
    digests: HashMap<String, Digest>,
    /// The EP's metrics listener, when the config asked for one.
    pub metrics: Option<std::net::SocketAddr>,
}

impl Harness {
    pub async fn start() -> Harness {
        Harness::start_with(|_| {}).await
    }

    /// Starts the fake server and an EP whose config `tweak` may change first.
    pub async fn start_with(tweak: impl FnOnce(&mut Config)) -> Harness {
        let mut modules = HashMap::from([
            ("checksum".to_owned(), guest_bytes("checksum")),
            ("spin-writer".to_owned(), wat::parse_str(SPIN_WRITER).expect("valid wat")),
            ("hostile".to_owned(), guest_bytes("hostile")),
            ("hostile-p2".to_owned(), crate::common::component_bytes("hostile")),
        ]);
        for secs in [2, 4, 60] {
            modules.insert(format!("sleep-{secs}s"), wat::parse_str(sleep_wat(secs)).expect("valid wat"));
        }
        let digests = modules.iter().map(|(name, bytes)| (name.clone(), digest(bytes))).collect();
        let (conns_tx, conns) = mpsc::unbounded_channel();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let slow_dropped = Arc::new(AtomicBool::new(false));
        let fake = Fake {
            conns: conns_tx,
            seen: seen.clone(),
            modules: Arc::new(modules),
            slow_dropped: slow_dropped.clone(),
        };
        let app = Router::new()
            .route("/v1/ep/attach", any(attach))
            .route("/modules/{name}", get(module))
            .route("/storage/in/{name}", get(input))
            .route("/storage/slow/{name}", get(slow_input))
            .route("/storage/out/{name}", put(output))
            .route("/storage/hang-out/{name}", put(hang_output))
            .route("/storage/redirect/{name}", get(redirect_away))
            .route("/storage/ckpt/{job}/{file}", any(checkpoint))
            .route("/storage/ckpt/{job}/", any(checkpoint_area))
            .with_state(fake);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });

        let work = tempfile::tempdir().expect("tempdir");
        let mut config = Config {
            slots: Resources::new(2, 512, 60),
            max_output_bytes: 1 << 30,
            ..Config::for_test("ep-test", base.clone(), ATTACH, work.path())
        };
        tweak(&mut config);
        let mut settings = config.resolve().await.expect("resolves");
        settings.drain_timeout = Duration::from_secs(10);
        let metrics = settings.metrics_addr();
        let (shutdown, stop_now) = (CancellationToken::new(), CancellationToken::new());
        let ep = tokio::spawn(htfaas_ep::run_with(settings, shutdown.clone(), stop_now.clone()));
        Harness { base, conns, seen, slow_dropped, shutdown, stop_now, ep, work, digests, metrics }
    }

    pub async fn conn(&mut self) -> Conn {
        tokio::time::timeout(WAIT, self.conns.recv()).await.expect("EP connects in time").expect("server up")
    }

    /// A checksum job over `input`.
    pub fn job(&self, id: &str, input: &str) -> JobAssignment {
        self.job_of(id, "checksum", input)
    }

    /// A job running module `module` over `/storage/in/{input}` (or another `/storage/…` path).
    pub fn job_of(&self, id: &str, module: &str, input: &str) -> JobAssignment {
        let (dir, name) = input.rsplit_once('/').unwrap_or(("in", input));
        JobAssignment {
            job_id: id.into(),
            function: FunctionRef {
                name: module.into(),
                version: 1,
                digest: self.digests.get(module).expect("module served").clone(),
                module_url: format!("{}/modules/{module}", self.base),
                native: None,
            },
            resources: Resources::new(1, 64, 30),
            input: Some(InputSpec::new(format!("{}/storage/{dir}/{name}", self.base), name, READ_MAC)),
            output: OutputSpec {
                url: format!("{}/storage/out/", self.base),
                macaroon: WRITE_MAC.into(),
                on_failure: Default::default(),
            },
            args: vec![],
            env: vec![],
            limits: Default::default(),
            secrets: Default::default(),
            renew_until: None,
            traceparent: None,
            refs: Vec::new(),
            checkpoint: None,
        }
    }

    /// `job` keeping checkpoints in its own area of the fake storage (`/storage/ckpt/{job id}/`),
    /// bounded by `max_bytes`, resumed on `exit_code`.
    pub fn with_checkpoint(&self, mut job: JobAssignment, exit_code: Option<i32>, max_bytes: u64) -> JobAssignment {
        job.checkpoint = Some(htfaas_functions::checkpoint::CheckpointSpec {
            url: format!("{}/storage/ckpt/{}/", self.base, job.job_id),
            macaroon: CKPT_MAC.into(),
            max_bytes,
            exit_code,
        });
        job
    }

    /// The digest of a served module.
    pub fn digest_of(&self, module: &str) -> Digest {
        self.digests.get(module).expect("module served").clone()
    }

    /// The EP's metrics page (the config must have asked for a listener).
    pub async fn metrics_page(&self) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let addr = self.metrics.expect("the EP serves metrics");
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect to the metrics");
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: ep\r\n\r\n").await.expect("request");
        let mut page = String::new();
        s.read_to_string(&mut page).await.expect("the page");
        page
    }

    /// The EP's scratch directory of a running job's outputs.
    pub fn output_dir(&self, job_id: &str) -> std::path::PathBuf {
        self.work.path().join("jobs").join(job_id).join("output")
    }

    /// Cancels the EP and waits for `run` to return `Ok`.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let done = tokio::time::timeout(WAIT, self.ep).await.expect("EP stops in time");
        done.expect("EP task").expect("EP run ok");
    }

    /// Waits (up to 10 s) for `run` to end by itself and returns its result.
    pub async fn ended(self) -> anyhow::Result<()> {
        let done = tokio::time::timeout(Duration::from_secs(10), self.ep).await.expect("EP ends by itself in time");
        done.expect("EP task")
    }
}

/// Polls `cond` every 20 ms until it holds; panics after [`WAIT`].
pub async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
