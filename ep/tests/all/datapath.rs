//! The EP's data path against hostile storage and hostile guests: transient storage errors are
//! retried with backoff (module, input, outputs), permanent ones fail at once with a reason that
//! names the status and the URL path (never the macaroon); an input past the scratch bound, an
//! output flood and a flood of files each end the job with their own outcome, nothing is
//! uploaded, and the EP serves the next job.
//!
//! The scheduler is the shared fake ([`Harness`]); modules and storage come from a scripted
//! server of this file ([`Flaky`]) on 127.0.0.1:0, which can answer a path with a status, a
//! `Retry-After`, or a body cut short (the connection reset mid-body).

use crate::fake::{Harness, READ_MAC, WAIT, WRITE_MAC};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use htfaas_functions::Digest;
use htfaas_functions::Resources;
use htfaas_functions::proto::{FunctionRef, InputSpec, JobAssignment, JobReport, Outcome, OutputSpec, SchedulerMsg};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Creates `/output/out.txt` holding `done\n`, then returns.
const WRITE_ONE: &str = r#"(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 100) "out.txt")
  (data (i32.const 200) "done\n")
  (func (export "_start")
    (if (call $open (i32.const 4) (i32.const 0) (i32.const 100) (i32.const 7) (i32.const 1)
                    (i64.const 64) (i64.const 0) (i32.const 0) (i32.const 16))
      (then unreachable))
    (i32.store (i32.const 0) (i32.const 200))
    (i32.store (i32.const 4) (i32.const 5))
    (if (call $w (i32.load (i32.const 16)) (i32.const 0) (i32.const 1) (i32.const 8)) (then unreachable))))"#;

/// Creates `/output/big` and writes 64 KiB to it, again and again, until stopped.
const FLOOD: &str = r#"(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (data (i32.const 100) "big")
  (func (export "_start")
    (if (call $open (i32.const 4) (i32.const 0) (i32.const 100) (i32.const 3) (i32.const 1)
                    (i64.const 64) (i64.const 0) (i32.const 0) (i32.const 16))
      (then unreachable))
    (i32.store (i32.const 0) (i32.const 65536))
    (i32.store (i32.const 4) (i32.const 65536))
    (loop
      (drop (call $w (i32.load (i32.const 16)) (i32.const 0) (i32.const 1) (i32.const 8)))
      (br 0))))"#;

/// Creates 5,000 empty files in `/output` (names `aaa`, `baa`, …), then returns.
const MANY_FILES: &str = r#"(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_close" (func $close (param i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start") (local $i i32)
    (loop
      (i32.store8 (i32.const 100) (i32.add (i32.const 97) (i32.rem_u (local.get $i) (i32.const 26))))
      (i32.store8 (i32.const 101)
        (i32.add (i32.const 97) (i32.rem_u (i32.div_u (local.get $i) (i32.const 26)) (i32.const 26))))
      (i32.store8 (i32.const 102) (i32.add (i32.const 97) (i32.div_u (local.get $i) (i32.const 676))))
      (if (call $open (i32.const 4) (i32.const 0) (i32.const 100) (i32.const 3) (i32.const 1)
                      (i64.const 64) (i64.const 0) (i32.const 0) (i32.const 16))
        (then unreachable))
      (drop (call $close (i32.load (i32.const 16))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if 0 (i32.lt_u (local.get $i) (i32.const 5000))))))"#;

/// One scripted misbehaviour, used up by one request.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Answer with this status.
    Status(u16),
    /// Answer with this status and `Retry-After: secs`.
    RetryAfter(u16, u64),
    /// Announce the whole body, send half of it, then break the connection.
    Reset,
}

#[derive(Default)]
struct Script {
    /// Bodies served by GET, by path (`/modules/…`, `/in/…`; `/stream/…` without a length).
    files: HashMap<String, Bytes>,
    /// Faults answered, one per request, before a path is served normally.
    first: HashMap<String, VecDeque<Fault>>,
    /// A status a path always answers with.
    always: HashMap<String, u16>,
    /// Requests seen, by `METHOD path`.
    requests: HashMap<String, usize>,
    /// Bodies stored by PUT, by path.
    puts: HashMap<String, Bytes>,
}

/// A scripted module and storage server.
struct Flaky {
    base: String,
    script: Arc<Mutex<Script>>,
}

impl Flaky {
    async fn start() -> Flaky {
        let script = Arc::new(Mutex::new(Script::default()));
        let app = Router::new().fallback(serve).with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
        Flaky { base, script }
    }

    fn file(&self, path: &str, body: impl Into<Bytes>) {
        self.script.lock().expect("lock").files.insert(path.into(), body.into());
    }

    fn faults(&self, path: &str, faults: &[Fault]) {
        self.script.lock().expect("lock").first.insert(path.into(), faults.iter().copied().collect());
    }

    fn always(&self, path: &str, status: u16) {
        self.script.lock().expect("lock").always.insert(path.into(), status);
    }

    fn requests(&self, method_path: &str) -> usize {
        self.script.lock().expect("lock").requests.get(method_path).copied().unwrap_or(0)
    }

    fn puts(&self) -> Vec<String> {
        let mut v: Vec<String> = self.script.lock().expect("lock").puts.keys().cloned().collect();
        v.sort();
        v
    }

    /// A job running the WAT guest `wat` (served at `/modules/{name}`) over `input_path`, its
    /// outputs PUT under `/out/{id}/`.
    fn job(&self, id: &str, name: &str, wat: &str, input_path: &str) -> JobAssignment {
        self.job_of(id, name, wat::parse_str(wat).expect("valid wat"), input_path, &[])
    }

    /// A job running the wasm `bytes` (a module or a component) with `args` after the input.
    fn job_of(&self, id: &str, name: &str, bytes: Vec<u8>, input_path: &str, args: &[&str]) -> JobAssignment {
        let digest = Digest::of(&bytes);
        self.file(&format!("/modules/{name}"), bytes);
        JobAssignment {
            job_id: id.into(),
            function: FunctionRef {
                name: name.into(),
                version: 1,
                digest,
                module_url: format!("{}/modules/{name}", self.base),
                native: None,
            },
            resources: Resources::new(1, 64, 30),
            input: Some(InputSpec::new(format!("{}{input_path}", self.base), "in.dat", READ_MAC)),
            output: OutputSpec {
                url: format!("{}/out/{id}/", self.base),
                macaroon: WRITE_MAC.into(),
                on_failure: Default::default(),
            },
            args: args.iter().map(|a| a.to_string()).collect(),
            env: vec![],
            limits: Default::default(),
            secrets: Default::default(),
            renew_until: None,
            traceparent: None,
            refs: Vec::new(),
            checkpoint: None,
        }
    }
}

async fn serve(
    State(script): State<Arc<Mutex<Script>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let mut s = script.lock().expect("lock");
    *s.requests.entry(format!("{method} {path}")).or_default() += 1;
    let fault = match s.first.get_mut(&path).and_then(VecDeque::pop_front) {
        Some(f) => Some(f),
        None => s.always.get(&path).map(|&code| Fault::Status(code)),
    };
    let status = |code: u16| StatusCode::from_u16(code).expect("valid status");
    match fault {
        Some(Fault::Status(code)) => return (status(code), format!("scripted {code}")).into_response(),
        Some(Fault::RetryAfter(code, secs)) => {
            return (status(code), [("retry-after", secs.to_string())], "slow down").into_response();
        }
        Some(Fault::Reset) => {
            let full = s.files.get(&path).cloned().unwrap_or_else(|| Bytes::from(vec![b'r'; 1 << 20]));
            let half = full.slice(..full.len() / 2);
            let chunks: Vec<Result<Bytes, std::io::Error>> =
                vec![Ok(half), Err(std::io::Error::other("scripted reset mid-body"))];
            let mut resp = Body::from_stream(futures_util::stream::iter(chunks)).into_response();
            resp.headers_mut().insert("content-length", full.len().into());
            return resp;
        }
        None => {}
    }
    if method == Method::PUT {
        if auth != format!("Bearer {WRITE_MAC}") {
            return StatusCode::FORBIDDEN.into_response();
        }
        s.puts.insert(path, body);
        return StatusCode::CREATED.into_response();
    }
    if !path.starts_with("/modules/") && auth != format!("Bearer {READ_MAC}") {
        return StatusCode::FORBIDDEN.into_response();
    }
    match s.files.get(&path).cloned() {
        Some(b) if path.starts_with("/stream/") => {
            let chunks: Vec<Result<Bytes, std::io::Error>> =
                b.chunks(64 * 1024).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
            Body::from_stream(futures_util::stream::iter(chunks)).into_response()
        }
        Some(b) => b.into_response(),
        None => (StatusCode::NOT_FOUND, "no such file").into_response(),
    }
}

/// Starts the fake scheduler with an EP (tweaked by `tweak`), attaches it, and a [`Flaky`].
async fn start(tweak: impl FnOnce(&mut htfaas_ep::Config)) -> (Harness, crate::fake::Conn, Flaky) {
    let mut h = Harness::start_with(tweak).await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    let f = Flaky::start().await;
    f.file("/in/small.dat", &b"Wikipedia"[..]);
    (h, c, f)
}

fn reason(r: &JobReport) -> String {
    r.outcome.reason()
}

#[tokio::test]
async fn input_503_twice_then_200_completes_after_three_requests() {
    let (h, mut c, f) = start(|_| {}).await;
    f.faults("/in/small.dat", &[Fault::Status(503), Fault::Status(503)]);
    c.send(&SchedulerMsg::Assign(f.job("retry-in", "write-one", WRITE_ONE, "/in/small.dat")));
    let r = c.finished().await;
    assert_eq!(r.outcome, Outcome::Exited { exit_code: 0 }, "{}\n{}", reason(&r), r.log);
    assert_eq!(f.requests("GET /in/small.dat"), 3);
    assert_eq!(r.usage.bytes_in, 9);
    assert_eq!(f.puts(), ["/out/retry-in/out.txt"]);
    h.stop().await;
}

#[tokio::test]
async fn input_403_fails_at_once_naming_the_status_and_path_not_the_macaroon() {
    let (h, mut c, f) = start(|_| {}).await;
    f.always("/in/small.dat", 403);
    let started = Instant::now();
    c.send(&SchedulerMsg::Assign(f.job("denied", "write-one", WRITE_ONE, "/in/small.dat")));
    let r = c.finished().await;
    let Outcome::InputFailed { reason } = &r.outcome else { panic!("want InputFailed, got {:?}", r.outcome) };
    assert!(reason.contains("403") && reason.contains("/in/small.dat"), "{reason}");
    assert!(!reason.contains(READ_MAC) && !r.log.contains(READ_MAC), "{reason}");
    assert_eq!(f.requests("GET /in/small.dat"), 1);
    assert!(started.elapsed() < Duration::from_secs(5), "no backoff for a 403: {:?}", started.elapsed());
    assert!(f.puts().is_empty());
    h.stop().await;
}

// A storage that stays away through every try is reported as unavailable (the
// scheduler runs the job again later), not as a failure of the job.
#[tokio::test]
async fn input_always_503_reports_the_storage_unavailable_after_four_attempts() {
    let (h, mut c, f) = start(|_| {}).await;
    f.always("/in/small.dat", 503);
    let started = Instant::now();
    c.send(&SchedulerMsg::Assign(f.job("down", "write-one", WRITE_ONE, "/in/small.dat")));
    let r = c.finished().await;
    let took = started.elapsed();
    let Outcome::StorageUnavailable { reason } = &r.outcome else {
        panic!("want StorageUnavailable, got {:?}", r.outcome)
    };
    assert!(reason.contains("503") && reason.contains("gave up after 4 attempts"), "{reason}");
    assert!(reason.contains("GET ") && reason.contains("/in/small.dat") && !reason.contains(READ_MAC), "{reason}");
    assert!(r.outcome.is_transient() && !r.outcome.is_success());
    assert_eq!(f.requests("GET /in/small.dat"), 4);
    // Three backoffs of 200, 400 and 800 ms, each at least halved by the jitter.
    assert!(took >= Duration::from_millis(700) && took < Duration::from_secs(10), "took {took:?}");
    assert!(f.puts().is_empty());
    eprintln!("always-503: {reason} after {took:?}");
    h.stop().await;
}

#[tokio::test]
async fn an_output_503_through_every_try_reports_the_storage_unavailable_and_a_403_fails_at_once() {
    let (h, mut c, f) = start(|_| {}).await;
    f.always("/out/out-down/out.txt", 503);
    c.send(&SchedulerMsg::Assign(f.job("out-down", "write-one", WRITE_ONE, "/in/small.dat")));
    let r = c.finished().await;
    let Outcome::StorageUnavailable { reason } = &r.outcome else {
        panic!("want StorageUnavailable, got {:?}", r.outcome)
    };
    assert!(reason.starts_with("PUT ") && reason.contains("503") && reason.contains("gave up after 4"), "{reason}");
    assert_eq!(f.requests("PUT /out/out-down/out.txt"), 4);
    assert!(r.outputs.is_empty());
    // A refusal is the job's failure, at once: no retry, no second chance.
    f.always("/out/out-denied/out.txt", 403);
    c.send(&SchedulerMsg::Assign(f.job("out-denied", "write-one", WRITE_ONE, "/in/small.dat")));
    let r = c.finished().await;
    let Outcome::OutputFailed { reason } = &r.outcome else { panic!("want OutputFailed, got {:?}", r.outcome) };
    assert!(reason.contains("403"), "{reason}");
    assert_eq!(f.requests("PUT /out/out-denied/out.txt"), 1);
    assert!(!r.outcome.is_transient());
    h.stop().await;
}

#[tokio::test]
async fn a_module_server_that_stays_away_reports_the_storage_unavailable() {
    let (h, mut c, f) = start(|_| {}).await;
    f.always("/modules/write-one", 502);
    c.send(&SchedulerMsg::Assign(f.job("mod-down", "write-one", WRITE_ONE, "/in/small.dat")));
    let r = c.finished().await;
    let Outcome::StorageUnavailable { reason } = &r.outcome else {
        panic!("want StorageUnavailable, got {:?}", r.outcome)
    };
    assert!(reason.starts_with("fetch ") && reason.contains("502"), "{reason}");
    assert_eq!(f.requests("GET /modules/write-one"), 4);
    assert_eq!(f.requests("GET /in/small.dat"), 0);
    h.stop().await;
}

#[tokio::test]
async fn module_5xx_input_reset_mid_body_and_output_429_are_all_retried() {
    let (h, mut c, f) = start(|_| {}).await;
    let input = Bytes::from(vec![b'i'; 256 * 1024]);
    f.file("/in/reset.dat", input.clone());
    f.faults("/modules/write-one", &[Fault::Status(502)]);
    f.faults("/in/reset.dat", &[Fault::Reset]);
    f.faults("/out/mixed/out.txt", &[Fault::RetryAfter(429, 1)]);
    let started = Instant::now();
    c.send(&SchedulerMsg::Assign(f.job("mixed", "write-one", WRITE_ONE, "/in/reset.dat")));
    let r = c.finished().await;
    let took = started.elapsed();
    assert_eq!(r.outcome, Outcome::Exited { exit_code: 0 }, "{}\n{}", reason(&r), r.log);
    assert_eq!(f.requests("GET /modules/write-one"), 2);
    assert_eq!(f.requests("GET /in/reset.dat"), 2);
    assert_eq!(f.requests("PUT /out/mixed/out.txt"), 2);
    assert_eq!(r.usage.bytes_in, input.len() as u64, "a restarted download counts its input once");
    assert_eq!(f.puts(), ["/out/mixed/out.txt"]);
    assert_eq!(r.outputs.len(), 1);
    assert!(took >= Duration::from_secs(1), "Retry-After: 1 was honoured: {took:?}");
    h.stop().await;
}

#[tokio::test]
async fn an_input_larger_than_the_scratch_bound_fails_before_or_as_it_arrives() {
    let (h, mut c, f) = start(|cfg| cfg.max_scratch_mb = Some(1)).await;
    let big = Bytes::from(vec![b'x'; 2 << 20]);
    f.file("/in/big.dat", big.clone());
    f.file("/stream/big.dat", big);
    c.send(&SchedulerMsg::Assign(f.job("big-len", "write-one", WRITE_ONE, "/in/big.dat")));
    let r = c.finished().await;
    assert_eq!(
        r.outcome,
        Outcome::InputFailed { reason: "input of 2097152 bytes exceeds the scratch limit of 1048576 bytes".into() }
    );
    assert_eq!(r.usage.bytes_in, 0, "Content-Length was checked up front");
    assert_eq!(f.requests("GET /in/big.dat"), 1, "not retried");

    c.send(&SchedulerMsg::Assign(f.job("big-stream", "write-one", WRITE_ONE, "/stream/big.dat")));
    let r = c.finished().await;
    let Outcome::InputFailed { reason } = &r.outcome else { panic!("want InputFailed, got {:?}", r.outcome) };
    assert!(reason.starts_with("input of at least ") && reason.ends_with("exceeds the scratch limit of 1048576 bytes"));
    assert!(r.usage.bytes_in <= 1 << 20, "stopped at the bound: {:?}", r.usage);
    assert_eq!(r.usage.cpu_ms, 0, "the guest never ran");
    assert!(f.puts().is_empty());

    // A small input still runs.
    c.send(&SchedulerMsg::Assign(f.job("small", "write-one", WRITE_ONE, "/in/small.dat")));
    assert_eq!(c.finished().await.outcome, Outcome::Exited { exit_code: 0 });
    h.stop().await;
}

#[tokio::test]
async fn an_output_flood_is_stopped_quickly_nothing_is_stored_and_the_ep_serves_on() {
    let (h, mut c, f) = start(|cfg| cfg.max_output_bytes = 8 << 20).await;
    let started = Instant::now();
    c.send(&SchedulerMsg::Assign(f.job("flood", "flood", FLOOD, "/in/small.dat")));
    let r = c.finished().await;
    let took = started.elapsed();
    let Outcome::OutputExceeded { reason } = &r.outcome else {
        panic!("want OutputExceeded, got {:?}\n{}", r.outcome, r.log)
    };
    assert!(reason.contains("more than the output byte limit of 8388608"), "{reason}");
    assert!(took < Duration::from_secs(5), "stopped after {took:?} (cap 30 s)");
    assert!(r.outputs.is_empty() && r.usage.bytes_out == 0, "{r:?}");
    assert!(f.puts().is_empty(), "nothing uploaded: {:?}", f.puts());
    assert!(!h.output_dir("flood").exists(), "the job's scratch is removed");
    eprintln!("flood: {reason}; reported {took:?} after assignment");

    c.send(&SchedulerMsg::Assign(f.job("after-flood", "write-one", WRITE_ONE, "/in/small.dat")));
    let r = c.finished().await;
    assert_eq!(r.outcome, Outcome::Exited { exit_code: 0 }, "{}", r.log);
    assert_eq!(f.puts(), ["/out/after-flood/out.txt"]);
    h.stop().await;
}

#[tokio::test]
async fn an_output_flood_past_the_scratch_bound_is_stopped() {
    let (h, mut c, f) = start(|cfg| cfg.max_scratch_mb = Some(4)).await;
    c.send(&SchedulerMsg::Assign(f.job("flood-scratch", "flood", FLOOD, "/in/small.dat")));
    let r = tokio::time::timeout(WAIT, c.finished()).await.expect("report in time");
    let Outcome::OutputExceeded { reason } = &r.outcome else { panic!("want OutputExceeded, got {:?}", r.outcome) };
    assert!(reason.contains("more than the scratch limit of 4194304 bytes"), "{reason}");
    assert!(f.puts().is_empty());
    h.stop().await;
}

#[tokio::test]
async fn five_thousand_files_exceed_the_file_limit_and_nothing_is_stored() {
    let (h, mut c, f) = start(|_| {}).await;
    c.send(&SchedulerMsg::Assign(f.job("files", "many-files", MANY_FILES, "/in/small.dat")));
    let r = c.finished().await;
    let Outcome::OutputExceeded { reason } = &r.outcome else {
        panic!("want OutputExceeded, got {:?}\n{}", r.outcome, r.log)
    };
    assert!(reason.contains("output file limit of 64"), "{reason}");
    assert!(f.puts().is_empty(), "nothing uploaded: {:?}", f.puts());
    assert!(r.outputs.is_empty());

    c.send(&SchedulerMsg::Assign(f.job("after-files", "write-one", WRITE_ONE, "/in/small.dat")));
    assert_eq!(c.finished().await.outcome, Outcome::Exited { exit_code: 0 });
    h.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Preview 2 components through the whole EP: the same data path and output limits.

#[tokio::test]
async fn a_component_runs_through_the_data_path_and_its_floods_are_stopped() {
    let (h, mut c, f) = start(|cfg| cfg.max_output_bytes = 8 << 20).await;
    f.file("/in/wiki.txt", Bytes::from_static(b"Wikipedia"));
    let checksum = crate::common::component_bytes("checksum");
    c.send(&SchedulerMsg::Assign(f.job_of("p2-checksum", "checksum-p2", checksum, "/in/wiki.txt", &[])));
    let r = c.finished().await;
    assert_eq!(r.outcome, Outcome::Exited { exit_code: 0 }, "{}\n{}", reason(&r), r.log);
    assert_eq!(f.puts(), ["/out/p2-checksum/in.dat.checksums.json"]);
    let json = f.script.lock().expect("lock").puts["/out/p2-checksum/in.dat.checksums.json"].clone();
    let v: serde_json::Value = serde_json::from_slice(&json).expect("json");
    assert_eq!(v["adler32"], "11e60398");

    let hostile = crate::common::component_bytes("hostile");
    c.send(&SchedulerMsg::Assign(f.job_of(
        "p2-files",
        "hostile-p2",
        hostile.clone(),
        "/in/wiki.txt",
        &["files", "5000"],
    )));
    let r = c.finished().await;
    let Outcome::OutputExceeded { reason } = &r.outcome else { panic!("want OutputExceeded, got {:?}", r.outcome) };
    assert!(reason.contains("output file limit of 64"), "{reason}");
    c.send(&SchedulerMsg::Assign(f.job_of("p2-write", "hostile-p2", hostile, "/in/wiki.txt", &["write", "64"])));
    let r = c.finished().await;
    let Outcome::OutputExceeded { reason } = &r.outcome else { panic!("want OutputExceeded, got {:?}", r.outcome) };
    assert!(reason.contains("more than the output byte limit of 8388608"), "{reason}");
    assert_eq!(f.puts(), ["/out/p2-checksum/in.dat.checksums.json"], "nothing of the floods was uploaded");
    h.stop().await;
}
