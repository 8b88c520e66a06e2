//! The EP's data path against `curl` on the same storage: download and upload throughput of a
//! large file, and how much the process's peak memory grows with the file's size (it must not:
//! both directions stream through the scratch directory).
//!
//! Setup, all on 127.0.0.1: the built-in storage (`htfaas_storage::run`, in this process, so
//! no binary has to be built first), one macaroon (`DOWNLOAD,UPLOAD` under `/bench`) used by
//! both clients as `Authorization: Bearer`, a generated input written to the storage's data
//! directory in 1 MiB pieces (never held in memory), a minimal fake scheduler (WebSocket) and a
//! real EP (`htfaas_ep::run`) with a pass-through guest (WAT: `/input/in.dat` to
//! `/output/out.dat` in 1 MiB reads and writes).
//!
//! For each size: (a) `curl` GETs the input to `/dev/null`, then PUTs it back (`-T`); (b) the EP
//! runs one job: its input download and output upload times are read from its `job finished`
//! log line (`input_ms`, `output_ms`, caught by a tracing layer), so the guest's copy is not
//! counted. The storage answers a PUT once the file is durable, for both clients alike.
//!
//! Peak memory: before each EP job `5` is written to `/proc/self/clear_refs` (resets `VmHWM`);
//! the growth is `VmHWM` after the job less `VmRSS` before it. The storage runs in this process
//! too, so the figure is an upper bound on the EP's own growth.
//!
//! `cargo bench -p htfaas-ep --bench datapath` uses 256 MiB and 1 GiB; `-- --quick` or
//! `HTFAAS_BENCH_QUICK=1` 64 and 256 MiB. Without `--bench` (as `cargo test --benches` runs it)
//! one 4 MiB round runs as a smoke test. One JSON line per figure. Temporary files live in one
//! temporary directory, removed at the end.

use axum::Router;
use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use axum::routing::any;
use htfaas_functions::proto::{
    EpMsg, FunctionRef, InputSpec, JobAssignment, JobReport, Outcome, OutputSpec, SchedulerMsg,
};
use htfaas_functions::{Digest, Resources};
use std::collections::HashMap;
use std::io::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::layer::SubscriberExt as _;

const MIB: u64 = 1 << 20;
const USER: (&str, &str) = ("bench", "bench-secret");

/// Copies `/input/in.dat` to `/output/out.dat` through a 1 MiB buffer at 65536.
const PASS_THROUGH: &str = r#"(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 20)
  (data (i32.const 100) "in.dat")
  (data (i32.const 200) "out.dat")
  (func (export "_start") (local $in i32) (local $out i32) (local $n i32) (local $off i32)
    (if (call $open (i32.const 3) (i32.const 0) (i32.const 100) (i32.const 6) (i32.const 0)
                    (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 16))
      (then unreachable))
    (local.set $in (i32.load (i32.const 16)))
    (if (call $open (i32.const 4) (i32.const 0) (i32.const 200) (i32.const 7) (i32.const 9)
                    (i64.const 64) (i64.const 0) (i32.const 0) (i32.const 16))
      (then unreachable))
    (local.set $out (i32.load (i32.const 16)))
    (block $done
      (loop $copy
        (i32.store (i32.const 0) (i32.const 65536))
        (i32.store (i32.const 4) (i32.const 1048576))
        (if (call $read (local.get $in) (i32.const 0) (i32.const 1) (i32.const 8)) (then unreachable))
        (local.set $n (i32.load (i32.const 8)))
        (br_if $done (i32.eqz (local.get $n)))
        (local.set $off (i32.const 0))
        (loop $all
          (i32.store (i32.const 0) (i32.add (i32.const 65536) (local.get $off)))
          (i32.store (i32.const 4) (i32.sub (local.get $n) (local.get $off)))
          (if (call $write (local.get $out) (i32.const 0) (i32.const 1) (i32.const 8)) (then unreachable))
          (local.set $off (i32.add (local.get $off) (i32.load (i32.const 8))))
          (br_if $all (i32.lt_u (local.get $off) (local.get $n))))
        (br $copy)))))"#;

/// Numeric fields of the EP's `job finished` log lines.
#[derive(Clone, Default)]
struct Finished(Arc<Mutex<Vec<HashMap<String, u64>>>>);

#[derive(Default)]
struct Fields {
    message: String,
    numbers: HashMap<String, u64>,
}

impl tracing::field::Visit for Fields {
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.numbers.insert(field.name().to_owned(), value);
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Finished {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: tracing_subscriber::layer::Context<'_, S>) {
        let mut f = Fields::default();
        event.record(&mut f);
        if f.message.starts_with("job finished") {
            self.0.lock().unwrap_or_else(|p| p.into_inner()).push(f.numbers);
        }
    }
}

/// The scheduler side: jobs to assign, reports back.
struct Scheduler {
    jobs: mpsc::UnboundedSender<JobAssignment>,
    reports: mpsc::UnboundedReceiver<JobReport>,
}

type Link = Arc<tokio::sync::Mutex<(mpsc::UnboundedReceiver<JobAssignment>, mpsc::UnboundedSender<JobReport>)>>;

async fn attach(State(link): State<Link>, ws: WebSocketUpgrade) -> Response {
    ws.on_upgrade(move |socket| serve_ep(socket, link))
}

/// Welcomes the EP, then assigns each job sent and forwards each report.
async fn serve_ep(mut socket: WebSocket, link: Link) {
    let mut link = link.lock().await;
    let (jobs, reports) = &mut *link;
    loop {
        tokio::select! {
            job = jobs.recv() => {
                let Some(job) = job else { return };
                let text = serde_json::to_string(&SchedulerMsg::Assign(job)).expect("json");
                if socket.send(Message::Text(text.into())).await.is_err() {
                    return;
                }
            }
            msg = socket.recv() => {
                let Some(Ok(Message::Text(text))) = msg else { return };
                match serde_json::from_str::<EpMsg>(text.as_str()) {
                    Ok(EpMsg::Hello(_)) => {
                        let welcome = SchedulerMsg::Welcome { ep_id: "bench-ep".into(), prefetch: None, attach: None };
                        let text = serde_json::to_string(&welcome).expect("json");
                        if socket.send(Message::Text(text.into())).await.is_err() {
                            return;
                        }
                    }
                    Ok(EpMsg::Finished(r)) => {
                        let _ = reports.send(r);
                    }
                    _ => {}
                }
            }
        }
    }
}

async fn start_scheduler() -> (String, Scheduler) {
    let (jobs_tx, jobs_rx) = mpsc::unbounded_channel();
    let (reports_tx, reports_rx) = mpsc::unbounded_channel();
    let link: Link = Arc::new(tokio::sync::Mutex::new((jobs_rx, reports_tx)));
    let app = Router::new().route("/v1/ep/attach", any(attach)).with_state(link);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind scheduler");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve scheduler") });
    (base, Scheduler { jobs: jobs_tx, reports: reports_rx })
}

/// Starts the storage on 127.0.0.1:0 under `root`; returns its base URL and a bearer macaroon
/// for `/bench` (download and upload).
async fn start_storage(root: &Path, shutdown: CancellationToken) -> (String, String) {
    let users = root.join("users.json");
    let users_json =
        format!(r#"{{"users":[{{"name":"{}","secret":"{}","issue_macaroons":true,"paths":["/"]}}]}}"#, USER.0, USER.1);
    std::fs::write(&users, users_json).expect("write users file");
    let config = htfaas_storage::Config {
        listen: "127.0.0.1:0".parse().expect("addr"),
        data_dir: root.join("data"),
        secret_file: root.join("secret"),
        users_file: users,
        nats_url: None,
        nats_nkey_seed: None,
        events_stream_replicas: 1,
        public_url: None,
        tls_cert_file: None,
        tls_key_file: None,
        billing_path_subjects: true,
        cell_name: "htfaas-storage".into(),
        durability: Default::default(),
        http: Default::default(),
    };
    let settings = config.resolve().await.expect("storage resolves");
    let base = format!("http://{}", settings.local_addr());
    tokio::spawn(htfaas_storage::run(settings, shutdown));
    std::fs::create_dir_all(root.join("data/bench")).expect("mkdir data/bench");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let resp = reqwest::Client::new()
        .post(format!("{base}/bench"))
        .basic_auth(USER.0, Some(USER.1))
        .header("Content-Type", "application/macaroon-request")
        .body(r#"{"caveats":["activity:DOWNLOAD,UPLOAD"],"validity":"PT2H"}"#)
        .send()
        .await
        .expect("macaroon request");
    assert!(resp.status().is_success(), "macaroon request: {}", resp.status());
    let v: serde_json::Value = resp.json().await.expect("macaroon JSON");
    (base, v["macaroon"].as_str().expect("macaroon").to_owned())
}

/// Writes `size` bytes of non-repeating data to `path`, 1 MiB at a time.
fn generate(path: &Path, size: u64) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).expect("create input"));
    let mut buf = vec![0u8; MIB as usize];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut left = size;
    while left > 0 {
        for word in buf.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            word.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(MIB) as usize;
        f.write_all(&buf[..n]).expect("write input");
        left -= n as u64;
    }
    f.flush().expect("flush input");
}

/// `(VmRSS, VmHWM)` of this process, bytes.
fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Resets `VmHWM` to the current RSS; false where the kernel does not allow it.
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn mib_per_s(bytes: u64, d: Duration) -> f64 {
    (bytes as f64 / MIB as f64) / d.as_secs_f64().max(1e-9)
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Runs `curl` with `args`, returning its wall time, or `None` when it is not on PATH.
fn curl(args: &[&str]) -> Option<Duration> {
    let started = Instant::now();
    let out = match std::process::Command::new("curl").args(args).output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("run curl: {e}"),
    };
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.trim().starts_with('2'), "curl {args:?}: {stdout} {:?}", out.stderr);
    Some(took)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let timed = args.iter().any(|a| a == "--bench");
    let quick = args.iter().any(|a| a == "--quick") || std::env::var("HTFAAS_BENCH_QUICK").is_ok_and(|v| v == "1");
    let sizes_mib: &[u64] = match (timed, quick) {
        (false, _) => &[4],
        (true, true) => &[64, 256],
        (true, false) => &[256, 1024],
    };

    let finished = Finished::default();
    let subscriber = tracing_subscriber::registry().with(finished.clone());
    tracing::subscriber::set_global_default(subscriber).expect("one subscriber");

    let tmp = tempfile::tempdir().expect("tempdir");
    let stop = CancellationToken::new();
    let (storage, macaroon) = start_storage(tmp.path(), stop.clone()).await;
    let (scheduler_url, mut scheduler) = start_scheduler().await;
    let work = tmp.path().join("ep");
    let config: htfaas_ep::Config = serde_json::from_value(serde_json::json!({
        "name": "bench-ep",
        "scheduler_url": scheduler_url,
        "attach_token": "bench",
        "work_dir": work,
        "slots": {"cpus": 1, "memory_mb": 512, "runtime_s": 3600, "gpus": 0, "disk_mb": 8192},
    }))
    .expect("EP config");
    let settings = config.resolve().await.expect("EP resolves");
    let ep = tokio::spawn(htfaas_ep::run(settings, stop.clone()));
    let module = wat::parse_str(PASS_THROUGH).expect("valid wat");
    std::fs::write(tmp.path().join("data/bench/pass-through.wasm"), &module).expect("write module");
    let auth = format!("Authorization: Bearer {macaroon}");

    let mut growth = Vec::new();
    for &mib in sizes_mib {
        let size = mib * MIB;
        let input = tmp.path().join(format!("data/bench/in-{mib}.dat"));
        generate(&input, size);
        let url = format!("{storage}/bench/in-{mib}.dat");

        // (a) curl: GET to /dev/null, then PUT the same file back.
        let fmt = "%{http_code}";
        let down = curl(&["-sS", "-o", "/dev/null", "-w", fmt, "-H", &auth, &url]);
        let input_arg = input.display().to_string();
        let up_url = format!("{storage}/bench/curl-up-{mib}.dat");
        let up = curl(&["-sS", "-o", "/dev/null", "-w", fmt, "-H", &auth, "-T", &input_arg, &up_url]);
        if let (Some(down), Some(up)) = (down, up) {
            let uploaded = std::fs::metadata(tmp.path().join(format!("data/bench/curl-up-{mib}.dat"))).map(|m| m.len());
            assert_eq!(uploaded.ok(), Some(size), "curl's upload stored whole");
            for (dir, d) in [("download", down), ("upload", up)] {
                let line = serde_json::json!({"bench": format!("datapath.curl.{dir}"), "size_mib": mib,
                    "ms": d.as_millis() as u64, "mib_per_s": round2(mib_per_s(size, d))});
                println!("{line}");
            }
        } else {
            println!("{}", serde_json::json!({"bench": "datapath.curl", "size_mib": mib, "error": "curl not on PATH"}));
        }
        let _ = std::fs::remove_file(tmp.path().join(format!("data/bench/curl-up-{mib}.dat")));

        // (b) the EP: one pass-through job.
        let job = JobAssignment {
            job_id: format!("bench-{mib}"),
            function: FunctionRef {
                name: "pass-through".into(),
                version: 1,
                digest: Digest::of(&module),
                module_url: format!("{storage}/bench/pass-through.wasm?authz={macaroon}"),
                native: None,
            },
            resources: Resources::new(1, 64, 3600),
            input: Some(InputSpec::new(url.clone(), "in.dat", macaroon.clone())),
            output: OutputSpec {
                url: format!("{storage}/bench/ep-{mib}-"),
                macaroon: macaroon.clone(),
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
        };
        let reset = reset_peak();
        let (rss_before, _) = memory();
        scheduler.jobs.send(job).expect("scheduler link up");
        let report = tokio::time::timeout(Duration::from_secs(1800), scheduler.reports.recv())
            .await
            .expect("job finishes in time")
            .expect("scheduler link up");
        let (_, hwm_after) = memory();
        assert_eq!(report.outcome, Outcome::Exited { exit_code: 0 }, "{}\n{}", report.outcome.reason(), report.log);
        assert_eq!((report.usage.bytes_in, report.usage.bytes_out), (size, size), "{:?}", report.usage);
        let stored = std::fs::metadata(tmp.path().join(format!("data/bench/ep-{mib}-out.dat"))).map(|m| m.len());
        assert_eq!(stored.ok(), Some(size), "the EP's upload stored whole");
        let fields = finished.0.lock().unwrap_or_else(|p| p.into_inner()).pop().unwrap_or_default();
        let ms = |k: &str| fields.get(k).copied().unwrap_or(0);
        let ep_down = Duration::from_millis(ms("input_ms"));
        let ep_up = Duration::from_millis(ms("output_ms"));
        for (dir, d, c) in [("download", ep_down, down), ("upload", ep_up, up)] {
            let mut line = serde_json::json!({"bench": format!("datapath.ep.{dir}"), "size_mib": mib,
                "ms": d.as_millis() as u64, "mib_per_s": round2(mib_per_s(size, d)), "retries": ms("retries")});
            if let Some(c) = c {
                line["vs_curl"] = serde_json::json!(round2(c.as_secs_f64() / d.as_secs_f64().max(1e-9)));
            }
            println!("{line}");
        }
        let grew = hwm_after.saturating_sub(rss_before);
        println!(
            "{}",
            serde_json::json!({"bench": "datapath.ep.peak_rss_growth", "size_mib": mib, "mib": round2(grew as f64 / MIB as f64),
                "hwm_reset": reset, "wall_ms": report.usage.wall_ms})
        );
        growth.push((mib, grew));
        let _ = std::fs::remove_file(&input);
        let _ = std::fs::remove_file(tmp.path().join(format!("data/bench/ep-{mib}-out.dat")));
    }
    if let [(small, a), (large, b)] = growth[..] {
        // Flat: the larger file grows the peak by less than 32 MiB more than the smaller one.
        let flat = b <= a + 32 * MIB;
        println!(
            "{}",
            serde_json::json!({"bench": "datapath.ep.peak_rss_flat", "small_mib": small, "large_mib": large,
                "growth_small_mib": round2(a as f64 / MIB as f64), "growth_large_mib": round2(b as f64 / MIB as f64), "flat": flat})
        );
    }
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(20), ep).await;
    if !timed {
        println!("datapath: ok (smoke; run `cargo bench` to time)");
    }
    drop(tmp);
}
